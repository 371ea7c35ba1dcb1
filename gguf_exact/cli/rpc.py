"""``rpc-server``: this machine's device lent to a llama-server elsewhere (llama.cpp's RPC worker)."""

from __future__ import annotations

import sys

import click

from gguf_exact.cli.app import main
from gguf_exact.cli.console import say, warn
from gguf_exact.cli.options import profile_option
from gguf_exact.engines.shared.settings import CONSOLE_FILE, DEFAULT_HOST, DEFAULT_RPC_PORT, WorkerSettings


@main.command("rpc-server")
@profile_option()
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="The address to listen on. Anything but this machine's own needs --allow-network.",
)
@click.option("--port", default=DEFAULT_RPC_PORT, show_default=True, type=int)
@click.option(
    "--allow-network",
    is_flag=True,
    help="Listen on a --host other machines reach. llama.cpp's RPC protocol has no authentication and no "
    "encryption: anyone who reaches the port can run code on this machine's device. Use a private link "
    "(a cable, a VPN) that only your head machine reaches.",
)
@click.option("--threads", type=int, help="Threads of the worker's CPU device (default: the profile's, else half the cores).")
@click.option("--cache", is_flag=True, help="Keep large tensors on this machine's disk, so the next load sends only hashes.")
@click.option("--detach", is_flag=True, help="Run in the background (pid file and console log in the run directory).")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the worker to answer.")
def rpc_server(
    profile: str,
    host: str,
    port: int,
    allow_network: bool,
    threads: int | None,
    cache: bool,
    detach: bool,
    timeout: float,
) -> None:
    """Lend this machine's GPU (or CPU) to a llama-server on another machine.

    \b
    Starts llama.cpp's rpc-server from the build the profile names (the same
    build as `serve`: `gguf-exact build-llama` makes both), on 127.0.0.1 unless
    --host and --allow-network say otherwise, and waits until it answers. On the
    head machine, `gguf-exact serve --rpc HOST:PORT[,HOST:PORT...]` splits the
    model over this worker and its own devices. `status --port N` reports on the
    worker, `stop --port N` ends it. A worker serves one llama-server at a time.
    """
    from gguf_exact.engines.launch import stay_in_foreground
    from gguf_exact.engines.rpc_worker import plan_worker, start_worker

    settings = WorkerSettings(
        profile=profile, host=host, port=port, threads=threads, cache=cache, allow_network=allow_network
    )
    launch = plan_worker(settings)
    say(f"profile  {launch.profile.name}: build {launch.profile.build}")
    say(" ".join(launch.command))
    if allow_network:
        warn(f"--allow-network: anyone who reaches {launch.endpoint} can run code on this machine's device")
    proc, seconds = start_worker(launch, detach, timeout)
    say(f"rpc-server ready at {launch.endpoint} in {seconds:.1f} s (pid {proc.pid}); on the head: serve --rpc {launch.endpoint}")
    if detach:
        say(f"detached; `gguf-exact status --port {port}` reports on it, `gguf-exact stop --port {port}` ends it")
        return
    sys.exit(stay_in_foreground(proc, launch.run_dir))


def show_worker(st, show) -> None:
    """``status`` of an RPC worker: its process, whether it answers, its devices."""
    s = st.state
    state = "up" if st.up else (f"down: {st.down_reason}" if not st.running else st.health)
    show(f"worker       {s['url'].removeprefix('rpc://')}  pid {st.pid or s['pid']}  {state}")
    show(f"engine       rpc-server (profile {s.get('profile', '-')}, build {s.get('build', '-')})")
    if st.worker is not None:
        show(f"answer       {st.worker.line()}")
    for dev in st.worker_devices:
        show(f"device       {dev}")
    show(f"log          {st.run_dir / CONSOLE_FILE}")


def rpc_plan_lines(plan) -> list[str]:
    """``serve --rpc``: what each worker answered, then the memory plan over the devices."""
    out = [f"rpc worker {w.line()}" for w in plan.workers or ()]
    d = plan.devices
    out.append(f"memory plan over devices (layers split by {d.split_from}; estimated from the GGUF headers as llama.cpp places them):")
    return out + d.lines()
