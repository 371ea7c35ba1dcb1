"""What ``bench`` is asked to measure, in one object: :class:`BenchRequest`.

Built once (the CLI, ``scripts/bench_engines.py``, a caller of the API) and passed to
:func:`gguf_exact.bench.run.run_bench`, which hands it on to the in-process runner, the
running servers or :func:`gguf_exact.bench.engines.bench_engines`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf_exact.engines.shared.knobs import KNOB

# A benchmark's own profile: the same on every machine (not ``auto``), so figures compare.
BENCH_PROFILE = "cpu"


# The drafting knobs' profile keys, as engines/shared/knobs.py declares them.
N_MAX_KEY, ADAPTIVE_KEY, P_MIN_KEY = (KNOB[name].flag for name in ("n_max", "adaptive", "p_min"))
RULE_KEY = KNOB["rejection_sampling"].flag  # the verification rule: exact match, or speculative sampling

# A request's sampler fields by name. Gemma 4's generation_config: temperature 1, top-k 64,
# top-p 0.95, min-p off (llama-server's default 0.05 is not Gemma's). Greedy: the target alone's text.
SAMPLERS: dict[str, dict[str, float]] = {
    "greedy": {"temperature": 0.0},
    "gemma": {"temperature": 1.0, "top_k": 64, "top_p": 0.95, "min_p": 0.0},
}
RULES = ("exact", "rejection")  # how drafts are verified: exact match, or speculative sampling (RULE_KEY)


def rule_overrides(rule: str) -> list[str]:
    """The launch override of a drafting arm verifying by ``rule`` (one of :data:`RULES`), given
    either way so a profile that turns the rule on does not decide an exact-match arm."""
    return [f"{RULE_KEY}={'true' if rule == 'rejection' else 'false'}"]


def fixed_length(n_max: int) -> list[str]:
    """The overrides of an arm that drafts ``n_max`` every pass (none: the target alone), the
    shipped profiles' adaptive length switched off so the arm measures that length."""
    return [f"{ADAPTIVE_KEY}=false", f"{N_MAX_KEY}={n_max}"] if n_max else []


def adaptive_length(n_max: int, p_min: float | None = None) -> list[str]:
    """The overrides of an arm whose draft length the policy chooses, up to ``n_max`` (0: the
    target alone), with the drafter-confidence floor ``p_min`` (None: the profile's)."""
    if not n_max:
        return []
    return [f"{ADAPTIVE_KEY}=true", f"{N_MAX_KEY}={n_max}"] + ([] if p_min is None else [f"{P_MIN_KEY}={p_min:g}"])


@dataclass(frozen=True)
class BenchRequest:
    """A bench run: in-process (``target``, ``draft``), against running llama-servers
    (``servers``: ``[LABEL=]URL`` each), or both engines' servers started for it
    (``engines``, with ``profile``, ``overrides``, ``temperature`` and ``seed``).
    ``draft`` may be ``auto``: found as ``serve`` finds it."""

    target: str | Path | None = None
    draft: str | Path | None = None
    n_values: tuple[int, ...] = (1, 2, 3, 4)
    servers: tuple[str, ...] = ()
    prompt_names: tuple[str, ...] | None = None  # None: every shipped prompt
    n_predict: int = 64
    rounds: int = 2
    n_ctx: int = 4096
    threads: int = 2
    engines: tuple[str, ...] = ()
    profile: str = BENCH_PROFILE
    overrides: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int | None = 1

    def __post_init__(self) -> None:
        for name in ("n_values", "servers", "engines", "overrides"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.prompt_names is not None:
            object.__setattr__(self, "prompt_names", tuple(self.prompt_names))


__all__ = [
    "ADAPTIVE_KEY",
    "BENCH_PROFILE",
    "N_MAX_KEY",
    "P_MIN_KEY",
    "RULES",
    "RULE_KEY",
    "SAMPLERS",
    "BenchRequest",
    "adaptive_length",
    "fixed_length",
    "rule_overrides",
]
