"""The Python engine names its model one way: `/v1/models` lists the name every answer's
`model` field carries (the target's full path, as llama-server gives it), whatever name
the request used."""

import json
import urllib.request
from pathlib import Path

import pytest
from _llama_server import TEST_SETTINGS, free_port

from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.shared.settings import ServeSettings
from gguf_exact.engines.shared.status import stop_server
from gguf_exact.tiny.hidden_pair import write_hidden_state_pair

pytestmark = pytest.mark.bindings


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_models_and_answers_give_one_name(run_dir, tmp_path):
    target, _ = write_hidden_state_pair(tmp_path / "hidden")
    launch = plan_launch(ServeSettings(target, None, "cpu", list(TEST_SETTINGS), port=free_port(), engine="python"))
    proc, _ = start_server(launch, detach=True, timeout=120)
    try:
        with urllib.request.urlopen(launch.url + "/v1/models", timeout=30) as r:
            models = [m["id"] for m in json.loads(r.read())["data"]]
        full = str(Path(target).resolve())
        assert models == [full]
        base = {"max_tokens": 3, "temperature": 0}
        for name in (None, "target", "target.gguf", full):
            extra = {} if name is None else {"model": name}
            answer = post(launch.url + "/v1/completions", {"prompt": "the", **base, **extra})
            assert answer["model"] == full, (name, answer["model"])
            chat = post(
                launch.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **base, **extra}
            )
            assert chat["model"] == full, (name, chat["model"])
    finally:
        stop_server(launch.port)
        proc.wait(timeout=30)
