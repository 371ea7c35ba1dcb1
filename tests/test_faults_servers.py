"""Both servers under faults (issue 26 §4), through the public CLI and HTTP only, on
127.0.0.1, every loop bounded in count and time: clients that disconnect mid-stream, a
prompt over the context, invalid UTF-8 and malformed JSON, wrong and missing API keys,
64 concurrent requests. Every request gets an HTTP answer or a clean close; the server
keeps serving (the same greedy tokens after as before), its RSS stays bounded, `status`
stays right, and `stop` leaves no process behind."""

from __future__ import annotations

import json
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _llama_server import free_port, server_binary
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.engines.shared.process import alive

SETTINGS = ["--set", "ctx-size=512", "--set", "threads=2", "--set", "batch-size=64", "--set", "ubatch-size=64"]
HOST = "127.0.0.1"
TIMEOUT = 120.0  # seconds any one request may take
RSS_GROWTH_LIMIT = 64 << 20  # bytes the server may grow by over the whole fault run


BAD_BODIES = {
    "invalid UTF-8": b'{"model": "m", "prompt": "\xff\xfe\xc3(", "max_tokens": 4}',
    "malformed JSON": b'{"prompt": "abc", "max_tokens": ',
    "not an object": b'["abc"]',
    "empty body": b"",
    "a number as the prompt": b'{"prompt": 123, "max_tokens": 4}',
    "token ids beyond the vocabulary": b'{"prompt": [999999999, -1], "max_tokens": 4}',
    "negative max_tokens": b'{"prompt": "abc", "max_tokens": -5}',
    "a word as the temperature": b'{"prompt": "abc", "max_tokens": 4, "temperature": "hot"}',
}
# Both engines answer each with 400. llama-server (0c1e57098) called a body that is not JSON
# its own fault (500, nlohmann's parse_error) until the request guard's patch (#42).


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny-pairs")
    result = CliRunner().invoke(main, ["make-tiny", str(root), "--pairs"])
    assert result.exit_code == 0, result.output
    return root / "pairs"


def http(
    port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, early: bool = False
):
    """One raw HTTP/1.1 exchange: (status, body bytes); (None, b"") for a clean close
    without an answer. Raw sockets, so a body can be invalid UTF-8 or not JSON at all.
    ``early``: the headers go first and the body only if no answer came within 2 s (a server
    may refuse a declared length before reading it: the Python engine does)."""
    head = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", "Connection: close", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection((HOST, port), timeout=TIMEOUT) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + (b"" if early else body))
        chunks = []
        if early:
            s.settimeout(2.0)
            try:
                chunks.append(s.recv(1 << 16))
            except TimeoutError:
                s.settimeout(TIMEOUT)
                s.sendall(body)
        while True:
            data = s.recv(1 << 16)
            if not data:
                break
            chunks.append(data)
    raw = b"".join(chunks)
    if not raw:
        return None, b""
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def greedy(port: int, key: str, model: str, prompt: str = "abc abc abc", n: int = 8) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0}
    code, raw = http(port, "POST", "/v1/completions", json.dumps(body).encode(), auth(key))
    assert code == 200, raw[:300]
    return json.loads(raw)["choices"][0]["text"]


