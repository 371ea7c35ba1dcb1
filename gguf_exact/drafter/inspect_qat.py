"""``inspect``: is this checkpoint QAT 4-bit? Per tensor grid statistics, no output.

Runs the same grid fit and scale choice as ``convert`` (via :mod:`.exact`) without
writing anything, so the "achievable bit-exact" figure is what convert will reach.
"""

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from gguf_exact.core.exact import plan_matrix
from gguf_exact.drafter.verify import source_bits
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.gemma4.assistant import gguf_tensor_name
from gguf_exact.malloc_tuning import keep_heap_blocks


@dataclass
class TensorSummary:
    name: str
    shape: list[int]
    dtype: str
    blocks: int
    on_grid_fraction: float | None  # None: not a matrix
    exact_fraction: float | None  # achievable bit-exact share of values, as Q4_0
    planned: str  # Q4_0, F32, dropped, or "off grid"
    off_grid_blocks: int = 0
    first_off_grid: list | None = None
    level_histogram: list[int] | None = None


@dataclass
class InspectReport:
    source: str
    tensors: list[TensorSummary]

    @property
    def matrices(self) -> list[TensorSummary]:
        return [t for t in self.tensors if t.on_grid_fraction is not None and t.planned != "dropped"]

    @property
    def is_qat(self) -> bool:
        return bool(self.matrices) and all(t.off_grid_blocks == 0 for t in self.matrices)

    @property
    def verdict(self) -> str:
        mats = self.matrices
        off = [t for t in mats if t.off_grid_blocks]
        if not mats:
            return "no weight matrices found"
        if not off:
            values = sum(t.blocks * 32 for t in mats)
            exact = sum(t.exact_fraction * t.blocks * 32 for t in mats) / values
            return f"QAT 4-bit: all {len(mats)} weight matrices are on the Q4_0 grid; {exact:.4%} of their values can be bit-exact"
        return (
            f"not QAT 4-bit: {len(off)} of {len(mats)} weight matrices have blocks off the grid (first: {off[0].name})"
        )

    def as_dict(self) -> dict:
        return {
            "source": self.source,
            "is_qat": self.is_qat,
            "verdict": self.verdict,
            "tensors": [asdict(t) for t in self.tensors],
        }


def inspect_checkpoint(folder: str | Path, progress: Callable[[str], None] | None = None) -> InspectReport:
    """Grid statistics for every tensor of an HF folder."""
    summaries = []
    keep_heap_blocks()
    with Checkpoint(folder) as ckpt:
        for name in sorted(ckpt.tensors):
            if progress:
                progress(name)
            info = ckpt.tensors[name]
            try:
                dropped = gguf_tensor_name(name) is None
            except GgufExactError:
                dropped = True  # not part of the drafter: shown, never converted
            matrix = len(info.shape) == 2 and info.dtype != "I64"
            if not matrix:
                planned = "dropped" if dropped or info.dtype == "I64" else "F32"
                summaries.append(TensorSummary(name, list(info.shape), info.dtype, 0, None, None, planned))
                continue
            try:
                plan = plan_matrix(source_bits(ckpt, name), keep_data=False)
            except GgufExactError as err:
                raise GgufExactError(f"{info.file}: tensor {name}: {err}") from None
            planned = "dropped" if dropped else ("Q4_0" if plan.on_grid else "off grid")
            summaries.append(
                TensorSummary(
                    name,
                    list(info.shape),
                    info.dtype,
                    plan.n_blocks,
                    plan.on_grid_fraction,
                    plan.exact_fraction,
                    planned,
                    plan.off_grid_blocks,
                    [list(x) for x in plan.first_off_grid],
                    plan.level_histogram.tolist(),
                )
            )
    return InspectReport(str(folder), summaries)
