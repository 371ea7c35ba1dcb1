"""The request guard's rules, apart from any server (gguf_exact/engines/shared/request_guard.py); the
servers under hostile requests are in tests/test_faults_servers.py."""

from __future__ import annotations

import json

import pytest

from gguf_exact.engines.shared.request_guard import LIMITS, RequestLimits, check_body, grammar_depth, json_depth


@pytest.mark.parametrize(
    "raw, depth",
    [
        (b"", 0),
        (b"1", 0),
        (b"[]", 1),
        (b'{"a": [1, {"b": 2}]}', 3),
        (b'{"a": "[[[[{{{{"}', 1),  # brackets inside a string do not nest
        (rb'{"a": "\"[[[", "b": [[]]}', 3),  # nor after an escaped quote
        (rb'{"a": "\\", "b": [[]]}', 3),  # an escaped backslash ends before the quote
        (b"[" * 20000 + b"]" * 20000, 20000),
        (b"[" * 5 + b'"' + b"[" * 100, 5),  # an unterminated string: the parser stops there
        (b"]]]][[", 0),  # more closed than opened: never below the top
        (b'{"k": "\xff\xfe", "v": [[1]]}', 3),  # bytes that are not UTF-8 are still counted past
    ],
)
def test_json_depth_counts_on_the_bytes(raw, depth):
    assert json_depth(raw) == depth


@pytest.mark.parametrize(
    "grammar, depth",
    [
        ('root ::= "a"', 0),
        ('root ::= ("a" | ("b" "c"))*', 2),
        ('root ::= "((((" [()] x\nx ::= ("y")', 1),  # parentheses in literals and classes are text
        ('root ::= "\\"(((" ( "a" )', 1),  # an escaped quote does not end the literal
        ('root ::= [\\](((] ( "a" )', 1),  # nor an escaped bracket the class
        ('# ((((((\nroot ::= ( "a" )', 1),  # comments are skipped
        ("root ::= " + "(" * 20000 + '"a"' + ")" * 20000, 20000),
    ],
)
def test_grammar_depth_counts_groups(grammar, depth):
    assert grammar_depth(grammar) == depth


def nested_grammar(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def nested_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def nested_schema_text(depth: int) -> str:
    """:func:`nested_schema` as text, for depths Python's json cannot write."""
    return '{"type": "object", "properties": {"x": ' * depth + '{"type": "string"}' + "}}" * depth


def test_check_body_refuses_past_each_limit_and_names_it():
    limits = RequestLimits(body_bytes=1000, json_depth=8, grammar_depth=3)
    ok = json.dumps({"prompt": "abc", "grammar": nested_grammar(3)}).encode()
    assert check_body(ok, limits) is None
    too_large = check_body(b" " * 1001, limits)
    assert (too_large.status, too_large.message) == (413, "the request body is over this server's limit of 1000 bytes")
    deep = check_body(json.dumps({"a": [[[[[[[[1]]]]]]]]}).encode(), limits)
    assert (deep.status, deep.message) == (
        400,
        "the request's JSON is nested deeper than this server's limit of 8 levels",
    )
    grammar = check_body(json.dumps({"grammar": nested_grammar(4)}).encode(), limits)
    assert (grammar.status, grammar.param) == (400, "grammar")
    assert grammar.message == "the grammar nests groups deeper than this server's limit of 3"
    big = check_body(
        json.dumps({"grammar": 'root ::= "' + "a" * 1000 + '"'}).encode(), RequestLimits(grammar_bytes=1000)
    )
    assert (big.status, big.param, big.message) == (
        400,
        "grammar",
        "the grammar is over this server's limit of 1000 bytes",
    )
    # not JSON: the engine's own parser answers it (400 there)
    assert check_body(b'{"grammar": "((((((", ', limits) is None


def test_the_shipped_limits_take_real_requests_and_refuse_the_probes():
    """What a client sends (a tool schema a dozen levels deep, a grammar of a few groups) passes;
    the probe's 40 KB requests (depth 20,000) and a 10 MB body do not."""
    tool = {"type": "function", "function": {"name": "f", "parameters": nested_schema(12)}}
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "tools": [tool]}
    assert json_depth(json.dumps(chat).encode()) == 29 and check_body(json.dumps(chat).encode()) is None
    assert check_body(json.dumps({"prompt": "x", "grammar": nested_grammar(LIMITS.grammar_depth)}).encode()) is None
    assert check_body(json.dumps({"prompt": "x", "grammar": nested_grammar(20000)}).encode()).status == 400
    assert json.loads(nested_schema_text(3)) == nested_schema(3)
    schema = '{"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": %s}}}'
    assert check_body((schema % nested_schema_text(10000)).encode()).status == 400
    assert check_body(b"[" * 100000 + b"]" * 100000).status == 400
    assert check_body(json.dumps({"prompt": "x" * (10 << 20)}).encode()).status == 413
