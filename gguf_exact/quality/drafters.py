"""``quality`` for drafters: each drafter's acceptance against one target, same prompts.

One llama-server per drafter (the ``cpu`` profile, ``--spec-type draft-mtp``), every
prompt completed greedily (temperature 0, no prompt cache); the completions' own
counters (``timings.draft_n``, ``draft_n_accepted``) summed per drafter. The reference
is the bf16 drafter (``convert --bf16`` of ``source`` with the target's vocabulary, built
once into the cache) or the first drafter given; every drafter's acceptance is also
given over the reference's, and its greedy tokens are compared with the reference's
(speculation must not change what the target says).
"""

from __future__ import annotations

from pathlib import Path

from gguf_exact.errors import ArgumentError, InputError, Param
from gguf_exact.progress import Progress, announce
from gguf_exact.quality.measure import reference_key, work_dir
from gguf_exact.quality.report import AcceptanceReport, AcceptanceRow

MAX_PROMPTS = 200


def read_prompts(path: str | Path) -> list[str]:
    """One prompt per non-empty line of ``path``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such prompts file")
    prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise InputError(f"{path}: no prompts (one per non-empty line)")
    if len(prompts) > MAX_PROMPTS:
        raise InputError(f"{path}: {len(prompts)} prompts; at most {MAX_PROMPTS}")
    return prompts


def drafter_reference(source: Path, target: Path, work: Path) -> Path:
    """The bf16 drafter of ``source`` with ``target``'s vocabulary (``convert --bf16``),
    cached in ``work``."""
    from gguf_exact.drafter.convert import convert_drafter

    path = work / f"{source.name}-bf16-drafter-{reference_key(target, source)}.gguf"
    if not path.is_file():
        convert_drafter(source, path, target, bf16_reference=True)
    return path


def _run_drafter(target: Path, drafter: Path, prompts: list[str], n_predict: int, root: Path):
    from gguf_exact.engines.launch import plan_launch, start_server
    from gguf_exact.engines.shared.http import server_generate
    from gguf_exact.engines.shared.process import free_port
    from gguf_exact.engines.shared.settings import ServeSettings
    from gguf_exact.engines.shared.status import stop_server

    # a fixed draft length: acceptance compared at one length, not at what the adaptive policy
    # picks on this machine (on tiny models it rightly stops drafting)
    fixed = ("spec-draft-adaptive=false",)
    launch = plan_launch(ServeSettings(target, drafter, "cpu", fixed, port=free_port(), runs=root))
    start_server(launch, detach=True, timeout=600)
    try:
        return [server_generate(launch.url, p, n_predict) for p in prompts]
    finally:
        stop_server(launch.port, root)


def measure_drafters(
    target: str | Path,
    prompts: str | Path,
    drafters: list[str | Path],
    source: str | Path | None = None,
    n_predict: int = 64,
    work: str | Path | None = None,
    progress: Progress | None = None,
) -> AcceptanceReport:
    """Each drafter's acceptance against ``target`` on the ``prompts`` file; with
    ``source``, the bf16 drafter made from it comes first and is the reference."""
    from gguf_exact.engines.shared.process import scratch_run_root

    target = Path(target)
    if not target.is_file():
        raise InputError(f"{target}: no such target GGUF")
    if n_predict < 1:
        raise ArgumentError(Param("n_predict"), f" {n_predict}: give 1 or more tokens")
    texts = read_prompts(prompts)
    paths = [Path(d) for d in drafters]
    for p in paths:
        if not p.is_file():
            raise InputError(f"{p}: no such drafter GGUF")
    if source is not None:
        paths.insert(0, drafter_reference(Path(source), target, work_dir(work)))
    if not paths:
        raise ArgumentError("no drafters to measure: name one or more drafter GGUF files, or give ", Param("source"))
    report = AcceptanceReport(target, len(texts), n_predict, str(paths[0]))
    announce(progress, len(paths))
    first_tokens, first_rate = None, None
    with scratch_run_root("quality") as root:
        for p in paths:
            if progress:
                progress(p.name)
            gens = _run_drafter(target, p, texts, n_predict, root)
            tokens = [g.tokens for g in gens]
            drafted, accepted = sum(g.drafts_generated for g in gens), sum(g.drafts_accepted for g in gens)
            rate = accepted / drafted if drafted else None
            if first_tokens is None:
                first_tokens, first_rate = tokens, rate
            ratio = rate / first_rate if rate is not None and first_rate else None
            n = sum(len(t) for t in tokens)
            report.rows.append(
                AcceptanceRow(str(p), p.stat().st_size, drafted, accepted, n, tokens == first_tokens, ratio)
            )
    return report
