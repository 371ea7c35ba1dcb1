"""Helpers for the tests that run a real llama-server (built by scripts/build-llama-cpp.sh)."""

import json
import os
import socket
import urllib.request
from pathlib import Path

import pytest

from gguf_exact.serving.llama_build import find_build

# Small and quick on two cores; the cpu profile gives --parallel 1 and draft-mtp.
TEST_SETTINGS = ("ctx-size=512", "threads=2", "batch-size=64", "ubatch-size=64", "no-warmup=true")
PROMPTS = ("def f(x): return x + 1", "the quick brown fox", "abc abc abc", "print(1) if x: for")


def server_binary() -> Path:
    """The cached CPU llama-server; skips (or fails under `make test`) when not built."""
    build = find_build("cpu")
    if build is None:
        message = "llama-server is not built; run `make llama-server` (scripts/build-llama-cpp.sh)"
        if os.environ.get("GGUF_EXACT_REQUIRE_SERVER"):
            pytest.fail(message)
        pytest.skip(message)
    return build.binary("llama-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post_json(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def complete(url: str, prompt: str, n_predict: int = 16) -> dict:
    """A greedy completion with the generated token ids."""
    return post_json(
        url + "/completion",
        {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": 0,
            "return_tokens": True,
            "cache_prompt": False,
            "ignore_eos": True,
        },
    )
