"""`gguf-exact serve --engine python` with the official `openai` client, on the hidden-state pair.

Two servers for the module, started as the CLI starts them (a detached process, pid
file and log in the run directory): the pair, and the target alone, to compare
answers token for token. The hidden pair has no near-ties, so greedy and seeded
answers must be identical.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from _llama_server import TEST_SETTINGS, free_port
from click.testing import CliRunner

from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.cli import main
from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.shared.http import get_metrics
from gguf_exact.engines.shared.settings import ServeSettings
from gguf_exact.engines.shared.status import server_status, stop_server
from gguf_exact.tiny.hidden_pair import write_hidden_state_pair

PROMPTS = load_prompts()
ALIAS = "target"  # the target file's name without .gguf: requests may name the model so
CHAT = [{"role": "system", "content": "answer briefly"}, {"role": "user", "content": "count for me"}]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return write_hidden_state_pair(tmp_path_factory.mktemp("hidden"))


def _serve(target: Path, drafter: Path | None):
    launch = plan_launch(
        ServeSettings(target, drafter, "cpu", [*TEST_SETTINGS, "spec-draft-n-max=3"], port=free_port(), engine="python")
    )
    proc, _ = start_server(launch, detach=True, timeout=120)
    return launch, proc


@pytest.fixture(scope="module")
def servers(run_dir, pair):
    spec, p1 = _serve(*pair)
    alone, p2 = _serve(pair[0], None)
    yield spec, alone
    for launch, proc in ((spec, p1), (alone, p2)):
        stop_server(launch.port)
        proc.wait(timeout=30)


def client(launch) -> openai.OpenAI:
    return openai.OpenAI(base_url=launch.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def post_raw(url: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.bindings
def test_models_health_and_the_command(servers):
    spec, _ = servers
    # the engine's own module, reading the settings plan_launch resolved (no profile, no pair check)
    assert spec.command[1:] == [
        "-m",
        "gguf_exact.engines.python.server_main",
        "--settings",
        str(spec.run_dir / "settings.json"),
    ]
    written = json.loads((spec.run_dir / "settings.json").read_text())
    assert written["pair_checked"] is True and written["engine_options"]["n_max"] == 3
    assert written["profile"]["server"]["ctx-size"] == 512 and written["api_key"] is False
    assert [m.id for m in client(spec).models.list().data] == [str(spec.settings.target_path.resolve())]
    with urllib.request.urlopen(spec.url + "/health") as r:
        assert json.loads(r.read()) == {"status": "ok"}


# exact match, asked per request (the shipped profile verifies sampled drafts by speculative
# sampling, which keeps the target's distribution but not its text for a seed): same seed, same text
EXACT: dict = {"extra_body": {"speculative": {"rejection_sampling": False}}}


@pytest.mark.bindings
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 42, "top_p": 0.9}])
def test_completions_equal_the_target_alone(servers, sampling):
    spec, alone = servers
    for name in ("code", "prose"):
        a = client(spec).completions.create(model=ALIAS, prompt=PROMPTS[name], max_tokens=40, **sampling, **EXACT)
        b = client(alone).completions.create(model=ALIAS, prompt=PROMPTS[name], max_tokens=40, **sampling)
        assert (a.choices[0].text, a.usage) == (b.choices[0].text, b.usage)
        text = PROMPTS[name]
        chunks = client(spec).completions.create(model=ALIAS, prompt=text, max_tokens=40, stream=True, **sampling, **EXACT)
        assert "".join(c.choices[0].text for c in chunks) == a.choices[0].text


@pytest.mark.bindings
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}])
def test_chat_equals_the_target_alone(servers, sampling):
    spec, alone = servers
    a = client(spec).chat.completions.create(model=ALIAS, messages=CHAT, max_tokens=30, **sampling, **EXACT)
    b = client(alone).chat.completions.create(model=ALIAS, messages=CHAT, max_tokens=30, **sampling)
    assert (a.choices[0].message.content, a.usage) == (b.choices[0].message.content, b.usage)
    chunks = client(spec).chat.completions.create(
        model=ALIAS, messages=CHAT, max_tokens=30, stream=True, **sampling, **EXACT
    )
    streamed = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert streamed == a.choices[0].message.content


@pytest.mark.bindings
def test_metrics_move_and_agree_with_the_clients_counts(servers):
    spec, _ = servers
    before = get_metrics(spec.url)
    usages = [
        client(spec).completions.create(model=ALIAS, prompt=text, max_tokens=24, temperature=0).usage
        for text in PROMPTS.values()
    ]
    after = get_metrics(spec.url)

    def d(name):
        return after[name] - before.get(name, 0.0)

    tokens = d("llamacpp:tokens_predicted_total")
    drafted, accepted = (
        d("llamacpp:spec_decode_num_draft_tokens_total"),
        d("llamacpp:spec_decode_num_accepted_tokens_total"),
    )
    assert tokens == sum(u.completion_tokens for u in usages) == 4 * 24
    assert d("llamacpp:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert drafted > 0 and accepted == drafted  # the hidden pair's drafter is always right
    assert d("llamacpp:n_decode_total") == tokens - accepted  # every pass: its accepted drafts + 1
    assert d("llamacpp:spec_decode_num_drafts_total") > 0
    rate = (
        after["llamacpp:spec_decode_num_accepted_tokens_total"] / after["llamacpp:spec_decode_num_draft_tokens_total"]
    )
    assert after["gguf_exact:spec_decode_acceptance_rate"] == pytest.approx(rate, abs=1e-5)  # since the start
    per_pass = after["llamacpp:tokens_predicted_total"] / after["llamacpp:n_decode_total"]
    assert after["gguf_exact:tokens_per_target_pass"] == pytest.approx(per_pass, abs=1e-5)
    assert after['llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"}'] > 0


@pytest.mark.bindings
@pytest.mark.parametrize("stream", [False, True])
def test_cache_prompt_false_decodes_the_whole_prompt_as_llama_server_does(servers, stream):
    """The same prompt again: by default the request resumes from the previous one's cache
    (here all of it: nothing is decoded before its token is sampled); with cache_prompt
    false it decodes every prompt row, as llama-server does."""
    spec, _ = servers
    prompt = PROMPTS["code"]

    def rows(extra: dict) -> tuple[float, str, int]:
        before = get_metrics(spec.url)
        body = {"model": ALIAS, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": stream} | extra
        req = urllib.request.Request(
            spec.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read().decode()
        after = get_metrics(spec.url)
        n_prompt = int(after["llamacpp:prompt_tokens_total"] - before.get("llamacpp:prompt_tokens_total", 0.0))
        return after["gguf_exact:target_rows_total"] - before["gguf_exact:target_rows_total"], raw, n_prompt

    rows({})  # the prompt is now the cached one
    resumed, _, n_prompt = rows({})
    whole, _, n_again = rows({"cache_prompt": False})
    assert n_prompt == n_again > 2
    assert resumed == 0  # the whole prompt was cached, with its last row's logits
    assert whole == n_prompt  # every prompt row decoded again
    again, _, _ = rows({"cache_prompt": True})
    assert again == 0  # the flag lasts one request


@pytest.mark.bindings
def test_two_clients_at_once_both_get_their_whole_answer(servers):
    spec, _ = servers
    c = client(spec)
    expect_completion = (
        c.completions.create(model=ALIAS, prompt=PROMPTS["code"], max_tokens=60, temperature=0).choices[0].text
    )
    expect_chat = (
        c.chat.completions.create(model=ALIAS, messages=CHAT, max_tokens=60, temperature=0).choices[0].message.content
    )
    got: list[tuple[str, str]] = []

    def completion():
        res = client(spec).completions.create(model=ALIAS, prompt=PROMPTS["code"], max_tokens=60, temperature=0)
        got.append(("completion", res.choices[0].text))

    def chat():
        chunks = client(spec).chat.completions.create(
            model=ALIAS, messages=CHAT, max_tokens=60, temperature=0, stream=True
        )
        got.append(("chat", "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices)))

    threads = [threading.Thread(target=f) for f in (chat, completion, chat, completion)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(got) == sorted([("chat", expect_chat), ("completion", expect_completion)] * 2)


@pytest.mark.bindings
def test_bad_requests_get_4xx_and_the_server_keeps_serving(servers):
    spec, _ = servers
    c = client(spec)
    code, body = post_raw(spec.url + "/v1/completions", b'{"prompt": "the", "max_tokens": ')
    assert code == 400 and "not valid JSON" in body["error"]["message"]
    code, body = post_raw(spec.url + "/v1/chat/completions", b"[1, 2]")
    assert code == 400 and "JSON object" in body["error"]["message"]
    # any model name is served, as llama-server serves it; the answer carries the served name
    other = c.completions.create(model="gpt-4o", prompt="the", max_tokens=4)
    assert (other.model, other.usage.completion_tokens) == (str(spec.settings.target_path.resolve()), 4)
    with pytest.raises(openai.BadRequestError, match=r"Requested tokens \(\d+\) exceed context window of 512"):
        c.completions.create(model=ALIAS, prompt="the river " * 400, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="exceed context window"):
        list(c.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "x " * 900}], stream=True))
    with pytest.raises(openai.BadRequestError, match="max_tokens must be >= 0"):
        c.completions.create(model=ALIAS, prompt="the", max_tokens=-1)
    with pytest.raises(openai.BadRequestError, match="messages must be a non-empty list"):
        c.chat.completions.create(model=ALIAS, messages=[], max_tokens=4)
    code, body = post_raw(spec.url + "/v1/completions", b'{"prompt": "the", "temperature": "hot"}')
    assert code == 400 and body["error"]["message"].startswith("temperature: Input should be a valid number")
    code, body = post_raw(spec.url + "/v1/chat/completions", b'{"messages": [{"role": "user"}]}')
    assert code == 400 and "messages[0] is not a chat message" in body["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="this server answers with one choice"):
        c.chat.completions.create(model=ALIAS, messages=CHAT, max_tokens=4, n=2)
    with pytest.raises(openai.BadRequestError, match="logprobs need every row's logits kept"):
        c.completions.create(model=ALIAS, prompt="the", max_tokens=4, logprobs=2)
    ok = c.completions.create(model=ALIAS, prompt="the", max_tokens=5, temperature=0)
    assert ok.usage.completion_tokens == 5 and ok.choices[0].finish_reason == "length"


@pytest.mark.bindings
def test_status_and_log_lines(servers, run_dir):
    spec, _ = servers
    client(spec).completions.create(model=ALIAS, prompt="the", max_tokens=12, temperature=0)
    st = server_status(spec.port)
    assert st.up and st.state["engine"] == "python" and st.speculative
    assert 0 < st.counters.accepted_tokens <= st.counters.draft_tokens  # sampled requests ran before
    assert st.recent and st.recent[-1].rate == 1.0 and st.recent[-1].accepted > 0
    res = CliRunner().invoke(main, ["status", "--port", str(spec.port)])
    assert (
        res.exit_code == 0 and "engine       python" in res.output and "request      acceptance 1.00000" in res.output
    )


def _refused(*args: str) -> str:
    res = CliRunner().invoke(main, ["serve", "--engine", "python", *args])
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    return lines[0]


def test_refused_before_binding(pair, run_dir, tmp_path):
    target, drafter = pair
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _refused("--model", str(target), "--draft", str(drafter), "--port", str(port))
        assert f"port {port} on 127.0.0.1 is in use" in line
    assert "no such file" in _refused("--model", str(tmp_path / "none.gguf"), "--port", str(free_port()))
    assert "no such file" in _refused("--model", str(target), "--draft", str(tmp_path / "d.gguf"), "--port", "9")
    line = _refused("--model", str(target), "--draft", str(target), "--port", str(free_port()))
    assert "general.architecture is 'gemma4', expected 'gemma4-assistant'" in line
    assert "--server-bin" in _refused("--model", str(target), "--server-bin", "/bin/true", "--port", str(free_port()))
    assert not any(run_dir.glob("*/server.pid")) or all(
        server_status(int(p.parent.name)).running for p in run_dir.glob("*/server.pid")
    )


@pytest.mark.bindings
def test_stop_then_status_says_down(pair, run_dir):
    launch, proc = _serve(pair[0], pair[1])
    res = CliRunner().invoke(main, ["stop", "--port", str(launch.port)])
    assert res.exit_code == 0 and f"stopped python engine server on port {launch.port}" in res.output
    assert proc.wait(timeout=30) in (0, -15)  # uvicorn shuts down, then re-raises SIGTERM
    res = CliRunner().invoke(main, ["status", "--port", str(launch.port)])
    assert res.exit_code == 1 and "down" in res.output


@pytest.mark.bindings
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "the quick brown fox", "max_tokens": 4, "temperature": 0}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "temperature": 0}),
    ],
)
def test_a_request_is_parsed_checked_and_tokenized_once(pair, path, body, stream):
    """The check tokenizes the prompt; llama-cpp-python's own tokenize calls for the same
    text (create_completion, the chat handler) are answered from it: one tokenizer call."""
    import asyncio

    import httpx2 as httpx  # the HTTP client the openai package (test extra) brings

    from gguf_exact.engines.python.load import load_with_drafter
    from gguf_exact.engines.python.openai_server import build_app
    from gguf_exact.engines.python.request import CURRENT_REQUEST

    llm = load_with_drafter(*pair, n_max=2, n_ctx=256, n_threads=2)
    calls = []
    tokenize = llm.tokenizer_.tokenize
    llm.tokenizer_.tokenize = lambda *a, **k: calls.append(a[0]) or tokenize(*a, **k)
    app = build_app(llm, ALIAS)

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as c:
            return await c.post(path, json=body | {"stream": stream}, timeout=120)

    try:
        answer = asyncio.run(send())
        assert answer.status_code == 200, answer.text
        assert len(calls) == 1 and CURRENT_REQUEST.get() is None
        assert llm.last_generation is not None and llm.last_generation.n_tokens == 4
        calls.clear()
        assert (
            llm.tokenize(b"the quick brown fox", add_bos=False, special=True) and len(calls) == 1
        )  # outside a request: each call
    finally:
        llm.close()


@pytest.mark.bindings
def test_past_the_queue_bound_a_request_is_answered_503_with_retry_after(pair):
    """The Python engine answers one request at a time: with one request in hand and one waiting
    (max_waiting=1), a third is 503 with Retry-After at once, and /metrics counts it; the two
    admitted ones are then answered whole. The engine is held on an event (the route's call of
    it, not the queue under test) so that the three are in flight together."""
    import asyncio
    import threading

    import httpx2 as httpx

    from gguf_exact.engines.python.load import load_with_drafter
    from gguf_exact.engines.python.openai_server import build_app

    llm = load_with_drafter(*pair, n_max=2, n_ctx=256, n_threads=2)
    release, entered = threading.Event(), threading.Event()
    create = llm.create_completion

    def held(*args, **kwargs):
        entered.set()
        release.wait(60)
        return create(*args, **kwargs)

    llm.create_completion = held
    app = build_app(llm, ALIAS, max_waiting=1)
    body = {"prompt": "abc abc", "max_tokens": 4, "temperature": 0}

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://engine", timeout=120) as c:
            first = asyncio.create_task(c.post("/v1/completions", json=body))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            second = asyncio.create_task(c.post("/v1/completions", json=body))
            await asyncio.sleep(0.2)  # admitted: it waits on llama-cpp-python's lock
            third = await c.post("/v1/completions", json=body)
            metrics = (await c.get("/metrics")).text
            release.set()
            return await first, await second, third, metrics

    try:
        first, second, third, metrics = asyncio.run(run())
        assert third.status_code == 503 and int(third.headers["retry-after"]) >= 1
        error = third.json()["error"]
        assert error["code"] == "server_busy" and error["type"] == "server_error"
        assert (
            error["message"] == "the server is busy (queue full: 1 waiting); the engine answers one request at a time"
        )
        assert "llamacpp:requests_deferred 1\n" in metrics and "llamacpp:requests_processing 1\n" in metrics
        assert "gguf_exact:requests_turned_away_total 1\n" in metrics
        assert [r.status_code for r in (first, second)] == [200, 200]
        assert first.json()["choices"][0]["text"] == second.json()["choices"][0]["text"]
        assert first.json()["usage"]["completion_tokens"] == 4
    finally:
        llm.close()
