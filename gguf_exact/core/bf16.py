"""bfloat16 as raw bits (uint16): the only form in which source weights are compared.

bf16 is the top half of an IEEE float32, so widening is a shift and narrowing is
round-to-nearest-even on the dropped 16 bits. Done with integer ops rather than
``ml_dtypes`` casts because these run on every value in the hot loop and need no
NaN handling (NaN and Inf are rejected before they get here).
"""

import numpy as np

SIGN_MASK = np.uint16(0x8000)
MAGNITUDE_MASK = np.uint16(0x7FFF)
EXPONENT_MASK = np.uint16(0x7F80)


def to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bf16 bits to float32 values (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def from_f32(values: np.ndarray) -> np.ndarray:
    """Round float32 values to bf16 bits, nearest-even (finite inputs only)."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    r = u >> 16  # in-place steps on one temporary; ``values`` is never written
    r &= np.uint32(1)
    r += u
    r += np.uint32(0x7FFF)
    r >>= 16
    return r.astype(np.uint16)


def non_finite(bits: np.ndarray) -> np.ndarray:
    """Mask of NaN or Inf values (exponent all ones)."""
    return (bits & EXPONENT_MASK) == EXPONENT_MASK


def same_value(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bit equality with +0 and -0 taken as equal.

    llama.cpp decodes level 0 as ``0.0f * d``, whose sign follows ``d``; QAT exports
    may hold either zero.
    """
    return (a == b) | (((a | b) & MAGNITUDE_MASK) == 0)


def ordered(bits: np.ndarray) -> np.ndarray:
    """Map bf16 bits to integers that are monotonic in value (+0 and -0 both 0)."""
    b = bits.astype(np.int32)
    return np.where(b & 0x8000, -(b & 0x7FFF), b)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many bf16 steps apart two bf16 values are."""
    return np.abs(ordered(a) - ordered(b))


def from_exact(values: np.ndarray) -> np.ndarray | None:
    """bf16 bits of float16/float32 ``values`` when every one is a bf16 value (nothing is
    lost); None otherwise. bf16 bits (uint16) pass through."""
    if values.dtype == np.uint16:
        return values
    wide = np.asarray(values, dtype=np.float32)
    bits = from_f32(wide)
    return bits if np.array_equal(to_f32(bits).view(np.uint32), wide.view(np.uint32)) else None
