"""A worker that stopped answering, told apart from a busy one.

An ``rpc-server`` serves one client at a time, so a probe's connection to a worker serving a
head waits in its queue unanswered (:func:`.rpc_probe.probe_worker`: ``busy``): it cannot tell
busy from hung, and it should not be tried while a head is connected. What can tell them apart:

* a worker of this machine, started by ``gguf-exact rpc-server``, is found by its run folder
  (:func:`local_worker_pid`) and its process state read, with no connection
  (:func:`stopped_worker`: ``T``, stopped by a signal or a debugger);
* for any worker, the head's own connection: the carried patch 42r gives llama-server's sockets to
  its workers a bound (:data:`RPC_TIMEOUT_ENV` seconds without progress, default
  :data:`DEFAULT_RPC_TIMEOUT_S`), after which it exits as when a worker is killed, its log saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gguf_exact import constants
from gguf_exact.engines.shared.process import is_server_process, process_state, read_pid, read_state
from gguf_exact.engines.shared.rpc_probe import PROBE_TIMEOUT, WorkerReport, parse_endpoint, probe_worker
from gguf_exact.engines.shared.settings import RPC_ENGINE, STATE_FILE, is_loopback
from gguf_exact.errors import GgufExactError

RPC_TIMEOUT_ENV = "GGML_RPC_TIMEOUT"  # patch 42r: llama-server's seconds without an answer from a worker
DEFAULT_RPC_TIMEOUT_S = 120  # the patch's default, when the variable is unset
STOPPED_STATES = ("T", "t")  # /proc state: stopped by a signal (SIGSTOP, Ctrl-Z), by a debugger
WILDCARD_HOSTS = ("0.0.0.0", "::")


def _same_host(bound: str, asked: str) -> bool:
    return bound == asked or bound in WILDCARD_HOSTS or (is_loopback(bound) and is_loopback(asked))


def local_worker_pid(endpoint: str, root: Path | None = None) -> int | None:
    """The pid of the ``gguf-exact rpc-server`` running on this machine at ``endpoint``, from
    its run folder under ``root`` (default: the run root); None when there is none."""
    host, port = parse_endpoint(endpoint)
    rdir = (root or constants.run_root()) / str(port)
    if not (rdir / STATE_FILE).is_file():
        return None
    try:
        state = read_state(rdir)
    except GgufExactError:
        return None
    pid = read_pid(rdir)
    if state.get("engine") != RPC_ENGINE or not pid or not _same_host(str(state.get("host")), host):
        return None
    return pid if is_server_process(pid, state) else None


def stopped_report(endpoint: str, pid: int) -> WorkerReport:
    return WorkerReport(
        endpoint, "stopped",
        detail=f"not answering: its process (pid {pid}, on this machine) is stopped by a signal or a debugger; "
        f"`kill -CONT {pid}` resumes it",
    )  # fmt: skip


def stopped_worker(endpoint: str, root: Path | None = None) -> WorkerReport | None:
    """A report saying the worker at ``endpoint`` is stopped, when it is this machine's
    ``gguf-exact rpc-server`` and its process is (``T``/``t``); else None. Never connects,
    so it disturbs no head the worker serves."""
    pid = local_worker_pid(endpoint, root)
    if pid is not None and process_state(pid) in STOPPED_STATES:
        return stopped_report(endpoint, pid)
    return None


def check_worker(endpoint: str, root: Path | None = None, timeout: float = PROBE_TIMEOUT) -> WorkerReport:
    """:func:`stopped_worker`'s report, else the protocol's probe (:func:`.rpc_probe.probe_worker`)."""
    return stopped_worker(endpoint, root) or probe_worker(endpoint, timeout)


def worker_checker(root: Path | None) -> Callable[[str, float], WorkerReport]:
    """:func:`check_worker` for the workers of the run root ``root``, as ``require_workers`` calls it."""
    return lambda endpoint, timeout: check_worker(endpoint, root, timeout)


__all__ = [
    "DEFAULT_RPC_TIMEOUT_S",
    "RPC_TIMEOUT_ENV",
    "STOPPED_STATES",
    "check_worker",
    "local_worker_pid",
    "stopped_report",
    "stopped_worker",
    "worker_checker",
]
