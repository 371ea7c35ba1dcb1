"""Choice of each block's fp16 scale, for bit-exact decoding.

Levels are fixed (the trained ones from :mod:`gguf_exact.core.grid`); only ``d`` is
chosen. A value is *exact* when bf16(level * d), computed in float32 as llama.cpp
decodes, has the source's bf16 bits (+0 and -0 equal). Per block we take the fp16 ``d``
with the most exact values, ties going to the smaller largest error ``|level*d - x|``,
then to the candidate nearest the least-squares step.

Candidates are fp16 neighbours of the least-squares step, counted in units in the last
place (ULPs). The nearest one is taken outright when it reproduces all 32 values (about
87% of blocks on simulated fp32-step QAT data; no other candidate can count more).
Otherwise ±1 ULP is scored, and when that still leaves values inexact, ±2 to ±4, beyond
which no better candidate was ever seen on such data.

Compiled by numba like :mod:`gguf_exact.core.grid`; fp16 and bf16 roundings are done on
integer bits here because numba has no float16 scalars. Pure functions, no I/O.
"""

from dataclasses import dataclass

import numpy as np
from numba import njit

from gguf_exact.core import bf16
from gguf_exact.core.grid import FINITE_MATH, NO_NRT, max_bits
from gguf_exact.errors import InputError

OFFSETS = np.array([0, -1, 1, -2, 2, -3, 3, -4, 4], dtype=np.int64)  # in trying order
NEAR = 3  # OFFSETS[:NEAR] are always scored for a block the nearest does not settle
FP16_INF_BITS = 0x7C00
FP16_MAX_FINITE_BITS = 0x7BFF
# 2.0 ** (exponent - 25) per value of fp16's exponent field: a power with a variable exponent
# is a loop of multiplications and a division in numba; these are the same exact values, looked up.
POWERS_OF_TWO = 2.0 ** np.arange(-25, 7, dtype=np.float64)
# Helpers compiled with _nrt=False: see gguf_exact.core.grid.


@njit(**NO_NRT, inline="always", cache=True, nogil=True)
def fp16_bits(a, a_bits):
    """fp16 bits nearest (ties to even) to a positive finite float32 ``a`` whose bits are
    ``a_bits``; ``FP16_INF_BITS`` past the largest finite fp16."""
    v = np.float64(a)
    if v >= 65520.0:
        return FP16_INF_BITS
    if v < 2.0**-14:  # fp16 subnormal: a multiple of 2**-24
        return int(np.rint(v * 2.0**24))
    mantissa = int(a_bits & 0x7FFFFF)
    h = ((int((a_bits >> 23) & 0xFF) - 112) << 10) | (mantissa >> 13)
    rest = mantissa & 0x1FFF
    if rest > 0x1000 or (rest == 0x1000 and (h & 1)):
        h += 1  # a carry into the exponent is right too
    return h


@njit(**NO_NRT, inline="always", cache=True, nogil=True)
def fp16_value(h):
    """float32 value of positive fp16 bits ``h`` (exact)."""
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    if exponent == 0:
        return np.float32(mantissa * 2.0**-24)
    return np.float32((1024 + mantissa) * POWERS_OF_TWO[exponent])


@njit(**NO_NRT, inline="always", cache=True, nogil=True, fastmath=FINITE_MATH)
def count_exact(levels, d, bits, p):
    """Write ``levels * d`` (float32, exact: an 11-bit d times a 4-bit level) into ``p``;
    return how many of them round (bf16, nearest-even, on the bits) to the magnitude of
    the source ``bits``. Magnitudes suffice: a level's sign times d's is the value's sign
    by construction."""
    for i in range(levels.size):
        p[i] = np.float32(levels[i]) * d
    pb = p.view(np.uint32)
    exact = 0
    for i in range(pb.size):
        u = pb[i]
        rounded = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16
        exact += ((rounded ^ np.uint32(bits[i])) & np.uint32(0x7FFF)) == 0
    return exact


@njit(**NO_NRT, inline="always", cache=True, nogil=True, fastmath=FINITE_MATH)
def max_error(p, x, e):
    """Largest ``|p - x|``, using ``e`` as scratch."""
    for i in range(p.size):
        e[i] = abs(p[i] - x[i])
    worst = max_bits(e)
    e.view(np.int32)[0] = worst
    return e[0]


@njit(**NO_NRT, inline="always", cache=True, nogil=True, fastmath=FINITE_MATH)
def choose_block_scale(levels, x, bits, step, p, e):
    """Pick ``d`` for one block: ``levels`` (32,) int8, source values ``x`` (32,) float32
    and their bf16 ``bits`` (32,) uint16, least-squares ``step``; ``p`` and ``e`` are (32,)
    float32 scratch. Returns (signed fp16 bits of d, exact values, largest error; the
    error is 0 for a block the nearest candidate settles). fp16 bits ``FP16_INF_BITS``:
    the step is beyond fp16's range."""
    negative = step < 0
    e[0] = abs(step)
    base = fp16_bits(e[0], e.view(np.uint32)[0])
    if base == FP16_INF_BITS:
        return FP16_INF_BITS, 0, np.float32(np.inf)
    best_d = base
    best_exact = -1
    best_error = np.float32(np.inf)
    for j in range(OFFSETS.size):
        if j == NEAR and best_exact == 32:
            break
        candidate = min(max(base + OFFSETS[j], 0), FP16_MAX_FINITE_BITS)
        d = fp16_value(candidate)
        if negative:
            d = -d
        exact = count_exact(levels, d, bits, p)
        if j == 0 and exact == 32:
            return candidate | (0x8000 if negative else 0), 32, np.float32(0)
        error = max_error(p, x, e)
        if exact > best_exact or (exact == best_exact and error < best_error):
            best_d, best_exact, best_error = candidate, exact, error
    return best_d | (0x8000 if negative else 0), best_exact, best_error


@njit(cache=True, nogil=True)
def _choose_scales(levels, x, bits, step, d_bits, exact, largest_error):
    p = np.empty(32, np.float32)
    e = np.empty(32, np.float32)
    for b in range(levels.shape[0]):
        d_bits[b], exact[b], largest_error[b] = choose_block_scale(levels[b], x[b], bits[b], step[b], p, e)


@dataclass(frozen=True)
class ScaleChoice:
    d: np.ndarray  # (n,) float16, signed
    exact: np.ndarray  # (n,) int32 values per block that decode to the source bits
    max_error: np.ndarray  # (n,) float32 largest |level*d - x|, for blocks that were scored


def choose_scales(levels: np.ndarray, source_bits: np.ndarray, step: np.ndarray) -> ScaleChoice:
    """:func:`choose_block_scale` for each block: ``levels`` (n, 32) int8, the source
    ``source_bits`` (n, 32) bf16 bits, and the least-squares ``step`` (n,) float32."""
    n = levels.shape[0]
    d_bits = np.zeros(n, np.uint16)
    exact = np.zeros(n, np.int32)
    largest_error = np.zeros(n, np.float32)
    bits = np.ascontiguousarray(source_bits, dtype=np.uint16)
    step = np.ascontiguousarray(step, dtype=np.float32)
    _choose_scales(np.ascontiguousarray(levels), bf16.to_f32(bits), bits, step, d_bits, exact, largest_error)
    if ((d_bits & 0x7FFF) == FP16_INF_BITS).any():
        raise InputError(f"a block step of {float(np.abs(step).max()):.6g} is beyond the fp16 range of Q4_0 scales")
    return ScaleChoice(d=d_bits.view(np.float16), exact=exact, max_error=largest_error)
