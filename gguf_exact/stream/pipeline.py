"""The one write pipeline of ``convert`` and ``repack``: write, finish, read back, sha256, rename.

:func:`write_verified` writes planned tensors (a :class:`FilePlan`) in row chunks into a temp file beside the
output (:mod:`.writer`), writes the header last with the final key/values (which may
depend on the types the tensors were written as), reads the file back against what was
meant (:func:`.readback.verify_written`: header bytes, every chunk's CRC, gaps; the same
pass gives the sha256), holds it to :attr:`WriteOptions.expect_sha256`, and only then renames it into
place. On any failure nothing is left at the output. :func:`write_report` writes a JSON
report the same careful way.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gguf_exact.errors import NotExactError
from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.formats.gguf_reader import GgufFile
from gguf_exact.formats.gguf_stream import streaming_gguf
from gguf_exact.formats.safe_write import write_text
from gguf_exact.progress import Progress
from gguf_exact.stream.jobs import TensorJob
from gguf_exact.stream.readback import Replanner, verify_written
from gguf_exact.stream.writer import DONOR_SAMPLE_EVERY, TensorResult, TensorWriter, write_tensors


@dataclass
class Written:
    """A file :func:`write_verified` wrote, read back and renamed into place."""

    path: Path
    sha256: str
    size: int
    results: list[TensorResult]  # per tensor, in file order
    seconds: dict[str, float] = field(default_factory=dict)  # write, verify (from ``start``)


@dataclass(frozen=True)
class FilePlan:
    """What :func:`write_verified` writes: ``jobs`` as ``entries`` in a GGUF of ``version`` and
    ``alignment``, header room planned with ``kv``, the header written last with
    ``final_kv(placed entries)``; ``replanner(entry, r0, r1)`` recomputes a chunk's bytes
    to name a bad block when the read-back finds one."""

    jobs: list[TensorJob]
    entries: list[TensorEntry]
    version: int
    alignment: int
    kv: list[bytes]
    final_kv: Callable[[list[TensorEntry]], list[bytes]]
    replanner: Replanner


@dataclass(frozen=True)
class WriteOptions:
    """How :func:`write_verified` writes: the ``donor`` copies come from (figures on every
    ``donor_every``-th chunk), the ``off_grid`` rule (:class:`.writer.TensorWriter`), the
    workers, ``progress``, the sha256 the file must have, and ``start``, the time ``seconds``
    count from (default: the call)."""

    donor: GgufFile | None = None
    off_grid: str | None = None
    donor_every: int = DONOR_SAMPLE_EVERY
    workers: int | None = None
    worker_kind: str = "thread"
    progress: Progress | None = None
    expect_sha256: str | None = None
    start: float | None = None


def write_verified(out_path: Path, plan: FilePlan, options: WriteOptions | None = None) -> Written:
    """Write ``plan`` at ``out_path`` as ``options`` say, read it back, check its sha256, rename."""
    o = options or WriteOptions()
    start = time.perf_counter() if o.start is None else o.start
    seconds: dict[str, float] = {}
    with streaming_gguf(out_path, plan.version, plan.kv, plan.entries, plan.alignment) as writer:
        tensors = TensorWriter(plan.jobs, writer, o.donor, o.off_grid, o.donor_every)
        try:
            results = write_tensors(tensors, o.workers or min(2, os.cpu_count() or 1), o.worker_kind, o.progress)
            size = writer.finish(plan.final_kv(writer.placed))
        finally:
            tensors.close()
            writer.close()
        seconds["write"] = time.perf_counter() - start
        digest = verify_written(writer.path, writer.header, writer.placed, results, plan.replanner)
        seconds["verify"] = time.perf_counter() - start - seconds["write"]
        expect = o.expect_sha256.lower() if o.expect_sha256 else None
        if expect and digest != expect:
            raise NotExactError(f"{out_path}: sha256 {digest} does not match the expected {expect}")
    return Written(out_path, digest, size, results, seconds)


def write_report(report_path: str | Path | None, report: dict) -> None:
    """Write ``report`` as JSON at ``report_path`` (nothing when None), atomically."""
    if report_path:
        write_text(report_path, json.dumps(report, indent=2) + "\n")


__all__ = ["FilePlan", "WriteOptions", "Written", "write_report", "write_verified"]
