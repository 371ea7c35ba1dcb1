"""Rows of a safetensors tensor, read with ``os.pread`` a chunk at a time.

:class:`gguf_exact.formats.checkpoint.Checkpoint` reads through safetensors' memory map,
whose touched pages stay resident; a re-pack reads 9 GB of source and must stay
under 1 GiB, so here each chunk of rows is read into a fresh buffer. Values come back
in the source's own type (bf16 as its bits, uint16; F16 and F32 as they are): no
source is rounded to another precision on the way in. A tensor of
any rank is seen as a matrix of (product of leading dims, last dim) rows; a
:class:`RowSource` may also pick, in every expert of a (E, R, C) bank, the rows
[first, first + count) of R (one half of a fused ``gate_up_proj``).
"""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gguf_exact.errors import InputError
from gguf_exact.formats.bounded_json import open_input
from gguf_exact.formats.checkpoint import Checkpoint, check_finite_values

ITEM_BYTES = {"BF16": 2, "F16": 2, "F32": 4}
NATIVE = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}  # bf16 as its bits


@dataclass(frozen=True)
class TensorLocation:
    name: str
    file: Path
    offset: int  # absolute byte offset of the tensor's data
    dtype: str
    shape: tuple[int, ...]


def locate(ckpt: Checkpoint) -> dict[str, TensorLocation]:
    """Absolute data offsets of every tensor of a checkpoint (as :class:`Checkpoint` read
    and checked its headers: nothing is read again)."""
    return {name: TensorLocation(name, i.file, i.offset, i.dtype, i.shape) for name, i in ckpt.tensors.items()}


@dataclass(frozen=True)
class RowSource:
    """A source tensor seen as a (rows, cols) matrix of bf16 bits.

    ``part`` = (first, count, of): in each block of ``of`` rows (one expert), only
    rows [first, first + count) belong to this matrix.
    """

    loc: TensorLocation
    part: tuple[int, int, int] | None = None

    @property
    def cols(self) -> int:
        return self.loc.shape[-1] if self.loc.shape else 1

    @property
    def rows(self) -> int:
        all_rows = int(np.prod(self.loc.shape[:-1], dtype=np.int64)) if len(self.loc.shape) > 1 else 1
        if self.part is None:
            return all_rows
        _, count, of = self.part
        return all_rows // of * count

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    def _segments(self, r0: int, r1: int) -> list[tuple[int, int]]:
        """(first source row, row count) runs for rows [r0, r1) of this matrix."""
        if self.part is None:
            return [(r0, r1 - r0)]
        first, count, of = self.part
        out, r = [], r0
        while r < r1:
            expert, i = divmod(r, count)
            n = min(r1 - r, count - i)
            out.append((expert * of + first + i, n))
            r += n
        return out

    def read(self, r0: int, r1: int, fd: int | None = None, check_finite: bool = True) -> np.ndarray:
        """Rows [r0, r1) as (r1 - r0, cols): bf16 bits (uint16), float16 or float32.
        A NaN or Inf is an error naming the tensor and where, unless ``check_finite`` is
        false (the exact packer checks in its own pass)."""
        size = ITEM_BYTES.get(self.loc.dtype)
        if size is None:
            raise InputError(f"{self.loc.file}: tensor {self.loc.name} has dtype {self.loc.dtype}, not a weight")
        row_bytes = self.cols * size
        out = np.empty((r1 - r0) * row_bytes, dtype=np.uint8)
        own = fd is None
        handle = open_input(self.loc.file) if fd is None else fd
        try:
            pos = 0
            for start, n in self._segments(r0, r1):
                want = n * row_bytes
                got = os.preadv(handle, [out.data[pos : pos + want]], self.loc.offset + start * row_bytes)
                if got != want:
                    raise InputError(f"{self.loc.file}: truncated while reading tensor {self.loc.name}")
                pos += want
        finally:
            if own:
                os.close(handle)
        values = out.reshape(r1 - r0, row_bytes).view(NATIVE[self.loc.dtype])
        if check_finite:
            check_finite_values(values, f"{self.loc.file}: tensor {self.loc.name}", r0)
        return values
