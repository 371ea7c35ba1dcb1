"""What a full-size pair (:mod:`.full_pair`) does, worked out without running it: the
target's walk round its cycle, which drafts each kind of drafter gets right at each depth,
and what a run or the steady state then counts. Pure: the tests compare llama-server's and
the Python engine's counts with these, and the docs quote :func:`steady_state`.

The target's greedy text walks :data:`N_AXES` cycle tokens, one axis further per token. A
pass that starts with the last emitted token on axis ``s`` and carries ``k`` drafts has
draft ``j`` (1-based) propose the token of axis ``s + j``; the kinds differ in which of
those proposals name the right token:

- ``hidden``: every one.
- ``mixed``: those on an axis in the first two thirds of each :data:`MIXED_PERIOD` (the
  same pattern twice round the cycle, so its figures are those of the 12-axis cycle it
  had before ``real``).
- ``real``: draft 1 (made from the target's own hidden state) unless its axis is in
  :data:`REAL_FIRST_WRONG`; a deeper draft (made from the drafter's own ``post_projection``
  output, which it maps differently) unless its axis is in :data:`REAL_DEEP_WRONG`.
  Where it is wrong its top probability is low: :func:`top_probability`.

A pass keeps the drafts up to the first wrong one and the target's own token after them,
so it moves ``accepted + 1`` axes. The walk is deterministic; from any start it reaches one
periodic orbit (:func:`steady_state`), which gives the figures the module docstring of
:mod:`.full_pair` states.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

N_AXES = 24  # the cycle's length: axes 0..23 of the residual stream
MIXED_PERIOD = 12  # mixed: right on the first 8 axes of every 12
KINDS = ("hidden", "mixed", "real")
# real: the axes its first draft (target's hidden state) and its deeper drafts (its own
# output fed back) name a wrong token on; found by a search over subsets for per-depth
# acceptance near real assistants' (about 0.85 at depth 1, 0.6-0.65 deeper) at every
# n-max 1..4 from every start
REAL_FIRST_WRONG = (1, 5, 10, 12, 14, 18, 21)
REAL_DEEP_WRONG = (3, 4, 6, 7, 8, 9, 15, 16, 22, 23)
# real's confidence: the drafter's final norm weight on a proposal's axis scales its logit;
# right: 1, wrong: these. RIGHT_LOGIT: a right draft's logit as llama.cpp computes it (the
# target's h is 37.61 on its own axis and -11.02 on the one before, RMS-normed at width 256)
REAL_FIRST_WRONG_WEIGHT = 0.25  # confident and wrong: top probability 0.84
REAL_DEEP_WRONG_WEIGHT = 0.125  # unsure: 0.43
RIGHT_LOGIT = 15.36
TOP_K = 10  # draft-mtp's top-k: its top probability is a softmax over the 10 best logits


def right(kind: str, axis: int, depth: int) -> bool:
    """Does ``kind``'s draft at ``depth`` (1-based) that proposes ``axis``'s token name it?"""
    axis %= N_AXES
    if kind == "hidden":
        return True
    if kind == "mixed":
        return axis % MIXED_PERIOD < 2 * MIXED_PERIOD // 3
    if kind == "real":
        return axis not in (REAL_FIRST_WRONG if depth == 1 else REAL_DEEP_WRONG)
    raise ValueError(kind)


def norm_weight(kind: str, axis: int, depth: int) -> float:
    """The drafter's final-norm weight on the axis it proposes from (1 unless ``real`` is wrong)."""
    if kind != "real" or right(kind, axis, depth):
        return 1.0
    return REAL_FIRST_WRONG_WEIGHT if depth == 1 else REAL_DEEP_WRONG_WEIGHT


def top_probability(kind: str, axis: int, depth: int) -> float:
    """The drafter's top probability for that proposal: its logit ``RIGHT_LOGIT * weight``
    against nine zero logits (every other candidate's row is zero on the axis; a draft after a
    wrong one is lower, down to 0.29 for 0.43: on the same side of p-min 0.5, 0.7 and 0.9)."""
    x = RIGHT_LOGIT * norm_weight(kind, axis, depth)
    return 1.0 / (1.0 + (TOP_K - 1) * math.exp(-x))


