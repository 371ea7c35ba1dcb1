"""``status`` and ``stop`` of a server started by :func:`~gguf_exact.engines.launch.start_server` (either engine).

:func:`server_status` reads the run folder (:mod:`.process`), asks the server over HTTP
(:mod:`.http`: ``/health``, ``/v1/models``, ``/slots``, ``/metrics``) and judges whether
draft-mtp is drafting (:mod:`.speculation`); :func:`stop_server` stops it by its pid
and start time, never a process that has since been given its pid.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gguf_exact import constants
from gguf_exact.engines.shared.http import get_text, health
from gguf_exact.engines.shared.policy_snapshot import PolicySnapshot, parse_snapshot
from gguf_exact.engines.shared.process import (
    alive,
    find_run_dir,
    is_server_process,
    process_state,
    read_pid,
    read_state,
    read_tail,
    terminate,
)
from gguf_exact.engines.shared.rpc_probe import WorkerReport, client_connected, probe_worker, worker_devices_logged
from gguf_exact.engines.shared.rpc_watch import (
    DEFAULT_RPC_TIMEOUT_S,
    RPC_TIMEOUT_ENV,
    STOPPED_STATES,
    check_worker,
    stopped_report,
    stopped_worker,
)
from gguf_exact.engines.shared.settings import CONSOLE_FILE, LOG_FILE, PID_FILE, RPC_ENGINE, STATE_FILE
from gguf_exact.engines.shared.speculation import Verdict, judge, probe
from gguf_exact.engines.shared.stats import Acceptance, DraftCounters, draft_counters, parse_acceptance, parse_metrics


def server_label(engine: str | None) -> str:
    """How messages name a server of ``engine``."""
    if engine == RPC_ENGINE:
        return "rpc-server worker"
    return "llama-server" if engine in (None, "llama-server") else f"{engine} engine server"


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
    policy: PolicySnapshot | None = None  # spec-draft-adaptive: the length chosen, acceptance by depth, costs
    recent: list[Acceptance] = field(default_factory=list)
    speculation: Verdict | None = None  # is draft-mtp drafting? (:mod:`.speculation`)
    needs_key: bool = False  # the server wants an API key this call did not have (HTTP 401)
    stopped: float | None = None  # when ``gguf-exact stop`` stopped it (server.json ``stopped``), else None
    worker: WorkerReport | None = None  # an RPC worker: what it answered (health: ok, busy, down, wrong)
    worker_devices: list[str] = field(default_factory=list)  # an RPC worker's devices, as it logged them
    # a llama-server's --rpc workers: when it is down, each one's report; while it runs, those
    # known not to answer (a stopped worker of this machine), without connecting to any
    rpc_workers: list[WorkerReport] = field(default_factory=list)
    gave_up_after: int | None = None  # seconds llama-server waited on a silent worker before it exited (its log)

    @property
    def down_reason(self) -> str:
        """Why a server that is not running is down, in a few words."""
        if self.stopped is not None:
            return (
                "stopped (by gguf-exact stop at "
                + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.stopped))
                + ")"
            )
        gone = [w.line() for w in self.rpc_workers if w.state == "down"]
        if gone:  # llama.cpp's RPC backend aborts the server when a worker goes away
            return f"process not running: an RPC worker it used is gone ({'; '.join(gone)})"
        silent = [w.line() for w in self.rpc_workers if not w.ok]
        if silent or self.gave_up_after is not None:  # patch 42r: it gives up on a worker silent that long
            waited = (
                f" after {self.gave_up_after} s without an answer ({RPC_TIMEOUT_ENV})" if self.gave_up_after else ""
            )
            which = f" ({'; '.join(silent)})" if silent else ""
            return f"process not running: an RPC worker it used stopped answering{which}; llama-server gave up on it{waited}"
        return "process not running (exited or killed)"

    @property
    def up(self) -> bool:
        return self.running and self.health in ("ok", "busy")  # busy: an RPC worker serving its head

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
    probe_timeout: float | None = None,
) -> ServerStatus:
    """Health, models, speculation, draft counters (``/metrics``) and the last
    ``last`` per-request ``draft acceptance`` lines of a server started by ``start_server``;
    whether draft-mtp is drafting (:func:`.speculation.judge`), over one probe request
    when ``probe_request``. ``api_key`` (default ``$GGUF_EXACT_API_KEY``): for a server
    started with one; without it only ``/health`` answers (:attr:`ServerStatus.needs_key`)."""
    api_key = api_key or constants.api_key()
    rdir = find_run_dir(port, root)
    state = read_state(rdir)
    pid = read_pid(rdir)
    running = pid is not None and pid != 0 and is_server_process(pid, state)
    url = state["url"]
    if state.get("engine") == RPC_ENGINE:
        return worker_status(rdir, state, pid, running)
    st = ServerStatus(rdir, state, pid, running, health(url) if running else "down")
    _mark_stopped(st)
    workers = rpc_of_command(state.get("command") or [])
    log = read_tail(rdir / LOG_FILE)
    if not running and st.stopped is None and workers:
        st.rpc_workers = [gone_head_worker(e, rdir.parent) for e in workers]
        st.gave_up_after = rpc_gave_up_after(log + read_tail(rdir / CONSOLE_FILE))
    st.recent = parse_acceptance(log, last)  # a gone server's: the CLI shows them as past
    if not running or st.health == "down":
        return st
    # llama-server's /health stays ok while a worker is stopped; its /slots and /metrics wait on it
    st.rpc_workers = [r for r in (stopped_worker(e, rdir.parent) for e in workers) if r is not None]
    if st.rpc_workers:  # whatever /health said (ok, loading): the worker is what to fix
        st.health = (
            f"rpc worker {'; '.join(w.line() for w in st.rpc_workers)}: requests wait on it until llama-server "
            f"gives up ({RPC_TIMEOUT_ENV} s without an answer, default {DEFAULT_RPC_TIMEOUT_S}) and exits"
        )
        return st
    if state.get("engine") == "python":
        st.speculative = bool(state.get("drafter"))  # no /slots: drafting is on whenever a drafter is loaded
    code, body = get_text(url + "/v1/models", api_key=api_key)
    if code == 401:
        st.needs_key = True
        return st
    if code == 200:
        try:
            st.models = [m.get("id", "?") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            pass
    code, body = get_text(url + "/slots", api_key=api_key)
    if code == 200:
        try:
            st.speculative = any(bool(s.get("speculative")) for s in json.loads(body))
        except (ValueError, AttributeError):
            pass
    code, body = get_text(url + "/metrics", api_key=api_key)
    if code == 200:
        figures = parse_metrics(body)
        st.counters = draft_counters(figures)
        st.policy = parse_snapshot(figures)
    st.speculation = speculation_verdict(st, probe_request, api_key, probe_timeout)
    return st


def _mark_stopped(st: ServerStatus) -> None:
    stopped = st.state.get("stopped")
    if not st.running and isinstance(stopped, (int, float)) and not isinstance(stopped, bool):
        st.stopped = float(stopped)


def rpc_of_command(command: list) -> list[str]:
    """The ``--rpc`` workers of a llama-server command line."""
    for flag, value in zip(command, command[1:]):
        if flag == "--rpc":
            return [e for e in str(value).split(",") if e]
    return []


def gone_head_worker(endpoint: str, root: Path) -> WorkerReport:
    """A worker of a llama-server that is gone: stopped (this machine's), else its probe's answer,
    where ``busy`` now means hung or serving someone else (its head no longer holds it)."""
    report = check_worker(endpoint, root, timeout=1.0)
    if report.state == "busy":
        report.detail = "accepts but does not answer within 1 s though the server that used it is gone: hung, or serving another client"
    return report


def rpc_gave_up_after(log: str) -> int | None:
    """The seconds in patch 42r's line of a llama-server log (``RPC server sent nothing within
    N s (GGML_RPC_TIMEOUT) ...``), or None."""
    found = re.findall(rf"RPC server \w+ nothing within (\d+) s \({RPC_TIMEOUT_ENV}\)", log)
    return int(found[-1]) if found else None


def still_serving(console_file: Path, wait: float = 1.0) -> bool:
    """Whether a worker's console says a client is connected, and still does after ``wait``
    seconds: a client that has just left (a probe's connection the worker took from its queue once
    its head went) is closed by then."""
    deadline = time.monotonic() + wait
    while client_connected(read_tail(console_file)):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def worker_status(rdir: Path, state: dict, pid: int | None, running: bool) -> ServerStatus:
    """An RPC worker's status: its process (stopped: it answers nothing), and its answer to the
    hello, or ``busy`` while its console says a head is connected (a worker serves one client at
    a time: a probe would only wait in its queue, and fill it: it holds two), its devices as it
    logged them."""
    console = read_tail(rdir / CONSOLE_FILE)
    st = ServerStatus(rdir, state, pid, running, "down", worker_devices=worker_devices_logged(console))
    _mark_stopped(st)
    if running and pid is not None:  # running: its pid is known
        endpoint = state["url"].removeprefix("rpc://")
        if process_state(pid) in STOPPED_STATES:
            st.worker = stopped_report(endpoint, pid)
        elif still_serving(rdir / CONSOLE_FILE):
            st.worker = WorkerReport(
                endpoint, "busy", detail="serving its client (a llama-server); it answers others once that one leaves"
            )
        else:
            st.worker = probe_worker(endpoint, timeout=1.0)
        st.health = st.worker.state
    return st


def speculation_verdict(
    st: ServerStatus, probe_request: bool = False, api_key: str | None = None, probe_timeout: float | None = None
) -> Verdict:
    """Whether a running server is drafting: from a probe request's draft tokens (waiting
    ``probe_timeout`` seconds for it, default :func:`.speculation.probe`'s), or the counters
    since start, ``/slots`` and the log (:func:`.speculation.judge`)."""
    state = st.state
    engine = state.get("engine") or "llama-server"
    drafted = accepted = None
    if probe_request:
        drafted, accepted = probe(
            state["url"], api_key=api_key, **({"timeout": probe_timeout} if probe_timeout else {})
        )
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
    """Stop a server started by ``start_server`` (SIGTERM, then SIGKILL after
    ``timeout``); returns what happened, in one line. Stopping nothing is not an error:
    no server started on ``port`` (or none at all) is one line saying nothing is running.
    A clean stop is recorded in server.json (``stopped``), for ``status``."""
    root = root or constants.run_root()
    if port is not None and not (root / str(port) / STATE_FILE).is_file():
        return f"nothing is running on port {port} (no server was started there by gguf-exact serve)"
    if port is None and not any((p / STATE_FILE).is_file() for p in root.glob("*")):
        return "nothing is running (no server was started by gguf-exact serve)"
    rdir = find_run_dir(port, root)
    state = read_state(rdir)
    pid = read_pid(rdir)
    where = f"{server_label(state.get('engine'))} on port {state['port']}"
    if pid is None:
        how = "stopped by gguf-exact stop" if state.get("stopped") is not None else f"no pid file in {rdir}"
        return f"{where} is not running ({how})"
    if not is_server_process(pid, state):
        (rdir / PID_FILE).unlink(missing_ok=True)
        reused = " (that pid now belongs to another process, left alone)" if alive(pid, None) else ""
        return f"{where} (pid {pid}) is not running: it exited or was killed{reused}; removed its pid file"
    terminate(pid, state.get("start_time"), timeout)
    mark_stopped(rdir, state)
    (rdir / PID_FILE).unlink(missing_ok=True)
    return f"stopped {where} (pid {pid})"


def mark_stopped(rdir: Path, state: dict) -> None:
    """Record in server.json that ``stop`` stopped the server (a new ``serve`` rewrites it)."""
    path = rdir / STATE_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({**state, "stopped": time.time()}, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


__all__ = [
    "ServerStatus",
    "gone_head_worker",
    "rpc_gave_up_after",
    "rpc_of_command",
    "server_label",
    "server_status",
    "speculation_verdict",
    "stop_server",
    "worker_status",
]
