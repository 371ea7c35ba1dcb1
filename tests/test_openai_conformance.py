"""Both engines against one table of OpenAI requests, sent with the official `openai` client.

One server per engine for the module (`serve --detach` on the agreeing tiny pair,
127.0.0.1), the same requests to each: chat and completions, streamed or not,
``max_tokens``, ``max_completion_tokens``, ``stream_options``, ``stop``, ``seed``,
``logprobs``, ``n``, a model name the server does not know, a body without a JSON
Content-Type, and a client that disconnects before its answer. Each answer is reduced to
its shape (object, model, text, finish reason, usage, where the usage comes); the two
engines must give the same, except where docs/serving.md ("OpenAI conformance") says they
differ on purpose: those rows pin each engine's own answer.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any, Callable

import openai
import pytest
from _llama_server import free_port, server_binary
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.engines.shared.http import get_metrics

pytestmark = [pytest.mark.bindings, pytest.mark.llama_server]

HOST = "127.0.0.1"
ENGINES = ("python", "llama-server")
# A context long enough that a request left running holds the Python engine for a minute or
# more (llama-server's slot holds the tiny target's training context, 4,096 tokens).
SETTINGS = ["ctx-size=16384", "threads=2", "batch-size=64", "ubatch-size=64", "no-warmup=true"]
SETTINGS += ["spec-draft-adaptive=false", "spec-draft-n-max=2"]
CHAT = [{"role": "user", "content": "count"}]
UNKNOWN_MODEL = "gpt-4o"  # every request names a model neither server was given


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("conformance")
    made = CliRunner().invoke(main, ["make-tiny", str(root / "tiny"), "--pairs"])
    assert made.exit_code == 0, made.output
    target, drafter = root / "tiny/pairs/agreeing/target.gguf", root / "tiny/pairs/agreeing/drafter.gguf"
    env = {"GGUF_EXACT_RUN_DIR": str(root / "run")}
    started: dict[str, dict[str, Any]] = {}
    try:
        for engine in ENGINES:
            port = free_port()
            args = ["serve", "--engine", engine, "--model", target, "--draft", drafter, "--host", HOST, "--port", port]
            args += ["--profile", "cpu", *(a for s in SETTINGS for a in ("--set", s)), "--detach"]
            if engine == "llama-server":
                args += ["--server-bin", server_binary()]
            result = CliRunner().invoke(main, [str(a) for a in args], env=env)
            assert result.exit_code == 0, result.output
            log = root / "run" / str(port) / "server.log"
            started[engine] = {"port": port, "log": log, "model": str(target.resolve())}
        yield started
    finally:
        for engine in started.values():
            CliRunner().invoke(main, ["stop", "--port", str(engine["port"])], env=env)


def client(server: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{HOST}:{server['port']}/v1", api_key="unused", max_retries=0, timeout=120)


def shape(answer: Any) -> dict[str, Any]:
    """What the table compares: an answer (or a stream of chunks) without ids and times."""
    if isinstance(answer, list):  # a stream's chunks
        with_choices = [c for c in answer if c.choices]
        usage_chunks = [c for c in answer if c.usage is not None]
        texts = [
            c.choices[0].text if c.object == "text_completion" else c.choices[0].delta.content or ""
            for c in with_choices
        ]
        return {
            "object": "/".join(sorted({c.object for c in answer})),
            "model": "/".join(sorted({c.model for c in answer})),  # one name: the path once
            "text": "".join(texts),
            "finish_reason": [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason],
            "usage": [_usage(c.usage) for c in usage_chunks],
            "usage_chunk_has_choices": [bool(c.choices) for c in usage_chunks],
        }
    choice = answer.choices[0]
    return {
        "object": answer.object,
        "model": answer.model,
        "choices": len(answer.choices),
        "text": choice.text if answer.object == "text_completion" else choice.message.content,
        "finish_reason": choice.finish_reason,
        "usage": _usage(answer.usage),
        "logprobs": choice.logprobs is not None,
    }


def _usage(usage: Any) -> tuple[int, int, int]:
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


def chat(**kwargs: Any) -> Callable[[openai.OpenAI], Any]:
    return lambda c: c.chat.completions.create(model=UNKNOWN_MODEL, messages=CHAT, **({"temperature": 0} | kwargs))


def completion(**kwargs: Any) -> Callable[[openai.OpenAI], Any]:
    return lambda c: c.completions.create(model=UNKNOWN_MODEL, prompt="abc", **({"temperature": 0} | kwargs))


def answered(request: Callable[[openai.OpenAI], Any], server: dict) -> dict[str, Any]:
    try:
        answer = request(client(server))
    except openai.APIStatusError as e:
        return {"status": e.status_code}
    return shape(list(answer) if isinstance(answer, openai.Stream) else answer)


# The agreeing target repeats the prompt's last token: "c" after "abc", a newline after the chat template.
# id: (request, what both engines answer, {engine: what it answers instead} where they differ on purpose)
USAGE_STREAM = {"stream": True, "stream_options": {"include_usage": True}}
TABLE: dict[str, tuple[Callable, dict[str, Any], dict[str, dict[str, Any]]]] = {
    "chat max_tokens": (chat(max_tokens=5), {"text": "\n" * 5, "finish_reason": "length", "usage": (61, 5, 66)}, {}),
    "chat max_completion_tokens": (
        chat(max_completion_tokens=3),
        {"text": "\n" * 3, "finish_reason": "length", "usage": (61, 3, 64)},
        {},
    ),
    "max_completion_tokens wins over max_tokens": (
        chat(max_completion_tokens=3, max_tokens=6),
        {"text": "\n" * 3, "finish_reason": "length", "usage": (61, 3, 64)},
        {},
    ),
    "n_predict wins over both": (
        chat(max_completion_tokens=3, max_tokens=6, extra_body={"n_predict": 2}),
        {"text": "\n" * 2, "finish_reason": "length", "usage": (61, 2, 63)},
        {},
    ),
    "completion max_tokens": (
        completion(max_tokens=5),
        {"object": "text_completion", "text": "ccccc", "finish_reason": "length", "usage": (4, 5, 9)},
        {},
    ),
    "completion stop": (
        completion(max_tokens=10, stop=["cc"]),
        {"text": "", "finish_reason": "stop", "usage": (4, 2, 6)},
        {},
    ),
    "chat stop": (chat(max_tokens=10, stop=["\n\n"]), {"text": "", "finish_reason": "stop", "usage": (61, 2, 63)}, {}),
    "seeded sampling": (
        completion(max_tokens=5, temperature=1.0, seed=3),
        {"text": "ccccc", "finish_reason": "length", "usage": (4, 5, 9)},
        {},
    ),
    "n = 2": (completion(max_tokens=5, n=2), {"status": 400}, {}),
    "chat stream": (
        chat(max_tokens=4, stream=True),
        {"text": "\n" * 4, "finish_reason": ["length"], "usage": [], "usage_chunk_has_choices": []},
        {},
    ),
    "chat stream include_usage": (
        chat(max_tokens=4, **USAGE_STREAM),
        {"text": "\n" * 4, "finish_reason": ["length"], "usage": [(61, 4, 65)], "usage_chunk_has_choices": [False]},
        {},
    ),
    "completion stream include_usage": (
        completion(max_tokens=4, **USAGE_STREAM),
        {"text": "cccc", "finish_reason": ["length"], "usage": [(4, 4, 8)]},
        # llama-server puts the usage on its last chunk, the one with the finish reason
        {"python": {"usage_chunk_has_choices": [False]}, "llama-server": {"usage_chunk_has_choices": [True]}},
    ),
    "completion stream": (
        completion(max_tokens=4, stream=True),
        {"text": "cccc", "finish_reason": ["length"]},
        # llama-server sends the usage on every completions stream's last chunk, asked or not
        {
            "python": {"usage": [], "usage_chunk_has_choices": []},
            "llama-server": {"usage": [(4, 4, 8)], "usage_chunk_has_choices": [True]},
        },
    ),
    "completion logprobs": (
        completion(max_tokens=3, logprobs=2),
        {},
        # the Python engine keeps every row's logits only when started with --logprobs
        {"python": {"status": 400}, "llama-server": {"text": "ccc", "logprobs": True, "usage": (4, 3, 7)}},
    ),
    "chat logprobs": (
        chat(max_tokens=3, logprobs=True, top_logprobs=2),
        {},
        {"python": {"status": 400}, "llama-server": {"text": "\n" * 3, "logprobs": True, "usage": (61, 3, 64)}},
    ),
}


@pytest.mark.parametrize("case", TABLE)
def test_the_same_answer_from_both_engines(servers, case):
    request, expected, differences = TABLE[case]
    got = {engine: answered(request, servers[engine]) for engine in ENGINES}
    for engine in ENGINES:
        want = expected | differences.get(engine, {})
        assert {k: got[engine].get(k) for k in want} == want, (engine, got[engine])
    if not differences:
        assert got["python"] == got["llama-server"]
    for engine in ENGINES:  # whatever name the request gave: the target's full path, as llama-server serves it
        assert got[engine].get("model", servers[engine]["model"]) == servers[engine]["model"], got[engine]


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_json_body_is_read_whatever_its_content_type(servers, content_type):
    """curl -d sends form-urlencoded: llama-server reads the body as JSON anyway, and so does the Python engine."""
    body = json.dumps({"prompt": "abc", "max_tokens": 3, "temperature": 0}).encode()
    for engine in ENGINES:
        conn = http.client.HTTPConnection(HOST, servers[engine]["port"], timeout=60)
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("Content-Length", str(len(body)))
        if content_type is not None:
            conn.putheader("Content-Type", content_type)
        conn.endheaders(body)
        answer = conn.getresponse()
        data = json.loads(answer.read())
        conn.close()
        assert answer.status == 200, (engine, data)
        assert (data["choices"][0]["text"], data["usage"]["completion_tokens"]) == ("ccc", 3), engine


LONG = 16000  # tokens the abandoned request asks for: 4 s or more of the Python engine's time (the tiny
# target: up to 4,000 tokens a second, so a client gone after a second saw 4,003 made in CI; it leaves at 0.5 s)
ANSWER_BOUND = 10.0  # seconds a 4-token request may wait after the client before it left


@pytest.mark.parametrize("engine", ENGINES)
def test_a_client_that_leaves_before_its_answer_stops_its_generation(servers, engine):
    """A long request that is not streamed, its client gone after half a second: the next request
    is answered at once. The Python engine stops the abandoned one at its next token (it used
    to generate all of it for nobody); llama-server cancels the task, though on the tiny target
    it has made its 4,091 tokens (its slot's context) in under 2 s, before it looks."""
    server = servers[engine]
    url = f"http://{HOST}:{server['port']}"
    before = get_metrics(url) if engine == "python" else {}
    body = json.dumps({"model": server["model"], "prompt": "abc", "max_tokens": LONG, "temperature": 0}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((HOST, server["port"]), timeout=30) as s:
        s.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.5)
    left = time.monotonic()
    short = client(server).completions.create(model=server["model"], prompt="abc", max_tokens=4, temperature=0)
    waited = time.monotonic() - left
    assert (short.choices[0].text, short.choices[0].finish_reason) == ("cccc", "length")
    assert waited < ANSWER_BOUND, f"{engine}: the next request waited {waited:.1f} s"
    if engine == "python":
        generated = get_metrics(url)["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
        abandoned = int(generated) - 4
        assert 0 < abandoned < LONG // 2, abandoned  # stopped: all of it would be LONG
        log = server["log"].read_text()
        assert "client disconnected from /v1/completions before its answer" in log
        assert f"client disconnected: generation stopped after {abandoned} tokens" in log
