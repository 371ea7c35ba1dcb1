"""Writing planned tensors into a GGUF in row chunks, on both cores.

Each :class:`~.jobs.TensorJob` is cut into chunks of about :data:`CHUNK_VALUES` values.
A chunk reads its source rows (and the donor's) with ``pread``, plans, encodes or copies
them, writes its bytes with ``pwrite`` at their place in the temp file
(:class:`~gguf_exact.formats.gguf_stream.StreamingGGUF`), and returns small figures: the
CRC of its bytes (for :mod:`.readback`), off-grid blocks, and its error against the
source. Tensors are written in order; a ``qat`` tensor found off the grid is written
again in its fallback form at the same place. Memory is bounded by a chunk per worker,
not by tensor size.

Chunks run on threads by default: the packer's kernel, ``pread``, ``pwrite`` and the CRC
all release the GIL, so two threads keep two cores busy in one process (whose peak
memory is then the whole story). :mod:`.chunk_pool` can also fork worker processes.
"""

import os
import zlib
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType

from gguf_exact.core import bf16
from gguf_exact.core.error_stats import ErrorStats, compare_chunk, sum_stats
from gguf_exact.core.exact import plan_rows
from gguf_exact.errors import ArgumentError, GgufExactError, InputError, Message, OffGridError, Param
from gguf_exact.formats.gguf_file import TYPES, decode, encode
from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.formats.gguf_reader import GgufFile
from gguf_exact.formats.gguf_stream import StreamingGGUF, pwrite_all
from gguf_exact.progress import Progress, announce
from gguf_exact.stream.chunk_pool import ChunkPool, chunk_pool
from gguf_exact.stream.jobs import DATA, ENCODE, PROBE, SOURCE, TensorJob

CHUNK_VALUES = 1 << 18
DONOR_SAMPLE_EVERY = 32  # donor figures from every 32nd chunk of re-packed tensors (all: every chunk)
FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
# Largest relative difference between a donor tensor and its source for "same model":
# float copies must match (norms are copied from the donor), quantized ones roughly.
SAME_MODEL_FLOAT, SAME_MODEL_QUANTIZED = 1e-2, 0.5
Q4_0 = GGMLQuantizationType.Q4_0


def crc(data: np.ndarray) -> int:
    """The CRC-32 of a chunk's bytes: what the read-back compares (zlib releases the GIL)."""
    return zlib.crc32(np.ascontiguousarray(data).data.cast("B"))


@dataclass
class ChunkResult:
    r0: int
    r1: int
    n_blocks: int = 0
    off_grid_blocks: int = 0
    first_off_grid: list = field(default_factory=list)
    not_bf16: bool = False  # an F16/F32 source with values bf16 cannot hold: no exact Q4_0
    planner_exact: int = 0
    ours: ErrorStats | None = None
    donor: ErrorStats | None = None
    crc: int = 0


@dataclass
class TensorResult:
    name: str
    kind: str
    role: str
    hf_name: str | None
    donor_type: str  # the planned entry's type (the donor's, when there is one)
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
    crcs: list[int] = field(default_factory=list, repr=False)

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


