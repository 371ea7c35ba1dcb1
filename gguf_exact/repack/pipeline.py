"""``repack``: a donor GGUF re-packed as exact Q4_0 from the QAT source, streaming.

The donor (for example Google's own QAT GGUF: Q4_0 with llama.cpp's ``max / -8``
steps, Q6_K embeddings, F16 ``per_layer_model_proj``) keeps its header, metadata and
tensor order; every tensor that maps to a source matrix on the 4-bit grid is
rewritten as exact Q4_0, every other tensor is copied byte for byte.

The donor's tensors become jobs (:mod:`.tensor_map`), which :mod:`gguf_exact.stream`
writes in row chunks on both cores into a temp file beside the output (memory bounded
by a chunk, not by tensor size), reads back (header, metadata, every chunk's CRC,
sha256) and renames into place. On any failure nothing is left at the output.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from gguf_exact.core import bf16, q4_0
from gguf_exact.core.error_stats import ErrorStats, sum_stats
from gguf_exact.core.exact import plan_rows
from gguf_exact.errors import ArgumentError, Param
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import encode, file_type
from gguf_exact.formats.gguf_layout import TensorEntry, encode_kv, row_bytes
from gguf_exact.formats.paths import Inputs, check_output_files, one_command
from gguf_exact.formats.safe_write import staged_outputs
from gguf_exact.malloc_tuning import keep_heap_blocks
from gguf_exact.progress import Progress
from gguf_exact.repack import report as per_kind
from gguf_exact.repack.donor import Donor, open_donor
from gguf_exact.repack.tensor_map import build_map, check_same_model
from gguf_exact.stream.jobs import SOURCE, TensorJob, reference_jobs
from gguf_exact.stream.pipeline import FilePlan, WriteOptions, write_report, write_verified
from gguf_exact.stream.readback import Replanner
from gguf_exact.stream.source_rows import locate
from gguf_exact.stream.writer import DONOR_SAMPLE_EVERY, TensorResult, placed_types

OFF_GRID_CHOICES = ("keep", "q8_0", "f16", "bf16", "f32")
Q4_0 = GGMLQuantizationType.Q4_0


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

    @property
    def repacked_tensors(self) -> int:
        """How many tensors were re-packed as exact Q4_0."""
        return len(per_kind.repacked(self.tensors))

    @property
    def source_tensors(self) -> int:
        """How many tensors hold the source's own bytes (a bf16 reference's matrices)."""
        return sum(t.role == SOURCE for t in self.tensors)

    @property
    def copied_tensors(self) -> int:
        """How many tensors hold the donor's bytes."""
        return sum(not t.rewritten for t in self.tensors)

    @property
    def repacked_stats(self) -> ErrorStats | None:
        """The re-packed tensors against the source (every value)."""
        return sum_stats(t.ours for t in per_kind.repacked(self.tensors))

    @property
    def donor_stats(self) -> ErrorStats | None:
        """The donor's bytes of the same tensors against the source (sampled chunks)."""
        return sum_stats(t.donor for t in per_kind.repacked(self.tensors))

    @property
    def kinds(self) -> list[per_kind.KindRow]:
        """Donor and output side by side, per kind of tensor."""
        return per_kind.kind_rows(self.tensors)

    @property
    def off_grid(self) -> list[tuple[str, str]]:
        """(name, what was done) for each matrix with blocks off the grid."""
        return [(t.name, t.note) for t in self.tensors if t.note.startswith("off grid")]


def output_kv(donor: Donor, tensor_types: list[tuple[TensorEntry, GGMLQuantizationType]]) -> tuple[list[bytes], int]:
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


