"""Tensor data encoded to and decoded from GGUF types, and a file's sha256.

(:func:`atomic_output`, the safe writer every output goes through, lives in
:mod:`gguf_exact.formats.safe_write` and is named here too, where callers have long
imported it from.) :func:`encode` and :func:`decode` move
between a source's values and a GGUF type's bytes: each source keeps its own precision
(bf16 as its bits, float16, float32) until a type that cannot hold it is asked for.
"""

import hashlib
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType, quants

from gguf_exact.core import bf16, q4_0
from gguf_exact.formats.safe_write import atomic_output  # noqa: F401  (named here too: long imported from here)

# What the CLI calls each storage type, and its GGML type.
TYPES = {
    "q4_0": GGMLQuantizationType.Q4_0,
    "q8_0": GGMLQuantizationType.Q8_0,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "f32": GGMLQuantizationType.F32,
}


def file_type(types: list[GGMLQuantizationType]) -> int:
    """``general.file_type``: the type that holds most matrices (llama.cpp's MOSTLY_*)."""
    names = {
        GGMLQuantizationType.Q4_0: LlamaFileType.MOSTLY_Q4_0,
        GGMLQuantizationType.Q8_0: LlamaFileType.MOSTLY_Q8_0,
        GGMLQuantizationType.F16: LlamaFileType.MOSTLY_F16,
        GGMLQuantizationType.BF16: LlamaFileType.MOSTLY_BF16,
    }
    matrix_types = [t for t in types if t in names]
    if not matrix_types:
        return int(LlamaFileType.ALL_F32)
    most = max(set(matrix_types), key=lambda t: (matrix_types.count(t), -int(t)))
    return int(names[most])


def as_f32(values: np.ndarray) -> np.ndarray:
    """Source values (bf16 bits as uint16, float16 or float32) as float32, exactly."""
    return bf16.to_f32(values) if values.dtype == np.uint16 else np.asarray(values, dtype=np.float32)


def encode(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Source values (bf16 bits as uint16, float16 or float32) stored as ``qtype``: raw
    bytes for BF16 and the block types, a typed array for F32 and F16. F32 holds every
    source exactly; F16 and BF16 round only what they cannot hold."""
    if qtype == GGMLQuantizationType.BF16:
        bits = values if values.dtype == np.uint16 else bf16.from_f32(as_f32(values))
        return np.ascontiguousarray(bits).view(np.uint8)
    if qtype == GGMLQuantizationType.F16 and values.dtype == np.float16:
        return np.ascontiguousarray(values)
    wide = as_f32(values)
    if qtype == GGMLQuantizationType.F32:
        return wide
    if qtype == GGMLQuantizationType.F16:
        return wide.astype(np.float16)
    return quants.quantize(wide, qtype)


def decode(data: np.ndarray, dtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """A GGUF tensor's data (raw bytes, or a typed array) as float32 in row-major ``shape``."""
    if dtype == GGMLQuantizationType.Q4_0:
        out = q4_0.dequantize(np.asarray(data).reshape(-1, q4_0.BLOCK_BYTES))
    elif dtype == GGMLQuantizationType.BF16:
        out = bf16.to_f32(np.asarray(data).view(np.uint16))
    elif dtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        data = np.asarray(data)
        if data.dtype == np.uint8:  # raw bytes (streamed reads) rather than a typed view
            data = data.view(np.float32 if dtype == GGMLQuantizationType.F32 else np.float16)
        out = data.astype(np.float32)
    else:
        out = quants.dequantize(np.asarray(data), dtype)
    return out.reshape(shape)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
