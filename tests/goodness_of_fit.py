"""The goodness-of-fit test two test files share: a G-test of counted samples against exact probabilities, at a fixed threshold."""

from __future__ import annotations

import math

import numpy as np

Z_1E4 = 3.719016485455709  # the standard normal's 1 - 1e-4 quantile


def chi2_threshold(df: int) -> float:
    """The chi-square distribution's 1 - 1e-4 quantile at ``df`` (Wilson-Hilferty; within 1% from df 5)."""
    return df * (1 - 2 / (9 * df) + Z_1E4 * math.sqrt(2 / (9 * df))) ** 3


def g_test(observed: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """(G, degrees of freedom): cells expected below 5 pooled into one (with the smallest
    other cell while the pool is under 5); a count in a cell the target cannot reach is inf."""
    o, e = observed.ravel().astype(float), expected.ravel() * observed.sum()
    if o[e == 0].sum():
        return math.inf, 0
    small = e < 5
    if small.any() and e[small].sum() < 5:
        small[np.argmin(np.where(small, np.inf, e))] = True
    cells_o = np.append(o[~small], o[small].sum())
    cells_e = np.append(e[~small], e[small].sum())
    nz = cells_o > 0
    return float(2 * np.sum(cells_o[nz] * np.log(cells_o[nz] / cells_e[nz]))), len(cells_o) - 1
