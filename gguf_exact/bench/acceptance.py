"""Speculative sampling's acceptance per depth against the chances the rule itself gave
(``scripts/bench_acceptance.py``).

Under rejection sampling each verified draft is kept with probability sum_x min(p(x), q(x)) at its
context, and both engines write that chance into their ``LLAMA_SPEC_DRAFT_TRACE`` after each pass
(``result DRAFTED KEPT CHANCE...``: one chance per verified draft, the kept ones and the first
rejected). So at any scale the drafts kept at a depth are a sum of independent Bernoulli draws with
known means: their count minus the chances' sum, over the square root of sum c(1 - c), is a z-score
that a rule keeping drafts at any other rate drifts away from as drafts accrue. The pair's own
figure (``make-pair``'s sum min(p, q) per depth, over its contexts) is the rate a request should
see where its contexts are like the pair's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verified:
    """One pass's verification as a trace's ``result`` line tells it."""

    drafted: int
    kept: int
    chances: tuple[float, ...]  # one per verified draft, in depth order


@dataclass(frozen=True)
class DepthAcceptance:
    """The drafts verified at one depth, those kept, and what the rule's chances say to expect."""

    depth: int
    verified: int
    kept: int
    chance_sum: float
    chance_variance: float  # sum of c(1 - c): the kept count's variance

    @property
    def share(self) -> float:
        return self.kept / self.verified

    @property
    def mean_chance(self) -> float:
        return self.chance_sum / self.verified

    @property
    def z(self) -> float:
        """Standard deviations between the drafts kept and the chances' sum (0 where every chance is 0 or 1)."""
        return (self.kept - self.chance_sum) / math.sqrt(self.chance_variance) if self.chance_variance else 0.0


# A chance is a sum of min(p, q) over the candidates in float arithmetic: it may pass 1 by a rounding.
CHANCE_ROUNDING = 1e-6


class TraceError(ValueError):
    """A trace line that is not a well-formed ``result`` line with its chances."""


def read_results(text: str, source: str) -> list[Verified]:
    """The ``result`` lines of one trace text that carry chances (rejection sampling), checked: one chance
    per verified draft (the kept ones and the first rejected), each in [0, 1]. Other lines are the policy's
    and are skipped; exact-match and greedy passes tell no chances. ``source`` names the file in errors."""
    results = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0] != "result" or len(words) == 3:
            continue
        try:
            drafted, kept, chances = int(words[1]), int(words[2]), tuple(float(c) for c in words[3:])
        except (IndexError, ValueError):
            raise TraceError(f"{source}:{number}: not a result line: {line.strip()!r}") from None
        verified = min(kept + 1, drafted)
        if (
            not 0 <= kept <= drafted
            or len(chances) != verified
            or not all(-CHANCE_ROUNDING <= c <= 1.0 + CHANCE_ROUNDING for c in chances)
        ):
            raise TraceError(
                f"{source}:{number}: {len(chances)} chances for {drafted} drafted and {kept} kept "
                f"(expected {verified}, each in [0, 1]): {line.strip()!r}"
            )
        results.append(Verified(drafted, kept, chances))
    return results


def depth_acceptance(results: Iterable[Verified]) -> tuple[DepthAcceptance, ...]:
    """Per depth (1 first), the drafts verified there, those kept and their chances' sum and variance."""
    verified: list[int] = []
    kept: list[int] = []
    sums: list[float] = []
    variances: list[float] = []
    for result in results:
        for index, chance in enumerate(result.chances):
            if index == len(verified):  # deeper than any draft verified so far
                for column in (verified, kept):
                    column.append(0)
                for total in (sums, variances):
                    total.append(0.0)
            verified[index] += 1
            kept[index] += index < result.kept
            sums[index] += chance
            variances[index] += max(0.0, chance * (1.0 - chance))
    return tuple(
        DepthAcceptance(index + 1, verified[index], kept[index], sums[index], variances[index])
        for index in range(len(verified))
    )