def start_stream(port: int, key: str, model: str) -> tuple[socket.socket, bool]:
    """A long streamed completion, read up to its first event: (the open socket, whether
    an event came)."""
    body = json.dumps({"model": model, "prompt": "abc", "max_tokens": 400, "temperature": 0, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Length: {len(body)}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n\r\n"
    ).encode()
    s = socket.create_connection((HOST, port), timeout=TIMEOUT)
    s.sendall(head + body)
    got = b""
    while b"data:" not in got:
        data = s.recv(4096)
        if not data:
            break
        got += data
    return s, b"data:" in got


def disconnect_mid_stream(port: int, key: str, model: str) -> bool:
    """Start a long streamed completion, read its first event, and hang up."""
    s, streaming = start_stream(port, key, model)
    s.close()
    return streaming


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def server_pids(run: Path, port: int) -> list[int]:
    """The server's pid and its children's (the engine's own processes)."""
    pid = int((run / str(port) / "server.pid").read_text())
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [pid, *(int(c) for c in children.read_text().split())] if children.exists() else [pid]


def start_agreeing_pair(engine: str, pairs: Path, tmp_path: Path) -> tuple[str, int, Path, dict, Path]:
    """`serve --detach` of the agreeing tiny pair on 127.0.0.1 with an API key: (key, port, run
    root, the environment its CLI calls need, the target)."""
    key = "k-" + secrets.token_hex(8)
    port = free_port()
    run = tmp_path / "run"
    env = {"GGUF_EXACT_RUN_DIR": str(run), "GGUF_EXACT_API_KEY": key}
    target, drafter = pairs / "agreeing" / "target.gguf", pairs / "agreeing" / "drafter.gguf"
    extra = ["--server-bin", str(server_binary())] if engine == "llama-server" else []
    args = ["serve", "--engine", engine, "--model", target, "--draft", drafter, "--host", HOST, "--port", port]
    started = CliRunner().invoke(main, [*map(str, args), "--profile", "cpu", *SETTINGS, *extra, "--detach"], env=env)
    assert started.exit_code == 0, started.output
    return key, port, run, env, target


@pytest.mark.bindings
@pytest.mark.llama_server
@pytest.mark.parametrize("engine", ["python", "llama-server"])
def test_a_server_under_faults_keeps_serving(engine, pairs, tmp_path):
    key, port, run, env, target = start_agreeing_pair(engine, pairs, tmp_path)
    pids = server_pids(run, port)
    model = str(target.resolve())  # one name in both engines: the full path, as llama-server gives it
    figures: dict[str, object] = {}
    inflight: list[tuple[socket.socket, bool]] = []
    try:
        before = greedy(port, key, model)
        rss_before = rss(pids[0])

        # clients that hang up mid-stream, one after another
        assert all(disconnect_mid_stream(port, key, model) for _ in range(8))

        # a prompt over the 512-token context: an answer that says so, not a dead server
        code, raw = http(port, "POST", "/v1/completions", json.dumps(
            {"model": model, "prompt": "abc " * 2000, "max_tokens": 4}).encode(), auth(key))  # fmt: skip
        figures["over the context"] = (code, raw[:160])
        assert code is not None and 400 <= code < 500, figures["over the context"]

        # invalid UTF-8 and malformed JSON bodies: the client's fault, 400 with a JSON error each
        for name, body in BAD_BODIES.items():
            code, raw = http(port, "POST", "/v1/completions", body, auth(key))
            figures[name] = (code, raw[:160])
            assert code == 400 and json.loads(raw)["error"]["message"], (name, code, raw[:300])

        # wrong and missing API keys
        for headers in ({"Authorization": "Bearer not-" + key}, {}):
            code, _ = http(port, "POST", "/v1/completions", b'{"prompt": "abc", "max_tokens": 4}', headers)
            assert code == 401

        # 64 concurrent requests: each gets its answer
        prompts = [f"abc {i} abc" for i in range(64)]
        deadline = time.monotonic() + 600
        with ThreadPoolExecutor(64) as pool:
            codes = list(pool.map(lambda p: http(port, "POST", "/v1/completions", json.dumps(
                {"model": model, "prompt": p, "max_tokens": 4, "temperature": 0}).encode(), auth(key))[0], prompts))  # fmt: skip
        assert time.monotonic() < deadline
        figures["64 concurrent"] = {c: codes.count(c) for c in set(codes)}
        assert codes == [200] * 64, figures["64 concurrent"]

        # still serving, the same tokens; memory bounded
        assert greedy(port, key, model) == before
        rss_after = rss(pids[0])
        figures["rss"] = (rss_before, rss_after)
        print(f"{engine}: RSS {rss_before / 2**20:.1f} MiB before, {rss_after / 2**20:.1f} MiB after; {figures}")
        assert rss_after - rss_before < RSS_GROWTH_LIMIT, figures["rss"]

        st = CliRunner().invoke(main, ["status", "--port", str(port), "--json"], env=env)
        assert st.exit_code == 0, st.output
        data = json.loads(st.stdout)
        assert data["running"] and data["health"] == "ok" and data["models"] == [model], data
        # stopped while four streams are being answered
        inflight += [start_stream(port, key, model) for _ in range(4)]
        assert all(streaming for _, streaming in inflight)
    finally:
        stop = CliRunner().invoke(main, ["stop", "--port", str(port)], env=env)
        for sock, _ in inflight:
            sock.close()
    assert stop.exit_code == 0 and stop.stdout.startswith("stopped "), stop.output
    end = time.monotonic() + 30
    while any(alive(p, None) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p, None)], "stop left a process behind"
    with pytest.raises(OSError):
        socket.create_connection((HOST, port), timeout=2).close()


# --- hostile requests: the request guard in front of both engines (issue 42) --------------------


