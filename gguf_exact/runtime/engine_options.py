"""What a serving profile (``serve/*.toml``) means for the Python engine: :class:`EngineOptions`
and :func:`engine_options` (its values, and the llama-server-only keys it does not apply).

Here, below both engines, so that ``serve --engine python`` checks a profile before it
starts anything without importing the engine (llama-cpp-python).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gguf_exact.errors import InputError


@dataclass(frozen=True)
class EngineOptions:
    """What a serving profile (``serve/*.toml``) means for the Python engine."""

    n_ctx: int = 4096
    n_max: int = 2
    adaptive: bool = False  # the draft length chosen before each pass, up to n_max (spec-draft-adaptive)
    adaptive_warmup: bool = False  # its pass costs timed at load (spec-draft-adaptive-warmup)
    p_min: float = 0.0  # a draft stops below this drafter confidence (spec-draft-p-min)
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int | None = None  # None: as the target
    flash_attn: bool = True  # llama-server's auto
    n_threads: int | None = None  # None: llama-server's default (server_threads)
    n_threads_batch: int | None = None  # None: as n_threads (llama-server's --threads-batch default)
    n_batch: int = 512
    n_ubatch: int = 512

    def llama_kwargs(self) -> dict[str, Any]:
        threads = self.n_threads or server_threads()
        return {
            "n_ctx": self.n_ctx,
            "n_gpu_layers": self.n_gpu_layers,
            "flash_attn": self.flash_attn,
            "n_threads": threads,
            "n_threads_batch": self.n_threads_batch or threads,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
        }


def server_threads(cpu_dir: Path = Path("/sys/devices/system/cpu")) -> int:
    """llama-server's default ``--threads`` (and so ``--threads-batch``): the physical cores, counted
    as llama.cpp's ``common_cpu_get_num_physical_cores`` counts them on Linux (the distinct
    ``cpuN/topology/thread_siblings``, from cpu0 to the first missing), else its fallback (every
    logical CPU up to 4, half of them above). Not llama-cpp-python's default, ``cpu_count() // 2``
    for one-row passes: on 2 cores that decoded the target alone on 1 thread beside llama-server's
    2 (issue 40). A hybrid CPU's efficiency cores, which llama.cpp leaves out, are counted here."""
    siblings = set()
    for n in itertools.count():
        try:
            siblings.add((cpu_dir / f"cpu{n}" / "topology" / "thread_siblings").read_text().strip())
        except OSError:
            break
    if siblings:
        return len(siblings)
    logical = os.cpu_count() or 4
    return logical if logical <= 4 else logical // 2


# What load_with_drafter, chat and generate use without a profile: the drafting every shipped
# profile's [draft] sets (spec-draft-adaptive, -warmup, spec-draft-n-max 4), so a command
# drafts the same way with --profile cpu, with no profile, and as serve does.
NO_PROFILE = EngineOptions(n_max=4, adaptive=True, adaptive_warmup=True)


def _layers(key: str, value: Any) -> int:
    if str(value).lower() in ("all", "auto"):
        return -1  # llama.cpp: a negative count offloads every layer
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InputError(f"profile: {key} = {value!r}: expected a number of layers or 'all'") from None


def _flag(key: str, value: Any) -> bool:
    text = str(value).lower()
    if text in ("true", "on", "1", "enabled", "auto"):
        return True  # "auto": llama-server turns it on where the backend has it (CPU, CUDA)
    if text in ("false", "off", "0", "disabled"):
        return False
    raise InputError(f"profile: {key} = {value!r}: expected on, off or auto")


# llama-server long option (and short aliases) -> (EngineOptions field, converter)
_PROFILE_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "ctx-size": ("n_ctx", lambda k, v: int(v)),
    "c": ("n_ctx", lambda k, v: int(v)),
    "n-gpu-layers": ("n_gpu_layers", _layers),
    "ngl": ("n_gpu_layers", _layers),
    "gpu-layers": ("n_gpu_layers", _layers),
    "n-gpu-layers-draft": ("n_gpu_layers_draft", _layers),
    "ngld": ("n_gpu_layers_draft", _layers),
    "flash-attn": ("flash_attn", _flag),
    "fa": ("flash_attn", _flag),
    "threads": ("n_threads", lambda k, v: int(v)),
    "t": ("n_threads", lambda k, v: int(v)),
    "threads-batch": ("n_threads_batch", lambda k, v: int(v)),
    "batch-size": ("n_batch", lambda k, v: int(v)),
    "b": ("n_batch", lambda k, v: int(v)),
    "ubatch-size": ("n_ubatch", lambda k, v: int(v)),
    "ub": ("n_ubatch", lambda k, v: int(v)),
    "spec-draft-n-max": ("n_max", lambda k, v: int(v)),
    "draft-max": ("n_max", lambda k, v: int(v)),
    "spec-draft-adaptive": ("adaptive", _flag),
    "spec-draft-adaptive-warmup": ("adaptive_warmup", _flag),
    "spec-draft-p-min": ("p_min", lambda k, v: float(v)),
    "draft-p-min": ("p_min", lambda k, v: float(v)),
}
# llama-server options with nothing to do in one in-process engine serving one request at a time.
_NOT_APPLICABLE = {"parallel", "np", "metrics", "no-warmup", "cont-batching", "spec-draft-threads", "jinja"}


def engine_options(profile: Any, with_draft: bool = True) -> tuple[EngineOptions, list[str]]:
    """A :class:`~gguf_exact.runtime.profiles.Profile`'s values for the Python engine,
    and the keys it does not apply (llama-server-only options), for a note."""
    opts: dict[str, Any] = {}
    ignored: list[str] = []
    tables = [profile.server] + ([profile.draft] if with_draft else [])
    for table in tables:
        for key, value in table.items():
            if key == "spec-type":
                if with_draft and str(value) != "draft-mtp":
                    raise InputError(
                        f"profile {profile.name}: spec-type = {value!r}; the Python engine drafts with the MTP drafter only (draft-mtp)"
                    )
                continue
            if key == "parallel" and int(value) > 1:
                raise InputError(
                    f"profile {profile.name}: parallel = {value}; the Python engine serves one request at a time (others queue), use parallel = 1"
                )
            if key in _PROFILE_KEYS:
                name, convert = _PROFILE_KEYS[key]
                if value is not False or name in ("adaptive", "adaptive_warmup"):  # false: llama-server's default
                    opts[name] = convert(key, value)
            elif key not in _NOT_APPLICABLE:
                ignored.append(key)
    return EngineOptions(**opts), ignored


__all__ = ["EngineOptions", "engine_options", "server_threads"]
