"""`stop` and `status` tell one story: a clean stop is "stopped", stopping nothing is not
an error, and a stopped server's old request lines are not shown as if live.

The "server" is a `sleep` process with a run folder written as `serve` writes one: no
llama-server is needed to judge what `stop` and `status` say about it.
"""

import json
import os
import subprocess
import sys

from helpers import cli

from gguf_exact.engines.shared.process import process_start_time

ACCEPT_LINE = "slot print_timing: id  0 | task 5 | draft acceptance = 0.50000 (    5 accepted /    10 generated), mean len =  1.50"


def fake_server(root, port):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    rdir = root / str(port)
    rdir.mkdir(parents=True)
    state = {
        "pid": proc.pid,
        "start_time": process_start_time(proc.pid),
        "engine": "llama-server",
        "port": port,
        "url": f"http://127.0.0.1:{port}",
        "target": "/nowhere/target.gguf",
        "drafter": None,
        "command": ["llama-server"],
    }
    (rdir / "server.json").write_text(json.dumps(state))
    (rdir / "server.pid").write_text(f"{proc.pid}\n")
    (rdir / "server.log").write_text(ACCEPT_LINE + "\n")
    return proc


def test_stop_twice_then_status_says_stopped(tmp_path):
    env = dict(os.environ, GGUF_EXACT_RUN_DIR=str(tmp_path / "run"))
    port = 47123
    proc = fake_server(tmp_path / "run", port)
    try:
        r = cli("stop", "--port", str(port), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.strip() == f"stopped llama-server on port {port} (pid {proc.pid})"
        proc.wait(timeout=10)
        for _ in range(2):
            r = cli("stop", "--port", str(port), env=env)
            assert r.returncode == 0, r.stdout + r.stderr
            assert r.stdout.strip() == f"llama-server on port {port} is not running (stopped by gguf-exact stop)"
        r = cli("stop", env=env)  # the last one started, already stopped
        assert r.returncode == 0 and "is not running (stopped by gguf-exact stop)" in r.stdout
        r = cli("status", "--port", str(port), env=env)
        assert r.returncode == 1  # down, as documented
        server_line = r.stdout.splitlines()[0]
        assert server_line.startswith(
            f"server       http://127.0.0.1:{port}  pid {proc.pid}  down: stopped (by gguf-exact stop at "
        )
        assert "killed" not in r.stdout and "exited" not in r.stdout
        assert "request      acceptance" not in r.stdout  # the old log's lines are not shown as live
        data = json.loads(cli("status", "--port", str(port), "--json", env=env).stdout)
        assert data["up"] is False and data["running"] is False
        assert isinstance(data["stopped"], float) and data["recent"][0]["accepted"] == 5  # the log's, as history
        assert (
            r.stdout.splitlines()[-2] == "earlier      1 request line(s) in the log from before it stopped (not live)"
        )
    finally:
        proc.kill()
        proc.wait()


def test_killed_server_still_says_killed(tmp_path):
    env = dict(os.environ, GGUF_EXACT_RUN_DIR=str(tmp_path / "run"))
    port = 47124
    proc = fake_server(tmp_path / "run", port)
    proc.kill()
    proc.wait()
    r = cli("status", "--port", str(port), env=env)
    assert r.returncode == 1
    assert r.stdout.splitlines()[0].endswith("down: process not running (exited or killed)")
    assert "request      acceptance" not in r.stdout


def test_stop_with_nothing_there_is_not_an_error(tmp_path):
    env = dict(os.environ, GGUF_EXACT_RUN_DIR=str(tmp_path / "run"))
    r = cli("stop", "--port", "9999", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "nothing is running on port 9999 (no server was started there by gguf-exact serve)"
    ]
    assert r.stderr == ""
    r = cli("stop", env=env)
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["nothing is running (no server was started by gguf-exact serve)"]
