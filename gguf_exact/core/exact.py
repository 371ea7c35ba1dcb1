"""Exact Q4_0 for one bf16 matrix: grid fit, scale choice and packing, chunked.

Pure computation on numpy arrays (threads only split the rows; numpy releases the
GIL, so two cores run two chunks at once). Grid detection lives in :mod:`.grid`, the
scale choice in :mod:`.scale`, the byte layout in :mod:`.q4_0`.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from gguf_exact.core import bf16, q4_0
from gguf_exact.errors import GgufExactError
from gguf_exact.core.grid import fit_grid_t
from gguf_exact.core.scale import choose_scales_t

CHUNK_VALUES = 1 << 18
FIRST_OFF_GRID_SHOWN = 5


@dataclass
class MatrixPlan:
    """What exact Q4_0 makes of one matrix, and the bytes when it is fully on grid."""

    shape: tuple[int, int]
    n_blocks: int = 0
    off_grid_blocks: int = 0
    # (row, first column of the block, residual in steps), in row order
    first_off_grid: list[tuple[int, int, float]] = field(default_factory=list)
    level_histogram: np.ndarray = field(default_factory=lambda: np.zeros(16, dtype=np.int64))
    exact_values: int = 0  # over on-grid blocks with the chosen scales
    data: np.ndarray | None = None  # (rows, cols/32*18) uint8 Q4_0, only when fully on grid

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


def _plan_rows(bits: np.ndarray, row0: int):
    rows, cols = bits.shape
    blocks = bits.reshape(-1, q4_0.BLOCK_SIZE)
    bad = bf16.non_finite(blocks)
    if bad.any():
        flat = int(np.flatnonzero(bad.ravel())[0])
        raise GgufExactError(
            f"{int(bad.sum())} values are NaN or Inf (first at row {row0 + flat // cols}, column {flat % cols})"
        )
    blocks_t = np.ascontiguousarray(blocks.T)  # one block per column: see grid.fit_grid_t
    levels_t, step, on_grid, residual = fit_grid_t(bf16.to_f32(blocks_t))
    choice = choose_scales_t(levels_t, blocks_t, step)
    off = np.flatnonzero(~on_grid)
    per_row = cols // q4_0.BLOCK_SIZE
    first = [
        (row0 + int(b) // per_row, int(b) % per_row * q4_0.BLOCK_SIZE, float(residual[b]))
        for b in off[:FIRST_OFF_GRID_SHOWN]
    ]
    exact = int(choice.exact[on_grid].sum())
    hist = np.bincount((levels_t[:, on_grid].astype(np.int16) + 8).ravel(), minlength=16)
    data = q4_0.pack(levels_t.T, choice.d).reshape(rows, -1) if off.size == 0 else None
    return off.size, first, hist, exact, data


def plan_matrix(bits: np.ndarray, keep_data: bool = True, workers: int | None = None) -> MatrixPlan:
    """Plan exact Q4_0 for ``bits``, a (rows, cols) array of bf16 bits (uint16).

    Raises :class:`GgufExactError` for a row length that is not a multiple of 32 or
    for NaN/Inf values; off-grid blocks are reported, not raised.
    """
    if bits.ndim != 2:
        raise GgufExactError(f"expected a 2-D matrix, got shape {list(bits.shape)}")
    rows, cols = bits.shape
    if cols % q4_0.BLOCK_SIZE:
        raise GgufExactError(f"row length {cols} is not a multiple of {q4_0.BLOCK_SIZE}")
    plan = MatrixPlan(shape=(rows, cols), n_blocks=rows * cols // q4_0.BLOCK_SIZE)
    step = max(1, CHUNK_VALUES // max(cols, 1))
    starts = range(0, rows, step)
    workers = workers or min(2, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda r0: _plan_rows(np.ascontiguousarray(bits[r0 : r0 + step]), r0), starts))
    pieces = []
    for off, first, hist, exact, data in results:
        plan.off_grid_blocks += off
        plan.first_off_grid.extend(first[: FIRST_OFF_GRID_SHOWN - len(plan.first_off_grid)])
        plan.level_histogram += hist
        plan.exact_values += exact
        pieces.append(data)
    if keep_data and plan.on_grid:
        plan.data = np.concatenate(pieces, axis=0) if pieces else np.zeros((0, q4_0.row_bytes(cols)), np.uint8)
    return plan