def nested_grammar(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def chained_rules(n: int) -> str:
    """Rules that each reference the next: llama.cpp recurses along the chain (200,000: 3.8 MB,
    a SIGSEGV in libllama before the grammar's size was bounded)."""
    return "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(n)) + f'r{n} ::= "a"\n'


def nested_schema_text(depth: int) -> str:
    return '{"type": "object", "properties": {"x": ' * depth + '{"type": "string"}' + "}}" * depth


def hostile_requests(model: str) -> list[tuple[str, str, bytes, int, str]]:
    """(name, path, body, status, what the error message says)."""
    from gguf_exact.engines.shared.request_guard import LIMITS

    deep_json = f"the request's JSON is nested deeper than this server's limit of {LIMITS.json_depth} levels"
    deep_grammar = f"the grammar nests groups deeper than this server's limit of {LIMITS.grammar_depth}"
    large = f"the request body is over this server's limit of {LIMITS.body_bytes} bytes"
    completion = '{"model": "%s", "prompt": "abc", "max_tokens": 2, %%s}' % model
    chat = '{"model": "%s", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 2, %%s}' % model
    schema = nested_schema_text(20000)
    return [
        ("a grammar nested 20,000 deep", "/v1/completions",
         (completion % f'"grammar": {json.dumps(nested_grammar(20000))}').encode(), 400, deep_grammar),
        ("a json_schema nested 20,000 deep", "/v1/completions",
         (completion % f'"json_schema": {schema}').encode(), 400, deep_json),
        ("a response_format schema nested 20,000 deep", "/v1/chat/completions",
         (chat % f'"response_format": {{"type": "json_schema", "json_schema": {{"name": "n", "schema": {schema}}}}}').encode(),
         400, deep_json),
        ("messages nested 100,000 deep", "/v1/chat/completions",
         b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, deep_json),
        ("a body one byte over the limit", "/v1/completions",
         (completion % '"stop": "%s"' % ("x" * LIMITS.body_bytes)).encode()[: LIMITS.body_bytes + 1], 413, large),
        ("a grammar of 200,000 chained rules", "/v1/completions",
         (completion % f'"grammar": {json.dumps(chained_rules(200000))}').encode(), 400,
         f"the grammar is over this server's limit of {LIMITS.grammar_bytes} bytes"),
        ("a grammar that does not parse", "/v1/completions",
         (completion % '"grammar": "root ::= ("').encode(), 400, ""),
        ("a repetition past llama.cpp's 2,000", "/v1/completions",
         (completion % '"grammar": "root ::= \\"a\\"{2001}"').encode(), 400, ""),
        ("a grammar without a root rule", "/v1/completions",
         (completion % '"grammar": "x ::= \\"a\\""').encode(), 400, ""),
        ("a grammar of bytes that are not UTF-8", "/v1/completions",
         (completion % '"grammar": "root ::= \\"').encode() + b'\xff\xfe"}', 400, ""),
    ]  # fmt: skip


def fuzzed_bodies(seed: int, count: int) -> list[bytes]:
    """Seeded: nesting at and past the limits in each field, random bytes, truncated JSON."""
    import random

    rng = random.Random(seed)
    fields = ["prompt", "grammar", "stop", "logit_bias", "messages", "json_schema", "n_probs", "model"]
    bodies = []
    for _ in range(count):
        kind = rng.choice(["nested", "bytes", "truncated"])
        if kind == "nested":
            depth = rng.choice([1, 2, 62, 63, 64, 65, 500, 20000])
            opener = [rng.choice("[{") for _ in range(depth)]
            nested = "".join("[" if c == "[" else '{"k": ' for c in opener) + "1"
            nested += "".join("]" if c == "[" else "}" for c in reversed(opener))
            bodies.append(f'{{"prompt": "abc", "max_tokens": 1, "{rng.choice(fields)}": {nested}}}'.encode())
        elif kind == "bytes":
            bodies.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000))))
        else:
            whole = json.dumps({"prompt": "abc", "max_tokens": 1, "grammar": nested_grammar(rng.randrange(1, 80))})
            bodies.append(whole[: rng.randrange(1, len(whole))].encode())
    return bodies


@pytest.mark.bindings
@pytest.mark.llama_server
@pytest.mark.parametrize("engine", ["python", "llama-server"])
def test_no_request_crashes_a_server(engine, pairs, tmp_path):
    """Each of the probe's killer requests is refused naming the limit; a grammar at the limit
    is served (and obeyed); 60 fuzzed bodies get an answer each; the same process then serves
    the same greedy text as before."""
    key, port, run, env, target = start_agreeing_pair(engine, pairs, tmp_path)
    pid = server_pids(run, port)[0]
    model = str(target.resolve())
    try:
        before = greedy(port, key, model)
        for name, path, body, status, message in hostile_requests(model):
            code, raw = http(port, "POST", path, body, auth(key), early=True)
            assert code == status, (name, code, raw[:300])
            assert message in json.loads(raw)["error"]["message"], (name, raw[:300])
            assert alive(pid, None), name
        from gguf_exact.engines.shared.request_guard import LIMITS

        at_limit = {"model": model, "prompt": "abc", "max_tokens": 4, "temperature": 0,
                    "grammar": nested_grammar(LIMITS.grammar_depth)}  # fmt: skip
        code, raw = http(port, "POST", "/v1/completions", json.dumps(at_limit).encode(), auth(key))
        assert code == 200 and json.loads(raw)["choices"][0]["text"] == "a", raw[:300]
        answers: dict[int | None, int] = {}
        for body in fuzzed_bodies(seed=42, count=60):
            code, raw = http(port, "POST", "/v1/completions", body, auth(key), early=True)
            answers[code] = answers.get(code, 0) + 1
            assert code is not None and code < 500, (body[:200], code, raw[:300])
        print(f"{engine}: fuzzed answers {answers}")
        assert alive(pid, None) and greedy(port, key, model) == before
    finally:
        CliRunner().invoke(main, ["stop", "--port", str(port)], env=env)
