"""Drafter conversion: HF Gemma 4 assistant folder -> exact Q4_0 gemma4-assistant GGUF.

Plan every tensor (pure, via :mod:`gguf_exact.core.exact`), write to a temp file beside the output,
read it back and verify against the source, check the sha256, then rename.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from gguf_exact.core.exact import MatrixPlan, plan_matrix
from gguf_exact.drafter.verify import Verification, source_bits, verify_gguf
from gguf_exact.errors import GgufExactError, OffGridError
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import (
    TYPES,
    atomic_output,
    encode,
    file_type,
    sha256_file,
    write_gguf,
)
from gguf_exact.formats.vocab import read_target
from gguf_exact.gemma4.assistant import (
    ARCH,
    ROPE_FREQS,
    AssistantConfig,
    Field,
    expected_shape,
    gguf_tensor_name,
    metadata,
    rope_freqs,
    tensor_order,
)
from gguf_exact.malloc_tuning import keep_heap_blocks

OFF_GRID_TYPES = ("q8_0", "f16", "bf16")
Progress = Callable[[str], None]


@dataclass
class TensorPlan:
    """How one output tensor is made."""

    gguf_name: str
    source: str | None  # HF name; None for generated tensors
    shape: tuple[int, ...]  # HF (row-major) shape
    type: GGMLQuantizationType
    data: np.ndarray
    matrix: MatrixPlan | None = None  # grid analysis, for 2-D matrices
    note: str = ""


@dataclass
class ConvertResult:
    path: Path
    sha256: str
    size: int
    plans: list[TensorPlan]
    verification: Verification
    report: dict = field(default_factory=dict)


def plan_tensor(ckpt: Checkpoint, cfg: AssistantConfig, hf_name: str, off_grid: str | None) -> TensorPlan | None:
    """Decide type and bytes for one source tensor; None when it is dropped."""
    gguf_name = gguf_tensor_name(hf_name)
    if gguf_name is None:
        return None
    info = ckpt.tensors[hf_name]
    where = f"{info.file}: tensor {hf_name}"
    expected = expected_shape(gguf_name, cfg)
    if expected is not None and tuple(info.shape or (1,)) != expected:
        raise GgufExactError(f"{where}: shape {list(info.shape)} does not match the config, expected {list(expected)}")
    if info.dtype == "I64":
        raise GgufExactError(f"{where}: dtype I64 is not a weight")
    bits = source_bits(ckpt, hf_name)
    if len(info.shape) != 2:
        data = encode(bits.reshape(info.shape or (1,)), GGMLQuantizationType.F32)
        return TensorPlan(gguf_name, hf_name, tuple(info.shape or (1,)), GGMLQuantizationType.F32, data, note="f32")
    try:
        matrix = plan_matrix(bits)
    except GgufExactError as err:
        raise GgufExactError(f"{where}: {err}") from None
    if matrix.on_grid:
        return TensorPlan(gguf_name, hf_name, info.shape, GGMLQuantizationType.Q4_0, matrix.data, matrix, "exact q4_0")
    if off_grid is None:
        row, col, resid = matrix.first_off_grid[0]
        raise OffGridError(
            f"{where}: {matrix.off_grid_blocks} of {matrix.n_blocks} blocks are off the 4-bit grid "
            f"(first at row {row}, column {col}, residual {resid:.3g} steps); "
            f"pass --off-grid q8_0|f16|bf16 to store such matrices in another type"
        )
    qtype = TYPES[off_grid]
    return TensorPlan(gguf_name, hf_name, info.shape, qtype, encode(bits, qtype), matrix, f"off grid -> {off_grid}")


def plan_drafter(
    ckpt: Checkpoint, cfg: AssistantConfig, off_grid: str | None = None, progress: Progress | None = None
) -> list[TensorPlan]:
    """Plans for every output tensor, in output order (rope_freqs generated)."""
    if off_grid is not None and off_grid not in OFF_GRID_TYPES:
        raise GgufExactError(f"--off-grid {off_grid}: expected one of {', '.join(OFF_GRID_TYPES)}")
    plans = []
    for hf_name in sorted(ckpt.tensors):
        if progress:
            progress(hf_name)
        plan = plan_tensor(ckpt, cfg, hf_name, off_grid)
        if plan is not None:
            plans.append(plan)
    freqs = rope_freqs(cfg)
    plans.append(TensorPlan(ROPE_FREQS, None, freqs.shape, GGMLQuantizationType.F32, freqs, note="generated"))
    names = [p.gguf_name for p in plans]
    for layer in range(cfg.num_hidden_layers):
        for needed in (f"blk.{layer}.attn_q.weight", f"blk.{layer}.ffn_down.weight"):
            if needed not in names:
                raise GgufExactError(f"{ckpt.folder}: no source tensor for {needed} (layer {layer} is incomplete)")
    return sorted(plans, key=lambda p: tensor_order(p.gguf_name))


def drafter_fields(cfg: AssistantConfig, plans: list[TensorPlan], tokenizer_fields: list[Field]) -> list[Field]:
    """All KV pairs after ``general.architecture``."""
    u32 = GGUFValueType.UINT32
    general = [
        Field("general.file_type", file_type([p.type for p in plans if p.matrix is not None]), u32),
        Field("general.quantization_version", 2, u32),
    ]
    return general + metadata(cfg) + tokenizer_fields


def convert_drafter(
    source_dir: str | Path,
    out_path: str | Path,
    vocab_from: str | Path,
    off_grid: str | None = None,
    expect_sha256: str | None = None,
    report_path: str | Path | None = None,
    progress: Progress | None = None,
) -> ConvertResult:
    """Convert an HF Gemma 4 assistant folder to an exact Q4_0 GGUF at ``out_path``.

    Nothing is left at ``out_path`` unless the file verified and, when given,
    matched ``expect_sha256``.
    """
    out_path = Path(out_path)
    keep_heap_blocks()
    with Checkpoint(source_dir) as ckpt:
        cfg = AssistantConfig.from_hf(ckpt.config, str(ckpt.folder / "config.json"))
        target = read_target(vocab_from)
        if target.vocab_size != cfg.vocab_size:
            raise GgufExactError(
                f"{vocab_from}: vocabulary has {target.vocab_size} tokens but the drafter's vocab_size is {cfg.vocab_size}"
            )
        if target.embedding_length is not None and target.embedding_length != cfg.backbone_hidden_size:
            raise GgufExactError(
                f"{vocab_from}: target embedding_length {target.embedding_length} differs from the drafter's "
                f"backbone_hidden_size {cfg.backbone_hidden_size}; this drafter belongs to another model"
            )
        plans = plan_drafter(ckpt, cfg, off_grid, progress)
        fields = drafter_fields(cfg, plans, target.tokenizer_fields)
        with atomic_output(out_path) as tmp:
            write_gguf(tmp, ARCH, fields, [(p.gguf_name, p.data, p.type) for p in plans])
            planned = {p.gguf_name: p.data for p in plans if p.type == GGMLQuantizationType.Q4_0}
            verification = verify_gguf(tmp, ckpt, planned)
            digest = sha256_file(tmp)
            if expect_sha256 and digest != expect_sha256.lower():
                raise GgufExactError(f"{out_path}: sha256 {digest} does not match the expected {expect_sha256.lower()}")
            size = tmp.stat().st_size
        result = ConvertResult(out_path, digest, size, plans, verification)
        result.report = build_report(result, ckpt.folder)
    if report_path:
        with atomic_output(report_path) as tmp:
            tmp.write_text(json.dumps(result.report, indent=2) + "\n")
    return result


def build_report(result: ConvertResult, source: Path) -> dict:
    checks = {c.name: c for c in result.verification.tensors}
    tensors = []
    for p in result.plans:
        entry = {"name": p.gguf_name, "source": p.source, "shape": list(p.shape), "type": p.type.name, "note": p.note}
        if p.matrix is not None:
            entry |= {
                "blocks": p.matrix.n_blocks,
                "off_grid_blocks": p.matrix.off_grid_blocks,
                "level_histogram": p.matrix.level_histogram.tolist(),
            }
        if p.gguf_name in checks:
            c = checks[p.gguf_name]
            entry |= {"exact_fraction": c.exact_fraction, "max_ulps": c.max_ulps, "rel_error": c.rel_error}
        tensors.append(entry)
    total = result.verification.total
    return {
        "output": str(result.path),
        "source": str(source),
        "sha256": result.sha256,
        "bytes": result.size,
        "values": total.n_values,
        "exact_values": total.exact,
        "exact_fraction": total.exact_fraction,
        "max_ulps": total.max_ulps,
        "rel_error": total.rel_error,
        "off_grid_tensors": [p.gguf_name for p in result.plans if p.note.startswith("off grid")],
        "tensors": tensors,
    }
