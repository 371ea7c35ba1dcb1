"""Writing a Hugging Face safetensors folder tensor by tensor, rows at a time.

``safetensors.numpy.save_file`` needs every tensor in memory; benchmark checkpoints
the size of Gemma 4 E2B (9 GB of bf16) are written here in row chunks instead.
The file layout is the format's own: u64 header length, JSON header (padded with
spaces to 8 bytes), then the tensors back to back in header order.
"""

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from gguf_exact.formats.safe_write import atomic_output, output_folder, write_text

DTYPES = {"BF16": (np.uint16, 2), "F32": (np.float32, 4), "I64": (np.int64, 8)}
Fill = Callable[[int, int], np.ndarray]  # rows [r0, r1) -> array (r1 - r0, *shape[1:])


@dataclass(frozen=True)
class StreamTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # BF16 (given as uint16 bits), F32 or I64
    fill: Fill


def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
    if not shape:
        return 1, 1
    return shape[0], int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1


def write_safetensors(path: Path, tensors: list[StreamTensor], chunk_values: int = 1 << 20) -> None:
    header: dict[str, dict[str, object]] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        size = int(np.prod(t.shape, dtype=np.int64)) * DTYPES[t.dtype][1]
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with atomic_output(path, 8 + len(raw) + offset) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for t in tensors:
            rows, per_row = _rows(t.shape)
            step = max(1, chunk_values // max(per_row, 1))
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                data = np.ascontiguousarray(t.fill(r0, r1), dtype=DTYPES[t.dtype][0])
                if data.size != (r1 - r0) * per_row:
                    raise ValueError(f"{t.name}: fill gave {data.size} values for rows {r0}..{r1}")
                f.write(data.tobytes())


def write_folder(folder: str | Path, config: dict, tensors: list[StreamTensor], shards: int = 1) -> Path:
    """config.json plus one safetensors file, or ``shards`` files and an index."""
    folder = Path(folder)
    output_folder(folder)
    write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")
    if shards <= 1:
        write_safetensors(folder / "model.safetensors", tensors)
        return folder
    weight_map: dict[str, str] = {}
    for i in range(shards):
        part = tensors[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(folder / file, part)
        weight_map |= {t.name: file for t in part}
    index = {"metadata": {}, "weight_map": weight_map}
    write_text(folder / "model.safetensors.index.json", json.dumps(index, indent=2) + "\n")
    return folder
