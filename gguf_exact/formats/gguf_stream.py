"""Writing a GGUF file tensor by tensor, chunk by chunk, in bounded memory.

The header (key/values and tensor infos) has the same length whatever the tensor
types and offsets turn out to be (both are fixed-size fields), so its room is
reserved first, tensors are streamed in order with ``os.pwrite`` at aligned offsets
(chunks of one tensor may be written by several threads at once), and the header
is written last, when every tensor's final type is known. Gaps are zero-filled
and the file ends padded to the alignment, as gguf-py's ``GGUFWriter`` leaves it.
While tensors are still being written, what is written so far goes to disk in the
background (:meth:`StreamingGGUF.start_writeback`), so the fsync before the rename
finds little left to wait for.
"""

import contextlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_exact.formats.gguf_layout import (
    TensorEntry,
    align,
    encode_header,
    layout_offsets,
)
from gguf_exact.formats.safe_write import atomic_output, injected_fault

ZEROS = bytes(1 << 16)


def pwrite_all(fd: int, data, offset: int) -> None:
    view = np.ascontiguousarray(data).data.cast("B") if isinstance(data, np.ndarray) else memoryview(data)
    injected_fault(offset, len(view))
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def write_zeros(fd: int, start: int, end: int) -> None:
    while start < end:
        n = min(len(ZEROS), end - start)
        pwrite_all(fd, ZEROS[:n], start)
        start += n


def planned_size(version: int, kv_raw: list[bytes], tensors: list[TensorEntry], alignment: int) -> int:
    """The size of the file these tensors make, as planned (a fallback type may grow it)."""
    placed = layout_offsets(tensors, alignment)
    end = placed[-1].offset + placed[-1].nbytes if placed else 0
    return len(encode_header(version, list(kv_raw), placed, alignment)) + align(end, alignment)


class StreamingGGUF:
    """A GGUF being written at ``path``: :meth:`place` each tensor in order, write
    its bytes at the returned offset, :meth:`finish` with the final header."""

    def __init__(
        self, path: Path, version: int, kv_raw: list[bytes], tensors: list[TensorEntry], alignment: int
    ) -> None:
        self.path, self.version, self.alignment = path, version, alignment
        self.kv_raw = list(kv_raw)
        self.data_start = len(encode_header(version, self.kv_raw, layout_offsets(tensors, alignment), alignment))
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.placed: list[TensorEntry] = []
        self.end = 0  # relative to the data start, after the last placed tensor
        self.header = b""  # the header as written by finish()
        self._writeback: ThreadPoolExecutor | None = None
        self._synced: Future | None = None

    def start_writeback(self) -> None:
        """Start writing the bytes written so far to disk, in the background: an
        ``os.fdatasync`` on a thread of its own (it releases the GIL), one at a time (a
        call while one runs does nothing; the next covers it). The fsync before the rename
        (:func:`~.safe_write.atomic_output`) then waits only for the tail: for the E2B
        drafter (53 MB) it waited 0.10-0.14 s when every byte was left to it."""
        if self._synced is not None and not self._synced.done():
            return
        self._raise_writeback_error()
        if self._writeback is None:
            self._writeback = ThreadPoolExecutor(1, thread_name_prefix="gguf-writeback")
        self._synced = self._writeback.submit(os.fdatasync, self.fd)

    def _raise_writeback_error(self) -> None:
        # An error the background sync met (EIO, ENOSPC) may be reported to that call
        # only, so it is raised here, as the write's own error.
        if self._synced is not None and self._synced.done() and (err := self._synced.exception()) is not None:
            raise err

    def _stop_writeback(self) -> None:
        if self._writeback is not None:
            self._writeback.shutdown(wait=True)  # before the descriptor is closed
            self._writeback = None

    def place(self, entry: TensorEntry) -> int:
        """Reserve room for ``entry`` (its type and shape final) after the tensors
        placed so far; returns the absolute file offset to write its bytes at."""
        offset = align(self.end, self.alignment)
        self.placed.append(TensorEntry(entry.name, entry.ne, entry.type, offset))
        self.end = offset + entry.nbytes
        return self.data_start + offset

    def replace_last(self, entry: TensorEntry) -> int:
        """Place the last tensor again with another type (a fallback); same offset."""
        last = self.placed.pop()
        self.end = last.offset
        return self.place(entry)

    def finish(self, kv_raw: list[bytes]) -> int:
        """Zero the gaps, write the header (``kv_raw`` must have the same lengths as
        at the start), trim; returns the file size."""
        self._stop_writeback()
        self._raise_writeback_error()
        header = encode_header(self.version, kv_raw, self.placed, self.alignment)
        self.header = header
        if len(header) != self.data_start:
            raise AssertionError("header length changed between reservation and finish")
        pos = 0
        for t in self.placed:
            write_zeros(self.fd, self.data_start + pos, self.data_start + t.offset)
            pos = t.offset + t.nbytes
        size = self.data_start + align(pos, self.alignment)
        write_zeros(self.fd, self.data_start + pos, size)
        pwrite_all(self.fd, header, 0)
        os.ftruncate(self.fd, size)
        return size

    def close(self) -> None:
        self._stop_writeback()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@contextlib.contextmanager
def streaming_gguf(
    path: Path, version: int, kv_raw: list[bytes], tensors: list[TensorEntry], alignment: int
) -> Iterator[StreamingGGUF]:
    """A :class:`StreamingGGUF` on a temp file beside ``path`` (:func:`~.safe_write.atomic_output`,
    the free space held against the planned size), renamed into place when the body ends
    without an error; ``writer.path`` is the temp file, to read back before that."""
    with atomic_output(path, planned_size(version, kv_raw, tensors, alignment)) as tmp:
        writer = StreamingGGUF(tmp, version, kv_raw, tensors, alignment)
        try:
            yield writer
        finally:
            writer.close()


def write_gguf(
    path: Path,
    kv_raw: list[bytes],
    tensors: list[tuple[str, np.ndarray, GGMLQuantizationType]],
    version: int = 3,
    alignment: int = 32,
) -> int:
    """A whole GGUF from key/value pairs (as bytes, e.g. :meth:`gguf_layout.Field.encode`)
    and in-memory tensors (name, data in row-major shape, type): F32/F16 data typed,
    other types as raw bytes of shape (rows, row bytes). Small files: tests, benchmarks'
    inputs, tiny models. Written safely (:func:`~.safe_write.atomic_output`). Returns the size."""
    entries, blobs = [], []
    for name, data, qtype in tensors:
        data = np.ascontiguousarray(data)
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            shape = data.shape
        else:  # raw bytes: the last axis is row bytes
            block, size = GGML_QUANT_SIZES[qtype]
            shape = (*data.shape[:-1], data.shape[-1] // size * block) if data.dtype == np.uint8 else data.shape
        entries.append(TensorEntry(name, tuple(reversed(shape)) or (1,), qtype))
        blobs.append(data)
    with streaming_gguf(path, version, kv_raw, entries, alignment) as writer:
        for entry, data in zip(entries, blobs):
            pwrite_all(writer.fd, data, writer.place(entry))
        return writer.finish(kv_raw)
