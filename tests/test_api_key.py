"""`serve --api-key` on both engines, with the official `openai` client; and the python
engine's sampling defaults, which are llama-server's.

A server opened to other machines (`--host 0.0.0.0`) with a key: no key or a wrong one
gets HTTP 401, the right one 200; `/health` stays open; `status` says the key is wanted
and reads everything with it; the key is on no command line and in no file of the run
folder.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from _llama_server import free_port, server_binary
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.tiny.models import write_agreeing_pair
from gguf_exact.tiny.pairs import write_mixed_target

SETTINGS = ["--set", "ctx-size=512", "--set", "threads=2", "--set", "batch-size=64", "--set", "ubatch-size=64"]
# a fixed draft length (the shipped profiles are adaptive): the probe counts drafts
SETTINGS += ["--set", "spec-draft-adaptive=false", "--set", "spec-draft-n-max=2"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """The agreeing pair: every draft accepted."""
    from gguf_exact.drafter.convert import convert_drafter

    target, hf = write_agreeing_pair(tmp_path_factory.mktemp("agreeing"))
    return target, convert_drafter(hf, hf.parent / "drafter.gguf", target).path


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def serve(args: list[str], env: dict[str, str]):
    r = CliRunner().invoke(main, ["serve", *args, "--profile", "cpu", *SETTINGS, "--detach"], env=env)
    assert r.exit_code == 0, r.output
    return r


@pytest.mark.bindings
@pytest.mark.llama_server
@pytest.mark.parametrize("engine", ["llama-server", "python"])
def test_api_key_with_the_openai_client(engine, pair, tmp_path):
    key = "k-" + secrets.token_hex(12)
    port = free_port()
    run = tmp_path / "run"
    env = {"GGUF_EXACT_RUN_DIR": str(run), "GGUF_EXACT_API_KEY": key}
    extra = ["--server-bin", str(server_binary())] if engine == "llama-server" else []
    target, drafter = pair
    r = serve(["--engine", engine, "--model", str(target), "--draft", str(drafter), "--host", "0.0.0.0",
               "--port", str(port), *extra], env)  # fmt: skip
    try:
        assert "api key  required from clients" in r.stdout
        assert "draft-mtp active: 10 draft tokens in the probe request, 10 accepted" in r.stdout  # probed with the key
        base = f"http://127.0.0.1:{port}"
        model = str(target.resolve())  # one name in both engines: the full path
        # no key (the client's Authorization header left out), then a wrong one
        for wrong, headers in (("unused", {"Authorization": openai.Omit()}), ("not-" + key, {})):
            c = openai.OpenAI(base_url=base + "/v1", api_key=wrong, max_retries=0, timeout=60)
            with pytest.raises(openai.AuthenticationError) as e:
                c.completions.create(model=model, prompt="abc", max_tokens=4, temperature=0, extra_headers=headers)
            assert e.value.status_code == 401
            with pytest.raises(openai.AuthenticationError):
                c.models.list(extra_headers=headers)
        assert http_status(base + "/v1/models") == 401  # no Authorization header at all
        assert http_status(base + "/metrics") == 401
        assert http_status(base + "/health") == 200  # open, as llama-server keeps it
        c = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)
        raw = c.completions.with_raw_response.create(model=model, prompt="abc", max_tokens=4, temperature=0)
        assert raw.http_response.status_code == 200
        assert raw.parse().usage.completion_tokens == 4
        assert [m.id for m in c.models.list()] == [model]
        assert http_status(base + "/metrics", {"X-Api-Key": key}) == 200  # llama-server's other header
        # status: without the key it says so; with it (from the environment) it reads everything
        no_key = CliRunner().invoke(main, ["status", "--port", str(port)], env=env | {"GGUF_EXACT_API_KEY": ""})
        assert no_key.exit_code == 0 and "api key      the server wants its API key" in no_key.stdout
        assert "models" not in no_key.stdout
        st = CliRunner().invoke(main, ["status", "--port", str(port), "--json"], env=env)
        data = json.loads(st.stdout)
        assert data["models"] == [model] and data["counters"]["draft_tokens"] >= 10 and not data["needs_key"]
        # the key is in no file of the run folder, and on no command line
        files = [p for p in (run / str(port)).iterdir() if p.is_file()]
        assert {p.name for p in files} >= {"server.json", "server.log", "server.pid"}
        assert not [p.name for p in files if key.encode() in p.read_bytes()]
        assert json.loads((run / str(port) / "server.json").read_text())["api_key"] is True
        pid = int((run / str(port) / "server.pid").read_text())
        assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    finally:
        stop = CliRunner().invoke(main, ["stop", "--port", str(port)], env=env)
        assert stop.exit_code == 0 and stop.stdout.startswith("stopped ")


@pytest.mark.bindings
@pytest.mark.llama_server
def test_python_engine_samples_with_llama_servers_defaults(tmp_path):
    """A request that names no sampler setting is sampled as llama-server would (temperature
    0.8, top-k 40, top-p 0.95, min-p 0.05, no repeat penalty), not with llama-cpp-python's
    server defaults (repeat penalty 1.1); /v1/completions without max_tokens runs to the end of
    the context, not 16 tokens. The mixed tiny target has flat enough logits to show it."""
    target = write_mixed_target(tmp_path / "mixed.gguf")
    port = free_port()
    env = {"GGUF_EXACT_RUN_DIR": str(tmp_path / "run")}
    serve(["--engine", "python", "--model", str(target), "--no-draft", "--port", str(port), "--no-probe"], env)
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        server = {"temperature": 0.8, "top_p": 0.95, "extra_body": {"top_k": 40, "min_p": 0.05, "repeat_penalty": 1.0}}
        python = server | {"extra_body": server["extra_body"] | {"repeat_penalty": 1.1}}

        def text(**kw) -> str:
            return c.completions.create(model="mixed", prompt="the cat", max_tokens=24, seed=7, **kw).choices[0].text

        default = text()
        assert default == text(**server)
        assert default != text(**python)
        assert default != text(temperature=0)
        whole = c.completions.create(model="mixed", prompt="the cat", temperature=0)
        # to the context's end or the model's own end of text, never llama-cpp-python's 16 tokens (with patch
        # 39j's one-row F16 path this target's greedy text ends itself after 177 tokens)
        if whole.choices[0].finish_reason == "length":
            assert whole.usage.completion_tokens + whole.usage.prompt_tokens == 512
        else:
            assert whole.choices[0].finish_reason == "stop" and whole.usage.completion_tokens > 16
    finally:
        CliRunner().invoke(main, ["stop", "--port", str(port)], env=env)