class TensorWriter:
    """Carries out jobs into ``writer``. Its chunk methods run on the pool's workers (a
    forked process inherits it, descriptors included), take a job index and rows, write
    their bytes at their place and return a :class:`ChunkResult`.

    ``off_grid``: for a ``qat`` matrix with blocks off the grid, None stops, ``keep``
    copies the donor's tensor, a type name (``q8_0``, ``f16``, ``bf16``, ``f32``) stores
    the source in that type. ``donor_every``: donor figures on every n-th chunk."""

    def __init__(
        self,
        jobs: list[TensorJob],
        writer: StreamingGGUF,
        donor: GgufFile | None = None,
        off_grid: str | None = None,
        donor_every: int = DONOR_SAMPLE_EVERY,
    ) -> None:
        if off_grid == "keep" and donor is None:
            raise ArgumentError(Param("off_grid"), " keep keeps the donor's tensor, and there is no donor here")
        self.donor, self.jobs, self.writer = donor, jobs, writer
        self.off_grid, self.donor_every = off_grid, donor_every
        self.pool: ChunkPool | None = None  # write_tensors' while it runs
        self.fds = {
            f: os.open(f, os.O_RDONLY) for f in sorted({j.source_rows.loc.file for j in jobs if j.source is not None})
        }

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    # -- chunk workers (run on the pool) --------------------------------------------

    def _read_source(self, job: TensorJob, r0: int, r1: int, check_finite: bool = True) -> np.ndarray:
        return job.source_rows.read(r0, r1, self.fds[job.source_rows.loc.file], check_finite)

    def _donor_stats(self, job: TensorJob, r0: int, r1: int, values: np.ndarray) -> ErrorStats | None:
        e = job.entry
        assert self.donor is not None  # sampled only with a donor
        try:
            decoded = decode(self.donor.read_rows(e, r0, r1), e.type, (r1 - r0, e.cols))
        except NotImplementedError:
            return None
        return compare_chunk(decoded, values, ulps=False)

    def _sampled(self, index: int) -> bool:
        return self.donor is not None and index % self.donor_every == 0

    def exact_chunk(self, j: int, offset: int, r0: int, r1: int, index: int) -> ChunkResult:
        job = self.jobs[j]
        values = self._read_source(job, r0, r1, check_finite=False)  # the kernel checks
        bits = bf16.from_exact(values)
        if bits is None:
            n_blocks = values.size // 32
            return ChunkResult(r0, r1, n_blocks, n_blocks, [], not_bf16=True)
        try:
            plan = plan_rows(bits, r0, histogram=False, score_partial=False)
        except GgufExactError as err:
            raise InputError(f"{job.source_rows.loc.file}: tensor {job.hf_name}: {err}") from None
        res = ChunkResult(r0, r1, plan.n_blocks, plan.off_grid_blocks, plan.first_off_grid)
        if plan.data is None:
            return res
        pwrite_all(self.writer.fd, plan.data, offset + r0 * plan.data.shape[1])
        res.crc = crc(plan.data)
        res.planner_exact = plan.exact_values
        res.ours = (
            plan.stats if values.dtype == np.uint16 else compare_chunk(decode(plan.data, Q4_0, values.shape), values)
        )
        if self._sampled(index):
            res.donor = self._donor_stats(job, r0, r1, values)
        return res

    def copy_chunk(self, j: int, offset: int, r0: int, r1: int, index: int) -> ChunkResult:
        job = self.jobs[j]
        e = job.entry
        assert self.donor is not None  # copies come from the donor
        raw = self.donor.read_rows(e, r0, r1)
        pwrite_all(self.writer.fd, raw, offset + r0 * raw.shape[1])
        res = ChunkResult(r0, r1, crc=crc(raw))
        if job.source is not None:
            values = self._read_source(job, r0, r1)
            try:
                res.donor = compare_chunk(decode(raw, e.type, (r1 - r0, e.cols)), values)
            except NotImplementedError:
                res.donor = None
            res.ours = res.donor
        return res

    def encode_chunk(
        self, j: int, offset: int, r0: int, r1: int, index: int, qtype: GGMLQuantizationType
    ) -> ChunkResult:
        job = self.jobs[j]
        values = self._read_source(job, r0, r1)
        data = encode(values, qtype)
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(r1 - r0, -1)
        pwrite_all(self.writer.fd, raw, offset + r0 * raw.shape[1])
        res = ChunkResult(r0, r1, crc=crc(raw))
        res.ours = compare_chunk(decode(data, qtype, values.shape), values)
        if self._sampled(index):
            res.donor = self._donor_stats(job, r0, r1, values)
        return res

    # -- per tensor (in the calling thread) -------------------------------------------

    def _chunks(self, method: str, j: int, offset: int, *extra) -> tuple[list[ChunkResult], int]:
        e = self.jobs[j].entry
        step = max(1, CHUNK_VALUES // max(e.cols, 1))
        args = [(j, offset, r0, min(e.rows, r0 + step), i, *extra) for i, r0 in enumerate(range(0, e.rows, step))]
        assert self.pool is not None  # inside write_tensors
        return self.pool.run(method, args), step

    def tensor(self, j: int) -> TensorResult:
        job = self.jobs[j]
        e = job.entry
        result = TensorResult(
            e.name, job.kind, job.role, job.hf_name, e.type.name, e.nbytes, e.type.name, e.nbytes, e.n_values,
            None, None, note=job.note,
        )  # fmt: skip
        if job.role == DATA:
            return self._data(job, result)
        if job.role == ENCODE:
            result.rewritten = True
            return self._finish(job, result, *self._chunks("encode_chunk", j, self.writer.place(e), e.type))
        if job.role == SOURCE:  # a bf16 reference: the source's own bytes, in its own dtype
            out = TensorEntry(e.name, e.ne, job.stored_type)
            result.out_type, result.out_bytes, result.rewritten = out.type.name, out.nbytes, True
            return self._finish(job, result, *self._chunks("encode_chunk", j, self.writer.place(out), out.type))
        if not job.exact:
            return self._finish(job, result, *self._chunks("copy_chunk", j, self.writer.place(e)))
        out = TensorEntry(e.name, e.ne, Q4_0)
        chunks, step = self._chunks("exact_chunk", j, self.writer.place(out))
        result.n_blocks = sum(c.n_blocks for c in chunks)
        result.off_grid_blocks = sum(c.off_grid_blocks for c in chunks)
        if result.off_grid_blocks == 0:
            result.out_type, result.out_bytes = Q4_0.name, out.nbytes
            result.planner_exact = sum(c.planner_exact for c in chunks)
            result.rewritten = True
            return self._finish(job, result, chunks, step)
        return self._fallback(j, job, result, chunks)

    def _fallback(self, j: int, job: TensorJob, result: TensorResult, chunks: list[ChunkResult]) -> TensorResult:
        e = job.entry
        where = f"{job.source_rows.loc.file}: tensor {job.hf_name}"
        if any(c.not_bf16 for c in chunks):
            share = f"{job.source_rows.loc.dtype} values that bf16 cannot hold exactly, so no exact Q4_0"
            how = Message("pass ", Param("off_grid", value="f32|f16|bf16|q8_0"), " to store it in another type")
        else:
            share = f"{result.off_grid_blocks} of {result.n_blocks} blocks are off the 4-bit grid"
            choices = ("keep|" if self.donor is not None else "") + "q8_0|f16|bf16"
            how = Message("pass ", Param("off_grid", value=choices), " to store such matrices in another way")
        if job.lossless is not None:
            return self._encoded_fallback(j, job, result, job.lossless, f"off grid ({share}), stored as "
                                          f"{job.lossless.name.lower()}, every source bit")  # fmt: skip
        if job.role == PROBE or self.off_grid == "keep":
            result.note = f"off grid ({share}), kept as the donor has it"
            return self._finish(job, result, *self._chunks("copy_chunk", j, self.writer.replace_last(e)))
        if self.off_grid is None:
            first = next((f for c in chunks for f in c.first_off_grid), None)
            at = f" (first at row {first[0]}, column {first[1]}, residual {first[2]:.3g} steps)" if first else ""
            raise OffGridError(f"{where}: {share}{at}; ", how)
        return self._encoded_fallback(j, job, result, TYPES[self.off_grid], f"off grid ({share}), stored as {self.off_grid}")

    def _encoded_fallback(
        self, j: int, job: TensorJob, result: TensorResult, qtype: GGMLQuantizationType, note: str
    ) -> TensorResult:
        fallback = TensorEntry(job.entry.name, job.entry.ne, qtype)
        result.out_type, result.out_bytes, result.rewritten, result.note = qtype.name, fallback.nbytes, True, note
        return self._finish(job, result, *self._chunks("encode_chunk", j, self.writer.replace_last(fallback), qtype))

    def _data(self, job: TensorJob, result: TensorResult) -> TensorResult:
        offset = self.writer.place(job.entry)
        assert job.data is not None  # role data: planned with its bytes
        pwrite_all(self.writer.fd, job.data, offset)
        result.rewritten, result.chunk_rows, result.crcs = True, job.entry.rows or 1, [crc(job.data)]
        return result

    def _finish(self, job: TensorJob, result: TensorResult, chunks: list[ChunkResult], step: int) -> TensorResult:
        result.ours = sum_stats(c.ours for c in chunks)
        result.donor = sum_stats(c.donor for c in chunks)
        result.crcs = [c.crc for c in chunks]
        result.chunk_rows = step
        limit = SAME_MODEL_FLOAT if job.entry.type in FLOAT_TYPES else SAME_MODEL_QUANTIZED
        if result.donor is not None and result.donor.rel_error > limit and self.donor is not None:
            raise InputError(
                f"{self.donor.path}: tensor {job.entry.name} differs from the source's {job.hf_name} "
                f"(relative difference {result.donor.rel_error:.3g}): donor and source are different models"
            )
        return result


def write_tensors(
    tensors: TensorWriter, workers: int, worker_kind: str = "thread", progress: Progress | None = None
) -> list[TensorResult]:
    """Every job of ``tensors``, in order, on ``workers`` workers."""
    results = []
    announce(progress, len(tensors.jobs))
    with chunk_pool(tensors, workers, worker_kind) as tensors.pool:
        for j, job in enumerate(tensors.jobs):
            if progress:
                progress(job.entry.name)
            results.append(tensors.tensor(j))
            tensors.writer.start_writeback()
    return results


def placed_types(results: list[TensorResult], jobs: list[TensorJob]) -> list[tuple[TensorEntry, GGMLQuantizationType]]:
    """(planned entry, type written) per tensor, for ``general.file_type``."""
    return [(job.entry, GGMLQuantizationType[r.out_type]) for job, r in zip(jobs, results)]


__all__ = ["ChunkResult", "TensorResult", "TensorWriter", "placed_types", "write_tensors"]
