"""Ask an RPC worker (llama.cpp's ``rpc-server``) what it holds, over its own protocol.

The protocol (``ggml/src/ggml-rpc/ggml-rpc.cpp`` at the pinned commit, version
:data:`PROTOCOL_MAJOR`): a request is one command byte, a little-endian ``u64`` size and
that many bytes; an answer is a ``u64`` size and its bytes. The first command of a
connection must be ``HELLO`` (24 zero bytes of transport capabilities: plain TCP) and is
answered with the worker's version; then ``DEVICE_COUNT`` and ``GET_DEVICE_MEMORY`` (free
and total bytes of one device). The protocol carries no device names: a head names
them ``RPC0``, ``RPC1``, ... in ``--rpc`` order.

An ``rpc-server`` serves **one client at a time**: while a llama-server is connected, a
new connection is accepted by the kernel but not answered. So every probe is bounded (a
connect and a read timeout) and reports ``busy`` for a worker that accepts and stays
silent, instead of waiting for the head to leave. Nothing here raises for the network:
:func:`probe_worker` returns what it found; :func:`require_workers` turns an unreachable
worker into one line.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from gguf_exact.engines.shared.settings import DEFAULT_RPC_PORT
from gguf_exact.errors import ArgumentError, Param, ServerError

PROTOCOL_MAJOR = 7  # RPC_PROTO_MAJOR_VERSION in ggml-rpc.h at the pinned commit
CMD_GET_DEVICE_MEMORY, CMD_HELLO, CMD_DEVICE_COUNT = 11, 14, 15  # enum rpc_cmd
CONN_CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: zeros ask for plain TCP
PROBE_TIMEOUT = 3.0  # seconds for the connect and for each answer
MAX_DEVICES = 16  # more than any worker exposes; a larger count is not an rpc-server's answer


RPC_PARAM = Param("rpc")  # the option an endpoint came from, unless a caller names another


def parse_endpoint(text: str, what: Param | str = RPC_PARAM) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port); one line naming ``what`` otherwise."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ArgumentError(
            what, f" {text!r}: expected HOST:PORT (an rpc-server's address, e.g. 127.0.0.1:{DEFAULT_RPC_PORT})"
        )
    return host, int(port)


def parse_endpoints(text: str | tuple[str, ...] | list[str], what: Param | str = RPC_PARAM) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]`` (or a list of them) as checked ``HOST:PORT`` strings, in order."""
    items = text.split(",") if isinstance(text, str) else [p for t in text for p in str(t).split(",")]
    out = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, port = parse_endpoint(item, what)
        name = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if name in out:
            raise ArgumentError(what, f" {name} is given twice: each worker once")
        out.append(name)
    if not out:
        raise ArgumentError(what, f" {text!r}: expected HOST:PORT[,HOST:PORT...]")
    return tuple(out)


@dataclass(frozen=True)
class WorkerDevice:
    index: int  # the device's index on its worker
    free: int  # bytes
    total: int


@dataclass
class WorkerReport:
    """What one probe of a worker found. ``state``: ``ok`` (it answered), ``busy`` (it
    accepted but did not answer: serving another client), ``down`` (nothing listens or
    the address does not resolve), ``wrong`` (something answered, not an rpc-server of
    this protocol), ``stopped`` (a worker of this machine whose process is stopped, seen
    without a connection: :func:`.rpc_worker.stopped_worker`)."""

    endpoint: str
    state: str
    version: str | None = None
    devices: list[WorkerDevice] = field(default_factory=list)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def line(self) -> str:
        """One line: the worker, its state, and its devices' memory."""
        if self.ok:
            devs = ", ".join(
                f"device {d.index}: {d.free / 2**20:,.0f} MiB free of {d.total / 2**20:,.0f} MiB" for d in self.devices
            )
            return f"{self.endpoint}: rpc-server, protocol {self.version}, {len(self.devices)} device(s): {devs}"
        return f"{self.endpoint}: {self.state} ({self.detail})"


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return data


