"""Launch either engine's server from :class:`~.settings.ServeSettings`, and stay with it or leave it running.

:func:`plan_launch` checks the settings (engine, port, the host's exposure, the pair
with :func:`~gguf_exact.pair.checks.check_pair`, the profile with its overrides) and
returns a :class:`Launch`: the resolved settings and the exact command line of the
engine's own module (:mod:`.llama_server`, :mod:`.python.server_main`); nothing is started.
:func:`start_server` writes the run folder (:mod:`.process`, :mod:`.settings`), starts
the server, waits for ``/health`` and then either stays with it (:func:`serve_foreground`)
or leaves it running (``detach``). ``status`` and ``stop`` are :mod:`.status`.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from gguf_exact import constants
from gguf_exact.engines import llama_server
from gguf_exact.engines.python import server_main
from gguf_exact.engines.shared.process import (
    await_start,
    check_port_free,
    claim_run_folder,
    last_lines,
    process_start_time,
    run_folder,
    terminate,
    write_state,
)
from gguf_exact.engines.shared.profile_choice import resolve_profile
from gguf_exact.engines.shared.profiles import Profile
from gguf_exact.engines.shared.rpc_probe import parse_endpoints
from gguf_exact.engines.shared.serving_config import ServingConfig, serving_config
from gguf_exact.engines.shared.settings import (
    CONSOLE_FILE,
    ENGINES,
    LOG_FILE,
    PID_FILE,
    ServeSettings,
    is_loopback,
    write_settings,
)
from gguf_exact.engines.shared.status import server_label
from gguf_exact.errors import ArgumentError, Param, ServerError
from gguf_exact.pair.checks import ServePair, check_pair


@dataclass(frozen=True)
class Launch:
    """A checked, not yet started, server: its resolved settings and command line."""

    settings: ServeSettings  # resolved (plan_launch): the profile loaded, the pair checked
    command: list[str]
    run_dir: Path
    note: str | None = None  # e.g. the build is not there yet (a dry run)

    @property
    def engine(self) -> str:
        return self.settings.engine

    @property
    def host(self) -> str:
        return self.settings.host

    @property
    def port(self) -> int:
        return self.settings.port

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def api_key(self) -> str | None:
        return self.settings.api_key or None

    @property
    def profile(self) -> Profile:
        return self.settings.loaded_profile

    @property
    def pair(self) -> ServePair:
        return ServePair(self.settings.target, self.settings.drafter)  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        return server_label(self.engine)

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)


# A key for a server other machines reach: 16 characters at least (a random hex key of 16 is
# 64 bits; the one the messages suggest, `openssl rand -hex 24`, is 48 characters).
MIN_API_KEY_CHARS = 16


def check_exposure(host: str, api_key: str | None, insecure: bool) -> None:
    """A server reachable from other machines needs an API key, unless ``insecure``."""
    key_env = constants.API_KEY_ENV
    if api_key is not None and not api_key.strip():
        raise ArgumentError(
            Param("api_key"), f" (or ${key_env}) is empty; give a key, e.g. from `openssl rand -hex 24`"
        )
    if not is_loopback(host) and api_key and len(api_key) < MIN_API_KEY_CHARS:
        raise ArgumentError(
            Param("api_key"),
            f" (or ${key_env}) has {len(api_key)} characters; a server other machines reach ({host}) needs a key of at "
            f"least {MIN_API_KEY_CHARS}, e.g. from `openssl rand -hex 24`",
        )
    if not is_loopback(host) and not api_key and not insecure:
        raise ArgumentError(
            Param("host"),
            f" {host} lets other machines reach the server, which answers anyone without a key: give one with ",
            Param("api_key"),
            f" KEY (or ${key_env}; clients send it as the OpenAI api_key), or pass ",
            Param("insecure", api="insecure=True"),
            " to serve without one",
        )


def _engine_checks(settings: ServeSettings, config: ServingConfig) -> ServeSettings:
    """What the engine allows of the settings; the Python engine's logprobs from the profile."""
    if settings.engine == server_main.NAME:
        if config.rpc:
            raise ArgumentError(
                Param("engine"), " python runs on this machine's devices only: ", Param("rpc"),
                " (RPC workers) is for llama-server",
            )  # fmt: skip
        if settings.server_bin or settings.extra_args:
            raise ArgumentError(
                Param("engine"), " python runs in Python: ", Param("server_bin"), " and ", Param("extra_args"),
                " do not apply",
            )  # fmt: skip
        if not settings.logprobs and config.logprobs:
            return replace(settings, logprobs=True)
    elif settings.logprobs:
        raise ArgumentError(
            Param("logprobs"), " is for ", Param("engine"), " python (llama-server always returns them on request)"
        )
    return settings


