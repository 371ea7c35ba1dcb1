"""Editing GGUF files for tests that attack ``verify``, and an oracle for its figures.

Files are read whole (tiny models only) into their key/value pairs as bytes and their
tensors as arrays, changed, and written again: with this project's writer
(:func:`rewrite`) or with gguf-py's ``GGUFWriter`` (:func:`rewrite_with_gguf_py`, the
control: an unchanged file written by another tool must still pass).

The oracle computes a Q4_0 block's figures without gguf_exact's core: gguf-py's reference
dequantizer and ml_dtypes' bfloat16 rounding, so a test's expected message does not
come from the code under test."""

import struct
from pathlib import Path

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

from gguf_exact.formats.gguf_layout import encode_kv
from gguf_exact.formats.gguf_reader import open_gguf
from gguf_exact.formats.gguf_stream import write_gguf

Q4_0, Q8_0, F32, F16, BF16 = (GGMLQuantizationType[n] for n in ("Q4_0", "Q8_0", "F32", "F16", "BF16"))
TYPED = {F32: np.float32, F16: np.float16}


def read_all(path) -> tuple[list[bytes], list[tuple[str, np.ndarray, GGMLQuantizationType]]]:
    """(key/value pairs as bytes, [(name, data as write_gguf takes it, type)])."""
    with open_gguf(path) as g:
        kv = [kv.raw for kv in g.header.kv]
        tensors = []
        for t in g.tensors:
            raw = g.read_rows(t, 0, t.rows)
            data = raw.view(TYPED[t.type]).reshape(t.shape) if t.type in TYPED else raw.reshape(*t.shape[:-1], -1)
            tensors.append((t.name, data.copy(), t.type))
    return kv, tensors


def key_of(raw: bytes) -> str:
    (n,) = struct.unpack_from("<Q", raw)
    return raw[8 : 8 + n].decode()


def rewrite(src, dst, change=None, drop=(), add=(), kv=None, retype=None, version=3) -> Path:
    """A copy of ``src`` at ``dst``: ``change(name, data)`` returns a tensor's new data,
    ``retype`` maps names to (new data, new type), ``drop`` names tensors to leave out,
    ``add`` appends (name, data, type), ``kv(pairs)`` returns the new pairs; GGUF ``version``."""
    pairs, tensors = read_all(src)
    out = []
    for name, data, qtype in tensors:
        if name in drop:
            continue
        if retype and name in retype:
            data, qtype = retype[name]
        elif change:
            data = change(name, data)
        out.append((name, data, qtype))
    write_gguf(Path(dst), kv(pairs) if kv else pairs, out + list(add), version=version)
    return Path(dst)


def set_key(pairs: list[bytes], key: str, vtype: GGUFValueType, value) -> list[bytes]:
    """The pairs with ``key``'s value (and type) replaced, in place."""
    return [encode_kv(key, vtype, value) if key_of(p) == key else p for p in pairs]


def rewrite_with_gguf_py(src, dst) -> Path:
    """``src`` read with gguf-py's GGUFReader and written again with its GGUFWriter:
    every key with its own type, every tensor with its own type and bytes."""
    reader = GGUFReader(src)
    writer = GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        value = f.contents()
        if sub == GGUFValueType.STRING:  # token texts as bytes: no round trip through str
            value = [bytes(f.parts[i]) for i in f.data]
        writer.add_key_value(name, value, f.types[0], sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst)


# --- the oracle --------------------------------------------------------------------------


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (nearest even), as bits."""
    return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def _ordered(bits: np.ndarray) -> np.ndarray:
    b = bits.astype(np.int64)
    return np.where(b & 0x8000, -(b & 0x7FFF), b & 0x7FFF)


def oracle_figures(blocks: np.ndarray, source_bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bit-exact values, worst distance in bf16 steps) of each Q4_0 block against its
    source, +0 and -0 equal: gguf-py's dequantizer, ml_dtypes' rounding."""
    decoded = bf16_bits(quants.dequantize(np.asarray(blocks, np.uint8).reshape(-1, 18), Q4_0).reshape(-1, 32))
    steps = np.abs(_ordered(decoded) - _ordered(np.asarray(source_bits).reshape(-1, 32)))
    return (steps == 0).sum(axis=1), steps.max(axis=1)


def oracle_levels(block: np.ndarray) -> list[int]:
    """The levels a Q4_0 block decodes to (all zero when its scale is zero)."""
    block = np.asarray(block, np.uint8).reshape(18)
    if np.frombuffer(block[:2].tobytes(), "<f2")[0] == 0:
        return [0] * 32
    qs = block[2:]
    return [int(x) - 8 for x in np.concatenate([qs & 0x0F, qs >> 4])]


def oracle_scale(block: np.ndarray) -> float:
    return float(np.frombuffer(np.asarray(block, np.uint8).reshape(18)[:2].tobytes(), "<f2")[0])


def proportional(a: list[int], b: list[int]) -> bool:
    """Level vectors equal up to one nonzero rational factor."""
    pivot = max(range(32), key=lambda i: abs(b[i]))
    return all(x * b[pivot] == y * a[pivot] for x, y in zip(a, b)) and any(a) == any(b)


def block_message(name: str, cols: int, index: int, stored, planned, source_bits, less: int, total: int) -> str:
    """The failure ``verify`` must print for the less exact block ``index`` of a tensor,
    every figure from the oracle."""
    (exact,), (worst,) = oracle_figures(stored, source_bits)
    (plan_exact,), (plan_worst,) = oracle_figures(planned, source_bits)
    per_row = cols // 32
    column = index % per_row * 32
    levels, plan_levels = oracle_levels(stored), oracle_levels(planned)
    if proportional(levels, plan_levels):
        how = f"same levels, scale {oracle_scale(stored)!r}, the plan's {oracle_scale(planned)!r}"
    else:
        how = f"levels {levels} are not the source grid's {plan_levels}"
    return (
        f"tensor {name}: Q4_0 block {index} (row {index // per_row}, columns {column}..{column + 31}) is less exact "
        f"than the plan: {exact} of 32 values bit-exact, the plan's {plan_exact}; worst {worst} bf16 ULP from the "
        f"source, the plan's {plan_worst}; {how}; {less:,} of {total:,} blocks of this tensor "
        f"{'is' if less == 1 else 'are'} less exact"
    )
