"""Detection of the QAT 4-bit grid: per block of 32, integer levels and one step.

A block is *on the grid* when some step ``s`` and integer levels ``q`` in -8..8 (not
both -8 and +8) reproduce every value to within a small fraction of a step. Levels are
found from the block's largest magnitude ``amax``: the step is ``amax / m`` for the
extreme level ``m``. ``m = 8`` is tried first (llama.cpp's own Q4_0 convention,
``d = max / -8``, and the cheapest case), then 7 down to 1. Levels are then put in
lowest terms (a block fitted at m = 8 whose levels are all even was trained at m = 4:
the same values, and those are its trained levels), and the step is refined by least
squares over the block.

Tolerance: a bf16 value is within 2**-8 (relative) of ``q * s``, and ``amax / m`` is
within 2**-8 of ``s``, so a genuine QAT block has residuals under ``s / 16``. We accept
``s / 8``. Random data passes a block with odds below 4**-31.

The per-block work is a loop compiled by numba (``fit_block``): as whole-array numpy it
took about 30 passes over the data and ran at a third of the speed (see
``scripts/bench_convert.py``). Part of the kernels' source (:mod:`.kernels`): the
packer's kernel calls it, JIT or compiled ahead of time. Pure functions on numpy arrays, no I/O.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from gguf_exact.core.kernels import GCD_BY_LEVEL_SET
from gguf_exact.core.q4_0 import BLOCK_SIZE

TOLERANCE_STEPS = np.float32(1.0 / 8.0)


# The flags let LLVM vectorise; with finite inputs (callers check) they change no value:
# "contract", "reassoc", "arcp" and "afn", which would, are left out.
FINITE_MATH = {"nnan", "ninf", "nsz"}

# The per-block helpers (here, in .scale and .exact_kernel) are compiled without numba's
# reference-counting runtime (``_nrt=False``: not in numba's user documentation, but the
# option numba's own helpers use, numba.misc.mergesort and numba.cpython.unicode). They allocate
# nothing and only index arrays their caller holds; with it, every call took and dropped a count
# on each array argument (two calls into the runtime per array, a few calls per block): 15% of
# the packer's time (perf). Those marked ``inline="always"`` are inlined by numba into their
# callers (exact_kernel.each_block, the packer's loop). The bytes depend on neither (the build's
# probe, tests/test_same_bytes.py); pack_blocks, which allocates its scratch, keeps the runtime.
# Passed as ``**NO_NRT``: numba's type stubs list only its documented options.
NO_NRT: dict[str, Any] = {"_nrt": False}


@njit(**NO_NRT, inline="always", cache=True, nogil=True, fastmath=FINITE_MATH)
def max_bits(e):
    """The largest of ``e`` (float32, all >= 0) as int32 bits. Integers order like the
    non-negative floats they encode, and an integer maximum vectorises where numba's
    float ``max`` does not."""
    eb = e.view(np.int32)
    worst = np.int32(0)
    for i in range(eb.size):
        worst = max(worst, eb[i])
    return worst


@njit(**NO_NRT, cache=True, nogil=True, fastmath=FINITE_MATH | {"reassoc"})
def level_sums(levels, x):
    """``sum(q*q)`` and ``sum(q*x)`` for the least-squares step. The float64 sum is exact
    in any order (each term has at most 12 significant bits, and on a fitted block the
    non-zero terms' exponents lie within a few bits of each other), so "reassoc" may
    vectorise it without changing a bit."""
    qq = 0
    qx = 0.0
    for i in range(levels.size):
        level = levels[i]
        qq += level * level
        qx += level * np.float64(x[i])
    return qq, qx


@njit(**NO_NRT, inline="always", cache=True, nogil=True, fastmath=FINITE_MATH)
def fit_block(x, levels, q, e, gcd_by_level_set):
    """Fit one block: ``x`` (32,) float32 finite values; writes ``levels`` (32,) int8 in
    -8..7 (sign folded into the step); ``q`` and ``e`` are (32,) float32 scratch. Returns
    (on_grid, least-squares step, residual): the step is negative for +8 blocks and 0
    for zero or off-grid blocks; the residual is the largest ``|x - q * amax/m|`` in
    steps of ``amax/m``, for the best ``m`` tried.

    Loops run over ``x.size`` rather than a constant 32, which LLVM would unroll into
    scalar code; the rounded ``x / step`` of the fitting ``m`` are the levels (``x / -step``
    is ``-(x / step)`` exactly, and ``rint`` is symmetric)."""
    n = x.size
    xb = x.view(np.int32)
    eb = e.view(np.int32)
    amax_bits = np.int32(0)
    for i in range(n):
        amax_bits = max(amax_bits, xb[i] & np.int32(0x7FFFFFFF))
    eb[0] = amax_bits
    amax = e[0]
    if amax == 0:
        levels[:] = 0
        return True, np.float32(0), np.float32(0)
    residual = np.float32(np.inf)
    extreme = 0
    negate = False
    for m in range(8, 0, -1):
        step = amax / np.float32(m)
        for i in range(n):
            qi = np.rint(x[i] / step)
            q[i] = qi
            e[i] = abs(qi * step - x[i])
        eb[0] = max_bits(e)
        r = e[0] / step
        residual = min(residual, r)
        fits = r <= TOLERANCE_STEPS
        plus8 = False
        if m == 8:
            # Level +8 needs a negative scale, so -8 and +8 cannot share a block.
            threshold = np.float32(7.5) * step
            n_high = 0
            n_low = 0
            for i in range(n):
                n_high += x[i] >= threshold
                n_low += x[i] <= -threshold
            plus8 = n_high > 0
            if plus8 and n_low > 0:
                fits = False
        if fits:
            extreme = m
            negate = plus8
            break
    if extreme == 0:
        levels[:] = 0
        return False, np.float32(0), residual
    sign = np.int32(-1) if negate else np.int32(1)
    present = np.int32(0)
    for i in range(n):
        level = np.int32(q[i]) * sign
        levels[i] = level
        present |= np.int32(1) << (level + 8)
    divisor = gcd_by_level_set[present]
    if divisor > 1:  # rare, and an integer division per value costs more than the rest
        for i in range(n):
            levels[i] = levels[i] // divisor
    qq, qx = level_sums(levels, x)
    return True, np.float32(qx / qq), residual


@njit(cache=True, nogil=True)
def _fit_blocks(values, levels, step, on_grid, residual, gcd_by_level_set):
    q = np.empty(32, np.float32)
    e = np.empty(32, np.float32)
    for b in range(values.shape[0]):
        on_grid[b], step[b], residual[b] = fit_block(values[b], levels[b], q, e, gcd_by_level_set)


@dataclass(frozen=True)
class GridFit:
    """Per-block result of :func:`fit_grid` for ``n`` blocks."""

    levels: np.ndarray  # (n, 32) int8 in -8..7; sign folded into ``step``
    step: np.ndarray  # (n,) float32 least-squares step, negative for +8 blocks
    on_grid: np.ndarray  # (n,) bool
    residual: np.ndarray  # (n,) float32 largest |x - q*amax/m| in steps of amax/m (best m tried)


def fit_grid(values: np.ndarray) -> GridFit:
    """:func:`fit_block` over each row of ``values`` (n_blocks, 32) float32.

    Values must be finite; callers check with :func:`gguf_exact.core.bf16.non_finite`.
    """
    x = np.ascontiguousarray(values, dtype=np.float32)
    assert x.ndim == 2 and x.shape[1] == BLOCK_SIZE
    n = x.shape[0]
    fit = GridFit(
        np.zeros((n, BLOCK_SIZE), np.int8), np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, np.float32)
    )
    _fit_blocks(x, fit.levels, fit.step, fit.on_grid, fit.residual, GCD_BY_LEVEL_SET)
    return fit
