"""Serving over llama.cpp's RPC backend on loopback: two `gguf-exact rpc-server` workers (CPU)
and `gguf-exact serve --rpc` with draft-mtp on the tiny hidden-state pair.

One module, few servers (CI runs it on 2 cores): the workers once; llama-server once on
this machine alone, once over the workers (through the CLI, in the foreground, as a user
runs it). Over the workers the target's text is the one-machine run's, greedy and seeded,
with the same drafts accepted; each worker's buffers are what the plan says; a worker
killed in the middle of a request gives the client an error and `serve` and `status`
one line each, within bounded time.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest
from _llama_server import TEST_SETTINGS, free_port, get_json, post_json, server_binary
from helpers import status_lines

from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.logged_buffers import logged_buffers
from gguf_exact.engines.rpc_worker import plan_worker, start_worker
from gguf_exact.engines.serve import plan_serve
from gguf_exact.engines.shared.memory_plan import MIB
from gguf_exact.engines.shared.process import read_pid
from gguf_exact.engines.shared.rpc_probe import CMD_HELLO, CONN_CAPS_SIZE, probe_worker
from gguf_exact.engines.shared.settings import CONSOLE_FILE, LOG_FILE, ServeSettings, WorkerSettings
from gguf_exact.engines.shared.status import server_status, stop_server
from gguf_exact.tiny.pairs import write_runner_pairs

pytestmark = [pytest.mark.llama_server]

PROMPTS = ("def f(x): return x + 1", "the quick brown fox")
SEEDED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 11}
SPLIT = (*TEST_SETTINGS, "tensor-split=1,1", "log-verbosity=4")  # equal shares; buffers in the log
BOUND = 60  # seconds: no step of this module may wait longer
RPC_TIMEOUT = 4  # seconds the head waits on a silent worker (GGML_RPC_TIMEOUT, patch 42r)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    server_binary()
    root = tmp_path_factory.mktemp("rpc")
    target, drafter = write_runner_pairs(root / "pairs")["hidden"]
    runs = root / "run"
    ports = []
    while len(ports) < 2:
        p = free_port()
        ports.append(p) if p not in ports else None
    for port in ports:
        start_worker(plan_worker(WorkerSettings(profile="cpu", port=port, threads=1, runs=runs)), detach=True)
    endpoints = tuple(f"127.0.0.1:{p}" for p in ports)
    yield {"root": root, "runs": runs, "target": target, "drafter": drafter, "ports": ports, "endpoints": endpoints}
    for port in ports:
        stop_server(port, runs)


def answers(url: str) -> list[dict]:
    out = []
    for prompt in PROMPTS:
        for sampling in ({"temperature": 0}, SEEDED):
            body = {"prompt": prompt, "n_predict": 32, "return_tokens": True, "cache_prompt": False, "ignore_eos": True}
            out.append(post_json(url + "/completion", body | sampling))
    return out


def wait_health(url: str, proc: subprocess.Popen, err: Path) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < BOUND:
        assert proc.poll() is None, err.read_text()[-3000:]
        try:
            if get_json(url + "/health") == {"status": "ok"}:
                return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"not healthy in {BOUND} s: {err.read_text()[-2000:]}")


def test_over_two_workers_the_text_acceptance_and_buffers_are_as_planned_and_a_lost_worker_is_one_line(setup):
    s, env = setup, dict(os.environ, GGUF_EXACT_RUN_DIR=str(setup["runs"]), GGML_NO_BACKTRACE="1")
    # this machine alone: the reference
    alone = plan_launch(ServeSettings(s["target"], s["drafter"], "cpu", TEST_SETTINGS, port=free_port(), runs=s["root"] / "one"))
    start_server(alone, detach=True, timeout=BOUND)
    try:
        want = answers(alone.url)
    finally:
        stop_server(alone.port, s["root"] / "one")

    # the plan serve prints, from the workers' answers (they are idle: one client at a time)
    port = free_port()
    settings = ServeSettings(s["target"], s["drafter"], "cpu", SPLIT, port=port, rpc=s["endpoints"], runs=s["runs"])
    plan = plan_serve(settings)
    assert [w.state for w in plan.workers] == ["ok", "ok"]
    assert plan.devices.draft_device == "RPC1"  # the tiny target's cached layers 3 and 4 are on the second worker
    cmd = plan.launch.command
    assert cmd[cmd.index("--rpc") + 1] == ",".join(s["endpoints"]) and cmd[cmd.index("--spec-draft-device") + 1] == "RPC1"

    # serve --rpc in the foreground, as a user runs it
    out, err = s["root"] / "serve.out", s["root"] / "serve.err"
    sets = [a for x in SPLIT for a in ("--set", x)]
    argv = [sys.executable, "-m", "gguf_exact.cli", "serve", "--model", str(s["target"]), "--draft", str(s["drafter"]),
            "--profile", "cpu", "--port", str(port), "--rpc", ",".join(s["endpoints"]), *sets]  # fmt: skip
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen(argv, stdout=fo, stderr=fe, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc, err)
        got = answers(url)
        printed = out.read_text()
        assert "memory plan over devices (layers split by tensor-split" in printed
        assert "drafter on RPC1: it reads the caches of target layers 3, 4" in printed

        # the target's text and the drafts accepted: as on one machine, greedy and seeded
        assert [g["tokens"] for g in got] == [w["tokens"] for w in want]
        for g, w in zip(got, want):
            assert (g["timings"]["draft_n"], g["timings"]["draft_n_accepted"]) == (
                w["timings"]["draft_n"], w["timings"]["draft_n_accepted"]
            )  # fmt: skip
        assert sum(g["timings"]["draft_n_accepted"] for g in got) > 0

        # each worker's buffers as the plan says, within 10% (names: RPC<device>[HOST:PORT])
        models = logged_buffers((s["runs"] / str(port) / LOG_FILE).read_text())
        for i, endpoint in enumerate(s["endpoints"]):
            share, name = plan.devices.shares[i], f"RPC0[{endpoint}]"
            logged = models[0].weights[name] * MIB, models[0].kv[name] * MIB
            assert abs(logged[0] - share.weights) <= 0.1 * share.weights, (name, logged, share)
            assert abs(logged[1] - share.kv) <= 0.1 * share.kv, (name, logged, share)
            drafter_logged = models[1].weights.get(name, 0.0) * MIB
            # compute buffers are an estimate (llama.cpp sizes them from the worst-case graph): within 2x
            compute = models[0].compute[name] * MIB
            assert 0.5 * compute <= share.compute <= 2 * compute, (name, compute, share.compute)
            assert abs(drafter_logged - share.drafter_weights) <= 0.1 * max(share.drafter_weights, 1), (name, drafter_logged)

        # a worker killed while a request streams: the client gets an error, serve one line, status one line
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=BOUND)
        body = {"prompt": "the quick brown fox", "n_predict": 400, "stream": True, "ignore_eos": True, "temperature": 0}
        conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")  # it is generating
        worker = s["runs"] / str(s["ports"][1])
        os.kill(read_pid(worker), signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises((http.client.HTTPException, OSError, AssertionError)):
            while True:  # the stream breaks off before its end
                line = resp.readline()
                assert line, "stream ended"
                assert b'"stop":true' not in line, "the request finished"
        assert time.monotonic() - t0 < BOUND
        proc.wait(timeout=BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    last = [ln for ln in err.read_text().splitlines() if ln.strip()][-1]
    assert proc.returncode == 1
    assert last.startswith(f"error: llama-server exited with code -{signal.SIGABRT}: RPC worker {s['endpoints'][1]}: down"), last
    assert last.endswith("start the worker again, then serve again")

    st = server_status(port, s["runs"])
    assert not st.up and st.down_reason.startswith(f"process not running: an RPC worker it used is gone ({s['endpoints'][1]}: down")
    gone = server_status(s["ports"][1], s["runs"])
    assert not gone.running and gone.down_reason == "process not running (exited or killed)"
    kept = server_status(s["ports"][0], s["runs"])
    assert kept.up and kept.worker.ok and kept.worker_devices and kept.worker_devices[0].startswith("CPU: ")
    assert "Accepted client connection" in (s["runs"] / str(s["ports"][0]) / CONSOLE_FILE).read_text()


def test_rpc_server_from_the_command_line_detached_seen_by_status_ended_by_stop(tmp_path):
    from helpers import cli

    server_binary()
    env = dict(os.environ, GGUF_EXACT_RUN_DIR=str(tmp_path))
    port = free_port()
    r = cli("rpc-server", "--port", str(port), "--threads", "1", "--detach", env=env)
    assert r.returncode == 0, r.stderr
    assert f"rpc-server ready at 127.0.0.1:{port}" in r.stdout and f"serve --rpc 127.0.0.1:{port}" in r.stdout
    assert f"--host 127.0.0.1 --port {port} --threads 1" in r.stdout
    st = cli("status", "--port", str(port), env=env)
    assert st.returncode == 0, st.stdout + st.stderr
    lines = st.stdout.splitlines()
    assert lines[0].startswith(f"worker       127.0.0.1:{port}  pid ") and lines[0].endswith("  up")
    assert lines[1] == "engine       rpc-server (profile cpu, build cpu)"
    assert lines[2].startswith(f"answer       127.0.0.1:{port}: rpc-server, protocol 7.0.0, 1 device(s): device 0: ")
    assert any(ln.startswith("device       CPU: ") for ln in lines)
    again = cli("rpc-server", "--port", str(port), env=env)  # the port is taken: one line
    assert again.returncode == 1 and again.stderr.startswith(f"error: port {port} on 127.0.0.1 is in use")
    stop = cli("stop", "--port", str(port), env=env)
    assert stop.stdout.startswith(f"stopped rpc-server worker on port {port} (pid ")
    down = cli("status", "--port", str(port), env=env)
    assert down.returncode == 1 and "down: stopped (by gguf-exact stop at " in down.stdout


def hello(endpoint: str) -> socket.socket:
    """A client that said hello to the worker and holds it, as a head does."""
    host, port = endpoint.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(bytes([CMD_HELLO]) + struct.pack("<Q", CONN_CAPS_SIZE) + bytes(CONN_CAPS_SIZE))
    (size,) = struct.unpack("<Q", sock.recv(8, socket.MSG_WAITALL))
    assert len(sock.recv(size, socket.MSG_WAITALL)) == size
    return sock


def test_a_worker_probed_while_it_serves_outlives_its_client(tmp_path):
    """Issue 41: a probe that timed out on a busy worker (`status --port W`, `doctor --rpc`) left
    its hello in the worker's queue; answered once the head left, to a closed connection, it
    killed the worker by SIGPIPE. The worker ignores SIGPIPE, and its status does not connect
    while its console says it serves."""
    server_binary()
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    start_worker(plan_worker(WorkerSettings(profile="cpu", port=port, threads=1, runs=tmp_path)), detach=True)
    pid = read_pid(tmp_path / str(port))
    try:
        head = hello(endpoint)
        assert probe_worker(endpoint, timeout=0.5).state == "busy"  # its hello waits in the queue
        st = server_status(port, tmp_path)
        assert st.health == "busy" and st.worker.detail.startswith("serving its client (a llama-server)")
        head.close()
        time.sleep(3)  # the worker answers the queued probe, to a closed connection
        assert server_status(port, tmp_path).running, (tmp_path / str(port) / CONSOLE_FILE).read_text()[-2000:]
        assert probe_worker(endpoint, timeout=5).ok
    finally:
        stop_server(port, tmp_path)
    assert not server_status(port, tmp_path).running and pid


def test_a_stopped_worker_is_named_by_status_and_a_request_fails_within_the_bound(tmp_path, monkeypatch):
    """Issue 42: a worker stopped (SIGSTOP) under a serving head. /health stays ok, but status
    names the worker as not answering (one line); a request gets an error within the head's
    GGML_RPC_TIMEOUT (patch 42r; here 4 s), not a hang; then the head is down for that reason."""
    from helpers import cli

    server_binary()
    target, drafter = write_runner_pairs(tmp_path / "pairs")["hidden"]
    runs = tmp_path / "run"
    wport = free_port()
    endpoint = f"127.0.0.1:{wport}"
    start_worker(plan_worker(WorkerSettings(profile="cpu", port=wport, threads=1, runs=runs)), detach=True)
    wpid = read_pid(runs / str(wport))
    monkeypatch.setenv("GGML_RPC_TIMEOUT", str(RPC_TIMEOUT))  # the head's environment: server_env passes it on
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")  # the head's abort: no debugger looking for a backtrace
    port = free_port()
    try:
        plan = plan_serve(ServeSettings(target, drafter, "cpu", TEST_SETTINGS, port=port, rpc=(endpoint,), runs=runs))
        start_server(plan.launch, detach=True, timeout=BOUND)
        url = f"http://127.0.0.1:{port}"
        assert "content" in post_json(url + "/completion", {"prompt": "abc", "n_predict": 4})  # it serves
        os.kill(wpid, signal.SIGSTOP)
        t0 = time.monotonic()
        assert get_json(url + "/health") == {"status": "ok"}  # llama-server's own health cannot tell
        st = server_status(port, runs)
        said = f"{endpoint}: stopped (not answering: its process (pid {wpid}, on this machine) is stopped"
        assert not st.up and st.running and st.health.startswith(f"rpc worker {said}"), st.health
        assert "GGML_RPC_TIMEOUT s without an answer, default 120) and exits" in st.health
        env = dict(os.environ, GGUF_EXACT_RUN_DIR=str(runs))
        shown = cli("status", "--port", str(port), env=env)
        assert shown.returncode == 1 and status_lines(shown.stdout)[0].endswith(st.health), shown.stdout
        assert server_status(wport, runs).health == "stopped"
        assert time.monotonic() - t0 < 20  # status does not wait on the worker

        body = {"prompt": "the quick brown fox", "n_predict": 64, "ignore_eos": True, "temperature": 0}
        t0 = time.monotonic()
        with pytest.raises((urllib.error.URLError, http.client.HTTPException, OSError)):
            post_json(url + "/completion", body)
        waited = time.monotonic() - t0
        assert RPC_TIMEOUT - 1 < waited < RPC_TIMEOUT + 20, waited
        deadline = time.monotonic() + 20
        while server_status(port, runs).running and time.monotonic() < deadline:
            time.sleep(0.2)
        down = server_status(port, runs)
        assert not down.running and down.gave_up_after == RPC_TIMEOUT
        assert down.down_reason.startswith(f"process not running: an RPC worker it used stopped answering ({said}")
        assert down.down_reason.endswith(f"llama-server gave up on it after {RPC_TIMEOUT} s without an answer (GGML_RPC_TIMEOUT)")
    finally:
        os.kill(wpid, signal.SIGCONT)
        stop_server(port, runs)
        stop_server(wport, runs)
