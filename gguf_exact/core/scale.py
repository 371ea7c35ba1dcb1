"""Choice of each block's fp16 scale, for bit-exact decoding.

Pure numpy, no I/O. Levels are fixed (the trained ones from :mod:`gguf_exact.core.grid`);
only ``d`` is chosen. A value is *exact* when bf16(level * d), computed in float32 as
llama.cpp decodes, has the source's bf16 bits (+0 and -0 equal). Per block we take
the fp16 ``d`` with the most exact values, ties going to the smaller largest error
``|level*d - x|``, then to the candidate nearest the least-squares step.

Candidates are fp16 neighbours of the least-squares step, counted in units in the
last place (ULPs). The nearest one is taken outright when it reproduces all 32 values
(about 87% of blocks on simulated fp32-step QAT data; no other candidate can count
more). The rest are scored over ±1 ULP, and those still inexact over ±4, beyond which
no better candidate was ever seen on such data.
"""

from dataclasses import dataclass

import numpy as np

from gguf_exact.core import bf16
from gguf_exact.errors import GgufExactError

NEAR_OFFSETS = (-1, 1)
WIDE_OFFSETS = (-2, 2, -3, 3, -4, 4)
FP16_MAX_FINITE_BITS = 0x7BFF


@dataclass(frozen=True)
class ScaleChoice:
    d: np.ndarray  # (n,) float16, signed
    exact: np.ndarray  # (n,) int32 values per block that decode to the source bits
    max_error: np.ndarray  # (n,) float32 largest |level*d - x|, for blocks that were scored


def _matches(decoded: np.ndarray, source_bits: np.ndarray) -> np.ndarray:
    """bf16(decoded) has the source's bits, +0 and -0 equal.

    Comparing magnitudes is enough here: a level's sign times the scale's sign is the
    source value's sign by construction, so nonzero values never differ in sign alone.
    """
    return ((bf16.from_f32(decoded) ^ source_bits) & bf16.MAGNITUDE_MASK) == 0


def _score(levels_f32, source_bits, source_f32, d16):
    decoded = levels_f32 * d16.astype(np.float32)
    exact = _matches(decoded, source_bits).sum(axis=0, dtype=np.int32)
    max_error = np.abs(decoded - source_f32).max(axis=0)
    return exact, max_error


def _candidates(base_bits: np.ndarray, negative: np.ndarray, offset: int) -> np.ndarray:
    bits = np.clip(base_bits.astype(np.int32) + offset, 0, FP16_MAX_FINITE_BITS).astype(np.uint16)
    return np.where(negative, bits | np.uint16(0x8000), bits).view(np.float16)


def _search(levels_f32, source_bits, source_f32, base_bits, negative, offsets, best):
    best_d, best_exact, best_err = best
    for offset in offsets:
        d16 = _candidates(base_bits, negative, offset)
        exact, err = _score(levels_f32, source_bits, source_f32, d16)
        better = (exact > best_exact) | ((exact == best_exact) & (err < best_err))
        best_d = np.where(better, d16, best_d)
        best_exact = np.where(better, exact, best_exact)
        best_err = np.where(better, err, best_err)
    return best_d, best_exact, best_err


def choose_scales(levels: np.ndarray, source_bits: np.ndarray, step: np.ndarray) -> ScaleChoice:
    """Pick ``d`` per block for ``levels`` (n, 32) int8, the source ``source_bits``
    (n, 32) bf16 bits, and the least-squares ``step`` (n,) float32."""
    return choose_scales_t(np.ascontiguousarray(levels.T), np.ascontiguousarray(source_bits.T), step)


def choose_scales_t(levels: np.ndarray, source_bits: np.ndarray, step: np.ndarray) -> ScaleChoice:
    """:func:`choose_scales` on the transposed layout (32, n), one block per column."""
    n = levels.shape[1]
    magnitude = np.abs(step).astype(np.float16)
    if np.isinf(magnitude).any():
        worst = float(np.abs(step).max())
        raise GgufExactError(f"a block step of {worst:.6g} is beyond the fp16 range of Q4_0 scales")
    base_bits = magnitude.view(np.uint16)
    negative = step < 0
    levels_f32 = levels.astype(np.float32)
    source_f32 = bf16.to_f32(source_bits)

    d = _candidates(base_bits, negative, 0)
    decoded = levels_f32 * d.astype(np.float32)
    exact = _matches(decoded, source_bits).sum(axis=0, dtype=np.int32)
    # Blocks taken outright need no error figure for a tie-break; 0 marks them.
    err = np.zeros(n, dtype=np.float32)
    todo = np.flatnonzero(exact < levels.shape[0])
    err[todo] = np.abs(decoded[:, todo] - source_f32[:, todo]).max(axis=0)

    for offsets in (NEAR_OFFSETS, WIDE_OFFSETS):
        todo = np.flatnonzero(exact < levels.shape[0])
        if todo.size == 0:
            break
        sub = _search(
            levels_f32[:, todo],
            source_bits[:, todo],
            source_f32[:, todo],
            base_bits[todo],
            negative[todo],
            offsets,
            (d[todo], exact[todo], err[todo]),
        )
        d[todo], exact[todo], err[todo] = sub
    return ScaleChoice(d=d, exact=exact, max_error=err)  # max_error: 0 for blocks taken outright
