"""The one write pipeline of ``convert`` and ``repack``: write, finish, read back, sha256, rename.

:func:`write_verified` writes planned tensors in row chunks into a temp file beside the
output (:mod:`.writer`), writes the header last with the final key/values (which may
depend on the types the tensors were written as), reads the file back against what was
meant (:func:`.readback.verify_written`: header bytes, every chunk's CRC, gaps; the same
pass gives the sha256), holds it to ``expect_sha256``, and only then renames it into
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
from gguf_exact.stream.readback import verify_written
from gguf_exact.stream.writer import DONOR_SAMPLE_EVERY, TensorResult, TensorWriter, write_tensors


@dataclass
class Written:
    """A file :func:`write_verified` wrote, read back and renamed into place."""

    path: Path
    sha256: str
    size: int
    results: list[TensorResult]  # per tensor, in file order
    seconds: dict[str, float] = field(default_factory=dict)  # write, verify (from ``start``)


def write_verified(
    out_path: Path,
    jobs: list[TensorJob],
    entries: list[TensorEntry],
    version: int,
    alignment: int,
    kv: list[bytes],
    final_kv: Callable[[list[TensorEntry]], list[bytes]],
    replanner: Callable,
    *,
    donor: GgufFile | None = None,
    off_grid: str | None = None,
    donor_every: int = DONOR_SAMPLE_EVERY,
    workers: int | None = None,
    worker_kind: str = "thread",
    progress: Progress | None = None,
    expect_sha256: str | None = None,
    start: float | None = None,
) -> Written:
    """Write ``jobs`` as ``entries`` (header room planned with ``kv``), then the header
    with ``final_kv(placed entries)``; read the file back (``replanner(entry, r0, r1)``
    recomputes a chunk's bytes to name a bad block), check ``expect_sha256``, rename.
    ``seconds`` count from ``start`` (default: now)."""
    start = time.perf_counter() if start is None else start
    seconds: dict[str, float] = {}
    with streaming_gguf(out_path, version, kv, entries, alignment) as writer:
        tensors = TensorWriter(jobs, writer, donor, off_grid, donor_every)
        try:
            results = write_tensors(tensors, workers or min(2, os.cpu_count() or 1), worker_kind, progress)
            size = writer.finish(final_kv(writer.placed))
        finally:
            tensors.close()
            writer.close()
        seconds["write"] = time.perf_counter() - start
        digest = verify_written(writer.path, writer.header, writer.placed, results, replanner)
        seconds["verify"] = time.perf_counter() - start - seconds["write"]
        if expect_sha256 and digest != expect_sha256.lower():
            raise NotExactError(f"{out_path}: sha256 {digest} does not match the expected {expect_sha256.lower()}")
    return Written(out_path, digest, size, results, seconds)


def write_report(report_path: str | Path | None, report: dict) -> None:
    """Write ``report`` as JSON at ``report_path`` (nothing when None), atomically."""
    if report_path:
        write_text(report_path, json.dumps(report, indent=2) + "\n")


__all__ = ["Written", "write_report", "write_verified"]
