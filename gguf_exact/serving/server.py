"""Launch llama-server with a Gemma 4 target and its MTP drafter, report on it, stop it.

:func:`plan_launch` checks the models (:mod:`.checks`), reads the profile
(:mod:`.profiles`), finds the llama-server build (:mod:`.llama_build`) and returns the
exact command line; nothing is started. :func:`start_server` starts it with
``--metrics`` and ``--log-file``, waits for ``/health`` and then either stays with it
(:func:`serve_foreground`) or leaves it running (``detach``). Each server has a run
directory, ``<cache>/run/<port>/``: ``server.pid``, ``server.json`` (how it was
started), ``server.log`` (llama-server's log) and, when detached, ``console.log``.
:func:`server_status` and :func:`stop_server` work from that directory.
"""

import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from gguf_exact.errors import GgufExactError
from gguf_exact.serving.checks import ServePair, check_pair
from gguf_exact.serving.llama_build import build_command, cache_root, find_build
from gguf_exact.serving.profiles import Profile, load_profile, refuse_no_mmap
from gguf_exact.serving.stats import (
    Acceptance,
    DraftCounters,
    draft_counters,
    parse_acceptance,
    parse_metrics,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
STATE_FILE, PID_FILE, LOG_FILE, CONSOLE_FILE = "server.json", "server.pid", "server.log", "console.log"
SERVER_BIN_ENV = "GGUF_EXACT_LLAMA_SERVER"

Log = Callable[[str], None]


def run_root() -> Path:
    """``$GGUF_EXACT_RUN_DIR``, else ``<cache>/run``."""
    env = os.environ.get("GGUF_EXACT_RUN_DIR")
    return Path(env).expanduser() if env else cache_root() / "run"


@dataclass(frozen=True)
class Launch:
    """A checked, not yet started, llama-server invocation."""

    command: list[str]
    host: str
    port: int
    run_dir: Path
    pair: ServePair
    profile: Profile

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)


def resolve_server_binary(profile: Profile, server_bin: str | Path | None = None) -> Path:
    """``server_bin``, else ``$GGUF_EXACT_LLAMA_SERVER``, else the cached build the profile names."""
    chosen = server_bin or os.environ.get(SERVER_BIN_ENV)
    if chosen:
        path = Path(chosen).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise GgufExactError(
                f"llama-server {path}: no such executable; build it with `gguf-exact build-llama` or fix --server-bin"
            )
        return path
    build = find_build(profile.build)
    if build is None:
        raise GgufExactError(
            f"llama-server for build {profile.build!r} (profile {profile.name}) not found; run `{build_command(profile.build)}` (or make llama-server) first"
        )
    return build.binary("llama-server")


def _extra_args_check(extra: list[str]) -> None:
    for i, arg in enumerate(extra):
        key = arg.lstrip("-")
        value = extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("-") else True
        key, eq, inline = key.partition("=")
        refuse_no_mmap(key, inline if eq else value, "llama-server arguments")


def plan_launch(
    target: str | Path,
    drafter: str | Path | None = None,
    profile: str | Path | Profile = "cpu",
    overrides: list[str] | tuple[str, ...] = (),
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    server_bin: str | Path | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    checksums: dict[str, str] | None = None,
    check_port: bool = True,
) -> Launch:
    """Check everything (the port too, unless ``check_port`` is false) and build the
    llama-server command line; start nothing."""
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    prof = prof.with_overrides(list(overrides)) if overrides else prof
    _extra_args_check(list(extra_args))
    if not 0 < int(port) < 65536:
        raise GgufExactError(f"--port {port}: expected 1-65535")
    pair = check_pair(target, drafter, checksums)
    binary = resolve_server_binary(prof, server_bin)
    if check_port:
        _check_port_free(host, int(port))
    rdir = run_root() / str(port)
    cmd = [str(binary), "--model", str(pair.target.path.resolve())]
    if pair.drafter is not None:
        cmd += ["--model-draft", str(pair.drafter.path.resolve())]
    cmd += ["--host", host, "--port", str(port), "--metrics", "--log-file", str(rdir / LOG_FILE)]
    cmd += prof.args(with_draft=pair.drafter is not None) + list(extra_args)
    return Launch(cmd, host, int(port), rdir, pair, prof)


