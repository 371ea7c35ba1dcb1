"""In-process commands on llama-cpp-python with the MTP drafter: ``generate``, ``chat``, ``bench``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click

from gguf_exact.bench.request import BENCH_PROFILE
from gguf_exact.cli import console
from gguf_exact.cli.app import main
from gguf_exact.cli.console import note, say_fitted, say_markdown
from gguf_exact.cli.options import (
    PROFILE_HELP,
    draft_length_options,
    draft_length_words,
    drafter_from_options,
    n_max_list_option,
    n_predict_option,
    out_dir_option,
    profile_line,
    prompts_option,
    results_dir,
    sampling,
    sampling_options,
    target_and_draft_options,
)
from gguf_exact.engines.shared.engine_options import NO_PROFILE
from gguf_exact.errors import ArgumentError


def unescape(text: str) -> str:
    """``\\n``, ``\\t``, ``\\r`` and ``\\\\`` typed on a command line as the characters they
    name (a shell passes ``"\\n"`` as a backslash and an n); any other backslash is kept."""
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m.group(1)], text)


def generation_line(g) -> str:
    """One line of a generation's counters: tokens, target passes, acceptance, tokens/s."""
    acc = (
        ""
        if g.acceptance_rate is None
        else f"; drafts {g.drafts_accepted}/{g.drafts_generated} accepted ({g.acceptance_rate:.1%}), mean length {g.mean_accepted_length:.2f}"
    )
    return f"{g.n_tokens} tokens, {g.target_passes} target passes ({g.tokens_per_target_pass:.2f} tokens/pass){acc}; {g.tokens_per_second:.1f} tokens/s"


@main.command()
@target_and_draft_options(auto=False)
@click.option("--prompt", help="The prompt text (BOS is added).")
@click.option(
    "--prompt-file", type=click.Path(path_type=Path), help="Read the prompt from this file (one final newline dropped)."
)
@draft_length_options
@n_predict_option(128, "Most tokens to generate (fewer when an end-of-generation token comes).")
@sampling_options
@click.option(
    "--stop",
    "stops",
    multiple=True,
    help=r"Stop before this text (repeatable). \n, \t, \r and \\ are read as newline, tab, return and "
    r"backslash: --stop '\n\n' stops at the first blank line.",
)
@click.option("--chat", is_flag=True, help="Send the prompt as one user message through the GGUF's chat template.")
@click.option(
    "--n-ctx",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="Context size: prompt plus generated tokens.",
)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print token ids, text and counters as JSON.")
def generate(
    target: Path,
    drafter: str | None,
    no_draft: bool,
    fetch_draft: bool,
    models_dir: Path,
    prompt: str | None,
    prompt_file: Path | None,
    n_max: int | None,
    adaptive: bool | None,
    n_predict: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    repeat_penalty: float,
    seed: int | None,
    stops: tuple[str, ...],
    chat: bool,
    n_ctx: int,
    threads: int,
    as_json: bool,
) -> None:
    """Generate in-process, with the MTP drafter when --draft is given (--draft auto finds it as serve does).

    The drafter proposes up to --n-max tokens from the target's hidden state, the
    target checks them in one pass with the request's sampler, the agreeing prefix
    and the target's own next token are kept. Greedy (--temperature 0) the text is
    the target alone's but at rare near-ties; sampled, the tokens follow the
    target's distribution, but a --seed need not give the same text with and
    without the drafter. The draft length: as the shipped profiles, adaptive up to
    n-max 4. Prints the text, and counters on stderr (--json: everything on stdout).
    """
    from gguf_exact.engines.python.runner import Runner

    if (prompt is None) == (prompt_file is None):
        raise ArgumentError("give exactly one of --prompt TEXT and --prompt-file FILE")
    if prompt_file is not None:
        if not prompt_file.is_file():
            raise ArgumentError(f"--prompt-file {prompt_file}: no such file")
        prompt = prompt_file.read_text(encoding="utf-8").removesuffix("\n")
    assert prompt is not None  # one of the two, checked above
    sampler = sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    stops = tuple(unescape(s) for s in stops)
    found = drafter_from_options(target, drafter, no_draft, fetch_draft, models_dir, auto=False)
    if not found.given and found.path is not None:
        note(f"drafter {found.path} ({found.how})")
    n_max = (NO_PROFILE.n_max if n_max is None else n_max) if found.path else 0
    adaptive = NO_PROFILE.adaptive if adaptive is None else adaptive
    if found.path and not as_json:  # --json: in the JSON (n_max, adaptive)
        note(f"draft    {draft_length_words(n_max, adaptive)}")
    with console.status(f"loading {target.name}") as step:
        with Runner(target, found.path, n_ctx=n_ctx, n_threads=threads, checked=found.pair, shadow=NO_PROFILE.shadow) as r:
            if n_max and adaptive:
                step("timing the target's passes for the adaptive draft length")
                r.time_passes(n_max)
            step(f"generating up to {n_predict} tokens")
            g = r.complete(prompt, n_predict, n_max, sampler, stops, chat, adaptive)
    if as_json:
        draft = str(found.path) if found.path else None
        drafting = {"adaptive": bool(adaptive and n_max)}
        click.echo(json.dumps({"model": str(target), "draft": draft} | g.as_dict() | drafting, indent=2))
        return
    click.echo(g.text)
    note(generation_line(g))


