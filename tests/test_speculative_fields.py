"""One per-request speculative contract in both engines (issue 41 §3): ``speculative.n_max``,
``.p_min``, ``.adaptive`` and ``.rejection_sampling`` (issue 38), dotted or inside a
``speculative`` object, are taken by ``serve --engine python`` and by llama-server (patches 23
and 38) alike, and what one refuses the other
refuses with the same HTTP 400 and the same message naming the field
(:func:`gguf_exact.engines.python.draft_length.request_speculation`)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from _llama_server import TEST_SETTINGS, free_port, server_binary
from click.testing import CliRunner
from test_faults_servers import HOST, auth, http

from gguf_exact.cli import main
from gguf_exact.engines.python.draft_length import RequestSpeculation, request_speculation
from gguf_exact.engines.shared.http import get_metrics
from gguf_exact.tiny.pairs import write_runner_pairs

DRAFT_TOKENS, DRAFT_PASSES = "llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_drafts_total"

# (what the request adds, the field its refusal names)
REFUSED = [
    ({"speculative": "yes"}, "speculative"),
    ({"speculative": [1]}, "speculative"),
    ({"speculative": 2}, "speculative"),
    ({"speculative": {"n_max": -3}}, "speculative.n_max"),
    ({"speculative.n_max": -3}, "speculative.n_max"),
    ({"speculative": {"n_max": 1.5}}, "speculative.n_max"),
    ({"speculative": {"n_max": 2.0}}, "speculative.n_max"),
    ({"speculative": {"n_max": True}}, "speculative.n_max"),
    ({"speculative": {"n_max": 2**31}}, "speculative.n_max"),
    ({"speculative": {"p_min": 1.5}}, "speculative.p_min"),
    ({"speculative.p_min": -0.1}, "speculative.p_min"),
    ({"speculative": {"p_min": "high"}}, "speculative.p_min"),
    ({"speculative": {"adaptive": "yes"}}, "speculative.adaptive"),
    ({"speculative.adaptive": 1}, "speculative.adaptive"),
    ({"speculative": {"n_min": 2}}, "speculative.n_min"),
    ({"speculative": {"n_max": 1, "type": "x"}}, "speculative.type"),
    ({"speculative": {"n_max": 1}, "speculative.n_max": 1}, "speculative.n_max"),
    ({"speculative": {"adaptive": False}, "speculative.adaptive": True}, "speculative.adaptive"),
    ({"speculative": {"rejection_sampling": "yes"}}, "speculative.rejection_sampling"),
    ({"speculative.rejection_sampling": 0}, "speculative.rejection_sampling"),
    ({"speculative": {"rejection_sampling": 1}, "speculative.rejection_sampling": 1}, "speculative.rejection_sampling"),
]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    return write_runner_pairs(tmp_path_factory.mktemp("pairs"))


def test_the_contract_as_the_python_engine_reads_it():
    assert request_speculation({"speculative": {"n_max": 2, "p_min": 0.5, "adaptive": False}}) == RequestSpeculation(
        2, 0.5, False
    )
    assert request_speculation({"speculative.n_max": 2, "speculative": {"p_min": 1}}) == RequestSpeculation(2, 1.0)
    # null is absent, in either form, so it is not given twice either
    assert request_speculation({"speculative": None, "speculative.n_max": 0}) == RequestSpeculation(0)
    assert request_speculation({"speculative": {"n_max": None}, "speculative.n_max": 1}) == RequestSpeculation(1)
    assert request_speculation({"speculative": {}}) == RequestSpeculation()
    off, on = RequestSpeculation(rejection_sampling=False), RequestSpeculation(rejection_sampling=True)
    assert request_speculation({"speculative.rejection_sampling": False}) == off
    assert request_speculation({"speculative": {"rejection_sampling": True}}) == on
    assert request_speculation({"speculative": {"n_min": 2}}) == (
        "speculative.n_min is not a per-request speculative field (n_max, p_min, adaptive, rejection_sampling)",
        "speculative.n_min",
    )
    assert request_speculation({"speculative.rejection_sampling": 0}) == (
        "speculative.rejection_sampling must be true or false, got 0",
        "speculative.rejection_sampling",
    )
    assert request_speculation({"speculative": {"n_max": 2**31 - 1}}) == RequestSpeculation(2**31 - 1)
    assert request_speculation({"speculative": "yes"}) == (
        "speculative must be an object (n_max, p_min, adaptive, rejection_sampling), got a string",
        "speculative",
    )
    assert request_speculation({"speculative": {"n_max": -3}}) == (
        "speculative.n_max must be an integer from 0 (no drafts) to 2147483647, got -3",
        "speculative.n_max",
    )
    assert request_speculation({"speculative": {"n_max": 1}, "speculative.n_max": 1}) == (
        'speculative.n_max is given twice, as "speculative.n_max" and inside "speculative": give it once',
        "speculative.n_max",
    )
    for extra, field in REFUSED:
        message, named = request_speculation(extra)
        assert named == field and message.startswith(field + " "), (extra, message)


def drafts(port: int, key: str, extra: dict) -> tuple[int, int]:
    """(draft tokens, passes that carried drafts) of one greedy completion with ``extra``."""
    base = f"http://{HOST}:{port}"
    before = get_metrics(base, key)
    body = {"prompt": "abc abc abc", "max_tokens": 16, "temperature": 0} | extra
    code, raw = http(port, "POST", "/v1/completions", json.dumps(body).encode(), auth(key))
    assert code == 200, (extra, raw[:300])
    after = get_metrics(base, key)
    return tuple(int(after.get(n, 0.0) - before.get(n, 0.0)) for n in (DRAFT_TOKENS, DRAFT_PASSES))


@pytest.mark.bindings
@pytest.mark.llama_server
@pytest.mark.parametrize("engine", ["python", "llama-server"])
def test_both_engines_take_and_refuse_the_same_speculative_fields(engine, pairs, tmp_path):
    key = "k-" + secrets.token_hex(8)
    port = free_port()
    env = {"GGUF_EXACT_RUN_DIR": str(tmp_path / "run"), "GGUF_EXACT_API_KEY": key}
    target, drafter = pairs["hidden"]  # always right: a pass drafts as many as it may
    extra = ["--server-bin", str(server_binary())] if engine == "llama-server" else []
    sets = [a for s in TEST_SETTINGS for a in ("--set", s)]  # a fixed length of 2
    args = ["serve", "--engine", engine, "--model", target, "--draft", drafter, "--host", HOST, "--port", port]
    started = CliRunner().invoke(main, [*map(str, args), "--profile", "cpu", *sets, *extra, "--detach"], env=env)
    assert started.exit_code == 0, started.output
    refusals = {}
    try:
        for fields, field in REFUSED:
            completion = {"prompt": "abc", "max_tokens": 2} | fields
            chat = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 2} | fields
            for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
                code, raw = http(port, "POST", path, json.dumps(body).encode(), auth(key))
                message = json.loads(raw).get("error", {}).get("message") if raw else raw
                refusals[(json.dumps(fields), path)] = (code, message, field)
        counts = {
            name: drafts(port, key, fields)
            for name, fields in {
                "server's": {},
                "nested 1": {"speculative": {"n_max": 1}},
                "dotted 1": {"speculative.n_max": 1},
                "nested 0": {"speculative": {"n_max": 0}},
                "nested null": {"speculative": None},
                "nested 1, p_min 0": {"speculative": {"n_max": 1, "p_min": 0, "adaptive": False}},
            }.items()
        }
    finally:
        stop = CliRunner().invoke(main, ["stop", "--port", str(port)], env=env)
    assert stop.exit_code == 0, stop.output
    print(engine, counts, refusals)
    # each refusal: 400, the Python engine's own message for it (so the same words from both engines)
    answered = {key: code for key, (code, _, _) in refusals.items() if code != 400}
    assert not answered, answered
    for (fields, path), (_, message, field) in refusals.items():
        want = request_speculation(json.loads(fields))[0]
        assert message == want and message.startswith(field + " "), (fields, path, message)
    # the server's length is 2; a request's n_max, nested or dotted, bounds each pass; 0: no drafts
    tokens, passes = counts["server's"]
    assert passes > 0 and tokens > passes  # 2 per pass but where the budget left fewer
    for name in ("nested 1", "dotted 1", "nested 1, p_min 0"):
        tokens, passes = counts[name]
        assert passes > 0 and tokens == passes, (name, counts[name])
    assert counts["nested 0"] == (0, 0)
    assert counts["nested null"] == counts["server's"]
