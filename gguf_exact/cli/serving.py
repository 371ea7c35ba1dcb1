"""Serving commands: ``serve``, ``status``, ``stop`` and ``tune`` (llama-server or the Python engine, over HTTP)."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path

import click

from gguf_exact.cli import console
from gguf_exact.cli.app import main, message
from gguf_exact.cli.console import note, say, say_fitted, say_markdown, warn
from gguf_exact.cli.options import (
    CommaList,
    draft_length_words,
    drafter_from_options,
    n_max_list_option,
    out_dir_option,
    overrides_option,
    profile_line,
    profile_option,
    prompts_option,
    results_dir,
    server_bin_option,
    target_and_draft_options,
)
from gguf_exact.cli.rpc import rpc_plan_lines, show_worker
from gguf_exact.constants import API_KEY_ENV
from gguf_exact.engines.settings import (
    DEFAULT_ENGINE,
    DEFAULT_HOST,
    DEFAULT_PORT,
    ENGINES,
    LOG_FILE,
    RPC_ENGINE,
    ServeSettings,
)
from gguf_exact.errors import MeasurementError


@main.command()
@target_and_draft_options(auto=True)
@profile_option()
@overrides_option
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="The address to listen on. Anything but this machine's own (127.0.0.1, ::1, localhost), "
    "such as 0.0.0.0 for a laptop on the same network, needs --api-key (or --insecure).",
)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int)
@click.option(
    "--api-key",
    envvar=API_KEY_ENV,
    metavar="KEY",
    help="Clients must send this key (OpenAI clients: api_key=KEY; curl: -H 'Authorization: Bearer KEY'); "
    "without it every request but /health gets HTTP 401. Both engines. Prefer the environment variable "
    "$GGUF_EXACT_API_KEY: the key is passed to the server in its environment and never written to "
    "the run folder or its logs.",
)
@click.option(
    "--insecure", is_flag=True, help="Serve a --host other machines can reach without an API key: anyone may use it."
)
@server_bin_option
@click.option(
    "--rpc",
    metavar="HOST:PORT[,HOST:PORT...]",
    help="Split the model over these RPC workers' devices and this machine's (`gguf-exact rpc-server` on each "
    "worker; the profile's rpc key otherwise). llama-server only.",
)
@click.option("--detach", is_flag=True, help="Run in the background (pid file and log in the run directory).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check the files, print the memory plan and the command (even before the build exists); start nothing, "
    "download nothing (with --fetch-draft it says where the drafter would go).",
)
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for /health.")
@click.option(
    "--no-probe", is_flag=True, help="Skip the short request that confirms draft-mtp is drafting after launch."
)
@click.option(
    "--engine",
    type=click.Choice(list(ENGINES)),
    default=DEFAULT_ENGINE,
    show_default=True,
    help="llama-server (llama.cpp's draft-mtp), or python: llama-cpp-python's OpenAI-compatible server with the MTP drafter (same profile, same /metrics names).",
)
@click.option(
    "--logprobs", is_flag=True, help="--engine python: keep every row's logits so requests may ask for logprobs."
)
@click.option(
    "--vulkan-devices",
    metavar="LIST",
    help="The Vulkan devices the server may use, by index as `vulkaninfo --summary` numbers them (GPU0 is 0), "
    "given to it as GGML_VK_VISIBLE_DEVICES: what makes a CPU-type device such as Mesa's lavapipe usable "
    "(llama.cpp hides those). A GPU profile whose server sees no device of its backend is refused.",
)
@click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[-- LLAMA_SERVER_ARGS...]")
def serve(
    target: Path,
    drafter: str | None,
    no_draft: bool,
    fetch_draft: bool,
    models_dir: Path,
    profile: str,
    overrides: tuple[str, ...],
    host: str,
    port: int,
    api_key: str | None,
    insecure: bool,
    server_bin: Path | None,
    rpc: str | None,
    detach: bool,
    dry_run: bool,
    timeout: float,
    no_probe: bool,
    engine: str,
    logprobs: bool,
    vulkan_devices: str | None,
    extra: tuple[str, ...],
) -> None:
    """Serve a Gemma 4 target with its MTP drafter (draft-mtp) over HTTP.

    \b
    Without --draft the drafter is found: the target's size is read from its
    header, then the recipes' exact drafter is looked for in --models-dir (as
    `gguf-exact fetch` places it) and any fitting gemma4-assistant GGUF there or
    beside the target; --fetch-draft fetches it, pinned and hash-checked. None
    found: one line says how to get one (or --no-draft serves the target alone).
    --profile auto (the default) reads nvidia-smi's GPU name and memory.

    Checks the pair (gemma4 target, gemma4-assistant drafter of the target's width,
    same vocabulary, sha256 against checksums/ for listed files), prints the weight
    bytes, the memory plan (weights, KV cache at the profile's context, drafter,
    compute buffers; a warning when it exceeds the card) and the exact server
    command, starts it on 127.0.0.1 (llama-server with --metrics; another --host
    needs --api-key or --insecure), waits for /health, sends one short probe request and says whether draft-mtp is drafting
    (or that llama.cpp left speculation off), then stays in the foreground (Ctrl-C
    stops it) unless --detach. --engine python serves /v1/chat/completions,
    /v1/completions, /v1/models, /health and /metrics from llama-cpp-python
    instead, with the same profile.
    """
    from gguf_exact.engines.launch import serve_foreground
    from gguf_exact.engines.serve import plan_serve, start_planned, workers_gone
    from gguf_exact.errors import ServerError

    settings = ServeSettings(
        target=target,
        drafter=drafter,
        profile=profile,
        overrides=overrides,
        engine=engine,
        host=host,
        port=port,
        api_key=api_key,
        insecure=insecure,
        logprobs=logprobs,
        server_bin=server_bin,
        extra_args=extra,
        vulkan_devices=vulkan_devices,
        rpc=(rpc,) if rpc else (),
        no_draft=no_draft,
        fetch_draft=fetch_draft,
        models_dir=models_dir,
    )
    plan = plan_serve(settings, dry_run=dry_run)
    launch, pair = plan.launch, plan.launch.pair
    for role, m in (("target", pair.target), ("drafter", pair.drafter)):
        if m is not None:
            listed = ", sha256 matches checksums/" if m.sha256 else ""
            say(
                f"{role:<8} {m.path}  {m.architecture}, {m.weight_bytes:,} bytes of weights in {m.n_tensors} tensors{listed}"
            )
    if not plan.drafter.given:
        say(f"{'':<8} drafter: {message(plan.drafter.how)}")
    if pair.drafter is not None:
        say(f"{'total':<8} {pair.target.weight_bytes + pair.drafter.weight_bytes:,} bytes of weights")
    say(profile_line(plan.profile, plan.choice))
    if pair.drafter is not None:  # llama-server's defaults where the profile says nothing: fixed, n-max 3
        draft = plan.profile.draft
        n_max, adaptive = int(draft.get("spec-draft-n-max", 3)), draft.get("spec-draft-adaptive") is True
        say(f"draft    {draft_length_words(n_max, adaptive)}")
    if plan.device is not None:
        soft = (
            " (a software device: its first requests compile the GPU pipelines, tens of seconds)"
            if plan.software_device
            else ""
        )
        say(f"device   {plan.device.line()}{soft}")
    engine_note = "python engine: one sequence, the whole SWA cache; " if engine == "python" else ""
    if plan.devices is None:
        say(
            f"memory plan ({'GPU' if plan.memory.gpu else 'CPU'}, {engine_note}estimated from the GGUF headers as llama.cpp sizes them):"
        )
    for line in plan.memory.lines() if plan.devices is None else rpc_plan_lines(plan):
        say(line)
    for line in plan.devices.warnings() if plan.devices else ():
        warn(message(line))
    if plan.memory_warning:
        warn(message(plan.memory_warning))
    say(launch.command_line)
    if launch.note:
        say(f"note: {launch.note}")
    if plan.waits_for_fetch:
        say(
            "note: the plan and command above are the target's alone until the drafter is there; run without --dry-run to fetch it"
        )
    if launch.api_key:
        say("api key  required from clients (given to the server in its environment, not shown above)")
    elif plan.open_to_anyone:
        warn(f"--insecure: anyone who can reach {host} may use this server")
    if dry_run:
        return
    # A detached server's console goes to its log: say what the wait is for (a full-size model
    # loads for tens of seconds). In the foreground its own log lines share this terminal.
    with console.status(f"starting {launch.label}") if detach else nullcontext(lambda _step: None) as step:
        started = start_planned(plan, detach, timeout, probe=not no_probe, on_step=step)
    say(
        f"{launch.label} ready at {launch.url} in {started.seconds:.1f} s (pid {started.process.pid}); log {launch.run_dir / LOG_FILE}"
    )
    if started.probe_error is not None:
        warn(f"draft-mtp not checked: {message(started.probe_error)}")
    verdict = started.speculation
    if verdict is not None:
        if verdict.state == "off":
            warn(f"draft-mtp {verdict.line}")
        else:
            say(f"draft-mtp {verdict.line}")
    if detach:
        key = f" (with {API_KEY_ENV} set)" if launch.api_key else ""
        say(f"detached; `gguf-exact status --port {port}`{key} reports on it, `gguf-exact stop --port {port}` ends it")
        return
    code = serve_foreground(launch, started.process)
    if gone := workers_gone(plan, code):
        raise ServerError(gone)
    sys.exit(code)


def show_status_line(line: str) -> None:
    """A ``status`` line (``label        value``), wrapped to the console and continued
    under the value's column, as ``doctor`` does."""
    say_fitted(line, " " * len("server       "))