@main.command()
@target_and_draft_options(auto=True)
@click.option(
    "--profile",
    help="Context, GPU layers, n-max as for serve: " + PROFILE_HELP + " Default: 4096 tokens on the CPU, the draft "
    "length adaptive up to n-max 4 (as every shipped profile).",
)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a profile value.")
@draft_length_options
@sampling_options
@n_predict_option(512, "Most tokens per reply.")
@click.option("--system", help="A system message to start the conversation with.")
def chat(
    target: Path,
    drafter: str | None,
    no_draft: bool,
    fetch_draft: bool,
    models_dir: Path,
    profile: str | None,
    overrides: tuple[str, ...],
    n_max: int | None,
    adaptive: bool | None,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    repeat_penalty: float,
    seed: int | None,
    n_predict: int,
    system: str | None,
) -> None:
    """Chat in the terminal, in-process, with the MTP drafter; text streams as it is accepted.

    Without --draft the drafter is found as for serve (--fetch-draft, --models-dir,
    --no-draft for the target alone).

    Each line you type is a user message; the reply uses the GGUF's chat template
    and the sampler options. /stats shows acceptance, tokens per target pass and
    tokens/s so far; /reset starts over; /exit (or Ctrl-D, or Ctrl-C at the prompt)
    ends and prints the same figures; Ctrl-C during a reply ends that reply. Any other line starting with / is not sent: it gets the list of
    commands (start a line with // to send it with one /).
    """
    from gguf_exact.engines.python.chat import chat_session, stats_line
    from gguf_exact.engines.python.load import load_with_drafter
    from gguf_exact.engines.shared.profile_choice import resolve_profile

    found = drafter_from_options(target, drafter, no_draft, fetch_draft, models_dir, auto=True)
    if not found.given and found.path is not None:
        note(f"drafter {found.path} ({found.how})")
    prof = None
    if profile:
        prof, choice = resolve_profile(profile)
        note(profile_line(prof, choice))
    with console.status(f"loading {target.name}"):
        llm = load_with_drafter(target, found.path, n_max, prof, overrides, adaptive, checked=found.pair)
    sampler = sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    with_draft = f" + {found.path.name}" if found.path else ""
    length = f"; draft {draft_length_words(llm.n_max, llm.draft_length.adaptive)}" if found.path else ""
    note(f"{target.name}{with_draft}: context {llm.n_ctx()} tokens{length}. /stats, /reset, /exit")

    def write(text: str) -> None:
        click.echo(text, nl=False)
        sys.stdout.flush()

    try:
        chat_session(
            llm,
            lines=iter(sys.stdin.readline, ""),
            write=write,
            note=note,
            sampling=sampler,
            max_tokens=n_predict,
            system=system,
        )
    finally:
        note(stats_line(llm.totals))
        llm.close()


