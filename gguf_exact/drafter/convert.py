"""Drafter conversion: HF Gemma 4 assistant folder -> exact Q4_0 gemma4-assistant GGUF.

The checkpoint's tensors become jobs (:func:`drafter_jobs`: exact Q4_0 for every matrix,
F32 for norms and scalars, ``rope_freqs`` generated), the metadata comes from the config
(:mod:`gguf_exact.gemma4.assistant`) and the target's ``tokenizer.*`` pairs, copied as
bytes. :mod:`gguf_exact.stream` writes it in row chunks on both cores into a temp file
beside the output, reads it back (every chunk's CRC against its plan, sha256), and
only then is it renamed into place.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from gguf_exact.core import bf16, q4_0
from gguf_exact.core.error_stats import ErrorStats, sum_stats
from gguf_exact.core.exact import plan_rows
from gguf_exact.errors import ArgumentError, InputError, Param
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import encode, file_type
from gguf_exact.formats.gguf_layout import Field, TensorEntry
from gguf_exact.formats.paths import Inputs, check_output_files, one_command
from gguf_exact.formats.safe_write import staged_outputs
from gguf_exact.formats.vocab import TargetInfo, read_target
from gguf_exact.gemma4.assistant import (
    ARCH,
    CENTROIDS,
    HEAD_TENSORS,
    ORDERING,
    ROPE_FREQS,
    AssistantConfig,
    expected_shape,
    gguf_tensor_name,
    metadata,
    rope_freqs,
    tensor_order,
)
from gguf_exact.gemma4.names import tensor_kind
from gguf_exact.malloc_tuning import keep_heap_blocks
from gguf_exact.progress import Progress
from gguf_exact.stream.jobs import DATA, ENCODE, QAT, TensorJob, is_source_matrix, llama_q8_0_jobs, reference_jobs
from gguf_exact.stream.pipeline import FilePlan, WriteOptions, write_report, write_verified
from gguf_exact.stream.readback import Replanner
from gguf_exact.stream.source_rows import RowSource, locate
from gguf_exact.stream.writer import TensorResult

OFF_GRID_TYPES = ("q8_0", "f16", "bf16", "f32")
GGUF_VERSION, ALIGNMENT = 3, 32
F32, Q4_0, I32 = GGMLQuantizationType.F32, GGMLQuantizationType.Q4_0, GGMLQuantizationType.I32
# The type that holds every bit of a source dtype: an off-grid ordered head's centroids.
LOSSLESS_TYPES = {"BF16": GGMLQuantizationType.BF16, "F16": GGMLQuantizationType.F16, "F32": F32}


@dataclass
class ConvertResult:
    path: Path
    sha256: str
    size: int
    tensors: list[TensorResult]
    seconds: dict[str, float] = field(default_factory=dict)
    report: dict = field(default_factory=dict)

    @property
    def total(self) -> ErrorStats:
        """Every tensor with a source, against it."""
        return sum_stats(t.ours for t in self.tensors) or ErrorStats()

    @property
    def type_counts(self) -> dict[str, int]:
        """How many tensors of each GGUF type the file holds."""
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.out_type] = counts.get(t.out_type, 0) + 1
        return counts

    @property
    def off_grid_tensors(self) -> list[str]:
        """The matrices stored in the off-grid type, not Q4_0."""
        return [t.name for t in self.tensors if t.note.startswith("off grid")]


def hf_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape) or (1,)


def drafter_jobs(ckpt: Checkpoint, cfg: AssistantConfig) -> list[TensorJob]:
    """One job per output tensor, in output order (no weight data is read; the ordered
    head's token ordering is, to be checked and stored as I32)."""
    locations = locate(ckpt)
    jobs = []
    for hf_name in sorted(ckpt.tensors):
        gguf_name = gguf_tensor_name(hf_name)
        if gguf_name in (CENTROIDS, ORDERING):
            if cfg.head is not None:
                jobs.append(head_job(ckpt, cfg, hf_name, gguf_name, locations[hf_name]))
            continue
        info = ckpt.tensors[hf_name]
        where = f"{info.file}: tensor {hf_name}"
        shape = hf_shape(info.shape)
        expected = expected_shape(gguf_name, cfg)
        if expected is not None and shape != expected:
            raise InputError(f"{where}: shape {list(info.shape)} does not match the config, expected {list(expected)}")
        if info.dtype == "I64":
            raise InputError(f"{where}: dtype I64 is not a weight")
        ne = tuple(reversed(shape))
        matrix = len(shape) == 2
        if matrix and shape[1] % q4_0.BLOCK_SIZE:
            raise InputError(f"{where}: row length {shape[1]} is not a multiple of {q4_0.BLOCK_SIZE}")
        entry = TensorEntry(gguf_name, ne, Q4_0 if matrix else F32)
        kind = tensor_kind(gguf_name, len(ne))
        role, note = (QAT, "exact q4_0") if matrix else (ENCODE, "f32")
        jobs.append(TensorJob(entry, role, kind, hf_name, RowSource(locations[hf_name]), note))
    freqs = rope_freqs(cfg)
    data = freqs.view(np.uint8).reshape(1, -1)
    jobs.append(
        TensorJob(
            TensorEntry(ROPE_FREQS, freqs.shape, F32), DATA, tensor_kind(ROPE_FREQS, 1), note="generated", data=data
        )
    )
    names = {j.entry.name for j in jobs}
    for needed in (CENTROIDS, ORDERING) if cfg.head is not None else ():
        if needed not in names:
            hf = next(hf for hf, g in HEAD_TENSORS.items() if g == needed)
            raise InputError(f"{ckpt.folder}: config.json uses ordered embeddings but there is no tensor {hf}")
    for layer in range(cfg.num_hidden_layers):
        for needed in (f"blk.{layer}.attn_q.weight", f"blk.{layer}.ffn_down.weight"):
            if needed not in names:
                raise InputError(f"{ckpt.folder}: no source tensor for {needed} (layer {layer} is incomplete)")
    return sorted(jobs, key=lambda j: tensor_order(j.entry.name))


def head_job(ckpt: Checkpoint, cfg: AssistantConfig, hf_name: str, gguf_name: str, loc) -> TensorJob:
    """The ordered head's two tensors. The centroids: exact Q4_0 when they are on the grid, else
    the source's own float type (every bit; no one promises they are QAT, so never a stop). The
    ordering: a permutation of the vocabulary, as I32 (what ggml's get_rows indexes with)."""
    info = ckpt.tensors[hf_name]
    where = f"{info.file}: tensor {hf_name}"
    shape = hf_shape(info.shape)
    expected = expected_shape(gguf_name, cfg)
    assert expected is not None  # the head's tensors: asked for only when the config has the head
    if shape != expected:
        raise InputError(f"{where}: shape {list(info.shape)} does not match the config, expected {list(expected)}")
    kind = tensor_kind("output.weight", 2)  # reported with the output head
    if gguf_name == CENTROIDS:
        if info.dtype == "I64":
            raise InputError(f"{where}: dtype I64 is not a weight")
        entry = TensorEntry(gguf_name, tuple(reversed(shape)), Q4_0)
        lossless = LOSSLESS_TYPES[info.dtype]
        return TensorJob(entry, QAT, kind, hf_name, RowSource(loc), "exact q4_0", lossless=lossless)
    if info.dtype != "I64":
        raise InputError(f"{where}: dtype {info.dtype}, expected I64 token ids")
    ordering = np.asarray(ckpt.read(hf_name)).reshape(-1)
    if not np.array_equal(np.sort(ordering), np.arange(cfg.vocab_size)):
        raise InputError(f"{where}: not a permutation of the {cfg.vocab_size} token ids (each token in one cluster)")
    data = ordering.astype("<i4").view(np.uint8).reshape(1, -1)
    return TensorJob(TensorEntry(gguf_name, shape, I32), DATA, kind, hf_name, note="token ids as I32", data=data)


def drafter_kv(cfg: AssistantConfig, target: TargetInfo, matrix_types: list[GGMLQuantizationType]) -> list[bytes]:
    """Every key/value pair, as bytes: ``general.*``, the config's keys, then the
    target's ``tokenizer.*`` pairs byte for byte."""
    u32 = GGUFValueType.UINT32
    fields = [
        Field("general.architecture", ARCH, GGUFValueType.STRING),
        Field("general.file_type", file_type(matrix_types), u32),
        Field("general.quantization_version", 2, u32),
        *metadata(cfg),
    ]
    return [f.encode() for f in fields] + list(target.tokenizer.pairs)


def check_target(target: TargetInfo, cfg: AssistantConfig, vocab_from: Path) -> None:
    if target.vocab_size != cfg.vocab_size:
        raise InputError(
            f"{vocab_from}: vocabulary has {target.vocab_size} tokens but the drafter's vocab_size is {cfg.vocab_size}"
        )
    if target.embedding_length is not None and target.embedding_length != cfg.backbone_hidden_size:
        raise InputError(
            f"{vocab_from}: target embedding_length {target.embedding_length} differs from the drafter's "
            f"backbone_hidden_size {cfg.backbone_hidden_size}; this drafter belongs to another model"
        )


@one_command()
def convert_drafter(
    source_dir: str | Path,
    out_path: str | Path,
    vocab_from: str | Path,
    off_grid: str | None = None,
    expect_sha256: str | None = None,
    report_path: str | Path | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
    bf16_reference: bool = False,
    ordered_head: bool = True,
) -> ConvertResult:
    """Convert an HF Gemma 4 assistant folder to an exact Q4_0 GGUF at ``out_path``.

    ``off_grid``: how to store a matrix with blocks off the 4-bit grid (``q8_0``,
    ``f16``, ``bf16``, ``f32``); None stops. ``bf16_reference``: write the bf16
    reference instead, every matrix the source's own bytes under the same header and
    tensor order (:func:`gguf_exact.stream.jobs.reference_jobs`). ``ordered_head``: keep the checkpoint's
    ordered-embedding head when its config uses one (the fast draft step of llama.cpp
    with patch #24); False writes the full head only, as upstream's converter does. Nothing is left at
    ``out_path`` unless the file read back as planned and, when given, matched ``expect_sha256``.
    """
    if off_grid is not None and off_grid not in OFF_GRID_TYPES:
        raise ArgumentError(Param("off_grid"), f" {off_grid}: expected one of {', '.join(OFF_GRID_TYPES)}")
    if off_grid is not None and bf16_reference:
        raise ArgumentError(
            Param("off_grid"), " does not apply to a bf16 reference: every matrix is the source's bytes"
        )
    plan = reference_jobs if bf16_reference else None
    return _write_drafter(
        source_dir, out_path, vocab_from, plan, off_grid, expect_sha256, report_path, progress, workers, ordered_head
    )


@one_command()
def convert_llama_q8_0(
    source_dir: str | Path,
    out_path: str | Path,
    vocab_from: str | Path,
    expect_sha256: str | None = None,
    report_path: str | Path | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
    ordered_head: bool = True,
) -> ConvertResult:
    """llama.cpp's Q8_0 peer of a drafter at ``out_path``: the bf16 reference's plan and header
    (:func:`convert_drafter` with ``bf16_reference``) with every matrix as upstream's
    ``convert_hf_to_gguf.py --outtype q8_0`` stores it, gguf-py's Q8_0 of the source's values
    (:func:`gguf_exact.stream.jobs.llama_q8_0_jobs`): the file an exact drafter's acceptance
    and size are set beside. Written, read back and renamed as :func:`convert_drafter`'s."""
    return _write_drafter(
        source_dir,
        out_path,
        vocab_from,
        llama_q8_0_jobs,
        None,
        expect_sha256,
        report_path,
        progress,
        workers,
        ordered_head,
    )


def _write_drafter(
    source_dir: str | Path,
    out_path: str | Path,
    vocab_from: str | Path,
    plan: Callable[[list[TensorJob]], list[TensorJob]] | None,
    off_grid: str | None,
    expect_sha256: str | None,
    report_path: str | Path | None,
    progress: Progress | None,
    workers: int | None,
    ordered_head: bool,
) -> ConvertResult:
    """The exact file's jobs, as ``plan`` re-plans them (None: the exact file itself), written."""
    inputs: Inputs = {"source folder's file": source_dir, Param("vocab_from"): vocab_from}
    out_path = check_output_files(out_path, report_path, inputs)
    keep_heap_blocks()
    start = time.perf_counter()
    # The report is written before the model is renamed into place, and both are renamed only
    # once both are written: a report that cannot be written leaves the output as it was.
    with staged_outputs() as staged:
        if report_path is not None:
            staged.reserve(report_path, inputs)  # an unwritable report place stops the run here
        with Checkpoint(source_dir) as ckpt:
            cfg = AssistantConfig.from_hf(ckpt.config, str(ckpt.folder / "config.json"))
            if not ordered_head:
                cfg = cfg.full_head()
            target = read_target(vocab_from)
            check_target(target, cfg, Path(vocab_from))
            jobs = drafter_jobs(ckpt, cfg)
            folder = ckpt.folder
        if plan is not None:
            jobs = plan(jobs)
        kv_raw = drafter_kv(cfg, target, [j.stored_type for j in jobs if is_source_matrix(j)])
        file_plan = FilePlan(
            jobs,
            [j.entry for j in jobs],
            GGUF_VERSION,
            ALIGNMENT,
            kv_raw,
            lambda placed: drafter_kv(cfg, target, [t.type for t, j in zip(placed, jobs) if is_source_matrix(j)]),
            _replanner(jobs),
        )
        options = WriteOptions(
            off_grid=off_grid, workers=workers, progress=progress, expect_sha256=expect_sha256, start=start
        )
        written = write_verified(out_path, file_plan, options)
        times = written.seconds | {"total": time.perf_counter() - start}
        result = ConvertResult(out_path, written.sha256, written.size, written.results, times)
        result.report = build_report(result, folder)
        write_report(report_path, result.report)
    return result


def _replanner(jobs: list[TensorJob]) -> Replanner:
    """For the read-back: a chunk's bytes recomputed, to name the first bad block."""
    by_name = {j.entry.name: j for j in jobs}

    def expected(entry: TensorEntry, r0: int, r1: int) -> tuple[np.ndarray | None, int]:
        job = by_name[entry.name]
        if job.role == DATA:
            return job.data, 1
        values = job.source_rows.read(r0, r1)
        if entry.type == Q4_0:
            bits = bf16.from_exact(values)
            assert bits is not None  # written as Q4_0: its source values were bf16 values
            return plan_rows(bits, r0, histogram=False).data, q4_0.BLOCK_BYTES
        return np.ascontiguousarray(encode(values, entry.type)).view(np.uint8), 1

    return expected


def build_report(result: ConvertResult, source: Path) -> dict:
    tensors = []
    for t in result.tensors:
        entry = {"name": t.name, "source": t.hf_name, "type": t.out_type, "bytes": t.out_bytes, "note": t.note}
        if t.n_blocks:
            entry |= {"blocks": t.n_blocks, "off_grid_blocks": t.off_grid_blocks}
        if t.ours is not None:
            entry |= t.ours.as_dict()
        tensors.append(entry)
    total = result.total
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
        "off_grid_tensors": result.off_grid_tensors,
        "seconds": result.seconds,
        "tensors": tensors,
    }
