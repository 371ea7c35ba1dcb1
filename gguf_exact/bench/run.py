"""``gguf-exact bench``: the target alone against the drafter at each n-max.

Arms are run over the shipped prompt set (:mod:`.prompt_set`) in alternating
order, each round forward then backward (``A B C C B A``, the ``A B B A`` of two
arms), so slow drift of the machine falls on every arm alike. Each arm is
warmed up once (untimed) before the first round. Runs are in-process
(:class:`.Runner`, one model load shared by every arm) or against running
llama-servers (:func:`gguf_exact.engines.shared.http.server_generate`, one server per arm, since
llama-server fixes n-max at start-up).

The report holds every run, a summary per arm (tokens/s over the generation
phase, tokens per target pass, acceptance, mean accepted length, speed-up over
the target alone, whether every output equals the target's) and writes JSON,
Markdown and, with matplotlib, a PNG (:mod:`.plot`): a :class:`~.report.Report`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from gguf_exact.bench.report import TARGET, Arm, Figures, Report, alternating_order, cell, machine, yes_no
from gguf_exact.bench.request import BenchRequest
from gguf_exact.engines.shared.generation import Generation
from gguf_exact.errors import ArgumentError, Param
from gguf_exact.formats.paths import Inputs


@dataclass
class BenchRun:
    arm: str
    n_max: int | None
    prompt: str
    round: int
    order: int
    n_tokens: int
    target_passes: int
    drafts_generated: int
    drafts_accepted: int
    draft_rounds: int
    generation_seconds: float
    wall_seconds: float
    tokens_per_second: float
    tokens_per_target_pass: float
    overhead_per_step_us: float | None
    tokens: list[int] = field(repr=False, default_factory=list)


@dataclass
class ArmSummary:
    label: str
    n_max: int | None
    runs: int
    tokens: int
    tokens_per_second: float  # all tokens over all generation seconds
    tokens_per_second_median: float  # median of the runs
    tokens_per_target_pass: float
    acceptance_rate: float | None
    mean_accepted_length: float | None
    speedup: float | None  # tokens/s over the target arm's
    overhead_per_step_us: float | None
    same_as_target: bool | None  # every output equals the target arm's for that prompt


@dataclass
class BenchReport(Report):
    """``bench`` and ``tune``: one row (:class:`ArmSummary`) per arm, a plot against n-max."""

    rows: list[ArmSummary]
    STEM = "bench"
    ROWS_KEY = "summary"

    def table(self) -> list[str]:
        head = "| arm | n-max | runs | tokens/s | median tokens/s | speed-up | tokens/pass | acceptance | mean len | Python µs/step | same as target |"
        rows = [head, "|" + "---|" * 11]
        for s in self.rows:
            rows.append(
                f"| {s.label} | {cell(s.n_max, 'd')} | {s.runs} | {s.tokens_per_second:.1f} | {s.tokens_per_second_median:.1f} | "
                f"{cell(s.speedup, '.2f')} | {s.tokens_per_target_pass:.2f} | {cell(s.acceptance_rate, '.3f')} | "
                f"{cell(s.mean_accepted_length, '.2f')} | {cell(s.overhead_per_step_us, '.0f')} | {yes_no(s.same_as_target)} |"
            )
        return rows

    def note(self) -> str:
        m = self.meta
        return f"\n{m.get('backend')} · {m.get('n_predict')} tokens per prompt · prompts {', '.join(m.get('prompts', []))} · {m.get('rounds')} rounds (forward, then backward)\n"

    def plot(self, path: Path) -> Path:
        from gguf_exact.bench.plot import plot_report

        return plot_report(self, path)


def _run(gen: Generation, arm: Arm, prompt: str, rnd: int, order: int, python: bool) -> BenchRun:
    return BenchRun(
        arm=arm.label,
        n_max=arm.n_max,
        prompt=prompt,
        round=rnd,
        order=order,
        n_tokens=gen.n_tokens,
        target_passes=gen.target_passes,
        drafts_generated=gen.drafts_generated,
        drafts_accepted=gen.drafts_accepted,
        draft_rounds=gen.draft_rounds,
        generation_seconds=gen.wall_seconds - gen.prefill_seconds,
        wall_seconds=gen.wall_seconds,
        tokens_per_second=gen.tokens_per_second,
        tokens_per_target_pass=gen.tokens_per_target_pass,
        overhead_per_step_us=gen.overhead_per_step_us if python else None,
        tokens=list(gen.tokens),
    )


def summarize(arms: list[Arm], runs: list[BenchRun]) -> list[ArmSummary]:
    target_tokens = {r.prompt: r.tokens for r in runs if r.arm == TARGET}
    out = []
    base = None
    for arm in arms:
        rs = [r for r in runs if r.arm == arm.label]
        fig = Figures.total(rs)
        rounds = sum(r.draft_rounds for r in rs)
        tps = fig.generation_tokens_per_second
        if arm.label == TARGET:
            base = tps
        overheads = [r.overhead_per_step_us for r in rs if r.overhead_per_step_us is not None]
        same = None
        if target_tokens and arm.label != TARGET:
            same = all(r.tokens == target_tokens.get(r.prompt) for r in rs)
        out.append(
            ArmSummary(
                label=arm.label,
                n_max=arm.n_max,
                runs=len(rs),
                tokens=fig.tokens,
                tokens_per_second=tps,
                tokens_per_second_median=statistics.median(r.tokens_per_second for r in rs) if rs else 0.0,
                tokens_per_target_pass=fig.tokens_per_target_pass,
                acceptance_rate=fig.acceptance_rate,
                mean_accepted_length=(1.0 + fig.drafts_accepted / rounds) if rounds else None,
                speedup=None,
                overhead_per_step_us=statistics.mean(overheads) if overheads else None,
                same_as_target=same,
            )
        )
    if base:
        for s in out:
            s.speedup = s.tokens_per_second / base
    return out


Progress = Callable[[str], None]


def bench_runner(
    model: str | Path,
    draft: str | Path | None,
    n_max_list: list[int],
    prompts: dict[str, str],
    n_predict: int = 64,
    rounds: int = 2,
    progress: Progress = lambda s: None,
    **runner_options,
) -> BenchReport:
    """In-process: the target alone, then the drafter at each n-max in ``n_max_list``."""
    from gguf_exact.engines.python.runner import Runner

    if draft is None and any(n > 0 for n in n_max_list):
        raise ArgumentError("bench: n-max > 0 needs a drafter", Param("draft", aside=" ({})"))
    arms = [Arm(TARGET, 0)] + [Arm(f"n_max={n}", n) for n in n_max_list if n > 0]
    runs: list[BenchRun] = []
    with Runner(model, draft, **runner_options) as r:
        for arm in arms:  # warm-up: first-call allocations stay out of the figures
            r.generate(next(iter(prompts.values())), min(n_predict, 8), arm.n_max or 0)
        for i, (rnd, arm) in enumerate(alternating_order(arms, rounds)):
            for name, text in prompts.items():
                gen = r.generate(text, n_predict, arm.n_max or 0)
                runs.append(_run(gen, arm, name, rnd, i, python=True))
            progress(f"round {rnd + 1}/{rounds}: {arm.label}")
    meta = _meta("in-process (llama-cpp-python)", prompts, n_predict, rounds)
    meta |= {
        "model": str(model),
        "draft": str(draft) if draft else None,
        "runner_options": {k: v for k, v in runner_options.items()},
    }
    return BenchReport(meta, runs, summarize(arms, runs))


def parse_server_arm(spec: str) -> Arm:
    """``LABEL=URL`` with LABEL ``target`` or an n-max; a bare URL is an arm named ``server``."""
    label, sep, url = spec.partition("=")
    if not sep or label.startswith("http"):
        return Arm("server", None, spec)
    label = label.strip()
    if label in (TARGET, "0"):
        return Arm(TARGET, 0, url)
    if label.isdigit():
        return Arm(f"n_max={int(label)}", int(label), url)
    raise ArgumentError(
        Param("servers"), f" {spec}: expected URL, target=URL or N=URL (N the server's --spec-draft-n-max)"
    )


def bench_servers(
    servers: list[Arm],
    prompts: dict[str, str],
    n_predict: int = 64,
    rounds: int = 2,
    progress: Progress = lambda s: None,
) -> BenchReport:
    """Against running llama-servers, one per arm."""
    from gguf_exact.engines.shared.http import server_generate

    if len({a.label for a in servers}) != len(servers):
        raise ArgumentError("bench: two ", Param("servers"), " arms have the same label")
    urls = {a.label: a.url or "" for a in servers}  # parse_server_arm gives each arm its URL
    for arm in servers:  # warm-up
        server_generate(urls[arm.label], next(iter(prompts.values())), min(n_predict, 8))
    runs: list[BenchRun] = []
    for i, (rnd, arm) in enumerate(alternating_order(servers, rounds)):
        for name, text in prompts.items():
            gen = server_generate(urls[arm.label], text, n_predict)
            runs.append(_run(gen, arm, name, rnd, i, python=False))
        progress(f"round {rnd + 1}/{rounds}: {arm.label}")
    meta = _meta("llama-server", prompts, n_predict, rounds) | {"servers": {a.label: a.url for a in servers}}
    summary = summarize(servers, runs)
    for s in summary:  # llama-server does not report draft rounds
        s.mean_accepted_length = None
    return BenchReport(meta, runs, summary)


def check_bench_outputs(out_dir: str | Path, engines: bool, target: Path | None, drafter: str | None) -> None:
    """Before measuring: the report :func:`run_bench` gives (``engines``: ``bench --engines``'s)
    would overwrite neither model (nor another recorded input) in ``out_dir``."""
    from gguf_exact.bench.engines import EngineReport

    inputs: Inputs = {Param("target"): target, Param("draft"): drafter if drafter and Path(drafter).exists() else None}
    (EngineReport if engines else BenchReport).check_outputs(out_dir, inputs)


def run_bench(request: BenchRequest, progress: Progress = lambda s: None):
    """``bench`` as one call: in-process (:func:`bench_runner`), against running
    llama-servers (:func:`bench_servers`) or both engines' servers started here
    (:func:`gguf_exact.bench.engines.bench_engines`), as :class:`~.request.BenchRequest`
    says. Returns the report, which writes its own files."""
    from gguf_exact.bench.prompt_set import load_prompts

    r = request
    target, draft, servers, n_values = r.target, r.draft, r.servers, r.n_values
    prompts = load_prompts(list(r.prompt_names) if r.prompt_names is not None else None)
    if draft is not None and target is not None:
        from gguf_exact.engines.drafter_lookup import resolve_drafter

        draft = resolve_drafter(target, draft, False, "models", False, default_auto=False).path
    if r.engines:
        from gguf_exact.bench.engines import bench_engines

        if target is None or draft is None or servers:
            raise ArgumentError(
                "bench ", Param("engines"), ": give ", Param("target"), " and ", Param("draft"),
                " (the servers are started here), no ", Param("servers"),
            )  # fmt: skip
        sets = (f"ctx-size={r.n_ctx}", f"threads={r.threads}", f"threads-batch={r.threads}", *r.overrides)
        return bench_engines(replace(r, draft=draft, overrides=sets), prompts, progress)
    if servers:
        if target or draft:
            raise ArgumentError(
                "bench: give either ", Param("servers"), " URLs or ", Param("target"), "/", Param("draft"), ", not both"
            )
        return bench_servers([parse_server_arm(s) for s in servers], prompts, r.n_predict, r.rounds, progress)
    if target is None:
        raise ArgumentError(
            "bench: give ", Param("target"), " (and ", Param("draft"), "), or ", Param("servers"), " URLs"
        )
    return bench_runner(
        target, draft, list(n_values), prompts, r.n_predict, r.rounds, progress, n_ctx=r.n_ctx, n_threads=r.threads
    )


def _meta(backend: str, prompts: dict[str, str], n_predict: int, rounds: int) -> dict:
    return {
        "backend": backend,
        "prompts": list(prompts),
        "n_predict": n_predict,
        "rounds": rounds,
        "order": "each round: arms forward, then backward (A B B A)",
    } | machine()


__all__ = [
    "ArmSummary",
    "BenchReport",
    "BenchRun",
    "bench_runner",
    "bench_servers",
    "parse_server_arm",
    "run_bench",
    "summarize",
]
