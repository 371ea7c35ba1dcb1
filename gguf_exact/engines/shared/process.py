"""The process and run-folder machinery both engines' servers use.

Each server has a run folder, ``<run root>/<port>/`` (:func:`gguf_exact.constants.run_root`):
``server.pid``, ``server.json`` (how it was started, and the process's start time:
:func:`write_state`, :func:`read_state`), ``settings.json`` (:mod:`.settings`),
``server.log`` and, when detached, ``console.log``. A server is recognised by its pid
*and* its start time (``/proc/PID/stat``), so a pid the system has since given to another
process is never taken for it. Also here: whether a port is free, and a free one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from gguf_exact import constants
from gguf_exact.engines.shared.settings import DEFAULT_HOST, PID_FILE, STATE_FILE, ServeSettings, WorkerSettings
from gguf_exact.errors import GgufExactError, Param, ServerError

LOG_TAIL_BYTES = 64 * 1024  # status reads at most this much of a server log


def run_folder(settings: ServeSettings | WorkerSettings) -> Path:
    """The run folder of the server (or RPC worker) ``settings`` describe: ``<runs>/<port>``."""
    return (settings.runs or constants.run_root()) / str(settings.port)


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


# --- ports ----------------------------------------------------------------------------


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


def check_port_free(host: str, port: int) -> None:
    if port_in_use(host, port):
        raise ServerError(
            f"port {port} on {host} is in use (`gguf-exact status --port {port}` shows if it is ours); pick another with ",
            Param("port"),
        )


def claim_run_folder(rdir: Path, host: str, port: int, what: str = "") -> None:
    """Before a start: the port free and no live process of an earlier start in ``rdir``
    (``what`` names it in the error: ``"server "``); then ``rdir`` exists."""
    check_port_free(host, port)
    old = running_pid(rdir)
    if old:
        raise ServerError(
            f"{rdir / PID_FILE}: {what}pid {old} is still running for port {port}; `gguf-exact stop --port {port}` first"
        )
    rdir.mkdir(parents=True, exist_ok=True)


# --- /proc identity -------------------------------------------------------------------


def process_start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/PID/stat field 22), or
    None where /proc cannot tell. A pid can be reused; a (pid, start time) pair cannot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_state(pid: int) -> str | None:
    """The process's state letter (/proc/PID/stat field 3: ``R`` running, ``S`` sleeping, ``T``
    stopped by a signal, ``t`` stopped by a debugger, ``Z`` zombie, ...), or None where /proc
    cannot tell."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int, start_time: int | None) -> bool:
    """The process ``pid`` exists, has not exited (no zombie) and, where /proc tells
    and ``start_time`` is known, started at ``start_time``: not a reused pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _all_threads_exited(pid):
        return False
    now = process_start_time(pid)
    return start_time is None or now is None or now == start_time


def _all_threads_exited(pid: int) -> bool:
    """Every thread of ``pid`` is a zombie (or dead). Not the leader's state alone: the main
    thread can be a zombie while others still run and hold the process's sockets, so a
    server whose leader has exited may still be listening on its port."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        tasks = [Path(f"/proc/{pid}")]
    states = []
    for task in tasks:
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # the thread ended while we looked
    return all(s in ("Z", "X") for s in states)


def is_server_process(pid: int, state: dict) -> bool:
    """``pid`` (from the pid file) is the server described by ``state`` (server.json),
    judged by its start time, whatever the executable is called (``--server-bin``)."""
    return bool(state) and pid == state.get("pid") and alive(pid, state.get("start_time"))


def terminate(pid: int, start_time: int | None, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; never a reused pid. Returns once
    every thread has exited, so the server's port is free again."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid, start_time):
            return
        time.sleep(0.1)
    if alive(pid, start_time):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        # a killed process still holds its port until its last thread has exited
        deadline = time.monotonic() + 5.0
        while alive(pid, start_time) and time.monotonic() < deadline:
            time.sleep(0.05)


# --- the run folder -------------------------------------------------------------------


def await_start(proc: subprocess.Popen, run_dir: Path, wait: Callable[[], float]) -> float:
    """``wait()``'s seconds until a just-started server is ready; if it raises (never ready,
    exited, interrupted), the process is ended and its pid file removed first, so no
    half-started server outlives the call."""
    try:
        return wait()
    except BaseException:
        if proc.poll() is None:
            terminate(proc.pid, process_start_time(proc.pid))
        (run_dir / PID_FILE).unlink(missing_ok=True)
        raise


def write_state(settings: ServeSettings, run_dir: Path, command: list[str], pid: int, detached: bool) -> None:
    """``server.json`` and ``server.pid`` of a server just started (never its API key)."""
    state = {
        "engine": settings.engine,
        "host": settings.host,
        "port": settings.port,
        "url": settings.url,
        "profile": settings.loaded_profile.name,
        "api_key": bool(settings.api_key),  # whether clients need one; the key itself is never written
        "command": command,
        "target": str(settings.target_path.resolve()),
        "drafter": str(settings.drafter_path.resolve()) if settings.drafter_path else None,
    }
    write_run_state(run_dir, state, pid, detached)


def write_run_state(run_dir: Path, state: dict, pid: int, detached: bool) -> None:
    """``server.json`` (``state`` with the process's identity) and ``server.pid`` of a process
    just started: a server, or an RPC worker (:mod:`.rpc_worker`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    state = {"pid": pid, "start_time": process_start_time(pid), "detached": detached, "started": time.time(), **state}
    (run_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    (run_dir / PID_FILE).write_text(f"{pid}\n")


def read_pid(run_dir: Path) -> int | None:
    try:
        return int((run_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


# What ``status`` and ``stop`` read from server.json, with the JSON types it must have.
STATE_FIELDS = {"pid": int, "port": int, "url": str}
STATE_OPTIONAL = {
    "start_time": int,
    "engine": str,
    "target": str,
    "drafter": str,
    "command": list,
}  # a worker has no target


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


def running_pid(run_dir: Path) -> int | None:
    """The pid of the server still running from ``run_dir`` (its pid file and a readable
    state agree), else None: a run folder whose server is gone may be used again."""
    pid = read_pid(run_dir)
    if pid is None:
        return None
    try:
        state = read_state(run_dir)
    except ServerError:
        return None
    return pid if is_server_process(pid, state) else None


def find_run_dir(port: int | None = None, root: Path | None = None) -> Path:
    """The run directory for ``port``; without one, the most recently started server's."""
    root = root or constants.run_root()
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


def last_lines(path: Path, n: int = 3) -> str:
    """The last ``n`` non-empty lines of a log, joined by `` | `` (for an error line)."""
    lines = [ln.strip() for ln in read_tail(path).splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


__all__ = [
    "LOG_TAIL_BYTES",
    "alive",
    "check_port_free",
    "find_run_dir",
    "free_port",
    "is_server_process",
    "last_lines",
    "port_in_use",
    "process_start_time",
    "process_state",
    "read_pid",
    "read_state",
    "read_tail",
    "run_folder",
    "running_pid",
    "scratch_run_root",
    "terminate",
    "write_run_state",
    "write_state",
]
