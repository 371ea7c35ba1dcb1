"""The HTTP client of both engines' servers (urllib): health, ``/metrics``, and requests as :class:`.Generation` s.

- :func:`get_text`, :func:`health`: a GET (with the API key, if any) that never raises.

- :func:`server_generate`: a greedy ``/completion`` against llama-server, which
  reports ``timings`` per request: ``predicted_n``, ``predicted_ms``,
  ``predicted_per_second`` (generation after the prompt) and, when it drafted,
  ``draft_n`` / ``draft_n_accepted``.
- :func:`openai_generate`: a ``/v1/completions`` request to either engine
  (llama-server or ``serve --engine python``), timed by the client, with the
  server's draft counters read from ``/metrics`` before and after (the servers run
  one request at a time, so the difference is this request's).

Target passes are not reported; they follow from the identity the engine keeps
(every pass yields one token of its own plus the drafts it accepts): passes =
tokens - accepted.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from gguf_exact.constants import API_KEY_ENV
from gguf_exact.engines.shared.generation import Generation
from gguf_exact.errors import Param, ServerError


def post_json(url: str, body: dict, timeout: float = 600.0) -> dict:
    """POST ``body`` as JSON; the JSON answer. One-line errors."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise ServerError(f"{url}: HTTP {e.code}: {e.read()[:200].decode('utf-8', 'replace')}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ServerError(f"{url}: no answer ({e}); is llama-server running there?") from None
    except ValueError:
        raise ServerError(f"{url}: the answer is not JSON") from None


def server_generate(url: str, prompt: str, n_predict: int) -> Generation:
    """Greedy completion of ``prompt`` (temperature 0, no prompt cache) by the
    llama-server at ``url``, with its counters and timings."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "return_tokens": True, "cache_prompt": False}
    res = post_json(url.rstrip("/") + "/completion", body)
    timings = res.get("timings")
    if not isinstance(timings, dict) or "predicted_n" not in timings:
        raise ServerError(f"{url}: the answer has no timings.predicted_n; is this llama-server?")
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


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The ``Authorization`` header a server started with ``--api-key`` wants (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def get_text(url: str, timeout: float = 3.0, api_key: str | None = None) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=auth_headers(api_key)), timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def health(url: str) -> str:
    """``ok`` (200), ``loading`` (503), ``down`` (no answer) or ``http NNN``."""
    code, _ = get_text(url + "/health")
    return {200: "ok", 503: "loading", 0: "down"}.get(code, f"http {code}")


def get_metrics(url: str, api_key: str | None = None) -> dict[str, float]:
    """``/metrics`` of a server, parsed (:func:`gguf_exact.engines.shared.stats.parse_metrics`)."""
    from gguf_exact.engines.shared.stats import parse_metrics

    req = urllib.request.Request(url.rstrip("/") + "/metrics", headers=auth_headers(api_key))
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return parse_metrics(r.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise ServerError(
                f"{url}/metrics: HTTP 401: the server wants its API key; set {API_KEY_ENV}",
                Param("api_key", aside=" (or {})"),
            ) from None
        raise ServerError(f"{url}/metrics: HTTP {e.code}; start the server with metrics on") from None
    except (urllib.error.URLError, OSError) as e:
        raise ServerError(f"{url}/metrics: no answer ({e}); start the server with metrics on") from None


def _delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def openai_generate(
    url: str,
    prompt: str,
    n_predict: int,
    temperature: float = 0.0,
    seed: int | None = None,
    model: str | None = None,
    sampler: dict[str, float] | None = None,
) -> Generation:
    """One ``/v1/completions`` request: text and client-side wall time from the
    answer, tokens and draft counters from the ``/metrics`` difference around it.

    ``wall_seconds`` is the whole request as the client saw it; ``prefill_seconds``
    is set so that ``tokens_per_second`` is the server's own generation-phase rate
    (``llamacpp:tokens_predicted_seconds_total``), as for llama-server's
    ``timings.predicted_per_second``; ``target_seconds`` and ``drafter_seconds``
    are the Python engine's decode times (0 for llama-server). ``sampler``: more of the
    request's sampler fields (``top_k``, ``top_p``, ``min_p``, a ``temperature`` over the argument's)."""
    base = url.rstrip("/")
    # cache_prompt false: llama-server would otherwise restore a prompt it has seen from its
    # cache and skip the prefill (llama-cpp-python only reuses the previous request's prefix).
    # repeat_penalty 1: llama-server's default; llama-cpp-python's server defaults to 1.1.
    body: dict = {
        "prompt": prompt,
        "max_tokens": n_predict,
        "temperature": temperature,
        "repeat_penalty": 1.0,
        "cache_prompt": False,
    } | (sampler or {})
    if seed is not None:
        body["seed"] = seed
    if model is not None:
        body["model"] = model
    before = get_metrics(base)
    t0 = time.perf_counter()
    res = post_json(base + "/v1/completions", body)
    wall = time.perf_counter() - t0
    after = get_metrics(base)
    choices = res.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ServerError(f"{url}: the answer has no choices; is this an OpenAI-compatible server?")
    d = lambda name: _delta(after, before, "llamacpp:" + name)  # noqa: E731
    n = int(d("tokens_predicted_total"))
    gen = Generation(tokens=[-1] * n, n_prompt=int((res.get("usage") or {}).get("prompt_tokens", 0)), n_max=-1)
    gen.text = choices[0].get("text", "")
    gen.drafts_generated = int(d("spec_decode_num_draft_tokens_total"))
    gen.drafts_accepted = int(d("spec_decode_num_accepted_tokens_total"))
    gen.draft_rounds = int(d("spec_decode_num_drafts_total"))
    gen.target_passes = n - gen.drafts_accepted
    gen.wall_seconds = wall
    gen.prefill_seconds = max(0.0, wall - d("tokens_predicted_seconds_total"))
    gen.target_seconds = _delta(after, before, "gguf_exact:target_decode_seconds_total")
    gen.drafter_seconds = _delta(after, before, "gguf_exact:draft_decode_seconds_total")
    if "gguf_exact:generate_seconds_total" in after:
        spent = _delta(after, before, "gguf_exact:generate_seconds_total")
        gen.server_python_seconds = max(0.0, spent - gen.target_seconds - gen.drafter_seconds)
    return gen


__all__ = ["auth_headers", "get_metrics", "get_text", "health", "openai_generate", "post_json", "server_generate"]
