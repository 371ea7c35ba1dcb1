"""Is draft-mtp really drafting? (gguf_exact.engines.shared.speculation): the verdict from its
evidence, and `serve` / `status` on real llama-servers with speculation on and silently off."""

import json
import os

import pytest
from _llama_server import TEST_SETTINGS, free_port, server_binary
from helpers import cli

from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.engines.shared.speculation import ACTIVE, NOT_REQUESTED, OFF, UNCONFIRMED, judge
from gguf_exact.tiny.models import write_agreeing_pair

CMD = ["llama-server", "--model", "t.gguf", "--model-draft", "d.gguf", "--spec-type", "draft-mtp"]
NO_SPEC = ["llama-server", "--model", "t.gguf", "--model-draft", "d.gguf"]
# what llama-server 0c1e57098 logs when common_speculative_init throws (tools/server/server-context.cpp)
FAILED_INIT = (
    "0.00.314.980 E srv    load_model: failed to initialize speculative decoding context: "
    "failed to allocate the draft context\n"
)


def test_verdicts():
    assert judge(False, CMD, False, 0, 0, "", False).state == NOT_REQUESTED
    v = judge(True, CMD, True, 10, 7, "", True)
    assert (v.state, v.line) == (ACTIVE, "active: 10 draft tokens in the probe request, 7 accepted")
    assert judge(True, CMD, True, 12, 12, "", False).line == "active: 12 draft tokens since start, 12 accepted"
    off = judge(True, NO_SPEC, False, 0, 0, "", True)
    assert off.state == OFF and "the command has no --spec-type draft-mtp" in off.line
    ngram = judge(True, [*NO_SPEC, "--spec-type", "ngram-simple"], False, 0, 0, "", False)
    assert "--spec-type is 'ngram-simple', not draft-mtp" in ngram.line
    logged = judge(True, CMD, False, 0, 0, FAILED_INIT, True)
    assert logged.state == OFF and logged.line.endswith(
        "llama.cpp logged: failed to initialize speculative decoding context: failed to allocate the draft context"
    )
    silent = judge(True, CMD, False, 0, 0, "", True)
    assert silent.state == OFF and "did not say why" in silent.line and "#24758" in silent.line
    # the log line alone is evidence even where /slots cannot be read
    assert judge(True, CMD, None, 0, 0, FAILED_INIT, False).state == OFF
    assert judge(True, CMD, True, 0, 0, "", True).state == UNCONFIRMED
    assert "status --probe" in judge(True, CMD, True, 0, 0, "", False).line
    # the Python engine has no /slots: drafting is judged from the counters alone
    assert judge(True, ["python", "-m", "x"], None, 4, 4, "", True, engine="python").state == ACTIVE


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    server_binary()
    root = tmp_path_factory.mktemp("spec-check")
    target, hf = write_agreeing_pair(root)
    drafter = convert_drafter(hf, root / "drafter.gguf", vocab_from=target).path
    env = dict(os.environ, GGUF_EXACT_RUN_DIR=str(root / "run"))
    return target, drafter, env


@pytest.mark.llama_server
@pytest.mark.parametrize("speculating", [True, False])
def test_serve_and_status_say_whether_it_drafts(pair, speculating):
    """With the profile's --spec-type draft-mtp the probe drafts and both commands say
    active; with `--set spec-type=false` llama-server still loads the drafter and serves,
    /slots says not speculative, and both commands say OFF and why."""
    target, drafter, env = pair
    port = free_port()
    sets = [a for s in TEST_SETTINGS for a in ("--set", s)] + ([] if speculating else ["--set", "spec-type=false"])
    r = cli("serve", "--model", str(target), "--draft", str(drafter), "--profile", "cpu", "--port", str(port), "--detach", *sets, env=env)  # fmt: skip
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert ("--spec-type draft-mtp" in r.stdout) is speculating
        status = cli("status", "--port", str(port), env=env)
        data = json.loads(cli("status", "--port", str(port), "--json", env=env).stdout)
    finally:
        cli("stop", "--port", str(port), env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    if speculating:
        # the agreeing drafter: every draft token of the 16-token probe accepted
        assert "draft-mtp active: " in r.stdout and " draft tokens in the probe request, " in r.stdout
        assert "draft-mtp    active: " in status.stdout and "draft tokens since start" in status.stdout
        assert data["speculation"]["state"] == "active" and data["counters"]["draft_tokens"] > 0
        assert data["counters"]["accepted_tokens"] == data["counters"]["draft_tokens"]
    else:
        warning = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: draft-mtp OFF")]
        assert len(warning) == 1 and "no --spec-type draft-mtp" in warning[0], r.stderr
        assert "speculation  off" in status.stdout
        assert "draft-mtp    OFF: a drafter was given but the server is not speculating" in status.stdout
        assert data["speculation"]["state"] == "off" and data["counters"]["draft_tokens"] == 0
