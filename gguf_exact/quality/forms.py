"""``quality`` as one call: the form the arguments ask for, main models or drafters."""

from __future__ import annotations

from pathlib import Path

from gguf_exact.errors import ArgumentError, Param
from gguf_exact.progress import Progress
from gguf_exact.quality.report import AcceptanceReport, QualityReport


def run_quality(
    files: list[str | Path],
    source: str | Path | None = None,
    donor: str | Path | None = None,
    vocab_from: str | Path | None = None,
    reference: str | Path | None = None,
    text: str | Path | None = None,
    chunks: int = 16,
    ctx: int = 512,
    threads: int | None = None,
    target: str | Path | None = None,
    prompts: str | Path | None = None,
    n_predict: int = 64,
    work: str | Path | None = None,
    progress: Progress | None = None,
) -> QualityReport | AcceptanceReport:
    """Drafters (``target`` and ``prompts``: :func:`.drafters.measure_drafters`) or main
    models (``source`` and ``text``: :func:`.measure.measure_quality`)."""
    if target is not None or prompts is not None:
        if target is None or prompts is None:
            raise ArgumentError("drafters are measured with both ", Param("target"), " and ", Param("prompts"))
        from gguf_exact.quality.drafters import measure_drafters

        return measure_drafters(target, prompts, files, source, n_predict, work, progress)
    if text is None or source is None:
        raise ArgumentError(
            "give ", Param("source"), " and ", Param("text"), " (main models) or ", Param("target"), " and ",
            Param("prompts"), " (drafters)",
        )  # fmt: skip
    from gguf_exact.quality.measure import measure_quality

    return measure_quality(source, files, text, donor, vocab_from, reference, chunks, ctx, threads, work, progress)
