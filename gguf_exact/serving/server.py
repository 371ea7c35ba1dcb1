"""Launch a server for a Gemma 4 target and its MTP drafter, report on it, stop it.

Two engines: ``llama-server`` (the default; llama.cpp's own draft-mtp) and
``python`` (llama-cpp-python's OpenAI-compatible server on
:mod:`gguf_exact.speculative.engine`, :mod:`.openai_server`). :func:`plan_launch`
checks the models (:mod:`.checks`), reads the profile (:mod:`.profiles`), finds the
llama-server build (:mod:`.llama_build`) and returns the exact command line;
nothing is started. :func:`start_server` starts it (llama-server with ``--metrics``
and ``--log-file``), waits for ``/health`` and then either stays with it
(:func:`serve_foreground`) or leaves it running (``detach``). Each server has a run
directory, ``<cache>/run/<port>/``: ``server.pid``, ``server.json`` (how it was
started, and the process's start time), ``server.log`` (the server's log) and, when
detached, ``console.log``. :func:`server_status` and :func:`stop_server` work from
that directory; they recognise the process by its pid *and* its start time, so a
pid the system has since given to another process is never taken for the server.
"""

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from gguf_exact.builds.llama_build import build_command, cache_root, find_build, install_dir, make_command
from gguf_exact.errors import ArgumentError, BuildError, GgufExactError, Param, ServerError
from gguf_exact.pair.checks import ModelFile, ServePair, check_pair
from gguf_exact.runtime.profiles import Profile, load_profile, refuse_no_mmap
from gguf_exact.serving.speculation import Verdict, judge, probe
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
API_KEY_ENV = "GGUF_EXACT_API_KEY"  # serve --api-key / status --api-key, from the environment
LLAMA_SERVER_KEY_ENV = "LLAMA_API_KEY"  # llama-server reads its --api-key from this variable
ENGINES = ("llama-server", "python")
LOG_TAIL_BYTES = 64 * 1024  # status reads at most this much of a server log

Log = Callable[[str], None]


def run_root() -> Path:
    """``$GGUF_EXACT_RUN_DIR``, else ``<cache>/run``."""
    env = os.environ.get("GGUF_EXACT_RUN_DIR")
    return Path(env).expanduser() if env else cache_root() / "run"


@contextlib.contextmanager
def scratch_run_root(purpose: str) -> Iterator[Path]:
    """A run-folder root of its own for the servers a command starts and stops itself
    (``tune``, ``bench --engines``): ``status`` never sees them, and the folder is removed
    when the command is done. Kept when a server failed (the error names its log)."""
    root = Path(tempfile.mkdtemp(prefix=f"gguf-exact-{purpose}-"))
    try:
        yield root
    except GgufExactError:
        raise
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Launch:
    """A checked, not yet started, llama-server invocation."""

    command: list[str]
    host: str
    port: int
    run_dir: Path
    pair: ServePair
    profile: Profile
    engine: str = "llama-server"
    note: str | None = None  # e.g. the build is not there yet (a dry run)
    # Given to the server in its environment, never on its command line, in server.json or a log.
    api_key: str | None = field(default=None, repr=False, compare=False)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def label(self) -> str:
        return server_label(self.engine)

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)


def server_label(engine: str | None) -> str:
    """How messages name a server of ``engine``."""
    return "llama-server" if engine in (None, "llama-server") else f"{engine} engine server"


def resolve_server_binary(profile: Profile, server_bin: str | Path | None = None) -> Path:
    """``server_bin``, else ``$GGUF_EXACT_LLAMA_SERVER``, else the cached build the profile names."""
    chosen = server_bin or os.environ.get(SERVER_BIN_ENV)
    if chosen:
        path = Path(chosen).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BuildError(
                f"llama-server {path}: no such executable; build it with `gguf-exact build-llama` or fix ",
                Param("server_bin"),
            )
        return path
    build = find_build(profile.build)
    if build is None:
        raise ServerError(
            f"llama-server for build {profile.build!r} (profile {profile.name}) not found; run `{build_command(profile.build)}` (or `{make_command(profile.build)}`) first"
        )
    return build.binary("llama-server")