def _call(sock: socket.socket, cmd: int, payload: bytes, answer_size: int) -> bytes:
    sock.sendall(bytes([cmd]) + struct.pack("<Q", len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != answer_size:
        raise ValueError(f"answer of {size} bytes to command {cmd}, expected {answer_size}")
    return _recv_exact(sock, size)


def probe_worker(endpoint: str, timeout: float = PROBE_TIMEOUT) -> WorkerReport:
    """Hello, device count and each device's memory from the worker at ``endpoint``
    (``HOST:PORT``), within ``timeout`` seconds per step; never raises for the network."""
    host, port = parse_endpoint(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.timeout:
        return WorkerReport(endpoint, "down", detail=f"no answer to connect within {timeout:.0f} s")
    except OSError as err:
        return WorkerReport(endpoint, "down", detail=err.strerror or type(err).__name__)
    with sock:
        try:
            hello = _call(sock, CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
        except socket.timeout:
            return WorkerReport(
                endpoint, "busy", detail=f"accepts but does not answer within {timeout:.0f} s: it serves one client "
                "at a time, and one (a llama-server) is connected",
            )  # fmt: skip
        except (OSError, ValueError) as err:
            return WorkerReport(endpoint, "wrong", detail=f"not an rpc-server's hello ({err})")
        major, minor, patch = hello[0], hello[1], hello[2]
        version = f"{major}.{minor}.{patch}"
        if major != PROTOCOL_MAJOR:
            return WorkerReport(
                endpoint, "wrong", version,
                detail=f"RPC protocol {version}, this build speaks {PROTOCOL_MAJOR}.x: run the same llama.cpp on both",
            )  # fmt: skip
        try:
            (count,) = struct.unpack("<I", _call(sock, CMD_DEVICE_COUNT, b"", 4))
            if count > MAX_DEVICES:
                raise ValueError(f"{count} devices")
            devices = []
            for i in range(count):
                free, total = struct.unpack("<QQ", _call(sock, CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16))
                devices.append(WorkerDevice(i, free, total))
        except (OSError, ValueError) as err:
            return WorkerReport(endpoint, "wrong", version, detail=f"answered hello, then not as rpc-server ({err})")
    return WorkerReport(endpoint, "ok", version, devices)


def require_workers(
    endpoints: tuple[str, ...],
    timeout: float = PROBE_TIMEOUT,
    check: Callable[[str, float], WorkerReport] = probe_worker,
) -> list[WorkerReport]:
    """Every worker's report (``check(endpoint, timeout)``: the probe, or
    :func:`.rpc_worker.check_worker`, which also sees a stopped worker of this machine); one line
    for the first that is not there to serve (llama-server would abort on it at load: ``RPC
    handshake failed``)."""
    reports = [check(e, timeout) for e in endpoints]
    for r in reports:
        if not r.ok:
            hint = {
                "down": (
                    f"start it with `gguf-exact rpc-server --port {r.endpoint.rpartition(':')[2]}` on that machine",
                ),
                "busy": ("another llama-server is using it: stop that one first, or start another worker",),
                "wrong": ("give ", Param("rpc"), " the address of an rpc-server of this build"),
                "stopped": ("resume it, or stop it and start another",),
            }[r.state]
            raise ServerError(f"rpc worker {r.line()}; ", *hint)
    return reports


def worker_devices_logged(console: str) -> list[str]:
    """The devices a worker listed when it started (its console: ``  CPU: AMD EPYC ... (N MiB, M MiB
    free)`` under ``Devices:``): names and descriptions, which the protocol does not carry."""
    lines = console.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == "Devices:"), None)
    if start is None:
        return []
    out = []
    for ln in lines[start + 1 :]:
        if not ln.startswith("  ") or not ln.endswith(" MiB free)"):
            break
        out.append(ln.strip())
    return out


def client_connected(console: str) -> bool:
    """Whether the worker's console says a client is connected now (its last connection line)."""
    marks = [ln for ln in console.splitlines() if ln in ("Accepted client connection", "Client connection closed")]
    return bool(marks) and marks[-1] == "Accepted client connection"


__all__ = [
    "PROTOCOL_MAJOR",
    "WorkerDevice",
    "WorkerReport",
    "client_connected",
    "parse_endpoint",
    "parse_endpoints",
    "probe_worker",
    "require_workers",
    "worker_devices_logged",
]
