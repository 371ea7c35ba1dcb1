"""The GGUF container's header, read and written by hand, for streaming.

gguf-py's ``GGUFWriter`` keeps every tensor in memory, and its ``GGUFReader`` turns
each token of a 262144-entry vocabulary into several numpy arrays (hundreds of MB
for a Gemma 4 file). Here the header is parsed from one bytes object: every
key/value pair keeps its raw bytes (so a re-pack copies metadata byte for byte),
scalars and strings are decoded, arrays are skipped over. Tensor data is not
touched: callers read and write it in row chunks at the offsets given here.

Layout (GGUF v2/v3, little-endian)::

    "GGUF" u32 version  u64 n_tensors  u64 n_kv
    n_kv x  (string key, u32 type, value)
    n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset)
    zero padding to ``general.alignment`` (default 32), then the tensor data,
    each tensor at ``offset`` (relative to the data start, aligned)
"""

import math
import mmap
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from gguf_exact.core import kernels
from gguf_exact.formats.bounded_json import shown

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
SUPPORTED_VERSIONS = (2, 3)
_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}  # fmt: skip
SCALAR_FORMATS = _SCALAR  # struct formats of the scalar value types, for readers of arrays
# Bounds on what a header may hold, refused before the values are read: llama.cpp's own
# (ggml/src/gguf.cpp), which it does not load a file past, and the format's limit on a key.
MAX_KEY_BYTES = 65_535  # the GGUF format: "at most 2^16-1 bytes"; a key is named in messages
MAX_STRING_BYTES = 1 << 30  # GGUF_MAX_STRING_LENGTH
MAX_ARRAY_ELEMENTS = 1 << 30  # GGUF_MAX_ARRAY_ELEMENTS


class LayoutError(ValueError):
    """The bytes are not a well-formed GGUF header; callers add the file name."""


@dataclass(frozen=True)
class Field:
    """A key/value pair to write: ``value`` of ``vtype`` (arrays: a list of ``sub_type``)."""

    key: str
    value: Any
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None

    def encode(self) -> bytes:
        """The pair as stored in the file."""
        if self.vtype == GGUFValueType.ARRAY:
            if self.sub_type is None:
                raise ValueError(f"{self.key}: an array field needs its element type (sub_type)")
            return encode_array_kv(self.key, self.sub_type, self.value)
        return encode_kv(self.key, self.vtype, self.value)


@dataclass(frozen=True)
class KeyValue:
    key: str
    vtype: GGUFValueType
    raw: bytes  # the whole pair as stored: key, type and value
    value: Any  # scalars and strings decoded; arrays: (element type, length)


