"""A donor GGUF: the file whose header, metadata and unmapped tensors a re-pack keeps.

Opened by hand (:mod:`gguf_exact.formats.gguf_layout`), read with ``os.pread`` in row chunks: neither
a memory map nor whole tensors, so resident memory stays at one chunk however large
the file. Every failure is one line naming the file.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from gguf_exact.errors import GgufExactError
from gguf_exact.formats.gguf_file import decode
from gguf_exact.formats.gguf_layout import (
    Header,
    LayoutError,
    TensorEntry,
    parse_header,
    row_bytes,
)

FIRST_READ = 1 << 20
SUPPORTED_ARCHS = ("gemma4", "gemma4-assistant")


@dataclass
class Donor:
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

    def tensor(self, name: str) -> TensorEntry:
        for t in self.header.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def read_rows(self, t: TensorEntry, r0: int, r1: int) -> np.ndarray:
        """Raw bytes of rows [r0, r1) of ``t``, as (r1 - r0, row bytes) uint8."""
        rb = row_bytes(t.type, t.cols)
        return pread_exact(self.fd, (r1 - r0) * rb, self.header.data_start + t.offset + r0 * rb, self.path).reshape(
            r1 - r0, rb
        )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Donor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pread_exact(fd: int, n: int, offset: int, path: Path) -> np.ndarray:
    out = np.empty(n, dtype=np.uint8)
    view, done = memoryview(out), 0
    while done < n:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise GgufExactError(f"{path}: truncated: {n} bytes expected at offset {offset}, the file ends first")
        done += got
    return out


def open_donor(path: str | Path) -> Donor:
    """Open and check a donor GGUF: magic, header, architecture, every tensor's
    data inside the file."""
    path = Path(path)
    if not path.is_file():
        raise GgufExactError(f"{path}: no such file (expected the donor GGUF)")
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        header = _read_header(fd, size, path)
        donor = Donor(path, header, size, fd)
        arch = donor.architecture
        if arch not in SUPPORTED_ARCHS:
            raise GgufExactError(
                f"{path}: general.architecture is {arch or 'missing'}; expected one of {', '.join(SUPPORTED_ARCHS)}"
            )
        for t in header.tensors:
            try:
                end = header.data_start + t.offset + t.nbytes
            except LayoutError as err:
                raise GgufExactError(f"{path}: tensor {t.name}: {err}") from None
            if end > size:
                raise GgufExactError(
                    f"{path}: truncated: tensor {t.name} ends at byte {end:,} but the file has {size:,}; download it again"
                )
        return donor
    except BaseException:
        os.close(fd)
        raise


def _read_header(fd: int, size: int, path: Path) -> Header:
    n = min(size, FIRST_READ)
    while True:
        buf = os.pread(fd, n, 0)
        try:
            return parse_header(buf)
        except EOFError:
            if n >= size:
                raise GgufExactError(
                    f"{path}: truncated: the GGUF header runs past the end of the file ({size:,} bytes)"
                ) from None
            n = min(size, n * 4)
        except (LayoutError, UnicodeDecodeError) as err:
            raise GgufExactError(f"{path}: not a GGUF file ({err})") from None


def decode_rows(raw: np.ndarray, qtype: GGMLQuantizationType, cols: int) -> np.ndarray:
    """Donor row bytes (rows, row bytes) -> float32 (rows, cols)."""
    return decode(raw, qtype, (raw.shape[0], cols))
