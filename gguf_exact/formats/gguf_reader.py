"""Opening a GGUF file: its header parsed by hand, its tensors read by rows.

gguf-py's ``GGUFReader`` builds numpy objects for every element of every array: several
per token of a 262,144-token vocabulary, half a million more for the merges, about 15 s
for a Gemma 4 file. Every command here only needs the scalars, the tensor table and,
for the tokenizer, the arrays as bytes (to copy or compare them whole). So the header is
parsed once (:func:`gguf_exact.formats.gguf_layout.parse_header`) from a read-only
memory map: arrays are skipped over, each key/value pair keeps its raw bytes, and only
the pages of the header are read. Tensor data is read with ``pread`` in row chunks, never
through the map, so resident memory stays at one chunk however large the file.

Every check on the file's structure happens here, once, and every failure is one line
naming the file: no magic, an unsupported version, a header that runs past the end,
implausible counts, a tensor of unknown type, outside the file, misaligned or
overlapping another. Nothing reads past the file's size.
"""

import contextlib
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gguf_exact.errors import InputError
from gguf_exact.formats.bounded_json import open_input, shown
from gguf_exact.formats.gguf_layout import Header, LayoutError, TensorEntry, pair_numbers, parse_header, row_bytes
from gguf_exact.formats.paths import check_input_file

MIN_FILE_BYTES = 24  # magic, version, tensor count, key count


@dataclass
class GgufFile:
    """An open GGUF: parsed :attr:`header`, and a descriptor for reading tensor data."""

    path: Path
    header: Header
    size: int
    fd: int

    @property
    def architecture(self) -> str:
        return str(self.header.value("general.architecture", ""))

    @property
    def tensors(self) -> list[TensorEntry]:
        return self.header.tensors

    def value(self, key: str, default: Any = None) -> Any:
        """A scalar or string value; arrays come back as (element type, length)."""
        return self.header.value(key, default)

    def arch_value(self, key: str, default: Any = None) -> Any:
        """``<architecture>.<key>``, e.g. ``arch_value("embedding_length")``."""
        return self.header.value(f"{self.architecture}.{key}", default)

    def raw_pairs(self, prefix: str) -> list[bytes]:
        """The stored bytes (key, type and value) of every pair whose key starts with
        ``prefix``, in file order: copied byte for byte, compared as bytes."""
        return [kv.raw for kv in self.header.kv if kv.key.startswith(prefix)]

    def array_length(self, key: str) -> int | None:
        """Element count of an array value; None when the key is absent or not an array."""
        value = self.header.value(key)
        return value[1] if isinstance(value, tuple) else None

    def numbers(self, key: str) -> list | None:
        """A numeric or bool value as a list: a scalar as one element, an array element
        by element (per-layer hyperparameters such as ``attention.head_count_kv``).
        None when the key is absent or holds strings."""
        kv = self.header.fields.get(key)
        return None if kv is None else pair_numbers(kv)

    def tensor(self, name: str) -> TensorEntry:
        for t in self.header.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def read_rows(self, t: TensorEntry, r0: int, r1: int) -> np.ndarray:
        """Raw bytes of rows [r0, r1) of ``t``, as a (r1 - r0, row bytes) uint8 array."""
        rb = row_bytes(t.type, t.cols)
        start = self.header.data_start + t.offset + r0 * rb
        return pread_exact(self.fd, (r1 - r0) * rb, start, self.path).reshape(r1 - r0, rb)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "GgufFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pread_exact(fd: int, n: int, offset: int, path: Path) -> np.ndarray:
    """``n`` bytes at ``offset``, or a one-line error when the file ends first."""
    out = np.empty(n, dtype=np.uint8)
    view, done = out.data, 0
    while done < n:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise InputError(f"{path}: truncated: {n:,} bytes expected at offset {offset:,}, the file ends first")
        done += got
    return out


def open_gguf(path: str | Path, role: str = "") -> GgufFile:
    """Open and check a GGUF file; ``role`` ("target", "drafter", ...) prefixes errors."""
    path = Path(path)
    where = f"{role} {path}" if role else str(path)
    check_input_file(path, where)
    fd = open_input(path, where)
    try:
        size = os.fstat(fd).st_size
        header = _parse(fd, size, where)
        _check_tensors(header, size, where)
        return GgufFile(path, header, size, fd)
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def opened(gguf: "str | Path | GgufFile", role: str = "") -> Iterator[GgufFile]:
    """``gguf`` open for the ``with`` block: a :class:`GgufFile` as it is (whoever opened it
    closes it), a path opened here and closed after. Lets a caller that has parsed a
    header pass it along instead of the path, so the header is read once."""
    if isinstance(gguf, GgufFile):
        yield gguf
        return
    with open_gguf(gguf, role) as g:
        yield g


def _parse(fd: int, size: int, where: str) -> Header:
    if size < MIN_FILE_BYTES:
        raise InputError(f"{where}: not a GGUF file ({size} bytes, shorter than a GGUF header)")
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise InputError(f"{where}: not a GGUF file (starts with {bytes(buf[:4])!r})")
        try:
            return parse_header(buf)
        except EOFError:
            raise InputError(
                f"{where}: truncated: the GGUF header runs past the end of the file ({size:,} bytes)"
            ) from None
        except (LayoutError, UnicodeDecodeError, OverflowError, ValueError) as err:
            raise InputError(f"{where}: not a usable GGUF header ({err})") from None


def _check_tensors(header: Header, size: int, where: str) -> None:
    """Every tensor's data aligned, inside the file, and overlapping no other."""
    spans = []
    for t in header.tensors:
        try:
            nbytes = t.nbytes
        except LayoutError as err:
            raise InputError(f"{where}: tensor {shown(t.name)}: {err}") from None
        if t.offset % header.alignment:
            raise InputError(
                f"{where}: tensor {shown(t.name)}: data offset {t.offset:,} is not a multiple of the alignment {header.alignment}"
            )
        end = header.data_start + t.offset + nbytes
        if end > size:
            raise InputError(
                f"{where}: truncated: tensor {shown(t.name)} ends at byte {end:,} but the file has {size:,}; download it again"
            )
        spans.append((t.offset, t.offset + nbytes, t.name))
    spans.sort()
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
        if start_b < end_a:
            raise InputError(f"{where}: tensors {shown(a)} and {shown(b)} overlap in the file")
