"""What ``quality`` is asked to measure, in one object: :class:`QualityRequest`.

Built once (the CLI, a caller of the API) and passed to
:func:`gguf_exact.quality.forms.run_quality`, which hands it on to
:func:`gguf_exact.quality.measure.measure_quality` (main models) or takes the
drafters' fields out of it for :func:`gguf_exact.quality.drafters.measure_drafters`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class QualityRequest:
    """A quality run over ``files``. Main models: ``source`` and ``text``, with ``donor``
    (the reference is built from it into ``work``) or ``reference``; ``chunks`` windows of
    ``ctx`` tokens on ``threads``. Drafters: ``target`` and ``prompts`` (``n_predict``
    tokens each), with ``source`` for the bf16 drafter that comes first. ``vocab_from`` is
    refused for main models (a drafter does not run alone in llama-perplexity)."""

    files: tuple[str | Path, ...]
    source: str | Path | None = None
    donor: str | Path | None = None
    vocab_from: str | Path | None = None
    reference: str | Path | None = None
    text: str | Path | None = None
    chunks: int = 16
    ctx: int = 512
    threads: int | None = None
    target: str | Path | None = None
    prompts: str | Path | None = None
    n_predict: int = 64
    work: str | Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(self.files))


__all__ = ["QualityRequest"]
