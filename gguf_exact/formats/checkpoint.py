"""A Hugging Face model folder: config.json plus one or more safetensors files.

Data is read through ``safetensors`` (numpy + ml_dtypes for bf16), row slices at a
time, so a tensor is never loaded whole unless asked. Headers are checked here first,
because the library's own errors ("incomplete metadata") name neither the file nor
the tensor.
"""

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, which safetensors needs)
import numpy as np
from safetensors import SafetensorError, safe_open

from gguf_exact.errors import GgufExactError

SUPPORTED_DTYPES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8}
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors dtype string: BF16, F16, F32 or I64
    shape: tuple[int, ...]
    file: Path


def _read_header(path: Path) -> dict:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise GgufExactError(f"{path}: not a safetensors file ({size} bytes, no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > MAX_HEADER_BYTES:
            raise GgufExactError(f"{path}: header length {n} runs past the end of the file ({size} bytes)")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GgufExactError(f"{path}: safetensors header is not valid JSON ({err})") from None
    data_bytes = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in SUPPORTED_DTYPES:
            raise GgufExactError(f"{path}: tensor {name} has dtype {dtype}; expected one of BF16, F16, F32, I64")
        if end > data_bytes:
            raise GgufExactError(
                f"{path}: truncated: tensor {name} ends at byte {end} of the data but the file holds {data_bytes}"
            )
        if end - begin != int(np.prod(shape, dtype=np.int64)) * SUPPORTED_DTYPES[dtype]:
            raise GgufExactError(f"{path}: tensor {name}: {end - begin} bytes do not match shape {shape} {dtype}")
    return header


class Checkpoint:
    """Tensors and config of one HF folder, read lazily."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        config_path = self.folder / "config.json"
        if not config_path.is_file():
            raise GgufExactError(f"{self.folder}: no config.json (expected a Hugging Face model folder)")
        try:
            self.config: dict = json.loads(config_path.read_text())
        except json.JSONDecodeError as err:
            raise GgufExactError(f"{config_path}: not valid JSON ({err})") from None
        self.tensors: dict[str, TensorInfo] = {}
        for file in self._files():
            for name, entry in _read_header(file).items():
                if name != "__metadata__":
                    self.tensors[name] = TensorInfo(name, entry["dtype"], tuple(entry["shape"]), file)
        self._handles: dict[Path, object] = {}

    def _files(self) -> list[Path]:
        index = self.folder / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise GgufExactError(f"{index}: no usable weight_map ({err})") from None
            files = [self.folder / f for f in sorted(set(weight_map.values()))]
            for f in files:
                if not f.is_file():
                    raise GgufExactError(f"{index}: lists shard {f.name}, which is missing from {self.folder}")
            return files
        single = self.folder / SINGLE_FILE
        if not single.is_file():
            raise GgufExactError(f"{self.folder}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
        return [single]

    def _handle(self, file: Path):
        if file not in self._handles:
            try:
                self._handles[file] = safe_open(str(file), framework="numpy")
            except SafetensorError as err:
                raise GgufExactError(f"{file}: cannot be read by safetensors ({err})") from None
        return self._handles[file]

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The tensor's data, or a slice of its rows. BF16 comes back as raw bits
        (uint16), the form :mod:`gguf_exact.core.bf16` works on."""
        info = self.tensors[name]
        tensor = self._handle(info.file).get_slice(name)
        data = tensor[rows] if rows is not None else tensor[:]
        if info.dtype == "BF16":
            return np.ascontiguousarray(data).view(np.uint16)
        return np.ascontiguousarray(data)

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
