"""Error figures of decoded values against the source, summed chunk by chunk.

Bit-exact values, largest error in ULPs, squared error and squared source. Errors are
measured at the source's own precision: decoded float32 values are rounded to the
source's type (bf16, float16, or float32 itself) before they are compared, and ULPs
are that type's. For bf16 sources this matters: in float32, ``level * d`` differs from a
bf16 source by the source's rounding of the trained value (about 2**-9 relative) even
where the bits match, which would hide the difference between formats that these
figures are for. A chunk that is mostly exact costs a few passes: only values whose
rounded bits differ from the source are looked at again. The exact Q4_0 packer
measures its own output the same way inside its kernel (:mod:`gguf_exact.core.exact_kernel`).
"""

from dataclasses import dataclass

import numpy as np

from gguf_exact.core import bf16


@dataclass
class ErrorStats:
    n_values: int = 0
    exact: int = 0
    max_ulps: int = 0  # -1: not measured
    sq_error: float = 0.0
    sq_source: float = 0.0

    @property
    def exact_fraction(self) -> float:
        return self.exact / self.n_values if self.n_values else 1.0

    @property
    def rel_error(self) -> float:
        """Relative RMS error, ||decoded - source|| / ||source||."""
        return float(np.sqrt(self.sq_error / self.sq_source)) if self.sq_source else float(self.sq_error > 0)

    def add(self, other: "ErrorStats") -> None:
        if not self.n_values:
            self.max_ulps = other.max_ulps
        elif min(self.max_ulps, other.max_ulps) < 0:
            self.max_ulps = -1  # not measured somewhere
        else:
            self.max_ulps = max(self.max_ulps, other.max_ulps)
        self.n_values += other.n_values
        self.exact += other.exact
        self.sq_error += other.sq_error
        self.sq_source += other.sq_source

    def as_dict(self) -> dict:
        out = {"values": self.n_values, "exact_values": self.exact, "exact_fraction": self.exact_fraction}
        if self.max_ulps >= 0:
            out["max_ulps"] = self.max_ulps
        return out | {"rel_error": self.rel_error}


def sum_stats(parts) -> ErrorStats | None:
    """The sum of the given figures (None entries skipped); None when there are none."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    total = ErrorStats()
    for p in parts:
        total.add(p)
    return total


def _as_bits(values: np.ndarray, like: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (float32) rounded to the source type ``like`` (bf16 given as uint16), as
    (unsigned bits, the rounded values as float64)."""
    if like == np.uint16:
        bits = bf16.from_f32(values)
        return bits, bf16.to_f32(bits).astype(np.float64)
    rounded = values.astype(like)
    return rounded.view(np.uint16 if like == np.float16 else np.uint32), rounded.astype(np.float64)


def _ordered(bits: np.ndarray) -> np.ndarray:
    """Unsigned float bits -> integers monotonic in value (+0 and -0 both 0)."""
    sign = np.array(1, bits.dtype) << (bits.dtype.itemsize * 8 - 1)
    magnitude = (bits & ~sign).astype(np.int64)
    return np.where(bits & sign, -magnitude, magnitude)


def compare_chunk(decoded: np.ndarray, source: np.ndarray, ulps: bool = True) -> ErrorStats:
    """:class:`ErrorStats` of float32 ``decoded`` against ``source``: bf16 bits (uint16),
    float16 or float32 values, compared at that precision.

    ``ulps=False`` skips the largest error in ULPs (reported as -1). Sums use
    ``einsum`` rather than BLAS dot products: BLAS may hand short vectors to its own
    threads, which costs more than the sum when the cores are busy.
    """
    decoded = np.asarray(decoded, dtype=np.float32).ravel()
    source = np.asarray(source).ravel()
    if source.dtype not in (np.uint16, np.float16, np.float32):
        raise TypeError(f"source of dtype {source.dtype}: expected bf16 bits (uint16), float16 or float32")
    source_bits = (
        source if source.dtype == np.uint16 else source.view(np.uint16 if source.dtype == np.float16 else np.uint32)
    )
    sign = np.array(1, source_bits.dtype) << (source_bits.dtype.itemsize * 8 - 1)
    rounded, _ = _as_bits(decoded, source.dtype)
    flipped = rounded ^ source_bits
    differ = flipped != 0
    # +0 and -0 are the same value
    differ &= (flipped != sign) | ((rounded & ~sign) != 0)
    n_differ = int(np.count_nonzero(differ))
    max_ulps, sq_error = (0 if ulps else -1), 0.0
    source_values = _values(source)
    if n_differ:
        where = slice(None) if n_differ * 4 > decoded.size else np.flatnonzero(differ)
        r, s = rounded[where], source_bits[where]
        if ulps:
            max_ulps = int(np.abs(_ordered(r) - _ordered(s)).max())
        _, r_values = _as_bits(decoded[where], source.dtype)
        diff = r_values - source_values[where].astype(np.float64)
        sq_error = float(np.einsum("i,i->", diff, diff))
    return ErrorStats(
        n_values=decoded.size,
        exact=decoded.size - n_differ,
        max_ulps=max_ulps,
        sq_error=sq_error,
        sq_source=float(np.einsum("i,i->", source_values, source_values)),  # float32 sum of one chunk, then float64
    )


def _values(source: np.ndarray) -> np.ndarray:
    """The source as float32 values (bf16 bits widened)."""
    return bf16.to_f32(source) if source.dtype == np.uint16 else source.astype(np.float32)
