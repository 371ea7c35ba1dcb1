"""A real llama-server serves a tiny gemma4 target with a tiny converted drafter (draft-mtp).

Two servers for the module: the pair, and the target alone, to compare token ids.
"""

import pytest
from _llama_server import (
    PROMPTS,
    TEST_SETTINGS,
    complete,
    free_port,
    get_json,
    server_binary,
)

from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.shared.settings import ServeSettings
from gguf_exact.engines.shared.status import server_status, stop_server
from gguf_exact.tiny.models import write_tiny_drafter, write_tiny_target

pytestmark = pytest.mark.llama_server


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("random-pair")
    target = write_tiny_target(root / "target.gguf", seed=0)
    write_tiny_drafter(root / "drafter-hf", seed=0)
    convert_drafter(root / "drafter-hf", root / "drafter.gguf", vocab_from=target)
    return target, root / "drafter.gguf"


def _serve(run_dir, target, drafter):
    server_binary()
    port = free_port()
    launch = plan_launch(ServeSettings(target, drafter, "cpu", TEST_SETTINGS, port=port))
    proc, seconds = start_server(launch, detach=True, timeout=120)
    return launch, proc, seconds


@pytest.fixture(scope="module")
def with_drafter(run_dir, pair):
    launch, proc, _ = _serve(run_dir, *pair)
    yield launch
    stop_server(launch.port)
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def target_alone(run_dir, pair):
    launch, proc, _ = _serve(run_dir, pair[0], None)
    yield launch
    stop_server(launch.port)
    proc.wait(timeout=30)


def test_command_line_has_draft_mtp(with_drafter):
    cmd = with_drafter.command
    assert cmd[cmd.index("--model-draft") + 1].endswith("drafter.gguf")
    assert cmd[cmd.index("--spec-type") + 1] == "draft-mtp"
    assert "--metrics" in cmd and cmd[cmd.index("--host") + 1] == "127.0.0.1"


def test_health_is_ok(with_drafter):
    assert get_json(with_drafter.url + "/health") == {"status": "ok"}


def test_greedy_completion_drafts(with_drafter):
    r = complete(with_drafter.url, PROMPTS[0])
    assert len(r["tokens"]) == 16
    assert r["timings"]["draft_n"] > 0


def test_drafter_does_not_change_greedy_tokens(with_drafter, target_alone):
    for prompt in PROMPTS:
        a = complete(with_drafter.url, prompt)
        b = complete(target_alone.url, prompt)
        assert a["tokens"] == b["tokens"], prompt
        assert "draft_n" not in b["timings"] or b["timings"]["draft_n"] == 0


def test_status_reports_speculation(with_drafter, target_alone):
    complete(with_drafter.url, PROMPTS[1])
    st = server_status(with_drafter.port)
    assert st.up and st.speculative is True
    assert st.models and st.counters is not None and st.counters.drafts > 0 and st.counters.draft_tokens > 0
    assert st.recent and all(a.generated > 0 for a in st.recent)
    alone = server_status(target_alone.port)
    assert alone.up and alone.speculative is False and alone.state["drafter"] is None