@dataclass(frozen=True)
class TensorEntry:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    type: GGMLQuantizationType
    offset: int = 0  # relative to the data start

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major (numpy / Hugging Face) shape."""
        return tuple(reversed(self.ne))

    @property
    def n_values(self) -> int:
        return math.prod(self.ne)  # Python ints: a hostile shape must not wrap around

    @property
    def cols(self) -> int:
        return self.ne[0]

    @property
    def rows(self) -> int:
        return self.n_values // self.ne[0] if self.ne[0] else 0

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.type, self.ne)


@dataclass
class Header:
    version: int
    kv: list[KeyValue]
    tensors: list[TensorEntry]
    alignment: int
    data_start: int  # absolute file offset of the tensor data
    fields: dict[str, KeyValue] = field(default_factory=dict)

    def value(self, key: str, default: Any = None) -> Any:
        kv = self.fields.get(key)
        return default if kv is None else kv.value


def row_bytes(qtype: GGMLQuantizationType, cols: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise LayoutError(f"row length {cols} is not a multiple of {qtype.name}'s block of {block}")
    return cols // block * size


def tensor_nbytes(qtype: GGMLQuantizationType, ne: tuple[int, ...]) -> int:
    return math.prod(ne[1:]) * row_bytes(qtype, ne[0])


def align(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


class _Cursor:
    def __init__(self, buf: bytes | mmap.mmap, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise EOFError
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise EOFError
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise EOFError
        self.pos += n

    def string(self, limit: int = MAX_STRING_BYTES, what: str = "a string", whose: str = "llama.cpp's") -> bytes:
        """A length-prefixed string: past the end of ``buf`` first (EOFError: a truncated
        file says so), then longer than ``limit`` (``whose`` limit, in messages)."""
        n = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise EOFError
        if n > limit:
            raise LayoutError(f"{what} of {n:,} bytes, more than {whose} limit of {limit:,}")
        return self.take(n)

    def skip_strings(self, count: int) -> None:
        compiled = kernels.loaded()
        if compiled is not None:  # loaded anyway: the compiled walk (see core.string_walk)
            pos = int(compiled.skip_strings(np.frombuffer(self.buf, dtype=np.uint8), self.pos, count))
            if pos < 0:
                raise EOFError
            self.pos = pos
            return
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = struct.unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise EOFError
            pos += 8 + unpack("<Q", buf, pos)[0]
        if pos > end:
            raise EOFError
        self.pos = pos


def _value(cur: _Cursor, vtype: GGUFValueType) -> Any:
    """A scalar or string decoded; an array skipped over, as (element type, count).

    No recursion: an array of arrays is refused, as llama.cpp refuses it ("invalid GGUF
    type"), so however deep a hostile file nests them, one level is read."""
    if vtype in _SCALAR:
        return cur.unpack(_SCALAR[vtype])
    if vtype == GGUFValueType.STRING:
        return cur.string().decode("utf-8", errors="replace")
    if vtype == GGUFValueType.ARRAY:
        sub = GGUFValueType(cur.unpack("<I"))
        count = cur.unpack("<Q")
        if sub == GGUFValueType.ARRAY:
            raise LayoutError("an array of arrays, which llama.cpp does not load")
        if count > MAX_ARRAY_ELEMENTS:
            raise LayoutError(f"an array of {count:,} elements, more than llama.cpp's limit of {MAX_ARRAY_ELEMENTS:,}")
        if sub in _SCALAR:
            cur.skip(count * struct.calcsize(_SCALAR[sub]))
        else:
            cur.skip_strings(count)
        return (sub, count)
    raise LayoutError(f"unknown value type {vtype}")


def _pair(cur: _Cursor) -> tuple[str, GGUFValueType, Any]:
    """One key/value pair at the cursor: (key, type, value as :func:`_value` gives it);
    a fault in the value names the key."""
    key = cur.string(MAX_KEY_BYTES, "a key", "the GGUF format's").decode("utf-8", errors="replace")
    try:
        vtype = GGUFValueType(cur.unpack("<I"))
        return key, vtype, _value(cur, vtype)
    except (LayoutError, ValueError) as err:
        raise LayoutError(f"key {shown(key)}: {err}") from None


def parse_header(buf: bytes | mmap.mmap) -> Header:  # the file mapped, or its first bytes
    """Parse a GGUF header from ``buf`` (the file's first bytes, at least up to the
    end of the tensor infos). Raises :class:`LayoutError` or :class:`EOFError`
    (``buf`` too short: read more and retry)."""
    cur = _Cursor(buf)
    if cur.take(4) != MAGIC:
        raise LayoutError("no GGUF magic")
    version = cur.unpack("<I")
    if version not in SUPPORTED_VERSIONS:
        raise LayoutError(f"GGUF version {version} (big-endian or unsupported); expected 2 or 3")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    if n_tensors > 1 << 24 or n_kv > 1 << 24:
        raise LayoutError(f"implausible counts: {n_tensors} tensors, {n_kv} keys")
    kv = []
    for _ in range(n_kv):
        start = cur.pos
        key, vtype, value = _pair(cur)
        kv.append(KeyValue(key, vtype, buf[start : cur.pos], value))
    fields = {k.key: k for k in kv}
    alignment = fields["general.alignment"].value if "general.alignment" in fields else DEFAULT_ALIGNMENT
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise LayoutError(f"general.alignment {alignment} is not a power of two")
    tensors = []
    for _ in range(n_tensors):
        name = cur.string().decode("utf-8", errors="replace")
        n_dims = cur.unpack("<I")
        if not 1 <= n_dims <= 4:
            raise LayoutError(f"tensor {shown(name)}: {n_dims} dimensions")
        ne = tuple(cur.unpack("<Q") for _ in range(n_dims))
        try:
            qtype = GGMLQuantizationType(cur.unpack("<I"))
        except ValueError as err:
            raise LayoutError(f"tensor {shown(name)}: {err}") from None
        tensors.append(TensorEntry(name, ne, qtype, cur.unpack("<Q")))
    return Header(version, kv, tensors, alignment, align(cur.pos, alignment), fields)


def parse_pair(raw: bytes) -> KeyValue:
    """One key/value pair from its stored bytes (as :attr:`KeyValue.raw` holds them)."""
    cur = _Cursor(raw)
    key, vtype, value = _pair(cur)
    return KeyValue(key, vtype, raw[: cur.pos], value)


def pair_numbers(kv: KeyValue) -> list | None:
    """A numeric or bool value as a list: a scalar as one element, an array element by
    element. None for strings and arrays of strings."""
    if not isinstance(kv.value, tuple):
        return None if isinstance(kv.value, str) else [kv.value]
    sub, count = kv.value
    fmt = SCALAR_FORMATS.get(sub)
    if fmt is None:
        return None
    values = kv.raw[len(kv.raw) - count * struct.calcsize(fmt) :]  # the elements end the pair
    return list(struct.unpack(f"<{count}{fmt[1:]}", values))


def encode_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def encode_kv(key: str, vtype: GGUFValueType, value: Any) -> bytes:
    """One scalar or string pair (arrays are only ever copied raw)."""
    head = encode_string(key) + struct.pack("<I", int(vtype))
    if vtype == GGUFValueType.STRING:
        return head + encode_string(value)
    return head + struct.pack(_SCALAR[vtype], value)


def encode_header(version: int, kv_raw: list[bytes], tensors: list[TensorEntry], alignment: int) -> bytes:
    """Header bytes up to the data start, zero-padded to ``alignment``."""
    parts = [MAGIC, struct.pack("<IQQ", version, len(tensors), len(kv_raw)), *kv_raw]
    for t in tensors:
        parts.append(encode_string(t.name))
        parts.append(struct.pack(f"<I{len(t.ne)}QIQ", len(t.ne), *t.ne, int(t.type), t.offset))
    out = b"".join(parts)
    return out + b"\0" * (align(len(out), alignment) - len(out))


def layout_offsets(tensors: list[TensorEntry], alignment: int) -> list[TensorEntry]:
    """The same tensors with offsets packed in order, each aligned."""
    out, pos = [], 0
    for t in tensors:
        pos = align(pos, alignment)
        out.append(TensorEntry(t.name, t.ne, t.type, pos))
        pos += t.nbytes
    return out


def encode_array_kv(key: str, sub: GGUFValueType, values) -> bytes:
    """One array pair of scalars or strings."""
    head = encode_string(key) + struct.pack("<IIQ", int(GGUFValueType.ARRAY), int(sub), len(values))
    if sub == GGUFValueType.STRING:
        return head + b"".join(encode_string(v) for v in values)
    return head + np.asarray(values, dtype=np.dtype(_SCALAR[sub])).tobytes()
