"""Judging an existing GGUF against its plan, tensor by tensor, in row chunks.

The plan is what ``convert`` (drafters) or ``repack`` (main models) would write for the
source: one :class:`~.jobs.TensorJob` per tensor (:mod:`.jobs`), and the key/value pairs
(judged by the caller, :mod:`gguf_exact.formats.kv_judge`). Every tensor of the file is
held to it, and nothing is merely measured:

- the file holds exactly the planned tensors, each of the planned shape;
- a matrix whose source is on the 4-bit grid is Q4_0, and each block follows the block
  rule of :mod:`gguf_exact.core.block_exactness`: at least as many values bit-exact as
  the plan's block, none further from the source than the plan's worst (no slack);
- a matrix whose source is off the grid has no exact form: it must hold the bytes the
  writer defines for its fallback, the source encoded as the type the file records
  (or ``--off-grid`` names), or (``repack --off-grid keep``, the MoE router) the donor's;
- a norm or scale is the planned type holding the source's values (drafters: F32, every
  bit); a tensor a re-pack copies from its donor holds the donor's bytes;
- a generated tensor (``rope_freqs``) holds what the config gives;
- in a bf16 reference (``--bf16``), a matrix holds the source's own bytes, every one.

What cannot be judged without a donor is named in :attr:`Verification.unchecked`, never
passed over. Lines that name a parameter (``give donor=DONOR.gguf to judge it``) are
:class:`~gguf_exact.errors.Message` strings: the CLI renders them with its flags
(``--donor DONOR.gguf``). Chunks run on two threads: the packer's kernel, ``pread`` and most numpy
passes release the GIL, and a file whose chunks are the plan's bytes costs the plan plus
one comparison per chunk.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from gguf_exact.core import bf16, q4_0
from gguf_exact.core.block_exactness import BlockJudgement, judge_blocks
from gguf_exact.core.error_stats import ErrorStats, compare_chunk, sum_stats
from gguf_exact.core.exact import plan_rows
from gguf_exact.errors import Message, Param
from gguf_exact.formats.gguf_file import decode, encode
from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.formats.gguf_reader import GgufFile
from gguf_exact.formats.kv_judge import KeyJudgement
from gguf_exact.progress import Progress, announce
from gguf_exact.stream.jobs import COPY, DATA, ENCODE, FROM_DONOR, PROBE, SOURCE, TensorJob
from gguf_exact.stream.verification import (  # noqa: F401  (importable from here, as before)
    ALLOW,
    DONOR,
    FAIL,
    FALLBACK_TYPES,
    FLOATS,
    KEEP,
    LLAMA_WAY,
    NOT_JUDGED,
    PASS,
    REFERENCE,
    OffGridRule,
    TensorCheck,
    Verification,
    _block_failure,
    _count,
    _value_failure,
)

CHUNK_VALUES = 1 << 19  # the packer's best chunk on 2 cores (core/exact.py)
T = GGMLQuantizationType
Q4_0 = T.Q4_0
# --- judging --------------------------------------------------------------------------------


def verify_tensors(
    gguf: GgufFile,
    jobs: list[TensorJob],
    keys: KeyJudgement,
    off_grid: OffGridRule = OffGridRule(),
    donor: GgufFile | None = None,
    writer: str = "convert",
    source: Path | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
) -> Verification:
    """Hold every tensor of ``gguf`` to ``jobs`` (see the module docstring); the header
    has been judged by the caller (``keys``). Never raises for a file that does not
    pass: the failures are in the result."""
    v = Verification(gguf.path, source, writer, keys=keys)
    v.failures += keys.failures
    v.unchecked += keys.unchecked
    by_name = {t.name: t for t in gguf.tensors}
    planned = {j.entry.name for j in jobs}
    for job in jobs:
        if job.entry.name not in by_name:
            v.failures.append(f"tensor {job.entry.name} is missing; {writer} writes it ({_origin(job)})")
    for t in gguf.tensors:
        if t.name not in planned:
            v.failures.append(
                f"tensor {t.name} ({t.type.name} {list(t.shape)}) is not one {writer} writes for this source"
            )
    judge = _Judge(gguf, donor, off_grid, writer, workers or min(2, os.cpu_count() or 1))
    announce(progress, sum(j.entry.name in by_name for j in jobs))
    try:
        for job in jobs:
            if job.entry.name not in by_name:
                continue
            t = by_name[job.entry.name]
            if progress:
                progress(t.name)
            check = judge.tensor(job, t)
            v.tensors.append(check)
            if check.status == FAIL:
                v.failures.append(Message(f"tensor {t.name}: ", check.failure))
            elif check.status == NOT_JUDGED:
                v.unchecked.append(Message(f"tensor {t.name}: ", check.note))
    finally:
        judge.close()
    return v


def _origin(job: TensorJob) -> str:
    if job.hf_name:
        return f"from the source's {job.hf_name}"
    return "from the config" if job.role == DATA else "from the donor"


@dataclass
class _Chunk:
    """What one chunk of rows tells about its tensor."""

    r0: int
    r1: int
    stats: ErrorStats | None = None
    blocks: BlockJudgement | None = None
    failure: str | None = None  # the first bad block or value, with its figures
    off_grid: tuple[int, int] | None = None  # (row, column) of the first block with no exact form
    off_grid_blocks: int = 0
    not_bf16: bool = False  # off the grid because F16/F32 source values are not bf16 values
    differs: bool = False  # bytes other than the ones compared with


class _Judge:
    """Judges tensors chunk by chunk on a pool of threads."""

    def __init__(self, gguf: GgufFile, donor: GgufFile | None, off_grid: OffGridRule, writer: str, workers: int):
        self.gguf, self.donor, self.off_grid, self.writer = gguf, donor, off_grid, writer
        self.pool = ThreadPoolExecutor(max_workers=workers)

    def close(self) -> None:
        self.pool.shutdown()

    def _chunks(self, t: TensorEntry, fn) -> list[_Chunk]:
        step = max(1, CHUNK_VALUES // max(t.cols, 1))
        return list(self.pool.map(lambda r0: fn(r0, min(t.rows, r0 + step)), range(0, t.rows, step)))

    def tensor(self, job: TensorJob, t: TensorEntry) -> TensorCheck:
        check = TensorCheck(name=t.name, source=job.hf_name or "", type=t.type.name, planned=job.entry.type.name)
        if t.ne != job.entry.ne:
            return _failed(
                check, f"shape {list(t.shape)}; {self.writer} writes {list(job.entry.shape)} ({_origin(job)})"
            )
        if job.role == DATA:
            return self._data(job, t, check)
        if job.exact:
            return self._exact(job, t, check)
        if job.role == SOURCE:
            kind = job.stored_type
            return self._encoded(job, t, check, kind, f"{kind.name}: {REFERENCE}")
        if job.role == ENCODE:  # F32 norms, or a matrix as llama.cpp's converter stores it
            how = "the source's values, every bit" if job.entry.type == T.F32 else LLAMA_WAY
            return self._encoded(job, t, check, job.entry.type, f"{job.entry.type.name}: {how}")
        if job.role in FROM_DONOR and self.donor is not None:
            return self._donor_bytes(job, t, check, "the donor's bytes")
        if job.role == COPY and job.source is not None:  # a re-pack without its donor: as upstream writes norms
            return self._encoded(
                job, t, check, T.F32, "F32: the source's values (as llama.cpp's converter writes norms)",
                hint=Message("; give ", DONOR, " to compare with the donor's bytes"),
            )  # fmt: skip
        return self._not_judged(job, t, check, Message("repack copies it from the donor; give ", DONOR, " to judge it"))

    # -- kinds of tensors -------------------------------------------------------------------

    def _data(self, job: TensorJob, t: TensorEntry, check: TensorCheck) -> TensorCheck:
        origin = f"the source's {job.hf_name} as {job.entry.type.name}" if job.hf_name else "generated from config.json"
        check.note = origin
        if t.type != job.entry.type:
            return _failed(check, f"is {t.type.name}; {self.writer} writes {job.entry.type.name}, {origin}")
        raw = self.gguf.read_rows(t, 0, t.rows).reshape(-1)
        assert job.data is not None  # role data: planned with its bytes
        want = job.data.reshape(-1)
        if t.type == T.I32 and not np.array_equal(raw, want):
            got, exp = raw.view("<i4"), want.view("<i4")
            i = int(np.flatnonzero(got != exp)[0])
            return _failed(check, f"value {i} is {int(got[i])}; {origin} gives {int(exp[i])}")
        if not np.array_equal(raw, want):
            got, exp = decode(raw, t.type, (t.n_values,)), decode(want, t.type, (t.n_values,))
            i = int(np.flatnonzero(got.view(np.uint32) != exp.view(np.uint32))[0]) if t.type == T.F32 else 0
            return _failed(check, f"value {i} is {float(got[i])!r}; config.json gives {float(exp[i])!r}")
        return check

    def _encoded(
        self,
        job: TensorJob,
        t: TensorEntry,
        check: TensorCheck,
        planned: GGMLQuantizationType,
        note: str,
        hint: str = "",
    ) -> TensorCheck:
        """The source stored as ``planned``, compared as bytes."""
        check.planned, check.note = planned.name, note
        if t.type != planned:
            return _failed(
                check, Message(f"is {t.type.name}; {self.writer} writes {planned.name}, {note.split(': ', 1)[1]}", hint)
            )
        chunks = self._chunks(t, lambda r0, r1: self._encoded_chunk(job, t, r0, r1))
        return _finish(check, chunks)

    def _encoded_chunk(self, job: TensorJob, t: TensorEntry, r0: int, r1: int) -> _Chunk:
        values = job.source_rows.read(r0, r1)
        raw = self.gguf.read_rows(t, r0, r1)
        want = np.ascontiguousarray(encode(values, t.type)).view(np.uint8).reshape(raw.shape)
        chunk = _Chunk(r0, r1, stats=compare_chunk(decode(raw, t.type, values.shape), values))
        if not np.array_equal(raw, want):
            chunk.differs, chunk.failure = True, _value_failure(t, r0, raw, want)
        return chunk

    def _donor_bytes(self, job: TensorJob, t: TensorEntry, check: TensorCheck, note: str) -> TensorCheck:
        d = job.entry  # the donor's own entry
        check.planned, check.note = d.type.name, note
        if t.type != d.type:
            return _failed(check, f"is {t.type.name}; the donor's is {d.type.name} (repack copies it byte for byte)")

        donor = self.donor
        assert donor is not None  # a donor's copy is judged only with the donor

        def chunk(r0: int, r1: int) -> _Chunk:
            raw, want = self.gguf.read_rows(t, r0, r1), donor.read_rows(d, r0, r1)
            c = _Chunk(r0, r1, stats=_measure(raw, t, job, r0, r1))
            if not np.array_equal(raw, want):
                row = int(np.flatnonzero((raw != want).any(axis=1))[0])
                byte = int(np.flatnonzero(raw[row] != want[row])[0])
                c.differs, c.failure = True, f"row {r0 + row} differs from the donor's (byte {byte} of the row)"
            return c

        return _finish(check, self._chunks(t, chunk))

    def _not_judged(self, job: TensorJob, t: TensorEntry, check: TensorCheck, why: str) -> TensorCheck:
        check.status, check.note = NOT_JUDGED, why
        if job.source is not None:
            parts = self._chunks(
                t, lambda r0, r1: _Chunk(r0, r1, stats=_measure(self.gguf.read_rows(t, r0, r1), t, job, r0, r1))
            )
            _add_stats(check, parts)
        return check

    def _exact(self, job: TensorJob, t: TensorEntry, check: TensorCheck) -> TensorCheck:
        """A matrix planned as exact Q4_0: Q4_0 blocks by the block rule where the source
        is on the grid; where it is not, the writer's fallback."""
        check.planned = Q4_0.name
        if t.type == Q4_0:
            chunks = self._chunks(t, lambda r0, r1: self._q4_0_chunk(job, t, r0, r1))
            if not any(c.off_grid for c in chunks):
                check.note = "exact Q4_0: every block by the block rule"
                check.blocks = BlockJudgement()
                for c in chunks:
                    if c.blocks is not None:  # every chunk on the grid has its blocks judged
                        check.blocks.add(c.blocks, 0, 0)
                done = _finish(check, chunks)
                if done.status == FAIL:
                    n, total = check.blocks.less_exact, check.blocks.n_blocks
                    done.failure += f"; {n:,} of {total:,} blocks of this tensor {'is' if n == 1 else 'are'} less exact"
                return done
            return self._off_grid(job, t, check, chunks)
        chunks = self._chunks(t, lambda r0, r1: self._fallback_chunk(job, t, r0, r1))
        if not any(c.off_grid for c in chunks):
            _add_stats(check, chunks)
            return _failed(
                check, f"is {t.type.name}, but its source {job.hf_name} is on the 4-bit grid: exact Q4_0 expected"
            )
        return self._off_grid(job, t, check, chunks)

    def _off_grid(self, job: TensorJob, t: TensorEntry, check: TensorCheck, chunks: list[_Chunk]) -> TensorCheck:
        """A matrix whose source has no exact Q4_0 form, stored as the file has it."""
        n_off = sum(c.off_grid_blocks for c in chunks)
        first = next(c.off_grid for c in chunks if c.off_grid)
        at = f"{n_off:,} blocks, first at row {first[0]}, column {first[1]}"
        if any(c.not_bf16 for c in chunks):
            where = f"its source {job.hf_name} holds {job.source_rows.loc.dtype} values that bf16 cannot ({at})"
        else:
            where = f"its source {job.hf_name} is off the 4-bit grid ({at})"
        kept = job.role == PROBE or self.off_grid.keep
        if job.lossless is not None:  # stored in the source's own type whatever the policy (chunks compared as bytes)
            check.planned, check.note = job.lossless.name, f"off the grid: the source as {job.lossless.name}, every bit"
            if t.type != job.lossless:
                return _failed(check, f"is {t.type.name}, but {where}: {self.writer} stores it as {job.lossless.name}")
            return _finish(check, chunks)
        if t.type in self.off_grid.types and job.role != PROBE:  # chunks from _fallback_chunk: bytes compared
            check.planned = t.type.name
            how = Param("off_grid", value=t.type.name.lower())
            check.note = Message(f"off the grid: the source as {t.type.name}, as ", how, " writes it")
            return _finish(check, chunks)
        if kept and self.donor is not None:
            return self._donor_bytes(
                job,
                t,
                check,
                Message("off the grid: the donor's bytes (", "router" if job.role == PROBE else KEEP, ")"),
            )
        if kept:
            return self._not_judged(
                job, t, check, Message(f"{where}, so repack keeps the donor's tensor; give ", DONOR, " to judge it")
            )
        allowed = self.off_grid.words()
        return _failed(
            check,
            Message(
                f"is {t.type.name}, but {where}: no exact Q4_0 form; {self.writer} stores such a matrix as {allowed} (",
                Param("off_grid"),
                ")",
            ),
        )

    def _q4_0_chunk(self, job: TensorJob, t: TensorEntry, r0: int, r1: int) -> _Chunk:
        values = job.source_rows.read(r0, r1)
        raw = self.gguf.read_rows(t, r0, r1)
        chunk = _Chunk(r0, r1)
        bits = _plan_bits(values, chunk, t.cols, r0)
        if bits is None:
            return chunk
        plan = plan_rows(bits, r0, histogram=False, score_partial=False)
        if plan.data is None:
            _mark_off_grid(chunk, plan.first_off_grid, plan.off_grid_blocks)
            return chunk
        chunk.blocks = judge_blocks(raw, plan.data, bits)
        if chunk.blocks.as_planned == chunk.blocks.n_blocks:
            chunk.stats = (
                plan.stats
                if values.dtype == np.uint16
                else compare_chunk(decode(plan.data, Q4_0, values.shape), values)
            )
            return chunk
        chunk.differs = True
        chunk.stats = compare_chunk(decode(raw, Q4_0, values.shape), values)
        if chunk.blocks.less_exact:
            chunk.failure = _block_failure(t, r0, raw, plan.data, chunk.blocks)
        return chunk

    def _fallback_chunk(self, job: TensorJob, t: TensorEntry, r0: int, r1: int) -> _Chunk:
        """A chunk of a matrix stored in another type than Q4_0: is its source off the
        grid, and do its bytes equal the source encoded as that type?"""
        values = job.source_rows.read(r0, r1)
        raw = self.gguf.read_rows(t, r0, r1)
        chunk = _Chunk(r0, r1, stats=_measure(raw, t, job, r0, r1, values))
        bits = _plan_bits(values, chunk, t.cols, r0)
        if bits is not None:
            plan = plan_rows(bits, r0, histogram=False, score_partial=False)
            if plan.data is None:
                _mark_off_grid(chunk, plan.first_off_grid, plan.off_grid_blocks)
        if t.type in FALLBACK_TYPES:
            want = np.ascontiguousarray(encode(values, t.type)).view(np.uint8).reshape(raw.shape)
            if not np.array_equal(raw, want):
                chunk.differs, chunk.failure = True, _value_failure(t, r0, raw, want)
        return chunk


