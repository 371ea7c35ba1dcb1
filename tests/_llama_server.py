"""Helpers for the tests that run a real llama-server (built by scripts/build-llama-cpp.sh)."""

import json
import urllib.request
from pathlib import Path

import pytest

from gguf_exact.builds.llama_build import find_build
from gguf_exact.engines.shared.process import free_port  # noqa: F401  (the tests' free port: the one the benchmarks use)

# Small and quick on two cores; the cpu profile gives --parallel 1 and draft-mtp.
# A fixed draft length: on tiny models a drafter step costs what a target pass does, so the
# adaptive length would rightly draft little, and the tests count drafts.
TEST_SETTINGS = (
    "ctx-size=512",
    "threads=2",
    "batch-size=64",
    "ubatch-size=64",
    "no-warmup=true",
    "spec-draft-adaptive=false",
    "spec-draft-n-max=2",
)
PROMPTS = ("def f(x): return x + 1", "the quick brown fox", "abc abc abc", "print(1) if x: for")


def server_binary() -> Path:
    """The cached CPU llama-server. A test that needs it fails when it is not built (never
    skips: `make test` builds it first)."""
    build = find_build("cpu")
    if build is None:
        pytest.fail("llama-server is not built; run `make llama-server` (scripts/build-llama-cpp.sh)")
    return build.binary("llama-server")


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post_json(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def completion_body(prompt: str, n_predict: int = 16) -> dict:
    """The body of a greedy ``/completion`` request that returns its token ids."""
    return {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0,
        "return_tokens": True,
        "cache_prompt": False,
        "ignore_eos": True,
    }


def complete(url: str, prompt: str, n_predict: int = 16) -> dict:
    """A greedy completion with the generated token ids."""
    return post_json(url + "/completion", completion_body(prompt, n_predict))


def model_infos(log_text: str) -> list[dict[str, str]]:
    """llama.cpp's own reading of each model it loaded: the ``print_info: key = value``
    lines (``--log-verbosity 4``), one dict per model, in load order."""
    models: list[dict[str, str]] = []
    for line in log_text.splitlines():
        _, sep, rest = line.partition("print_info: ")
        key, eq, value = rest.partition(" = ")
        if not sep or not eq:
            continue
        if key.strip() == "arch":
            models.append({})
        if models:
            models[-1][key.strip()] = value.strip()
    return models


def per_layer(info: dict[str, str], key: str, n_layer: int) -> list[int]:
    """A per-layer value as llama.cpp prints it: one number when all layers agree, else a list."""
    value = info[key]
    if value.startswith("["):
        return [int(v) for v in value.strip("[]").split(",")]
    return [int(value)] * n_layer


def shared_kv_mismatches(log_text: str, drafter_swa: list[bool]) -> list[str]:
    """Where the drafter would read the target's KV cache with the wrong row width.

    llama.cpp gives each ``gemma4-assistant`` sliding layer the target's layer
    ``n_layer - 2`` cache and each full layer ``n_layer - 1``'s (``llama-model.cpp``,
    the ``share`` callback), and views it with the drafter's own ``n_embd_k_gqa`` /
    ``n_embd_v_gqa``, unchecked in a release build: the widths must be equal.
    ``drafter_swa``: the drafter's sliding pattern (llama.cpp does not print it)."""
    infos = model_infos(log_text)
    target = next(i for i in infos if i["arch"] == "gemma4")
    drafter = next(i for i in infos if i["arch"] == "gemma4-assistant")
    n_target = int(target["n_layer_all"])
    out = []
    for key in ("n_embd_k_gqa", "n_embd_v_gqa"):
        t_rows = per_layer(target, key, n_target)
        d_rows = per_layer(drafter, key, int(drafter["n_layer_all"]))
        for il, (rows, swa) in enumerate(zip(d_rows, drafter_swa, strict=True)):
            src = n_target - 2 if swa else n_target - 1
            if rows != t_rows[src]:
                out.append(f"drafter layer {il} {key} {rows} != target layer {src} {t_rows[src]}")
    return out
