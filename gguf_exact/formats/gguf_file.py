"""Writing GGUF files safely, and decoding their tensors back to float32.

The writer goes through gguf-py's GGUFWriter; the only thing added is the rule
that nothing half-written ever sits at the output path (temp file beside it,
verify, rename).
"""

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, quants

from gguf_exact.core import bf16, q4_0
from gguf_exact.errors import GgufExactError
from gguf_exact.gemma4.assistant import Field

# What the CLI calls each storage type, and its GGML type.
TYPES = {
    "q4_0": GGMLQuantizationType.Q4_0,
    "q8_0": GGMLQuantizationType.Q8_0,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "f32": GGMLQuantizationType.F32,
}


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; rename it into place only if the body
    succeeds, otherwise remove it."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise GgufExactError(f"{path}: output directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as err:
        raise GgufExactError(f"{path}: cannot write to {directory} ({err.strerror})") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_gguf(
    path: Path, arch: str, fields: list[Field], tensors: list[tuple[str, np.ndarray, GGMLQuantizationType]]
) -> None:
    """Write a GGUF: ``general.architecture``, ``fields`` in order, then ``tensors``
    (name, data, type) in order. Q4_0/Q8_0 data is raw bytes, one row per row."""
    writer = GGUFWriter(path, arch)
    for field in fields:
        writer.add_key_value(field.key, field.value, field.vtype, field.sub_type)
    for name, data, dtype in tensors:
        if dtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


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


def encode(values_bits: np.ndarray, dtype: GGMLQuantizationType) -> np.ndarray:
    """Store bf16 source bits as ``dtype`` (for the non-Q4_0 paths)."""
    if dtype == GGMLQuantizationType.BF16:
        return np.ascontiguousarray(values_bits).view(np.uint8)  # raw bytes, as GGUFWriter wants
    values = bf16.to_f32(values_bits)
    if dtype == GGMLQuantizationType.F32:
        return values
    if dtype == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return quants.quantize(values, dtype)


def decode(data: np.ndarray, dtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """A GGUF tensor's data (gguf-py's array, or raw bytes) as float32 in HF row-major ``shape``."""
    if dtype == GGMLQuantizationType.Q4_0:
        out = q4_0.dequantize(np.asarray(data).reshape(-1, q4_0.BLOCK_BYTES))
    elif dtype == GGMLQuantizationType.BF16:
        out = bf16.to_f32(np.asarray(data).view(np.uint16))
    elif dtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        data = np.asarray(data)
        if data.dtype == np.uint8:  # raw bytes (streamed reads) rather than gguf-py's typed view
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
