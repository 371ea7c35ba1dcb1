"""Error figures of decoded values against bf16 source bits, summed chunk by chunk.

Bit-exact values, largest error in bf16 ULPs, squared error and squared source. Errors
are measured after rounding the decoded float32 values to bf16, the source's own
precision: in float32, ``level * d`` differs from a bf16 source by the source's
rounding of the trained value (about 2**-9 relative) even where the bits match, which
would hide the difference between formats that these figures are for. A chunk that is
mostly exact costs a few passes: only values whose rounded bits differ from the
source are looked at again.
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


def compare_chunk(decoded: np.ndarray, source_bits: np.ndarray, ulps: bool = True) -> ErrorStats:
    """:class:`ErrorStats` of float32 ``decoded`` against bf16 ``source_bits``.

    ``ulps=False`` skips the largest error in ULPs (reported as -1). Sums use
    ``einsum`` rather than BLAS dot products: BLAS may hand short vectors to its own
    threads, which costs more than the sum when the cores are busy.
    """
    decoded = np.asarray(decoded, dtype=np.float32).ravel()
    source_bits = np.asarray(source_bits, dtype=np.uint16).ravel()
    rounded = bf16.from_f32(decoded)
    flipped = rounded ^ source_bits
    differ = flipped != 0
    # +0 and -0 are the same value
    differ &= (flipped != bf16.SIGN_MASK) | ((rounded & bf16.MAGNITUDE_MASK) != 0)
    n_differ = int(np.count_nonzero(differ))
    max_ulps, sq_error = (0 if ulps else -1), 0.0
    if n_differ * 4 > decoded.size:  # mostly inexact (a lossy donor): whole arrays, no gathers
        diff = bf16.to_f32(rounded) - bf16.to_f32(source_bits)
        sq_error = float(np.einsum("i,i->", diff, diff, dtype=np.float64))
        if ulps:
            max_ulps = int(bf16.ulp_distance(rounded, source_bits).max())
    elif n_differ:
        where = np.flatnonzero(differ)
        r, s = rounded[where], source_bits[where]
        if ulps:
            max_ulps = int(bf16.ulp_distance(r, s).max())
        diff = bf16.to_f32(r).astype(np.float64) - bf16.to_f32(s).astype(np.float64)
        sq_error = float(np.einsum("i,i->", diff, diff))
    source = bf16.to_f32(source_bits)
    return ErrorStats(
        n_values=decoded.size,
        exact=decoded.size - n_differ,
        max_ulps=max_ulps,
        sq_error=sq_error,
        sq_source=float(np.einsum("i,i->", source, source)),  # float32 sum of one chunk, then float64
    )
