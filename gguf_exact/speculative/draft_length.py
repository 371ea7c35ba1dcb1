"""How many tokens the Python engine drafts before each target pass: a fixed n-max, or the
length :mod:`gguf_exact.runtime.draft_policy` chooses (``spec-draft-adaptive``), within what
one request asks for with llama-server's per-request fields ``speculative.n_max`` (0: no
drafts), ``speculative.p_min`` and ``speculative.adaptive``.

The engine reports each generation pass (rows, seconds in the target's decode), each
draft (drafter steps and their seconds) and what the target kept of it; the policy sees
them whether it chooses the length or not, so ``/metrics`` shows the measured costs either way
(and ``LLAMA_SPEC_DRAFT_TRACE`` records them, as llama-server's: :mod:`.policy_trace`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gguf_exact.runtime.draft_policy import PolicySettings, PolicySnapshot
from gguf_exact.speculative.policy_trace import new_policy

# llama-server's per-request field names (tools/server/server-schema.cpp with the 23 patch)
N_MAX_FIELD, P_MIN_FIELD, ADAPTIVE_FIELD = "speculative.n_max", "speculative.p_min", "speculative.adaptive"


@dataclass(frozen=True)
class RequestSpeculation:
    """What one request asks of speculation (None: the server's setting)."""

    n_max: int | None = None
    p_min: float | None = None
    adaptive: bool | None = None


def request_speculation(body: dict[str, Any]) -> RequestSpeculation | tuple[str, str]:
    """The request's speculative fields, or (message, field) when one is not what llama-server takes."""
    n_max, p_min, adaptive = body.get(N_MAX_FIELD), body.get(P_MIN_FIELD), body.get(ADAPTIVE_FIELD)
    if n_max is not None and (isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < 0):
        return f"{N_MAX_FIELD} must be an integer >= 0 (0: no drafts), got {n_max!r}", N_MAX_FIELD
    if p_min is not None and (isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or not 0 <= p_min <= 1):
        return f"{P_MIN_FIELD} must be a number from 0 to 1, got {p_min!r}", P_MIN_FIELD
    if adaptive is not None and not isinstance(adaptive, bool):
        return f"{ADAPTIVE_FIELD} must be true or false, got {adaptive!r}", ADAPTIVE_FIELD
    return RequestSpeculation(n_max, None if p_min is None else float(p_min), adaptive)


class DraftLength:
    """The engine's draft length: ``n_max`` the bound, ``adaptive`` whether the policy chooses
    within it, ``p_min`` the drafter confidence below which a draft stops."""

    def __init__(self, n_max: int, adaptive: bool = False, p_min: float = 0.0) -> None:
        self.adaptive = adaptive
        self.p_min = p_min
        self.policy = new_policy(PolicySettings(n_max=n_max, p_min=p_min))
        self.chosen = False  # the policy chose a length at least once (``/metrics`` shows it then)
        self.seeds: dict[int, float] = {}  # pass seconds by rows timed at start-up (spec-draft-adaptive-warmup)

    @property
    def n_max(self) -> int:
        return self.policy.settings.n_max

    @n_max.setter
    def n_max(self, value: int) -> None:
        if value != self.n_max:  # a new bound: estimates for the depths it has, from scratch (but the seeds)
            self.policy = new_policy(PolicySettings(n_max=value, p_min=self.p_min))
            self.seed(self.seeds)

    def seed(self, seconds_by_rows: dict[int, float]) -> None:
        """Seed the policy with pass costs timed before the first pass (kept for a later bound)."""
        self.seeds = dict(seconds_by_rows)
        for rows, seconds in sorted(self.seeds.items()):
            self.policy.seed(rows, seconds)

    def plan(self, limit: int, request: RequestSpeculation | None = None) -> tuple[int, float]:
        """(drafts for the next pass, p_min), at most ``limit`` (what the budget and context leave)."""
        request = request or RequestSpeculation()
        bound = min(self.n_max, limit, request.n_max if request.n_max is not None else self.n_max)
        p_min = request.p_min if request.p_min is not None else self.p_min
        if bound <= 0:
            return 0, p_min
        if request.adaptive if request.adaptive is not None else self.adaptive:
            self.chosen = True
            return self.policy.choose(bound), p_min
        return bound, p_min

    def snapshot(self) -> PolicySnapshot | None:
        return self.policy.snapshot() if self.chosen else None


__all__ = ["ADAPTIVE_FIELD", "N_MAX_FIELD", "P_MIN_FIELD", "DraftLength", "RequestSpeculation", "request_speculation"]
