"""`status` and `stop` know their server by pid file and start time, whatever its name,
and read only the end of its log."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _llama_server import TEST_SETTINGS, free_port, get_json, server_binary

from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.shared.process import alive, is_server_process, process_start_time, read_tail
from gguf_exact.engines.shared.settings import ServeSettings
from gguf_exact.engines.shared.status import server_status, stop_server
from gguf_exact.tiny.models import write_tiny_target

ACCEPTANCE = "slot print_timing: id  0 | task 5 | draft acceptance = 0.75000 (    3 accepted /     4 generated), mean len =  2.00"


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    root = tmp_path / "run"
    monkeypatch.setenv("GGUF_EXACT_RUN_DIR", str(root))
    return root


@pytest.mark.llama_server
def test_a_server_binary_of_another_name_is_recognised(tmp_path, run_dir):
    renamed = tmp_path / "my-inference-daemon"
    shutil.copy2(server_binary(), renamed)
    target = write_tiny_target(tmp_path / "target.gguf")
    launch = plan_launch(ServeSettings(target, None, "cpu", TEST_SETTINGS, port=free_port(), server_bin=renamed))
    proc, _ = start_server(launch, detach=True, timeout=120)
    try:
        assert b"llama-server" not in open(f"/proc/{proc.pid}/cmdline", "rb").read()
        st = server_status(launch.port)
        assert st.running and st.up and st.state["start_time"] == process_start_time(proc.pid)
        assert get_json(launch.url + "/health") == {"status": "ok"}
    finally:
        message = stop_server(launch.port)
    assert message == f"stopped llama-server on port {launch.port} (pid {proc.pid})"
    assert proc.wait(timeout=30) is not None
    assert not server_status(launch.port).running


def _fake_run(run_dir, port: int, pid: int, start_time: int | None) -> None:
    rdir = run_dir / str(port)
    rdir.mkdir(parents=True)
    state = {"pid": pid, "start_time": start_time, "engine": "llama-server", "port": port}
    state |= {"url": f"http://127.0.0.1:{port}", "target": "t.gguf", "drafter": None}
    (rdir / "server.json").write_text(json.dumps(state))
    (rdir / "server.pid").write_text(f"{pid}\n")


def test_a_reused_pid_is_not_taken_for_the_server(run_dir):
    """The server (pid P, started at S) died; the system gave P to another process."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        started = process_start_time(other.pid)
        assert started is not None
        port = free_port()
        _fake_run(run_dir, port, other.pid, started - 1)  # the server P was started earlier
        assert not is_server_process(other.pid, json.loads((run_dir / str(port) / "server.json").read_text()))
        assert not server_status(port).running
        message = stop_server(port)
        assert "is not running" in message and "belongs to another process, left alone" in message
        assert other.poll() is None  # not signalled
        assert not (run_dir / str(port) / "server.pid").exists()
        # the same process with its own start time is recognised: the check is not vacuous
        port2 = free_port()
        _fake_run(run_dir, port2, other.pid, started)
        assert server_status(port2).running
    finally:
        other.kill()
        other.wait()


# A server whose main thread has exited while another still listens (as llama-server's can be
# for a moment while it shuts down): its leader is a zombie, the process is not gone.
LEADER_GONE_LISTENER = """
import ctypes, signal, socket, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
threading.Thread(target=time.sleep, args=(60,)).start()
print("listening", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_server_whose_main_thread_exited_is_alive_until_its_last_thread_is_and_stop_waits_for_it(run_dir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", LEADER_GONE_LISTENER, str(port)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"listening\n"
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the main thread did not exit"
            time.sleep(0.01)
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # still listening
        started = process_start_time(proc.pid)
        assert alive(proc.pid, started)
        _fake_run(run_dir, port, proc.pid, started)
        assert server_status(port).running
        assert stop_server(port, timeout=1.0) == f"stopped llama-server on port {port} (pid {proc.pid})"
        # stop returned only once the port was free: a new server can take it at once
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        assert not alive(proc.pid, started)
    finally:
        proc.kill()
        proc.wait()


def test_read_tail_reads_the_end_from_a_whole_line(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("first\nsecond\n")
    assert read_tail(log) == "first\nsecond\n"
    log.write_text("x" * 100 + "\n" + "a line\n" * 10)
    assert read_tail(log, max_bytes=40) == "a line\n" * 5  # the partial line at the cut is dropped
    assert read_tail(tmp_path / "missing.log") == ""


def test_status_reads_only_the_tail_of_a_huge_log(tmp_path, run_dir):
    """A 64 GiB (sparse) log: status still answers, in a process that may not allocate
    more than 3 GiB, and finds the acceptance line at its end."""
    port = free_port()
    _fake_run(run_dir, port, 999_999_999, None)
    log = run_dir / str(port) / "server.log"
    with open(log, "wb") as f:
        f.truncate(64 << 30)
        f.seek(0, os.SEEK_END)
        f.write(("\n" + ACCEPTANCE + "\n").encode())
    code = f"""
import resource, json, sys
resource.setrlimit(resource.RLIMIT_AS, ({3 << 30}, {3 << 30}))
from gguf_exact.engines.shared.status import server_status
st = server_status({port})
print(json.dumps([a.accepted for a in st.recent]))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout) == [3]
