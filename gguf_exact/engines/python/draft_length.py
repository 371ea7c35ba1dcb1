"""How many tokens the Python engine drafts before each target pass: a fixed n-max, or the
length :mod:`gguf_exact.engines.shared.draft_policy` chooses (``spec-draft-adaptive``), within what
one request asks for with the per-request fields ``speculative.n_max`` (0: no drafts),
``speculative.p_min`` and ``speculative.adaptive``, dotted or inside a ``speculative`` object
(and ``speculative.rejection_sampling``, which :mod:`.rejection`'s rule reads),
checked as llama-server checks them (:func:`request_speculation`).

The engine reports each generation pass (rows, seconds in the target's decode), each
draft (drafter steps and their seconds) and what the target kept of it; the policy sees
them whether it chooses the length or not, so ``/metrics`` shows the measured costs either way
(and ``LLAMA_SPEC_DRAFT_TRACE`` records them, as llama-server's: :mod:`.policy_trace`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gguf_exact.engines.python.policy_trace import new_policy
from gguf_exact.engines.shared.draft_policy import PolicySettings
from gguf_exact.engines.shared.policy_snapshot import PolicySnapshot

# The per-request fields, one contract in both engines (llama-server's side: patch 23's
# tools/server/server-schema.cpp, eval_request_speculation; rejection_sampling: patch 38): each of
# n_max, p_min, adaptive and rejection_sampling is
# given dotted at the top level ("speculative.n_max": 2, llama-server's own form) or inside a
# "speculative" object ({"speculative": {"n_max": 2}}), not both ways at once (refused, whatever the
# values: neither form silently wins); null is absent (the server's setting). n_max above the server's
# spec-draft-n-max drafts that many, as a fixed length does. Each refusal names its field in the
# message and as the error's param, with the same words from both engines (tests/test_speculative_fields.py).
SPECULATIVE = "speculative"
N_MAX_FIELD, P_MIN_FIELD, ADAPTIVE_FIELD = "speculative.n_max", "speculative.p_min", "speculative.adaptive"
REQUEST_FIELDS = ("n_max", "p_min", "adaptive", "rejection_sampling")
LISTED = "(" + ", ".join(REQUEST_FIELDS) + ")"
N_MAX_LIMIT = 2**31 - 1  # llama-server keeps n_max in an int32


@dataclass(frozen=True)
class RequestSpeculation:
    """What one request asks of speculation (None: the server's setting)."""

    n_max: int | None = None
    p_min: float | None = None
    adaptive: bool | None = None
    rejection_sampling: bool | None = None


def shown(value: Any) -> str:
    """A JSON value in a refusal, as llama-server writes it: a number, true or false as JSON, a
    string, array or object by its kind (its text could be long, and the engines escape it apart)."""
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return json.dumps(value)


def request_speculation(body: dict[str, Any]) -> RequestSpeculation | tuple[str, str]:
    """The request's speculative fields, or (message, field) when one breaks the contract above."""
    nested = body.get(SPECULATIVE)
    if nested is not None and not isinstance(nested, dict):
        return f"{SPECULATIVE} must be an object {LISTED}, got {shown(nested)}", SPECULATIVE
    nested = nested or {}
    unknown = next((key for key in nested if key not in REQUEST_FIELDS), None)
    if unknown is not None:
        field = f"{SPECULATIVE}.{unknown}"
        return f"{field} is not a per-request speculative field {LISTED}", field
    found: dict[str, Any] = {}
    for name in REQUEST_FIELDS:
        field = f"{SPECULATIVE}.{name}"
        flat, inner = body.get(field), nested.get(name)
        if flat is not None and inner is not None:
            return f'{field} is given twice, as "{field}" and inside "{SPECULATIVE}": give it once', field
        value = flat if flat is not None else inner
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name == "n_max" and not (number and isinstance(value, int) and 0 <= value <= N_MAX_LIMIT):
            return f"{field} must be an integer from 0 (no drafts) to {N_MAX_LIMIT}, got {shown(value)}", field
        if name == "p_min" and not (number and 0 <= value <= 1):
            return f"{field} must be a number from 0 to 1, got {shown(value)}", field
        if name in ("adaptive", "rejection_sampling") and not isinstance(value, bool):
            return f"{field} must be true or false, got {shown(value)}", field
        found[name] = float(value) if name == "p_min" else value
    return RequestSpeculation(**found)


@dataclass(frozen=True)
class StartUpCosts:
    """What start-up timed (:mod:`.warmup`): the target's verification pass by rows, one drafter step (None: not timed)."""

    passes: dict[int, float] = field(default_factory=dict)
    step: float | None = None


class DraftLength:
    """The engine's draft length: ``n_max`` the bound, ``adaptive`` whether the policy chooses
    within it, ``p_min`` the drafter confidence below which a draft stops."""

    def __init__(self, n_max: int, adaptive: bool = False, p_min: float = 0.0, shadowing: bool = False) -> None:
        self.adaptive = adaptive
        self.p_min = p_min
        self.shadowing = shadowing  # spec-draft-shadow: the policy's probes from no drafts, not verified
        self.policy = new_policy(PolicySettings(n_max=n_max, p_min=p_min, shadow=shadowing))
        self.chosen = False  # the policy chose a length at least once (``/metrics`` shows it then)
        self.shadow = 0  # the last plan's shadow: drafts to draft and not verify (the policy's, spec-draft-shadow)
        self.seeds = StartUpCosts()  # timed at start-up (spec-draft-adaptive-warmup)

    @property
    def n_max(self) -> int:
        return self.policy.settings.n_max

    @n_max.setter
    def n_max(self, value: int) -> None:
        if value != self.n_max:  # a new bound: estimates for the depths it has, from scratch (but the seeds)
            self.policy = new_policy(PolicySettings(n_max=value, p_min=self.p_min, shadow=self.shadowing))
            self.seed(self.seeds)

    def seed(self, costs: StartUpCosts) -> None:
        """Seed the policy with pass and drafter step costs timed before the first pass (kept for a later bound)."""
        self.seeds = costs
        for rows, seconds in sorted(costs.passes.items()):
            self.policy.seed(rows, seconds)
        if costs.step is not None:
            self.policy.seed_steps(1, costs.step)

    def plan(self, limit: int, request: RequestSpeculation | None = None) -> tuple[int, float]:
        """(drafts for the next pass, p_min), at most ``limit`` (what the budget and context leave)."""
        request = request or RequestSpeculation()
        bound = min(self.n_max, limit, request.n_max if request.n_max is not None else self.n_max)
        p_min = request.p_min if request.p_min is not None else self.p_min
        self.shadow = 0
        if bound <= 0:
            return 0, p_min
        if request.adaptive if request.adaptive is not None else self.adaptive:
            self.chosen = True
            k = self.policy.choose(bound)
            self.shadow = self.policy.shadow
            return k, p_min
        return bound, p_min

    def snapshot(self) -> PolicySnapshot | None:
        return self.policy.snapshot() if self.chosen else None


__all__ = [
    "ADAPTIVE_FIELD",
    "N_MAX_FIELD",
    "P_MIN_FIELD",
    "SPECULATIVE",
    "DraftLength",
    "RequestSpeculation",
    "StartUpCosts",
    "request_speculation",
]
