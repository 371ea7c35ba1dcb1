"""``inspect``: is this checkpoint QAT 4-bit? Per tensor grid statistics, no output.

Runs the same grid fit and scale choice as ``convert`` and ``repack``
(:func:`gguf_exact.core.exact.plan_rows`) without writing anything, so the "achievable
bit-exact" figure is what they will reach. Drafters and main models are told apart by
``config.json``'s architecture, which decides what each tensor becomes (the tables in
:mod:`gguf_exact.gemma4`); tensors are read in row chunks, so a main model's 4.7 GB
``embed_tokens_per_layer`` costs a chunk of memory, not its size.
"""

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from gguf_exact.core import bf16
from gguf_exact.core.exact import CHUNK_VALUES, MatrixPlan, RowPlan, combine, plan_rows
from gguf_exact.errors import GgufExactError, InputError
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.gemma4 import assistant, names
from gguf_exact.malloc_tuning import keep_heap_blocks
from gguf_exact.progress import announce


@dataclass
class TensorSummary:
    name: str
    shape: list[int]
    dtype: str
    blocks: int
    on_grid_fraction: float | None  # None: not a matrix
    exact_fraction: float | None  # achievable bit-exact share of values, as Q4_0
    planned: str  # Q4_0, F32, I32, dropped, "off grid", or "kept" (a probe off the grid)
    off_grid_blocks: int = 0
    first_off_grid: list | None = None
    level_histogram: list[int] | None = None
    optional: bool = False  # a probe (the MoE router): off the grid is no verdict against QAT


@dataclass
class InspectReport:
    source: str
    tensors: list[TensorSummary]

    @property
    def matrices(self) -> list[TensorSummary]:
        return [t for t in self.tensors if t.on_grid_fraction is not None and not t.optional]

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
            exact = sum((t.exact_fraction or 0.0) * t.blocks * 32 for t in mats) / values
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


def tensor_roles(config: dict):
    """A function HF tensor name -> what conversion does with it, for this checkpoint's
    architecture: "matrix" (planned as Q4_0), "probe" (Q4_0 if on the grid, else kept),
    "F32" (a norm or scalar, kept), "I32" (the ordered head's token ids) or "dropped" (not in the GGUF)."""
    archs = config.get("architectures") or []
    if any(a in assistant.SUPPORTED_ARCHITECTURES for a in archs):

        ordered = config.get("use_ordered_embeddings", False)

        def drafter_role(name: str, ndim: int) -> str:
            try:
                mapped = assistant.gguf_tensor_name(name)
            except GgufExactError:
                return "dropped"
            if mapped == assistant.CENTROIDS:
                return "probe" if ordered else "dropped"  # Q4_0 if on the grid, else its own type
            if mapped == assistant.ORDERING:
                return "I32" if ordered else "dropped"
            return "matrix" if ndim >= 2 else "F32"

        return drafter_role
    if any(a in names.SUPPORTED_ARCHITECTURES for a in archs):

        def main_role(name: str, ndim: int) -> str:
            mapped = names.gguf_tensor_name(name)
            if mapped is None:
                return "dropped"
            return {names.QAT: "matrix", names.PROBE: "probe"}.get(mapped.role, "F32")

        return main_role
    return lambda name, ndim: "matrix" if ndim >= 2 else "F32"  # unknown model: look at every matrix


def plan_streamed(ckpt: Checkpoint, name: str) -> MatrixPlan:
    """Grid statistics of one tensor, read in row chunks (memory bounded by a chunk).
    A 3-D bank (experts, rows, cols) is planned as experts*rows rows."""
    info = ckpt.tensors[name]
    cols = info.shape[-1]
    rows_per_item = int(np.prod(info.shape[1:-1], dtype=np.int64)) if len(info.shape) > 2 else 1
    items = info.shape[0]
    step = max(1, CHUNK_VALUES // (cols * rows_per_item))
    parts = []
    for i0 in range(0, items, step):
        values = ckpt.read(name, slice(i0, min(items, i0 + step))).reshape(-1, cols)
        bits = bf16.from_exact(values)
        if bits is None:  # F16/F32 values bf16 cannot hold: no exact Q4_0 for them
            n_blocks = values.size // 32
            parts.append(RowPlan(n_blocks=n_blocks, off_grid_blocks=n_blocks))
            continue
        try:
            parts.append(plan_rows(bits, i0 * rows_per_item))
        except GgufExactError as err:
            raise InputError(f"{info.file}: tensor {name}: {err}") from None
    return combine((items * rows_per_item, cols), parts, keep_data=False)


def inspect_checkpoint(folder: str | Path, progress: Callable[[str], None] | None = None) -> InspectReport:
    """Grid statistics for every tensor of an HF folder (a drafter, a main model, or any
    bf16 checkpoint), read in row chunks."""
    summaries = []
    keep_heap_blocks()
    with Checkpoint(folder) as ckpt:
        archs = ckpt.config.get("architectures")
        if isinstance(archs, list) and set(archs) & {
            *assistant.SUPPORTED_ARCHITECTURES,
            *names.SUPPORTED_ARCHITECTURES,
        }:
            text = ckpt.config.get("text_config", ckpt.config)
            assistant.check_types(ckpt.config, text, str(ckpt.folder / "config.json"))
        role_of = tensor_roles(ckpt.config)
        announce(progress, len(ckpt.tensors))
        for name in sorted(ckpt.tensors):
            if progress:
                progress(name)
            info = ckpt.tensors[name]
            role = role_of(name, len(info.shape))
            if info.dtype == "I64" and role != "I32":
                role = "dropped"
            if role not in ("matrix", "probe") or len(info.shape) < 2:
                planned = "F32" if role in ("matrix", "probe") else role
                if planned == "F32":
                    ckpt.read(name)  # norms are small; a NaN or Inf there is an error too
                summaries.append(TensorSummary(name, list(info.shape), info.dtype, 0, None, None, planned))
                continue
            plan = plan_streamed(ckpt, name)
            if role == "probe":
                planned = "Q4_0" if plan.on_grid else "kept"
            else:
                planned = "Q4_0" if plan.on_grid else "off grid"
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
                    plan.level_histogram.tolist() if plan.level_histogram is not None else None,
                    role == "probe",
                )
            )
    return InspectReport(str(folder), summaries)