def plan_launch(settings: ServeSettings, *, check_port: bool = True, require_build: bool = True) -> Launch:
    """Check everything (the port too, unless ``check_port`` is false) and build the
    server's command line; start nothing. ``require_build=False`` (a dry run) plans
    llama-server with the path the profile's build will have once built, and says how
    to build it in :attr:`Launch.note`. Targets and drafters given as
    :class:`~gguf_exact.pair.checks.ModelFile` (as read before) are not read again."""
    if settings.engine not in ENGINES:
        raise ArgumentError(Param("engine"), f" {settings.engine}: expected one of {', '.join(ENGINES)}")
    given = settings.profile
    prof = given if isinstance(given, Profile) else resolve_profile(str(given))[0]
    prof = prof.with_overrides(list(settings.overrides)) if settings.overrides else prof
    if settings.rpc:  # serve --rpc: over the profile's rpc key
        prof = prof.with_overrides([f"rpc={','.join(parse_endpoints(settings.rpc, Param('rpc')))}"])
    config = serving_config(prof, with_draft=settings.drafter is not None)
    if config.rpc and not settings.rpc:
        parse_endpoints(config.rpc, f"profile {prof.name}: rpc")
    llama_server.check_extra_args(settings.extra_args)
    check_exposure(settings.host, settings.api_key, settings.insecure)
    if not 0 < int(settings.port) < 65536:
        raise ArgumentError(Param("port"), f" {settings.port}: expected 1-65535")
    settings = _engine_checks(settings, config)
    pair = check_pair(settings.target, settings.drafter, settings.checksums)
    options, ignored = None, list[str]()
    if settings.engine == server_main.NAME:  # the profile checked for this engine before anything starts
        options, ignored = serving_config(prof, with_draft=pair.drafter is not None).engine_options()
    resolved = settings.with_pair(pair, prof, options, tuple(ignored))
    rdir = run_folder(resolved)
    note = None
    if resolved.engine == server_main.NAME:
        cmd = server_main.command(resolved, rdir)
    else:
        cmd, note = llama_server.command(resolved, rdir, require_build)
        if skipped := config.not_applied(llama_server.NAME):  # a knob only the Python engine has
            line = f"profile {prof.name}: not applied by llama-server: {', '.join(skipped)} (the Python engine's)"
            note = f"{note}; {line}" if note else line
    if check_port:
        check_port_free(resolved.host, resolved.port)
    return Launch(resolved, cmd, rdir, note)


def server_env(launch: Launch) -> dict[str, str]:
    """The server's environment: this one, with the API key where its engine reads it
    (llama-server: ``LLAMA_API_KEY``; the python engine: ``GGUF_EXACT_API_KEY``) and no
    key at all when none was given (a key in the caller's environment is not inherited
    by the servers ``tune`` and ``bench`` start for themselves); ``GGML_VK_VISIBLE_DEVICES``
    set to the settings' ``vulkan_devices`` when given."""
    import os

    from gguf_exact.builds.devices import device_env

    keys = (constants.API_KEY_ENV, constants.LLAMA_SERVER_KEY_ENV)
    env = device_env(launch.settings.vulkan_devices, {k: v for k, v in os.environ.items() if k not in keys})
    if launch.api_key:
        env[constants.LLAMA_SERVER_KEY_ENV if launch.engine == llama_server.NAME else constants.API_KEY_ENV] = (
            launch.api_key
        )
    return env


def wait_healthy(launch: Launch, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until ``/health`` says ok; stops the server and raises if it exits or times out."""
    from gguf_exact.engines.shared.http import health

    t0 = time.monotonic()
    while True:
        code = proc.poll()
        if code is not None:
            tail = last_lines(launch.run_dir / CONSOLE_FILE) or last_lines(launch.run_dir / LOG_FILE)
            raise ServerError(
                f"{launch.label} exited with code {code} while starting ({tail or 'no output'}); log: {launch.run_dir / LOG_FILE}"
            )
        if health(launch.url) == "ok":
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            terminate(proc.pid, process_start_time(proc.pid))
            raise ServerError(
                f"{launch.label} at {launch.url} not healthy after {timeout:.0f} s; stopped it; log: {launch.run_dir / LOG_FILE}"
            )
        time.sleep(0.2)


def start_server(
    launch: Launch, detach: bool = False, timeout: float = 600.0, extra_env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen, float]:
    """Start the server and wait for ``/health``: (process, seconds to healthy).

    ``detach`` puts it in its own session with its console in ``console.log``, so it
    outlives this process; otherwise it shares this terminal. ``extra_env``: entries over
    :func:`server_env`'s (the benchmarks' trace path per server).
    """
    rdir = launch.run_dir
    claim_run_folder(rdir, launch.host, launch.port, "server ")
    for name in (LOG_FILE, CONSOLE_FILE):
        (rdir / name).unlink(missing_ok=True)
    write_settings(launch.settings, rdir)
    proc = spawn(launch.command, rdir, detach, server_env(launch) | dict(extra_env or {}))
    write_state(launch.settings, rdir, launch.command, proc.pid, detach)
    return proc, await_start(proc, rdir, lambda: wait_healthy(launch, proc, timeout))


def spawn(command: list[str], run_dir: Path, detach: bool, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``command``: detached, in its own session with its console in ``console.log`` of
    ``run_dir``, so it outlives this process; otherwise on this terminal."""
    if not detach:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env)
    with open(run_dir / CONSOLE_FILE, "wb") as console:
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )


def serve_foreground(launch: Launch, proc: subprocess.Popen) -> int:
    """Stay with a started server until it exits (Ctrl-C or SIGTERM stop it); its exit code."""
    return stay_in_foreground(proc, launch.run_dir)


def stay_in_foreground(proc: subprocess.Popen, run_dir: Path) -> int:
    """Stay with a started process (a server, a worker) until it exits; its exit code. Ctrl-C
    and SIGTERM stop it; its pid file is removed after."""
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # the terminal sent SIGINT to both; give it time to finish
                try:
                    return proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        signal.signal(signal.SIGTERM, previous)
        (run_dir / PID_FILE).unlink(missing_ok=True)


__all__ = [
    "Launch",
    "check_exposure",
    "plan_launch",
    "serve_foreground",
    "server_env",
    "spawn",
    "start_server",
    "stay_in_foreground",
    "wait_healthy",
]
