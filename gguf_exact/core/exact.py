"""Exact Q4_0 for bf16 matrices: grid fit, scale choice and packing, by chunks of rows.

Pure computation on numpy arrays. Rows are independent, so a matrix planned chunk by
chunk (:func:`plan_rows`, what a streaming re-pack calls) gives the same bytes as one
planned whole (:func:`plan_matrix`, which runs the chunks on two threads; the compiled
loop releases the GIL, in both of its builds). The loop is
:func:`gguf_exact.core.exact_kernel.pack_blocks`, from the build :mod:`.kernels` chose (JIT
or ahead of time): grid detection lives in :mod:`.grid`, the scale choice in :mod:`.scale`,
the byte layout in :mod:`.q4_0`.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from gguf_exact.core import kernels, q4_0
from gguf_exact.core.error_stats import ErrorStats, sum_stats
from gguf_exact.core.kernels import (
    FIRST_BAD_SCALE,
    FIRST_NON_FINITE,
    GCD_BY_LEVEL_SET,
    MAX_ULPS,
    N_COUNTERS,
    N_EXACT,
    N_NON_FINITE,
    N_OFF_GRID,
)
from gguf_exact.errors import InputError

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
    stats: ErrorStats | None = None  # ``data`` decoded against the source, only with ``data``


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


def plan_rows(bits: np.ndarray, row0: int = 0, histogram: bool = True, score_partial: bool = True) -> RowPlan:
    """Plan exact Q4_0 for ``bits``, (rows, cols) bf16 bits that are rows ``row0..`` of
    a matrix. ``score_partial=False`` skips the scale choice once a block is off the
    grid (for callers that will store the matrix another way). ``histogram`` is kept
    for callers' compatibility: the level counts cost nothing in the fused pass.

    Raises :class:`GgufExactError` for a row length that is not a multiple of 32, for
    NaN/Inf values, and for a step beyond fp16's range; off-grid blocks are reported,
    not raised.
    """
    rows, cols = bits.shape
    if cols % q4_0.BLOCK_SIZE:
        raise InputError(f"row length {cols} is not a multiple of {q4_0.BLOCK_SIZE}")
    blocks = np.ascontiguousarray(bits, dtype=np.uint16).reshape(-1, q4_0.BLOCK_SIZE)
    n = blocks.shape[0]
    out = np.empty((n, q4_0.BLOCK_BYTES), np.uint8)
    counters = np.empty(N_COUNTERS, np.int64)
    sq = np.empty(2, np.float64)
    levels = np.empty(16, np.int64)
    off_blocks = np.empty(FIRST_OFF_GRID_SHOWN, np.int64)
    off_residual = np.empty(FIRST_OFF_GRID_SHOWN, np.float32)
    pack = kernels.active().pack_blocks
    pack(blocks, out, counters, sq, levels, off_blocks, off_residual, score_partial, histogram, GCD_BY_LEVEL_SET)
    if counters[N_NON_FINITE]:
        flat = int(counters[FIRST_NON_FINITE])
        raise InputError(
            f"{int(counters[N_NON_FINITE])} values are NaN or Inf (first at row {row0 + flat // cols}, column {flat % cols})"
        )
    per_row = cols // q4_0.BLOCK_SIZE
    if counters[FIRST_BAD_SCALE] >= 0:
        worst = int(counters[FIRST_BAD_SCALE])
        raise InputError(
            f"the step of the block at row {row0 + worst // per_row}, column {worst % per_row * q4_0.BLOCK_SIZE} "
            "is beyond the fp16 range of Q4_0 scales"
        )
    n_off = int(counters[N_OFF_GRID])
    plan = RowPlan(n_blocks=n, off_grid_blocks=n_off)
    plan.first_off_grid = [
        (row0 + int(b) // per_row, int(b) % per_row * q4_0.BLOCK_SIZE, float(r))
        for b, r in zip(off_blocks[: min(n_off, FIRST_OFF_GRID_SHOWN)], off_residual)
    ]
    if n_off and not score_partial:
        return plan
    plan.exact_values = int(counters[N_EXACT])
    plan.level_histogram = levels
    if n_off == 0:
        plan.data = out.reshape(rows, -1)
        plan.stats = ErrorStats(
            n * q4_0.BLOCK_SIZE, int(counters[N_EXACT]), int(counters[MAX_ULPS]), float(sq[0]), float(sq[1])
        )
    return plan


def plan_matrix(bits: np.ndarray, keep_data: bool = True, workers: int | None = None) -> MatrixPlan:
    """Plan exact Q4_0 for ``bits``, a whole (rows, cols) matrix of bf16 bits."""
    if bits.ndim != 2:
        raise InputError(f"expected a 2-D matrix, got shape {list(bits.shape)}")
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
    if plan.on_grid:
        plan.stats = sum_stats(p.stats for p in parts) or ErrorStats()
    if keep_data and plan.on_grid:
        cols = shape[1]
        plan.data = np.concatenate([p.data for p in parts]) if parts else np.zeros((0, q4_0.row_bytes(cols)), np.uint8)
    return plan


# Chosen on import, as numba's kernels were loaded on import before there were two builds:
# the header walk of a command that packs (formats.gguf_layout) then takes the compiled one.
kernels.active()
