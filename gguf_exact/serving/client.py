"""A greedy ``/completion`` against a running llama-server, as a :class:`.Generation`.

llama-server reports ``timings`` per request: ``predicted_n``, ``predicted_ms``,
``predicted_per_second`` (generation after the prompt) and, when it drafted,
``draft_n`` / ``draft_n_accepted``. Target passes are not reported; they follow
from the identity the in-process runner also keeps (every pass yields one token
of its own plus the drafts it accepts): passes = tokens - accepted.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from gguf_exact.errors import GgufExactError
from gguf_exact.speculative.loop import Generation


def post_json(url: str, body: dict, timeout: float = 600.0) -> dict:
    """POST ``body`` as JSON; the JSON answer. One-line errors."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise GgufExactError(f"{url}: HTTP {e.code}: {e.read()[:200].decode('utf-8', 'replace')}") from None
    except (urllib.error.URLError, OSError) as e:
        raise GgufExactError(f"{url}: no answer ({e}); is llama-server running there?") from None
    except ValueError:
        raise GgufExactError(f"{url}: the answer is not JSON") from None


def server_generate(url: str, prompt: str, n_predict: int) -> Generation:
    """Greedy completion of ``prompt`` (temperature 0, no prompt cache) by the
    llama-server at ``url``, with its counters and timings."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "return_tokens": True, "cache_prompt": False}
    res = post_json(url.rstrip("/") + "/completion", body)
    timings = res.get("timings")
    if not isinstance(timings, dict) or "predicted_n" not in timings:
        raise GgufExactError(f"{url}: the answer has no timings.predicted_n; is this llama-server?")
    n = int(timings["predicted_n"])
    accepted = int(timings.get("draft_n_accepted", 0))
    gen = Generation(tokens=[int(t) for t in res.get("tokens", [])], n_prompt=int(timings.get("prompt_n", 0)), n_max=-1)
    gen.text = res.get("content", "")
    gen.drafts_generated = int(timings.get("draft_n", 0))
    gen.drafts_accepted = accepted
    gen.target_passes = n - accepted
    gen.stopped = bool(res.get("stopped_eos", False))
    gen.prefill_seconds = float(timings.get("prompt_ms", 0.0)) / 1e3
    gen.wall_seconds = gen.prefill_seconds + float(timings.get("predicted_ms", 0.0)) / 1e3
    gen.target_seconds = gen.wall_seconds  # all C++; no Python overhead to report
    if not gen.tokens:
        gen.tokens = [-1] * n  # an older server that does not return token ids
    return gen


__all__ = ["post_json", "server_generate"]
