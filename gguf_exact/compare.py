"""``compare``: several GGUF files side by side against one source checkpoint.

Each file is measured, not judged: a drafter (``gemma4-assistant``) with
:func:`gguf_exact.drafter.verify.verify_gguf`, a main model (``gemma4``) with
:func:`gguf_exact.repack.check.verify_model`, both with ``judge=False``. So a Q8_0 or
bf16 drafter from llama.cpp's converter stands beside the exact Q4_0 one, and Google's
QAT GGUF of a main model beside its ``repack``.
"""

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.drafter.verify import verify_gguf
from gguf_exact.formats.gguf_reader import open_gguf


@dataclass
class FileSummary:
    path: str
    bytes: int
    type_mix: dict[str, int]  # GGML type -> tensor count
    type_bytes: dict[str, int]  # GGML type -> tensor bytes
    exact_fraction: float
    rel_error: float
    max_ulps: int


def summarize(path: str | Path, source: str | Path) -> FileSummary:
    from gguf_exact.gemma4.assistant import ARCH as ASSISTANT

    mix: Counter[str] = Counter()
    size: Counter[str] = Counter()
    with open_gguf(path) as gguf:  # read once: the measuring below gets the open file
        for t in gguf.tensors:
            mix[t.type.name] += 1
            size[t.type.name] += t.nbytes
        if gguf.architecture == ASSISTANT:
            total = verify_gguf(gguf, source, judge=False).total
        else:
            from gguf_exact.repack.check import verify_model

            total = verify_model(gguf, source, judge=False).total
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
    return [summarize(p, source) for p in paths]
