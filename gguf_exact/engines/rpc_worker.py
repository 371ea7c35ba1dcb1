"""``gguf-exact rpc-server``: llama.cpp's RPC worker, started and kept like a server.

A worker lends this machine's device (its GPU, or its CPU where the build has none) to a
llama-server on another machine (``serve --rpc HOST:PORT``). It runs the ``rpc-server``
of the build the profile names (every llama-server build holds one,
:data:`gguf_exact.builds.llama_build.TARGETS`), in the serving run folder of its port
(:mod:`.process`: ``server.json`` says ``engine = rpc-server``), so ``status`` reports it
and ``stop`` ends it. It is ready when it answers the protocol's hello
(:mod:`.rpc_probe`); it has no HTTP side.

The RPC protocol has no authentication and no encryption: whoever reaches the port can
allocate memory on the worker's device and run any ggml graph there (llama.cpp's README:
"never run the RPC server on an open network"). So a worker binds to loopback unless
``allow_network`` says otherwise, and then only an address the user chose.
A worker that stopped answering: :mod:`.rpc_watch`.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.builds.llama_build import build_command, find_build
from gguf_exact.engines.shared.process import (
    await_start,
    check_port_free,
    claim_run_folder,
    last_lines,
    process_start_time,
    run_folder,
    terminate,
    write_run_state,
)
from gguf_exact.engines.shared.profile_choice import resolve_profile
from gguf_exact.engines.shared.profiles import Profile
from gguf_exact.engines.shared.rpc_probe import probe_worker
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.engines.shared.settings import CONSOLE_FILE, RPC_ENGINE, WorkerSettings, is_loopback
from gguf_exact.errors import ArgumentError, BuildError, Param, ServerError


@dataclass(frozen=True)
class WorkerLaunch:
    """A checked, not yet started, worker: its settings, profile, command line and run folder."""

    settings: WorkerSettings
    profile: Profile
    command: list[str]
    run_dir: Path

    @property
    def endpoint(self) -> str:
        return self.settings.endpoint


def check_worker_exposure(host: str, allow_network: bool) -> None:
    """Loopback, or ``allow_network``: an RPC worker answers anyone who reaches it."""
    if not is_loopback(host) and not allow_network:
        raise ArgumentError(
            Param("host"),
            f" {host} would let other machines reach this RPC worker, and llama.cpp's RPC protocol has no "
            "authentication and no encryption: anyone who reaches the port can allocate memory and run code on "
            "this machine's device. Bind it to a private link only your head machine reaches, and pass ",
            Param("allow_network", api="allow_network=True"),
            " to say so",
        )


def worker_binary(profile: Profile, worker_bin: str | Path | None = None) -> Path:
    """``worker_bin``, else the ``rpc-server`` of the cached build the profile names."""
    if worker_bin:
        path = Path(worker_bin).expanduser()
        if not path.is_file():
            raise BuildError(f"rpc-server {path}: no such executable; fix ", Param("worker_bin"))
        return path
    build = find_build(profile.build)
    if build is None:
        raise ServerError(
            f"rpc-server for build {profile.build!r} (profile {profile.name}) not found; run `{build_command(profile.build)}` first"
        )
    return build.binary("rpc-server")


def plan_worker(settings: WorkerSettings, check_port: bool = True) -> WorkerLaunch:
    """Check the settings (exposure, port, the build) and build rpc-server's command line;
    start nothing. Threads: ``settings.threads``, else the profile's ``threads``, else
    rpc-server's own default (half the cores)."""
    check_worker_exposure(settings.host, settings.allow_network)
    if not 0 < int(settings.port) < 65536:
        raise ArgumentError(Param("port"), f" {settings.port}: expected 1-65535")
    given = settings.profile
    prof = given if isinstance(given, Profile) else resolve_profile(str(given))[0]
    threads = settings.threads if settings.threads is not None else serving_config(prof, with_draft=False).threads
    if threads is not None and threads < 1:
        raise ArgumentError(Param("threads"), f" {threads}: expected a whole number of at least 1")
    cmd = [str(worker_binary(prof, settings.worker_bin)), "--host", settings.host, "--port", str(settings.port)]
    cmd += ["--threads", str(threads)] if threads is not None else []
    cmd += ["--cache"] if settings.cache else []
    if check_port:
        check_port_free(settings.host, settings.port)
    return WorkerLaunch(settings, prof, cmd, run_folder(settings))


def wait_ready(launch: WorkerLaunch, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until the worker answers the hello; stops it and raises if it exits or times out."""
    t0 = time.monotonic()
    while True:
        code = proc.poll()
        if code is not None:
            tail = last_lines(launch.run_dir / CONSOLE_FILE)
            raise ServerError(f"rpc-server exited with code {code} while starting ({tail or 'no output'})")
        if probe_worker(launch.endpoint, timeout=1.0).ok:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            terminate(proc.pid, process_start_time(proc.pid))
            raise ServerError(f"rpc-server at {launch.endpoint} not answering after {timeout:.0f} s; stopped it")
        time.sleep(0.2)


def spawn_worker(command: list[str], run_dir: Path, detach: bool) -> subprocess.Popen:
    """Start rpc-server with SIGPIPE ignored, as Python itself has it (``restore_signals=False``).
    rpc-server writes with plain ``send``: a client that left before its answer (a probe that
    timed out while the worker served a head, answered once the head goes) would otherwise
    kill the worker with SIGPIPE; ignored, the write fails and the worker takes the next client.
    Detached: in its own session, its console in ``console.log`` of ``run_dir``."""
    if not detach:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, restore_signals=False)
    with open(run_dir / CONSOLE_FILE, "wb") as console:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            restore_signals=False,
        )


def start_worker(launch: WorkerLaunch, detach: bool = False, timeout: float = 60.0) -> tuple[subprocess.Popen, float]:
    """Start the worker and wait until it answers: (process, seconds to ready)."""
    s = launch.settings
    rdir = launch.run_dir
    claim_run_folder(rdir, s.host, s.port)
    (rdir / CONSOLE_FILE).unlink(missing_ok=True)
    proc = spawn_worker(launch.command, rdir, detach)
    state = {
        "engine": RPC_ENGINE,
        "host": s.host,
        "port": s.port,
        "url": f"rpc://{s.endpoint}",
        "profile": launch.profile.name,
        "build": launch.profile.build,
        "command": launch.command,
    }
    write_run_state(rdir, state, proc.pid, detach)
    return proc, await_start(proc, rdir, lambda: wait_ready(launch, proc, timeout))


__all__ = [
    "WorkerLaunch",
    "check_worker_exposure",
    "plan_worker",
    "spawn_worker",
    "start_worker",
    "wait_ready",
    "worker_binary",
]