@main.command()
@click.option("--port", type=int, help="The server's port (default: the last one started).")
@click.option("--last", default=5, show_default=True, help="How many per-request acceptance lines to show.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--probe", is_flag=True, help="Send one short request first, to see whether it drafts.")
@click.option(
    "--api-key",
    envvar=API_KEY_ENV,
    metavar="KEY",
    help="The key of a server started with --api-key (default: $GGUF_EXACT_API_KEY); without it only health is read.",
)
def status(port: int | None, last: int, as_json: bool, probe: bool, api_key: str | None) -> None:
    """Health, models, speculation and draft acceptance of a served model.

    Draft counters come from /metrics (drafts, draft tokens, accepted tokens, the
    accepted share); the last requests' `draft acceptance` lines from the server
    log. The draft-mtp line says whether the server is really drafting: active
    (draft tokens since start, or in the --probe request), OFF (a drafter was
    given but llama-server is not speculating, and why: no --spec-type draft-mtp,
    or what llama.cpp logged), or not yet confirmed. Exits 1 when the server is
    down.
    """
    from gguf_exact.engines.status import server_status

    st = server_status(port, last=last, probe_request=probe, api_key=api_key)
    if as_json:
        click.echo(json.dumps(st.as_dict(), indent=2, default=str))
    elif st.state.get("engine") == RPC_ENGINE:
        show_worker(st, show_status_line)
    else:
        show = show_status_line
        s = st.state
        state = "up" if st.up else (f"down: {st.down_reason}" if not st.running else st.health)
        show(f"server       {s['url']}  pid {st.pid or s['pid']}  {state}")
        show(f"engine       {s.get('engine', 'llama-server')}")
        show(f"health       {st.health}")
        show(f"target       {s['target']}")
        show(f"drafter      {s.get('drafter') or '-'}")
        if st.needs_key:
            show(f"api key      the server wants its API key: set {API_KEY_ENV} or pass --api-key")
        elif st.running:
            show(f"models       {', '.join(st.models) or '-'}")
            spec = "-" if st.speculative is None else ("on" if st.speculative else "off")
            show(f"speculation  {spec}")
            if st.speculation is not None:
                show(f"draft-mtp    {st.speculation.line}")
            c = st.counters
            if c is not None:
                rate = "-" if c.rate is None else f"{c.rate:.2%}"
                show(
                    f"drafts       {c.drafts:,} drafts, {c.draft_tokens:,} draft tokens, {c.accepted_tokens:,} accepted ({rate})"
                )
                if c.position_rates:
                    per = ", ".join(f"{i + 1}: {r:.0%}" for i, r in enumerate(c.position_rates))
                    show(f"by position  {per} of drafts had that draft token accepted")
            else:
                show("drafts       - (no draft counters in /metrics)")
            if (p := st.policy) is not None:
                depth = ", ".join(f"{j}: {a:.0%}" for j, a in enumerate(p.acceptance, 1))
                costs = ", ".join(f"{r} rows {1000 * s:.1f} ms" for r, s in p.pass_seconds) or "-"
                step = "-" if p.step_seconds is None else f"{1000 * p.step_seconds:.1f} ms"
                show(f"adaptive     draft length {p.draft_n} now; acceptance by depth {depth}")
                if p.reason:
                    show(f"why          {p.reason}")
                show(f"pass cost    {costs}; drafter step {step}")
        if st.running:
            for a in st.recent:
                show(
                    f"request      acceptance {a.rate:.5f}: {a.accepted} accepted / {a.generated} drafted, mean len {a.mean_len:.2f}"
                )
        elif st.recent:  # a server that is gone: its log's lines are history, not live requests
            show(f"earlier      {len(st.recent)} request line(s) in the log from before it stopped (not live)")
        show(f"log          {st.run_dir / LOG_FILE}")
    if not st.up:
        sys.exit(1)


