"""The drafter's acceptance as the draft-length policy (:mod:`.draft_policy`) counts it: a_j, the chance draft j is
right once drafts 1..j-1 were, from decayed counts of the drafts tried and kept at each depth around a prior, kept
per acceptance class (:mod:`.acceptance_class`: the rule and the request's sampler; :meth:`AcceptanceCounts.set_class`).
Rejection sampling counts each verified draft's chance of being kept, sum min(p, q), in place of its 0 or 1: the same
mean, a fraction of the noise (Rao-Blackwell).

Shadows (drafted, not verified; the policy's ``shadow``) count at ``SHADOW_WEIGHT`` of a verified draft: a shadow rides
the target alone's walk through the text, a verified draft drafting's, which lingers where drafts fail (a kept draft
moves the text on faster), so shadows see a drafter better than drafting does. Where right answers come in runs that
bias is large: E2B's `mixed` pair, right on 8 of every 12 cycle axes, matched 0.91 in shadows and 0.36-0.40 verified.

Misses come in runs too (hard stretches of text), so depth 1 is also counted right after a miss there
(:meth:`AcceptanceCounts.after_a_miss`, around a_1), and the policy shadows first where that says a draft would not pay
(:meth:`.DraftPolicy.held_back`). Where misses do not come in runs it equals a_1 and changes nothing. Simulated
(``scripts/sim_policy_spread.py``, E2B, 300 runs of 190 passes; both rules against neither): the `mixed` pair's walk
0.943x -> 0.994x the target alone (median 0.941x -> 0.976x), the `real` pair's 1.052x -> 1.047x; drafts right at
random: `real` 1.040x -> 1.052x, `sampled` 1.154x -> 1.184x (10th percentile 1.001x -> 1.084x), 0.45 at every depth
0.983x -> 0.980x, always right 1.70x both.

"Right after a miss" is the next pass only, and only drafts made then count there (patch 39zd: a shadow's miss had
marked every pass until the next draft was counted, so shadows far from any miss lifted that count to 0.86 in a live
E2B `mixed` run whose verified drafts right after a first draft's miss kept depth 1 in 3 of 13). Simulated with
shadows told as the engines tell them (``--live-shadows``, 200 runs of 370 passes): the `mixed` walk 0.974x -> 0.994x
on the Zen 5 card, 0.987x -> 0.989x on the live Zen 4 card; no other mean on the four cards lower by more than 0.001.

Pure arithmetic in one order, as the C++ twin (``common/draft-policy.h``) does it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gguf_exact.engines.shared.acceptance_class import ACCEPTANCE_CLASSES, GREEDY
from gguf_exact.engines.shared.policy_settings import PolicySettings

SHADOW_WEIGHT = 0.5  # a shadow's drafts count as this many verified ones (it sees the target alone's walk)
Counts = tuple[list[float], list[float], list[float]]  # tried per depth, kept per depth, depth 1 after a miss


@dataclass
class AcceptanceCounts:
    """One policy's acceptance counts, the current class's in use; see the module's docstring."""

    settings: PolicySettings = field(default_factory=PolicySettings)
    tried: list[float] = field(default_factory=list)  # decayed drafts tried at depth j (index j - 1), this class
    accepted: list[float] = field(default_factory=list)  # decayed drafts accepted there
    after_miss: list[float] = field(default_factory=lambda: [0.0, 0.0])  # depth 1 right after a miss: tried, kept
    missed: bool = False  # the token the last pass gave was a first draft's miss (verified, or a shadow's told)
    drafted_after_miss: bool = False  # the last choice came right after a miss (its verified drafts count there)
    shadow_after_miss: bool = False  # the last shadow asked came right after a miss (it is told passes later)
    current_class: str = GREEDY  # the acceptance class the counts are of (set_class)
    parked: dict[str, Counts] = field(default_factory=dict)  # other classes' counts

    def __post_init__(self) -> None:
        self.tried = self.tried or [0.0] * self.settings.n_max
        self.accepted = self.accepted or [0.0] * self.settings.n_max

    def acceptance(self, depth: int) -> float:
        """a_depth: the chance draft ``depth`` (1-based) is right once the ones before it were."""
        s = self.settings
        return (self.accepted[depth - 1] + s.prior * s.prior_weight) / (self.tried[depth - 1] + s.prior_weight)

    def after_a_miss(self) -> float:
        """a_1 right after a miss at depth 1: the decayed counts of the drafts made there, around a_1 at
        ``explore_weight`` (only drafts made right after a miss count, so one early miss alone must not hold drafting
        back: its own counts price it once about as many as exploration's)."""
        w = self.settings.explore_weight
        return (self.after_miss[1] + self.acceptance(1) * w) / (self.after_miss[0] + w)

    def set_class(self, name: str) -> bool:
        """The request starting is of acceptance class ``name``: its counts (a class never seen: none, the
        prior) price the drafts from now on, the others' kept as they are. True when the class changed."""
        if name not in ACCEPTANCE_CLASSES:
            raise ValueError(f"unknown acceptance class {name!r} (one of {', '.join(ACCEPTANCE_CLASSES)})")
        if name == self.current_class:
            return False
        self.parked[self.current_class] = (self.tried, self.accepted, self.after_miss)
        n, self.missed = self.settings.n_max, False
        self.tried, self.accepted, self.after_miss = self.parked.pop(name, ([0.0] * n, [0.0] * n, [0.0, 0.0]))
        self.current_class = name
        return True

    def count(
        self, drafted: int, accepted: int, chances: Sequence[float], weight: float = 1.0, after_miss: bool = False
    ) -> None:
        """``drafted`` drafts, the first ``accepted`` kept (``chances``: the rule's chance of keeping each, counted in
        their place), at ``weight`` (a shadow's: ``SHADOW_WEIGHT``); depth 1 also after a miss where the choice that
        made them came right after one (``after_miss``). Told at the pass whose token shows the first miss (or matches
        the last draft), so a first draft's miss marks the token just given, until the next pass
        (:meth:`.DraftPolicy.observe_pass`); a depth past the first miss was not tried."""
        d = self.settings.decay
        if drafted > 0:
            if after_miss:
                first = chances[0] if chances else (1.0 if accepted > 0 else 0.0)
                self.after_miss = [self.after_miss[0] * d + weight, self.after_miss[1] * d + weight * first]
            self.missed = accepted == 0
        for j in range(1, min(accepted + 1, drafted, self.settings.n_max) + 1):
            kept = chances[j - 1] if j <= len(chances) else (1.0 if j <= accepted else 0.0)
            self.tried[j - 1] = self.tried[j - 1] * d + weight
            self.accepted[j - 1] = self.accepted[j - 1] * d + weight * kept


__all__ = ["SHADOW_WEIGHT", "AcceptanceCounts"]
