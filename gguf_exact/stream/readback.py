"""Reading a written file back before it is renamed into place, in one pass.

The header must be the bytes written (key/values and tensor infos, compared as bytes:
a Gemma 4 vocabulary is not parsed a second time); then the file is read start to end in
the chunks it was written in: each chunk's CRC must equal the CRC of the bytes
planned for it (so every Q4_0 block equals its plan, every copied tensor the donor's,
every encoded one its encoding), gaps must be zero, and the same pass gives the
sha256. The bit-exact figures were measured on exactly those planned bytes.

The sha256 is taken on a thread of its own, in file order, while the CRCs are taken on the
calling thread: both release the GIL, so the pass costs about the larger of the two
rather than their sum.
"""

import hashlib
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from gguf_exact.errors import GgufExactError, NotExactError
from gguf_exact.formats.gguf_layout import TensorEntry, row_bytes
from gguf_exact.formats.gguf_reader import pread_exact
from gguf_exact.stream.writer import crc

READ_BYTES = 1 << 22
HASHED_AHEAD = 2  # chunks read and not yet hashed, at most
# (entry, r0, r1) -> the bytes rows r0..r1 should hold (None: not recomputable), and the unit
# a difference is counted in (18: a Q4_0 block, 1: a byte)
Replanner = Callable[[TensorEntry, int, int], "tuple[np.ndarray | None, int]"]


def _fail(path: Path, what: str) -> GgufExactError:
    return NotExactError(f"{path}: verification failed: {what}")


def verify_written(path: Path, header: bytes, placed: list[TensorEntry], results: list, expected: Replanner) -> str:
    """Check ``path`` against what was meant; returns its sha256 (hex).

    ``header`` is the header as written (key/values and tensor infos, padded: the file's
    first bytes); ``placed`` the tensors at their offsets; ``results`` hold, per tensor,
    ``chunk_rows`` and the chunk ``crcs``; ``expected(entry, r0, r1)`` recomputes a
    chunk's bytes to name the first bad block.
    """
    fd = os.open(path, os.O_RDONLY)
    sha = hashlib.sha256()
    hasher = ThreadPoolExecutor(1, thread_name_prefix="gguf-sha256")  # one worker: updates in order
    in_flight: deque = deque()

    def hash_next(raw) -> None:
        if len(in_flight) == HASHED_AHEAD:  # memory stays a few chunks, however far ahead the CRCs run
            in_flight.popleft().result()
        in_flight.append(hasher.submit(sha.update, raw))

    try:
        size = os.fstat(fd).st_size
        on_disk = pread_exact(fd, len(header), 0, path)
        if on_disk.tobytes() != header:
            first = int(np.flatnonzero(on_disk != np.frombuffer(header, np.uint8))[0])
            raise _fail(path, f"header byte {first:,} differs from what was written")
        hash_next(header)
        pos = data_start = len(header)
        for entry, result in zip(placed, results):
            start = data_start + entry.offset
            _zeros(fd, pos, start, hash_next, path)
            rb = row_bytes(entry.type, entry.cols)
            rows, step = entry.rows, result.chunk_rows
            for i, r0 in enumerate(range(0, rows, step)):
                r1 = min(rows, r0 + step)
                raw = pread_exact(fd, (r1 - r0) * rb, start + r0 * rb, path)
                hash_next(raw)
                if crc(raw) != result.crcs[i]:
                    raise _fail(path, _where(entry, r0, r1, raw, expected))
            pos = start + entry.nbytes
        _zeros(fd, pos, size, hash_next, path)
    finally:
        hasher.shutdown(wait=True)
        os.close(fd)
    return sha.hexdigest()


def _zeros(fd: int, start: int, end: int, hash_next: Callable, path: Path) -> None:
    while start < end:
        raw = pread_exact(fd, min(READ_BYTES, end - start), start, path)
        if raw.any():
            raise _fail(path, f"padding at byte {start + int(np.flatnonzero(raw)[0])} is not zero")
        hash_next(raw)
        start += raw.size


def _where(entry: TensorEntry, r0: int, r1: int, raw: np.ndarray, expected: Replanner) -> str:
    want, unit = expected(entry, r0, r1)
    if want is None:
        return f"tensor {entry.name}: rows {r0}..{r1 - 1} differ from what was written"
    flat_want, flat_raw = np.asarray(want).reshape(-1), raw.reshape(-1)
    differ = np.flatnonzero(flat_want != flat_raw) if flat_want.size == flat_raw.size else np.array([0])
    first = int(differ[0]) // unit if differ.size else 0
    per_row = row_bytes(entry.type, entry.cols) // unit
    label = "Q4_0 block" if unit == 18 else "byte"
    return f"tensor {entry.name}: {label} {r0 * per_row + first} differs from the plan"