def _plan_bits(values: np.ndarray, chunk: _Chunk, cols: int, r0: int) -> np.ndarray | None:
    """The chunk's bf16 bits; None (and the chunk marked off the grid) for F16/F32 values
    bf16 cannot hold, which have no exact Q4_0 form."""
    bits = bf16.from_exact(values)
    if bits is None:
        wide = np.asarray(values, dtype=np.float32)
        lost = np.flatnonzero(
            bf16.to_f32(bf16.from_f32(wide)).view(np.uint32).reshape(-1) != wide.view(np.uint32).reshape(-1)
        )
        first = int(lost[0])
        chunk.off_grid = (r0 + first // cols, first % cols // q4_0.BLOCK_SIZE * q4_0.BLOCK_SIZE)
        chunk.off_grid_blocks = int(np.unique(lost // q4_0.BLOCK_SIZE).size)
        chunk.not_bf16 = True
    return bits


def _mark_off_grid(chunk: _Chunk, first: list, n: int) -> None:
    chunk.off_grid = (first[0][0], first[0][1]) if first else (chunk.r0, 0)
    chunk.off_grid_blocks = n


def _measure(
    raw: np.ndarray, t: TensorEntry, job: TensorJob, r0: int, r1: int, values: np.ndarray | None = None
) -> ErrorStats | None:
    """The stored chunk against its source; None without a source or a decoder."""
    if job.source is None:
        return None
    values = job.source_rows.read(r0, r1) if values is None else values
    try:
        return compare_chunk(decode(raw, t.type, (r1 - r0, t.cols)), values)
    except NotImplementedError:
        return None


def _add_stats(check: TensorCheck, chunks: list[_Chunk]) -> None:
    stats = sum_stats(c.stats for c in chunks)
    if stats is not None:
        check.add(stats)
        check.measured = True


def _finish(check: TensorCheck, chunks: list[_Chunk]) -> TensorCheck:
    _add_stats(check, chunks)
    bad = next((c.failure for c in chunks if c.failure), None)
    if bad is not None:
        check.status, check.failure = FAIL, bad
    return check


def _failed(check: TensorCheck, what: str) -> TensorCheck:
    check.status, check.failure = FAIL, what
    return check


# --- measuring (compare) ---------------------------------------------------------------------


def measure_tensors(gguf: GgufFile, jobs: list[TensorJob], progress: Progress | None = None) -> Verification:
    """Every tensor of ``gguf`` that has a source, measured against it and not judged
    (``compare``: files made any other way, a Q8_0 or bf16 drafter)."""
    v = Verification(gguf.path)
    by_name = {t.name: t for t in gguf.tensors}
    announce(progress, len(jobs))
    for job in jobs:
        t = by_name.get(job.entry.name)
        if t is None or job.source is None or t.ne != job.entry.ne:
            continue
        if progress:
            progress(t.name)
        check = TensorCheck(
            name=t.name, source=job.hf_name or "", type=t.type.name, status=NOT_JUDGED, note="measured only"
        )
        step = max(1, CHUNK_VALUES // max(t.cols, 1))
        parts = [
            _Chunk(r0, min(t.rows, r0 + step), stats=_measure(gguf.read_rows(t, r0, min(t.rows, r0 + step)), t, job, r0, min(t.rows, r0 + step)))
            for r0 in range(0, t.rows, step)
        ]  # fmt: skip
        _add_stats(check, parts)
        v.tensors.append(check)
    return v
