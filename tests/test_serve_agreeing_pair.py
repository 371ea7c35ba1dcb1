"""`gguf-exact serve --detach`, `status` and `stop` on a drafter that agrees with its target.

One server for the module, started through the CLI; the last test kills it from outside.
"""

import os
import signal
import time

import pytest
from _llama_server import TEST_SETTINGS, complete, free_port, get_json, server_binary
from helpers import cli

from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.tiny.models import write_agreeing_pair

pytestmark = pytest.mark.llama_server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server_binary()
    root = tmp_path_factory.mktemp("agreeing")
    target, hf = write_agreeing_pair(root)
    drafter = convert_drafter(hf, root / "drafter.gguf", vocab_from=target).path
    env = dict(os.environ, GGUF_EXACT_RUN_DIR=str(root / "run"))
    port = free_port()
    sets = [a for s in TEST_SETTINGS for a in ("--set", s)]
    t0 = time.monotonic()
    r = cli("serve", "--model", str(target), "--draft", str(drafter), "--port", str(port), "--detach", *sets, env=env)
    assert r.returncode == 0, r.stderr
    info = {
        "port": port,
        "env": env,
        "url": f"http://127.0.0.1:{port}",
        "stdout": r.stdout,
        "start_s": time.monotonic() - t0,
        "root": root,
    }
    yield info
    cli("stop", "--port", str(port), env=env)


def test_serve_prints_command_and_weight_bytes(served):
    out = served["stdout"]
    assert "bytes of weights" in out and "gemma4-assistant" in out
    assert "--spec-type draft-mtp" in out and "--metrics" in out and f"--port {served['port']}" in out
    assert f"ready at {served['url']}" in out and "detached" in out
    assert "memory plan (CPU" in out and "draft-mtp active: " in out  # the probe request drafted


def test_agreeing_drafter_is_accepted(served):
    assert get_json(served["url"] + "/health") == {"status": "ok"}
    r = complete(served["url"], "the quick brown fox", n_predict=24)
    t = r["timings"]
    assert t["draft_n"] > 0 and t["draft_n_accepted"] == t["draft_n"]  # every draft accepted
    # the target repeats its last token, and so does the drafter
    assert len(set(r["tokens"])) == 1


def test_status_shows_counters_and_log_lines(served):
    complete(served["url"], "abc", n_predict=16)
    r = cli("status", "--port", str(served["port"]), env=served["env"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "up" in r.stdout and "speculation  on" in r.stdout
    assert "draft tokens" in r.stdout and "accepted (" in r.stdout
    assert "request      acceptance" in r.stdout
    j = cli("status", "--port", str(served["port"]), "--json", env=served["env"])
    import json

    data = json.loads(j.stdout)
    c = data["counters"]
    assert c["drafts"] > 0 and c["accepted_tokens"] > 0 and 0 < c["rate"] <= 1
    assert data["recent"][-1]["accepted"] > 0


def test_killed_server_shows_down_and_stop_says_so(served):
    pid = int((served["root"] / "run" / str(served["port"]) / "server.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    r = cli("status", "--port", str(served["port"]), env=served["env"])
    assert r.returncode == 1 and "down" in r.stdout
    r = cli("stop", "--port", str(served["port"]), env=served["env"])
    assert r.returncode == 0 and "is not running" in r.stdout, r.stdout + r.stderr
