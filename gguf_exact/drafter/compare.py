"""``compare``: several GGUF drafters side by side against one source checkpoint."""

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.drafter.verify import verify_gguf
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.vocab import open_gguf


@dataclass
class FileSummary:
    path: str
    bytes: int
    type_mix: dict[str, int]  # GGML type -> tensor count
    type_bytes: dict[str, int]  # GGML type -> tensor bytes
    exact_fraction: float
    rel_error: float
    max_ulps: int


def summarize(path: str | Path, ckpt: Checkpoint) -> FileSummary:
    reader = open_gguf(path)
    mix, size = Counter(), Counter()
    for t in reader.tensors:
        mix[t.tensor_type.name] += 1
        size[t.tensor_type.name] += int(t.n_bytes)
    total = verify_gguf(path, ckpt).total
    return FileSummary(
        str(path),
        Path(path).stat().st_size,
        dict(mix),
        dict(size),
        total.exact_fraction,
        total.rel_error,
        total.max_ulps,
    )


def compare_files(source: str | Path, paths: list[str | Path]) -> list[FileSummary]:
    with Checkpoint(source) as ckpt:
        return [summarize(p, ckpt) for p in paths]