def _extra_args_check(extra: list[str]) -> None:
    for i, arg in enumerate(extra):
        key = arg.lstrip("-")
        value = extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("-") else True
        key, eq, inline = key.partition("=")
        refuse_no_mmap(key, inline if eq else value, Param("extra_args"))
        if key in ("api-key", "api-key-file"):
            raise ArgumentError(
                Param("extra_args"),
                f": --{key} would be kept in the run folder's server.json and shown by ps; give the key with serve's ",
                Param("api_key"),
                f" or ${API_KEY_ENV} instead",
            )


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1): nothing but this
    machine can reach a server bound there."""
    import ipaddress

    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve to any interface


def check_exposure(host: str, api_key: str | None, insecure: bool) -> None:
    """A server reachable from other machines needs an API key, unless ``insecure``."""
    if api_key is not None and not api_key.strip():
        raise ArgumentError(
            Param("api_key"), f" (or ${API_KEY_ENV}) is empty; give a key, e.g. from `openssl rand -hex 24`"
        )
    if not is_loopback(host) and not api_key and not insecure:
        raise ArgumentError(
            Param("host"),
            f" {host} lets other machines reach the server, which answers anyone without a key: give one with ",
            Param("api_key"),
            f" KEY (or ${API_KEY_ENV}; clients send it as the OpenAI api_key), or pass ",
            Param("insecure", api="insecure=True"),
            " to serve without one",
        )


def plan_launch(
    target: str | Path | ModelFile,
    drafter: str | Path | ModelFile | None = None,
    profile: str | Path | Profile = "cpu",
    overrides: list[str] | tuple[str, ...] = (),
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    server_bin: str | Path | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    checksums: dict[str, str] | None = None,
    check_port: bool = True,
    engine: str = "llama-server",
    logprobs: bool = False,
    require_build: bool = True,
    runs: Path | None = None,
    api_key: str | None = None,
    insecure: bool = False,
) -> Launch:
    """Check everything (the port too, unless ``check_port`` is false) and build the
    server's command line; start nothing. ``engine="python"`` runs
    :mod:`.openai_server` (llama-cpp-python) with the same profile instead of llama-server.
    ``require_build=False`` (a dry run) plans with the path the profile's build will
    have once built, and says how to build it in :attr:`Launch.note`. ``runs``: the
    root of the run folder (default :func:`run_root`; :func:`scratch_run_root` for servers
    a command starts for itself). ``api_key``: clients must send it (both engines; given
    to the server in its environment, kept out of the command line and the run folder);
    a ``host`` other machines can reach needs one unless ``insecure``. ``target`` and
    ``drafter`` may be :class:`~.checks.ModelFile` as read before: not read again."""
    if engine not in ENGINES:
        raise ArgumentError(Param("engine"), f" {engine}: expected one of {', '.join(ENGINES)}")
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    prof = prof.with_overrides(list(overrides)) if overrides else prof
    _extra_args_check(list(extra_args))
    check_exposure(host, api_key, insecure)
    if not 0 < int(port) < 65536:
        raise ArgumentError(Param("port"), f" {port}: expected 1-65535")
    if engine == "python":
        if server_bin or extra_args:
            raise ArgumentError(
                Param("engine"), " python runs in Python: ", Param("server_bin"), " and ", Param("extra_args"),
                " do not apply",
            )  # fmt: skip
        if logprobs is False and any(k == "logprobs" for k in prof.server):
            logprobs = True
    elif logprobs:
        raise ArgumentError(
            Param("logprobs"), " is for ", Param("engine"), " python (llama-server always returns them on request)"
        )
    pair = check_pair(target, drafter, checksums)
    rdir = (runs or run_root()) / str(port)
    if engine == "python":
        from gguf_exact.runtime.engine_options import engine_options  # checks the profile before anything starts

        engine_options(prof, with_draft=pair.drafter is not None)
        if check_port:
            _check_port_free(host, int(port))
        cmd = [sys.executable, "-m", "gguf_exact.speculative.openai_server", "--model", str(pair.target.path.resolve())]
        if pair.drafter is not None:
            cmd += ["--draft", str(pair.drafter.path.resolve())]
        cmd += ["--profile", str(prof.path or prof.name)]
        for pair_ in list(overrides):
            cmd += ["--set", pair_]
        cmd += ["--host", host, "--port", str(port), "--log-file", str(rdir / LOG_FILE)]
        cmd += ["--logprobs"] if logprobs else []
        return Launch(cmd, host, int(port), rdir, pair, prof, engine, api_key=api_key or None)
    note = None
    try:
        binary = resolve_server_binary(prof, server_bin)
    except GgufExactError as e:
        if require_build or server_bin or os.environ.get(SERVER_BIN_ENV):
            raise
        binary, note = install_dir(prof.build) / "bin" / "llama-server", str(e)
    if check_port:
        _check_port_free(host, int(port))
    cmd = [str(binary), "--model", str(pair.target.path.resolve())]
    if pair.drafter is not None:
        cmd += ["--model-draft", str(pair.drafter.path.resolve())]
    cmd += ["--host", host, "--port", str(port), "--metrics", "--log-file", str(rdir / LOG_FILE)]
    cmd += prof.args(with_draft=pair.drafter is not None) + list(extra_args)
    return Launch(cmd, host, int(port), rdir, pair, prof, note=note, api_key=api_key or None)


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port the system says is free now (for benchmarks and tests)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # as the servers bind: a port left in TIME_WAIT by a stopped server is free to them
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _check_port_free(host: str, port: int) -> None:
    if port_in_use(host, port):
        raise ServerError(
            f"port {port} on {host} is in use (`gguf-exact status --port {port}` shows if it is ours); pick another with ",
            Param("port"),
        )


def _http(url: str, timeout: float = 3.0, api_key: str | None = None) -> tuple[int, str]:
    """(status, body); status 0 when nothing answers."""
    from gguf_exact.serving.client import auth_headers

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=auth_headers(api_key)), timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def health(url: str) -> str:
    """``ok`` (200), ``loading`` (503), ``down`` (no answer) or ``http NNN``."""
    code, _ = _http(url + "/health")
    return {200: "ok", 503: "loading", 0: "down"}.get(code, f"http {code}")


def read_tail(path: Path, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last ``max_bytes`` of a text file (from its first whole line); "" if absent.
    A server log grows without bound: only its end is read."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return ""
    if start > 0:
        data = data.partition(b"\n")[2]
    return data.decode("utf-8", "replace")


def _tail(path: Path, n: int = 3) -> str:
    lines = [ln.strip() for ln in read_tail(path).splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def process_start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/PID/stat field 22), or
    None where /proc cannot tell. A pid can be reused; a (pid, start time) pair cannot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _write_state(launch: Launch, pid: int, detached: bool) -> None:
    launch.run_dir.mkdir(parents=True, exist_ok=True)
    state = {
        "pid": pid,
        "start_time": process_start_time(pid),
        "engine": launch.engine,
        "host": launch.host,
        "port": launch.port,
        "url": launch.url,
        "detached": detached,
        "started": time.time(),
        "profile": launch.profile.name,
        "api_key": bool(launch.api_key),  # whether clients need one; the key itself is never written
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
            raise ServerError(
                f"{launch.label} exited with code {code} while starting ({tail or 'no output'}); log: {launch.run_dir / LOG_FILE}"
            )
        if health(launch.url) == "ok":
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            _terminate(proc.pid, process_start_time(proc.pid))
            raise ServerError(
                f"{launch.label} at {launch.url} not healthy after {timeout:.0f} s; stopped it; log: {launch.run_dir / LOG_FILE}"
            )
        time.sleep(0.2)


def start_server(launch: Launch, detach: bool = False, timeout: float = 600.0) -> tuple[subprocess.Popen, float]:
    """Start llama-server and wait for ``/health``: (process, seconds to healthy).

    ``detach`` puts it in its own session with its console in ``console.log``, so it
    outlives this process; otherwise it shares this terminal.
    """
    _check_port_free(launch.host, launch.port)
    old = _read_pid(launch.run_dir)
    if old and is_server_process(old, _read_state(launch.run_dir)):
        raise ServerError(
            f"{launch.run_dir / PID_FILE}: server pid {old} is still running for port {launch.port}; `gguf-exact stop --port {launch.port}` first"
        )
    launch.run_dir.mkdir(parents=True, exist_ok=True)
    for name in (LOG_FILE, CONSOLE_FILE):
        (launch.run_dir / name).unlink(missing_ok=True)
    env = server_env(launch)
    if detach:
        with open(launch.run_dir / CONSOLE_FILE, "wb") as console:
            proc = subprocess.Popen(
                launch.command,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
    else:
        proc = subprocess.Popen(launch.command, stdin=subprocess.DEVNULL, env=env)
    _write_state(launch, proc.pid, detach)
    try:
        seconds = wait_healthy(launch, proc, timeout)
    except BaseException:
        if proc.poll() is None:
            _terminate(proc.pid, process_start_time(proc.pid))
        (launch.run_dir / PID_FILE).unlink(missing_ok=True)
        raise
    return proc, seconds


def server_env(launch: Launch) -> dict[str, str]:
    """The server's environment: this one, with the API key where its engine reads it
    (llama-server: ``LLAMA_API_KEY``; the python engine: ``GGUF_EXACT_API_KEY``) and no
    key at all when none was given (a key in the caller's environment is not inherited
    by the servers ``tune`` and ``bench`` start for themselves)."""
    env = {k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, LLAMA_SERVER_KEY_ENV)}
    if launch.api_key:
        env[LLAMA_SERVER_KEY_ENV if launch.engine == "llama-server" else API_KEY_ENV] = launch.api_key
    return env


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


def _read_state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


# What ``status`` and ``stop`` read from server.json, with the JSON types it must have.
STATE_FIELDS = {"pid": int, "port": int, "url": str, "target": str}
STATE_OPTIONAL = {"start_time": int, "engine": str, "drafter": str, "command": list}


def read_state(run_dir: Path) -> dict:
    """``server.json`` of a run, checked: one line naming the file and what is wrong with
    it (not JSON, not an object, a field missing or of the wrong type)."""
    path = run_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ServerError(
            f"{path}: not a readable server state ({type(err).__name__}: {err}); remove {run_dir} and start the server again"
        ) from None
    if not isinstance(state, dict):
        raise ServerError(
            f"{path}: a JSON {type(state).__name__}, not an object; remove {run_dir} and start the server again"
        )
    for key, kind in (STATE_FIELDS | STATE_OPTIONAL).items():
        value = state.get(key)
        if value is None and key in STATE_OPTIONAL:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            got = "missing" if key not in state else f"{value!r}"
            raise ServerError(
                f"{path}: field {key} is {got}, expected a JSON {'number' if kind is int else kind.__name__.replace('str', 'string').replace('list', 'array')}; "
                f"remove {run_dir} and start the server again"
            )
    return state


def _alive(pid: int, start_time: int | None) -> bool:
    """The process ``pid`` exists, has not exited (no zombie) and, where /proc tells
    and ``start_time`` is known, started at ``start_time``: not a reused pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False  # a zombie: it has exited
    except (OSError, IndexError):
        pass
    now = process_start_time(pid)
    return start_time is None or now is None or now == start_time


