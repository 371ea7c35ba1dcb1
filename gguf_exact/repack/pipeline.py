"""``repack``: a donor GGUF re-packed as exact Q4_0 from the QAT source, streaming.

The donor (for example Google's own QAT GGUF: Q4_0 with llama.cpp's ``max / -8``
steps, Q6_K embeddings, F16 ``per_layer_model_proj``) keeps its header, metadata and
tensor order; every tensor that maps to a source matrix on the 4-bit grid is
rewritten as exact Q4_0, every other tensor is copied byte for byte.

Memory is bounded by a chunk of rows, not by tensor size: each tensor is cut into
chunks of about :data:`CHUNK_VALUES` values; workers read a chunk of the source
and of the donor with ``pread``, plan it (:func:`gguf_exact.core.exact.plan_rows`), compare
the planned bytes, decoded, with the source, and ``pwrite`` them at their place in
a temp file beside the output (:class:`.gguf_stream.StreamingGGUF`). Then the file
is read back (:mod:`.verify`: header, metadata, every chunk's digest,
sha256), and renamed into place. On any failure nothing is left at the output.
"""

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from gguf_exact.core import q4_0
from gguf_exact.core.error_stats import ErrorStats, compare_chunk, sum_stats
from gguf_exact.core.exact import plan_rows
from gguf_exact.errors import GgufExactError, OffGridError
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import TYPES, atomic_output, decode, encode, file_type
from gguf_exact.formats.gguf_layout import TensorEntry, encode_kv, row_bytes
from gguf_exact.formats.gguf_stream import StreamingGGUF, pwrite_all
from gguf_exact.gemma4.names import PROBE
from gguf_exact.malloc_tuning import keep_heap_blocks
from gguf_exact.repack.chunk_pool import ChunkPool, chunk_pool
from gguf_exact.repack.donor import Donor, decode_rows, open_donor
from gguf_exact.repack.source_rows import locate
from gguf_exact.repack.tensor_map import TensorJob, build_map, check_same_model
from gguf_exact.repack.verify import verify_written

CHUNK_VALUES = 1 << 18
DONOR_SAMPLE_EVERY = 8  # donor figures from every 8th chunk of re-packed tensors (all: every chunk)
OFF_GRID_CHOICES = ("keep", "q8_0", "f16", "bf16")
FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
# Largest relative difference between a donor tensor and its source for "same model":
# float copies must match (norms are copied from the donor), quantized ones roughly.
SAME_MODEL_FLOAT, SAME_MODEL_QUANTIZED = 1e-2, 0.5
Q4_0 = GGMLQuantizationType.Q4_0
Progress = Callable[[str], None]


@dataclass
class ChunkResult:
    r0: int
    r1: int
    n_blocks: int = 0
    off_grid_blocks: int = 0
    first_off_grid: list = field(default_factory=list)
    planner_exact: int = 0
    ours: ErrorStats | None = None
    donor: ErrorStats | None = None
    digest: bytes = b""


@dataclass
class TensorResult:
    name: str
    kind: str
    role: str
    hf_name: str | None
    donor_type: str
    donor_bytes: int
    out_type: str
    out_bytes: int
    n_values: int
    ours: ErrorStats | None  # output against the source (None: no source)
    donor: ErrorStats | None  # donor against the source, over the sampled chunks
    planner_exact: int = 0
    off_grid_blocks: int = 0
    n_blocks: int = 0
    note: str = ""
    rewritten: bool = False  # False: the donor's bytes, copied
    chunk_rows: int = 1
    digests: list[bytes] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "source": self.hf_name,
            "action": self.role,
            "rewritten": self.rewritten,
            "note": self.note,
            "donor": {
                "type": self.donor_type,
                "bytes": self.donor_bytes,
                **(self.donor.as_dict() if self.donor else {}),
            },
            "output": {"type": self.out_type, "bytes": self.out_bytes, **(self.ours.as_dict() if self.ours else {})},
            "off_grid_blocks": self.off_grid_blocks,
            "blocks": self.n_blocks,
        }