@one_command()
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
    bf16_reference: bool = False,
) -> RepackResult:
    """Re-pack ``donor_path`` from the QAT checkpoint ``source_dir`` into ``out_path``.

    ``off_grid``: what to do with a QAT matrix that has blocks off the grid: None
    stops (nothing written), ``keep`` copies the donor's tensor, ``q8_0``/``f16``/
    ``bf16`` store the source in that type. ``donor_stats``: ``sample`` measures the
    donor against the source on every 32nd chunk of re-packed tensors, ``all`` on all.
    ``workers`` (default 2, or fewer CPUs) run chunks on threads, so the whole re-pack is
    one process (docs/repack.md: 233 MiB at its peak, against 611 MiB with forked workers).
    ``bf16_reference``: write the bf16 reference instead: the donor's header, keys and
    tensor order, every matrix with a source holding the source's own bytes, every other
    tensor the donor's (:func:`gguf_exact.stream.jobs.reference_jobs`).
    """
    if off_grid is not None and off_grid not in OFF_GRID_CHOICES:
        raise ArgumentError(Param("off_grid"), f" {off_grid}: expected one of {', '.join(OFF_GRID_CHOICES)}")
    if off_grid is not None and bf16_reference:
        raise ArgumentError(
            Param("off_grid"), " does not apply to a bf16 reference: every matrix is the source's bytes"
        )
    if donor_stats not in ("sample", "all"):
        raise ArgumentError(f"donor_stats {donor_stats}: expected sample or all")
    inputs: Inputs = {Param("donor"): donor_path, "source folder's file": source_dir}
    out_path, source_dir = check_output_files(out_path, report_path, inputs), Path(source_dir)
    keep_heap_blocks()
    times: dict[str, float] = {}
    start = time.perf_counter()
    # The report is written before the model is renamed into place, and both are renamed only
    # once both are written: a report that cannot be written leaves the output as it was.
    with staged_outputs() as staged:
        if report_path is not None:
            staged.reserve(report_path, inputs)  # an unwritable report place stops the run here
        with open_donor(donor_path) as donor:
            with Checkpoint(source_dir) as ckpt:
                check_same_model(
                    donor.path, donor.header.value, donor.architecture, ckpt.config, ckpt.folder / "config.json"
                )
                locations = locate(ckpt)
            mapping = build_map(donor.path, donor.architecture, donor.tensors, locations, source_dir)
            if bf16_reference:
                mapping.jobs = reference_jobs(mapping.jobs)
            # provisional types: header room does not depend on them
            provisional = [(j.entry, j.stored_type) for j in mapping.jobs]
            kv_raw, _ = output_kv(donor, provisional)
            entries = [TensorEntry(e.name, e.ne, t) for e, t in provisional]
            file_plan = FilePlan(
                mapping.jobs,
                entries,
                donor.header.version,
                donor.header.alignment,
                kv_raw,
                lambda placed: output_kv(donor, [(t, t.type) for t in placed])[0],
                _replanner(donor, mapping.jobs),
            )
            options = WriteOptions(
                donor=donor,
                off_grid=off_grid,
                donor_every=1 if donor_stats == "all" else DONOR_SAMPLE_EVERY,
                workers=workers,
                progress=progress,
                expect_sha256=expect_sha256,
                start=start,
            )
            written = write_verified(out_path, file_plan, options)
            times.update(written.seconds)
            digest, size, results = written.sha256, written.size, written.results
            _, out_file_type = output_kv(donor, placed_types(results, mapping.jobs))
            donor_ft = donor.header.value("general.file_type")
            result = RepackResult(
                out_path, digest, size, donor.path, donor.size, source_dir, donor.architecture, results,
                mapping.source_only, mapping.unmapped, (donor_ft, out_file_type),
            )  # fmt: skip
        times["total"] = time.perf_counter() - start
        result.seconds = times
        result.report = per_kind.build_report(result)
        write_report(report_path, result.report)
    return result


def _replanner(donor: Donor, jobs: list[TensorJob]) -> Replanner:
    """For the read-back: the bytes a chunk should hold, recomputed (only called on a
    CRC mismatch, to name the first differing block)."""
    by_name = {j.entry.name: j for j in jobs}

    def expected(entry: TensorEntry, r0: int, r1: int) -> tuple[np.ndarray | None, int]:
        job = by_name[entry.name]
        if entry.type == Q4_0 and job.exact:
            bits = bf16.from_exact(job.source_rows.read(r0, r1))
            assert bits is not None  # written as Q4_0: its source values were bf16 values
            plan = plan_rows(bits, r0, histogram=False, score_partial=False)
            return plan.data, q4_0.BLOCK_BYTES
        if job.role == SOURCE:
            return np.ascontiguousarray(encode(job.source_rows.read(r0, r1), entry.type)).view(np.uint8), 1
        if entry.type == job.entry.type:
            return donor.read_rows(job.entry, r0, r1), row_bytes(entry.type, entry.cols)
        return None, 1

    return expected
