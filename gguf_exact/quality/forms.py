"""``quality`` as one call: the form the arguments ask for, main models or drafters."""

from __future__ import annotations

from gguf_exact.errors import ArgumentError, Param
from gguf_exact.progress import Progress
from gguf_exact.quality.report import AcceptanceReport, QualityReport
from gguf_exact.quality.request import QualityRequest


def run_quality(request: QualityRequest, progress: Progress | None = None) -> QualityReport | AcceptanceReport:
    """Drafters (``target`` and ``prompts``: :func:`.drafters.measure_drafters`) or main
    models (``source`` and ``text``: :func:`.measure.measure_quality`), as ``request`` asks."""
    r = request
    if r.target is not None or r.prompts is not None:
        if r.target is None or r.prompts is None:
            raise ArgumentError("drafters are measured with both ", Param("target"), " and ", Param("prompts"))
        from gguf_exact.quality.drafters import measure_drafters

        return measure_drafters(r.target, r.prompts, list(r.files), r.source, r.n_predict, r.work, progress)
    if r.text is None or r.source is None:
        raise ArgumentError(
            "give ", Param("source"), " and ", Param("text"), " (main models) or ", Param("target"), " and ",
            Param("prompts"), " (drafters)",
        )  # fmt: skip
    from gguf_exact.quality.measure import measure_quality

    return measure_quality(r, progress)
