"""Exact Q4_0 for one chunk of rows, for streaming: :func:`plan_rows`.

The same planning as :func:`gguf_exact.core.exact.plan_matrix` (grid fit from
:mod:`.grid`, scale choice from :mod:`.scale`, bytes from :mod:`.q4_0`; rows are
independent, so a matrix planned chunk by chunk gives the same bytes), without the
level histogram, which costs a fifth of the time and which a re-pack does not
report, and without a thread pool: the caller runs chunks on its own workers.
"""

from dataclasses import dataclass, field

import numpy as np

from gguf_exact.core import bf16, q4_0
from gguf_exact.errors import GgufExactError
from gguf_exact.core.exact import FIRST_OFF_GRID_SHOWN
from gguf_exact.core.grid import fit_grid_t
from gguf_exact.core.scale import choose_scales_t


@dataclass
class RowPlan:
    n_blocks: int
    off_grid_blocks: int
    first_off_grid: list[tuple[int, int, float]] = field(default_factory=list)  # (row, column, residual in steps)
    exact_values: int = 0  # the planner's own count, over on-grid blocks
    data: np.ndarray | None = None  # (rows, cols/32*18) uint8, only when every block is on the grid


def plan_rows(bits: np.ndarray, row0: int = 0) -> RowPlan:
    """Plan rows ``row0 ..`` of a matrix, given as (rows, cols) bf16 bits."""
    rows, cols = bits.shape
    if cols % q4_0.BLOCK_SIZE:
        raise GgufExactError(f"row length {cols} is not a multiple of {q4_0.BLOCK_SIZE}")
    blocks = bits.reshape(-1, q4_0.BLOCK_SIZE)
    bad = bf16.non_finite(blocks)
    if bad.any():
        flat = int(np.flatnonzero(bad.ravel())[0])
        raise GgufExactError(f"{int(bad.sum())} values are NaN or Inf (first at row {row0 + flat // cols}, column {flat % cols})")
    blocks_t = np.ascontiguousarray(blocks.T)  # one block per column, see grid.fit_grid_t
    levels_t, step, on_grid, residual = fit_grid_t(bf16.to_f32(blocks_t))
    off = np.flatnonzero(~on_grid)
    per_row = cols // q4_0.BLOCK_SIZE
    first = [(row0 + int(b) // per_row, int(b) % per_row * q4_0.BLOCK_SIZE, float(residual[b])) for b in off[:FIRST_OFF_GRID_SHOWN]]
    plan = RowPlan(n_blocks=blocks.shape[0], off_grid_blocks=int(off.size), first_off_grid=first)
    if off.size:
        return plan  # the caller stops or stores this matrix another way: no scales needed
    choice = choose_scales_t(levels_t, blocks_t, step)
    plan.exact_values = int(choice.exact.sum())
    plan.data = q4_0.pack(levels_t.T, choice.d).reshape(rows, -1)
    return plan
