"""The request guard in front of both engines: bounds that keep one request from taking a server down.

llama.cpp parses a GBNF grammar and turns a JSON schema into one with recursive code, on
the stack of the thread that serves the request: a 40 KB request nested 20,000 deep
overflowed it (SIGSEGV in llama-server's grammar code, and in libllama under the Python
engine), and nothing restarted the server. llama-server also read bodies of any size
(10 MB bodies took its RSS from 30 to 435 MB). So every request is checked, before any
parser sees it, against :data:`LIMITS`:

- the body's size (``Content-Length``, or the bytes read so far): HTTP 413;
- the JSON's nesting depth, counted on the raw bytes (outside strings), so no
  recursive parser runs first: HTTP 400. A JSON schema (``json_schema``,
  ``response_format``, tools) nested N deep is JSON nested at least N deep, so this
  bounds schemas too;
- a ``grammar``'s size and nesting depth (parentheses outside strings, character classes and
  comments; each group is a rule llama.cpp recurses through, and so is a chain of rules): HTTP 400.

Each refusal names the limit. The Python engine applies :func:`check_body` in its
middleware (:class:`gguf_exact.engines.python.openai_server.RequestGuard`); llama-server applies
the same rules in C++ (the carried patch ``42-request-guard.patch``), with the limits
given on its command line by :func:`llama_server_args` from this one definition.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestLimits:
    # 8 MiB: a 128k-token prompt is about 0.5 MB of text; bodies ten times that are no
    # chat request, and a server on a small card has no memory to spare for them.
    body_bytes: int = 8 * 1024 * 1024
    # 64: OpenAI's tools and structured outputs stay within 10-15 levels; a schema's level
    # costs two JSON levels (``properties``, the property's name).
    json_depth: int = 64
    # 64 nested groups: grammars written by hand or from schemas nest a handful deep.
    grammar_depth: int = 64
    # 64 KiB of grammar: llama.cpp also recurses along chains of rules that reference each
    # other (200,000 chained rules, a 3.8 MB grammar, overflowed an 8 MB stack; 50,000 did not);
    # a grammar by hand is a few KB, and schemas and tools are turned into grammars server-side.
    grammar_bytes: int = 64 * 1024


LIMITS = RequestLimits()


@dataclass(frozen=True)
class GuardRefusal:
    """Why a request is refused: HTTP status, one-line message, the OpenAI error's ``param``."""

    status: int
    message: str
    param: str | None = None


# A JSON string literal: quotes, then anything but a quote or backslash, or an escaped pair.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_DEPTH_STEP = np.zeros(256, np.int8)  # +1 for a byte that opens an array or object, -1 for one that closes it
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in ``raw``, counted on the bytes (strings
    skipped), so a hostile document costs no recursion. For any document, valid or not."""
    bare = _JSON_STRING.sub(b"", raw)  # C speed: strings removed, brackets inside them with them
    if not bare:
        return 0
    steps = _DEPTH_STEP[np.frombuffer(bare, np.uint8)]
    steps = steps[steps != 0]
    return max(0, int(np.cumsum(steps, dtype=np.int32).max())) if steps.size else 0


# GBNF tokens that can hold a parenthesis without opening a group: string literals,
# character classes (both with backslash escapes) and comments to the end of the line.
_GBNF_SKIPPED = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|\[[^\]\\]*(?:\\.[^\]\\]*)*\]?|#[^\n]*', re.DOTALL)


def grammar_depth(grammar: str) -> int:
    """The deepest nesting of ``( ... )`` groups in a GBNF grammar."""
    depth = deepest = 0
    for char in _GBNF_SKIPPED.sub("", grammar):
        if char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest


def body_too_large(size: int, limits: RequestLimits = LIMITS) -> GuardRefusal | None:
    """A body of ``size`` bytes (declared or read so far) over the limit: HTTP 413."""
    if size <= limits.body_bytes:
        return None
    return GuardRefusal(413, f"the request body is over this server's limit of {limits.body_bytes} bytes")


def check_body(raw: bytes, limits: RequestLimits = LIMITS) -> GuardRefusal | None:
    """The whole body against ``limits``; None when it may go on to the parsers."""
    if (too_large := body_too_large(len(raw), limits)) is not None:
        return too_large
    if json_depth(raw) > limits.json_depth:
        return GuardRefusal(
            400, f"the request's JSON is nested deeper than this server's limit of {limits.json_depth} levels"
        )
    if b'"grammar"' in raw:
        try:
            body = json.loads(raw)  # bounded: the depth is checked
        except (ValueError, UnicodeDecodeError):
            return None  # the engine's own parser answers malformed JSON
        grammar = body.get("grammar") if isinstance(body, dict) else None
        if isinstance(grammar, str) and len(grammar.encode()) > limits.grammar_bytes:
            return GuardRefusal(
                400, f"the grammar is over this server's limit of {limits.grammar_bytes} bytes", "grammar"
            )
        if isinstance(grammar, str) and grammar_depth(grammar) > limits.grammar_depth:
            return GuardRefusal(
                400,
                f"the grammar nests groups deeper than this server's limit of {limits.grammar_depth}",
                "grammar",
            )
    return None


def llama_server_args(limits: RequestLimits = LIMITS) -> list[str]:
    """The same limits on llama-server's command line (options of the carried patch)."""
    return [
        "--request-max-body", str(limits.body_bytes),
        "--request-max-depth", str(limits.json_depth),
        "--grammar-max-depth", str(limits.grammar_depth),
        "--grammar-max-bytes", str(limits.grammar_bytes),
    ]  # fmt: skip


__all__ = [
    "LIMITS",
    "GuardRefusal",
    "RequestLimits",
    "body_too_large",
    "check_body",
    "grammar_depth",
    "json_depth",
    "llama_server_args",
]
