"""``gguf-exact bench --engines python,llama-server``: the Python engine beside llama-server, over HTTP.

For each n-max, one server per engine is started on the same pair with the same
profile and overrides (:func:`gguf_exact.engines.launch.plan_launch`,
``start_server``); after one untimed warm-up request each, the shipped prompts go
to ``/v1/completions`` of each server, same prompt, ``max_tokens``, temperature
and seed, the engines in A B B A order per round
(:func:`gguf_exact.engines.shared.http.openai_generate`). Per engine and n-max:

- tokens/s as the client sees it (the whole request: prompt, HTTP and JSON
  included), and in the server's generation phase (its own
  ``tokens_predicted_seconds`` counter);
- tokens per target pass and acceptance, from the servers' ``/metrics``;
- for the Python engine, its time outside ``llama_decode`` per target pass;
- whether the texts equal llama-server's, prompt for prompt (:func:`same_text`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from gguf_exact.bench.report import Figures, Report, cell, machine, yes_no
from gguf_exact.bench.request import BenchRequest, fixed_length
from gguf_exact.engines.shared.generation import Generation
from gguf_exact.errors import ArgumentError, Param

ENGINES = ("python", "llama-server")


@dataclass
class EngineRun:
    engine: str
    n_max: int
    prompt: str
    round: int
    n_tokens: int
    target_passes: int
    drafts_generated: int
    drafts_accepted: int
    wall_seconds: float
    generation_seconds: float
    server_python_seconds: float | None
    text: str = field(repr=False, default="")


@dataclass
class EngineRow:
    engine: str
    n_max: int
    runs: int
    tokens: int
    tokens_per_second: float  # client wall: whole requests
    generation_tokens_per_second: float  # the server's generation phase
    tokens_per_target_pass: float
    acceptance_rate: float | None
    python_us_per_target_pass: float | None
    same_text_as_llama_server: bool | None


@dataclass
class EngineReport(Report):
    """``bench --engines``: one row (:class:`EngineRow`) per engine and n-max; no plot."""

    rows: list[EngineRow]
    STEM = "bench-engines"
    ROWS_KEY = "rows"

    def ratio(self, n_max: int, measure: str = "tokens_per_second") -> float | None:
        """Python engine / llama-server, at ``n_max``."""
        by = {r.engine: r for r in self.rows if r.n_max == n_max}
        if "python" not in by or "llama-server" not in by:
            return None
        base = getattr(by["llama-server"], measure)
        return getattr(by["python"], measure) / base if base else None

    def table(self) -> list[str]:
        head = (
            "| n-max | engine | tokens/s (request) | ratio | tokens/s (generation) | ratio | tokens/pass "
            "| acceptance | Python µs/pass | same text as llama-server |"
        )
        rows = [head, "|" + "---|" * 10]
        for r in self.rows:
            ratio = self.ratio(r.n_max) if r.engine == "python" else None
            gratio = self.ratio(r.n_max, "generation_tokens_per_second") if r.engine == "python" else None
            rows.append(
                f"| {r.n_max} | {r.engine} | {r.tokens_per_second:.1f} | {cell(ratio, '.2f')} | "
                f"{r.generation_tokens_per_second:.1f} | {cell(gratio, '.2f')} | {r.tokens_per_target_pass:.2f} | "
                f"{cell(r.acceptance_rate, '.3f')} | {cell(r.python_us_per_target_pass, '.0f')} | "
                f"{yes_no(r.same_text_as_llama_server)} |"
            )
        return rows

    def note(self) -> str:
        m = self.meta
        return (
            f"\nover HTTP (/v1/completions) · {m['n_predict']} tokens per prompt · temperature {m['temperature']}"
            f" · prompts {', '.join(m['prompts'])} · {m['rounds']} rounds (A B B A) · ratio: python / llama-server\n"
        )


def _run(g: Generation, engine: str, n_max: int, prompt: str, rnd: int) -> EngineRun:
    return EngineRun(
        engine=engine,
        n_max=n_max,
        prompt=prompt,
        round=rnd,
        n_tokens=g.n_tokens,
        target_passes=g.target_passes,
        drafts_generated=g.drafts_generated,
        drafts_accepted=g.drafts_accepted,
        wall_seconds=g.wall_seconds,
        generation_seconds=g.wall_seconds - g.prefill_seconds,
        server_python_seconds=g.server_python_seconds,
        text=g.text,
    )


def same_text(python: str, server: str | None) -> bool:
    """The Python engine's text is llama-server's, up to how each renders bytes that are not
    UTF-8: llama-server writes U+FFFD, llama-cpp-python drops them (and may run a few tokens
    past max_tokens to finish a character split over byte tokens)."""
    return server is not None and python.startswith(server.replace("\ufffd", ""))


def summarize(runs: list[EngineRun]) -> list[EngineRow]:
    rows = []
    keys = sorted({(r.n_max, r.engine) for r in runs}, key=lambda k: (k[0], ENGINES.index(k[1])))
    for n_max, engine in keys:
        rs = [r for r in runs if r.n_max == n_max and r.engine == engine]
        base = {(r.prompt, r.round): r.text for r in runs if r.n_max == n_max and r.engine == "llama-server"}
        fig = Figures.total(rs)
        py = [r.server_python_seconds for r in rs if r.server_python_seconds is not None]
        rows.append(
            EngineRow(
                engine=engine,
                n_max=n_max,
                runs=len(rs),
                tokens=fig.tokens,
                tokens_per_second=fig.tokens_per_second,
                # the server's generation phase starts after the first token: that one is not in it
                generation_tokens_per_second=(
                    (fig.tokens - len(rs)) / fig.generation_seconds if fig.generation_seconds > 0 else 0.0
                ),
                tokens_per_target_pass=fig.tokens_per_target_pass,
                acceptance_rate=fig.acceptance_rate,
                python_us_per_target_pass=(1e6 * sum(py) / fig.target_passes if py and fig.target_passes else None),
                same_text_as_llama_server=(
                    all(same_text(r.text, base.get((r.prompt, r.round))) for r in rs)
                    if engine != "llama-server" and base
                    else None
                ),
            )
        )
    return rows


def bench_engines(
    request: BenchRequest, prompts: dict[str, str], progress: Callable[[str], None] = lambda s: None
) -> EngineReport:
    """Start each engine's server (``request.engines``, default both) at each n-max of
    ``request.n_values`` on ``request.target`` and ``request.draft``, run the prompts
    over HTTP, stop them."""
    from gguf_exact.engines.launch import plan_launch, start_server
    from gguf_exact.engines.shared.http import openai_generate
    from gguf_exact.engines.shared.process import free_port, scratch_run_root
    from gguf_exact.engines.shared.settings import ServeSettings
    from gguf_exact.engines.shared.status import stop_server

    model, draft, n_max_list, profile, overrides = (
        request.target,
        request.draft,
        request.n_values,
        request.profile,
        request.overrides,
    )
    assert model is not None  # run_bench refuses --engines without a target
    n_predict, rounds, temperature, seed = request.n_predict, request.rounds, request.temperature, request.seed
    engines = request.engines or ENGINES
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise ArgumentError(Param("engines"), f" {','.join(engines)}: expected one or both of {', '.join(ENGINES)}")
    runs: list[EngineRun] = []
    first = next(iter(prompts.values()))
    with scratch_run_root("bench") as root:  # its servers' run folders: not the user's, removed after
        for n_max in n_max_list:
            launches = {}
            try:
                for engine in engines:
                    sets = list(overrides) + fixed_length(n_max)
                    settings = ServeSettings(
                        model,
                        draft if n_max > 0 else None,
                        profile,
                        tuple(sets),
                        engine,
                        port=free_port(),
                        runs=root,
                    )
                    launch = plan_launch(settings)
                    start_server(launch, detach=True, timeout=300)
                    launches[engine] = launch
                    openai_generate(launch.url, first, min(n_predict, 8), temperature, seed)  # warm-up
                for rnd in range(rounds):
                    for engine in list(engines) + list(reversed(engines)):  # A B B A
                        for name, text in prompts.items():
                            g = openai_generate(launches[engine].url, text, n_predict, temperature, seed)
                            runs.append(_run(g, engine, n_max, name, rnd))
                    progress(f"n-max {n_max}: round {rnd + 1}/{rounds}")
            finally:
                for launch in launches.values():
                    stop_server(launch.port, root)
    meta = {
        "model": str(model),
        "draft": str(draft),
        "engines": list(engines),
        "profile": profile,
        "overrides": list(overrides),
        "prompts": list(prompts),
        "n_predict": n_predict,
        "rounds": rounds,
        "temperature": temperature,
        "seed": seed,
        "order": "each round: engines forward, then backward (A B B A), every prompt per visit",
    } | machine()
    return EngineReport(meta, runs, summarize(runs))


__all__ = ["ENGINES", "EngineReport", "EngineRow", "EngineRun", "bench_engines", "same_text", "summarize"]
