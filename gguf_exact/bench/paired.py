"""How sure a speed ratio between two arms is: request by request, each arm's request run seconds from its peer's.

Two arms measured side by side (``bench-real``'s rotation, ``bench-load``'s rounds) give one rate per request (or
round) each, paired by the request they served. The ratio of the arms is then the geometric mean of the paired
ratios, and how far it can be trusted a Student t interval on their logarithms: a shared host's drift falls on both
members of a pair, so what is left is each pair's own noise. (The requests of one arm are not independent draws:
its draft-length policy learns across them; the interval speaks for these requests on this machine.)

Why a table and not a library: the project's dependencies carry no statistics package (scipy is 40 MB for one
quantile), and Python's :mod:`statistics` has only the normal distribution, too narrow for 4-16 pairs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Student's t distribution's 0.975 quantile at 1..30 degrees of freedom (two-sided 95%); beyond, the normal's.
T_975 = (
    *(12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228),
    *(2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086),
    *(2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042),
)


def t_975(df: int) -> float:
    """Student's t 0.975 quantile at ``df`` >= 1 degrees of freedom."""
    return T_975[df - 1] if df <= len(T_975) else statistics.NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class PairedRatio:
    """``arm / base`` over ``pairs`` paired rates: the geometric mean, and its 95% interval (``low``, ``high``)."""

    ratio: float
    low: float
    high: float
    pairs: int

    def describe(self) -> str:
        """``0.990x (95% 0.970-1.010, 8 request pairs)``."""
        return f"{self.ratio:.3f}x (95% {self.low:.3f}-{self.high:.3f}, {self.pairs} request pairs)"


def paired_ratio(base: Sequence[float], arm: Sequence[float]) -> PairedRatio | None:
    """``arm``'s rates over ``base``'s, pair by pair (the same index: the same request); None where fewer than two
    pairs have both rates positive (no interval), or the sequences differ in length (not paired)."""
    if len(base) != len(arm):
        return None
    logs = [math.log(a / b) for b, a in zip(base, arm) if a > 0 and b > 0]
    if len(logs) < 2:
        return None
    mean = statistics.fmean(logs)
    half = t_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return PairedRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


__all__ = ["T_975", "PairedRatio", "paired_ratio", "t_975"]