@dataclass
class RepackResult:
    path: Path
    sha256: str
    size: int
    donor_path: Path
    donor_size: int
    source: Path
    arch: str
    tensors: list[TensorResult]
    source_only: list[str]
    unmapped: list[str]
    file_type: tuple[int | None, int]  # donor's, ours
    seconds: dict[str, float] = field(default_factory=dict)
    report: dict = field(default_factory=dict)


class _Run:
    """One re-pack in progress: the open files and the jobs. Its chunk methods run
    on the pool's workers (forked processes inherit it, descriptors included), take
    a job index and rows, write their bytes at their place and return a small
    :class:`ChunkResult`."""

    def __init__(
        self, donor: Donor, jobs: list[TensorJob], writer: StreamingGGUF, off_grid: str | None, donor_every: int
    ) -> None:
        self.donor, self.jobs, self.writer = donor, jobs, writer
        self.off_grid, self.donor_every = off_grid, donor_every
        self.pool: ChunkPool | None = None
        self.fds = {
            f: os.open(f, os.O_RDONLY) for f in sorted({j.source.loc.file for j in jobs if j.source is not None})
        }

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    # -- chunk workers (run on the pool) --------------------------------------------

    def _read_source(self, job: TensorJob, r0: int, r1: int):
        return job.source.read(r0, r1, self.fds[job.source.loc.file])

    def _donor_stats(self, job: TensorJob, r0: int, r1: int, bits) -> ErrorStats | None:
        e = job.entry
        try:
            decoded = decode_rows(self.donor.read_rows(e, r0, r1), e.type, e.cols)
        except NotImplementedError:
            return None
        return compare_chunk(decoded, bits, ulps=False)

    def _sampled(self, index: int) -> bool:
        return index % self.donor_every == 0

    def repack_chunk(self, j: int, offset: int, r0: int, r1: int, index: int) -> ChunkResult:
        job = self.jobs[j]
        bits = self._read_source(job, r0, r1)
        try:
            plan = plan_rows(bits, r0, histogram=False, score_partial=False)
        except GgufExactError as err:
            raise GgufExactError(f"{job.source.loc.file}: tensor {job.hf_name}: {err}") from None
        res = ChunkResult(r0, r1, plan.n_blocks, plan.off_grid_blocks, plan.first_off_grid)
        if plan.data is None:
            return res
        pwrite_all(self.writer.fd, plan.data, offset + r0 * plan.data.shape[1])
        res.digest = hashlib.sha256(plan.data).digest()
        res.planner_exact = plan.exact_values
        res.ours = compare_chunk(q4_0.dequantize(plan.data), bits)
        if self._sampled(index):
            res.donor = self._donor_stats(job, r0, r1, bits)
        return res

    def copy_chunk(self, j: int, offset: int, r0: int, r1: int, index: int) -> ChunkResult:
        job = self.jobs[j]
        e = job.entry
        raw = self.donor.read_rows(e, r0, r1)
        pwrite_all(self.writer.fd, raw, offset + r0 * raw.shape[1])
        res = ChunkResult(r0, r1, digest=hashlib.sha256(raw).digest())
        if job.source is not None:
            bits = self._read_source(job, r0, r1)
            try:
                res.donor = compare_chunk(decode_rows(raw, e.type, e.cols), bits)
            except NotImplementedError:
                res.donor = None
            res.ours = res.donor
        return res

    def encode_chunk(
        self, j: int, offset: int, r0: int, r1: int, index: int, qtype: GGMLQuantizationType
    ) -> ChunkResult:
        job = self.jobs[j]
        bits = self._read_source(job, r0, r1)
        data = encode(bits, qtype)
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(r1 - r0, -1)
        pwrite_all(self.writer.fd, raw, offset + r0 * raw.shape[1])
        res = ChunkResult(r0, r1, digest=hashlib.sha256(raw).digest())
        res.ours = compare_chunk(decode(data, qtype, bits.shape), bits)
        if self._sampled(index):
            res.donor = self._donor_stats(job, r0, r1, bits)
        return res

    # -- per tensor (in the calling process) ----------------------------------------------

    def _chunks(self, method: str, j: int, offset: int, *extra) -> tuple[list[ChunkResult], int]:
        e = self.jobs[j].entry
        step = max(1, CHUNK_VALUES // max(e.cols, 1))
        args = [(j, offset, r0, min(e.rows, r0 + step), i, *extra) for i, r0 in enumerate(range(0, e.rows, step))]
        return self.pool.run(method, args), step

    def tensor(self, j: int) -> TensorResult:
        job = self.jobs[j]
        e = job.entry
        result = TensorResult(
            e.name,
            job.kind,
            job.role,
            job.hf_name,
            e.type.name,
            e.nbytes,
            e.type.name,
            e.nbytes,
            e.n_values,
            None,
            None,
            note=job.note,
        )
        if not job.repack:
            return self._finish(job, result, *self._chunks("copy_chunk", j, self.writer.place(e)))
        out = TensorEntry(e.name, e.ne, Q4_0)
        chunks, step = self._chunks("repack_chunk", j, self.writer.place(out))
        result.n_blocks = sum(c.n_blocks for c in chunks)
        result.off_grid_blocks = sum(c.off_grid_blocks for c in chunks)
        if result.off_grid_blocks == 0:
            result.out_type, result.out_bytes = Q4_0.name, out.nbytes
            result.planner_exact = sum(c.planner_exact for c in chunks)
            result.rewritten = True
            return self._finish(job, result, chunks, step)
        first = next(f for c in chunks for f in c.first_off_grid)
        share = f"{result.off_grid_blocks} of {result.n_blocks} blocks are off the 4-bit grid"
        if job.role == PROBE or self.off_grid == "keep":
            result.note = f"off grid ({share}), kept as the donor has it"
            return self._finish(job, result, *self._chunks("copy_chunk", j, self.writer.replace_last(e)))
        if self.off_grid is None:
            raise OffGridError(
                f"{job.source.loc.file}: tensor {job.hf_name}: {share} (first at row {first[0]}, column {first[1]}, "
                f"residual {first[2]:.3g} steps); pass --off-grid keep|q8_0|f16|bf16 to store such matrices in another way"
            )
        qtype = TYPES[self.off_grid]
        fallback = TensorEntry(e.name, e.ne, qtype)
        result.out_type, result.out_bytes, result.rewritten = qtype.name, fallback.nbytes, True
        result.note = f"off grid ({share}), stored as {self.off_grid}"
        return self._finish(job, result, *self._chunks("encode_chunk", j, self.writer.replace_last(fallback), qtype))

    def _finish(self, job: TensorJob, result: TensorResult, chunks: list[ChunkResult], step: int) -> TensorResult:
        result.ours = sum_stats(c.ours for c in chunks)
        result.donor = sum_stats(c.donor for c in chunks)
        result.digests = [c.digest for c in chunks]
        result.chunk_rows = step
        limit = SAME_MODEL_FLOAT if job.entry.type in FLOAT_TYPES else SAME_MODEL_QUANTIZED
        if result.donor is not None and result.donor.rel_error > limit:
            raise GgufExactError(
                f"{self.donor.path}: tensor {job.entry.name} differs from the source's {job.hf_name} "
                f"(relative difference {result.donor.rel_error:.3g}): donor and source are different models"
            )
        return result


def _output_kv(donor: Donor, tensor_types: list[tuple[TensorEntry, GGMLQuantizationType]]) -> tuple[list[bytes], int]:
    """The donor's key/value pairs byte for byte, ``general.file_type`` set for ours
    (appended as u32 if the donor has none); and that file type."""
    value = file_type([t for e, t in tensor_types if len(e.ne) >= 2])
    out, seen = [], False
    for kv in donor.header.kv:
        if kv.key == "general.file_type" and kv.vtype not in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            out.append(encode_kv(kv.key, kv.vtype, value))
            seen = True
        else:
            out.append(kv.raw)
    if not seen:
        out.append(encode_kv("general.file_type", GGUFValueType.UINT32, value))
    return out, value


def repack_model(
    donor_path: str | Path,
    source_dir: str | Path,
    out_path: str | Path,
    off_grid: str | None = None,
    expect_sha256: str | None = None,
    report_path: str | Path | None = None,
    workers: int | None = None,
    donor_stats: str = "sample",
    progress: Progress | None = None,
    worker_kind: str = "auto",
) -> RepackResult:
    """Re-pack ``donor_path`` from the QAT checkpoint ``source_dir`` into ``out_path``.

    ``off_grid``: what to do with a QAT matrix that has blocks off the grid: None
    stops (nothing written), ``keep`` copies the donor's tensor, ``q8_0``/``f16``/
    ``bf16`` store the source in that type. ``donor_stats``: ``sample`` measures the
    donor against the source on every 8th chunk of re-packed tensors, ``all`` on all.
    ``workers`` (default 2, or fewer CPUs) run chunks as forked processes on Linux,
    threads elsewhere (``worker_kind``: ``auto``, ``process`` or ``thread``).
    """
    if off_grid is not None and off_grid not in OFF_GRID_CHOICES:
        raise GgufExactError(f"--off-grid {off_grid}: expected one of {', '.join(OFF_GRID_CHOICES)}")
    if donor_stats not in ("sample", "all"):
        raise GgufExactError(f"donor_stats {donor_stats}: expected sample or all")
    out_path, source_dir = Path(out_path), Path(source_dir)
    keep_heap_blocks()
    times: dict[str, float] = {}
    start = time.perf_counter()
    with open_donor(donor_path) as donor:
        if out_path.resolve() == donor.path.resolve():
            raise GgufExactError(f"{out_path}: is the donor itself; write the re-packed file elsewhere")
        with Checkpoint(source_dir) as ckpt:
            check_same_model(
                donor.path, donor.header.value, donor.architecture, ckpt.config, ckpt.folder / "config.json"
            )
            locations = locate(ckpt)
        mapping = build_map(donor.path, donor.architecture, donor.tensors, locations, source_dir)
        # provisional types: header room does not depend on them
        provisional = [(j.entry, Q4_0 if j.repack else j.entry.type) for j in mapping.jobs]
        kv_raw, _ = _output_kv(donor, provisional)
        entries = [TensorEntry(e.name, e.ne, t) for e, t in provisional]
        with atomic_output(out_path) as tmp:
            writer = StreamingGGUF(tmp, donor.header.version, kv_raw, entries, donor.header.alignment)
            run = _Run(donor, mapping.jobs, writer, off_grid, 1 if donor_stats == "all" else DONOR_SAMPLE_EVERY)
            try:
                with chunk_pool(run, workers or min(2, os.cpu_count() or 1), worker_kind) as run.pool:
                    results = []
                    for j, job in enumerate(mapping.jobs):
                        if progress:
                            progress(job.entry.name)
                        results.append(run.tensor(j))
                final_kv, out_file_type = _output_kv(donor, [(t, t.type) for t in writer.placed])
                size = writer.finish(final_kv)
            finally:
                run.close()
                writer.close()
            times["write"] = time.perf_counter() - start
            digest = verify_written(tmp, final_kv, writer.placed, results, donor, _replanner(donor, mapping.jobs))
            times["verify"] = time.perf_counter() - start - times["write"]
            if expect_sha256 and digest != expect_sha256.lower():
                raise GgufExactError(f"{out_path}: sha256 {digest} does not match the expected {expect_sha256.lower()}")
        donor_ft = donor.header.value("general.file_type")
        result = RepackResult(
            out_path, digest, size, donor.path, donor.size, source_dir, donor.architecture, results,
            mapping.source_only, mapping.unmapped, (donor_ft, out_file_type),
        )  # fmt: skip
    times["total"] = time.perf_counter() - start
    result.seconds = times
    from gguf_exact.repack.report import build_report

    result.report = build_report(result)
    if report_path:
        with atomic_output(report_path) as tmp:
            tmp.write_text(json.dumps(result.report, indent=2) + "\n")
    return result


def _replanner(donor: Donor, jobs: list[TensorJob]):
    """For the verifier: the bytes a chunk should hold, recomputed (only called on
    a digest mismatch, to name the first differing block)."""
    by_name = {j.entry.name: j for j in jobs}

    def expected(entry: TensorEntry, r0: int, r1: int):
        job = by_name[entry.name]
        if entry.type == Q4_0 and job.repack:
            plan = plan_rows(job.source.read(r0, r1), r0, histogram=False, score_partial=False)
            return plan.data, q4_0.BLOCK_BYTES
        if entry.type == job.entry.type:
            return donor.read_rows(job.entry, r0, r1), row_bytes(entry.type, entry.cols)
        return None, 1

    return expected