@main.command()
@click.option("--model", "target", type=click.Path(path_type=Path), help="The gemma4 target GGUF (in-process runs).")
@click.option(
    "--draft",
    "drafter",
    metavar="FILE|auto",
    help="Its MTP drafter GGUF, or auto: found as serve finds it (in models/).",
)
@n_max_list_option("Comma-separated n-max values to compare with the target alone.", "1,2,3")
@click.option(
    "--server",
    "servers",
    multiple=True,
    metavar="[LABEL=]URL",
    help="Bench running llama-servers instead: target=URL for the target alone, N=URL for one started with --spec-draft-n-max N. Repeat per server.",
)
@prompts_option
@click.option("--n-predict", default=64, show_default=True, help="Tokens per prompt and run.")
@click.option(
    "--rounds", default=2, show_default=True, help="Rounds; each runs the arms forward then backward (A B B A)."
)
@out_dir_option("bench", "bench.json, bench.md and bench.png")
@click.option("--n-ctx", default=4096, show_default=True)
@click.option("--threads", default=2, show_default=True)
@click.option("--no-plot", is_flag=True, help="Skip the PNG.")
@click.option(
    "--engines",
    help="python,llama-server: start a server per engine at each n-max and compare them over HTTP (/v1/completions).",
)
@click.option(
    "--profile", default=BENCH_PROFILE, show_default=True, help="--engines: the serving profile for both servers."
)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="--engines: profile overrides.")
@click.option("--temperature", default=0.0, show_default=True, help="--engines: sampling temperature (0: greedy).")
@click.option("--seed", default=1, show_default=True, help="--engines: the sampler seed sent with every request.")
def bench(
    target: Path | None,
    drafter: str | None,
    n_values: list[int],
    servers: tuple[str, ...],
    prompt_names: list[str] | None,
    n_predict: int,
    rounds: int,
    out_dir: Path | None,
    n_ctx: int,
    threads: int,
    no_plot: bool,
    engines: str | None,
    profile: str,
    overrides: tuple[str, ...],
    temperature: float,
    seed: int,
) -> None:
    """The target alone against the drafter at each n-max, over the shipped prompts.

    In-process (--model, --draft), against running llama-servers (--server,
    reading each answer's timings), or --engines python,llama-server: both
    engines' servers started here at each n-max on the same pair, prompts and
    seed, over HTTP, A B B A (tokens/s and their ratio, tokens per target pass,
    acceptance, the Python engine's time per pass). Writes JSON and a Markdown
    table (and, in-process or --server, a PNG of tokens/s and tokens per target
    pass against n-max).
    """
    from gguf_exact.bench.request import BenchRequest
    from gguf_exact.bench.run import check_bench_outputs, run_bench

    engine_list = [e.strip() for e in engines.split(",") if e.strip()] if engines else []
    request = BenchRequest(
        target=target,
        draft=drafter,
        n_values=tuple(n_values),
        servers=servers,
        prompt_names=tuple(prompt_names) if prompt_names else None,
        n_predict=n_predict,
        rounds=rounds,
        n_ctx=n_ctx,
        threads=threads,
        engines=tuple(engine_list) if engines else (),
        profile=profile,
        overrides=overrides,
        temperature=temperature,
        seed=seed,
    )
    out_dir = out_dir or results_dir("bench")
    check_bench_outputs(out_dir, bool(engines), target, drafter)
    report = run_bench(request, console.progress_lines())
    paths = report.write(out_dir, plot=not no_plot)
    say_markdown(report.markdown())
    say_fitted("wrote " + ", ".join(str(p) for p in paths.values()))