def is_server_process(pid: int, state: dict) -> bool:
    """``pid`` (from the pid file) is the server described by ``state`` (server.json),
    judged by its start time, whatever the executable is called (``--server-bin``)."""
    return bool(state) and pid == state.get("pid") and _alive(pid, state.get("start_time"))


def _terminate(pid: int, start_time: int | None, timeout: float = 15.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid, start_time):
            return
        time.sleep(0.1)
    if _alive(pid, start_time):
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
            raise ServerError(f"{rdir}: no server was started on port {port} by gguf-exact serve")
        return rdir
    runs = sorted(
        (p for p in root.glob("*") if (p / STATE_FILE).is_file()), key=lambda p: (p / STATE_FILE).stat().st_mtime
    )
    if not runs:
        raise ServerError(f"{root}: no server started by gguf-exact serve; start one with `gguf-exact serve`")
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
    speculation: Verdict | None = None  # is draft-mtp drafting? (:mod:`.speculation`)
    needs_key: bool = False  # the server wants an API key this call did not have (HTTP 401)

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


def server_status(
    port: int | None = None,
    root: Path | None = None,
    last: int = 5,
    probe_request: bool = False,
    api_key: str | None = None,
) -> ServerStatus:
    """Health, models, speculation, draft counters (``/metrics``) and the last
    ``last`` per-request ``draft acceptance`` lines of a server started by :func:`start_server`;
    whether draft-mtp is drafting (:func:`.speculation.judge`), over one probe request
    when ``probe_request``. ``api_key`` (default ``$GGUF_EXACT_API_KEY``): for a server
    started with one; without it only ``/health`` answers (:attr:`ServerStatus.needs_key`)."""
    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    rdir = find_run_dir(port, root)
    state = read_state(rdir)
    pid = _read_pid(rdir)
    running = bool(pid) and is_server_process(pid, state)  # type: ignore[arg-type]
    url = state["url"]
    st = ServerStatus(rdir, state, pid, running, health(url) if running else "down")
    st.recent = parse_acceptance(read_tail(rdir / LOG_FILE), last)
    if not running or st.health == "down":
        return st
    if state.get("engine") == "python":
        st.speculative = bool(state.get("drafter"))  # no /slots: drafting is on whenever a drafter is loaded
    code, body = _http(url + "/v1/models", api_key=api_key)
    if code == 401:
        st.needs_key = True
        return st
    if code == 200:
        try:
            st.models = [m.get("id", "?") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            pass
    code, body = _http(url + "/slots", api_key=api_key)
    if code == 200:
        try:
            st.speculative = any(bool(s.get("speculative")) for s in json.loads(body))
        except (ValueError, AttributeError):
            pass
    code, body = _http(url + "/metrics", api_key=api_key)
    if code == 200:
        st.counters = draft_counters(parse_metrics(body))
    st.speculation = speculation_verdict(st, probe_request, api_key)
    return st


def speculation_verdict(st: ServerStatus, probe_request: bool = False, api_key: str | None = None) -> Verdict:
    """Whether a running server is drafting: from a probe request's draft tokens, or the
    counters since start, ``/slots`` and the log (:func:`.speculation.judge`)."""
    state = st.state
    engine = state.get("engine") or "llama-server"
    drafted = accepted = None
    if probe_request:
        drafted, accepted = probe(state["url"], api_key=api_key)
    elif st.counters is not None:
        drafted, accepted = st.counters.draft_tokens, st.counters.accepted_tokens
    return judge(
        drafter=bool(state.get("drafter")),
        command=list(state.get("command") or []),
        slots_speculative=st.speculative if engine == "llama-server" else None,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        log_text=read_tail(st.run_dir / LOG_FILE),
        probed=probe_request,
        engine=engine,
    )


def stop_server(port: int | None = None, root: Path | None = None, timeout: float = 15.0) -> str:
    """Stop a server started by :func:`start_server` (SIGTERM, then SIGKILL after
    ``timeout``); returns what happened, in one line."""
    rdir = find_run_dir(port, root)
    state = read_state(rdir)
    pid = _read_pid(rdir)
    where = f"{server_label(state.get('engine'))} on port {state['port']}"
    if pid is None:
        return f"{where} is not running (no pid file in {rdir})"
    if not is_server_process(pid, state):
        (rdir / PID_FILE).unlink(missing_ok=True)
        reused = " (that pid now belongs to another process, left alone)" if _alive(pid, None) else ""
        return f"{where} (pid {pid}) is not running: it exited or was killed{reused}; removed its pid file"
    _terminate(pid, state.get("start_time"), timeout)
    (rdir / PID_FILE).unlink(missing_ok=True)
    return f"stopped {where} (pid {pid})"
