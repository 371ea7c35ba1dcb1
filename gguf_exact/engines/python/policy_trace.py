"""The Python engine's ``LLAMA_SPEC_DRAFT_TRACE``, as llama-server's (build patch 23) writes it:
what the draft-length policy is told and what it chooses, one line per event, appended to
``FILE.0`` (the engine's one slot) in the replay format of ``tests/cpp/draft_policy_driver.cpp``,
so the two engines' runs can be set side by side and replayed through either twin."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from gguf_exact.engines.shared.batch_cost import BatchPolicy
from gguf_exact.engines.shared.draft_policy import PolicySettings

TRACE_ENV = "LLAMA_SPEC_DRAFT_TRACE"


def settings_line(s: PolicySettings) -> str:
    """The trace's first line: the settings in the driver's order (``p_min`` is not the policy's)."""
    values: tuple[float, ...]  # counts and fractions
    values = (s.n_max, s.prior, s.prior_weight, s.decay, s.cost_weight, s.probe_interval, s.probe_interval_max)
    values += (s.cost_max_age, s.switch_margin, s.cost_window, s.retime_margin, s.burst_ratio, s.outlier_ratio)
    values += (s.recheck_interval, s.explore_weight, s.explore_errors, int(s.shadow))
    return "settings " + " ".join(repr(v) for v in values) + "\n"


@dataclass
class TracedPolicy(BatchPolicy):
    """A :class:`BatchPolicy` that appends its inputs and choices to ``out`` (the batch fields only where
    other slots share the pass: this engine's one slot writes the lines of traces before them)."""

    out: IO[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._write(settings_line(self.settings))

    def _write(self, line: str) -> None:
        if self.out is not None:
            self.out.write(line)

    def choose(
        self,
        limit: int,
        others_rows: int = 0,
        others_tokens: float = 0.0,
        others_drafts: int = 0,
        after: int = 0,
        layout: Sequence[int] = (),
        others_drafted: int = 0,
    ) -> int:
        batch = f" {others_rows} {others_tokens!r} {others_drafts}:{others_drafted} {after}"
        batch = batch + "".join(f" {r}" for r in layout) if others_rows or others_tokens else ""
        self._write(f"choose {limit}{batch}\n")
        k = super().choose(limit, others_rows, others_tokens, others_drafts, after, layout, others_drafted)
        self._write(f"# k {k} t_us {time.monotonic_ns() // 1000}\n")
        return k

    def seed(self, rows: int, seconds: float) -> None:
        self._write(f"seed {rows} {seconds!r}\n")
        super().seed(rows, seconds)

    def seed_steps(self, steps: int, seconds: float, sequences: int = 1) -> None:
        self._write(f"step-seed {steps} {seconds!r}" + (f" {sequences}\n" if sequences > 1 else "\n"))
        super().seed_steps(steps, seconds, sequences)

    def seed_batch(self, total: int, seconds: float) -> None:
        self._write(f"batch-seed {total} {seconds!r}\n")
        super().seed_batch(total, seconds)

    def observe_pass(self, rows: int, seconds: float, total: int = 0, passes: int = 1) -> None:
        self._write(
            f"pass {rows} {seconds!r}" + (f" {total}" if total else "") + (f" {passes}\n" if passes > 1 else "\n")
        )
        super().observe_pass(rows, seconds, total, passes)

    def observe_steps(self, steps: int, seconds: float, sequence_steps: int = 0) -> None:
        self._write(f"steps {steps} {seconds!r}" + (f" {sequence_steps}\n" if sequence_steps else "\n"))
        super().observe_steps(steps, seconds, sequence_steps)

    def set_class(self, name: str) -> bool:
        changed = super().set_class(name)
        if changed:  # as llama-server writes it: on a change only
            self._write(f"class {name}\n")
        return changed

    def observe_shadow(self, drafted: int, accepted: int, chances: Sequence[float] = ()) -> None:
        self._write(f"shadow {drafted} {accepted}" + "".join(f" {c!r}" for c in chances) + "\n")
        super().observe_shadow(drafted, accepted, chances)

    def observe_result(self, drafted: int, accepted: int, chances: Sequence[float] = ()) -> None:
        self._write(f"result {drafted} {accepted}" + "".join(f" {c!r}" for c in chances) + "\n")
        super().observe_result(drafted, accepted, chances)


def new_policy(settings: PolicySettings) -> BatchPolicy:
    """A policy, traced to ``$LLAMA_SPEC_DRAFT_TRACE.0`` when that is set (line-buffered: a
    killed server leaves whole lines)."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return BatchPolicy(settings)
    return TracedPolicy(settings, out=open(f"{path}.0", "a", buffering=1, encoding="utf-8"))  # noqa: SIM115


__all__ = ["TRACE_ENV", "TracedPolicy", "new_policy", "settings_line"]
