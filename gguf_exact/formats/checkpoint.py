"""A Hugging Face model folder: config.json plus one or more safetensors files.

Data is read through ``safetensors`` (numpy + ml_dtypes for bf16), row slices at a
time, so a tensor is never loaded whole unless asked. Headers are checked here first,
because the library's own errors ("incomplete metadata") name neither the file nor
the tensor.
"""

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gguf_exact.errors import InputError
from gguf_exact.formats.bounded_json import open_input, parse_json, read_at, read_json_file, shown
from gguf_exact.formats.paths import check_input_folder

SUPPORTED_DTYPES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8}
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's MAX_HEADER_SIZE: it refuses 100,000,001


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors dtype string: BF16, F16, F32 or I64
    shape: tuple[int, ...]
    file: Path
    offset: int  # absolute byte offset of its data in the file


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _read_header(path: Path) -> tuple[dict, int]:
    """The header of one safetensors file and the offset where its data starts, checked against the format's rules before
    anything trusts it: every tensor of a known dtype, a shape of non-negative integers,
    data offsets inside the file that tile the data with no gap or overlap, and as many
    bytes as shape and dtype need. Reads 8 bytes, then at most the header's length (at most
    :data:`MAX_HEADER_BYTES`), parsed within bounds (:func:`parse_json`)."""
    fd = open_input(path)
    try:
        size = os.fstat(fd).st_size
        head = read_at(fd, 8, 0, path)
        if len(head) < 8:
            raise InputError(f"{path}: not a safetensors file ({size} bytes, no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise InputError(f"{path}: truncated: header length {n:,} runs past the end of the file ({size:,} bytes)")
        if n > MAX_HEADER_BYTES:
            raise InputError(
                f"{path}: header length {n:,} is over the safetensors library's limit of {MAX_HEADER_BYTES:,}"
            )
        raw = read_at(fd, n, 8, path)
    finally:
        os.close(fd)
    header = parse_json(raw, f"{path}: safetensors header")
    if not isinstance(header, dict):
        raise InputError(f"{path}: safetensors header is a JSON {type(header).__name__}, not an object")
    data_bytes = size - 8 - n
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {shown(name)}"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: entry is a JSON {type(entry).__name__}, not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in SUPPORTED_DTYPES:
            raise InputError(f"{where} has dtype {dtype}; expected one of BF16, F16, F32, I64")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise InputError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
            raise InputError(f"{where}: data_offsets {offsets!r} is not a pair of integers")
        begin, end = offsets
        if not 0 <= begin <= end:
            raise InputError(f"{where}: data_offsets {offsets} run backwards")
        if end > data_bytes:
            raise InputError(
                f"{path}: truncated: tensor {shown(name)} ends at byte {end:,} of the data but the file holds {data_bytes:,}"
            )
        if end - begin != math.prod(shape) * SUPPORTED_DTYPES[dtype]:
            raise InputError(f"{where}: {end - begin:,} bytes do not match shape {shape} {dtype}")
        if math.prod(shape) == 0:
            raise InputError(f"{where} has no values (shape {shape})")
        spans.append((begin, end, name))
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin < at:
            raise InputError(
                f"{path}: tensor {shown(name)} overlaps the tensor before it (data_offsets from {begin:,})"
            )
        if begin > at:
            raise InputError(f"{path}: bytes {at:,}..{begin:,} of the data belong to no tensor (before {shown(name)})")
        at = end
    if at != data_bytes:
        raise InputError(f"{path}: the last {data_bytes - at:,} bytes of the data belong to no tensor")
    return header, 8 + n


def non_finite(values: np.ndarray) -> np.ndarray:
    """Mask of NaN and Inf in bf16 bits, float16 or float32 values."""
    if values.dtype == np.uint16:
        return (values & 0x7F80) == 0x7F80
    return ~np.isfinite(values)


def check_finite_values(values: np.ndarray, where: str, row0: int = 0) -> None:
    """One line naming the first NaN or Inf of a (rows, cols) chunk, if there is one."""
    bad = non_finite(values)
    if bad.any():
        first = int(np.flatnonzero(bad.reshape(-1))[0])
        cols = values.shape[-1] if values.ndim else 1
        raise InputError(
            f"{where}: {int(bad.sum())} values are NaN or Inf (first at row {row0 + first // cols}, column {first % cols})"
        )


def read_config(path: Path) -> dict:
    """``config.json`` as a JSON object, or one line saying what is wrong with it (read
    within bounds: :func:`read_json_file`)."""
    if not path.is_file():
        raise InputError(f"{path.parent}: no config.json (expected a Hugging Face model folder)")
    config = read_json_file(path, "config.json")
    if not isinstance(config, dict):
        raise InputError(f"{path}: a JSON {type(config).__name__}, not an object")
    return config


class Checkpoint:
    """Tensors and config of one HF folder, read lazily."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        check_input_folder(self.folder)
        self.config: dict = read_config(self.folder / "config.json")
        self.tensors: dict[str, TensorInfo] = {}
        weight_map = self._weight_map()
        for file in self._files(weight_map):
            header, data_start = _read_header(file)
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                if weight_map is not None and weight_map.get(name) != file.name:
                    raise InputError(
                        f"{file}: holds tensor {shown(name)}, which {INDEX_FILE} "
                        + (f"places in {shown(weight_map[name])}" if name in weight_map else "does not list")
                    )
                offset = data_start + entry["data_offsets"][0]
                self.tensors[name] = TensorInfo(name, entry["dtype"], tuple(entry["shape"]), file, offset)
        if weight_map is not None:
            missing = sorted(set(weight_map) - set(self.tensors))
            if missing:
                raise InputError(
                    f"{self.folder / INDEX_FILE}: lists tensor {shown(missing[0])} in {shown(weight_map[missing[0]])}, which does not hold it"
                )
        self._handles: dict[Path, object] = {}

    def _weight_map(self) -> dict[str, str] | None:
        """The index's tensor -> shard map; None for a single-file checkpoint."""
        index = self.folder / INDEX_FILE
        if not index.is_file():
            return None
        content = read_json_file(index, INDEX_FILE)
        weight_map = content.get("weight_map") if isinstance(content, dict) else None
        if weight_map is None:
            raise InputError(f"{index}: no weight_map (a JSON object with one is expected)")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InputError(f"{index}: weight_map is not an object of tensor name -> shard file name")
        for shard in set(weight_map.values()):
            if Path(shard).name != shard or shard in ("", ".", ".."):
                raise InputError(f"{index}: shard name {shard!r} is not a file name in this folder")
        return weight_map

    def _files(self, weight_map: dict[str, str] | None) -> list[Path]:
        if weight_map is not None:
            files = [self.folder / f for f in sorted(set(weight_map.values()))]
            for f in files:
                if not f.is_file():
                    raise InputError(
                        f"{self.folder / INDEX_FILE}: lists shard {f.name}, which is missing from {self.folder}"
                    )
            return files
        single = self.folder / SINGLE_FILE
        if not single.is_file():
            raise InputError(f"{self.folder}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
        return [single]

    def _handle(self, file: Path, dtype: str):
        # Imported here: a conversion reads rows with pread (stream.source_rows) and needs
        # neither. ml_dtypes registers the bfloat16 dtype that safetensors' numpy reader uses,
        # and only a BF16 tensor needs it: `convert` reads one I64 tensor this way, and
        # ml_dtypes 0.7.0 took 1.35 s to import here (0.6.0: 0.01 s).
        if dtype == "BF16":
            import ml_dtypes  # noqa: F401
        from safetensors import SafetensorError, safe_open

        if file not in self._handles:
            try:
                self._handles[file] = safe_open(str(file), framework="numpy")
            except SafetensorError as err:
                raise InputError(f"{file}: cannot be read by safetensors ({err})") from None
        return self._handles[file]

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The tensor's data, or a slice of its rows, in its own precision: BF16 as raw
        bits (uint16, the form :mod:`gguf_exact.core.bf16` works on), F16 and F32 as they
        are. A NaN or Inf is an error naming the tensor and where."""
        info = self.tensors[name]
        tensor = self._handle(info.file, info.dtype).get_slice(name)
        data = np.ascontiguousarray(tensor[rows] if rows is not None else tensor[:])
        if info.dtype == "BF16":
            data = data.view(np.uint16)
        if info.dtype != "I64":
            rows_of = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
            check_finite_values(rows_of, f"{info.file}: tensor {name}", (rows.start or 0) if rows is not None else 0)
        return data

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
