"""Serving commands: ``serve``, ``status``, ``stop`` (llama-server or the Python engine, over HTTP)."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from typing import Any

import click

from gguf_exact.cli import console
from gguf_exact.cli.app import main, message
from gguf_exact.cli.console import say, say_fitted, warn
from gguf_exact.cli.options import (
    draft_length_words,
    knob_options,
    overrides_option,
    profile_line,
    profile_option,
    settings_options,
    target_and_draft_options,
)
from gguf_exact.cli.rpc import rpc_plan_lines, show_worker
from gguf_exact.constants import API_KEY_ENV
from gguf_exact.engines.shared.settings import LOG_FILE, RPC_ENGINE, ServeSettings

SERVE_SETTINGS = ("host", "port", "api_key", "insecure", "server_bin", "rpc", "engine", "logprobs", "vulkan_devices")


@main.command()
@target_and_draft_options(auto=True)
@profile_option()
@overrides_option
@knob_options
@settings_options(ServeSettings, *SERVE_SETTINGS)
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
@click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[-- LLAMA_SERVER_ARGS...]")
def serve(
    detach: bool,
    dry_run: bool,
    timeout: float,
    no_probe: bool,
    extra: tuple[str, ...],
    **given: Any,
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

    settings = ServeSettings(extra_args=extra, **given)
    host, engine = settings.host, settings.engine
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
        config = launch.settings.config
        say(f"draft    {draft_length_words(config.n_max, config.adaptive)}")
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
        say(
            f"detached; `gguf-exact status --port {settings.port}`{key} reports on it, `gguf-exact stop --port {settings.port}` ends it"
        )
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
    from gguf_exact.engines.shared.status import server_status

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
                if p.slot_draft_n:  # --parallel: the batch the latest length was chosen in, each slot's length
                    per = ", ".join(f"slot {i}: {n}" for i, n in p.slot_draft_n)
                    show(f"batch        {p.batch_rows} rows in the latest choice's pass; draft length {per}")
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
    from gguf_exact.engines.shared.status import stop_server

    console.out.print(stop_server(port), markup=False)
