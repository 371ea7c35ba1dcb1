"""Exact Q4_0 for bf16 matrices: grid fit, scale choice and packing, by chunks of rows.

Pure computation on numpy arrays. Rows are independent, so a matrix planned chunk by
chunk (:func:`plan_rows`, what a streaming re-pack calls) gives the same bytes as one
planned whole (:func:`plan_matrix`, which runs the chunks on two threads; the compiled
loop releases the GIL). Grid detection lives in :mod:`.grid`, the scale choice in
:mod:`.scale`, the byte layout in :mod:`.q4_0`.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from gguf_exact.core import bf16, q4_0
from gguf_exact.core.grid import GCD_BY_LEVEL_SET, fit_block
from gguf_exact.core.scale import FP16_INF_BITS, choose_block_scale
from gguf_exact.errors import GgufExactError

CHUNK_VALUES = 1 << 19  # measured best on 2 cores: smaller chunks pay numpy's per-call cost
FIRST_OFF_GRID_SHOWN = 5


@dataclass
class RowPlan:
    """What exact Q4_0 makes of a chunk of rows (or, aggregated, of a whole matrix)."""

    n_blocks: int = 0
    off_grid_blocks: int = 0
    # (row, first column of the block, residual in steps), in row order
    first_off_grid: list[tuple[int, int, float]] = field(default_factory=list)
    exact_values: int = 0  # values that decode to the source bits, over on-grid blocks
    level_histogram: np.ndarray | None = None  # counts of levels -8..7 over on-grid blocks
    data: np.ndarray | None = None  # (rows, cols/32*18) uint8 Q4_0, only when fully on grid


@dataclass
class MatrixPlan(RowPlan):
    """:class:`RowPlan` of a whole matrix, with its shape."""

    shape: tuple[int, int] = (0, 0)

    @property
    def n_values(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def on_grid(self) -> bool:
        return self.off_grid_blocks == 0

    @property
    def on_grid_fraction(self) -> float:
        return 1.0 - self.off_grid_blocks / self.n_blocks if self.n_blocks else 1.0

    @property
    def exact_fraction(self) -> float:
        return self.exact_values / self.n_values if self.n_values else 1.0


def _histogram(packed: np.ndarray, off_grid_blocks: int) -> np.ndarray:
    """Level counts from packed Q4_0 bytes: each ``qs`` byte holds two levels, so one
    bincount over half as many entries, folded. Off-grid blocks were packed as level 0."""
    pairs = np.bincount(packed[:, 2:].ravel(), minlength=256).reshape(16, 16)  # [high, low]
    counts = pairs.sum(axis=0) + pairs.sum(axis=1)
    counts[8] -= off_grid_blocks * q4_0.BLOCK_SIZE
    return counts


@njit(cache=True, nogil=True)
def plan_blocks(x, bits, levels, d_bits, on_grid, residual, exact, score_partial, gcd_by_level_set):
    """Grid fit and scale choice for every block (row) of ``x`` (n, 32) float32 and its
    bf16 ``bits``, into the output arrays. With ``score_partial`` false, scales are
    skipped once a block is off the grid. Returns the number of off-grid blocks."""
    scratch = np.empty(32, np.float32)
    scratch_bits = scratch.view(np.uint32)
    off_grid = 0
    for b in range(x.shape[0]):
        on_grid[b], step, residual[b] = fit_block(x[b], levels[b], gcd_by_level_set)
        if not on_grid[b]:
            off_grid += 1
            d_bits[b] = 0
            exact[b] = 0
        elif off_grid == 0 or score_partial:
            d_bits[b], exact[b], _ = choose_block_scale(levels[b], x[b], bits[b], step, scratch, scratch_bits)
    return off_grid


def plan_rows(bits: np.ndarray, row0: int = 0, histogram: bool = True, score_partial: bool = True) -> RowPlan:
    """Plan exact Q4_0 for ``bits``, (rows, cols) bf16 bits that are rows ``row0..`` of
    a matrix. ``score_partial=False`` skips the scale choice when a block is off the
    grid (for callers that will store the matrix another way).

    Raises :class:`GgufExactError` for a row length that is not a multiple of 32 or
    for NaN/Inf values; off-grid blocks are reported, not raised.
    """
    rows, cols = bits.shape
    if cols % q4_0.BLOCK_SIZE:
        raise GgufExactError(f"row length {cols} is not a multiple of {q4_0.BLOCK_SIZE}")
    blocks = bits.reshape(-1, q4_0.BLOCK_SIZE)
    bad = bf16.non_finite(blocks)
    if bad.any():
        flat = int(np.flatnonzero(bad.ravel())[0])
        raise GgufExactError(
            f"{int(bad.sum())} values are NaN or Inf (first at row {row0 + flat // cols}, column {flat % cols})"
        )
    n = blocks.shape[0]
    levels = np.zeros((n, q4_0.BLOCK_SIZE), np.int8)
    d_bits = np.zeros(n, np.uint16)
    on_grid = np.zeros(n, bool)
    residual = np.zeros(n, np.float32)
    exact = np.zeros(n, np.int32)
    off_count = plan_blocks(
        bf16.to_f32(blocks), blocks, levels, d_bits, on_grid, residual, exact, score_partial, GCD_BY_LEVEL_SET
    )
    off = np.flatnonzero(~on_grid)
    per_row = cols // q4_0.BLOCK_SIZE
    plan = RowPlan(n_blocks=n, off_grid_blocks=int(off_count))
    plan.first_off_grid = [
        (row0 + int(b) // per_row, int(b) % per_row * q4_0.BLOCK_SIZE, float(residual[b]))
        for b in off[:FIRST_OFF_GRID_SHOWN]
    ]
    if off.size and not score_partial:
        return plan
    if ((d_bits & 0x7FFF) == FP16_INF_BITS).any():
        worst = int(np.flatnonzero((d_bits & 0x7FFF) == FP16_INF_BITS)[0])
        raise GgufExactError(
            f"the step of the block at row {row0 + worst // per_row}, column {worst % per_row * q4_0.BLOCK_SIZE} "
            "is beyond the fp16 range of Q4_0 scales"
        )
    plan.exact_values = int(exact[on_grid].sum())
    packed = q4_0.pack(levels, d_bits.view(np.float16))
    if histogram:
        plan.level_histogram = _histogram(packed, int(off.size))
    if off.size == 0:
        plan.data = packed.reshape(rows, -1)
    return plan


def plan_matrix(bits: np.ndarray, keep_data: bool = True, workers: int | None = None) -> MatrixPlan:
    """Plan exact Q4_0 for ``bits``, a whole (rows, cols) matrix of bf16 bits."""
    if bits.ndim != 2:
        raise GgufExactError(f"expected a 2-D matrix, got shape {list(bits.shape)}")
    rows, cols = bits.shape
    step = max(1, CHUNK_VALUES // max(cols, 1))
    workers = workers or min(2, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        parts = list(
            pool.map(lambda r0: plan_rows(np.ascontiguousarray(bits[r0 : r0 + step]), r0), range(0, rows, step))
        )
    if not parts:  # no rows: still validate the row length
        plan_rows(bits, 0)
    return combine((rows, cols), parts, keep_data)


def combine(shape: tuple[int, int], parts: list[RowPlan], keep_data: bool = True) -> MatrixPlan:
    """The :class:`MatrixPlan` of a matrix planned as ``parts``, in row order."""
    plan = MatrixPlan(shape=shape, level_histogram=np.zeros(16, dtype=np.int64))
    for part in parts:
        plan.n_blocks += part.n_blocks
        plan.off_grid_blocks += part.off_grid_blocks
        plan.first_off_grid.extend(part.first_off_grid[: FIRST_OFF_GRID_SHOWN - len(plan.first_off_grid)])
        if part.level_histogram is not None:
            plan.level_histogram += part.level_histogram
        plan.exact_values += part.exact_values
    if keep_data and plan.on_grid:
        cols = shape[1]
        plan.data = np.concatenate([p.data for p in parts]) if parts else np.zeros((0, q4_0.row_bytes(cols)), np.uint8)
    return plan
