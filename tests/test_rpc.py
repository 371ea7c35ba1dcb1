"""RPC serving without a build: the build's record, the worker protocol against a fake worker,
the worker's safety rules, the per-device memory plan. (With real workers on loopback:
tests/test_rpc_loopback.py.)"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from helpers import sdist_files, status_lines

from gguf_exact import doctor
from gguf_exact.builds import llama_build
from gguf_exact.engines.shared import rpc_probe


@pytest.fixture(scope="module")
def sdist():
    return llama_build.fetch_sdist(llama_build.pinned_sdist(), log=lambda _m: None)


def test_the_build_records_its_rpc_protocol_from_the_pinned_source(sdist, tmp_path):
    src = sdist_files(sdist, {llama_build.RPC_HEADER}, tmp_path)
    record = llama_build.rpc_record(src)
    assert record == {"ggml_rpc": True, "server": "rpc-server", "protocol": "7.0.0"}
    # the probe speaks the protocol the build's header declares
    assert int(record["protocol"].split(".")[0]) == rpc_probe.PROTOCOL_MAJOR
    (src / llama_build.RPC_HEADER).write_text("#define RPC_PROTO_MAJOR_VERSION 7\n")  # minor and patch gone
    with pytest.raises(llama_build.BuildError, match="ggml-rpc.h: no RPC_PROTO_"):
        llama_build.rpc_record(src)


def test_doctor_names_the_rpc_server_a_build_holds():
    rpc = {"ggml_rpc": True, "server": "rpc-server", "protocol": "7.0.0"}
    assert doctor.describe_build({"rpc": rpc, "build_seconds": 900}) == (
        "rpc-server, GGML_RPC=ON, RPC protocol 7.0.0, built in 900 s"
    )
    # a build made before the record: its CMake arguments say so
    assert doctor.describe_build({"cmake": ["-DGGML_RPC=ON"]}) == "rpc-server, GGML_RPC=ON"
    assert doctor.describe_build({"cmake": ["-DGGML_CUDA=ON"]}) == ""


# --- the worker protocol, against a fake worker -------------------------------------------


class FakeWorker:
    """A loopback TCP server that answers as rpc-server does (``how="ok"``), with another
    protocol version (``"v6"``), not at all (``"silent"``: a worker serving another client), or
    with an answer of the wrong size (``"garbage"``)."""

    def __init__(self, how: str = "ok", devices=((5 << 30, 8 << 30), (1 << 30, 4 << 30))):
        self.how, self.devices = how, devices
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _recv(self, conn, n):
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError
            data += chunk
        return data

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.how == "silent":
                continue
            try:
                while True:
                    cmd = self._recv(conn, 1)[0]
                    (size,) = struct.unpack("<Q", self._recv(conn, 8))
                    payload = self._recv(conn, size)
                    if cmd == rpc_probe.CMD_HELLO:
                        major = 6 if self.how == "v6" else 7
                        answer = bytes([major, 0, 0, 0]) + bytes(24)
                    elif cmd == rpc_probe.CMD_DEVICE_COUNT:
                        answer = struct.pack("<I", len(self.devices))
                    else:
                        (dev,) = struct.unpack("<I", payload)
                        answer = struct.pack("<QQ", *self.devices[dev])
                    if self.how == "garbage":
                        answer += b"x"
                    conn.sendall(struct.pack("<Q", len(answer)) + answer)
            except (ConnectionError, OSError):
                conn.close()

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def fake():
    workers = []

    def make(how="ok"):
        workers.append(FakeWorker(how))
        return workers[-1]

    yield make
    for w in workers:
        w.close()


def test_the_probe_reads_a_workers_devices(fake):
    w = fake()
    report = rpc_probe.probe_worker(w.endpoint)
    assert report.ok and report.version == "7.0.0"
    assert report.devices == [rpc_probe.WorkerDevice(0, 5 << 30, 8 << 30), rpc_probe.WorkerDevice(1, 1 << 30, 4 << 30)]
    assert report.line() == (
        f"{w.endpoint}: rpc-server, protocol 7.0.0, 2 device(s): device 0: 5,120 MiB free of 8,192 MiB, "
        "device 1: 1,024 MiB free of 4,096 MiB"
    )


def test_the_probe_says_what_is_wrong_and_never_waits_long(fake):
    import time

    assert rpc_probe.probe_worker(fake("v6").endpoint).state == "wrong"
    assert "RPC protocol 6.0.0, this build speaks 7.x" in rpc_probe.probe_worker(fake("v6").endpoint).detail
    assert rpc_probe.probe_worker(fake("garbage").endpoint).state == "wrong"
    silent = fake("silent")
    t0 = time.monotonic()
    busy = rpc_probe.probe_worker(silent.endpoint, timeout=0.5)
    assert busy.state == "busy" and time.monotonic() - t0 < 2.0
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = f"127.0.0.1:{s.getsockname()[1]}"
    assert rpc_probe.probe_worker(free).state == "down"
    with pytest.raises(rpc_probe.ServerError, match=rf"rpc worker {free}: down \(Connection refused\); start it with "
                       rf"`gguf-exact rpc-server --port {free.rpartition(':')[2]}` on that machine"):
        rpc_probe.require_workers((fake().endpoint, free))
    with pytest.raises(rpc_probe.ServerError, match="another llama-server is using it"):
        rpc_probe.require_workers((silent.endpoint,), timeout=0.3)


def test_endpoints_are_checked():
    assert rpc_probe.parse_endpoints("127.0.0.1:50052, 10.0.0.2:50053") == ("127.0.0.1:50052", "10.0.0.2:50053")
    assert rpc_probe.parse_endpoints(("[::1]:50052",)) == ("[::1]:50052",)
    for bad, why in (("127.0.0.1", "expected HOST:PORT"), ("h:0", "expected HOST:PORT"), (":80", "expected HOST:PORT"),
                     ("a:1,a:1", "a:1 is given twice"), (",", "expected HOST:PORT")):
        with pytest.raises(rpc_probe.ArgumentError, match=why):
            rpc_probe.parse_endpoints(bad)


def test_a_worker_console_names_its_devices():
    console = (
        "Starting RPC server v7.0.0\n  endpoint       : 127.0.0.1:50052\n  local cache    : n/a\nDevices:\n"
        "  CPU: AMD EPYC 7B12 (24031 MiB, 20000 MiB free)\n  transport      : TCP\nAccepted client connection\n"
    )
    assert rpc_probe.worker_devices_logged(console) == ["CPU: AMD EPYC 7B12 (24031 MiB, 20000 MiB free)"]
    assert rpc_probe.client_connected(console)
    assert not rpc_probe.client_connected(console + "Client connection closed\n")
    assert rpc_probe.worker_devices_logged("no devices here") == []


# --- the worker: loopback unless told, its command line ----------------------------------


def test_a_worker_off_loopback_is_refused_in_one_line_unless_allowed(tmp_path):
    from gguf_exact.engines.rpc_worker import plan_worker
    from gguf_exact.engines.shared.settings import WorkerSettings

    fake_bin = tmp_path / "rpc-server"
    fake_bin.write_text("#!/bin/sh\n")
    fake_bin.chmod(0o755)
    for host in ("0.0.0.0", "192.168.1.5", "desktop.local"):
        with pytest.raises(rpc_probe.ArgumentError) as err:
            plan_worker(WorkerSettings(profile="cpu", host=host, worker_bin=fake_bin, runs=tmp_path), check_port=False)
        text = err.value.render(lambda p: "--" + p.name.replace("_", "-"))
        assert text.startswith(f"--host {host} would let other machines reach this RPC worker")
        assert "no authentication and no encryption" in text and text.endswith("pass --allow-network to say so")
        assert "\n" not in text
    allowed = plan_worker(
        WorkerSettings(profile="cpu", host="0.0.0.0", port=50060, allow_network=True, worker_bin=fake_bin, runs=tmp_path),
        check_port=False,
    )
    assert allowed.command == [str(fake_bin), "--host", "0.0.0.0", "--port", "50060"]
    local = plan_worker(
        WorkerSettings(profile="cpu", threads=2, cache=True, worker_bin=fake_bin, runs=tmp_path), check_port=False
    )
    assert local.command == [str(fake_bin), "--host", "127.0.0.1", "--port", "50052", "--threads", "2", "--cache"]
    assert local.run_dir == tmp_path / "50052"
    with pytest.raises(rpc_probe.ArgumentError, match="threads 0: expected a whole number"):
        plan_worker(WorkerSettings(profile="cpu", threads=0, worker_bin=fake_bin, runs=tmp_path), check_port=False)


def test_the_python_engine_refuses_rpc_and_bad_endpoints_are_one_line(tmp_path):
    from gguf_exact.engines.launch import plan_launch
    from gguf_exact.engines.shared.settings import ServeSettings
    from gguf_exact.tiny.models import write_tiny_target

    target = write_tiny_target(tmp_path / "t.gguf")
    with pytest.raises(rpc_probe.ArgumentError, match="engine python runs on this machine's devices only"):
        plan_launch(ServeSettings(target, profile="cpu", engine="python", rpc=("127.0.0.1:1",)), check_port=False)
    with pytest.raises(rpc_probe.ArgumentError, match="rpc 'nope': expected HOST:PORT"):
        plan_launch(ServeSettings(target, profile="cpu", rpc=("nope",)), check_port=False, require_build=False)
    with pytest.raises(rpc_probe.ArgumentError, match="profile cpu: rpc 'x:y': expected HOST:PORT"):
        plan_launch(ServeSettings(target, profile="cpu", overrides=("rpc=x:y",)), check_port=False, require_build=False)
    launch = plan_launch(
        ServeSettings(target, profile="cpu", overrides=("rpc=10.0.0.2:1",), rpc=("127.0.0.1:50052", "127.0.0.1:50053")),
        check_port=False, require_build=False,
    )  # serve --rpc wins over the profile's key
    i = launch.command.index("--rpc")
    assert launch.command[i + 1] == "127.0.0.1:50052,127.0.0.1:50053" and launch.command.count("--rpc") == 1


# --- the plan over devices, as llama.cpp places layers ------------------------------------


def test_layers_go_to_devices_as_llama_cpp_places_them():
    from gguf_exact.engines.shared.device_plan import layer_devices

    # 5 layers + the output layer over two equal shares: upper_bound(0.5, 1.0) of il/6
    assert layer_devices(5, -1, [1.0, 1.0]) == [0, 0, 0, 1, 1, 1]
    assert layer_devices(5, -1, [3.0, 1.0]) == [0, 0, 0, 0, 0, 1]  # 0.75: layers 0-4 (4/6 < 0.75), output on 1
    assert layer_devices(5, 3, [1.0, 1.0]) == [None, None, None, 0, 0, 1]  # the last 3 offloaded, split 0.5
    assert layer_devices(5, 0, [1.0, 1.0]) == [None] * 6
    assert layer_devices(60, -1, [4096.0, 8192.0])[:21] == [0] * 21  # 21/61 = 0.344 > 1/3: device 1
    assert layer_devices(60, -1, [4096.0, 8192.0])[21] == 1


def test_the_plan_over_devices_splits_every_byte_and_places_the_drafter_with_its_caches(tmp_path):
    from gguf_exact.engines.shared.device_plan import CPU, Device, drafter_kv_layers, plan_devices
    from gguf_exact.engines.shared.memory_plan import MemoryInputs, kv_caches, weight_split
    from gguf_exact.pair.checks import read_model
    from gguf_exact.tiny.full_size import write_full_size_drafter, write_full_size_target

    t = read_model(write_full_size_target(tmp_path / "e2b.gguf", "E2B"), "target")
    d = read_model(write_full_size_drafter(tmp_path / "e2b-d.gguf", "E2B", tmp_path / "e2b.gguf"), "drafter")
    g = t.geometry()
    # E2B: 15 layers own a cache (20 share); the last sliding one is 13, the last full one 14
    assert drafter_kv_layers(g) == (13, 14)
    s = MemoryInputs(n_ctx=4096, n_parallel=1, flash_attn="on", n_draft_max=4)
    devs = [Device("RPC0", "10.0.0.2:50052", 8 << 30, 8 << 30), Device("RPC1", "10.0.0.3:50052", 4 << 30, 4 << 30)]
    plan = plan_devices(t, d, s, devs, tensor_split=None)
    assert plan.split_from == "free memory"
    r0, r1, cpu = plan.shares
    assert r0.layers == list(range(0, 24)) and r1.layers == list(range(24, 36))  # 24/36 = 2/3: RPC1 from layer 24
    # every weight byte is somewhere, once (the tied head's copy on the output layer's device)
    on_gpu, host = weight_split(t.header.tensors, g.n_layer, g.n_layer + 1)
    assert r0.weights + r1.weights == on_gpu and cpu.weights == host
    # all cache rows are on RPC0 (layers 0-14): the drafter goes there, not with the output layer
    assert r0.kv == sum(c.bytes for c in kv_caches(g, s)) and r1.kv == 0 and cpu.kv == 0
    assert plan.draft_device == "RPC0" and r0.drafter_weights > 0 and r1.drafter_weights == 0
    assert "reads the caches of target layers 13, 14" in plan.draft_reason
    # a tensor-split moves the layers; a profile's spec-draft-device is kept
    split = plan_devices(t, d, s, devs, tensor_split="1,1", draft_device="RPC1")
    assert split.shares[0].layers == list(range(0, 18)) and split.draft_device == "RPC1"
    assert split.shares[1].drafter_weights > 0 and split.split_from == "tensor-split"
    # a device too small for its share (less than --fit's 1 GiB margin left) is warned about, by name
    small = [Device("RPC0", "a:1", 1 << 30, 1 << 30), Device("CUDA0", "local", 8 << 30, 8 << 30)]
    warned = plan_devices(t, d, s, small, tensor_split="1,1").warnings()
    assert len(warned) == 1 and str(warned[0]).startswith("RPC0 (a:1) gets ")
    for bad, why in (("1,x", "expected numbers"), ("1,1,1", "at most 2 shares"), ("-1,2", "of 0 or more")):
        with pytest.raises(rpc_probe.ArgumentError, match=why):
            plan_devices(t, d, s, devs, tensor_split=bad)
    with pytest.raises(rpc_probe.ArgumentError, match="spec-draft-device=RPC7: expected one of RPC0, RPC1, CPU"):
        plan_devices(t, d, s, devs, draft_device="RPC7")
    assert plan_devices(t, None, s, devs).draft_device is None
    assert CPU == "CPU"


def test_doctor_lists_the_workers_given_and_those_running_here(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_EXACT_RUN_DIR", str(tmp_path))
    assert doctor.rpc_workers() == [
        doctor.Finding("RPC workers", "none given or running here (`gguf-exact rpc-server` starts one)", True)
    ]
    w, busy = fake(), fake("silent")
    found = doctor.rpc_workers((f"{w.endpoint},{busy.endpoint}",))
    assert [f.ok for f in found] == [True, True]  # busy: serving its head, which is fine
    assert found[0].value.startswith(f"{w.endpoint}: rpc-server, protocol 7.0.0, 2 device(s)")
    assert found[1].value.startswith(f"{busy.endpoint}: busy (accepts but does not answer")
    with pytest.raises(rpc_probe.ArgumentError, match="rpc 'nope'"):
        doctor.rpc_workers(("nope",))


def test_the_plan_says_when_shared_caches_travel_every_pass(tmp_path):
    """E2B's layers 15-34 reuse the caches of layers 13 (sliding) and 14 (full): split at 18, both
    caches go from RPC0 to RPC1 at every pass (measured on loopback: 12.2 MB per pass against 1.2 MB
    split at 13, scripts/bench_rpc.py); split at 13, nothing does."""
    from gguf_exact.engines.shared.device_plan import Device, plan_devices
    from gguf_exact.engines.shared.memory_plan import MemoryInputs, layer_kv
    from gguf_exact.pair.checks import read_model
    from gguf_exact.tiny.full_size import write_full_size_target

    t = read_model(write_full_size_target(tmp_path / "e2b.gguf", "E2B"), "target")
    s = MemoryInputs(n_ctx=1024, n_parallel=1, flash_attn="on")
    devs = [Device("RPC0", "a:1", 8 << 30), Device("RPC1", "b:1", 8 << 30)]
    kv = {il: k + v for il, _, k, v in layer_kv(t.geometry(), s)}
    even = plan_devices(t, None, s, devs, tensor_split="1,1")
    assert even.shared_kv_moves == [("RPC0", "RPC1", kv[13] + kv[14])] and kv[13] + kv[14] == 3 << 20
    assert any(ln.startswith("  note: layers on RPC1 reuse caches held on RPC0: 3.00 MiB copied") for ln in even.lines())
    assert plan_devices(t, None, s, devs, tensor_split="13,23").shared_kv_moves == []


# --- a worker that stopped answering, told without a connection -----------------------------


def test_a_stopped_worker_of_this_machine_is_named_by_status_serve_and_the_heads_status(tmp_path):
    """A worker's process stopped (SIGSTOP): status says so from /proc with no connection (one
    would only wait in its queue), serve refuses it in one line, and the status of a head that
    gave up on it (patch 42r's log line) says why it is down."""
    import os
    import signal
    import subprocess
    import sys
    from types import SimpleNamespace

    from helpers import cli

    from gguf_exact.engines.serve import workers_gone
    from gguf_exact.engines.shared import rpc_watch
    from gguf_exact.engines.shared.process import write_run_state
    from gguf_exact.engines.shared.status import rpc_gave_up_after, server_status

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"127.0.0.1:{port}"
    # the worker's process: any process will do, /proc is asked for its state
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = {"engine": "rpc-server", "host": "127.0.0.1", "port": port, "url": f"rpc://{endpoint}"}
        write_run_state(tmp_path / str(port), state, proc.pid, True)
        assert rpc_watch.local_worker_pid(endpoint, tmp_path) == proc.pid
        assert rpc_watch.local_worker_pid(f"localhost:{port}", tmp_path) == proc.pid  # loopback either way
        assert rpc_watch.local_worker_pid(f"10.9.9.9:{port}", tmp_path) is None  # another machine's
        assert rpc_watch.stopped_worker(endpoint, tmp_path) is None  # running: nothing to say without a probe
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while rpc_watch.stopped_worker(endpoint, tmp_path) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        detail = (
            f"not answering: its process (pid {proc.pid}, on this machine) is stopped by a signal or a debugger; "
            f"`kill -CONT {proc.pid}` resumes it"
        )
        st = server_status(port, tmp_path)
        assert (st.health, st.up, st.worker.line()) == ("stopped", False, f"{endpoint}: stopped ({detail})")
        shown = cli("status", "--port", str(port), env=dict(os.environ, GGUF_EXACT_RUN_DIR=str(tmp_path)))
        assert shown.returncode == 1
        lines = status_lines(shown.stdout)  # wrapped under the value's column: joined back
        assert lines[0] == f"worker       {endpoint}  pid {proc.pid}  stopped"
        assert lines[2] == f"answer       {endpoint}: stopped ({detail})"
        with pytest.raises(rpc_probe.ServerError) as err:
            rpc_probe.require_workers((endpoint,), check=rpc_watch.worker_checker(tmp_path))
        assert str(err.value) == f"rpc worker {endpoint}: stopped ({detail}); resume it, or stop it and start another"
        # serve in the foreground, its llama-server gone (patch 42r gave up on the worker): one line
        plan = SimpleNamespace(
            workers=[rpc_probe.WorkerReport(endpoint, "ok")],
            launch=SimpleNamespace(run_dir=tmp_path / "head", label="llama-server"),
        )
        assert workers_gone(plan, -6) == (
            f"llama-server exited with code -6: RPC worker {endpoint}: stopped ({detail}); llama-server stops when a "
            "worker does not answer for GGML_RPC_TIMEOUT seconds (default 120): resume or restart the worker, then "
            "serve again"
        )

        # a head that gave up on it: gone, its log naming the timeout
        head_port = port + 1 if port < 65535 else port - 1
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        head = tmp_path / str(head_port)
        head_state = {"engine": "llama-server", "port": head_port, "url": f"http://127.0.0.1:{head_port}",
                      "command": ["llama-server", "--rpc", endpoint]}  # fmt: skip
        write_run_state(head, head_state, gone.pid, True)
        log = "srv  load: ...\nRPC server sent nothing within 5 s (GGML_RPC_TIMEOUT): it stopped answering\n"
        (head / "server.log").write_text(log)
        assert rpc_gave_up_after(log) == 5 and rpc_gave_up_after("no such line") is None
        down = server_status(head_port, tmp_path)
        assert not down.running and down.gave_up_after == 5
        assert down.down_reason == (
            f"process not running: an RPC worker it used stopped answering ({endpoint}: stopped ({detail})); "
            "llama-server gave up on it after 5 s without an answer (GGML_RPC_TIMEOUT)"
        )
    finally:
        proc.kill()
        proc.wait()