@dataclass
class WalkCounts:
    """What a run counts: passes after the prompt's, drafts, per-depth tries and accepts."""

    tokens: list[int] = field(default_factory=list)  # the axes emitted, the prompt pass's first
    passes: int = 0  # generation passes (the prompt's pass not counted)
    drafted: int = 0
    accepted: int = 0
    tried: list[int] = field(default_factory=list)  # per depth: drafts made once the ones before were right
    kept: list[int] = field(default_factory=list)  # per depth: of those, right

    def acceptance(self) -> list[Fraction]:
        return [Fraction(a, t) for a, t in zip(self.kept, self.tried) if t]


Confidence = Callable[[int, int], float]  # (start axis, depth) -> the draft's top probability


def one_pass(
    kind: str, start: int, k: int, p_min: float = 0.0, confidence: Confidence | None = None
) -> tuple[int, int]:
    """(drafts made, drafts kept) for a pass from axis ``start`` asked for ``k`` drafts; a draft
    whose top probability is below ``p_min`` is not made (llama.cpp's ``--spec-draft-p-min``).
    ``confidence``: the drafter's top probabilities as its weights give them (after a wrong
    draft they differ from :func:`top_probability`'s); by default that model's."""
    made = kept = 0
    wrong = False
    for j in range(1, k + 1):
        p = confidence(start % N_AXES, j) if confidence else top_probability(kind, start + j, j)
        if p_min > 0 and p < p_min:
            break
        made += 1
        wrong = wrong or not right(kind, start + j, j)
        kept += not wrong
    return made, kept


def predict_run(
    kind: str, first_axis: int, n_predict: int, n_max: int, p_min: float = 0.0, confidence: Confidence | None = None
) -> WalkCounts:
    """A request of ``n_predict`` tokens at a fixed ``n_max`` whose prompt pass emitted the token
    of ``first_axis``: as llama-server and the Python engine draft, at most the tokens the
    request has left less one (``n_remaining - 1``)."""
    out = WalkCounts([first_axis % N_AXES], tried=[0] * n_max, kept=[0] * n_max)
    s = first_axis
    while len(out.tokens) < n_predict:
        k = min(n_max, n_predict - len(out.tokens) - 1)
        made, kept = one_pass(kind, s, k, p_min, confidence)
        for j in range(1, min(made, kept + 1) + 1):
            out.tried[j - 1] += 1
            out.kept[j - 1] += j <= kept
        out.passes += 1
        out.drafted += made
        out.accepted += kept
        out.tokens += [(s + i) % N_AXES for i in range(1, kept + 2)]
        s += kept + 1
    del out.tokens[n_predict:]
    return out


@dataclass(frozen=True)
class SteadyState:
    """One orbit of the walk at a fixed n-max: exact fractions."""

    passes: int
    acceptance: Fraction  # drafts kept / drafts made (llama-server's "draft acceptance")
    per_depth: tuple[Fraction, ...]  # a_j: right once the ones before were
    tokens_per_pass: Fraction


def steady_state(
    kind: str, n_max: int, start: int = 0, p_min: float = 0.0, confidence: Confidence | None = None
) -> SteadyState:
    """The periodic orbit the walk at ``n_max`` reaches from axis ``start``, counted once round."""
    seen: dict[int, int] = {}
    order: list[int] = []
    s = start % N_AXES
    while s not in seen:
        seen[s] = len(order)
        order.append(s)
        s = (s + one_pass(kind, s, n_max, p_min, confidence)[1] + 1) % N_AXES
    orbit = order[seen[s] :]
    made = kept = tokens = 0
    tried, right_ = [0] * n_max, [0] * n_max
    for s in orbit:
        m, a = one_pass(kind, s, n_max, p_min, confidence)
        made, kept, tokens = made + m, kept + a, tokens + a + 1
        for j in range(1, min(m, a + 1) + 1):
            tried[j - 1] += 1
            right_[j - 1] += j <= a
    return SteadyState(
        len(orbit),
        Fraction(kept, made) if made else Fraction(0),
        tuple(Fraction(r, t) for r, t in zip(right_, tried) if t),
        Fraction(tokens, len(orbit)),
    )


__all__ = [
    "KINDS",
    "MIXED_PERIOD",
    "N_AXES",
    "REAL_DEEP_WRONG",
    "REAL_FIRST_WRONG",
    "SteadyState",
    "WalkCounts",
    "norm_weight",
    "one_pass",
    "predict_run",
    "right",
    "steady_state",
    "top_probability",
]
