"""What the Python engine is loaded with: :class:`EngineOptions`
(:meth:`~.serving_config.ServingConfig.engine_options` makes them from a profile).

Here, below both engines, so that ``serve --engine python`` checks a profile before it
starts anything without importing the engine (llama-cpp-python).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineOptions:
    """What a serving profile (``serve/*.toml``) means for the Python engine."""

    n_ctx: int = 4096
    n_max: int = 3  # llama-server's spec-draft-n-max default
    adaptive: bool = False  # the draft length chosen before each pass, up to n_max (spec-draft-adaptive)
    adaptive_warmup: bool = False  # its pass costs timed at load (spec-draft-adaptive-warmup)
    p_min: float = 0.0  # a draft stops below this drafter confidence (spec-draft-p-min)
    rejection_sampling: bool = False  # sampled requests verify drafts by min(1, p/q) (spec-rejection-sampling)
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int | None = None  # None: as the target
    flash_attn: bool = True  # llama-server's auto
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_batch: int = 512
    n_ubatch: int = 512

    def llama_kwargs(self) -> dict[str, Any]:
        return {
            "n_ctx": self.n_ctx,
            "n_gpu_layers": self.n_gpu_layers,
            "flash_attn": self.flash_attn,
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads_batch,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
        }


# What load_with_drafter, chat and generate use without a profile: the drafting every shipped
# profile's [draft] sets (spec-draft-adaptive, -warmup, spec-draft-n-max 4), so a command
# drafts the same way with --profile cpu, with no profile, and as serve does.
NO_PROFILE = EngineOptions(n_max=4, adaptive=True, adaptive_warmup=True)


__all__ = ["NO_PROFILE", "EngineOptions"]
