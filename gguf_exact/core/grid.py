"""Detection of the QAT 4-bit grid: per block of 32, integer levels and one step.

Pure numpy, no I/O. A block is *on the grid* when some step ``s`` and integer levels
``q`` in -8..8 (not both -8 and +8) reproduce every value to within a small fraction
of a step. Levels are found from the block's largest magnitude ``amax``: the step is
``amax / m`` for the extreme level ``m``. ``m = 8`` is tried first (llama.cpp's own
Q4_0 convention, ``d = max / -8``, and the cheapest case), then 7 down to 1. Levels
are then put in lowest terms (a block fitted at m = 8 whose levels are all even was
trained at m = 4: the same values, and those are its trained levels), and the step
is refined by least squares over the block.

Tolerance: a bf16 value is within 2**-8 (relative) of ``q * s``, and ``amax / m`` is
within 2**-8 of ``s``, so a genuine QAT block has residuals under ``s / 16``. We accept
``s / 8``. Random data passes a block with odds below 4**-31.
"""

from dataclasses import dataclass

import numpy as np

from gguf_exact.core.q4_0 import BLOCK_SIZE

TOLERANCE_STEPS = 1.0 / 8.0
EXTREME_LEVELS = (8, 7, 6, 5, 4, 3, 2, 1)


@dataclass(frozen=True)
class GridFit:
    """Per-block result of :func:`fit_grid` for ``n`` blocks."""

    levels: np.ndarray  # (n, 32) int8 in -8..7; sign folded into ``step``
    step: np.ndarray  # (n,) float32 least-squares step, negative for +8 blocks
    on_grid: np.ndarray  # (n,) bool
    residual: np.ndarray  # (n,) float32 largest |x - q*amax/m| in steps of amax/m (best m tried)


def fit_grid(values: np.ndarray) -> GridFit:
    """Fit levels and a step to each row of ``values`` (n_blocks, 32) float32.

    Values must be finite; callers check with :func:`gguf_exact.core.bf16.non_finite`.
    """
    x = np.asarray(values, dtype=np.float32)
    assert x.ndim == 2 and x.shape[1] == BLOCK_SIZE
    levels_t, step, on_grid, residual = fit_grid_t(np.ascontiguousarray(x.T))
    return GridFit(levels=np.ascontiguousarray(levels_t.T), step=step, on_grid=on_grid, residual=residual)


def fit_grid_t(x: np.ndarray):
    """:func:`fit_grid` on the transposed layout (32, n_blocks), one block per column.

    Reductions over a block then run across 32 contiguous rows, which numpy does at
    memory speed, instead of over a short inner axis, which it does slowly.
    Returns (levels (32, n) int8, step, on_grid, residual).
    """
    n = x.shape[1]
    x_max, x_min = x.max(axis=0), x.min(axis=0)
    amax = np.maximum(x_max, -x_min)
    extreme = np.zeros(n, dtype=np.float32)  # the m that fits, 0 for none or all-zero
    negate = np.zeros(n, dtype=bool)  # +8 blocks
    on_grid = amax == 0  # all-zero blocks: level 0, step 0
    residual = np.where(on_grid, np.float32(0), np.float32(np.inf)).astype(np.float32)

    pending = np.flatnonzero(~on_grid)
    for m in EXTREME_LEVELS:
        if pending.size == 0:
            break
        whole = pending.size == n  # skip the gathers on the first, usually complete, pass
        sel = slice(None) if whole else pending
        xp = x[:, sel]
        step = amax[sel] / np.float32(m)
        q = xp / step
        np.rint(q, out=q)
        q *= step
        q -= xp
        np.abs(q, out=q)
        r = q.max(axis=0) / step
        residual[pending] = np.minimum(residual[pending], r)
        fits = r <= TOLERANCE_STEPS
        if m == 8:
            # Level +8 needs a negative scale, so -8 and +8 cannot share a block.
            plus8 = x_max[sel] >= np.float32(7.5) * step
            minus8 = x_min[sel] <= np.float32(-7.5) * step
            fits &= ~(plus8 & minus8)
            negate[pending[fits & plus8]] = True
        extreme[pending[fits]] = m
        on_grid[pending[fits]] = True
        pending = pending[~fits]

    # Least-squares step over each on-grid block; its sign follows the folded levels.
    # Levels are recomputed in one pass rather than scattered from each try.
    # An infinite step gives level 0 to off-grid and all-zero blocks.
    coarse = np.divide(amax, extreme, out=np.full(n, np.inf, dtype=np.float32), where=extreme > 0)
    coarse[negate] *= -1
    lf = x / coarse
    np.rint(lf, out=lf)
    levels = lf.astype(np.int8)
    divisor = _common_factor(levels)
    reduce = np.flatnonzero(divisor > 1)
    if reduce.size:
        levels[:, reduce] //= divisor[reduce].astype(np.int8)
        lf = levels.astype(np.float32)
    qq = np.einsum("ij,ij->j", lf, lf)
    qx = np.einsum("ij,ij->j", lf, x)
    step = np.divide(qx, qq, out=np.zeros(n, dtype=np.float32), where=qq > 0)
    return levels, step, on_grid, residual


def _gcd_by_level_set() -> np.ndarray:
    """Table: bit set of the levels present (bit k for level k - 8) -> their gcd."""
    sets = np.arange(1 << 17, dtype=np.int32)
    gcd = np.ones(sets.size, dtype=np.int8)
    for divisor in (2, 3, 4, 5, 6, 7, 8):  # ascending, so the largest that fits wins
        not_multiples = sum(1 << (k + 8) for k in range(-8, 9) if k % divisor)
        gcd[(sets & not_multiples) == 0] = divisor
    gcd[sets == 1 << 8] = 1  # only zeros
    return gcd


_GCD = _gcd_by_level_set()


def _common_factor(levels: np.ndarray) -> np.ndarray:
    """Greatest common divisor of each block's levels (1 for zero blocks), from the
    set of levels present: one shift and one OR-reduction per value, then a table
    lookup per block (integer ``%`` in numpy is several times slower)."""
    present = np.bitwise_or.reduce(np.left_shift(1, levels.astype(np.int32) + 8), axis=0)
    return _GCD[present]


def level_histogram(levels: np.ndarray, on_grid: np.ndarray) -> np.ndarray:
    """Counts of levels -8..7 over on-grid blocks, as 16 integers."""
    return np.bincount((levels[on_grid].astype(np.int16) + 8).ravel(), minlength=16)