def port_in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _check_port_free(host: str, port: int) -> None:
    if port_in_use(host, port):
        raise GgufExactError(
            f"port {port} on {host} is in use (`gguf-exact status --port {port}` shows if it is ours); pick another with --port"
        )


def _http(url: str, timeout: float = 3.0) -> tuple[int, str]:
    """(status, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def health(url: str) -> str:
    """``ok`` (200), ``loading`` (503), ``down`` (no answer) or ``http NNN``."""
    code, _ = _http(url + "/health")
    return {200: "ok", 503: "loading", 0: "down"}.get(code, f"http {code}")


def _tail(path: Path, n: int = 3) -> str:
    if not path.is_file():
        return ""
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def _write_state(launch: Launch, pid: int, detached: bool) -> None:
    launch.run_dir.mkdir(parents=True, exist_ok=True)
    state = {
        "pid": pid,
        "host": launch.host,
        "port": launch.port,
        "url": launch.url,
        "detached": detached,
        "started": time.time(),
        "profile": launch.profile.name,
        "command": launch.command,
        "target": str(launch.pair.target.path.resolve()),
        "drafter": str(launch.pair.drafter.path.resolve()) if launch.pair.drafter else None,
    }
    (launch.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    (launch.run_dir / PID_FILE).write_text(f"{pid}\n")


def wait_healthy(launch: Launch, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until ``/health`` says ok; stops the server and raises if it exits or times out."""
    t0 = time.monotonic()
    while True:
        code = proc.poll()
        if code is not None:
            tail = _tail(launch.run_dir / CONSOLE_FILE) or _tail(launch.run_dir / LOG_FILE)
            raise GgufExactError(
                f"llama-server exited with code {code} while starting ({tail or 'no output'}); log: {launch.run_dir / LOG_FILE}"
            )
        if health(launch.url) == "ok":
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            _terminate(proc.pid)
            raise GgufExactError(
                f"llama-server at {launch.url} not healthy after {timeout:.0f} s; stopped it; log: {launch.run_dir / LOG_FILE}"
            )
        time.sleep(0.2)