@main.command()
@click.option("--port", type=int, help="The server's port (default: the last one started).")
def stop(port: int | None) -> None:
    """Stop a server started by `gguf-exact serve` (by its pid file)."""
    from gguf_exact.engines.status import stop_server

    console.out.print(stop_server(port), markup=False)


@main.command()
@target_and_draft_options(auto=True, no_draft=False)
@profile_option(lead="The profile to start from: ")
@click.option(
    "--as",
    "save_as",
    metavar="NAME",
    help="The name to save the tuned profile under (default: PROFILE-tuned, e.g. cpu-tuned). "
    "Naming a profile shipped with gguf-exact (cpu, rtx3050, ...) replaces it for every later serve.",
)
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a profile value while measuring."
)
@n_max_list_option("Comma-separated fixed draft lengths to try (the adaptive policy off).", "1,2,3,4")
@click.option(
    "--bounds",
    type=CommaList(int, "4,6"),
    default="4,6",
    show_default=True,
    help="Comma-separated n-max bounds of the adaptive draft length to try ('' for fixed lengths only).",
)
@click.option(
    "--p-min",
    "p_mins",
    type=CommaList(float, "0,0.5,0.9"),
    default="0,0.5,0.9",
    show_default=True,
    help="With each bound, these drafter confidences below which a draft stops (spec-draft-p-min).",
)
@prompts_option
@click.option("--n-predict", default=64, show_default=True, help="Tokens per prompt and run.")
@click.option("--rounds", default=1, show_default=True, help="Rounds; each visits the arms forward then backward.")
@server_bin_option
@out_dir_option("tune", "bench.json and bench.md of the measurement")
@click.option("--no-write", is_flag=True, help="Measure and print; write no profile.")
@click.option(
    "--max-spread",
    type=click.FloatRange(min=0),
    default=0.5,
    show_default=True,
    help="The most noise tune ranks settings with: when the same request's tokens/s ratio between two arms "
    "spreads more than this either side of its middle (0.5: +-50%), it prints the table, writes no profile and "
    "exits 1.",
)
def tune(
    target: Path,
    drafter: str | None,
    fetch_draft: bool,
    models_dir: Path,
    profile: str,
    save_as: str | None,
    overrides: tuple[str, ...],
    n_values: list[int],
    bounds: list[int],
    p_mins: list[float],
    prompt_names: list[str] | None,
    n_predict: int,
    rounds: int,
    server_bin: Path | None,
    out_dir: Path | None,
    no_write: bool,
    max_spread: float,
) -> None:
    """Measure the draft settings on this machine; keep the best in a profile of its own.

    Starts llama-server with the profile once per arm (the target alone, the fixed
    lengths n-max 1, 2, 3, 4, then the adaptive draft length at each --bounds
    bound with each --p-min; one server at a time, arms forward then backward),
    runs the shipped prompts against each and prints the table, the best fixed
    length and what the adaptive default gives beside it. Its servers' run folders
    are temporary: `status` never shows them. The kept setting (adaptive unless
    a fixed length is faster beyond the noise) goes into a copy
    of the profile named PROFILE-tuned (cpu-tuned, rtx3050-tuned; --as NAME for
    another) in the user's profile folder ($GGUF_EXACT_PROFILES, else
    ~/.config/gguf-exact/profiles), the measurement in a comment at its top:
    serve with `--profile cpu-tuned`. The profiles shipped with gguf-exact (and
    what --profile auto picks) stay as they are unless --as names one. Delete
    the copy to go back.
    """
    from gguf_exact.bench.tune import TuneRequest, kept_line, tune_profile, tuned_name
    from gguf_exact.runtime.profile_choice import resolve_profile

    prof, choice = resolve_profile(profile)
    name = tuned_name(prof, save_as)  # a bad --as stops here, before any measuring
    found = drafter_from_options(target, drafter, False, fetch_draft, models_dir, auto=True)
    request = TuneRequest(
        target, found.path, prof, profile, tuple(n_values), tuple(bounds), tuple(p_mins),
        tuple(prompt_names) if prompt_names else None, n_predict, rounds, tuple(overrides), server_bin, save_as,
        max_spread,
    )  # fmt: skip
    if not found.given:
        note(f"drafter {found.path} ({found.how})")
    note(profile_line(prof, choice))
    with console.status("tune: measuring") as step:  # minutes: name the arm and round under way
        tuned = tune_profile(request, out_dir or results_dir("tune"), not no_write, console.progress_lines(), step)
    result = tuned.result
    say_markdown(result.report.markdown())
    if result.noisy is not None:  # its ratios and picks would be the noise's, not the settings'
        say_fitted("wrote " + ", ".join(str(p) for p in tuned.report_files.values()))
        raise MeasurementError(result.noisy)
    base = result.target_tokens_per_second
    vs = f"; the target alone {base:.1f} tokens/s" if base else ""
    say_fitted(
        f"best fixed length: n-max {result.best_n_max} at {result.best_tokens_per_second:.1f} tokens/s (median run){vs}"
    )
    if (a := result.adaptive) is not None:
        say_fitted(
            f"adaptive default ({a.default.describe()}): {a.default_tokens_per_second:.1f} tokens/s, "
            f"{a.default_vs_fixed:.2f}x the best fixed length (median ratio of the same requests)"
        )
        if a.best != a.default:
            say_fitted(f"best adaptive: {a.best.describe()} at {a.best_tokens_per_second:.1f} tokens/s")
    if result.spread is not None:
        say_fitted(
            f"spread: +-{result.spread:.1%} (half the range of the tokens/s ratios of the same request on two arms); "
            "a gain within it does not count"
        )
    for line in result.notes:
        say_fitted(line)
    if base and result.best_tokens_per_second < base and not result.target_within_noise:
        console.out.print(
            "drafting is slower than the target alone on this machine (noisy if it is busy)", markup=False
        )
    say_fitted("wrote " + ", ".join(str(p) for p in tuned.report_files.values()))
    if tuned.profile_file is None:
        return
    dest = tuned.profile_file
    say_fitted(f"wrote {dest}: {kept_line(result.kept)}; serve with `--profile {name}`")
    if tuned.replaces_builtin:
        say_fitted(
            f"note: it replaces the {name} profile shipped with gguf-exact for every later serve, chat and "
            f"--profile auto; delete {dest} to go back"
        )
