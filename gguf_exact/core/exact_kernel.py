"""The exact packer's kernel: one pass over a chunk of blocks, compiled by numba.

Grid fit (:mod:`.grid`), scale choice (:mod:`.scale`), the 18 Q4_0 bytes and the error
against the source, per block, with counters in the layout of :mod:`.kernels`. This file
is the source of both builds: numba's JIT (``@njit`` below, cached beside it) and the
ahead-of-time extension (:mod:`gguf_exact.builds.aot_kernels_build` compiles the same
functions' Python with ``numba.pycc``). Callers go through :func:`.kernels.active`, never
import it: :func:`gguf_exact.core.exact.plan_rows` is the wrapper.
"""

import numpy as np
from numba import njit

from gguf_exact.core.grid import FINITE_MATH, NO_NRT, fit_block
from gguf_exact.core.kernels import FIRST_BAD_SCALE, FIRST_NON_FINITE, MAX_ULPS, N_EXACT, N_NON_FINITE, N_OFF_GRID
from gguf_exact.core.scale import FP16_INF_BITS, choose_block_scale, count_exact, fp16_value


@njit(cache=True, nogil=True)
def pack_blocks(
    bits, out, counters, sq, histogram, off_blocks, off_residual, score_partial, with_histogram, gcd_by_level_set
):
    """Everything exact Q4_0 does to a chunk, in one pass over it: for each block (row)
    of ``bits`` (n, 32) bf16 bits, check the values are finite, fit the grid
    (:func:`~gguf_exact.core.grid.fit_block`), choose the scale
    (:func:`~gguf_exact.core.scale.choose_block_scale`), write the 18 Q4_0 bytes into
    ``out`` (n, 18), and measure the decoded block against the source as
    :func:`~gguf_exact.core.error_stats.compare_chunk` does (bf16-rounded ``level * d``:
    exact values, largest error in ULPs, squared error and squared source into ``sq``).

    Fills ``counters`` (see ``N_OFF_GRID`` ...), ``histogram`` (levels -8..7 of on-grid
    blocks), and the first off-grid blocks with their residuals (as many as
    ``off_blocks`` holds). Off-grid blocks are written as zeros (level 0, d 0). With
    ``score_partial`` false, scales are skipped once a block is off the grid. Stops at
    the first non-finite value (its flat index in ``FIRST_NON_FINITE``, all of them
    counted in ``N_NON_FINITE``) and at the first step beyond fp16's range."""
    x = np.empty(32, np.float32)
    x_bits = x.view(np.uint32)
    q = np.empty(32, np.float32)
    p = np.empty(32, np.float32)
    p_bits = p.view(np.uint32)
    e = np.empty(32, np.float32)
    levels = np.empty(32, np.int8)
    source = np.empty(32, np.uint16)  # a block's bits, copied: a row view (bits[b]) is a count taken and dropped
    counters[:] = 0
    counters[FIRST_NON_FINITE] = -1
    counters[FIRST_BAD_SCALE] = -1
    sq[:] = 0.0
    histogram[:] = 0
    flat = bits.reshape(-1)
    n_non_finite = 0
    for k in range(flat.size):  # counted without a branch, it vectorises; the first is looked for when there is one
        n_non_finite += (flat[k] & 0x7F80) == 0x7F80
    if n_non_finite:
        counters[N_NON_FINITE] = n_non_finite
        for k in range(flat.size):
            if (flat[k] & 0x7F80) == 0x7F80:
                counters[FIRST_NON_FINITE] = k
                break
        return
    outputs = (out, counters, sq, histogram, off_blocks, off_residual)
    scratch = (x, x_bits, q, p, p_bits, e, levels, source)
    each_block(bits, flat, outputs, scratch, score_partial, with_histogram, gcd_by_level_set)


@njit(**NO_NRT, cache=True, nogil=True, fastmath=FINITE_MATH)
def each_block(bits, flat, outputs, scratch, score_partial, with_histogram, gcd_by_level_set):
    """:func:`pack_blocks`' loop over the blocks (``flat``: ``bits`` as one row), writing its
    ``outputs`` with its ``scratch`` arrays (tuples, in the order pack_blocks makes them). The
    per-block helpers are inlined into it by numba (``inline="always"``), and it is compiled
    without the reference-counting runtime (see :mod:`gguf_exact.core.grid`): a call per block
    passed about 35 words of array structures and cost a fifth of the packer's time. Inlined,
    they take this function's ``fastmath`` flags: FINITE_MATH, which the grid fit and the scale
    choice carry and which changes no value on finite data (the values are checked before this
    loop); the two float64 sums that may also reassociate (``level_sums``, :func:`square_sum`)
    stay calls of their own (LLVM inlines them, with their flags)."""
    out, counters, sq, histogram, off_blocks, off_residual = outputs
    x, x_bits, q, p, p_bits, e, levels, source = scratch
    for b in range(bits.shape[0]):
        first = b * 32  # loops over .size, not 32, stay vector loops (see grid.fit_block)
        for i in range(source.size):
            source[i] = flat[first + i]
        for i in range(x.size):
            x_bits[i] = np.uint32(source[i]) << 16
        on_grid, step, residual = fit_block(x, levels, q, e, gcd_by_level_set)
        if not on_grid:
            n_off = counters[N_OFF_GRID]
            if n_off < off_blocks.size:
                off_blocks[n_off] = b
                off_residual[n_off] = residual
            counters[N_OFF_GRID] = n_off + 1
            for j in range(18):
                out[b, j] = 0
            continue
        if counters[N_OFF_GRID] and not score_partial:
            continue
        d_bits, exact, _ = choose_block_scale(levels, x, source, step, p, e)
        if (d_bits & 0x7FFF) == FP16_INF_BITS:
            counters[FIRST_BAD_SCALE] = b
            return
        out[b, 0] = d_bits & 0xFF
        out[b, 1] = d_bits >> 8
        for j in range(16):
            out[b, 2 + j] = (levels[j] + 8) | ((levels[j + 16] + 8) << 4)
        if with_histogram:
            for i in range(32):
                histogram[levels[i] + 8] += 1
        counters[N_EXACT] += exact
        sq[1] += square_sum(x)
        if exact == 32:
            continue
        d = fp16_value(d_bits & 0x7FFF)
        count_exact(levels, -d if d_bits & 0x8000 else d, source, p)  # level * d of the chosen d, in p
        for i in range(32):
            u = p_bits[i]
            r = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16
            s = np.uint32(source[i])
            if r == s or ((r | s) & 0x7FFF) == 0:  # +0 and -0 are the same value
                continue
            counters[MAX_ULPS] = max(counters[MAX_ULPS], abs(ordered(r) - ordered(s)))
            p_bits[i] = r << 16
            diff = np.float64(p[i]) - np.float64(x[i])
            sq[0] += diff * diff


@njit(**NO_NRT, cache=True, nogil=True, fastmath=FINITE_MATH | {"reassoc"})
def square_sum(x):
    """Sum of squares in float64: exact in any order on a fitted block (16-bit squares
    whose exponents lie within a few bits of each other), so it may vectorise."""
    total = 0.0
    for i in range(x.size):
        total += np.float64(x[i]) * np.float64(x[i])
    return total


@njit(**NO_NRT, inline="always", cache=True, nogil=True)
def ordered(bits):
    """bf16 bits as an integer monotonic in value (+0 and -0 both 0), as
    :func:`gguf_exact.core.bf16.ordered`."""
    magnitude = np.int64(bits & 0x7FFF)
    return -magnitude if bits & 0x8000 else magnitude