def start_server(launch: Launch, detach: bool = False, timeout: float = 600.0) -> tuple[subprocess.Popen, float]:
    """Start llama-server and wait for ``/health``: (process, seconds to healthy).

    ``detach`` puts it in its own session with its console in ``console.log``, so it
    outlives this process; otherwise it shares this terminal.
    """
    _check_port_free(launch.host, launch.port)
    old = _read_pid(launch.run_dir)
    if old and _is_llama_server(old):
        raise GgufExactError(
            f"{launch.run_dir / PID_FILE}: llama-server pid {old} is still running for port {launch.port}; `gguf-exact stop --port {launch.port}` first"
        )
    launch.run_dir.mkdir(parents=True, exist_ok=True)
    for name in (LOG_FILE, CONSOLE_FILE):
        (launch.run_dir / name).unlink(missing_ok=True)
    if detach:
        with open(launch.run_dir / CONSOLE_FILE, "wb") as console:
            proc = subprocess.Popen(
                launch.command,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    else:
        proc = subprocess.Popen(launch.command, stdin=subprocess.DEVNULL)
    _write_state(launch, proc.pid, detach)
    try:
        seconds = wait_healthy(launch, proc, timeout)
    except BaseException:
        if proc.poll() is None:
            _terminate(proc.pid)
        (launch.run_dir / PID_FILE).unlink(missing_ok=True)
        raise
    return proc, seconds


def serve_foreground(launch: Launch, proc: subprocess.Popen) -> int:
    """Stay with a started server until it exits (Ctrl-C or SIGTERM stop it); its exit code."""
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
        (launch.run_dir / PID_FILE).unlink(missing_ok=True)


# --- status and stop -------------------------------------------------------------


def _read_pid(run_dir: Path) -> int | None:
    try:
        return int((run_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _is_llama_server(pid: int) -> bool:
    """Alive, and (where /proc exists) really a llama-server, not a reused pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path(f"/proc/{pid}")
    if proc.is_dir():
        try:
            if (proc / "stat").read_text().split(")")[-1].split()[0] == "Z":
                return False  # a zombie: it has exited
            return b"llama-server" in (proc / "cmdline").read_bytes()
        except OSError:
            return False
    return True


def _terminate(pid: int, timeout: float = 15.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _is_llama_server(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def find_run_dir(port: int | None = None, root: Path | None = None) -> Path:
    """The run directory for ``port``; without one, the most recently started server's."""
    root = root or run_root()
    if port is not None:
        rdir = root / str(port)
        if not (rdir / STATE_FILE).is_file():
            raise GgufExactError(f"{rdir}: no server was started on port {port} by gguf-exact serve")
        return rdir
    runs = sorted(
        (p for p in root.glob("*") if (p / STATE_FILE).is_file()), key=lambda p: (p / STATE_FILE).stat().st_mtime
    )
    if not runs:
        raise GgufExactError(f"{root}: no server started by gguf-exact serve; start one with `gguf-exact serve`")
    live = [p for p in runs if (p / PID_FILE).is_file()]
    return (live or runs)[-1]


@dataclass
class ServerStatus:
    run_dir: Path
    state: dict
    pid: int | None
    running: bool
    health: str
    models: list[str] = field(default_factory=list)
    speculative: bool | None = None
    counters: DraftCounters | None = None
    recent: list[Acceptance] = field(default_factory=list)

    @property
    def up(self) -> bool:
        return self.running and self.health == "ok"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        d["up"] = self.up
        if self.counters:
            d["counters"]["rate"] = self.counters.rate
            d["counters"]["position_rates"] = list(self.counters.position_rates)
        return d


def server_status(port: int | None = None, root: Path | None = None, last: int = 5) -> ServerStatus:
    """Health, models, speculation, draft counters (``/metrics``) and the last
    ``last`` per-request ``draft acceptance`` lines of a server started by :func:`start_server`."""
    rdir = find_run_dir(port, root)
    state = json.loads((rdir / STATE_FILE).read_text())
    pid = _read_pid(rdir)
    running = bool(pid) and _is_llama_server(pid)
    url = state["url"]
    st = ServerStatus(rdir, state, pid, running, health(url) if running else "down")
    log = rdir / LOG_FILE
    if log.is_file():
        st.recent = parse_acceptance(log.read_text(errors="replace"), last)
    if not running or st.health == "down":
        return st
    code, body = _http(url + "/v1/models")
    if code == 200:
        try:
            st.models = [m.get("id", "?") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            pass
    code, body = _http(url + "/slots")
    if code == 200:
        try:
            st.speculative = any(bool(s.get("speculative")) for s in json.loads(body))
        except (ValueError, AttributeError):
            pass
    code, body = _http(url + "/metrics")
    if code == 200:
        st.counters = draft_counters(parse_metrics(body))
    return st


def stop_server(port: int | None = None, root: Path | None = None, timeout: float = 15.0) -> str:
    """Stop a server started by :func:`start_server` (SIGTERM, then SIGKILL after
    ``timeout``); returns what happened, in one line."""
    rdir = find_run_dir(port, root)
    state = json.loads((rdir / STATE_FILE).read_text())
    pid = _read_pid(rdir)
    where = f"llama-server on port {state['port']}"
    if pid is None:
        return f"{where} is not running (no pid file in {rdir})"
    if not _is_llama_server(pid):
        (rdir / PID_FILE).unlink(missing_ok=True)
        return f"{where} (pid {pid}) is not running: it exited or was killed; removed its pid file"
    _terminate(pid, timeout)
    (rdir / PID_FILE).unlink(missing_ok=True)
    return f"stopped {where} (pid {pid})"
