"""What the Python engine is loaded with: :class:`EngineOptions`
(:meth:`~.serving_config.ServingConfig.engine_options` makes them from a profile).

Here, below both engines, so that ``serve --engine python`` checks a profile before it
starts anything without importing the engine (llama-cpp-python).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EngineOptions:
    """What a serving profile (``serve/*.toml``) means for the Python engine."""

    n_ctx: int = 4096
    n_max: int = 3  # llama-server's spec-draft-n-max default
    adaptive: bool = False  # the draft length chosen before each pass, up to n_max (spec-draft-adaptive)
    adaptive_warmup: bool = False  # its pass costs timed at load (spec-draft-adaptive-warmup)
    shadow: bool = False  # its probes from no drafts drafted and not verified (spec-draft-shadow)
    p_min: float = 0.0  # a draft stops below this drafter confidence (spec-draft-p-min)
    rejection_sampling: bool = False  # sampled requests verify drafts by min(1, p/q) (spec-rejection-sampling)
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
# profile's [draft] sets (spec-draft-adaptive, -warmup, -shadow, spec-draft-n-max 4), so a command
# drafts the same way with --profile cpu, with no profile, and as serve does.
NO_PROFILE = EngineOptions(n_max=4, adaptive=True, adaptive_warmup=True, shadow=True)


__all__ = ["NO_PROFILE", "EngineOptions", "server_threads"]
