"""``gguf-exact serve --engine python``: llama-cpp-python's OpenAI-compatible server on the engine.

The routes are llama-cpp-python's own (``llama_cpp.server.app.router``:
``/v1/completions`` and ``/v1/chat/completions``, streaming or not, ``/v1/models``,
``/v1/embeddings``, ``/extras/*``), serving one :class:`~gguf_exact.speculative.engine.MtpLlama`
(the target with its MTP drafter). Added here:

- ``/health`` (``{"status": "ok"}``, as llama-server answers once loaded) and
  ``/metrics`` in Prometheus text with llama-server's names where it has them
  (``llamacpp:spec_decode_num_draft_tokens_total``, ``..._accepted_tokens_total``,
  ``..._drafts_total``, ``..._accepted_tokens_per_pos_total{position=}``,
  ``llamacpp:n_decode_total``, ``tokens_predicted_total`` ...) and ``gguf_exact:``
  names where it has none (acceptance rate, tokens per target pass, Python time);
- :class:`RequestChecks`, which answers malformed JSON, an unknown model, a
  negative ``max_tokens``, a prompt that does not fit the context and unsupported
  logprobs with HTTP 4xx and an OpenAI-style ``{"error": {...}}`` *before* the
  request reaches the route (a streamed answer has sent its 200 by the time the
  model would notice);
- one request at a time: llama-cpp-python's lock queues the others, and
  ``interrupt_requests`` is off so a waiting request never cuts a stream short;
- per request, llama-server's log line ``draft acceptance = ... (A accepted / G
  generated), mean len = ...``, which ``gguf-exact status`` reads;
- llama-server's ``cache_prompt``: ``false`` decodes the request's prompt whole instead
  of resuming from the previous request's cache (:data:`.engine.PROMPT_CACHE`);
- llama-server's sampling defaults for requests that name none
  (:func:`with_server_defaults`), and :class:`ApiKeyCheck` when started with an API key
  (``$GGUF_EXACT_API_KEY``): 401 for every request without it but ``/health``.

Why not ``llama_cpp.server.app.create_app``: it always builds its own ``Llama``
from ``ModelSettings``; :func:`build_app` does what it does (same middleware,
same router, same settings object) around the engine that is already loaded.

Served by the llama-cpp-python engine's process (:mod:`gguf_exact.engines.llama_cpp_python`),
which :func:`gguf_exact.engines.launch.start_server` starts after checking the files and
the port, and which keeps the pid file and log like a llama-server's.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from gguf_exact.speculative.engine import PROMPT_CACHE, MtpLlama

log = logging.getLogger("gguf_exact.server")

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")


class SingleModel:
    """The model proxy the upstream routes call (``llama_proxy(body.model)``): one engine, one name."""

    def __init__(self, llm: MtpLlama, alias: str) -> None:
        self.llm = llm
        self.alias = alias

    def __call__(self, model: str | None = None) -> MtpLlama:
        return self.llm  # RequestChecks has refused other names already

    def __iter__(self):
        yield self.alias

    def __getitem__(self, model: str) -> dict:
        return {"model": str(self.llm.model_path), "model_alias": self.alias}

    def free(self) -> None:
        self.llm.close()


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


class RequestChecks:
    """ASGI middleware: refuse a completion request that cannot be served, before it starts."""

    def __init__(self, app: Any, llm: MtpLlama, names: set[str], stats: dict) -> None:
        self.app = app
        self.llm = llm
        self.names = names
        self.stats = stats

    def problem(self, path: str, raw: bytes) -> tuple[int, str, str | None, str | None] | None:
        """(status, message, code, param) for a request to refuse, else None."""
        try:
            body = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            return 400, f"the request body is not valid JSON: {e}", "invalid_json", None
        if not isinstance(body, dict):
            return 400, "the request body must be a JSON object", "invalid_json", None
        model = body.get("model")
        if model is not None and model not in self.names:
            names = ", ".join(sorted(self.names))
            return 404, f"the model {model!r} does not exist; this server serves {names}", "model_not_found", "model"
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
            return 400, f"max_tokens must be an integer, got {max_tokens!r}", None, "max_tokens"
        if isinstance(max_tokens, int) and max_tokens < 0:
            return (
                400,
                f"max_tokens must be >= 0 (0 or none: up to the end of the context), got {max_tokens}",
                None,
                "max_tokens",
            )
        for key in ("n", "best_of"):
            if body.get(key) not in (None, 1):
                return 400, f"{key} = {body[key]!r}: this server answers with one choice (n = 1)", None, key
        bad_field = self.field_problem(path, body)
        if bad_field is not None:
            return 400, bad_field[0], None, bad_field[1]
        try:
            if path == "/v1/chat/completions":
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    return 400, "messages must be a non-empty list", None, "messages"
                kwargs = {k: body[k] for k in ("tools", "tool_choice") if body.get(k) is not None}
                prompt = self.llm.chat_prompt_tokens(messages, **kwargs)
                logprobs = body.get("logprobs") or None
            else:
                p = body.get("prompt", "")
                if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
                    p = p[0]
                if not (isinstance(p, str) or (isinstance(p, list) and all(isinstance(t, int) for t in p))):
                    return 400, "prompt must be a string or a list of token ids", None, "prompt"
                prompt = self.llm.prompt_tokens(p)
                logprobs = body.get("logprobs")
            n_prompt = len(prompt) if prompt is not None else 0
            self.llm.check_request(n_prompt, max_tokens, logprobs)
        except ValueError as e:
            text = str(e)
            code = "context_length_exceeded" if "context window" in text else None
            return 400, text, code, "messages" if "messages" in body else "prompt"
        except Exception as e:  # a chat template that fails on these messages, a bad field type
            return 400, f"cannot read the request: {e}", None, None
        return None

    @staticmethod
    def field_problem(path: str, body: dict) -> tuple[str, str] | None:
        """Checked against llama-cpp-python's own request models, which its routes would
        otherwise report as HTTP 500 (its error handler catches validation errors)."""
        import pydantic
        from llama_cpp.server.types import CreateChatCompletionRequest, CreateCompletionRequest

        model = CreateChatCompletionRequest if path == "/v1/chat/completions" else CreateCompletionRequest
        try:
            model.model_validate(body)
        except pydantic.ValidationError as e:
            err = e.errors()[0]
            loc = [str(x) for x in err["loc"]]
            if loc[0] == "messages" and len(loc) > 1:
                return (
                    f"messages[{loc[1]}] is not a chat message: it needs a role (system, user, assistant, tool) and its content",
                    "messages",
                )
            return f"{'.'.join(loc)}: {err['msg']}", loc[0]
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in COMPLETION_PATHS:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        bad = self.problem(scope["path"], raw)
        if bad is None:
            raw = with_server_defaults(scope["path"], raw)
        if bad is not None:
            status, message, code, param = bad
            log.info("refused %s: HTTP %d %s", scope["path"], status, message)
            body = error_body(status, message, code, param)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        # llama-server's cache_prompt: false: this request's prompt is decoded whole, not
        # resumed from the previous request's (the route runs the engine in a worker thread,
        # which sees this task's context variables)
        fresh = PROMPT_CACHE.set(False) if json.loads(raw).get("cache_prompt") is False else None
        with self.stats["lock"]:
            self.stats["waiting"] += 1
        try:
            await self.app(scope, replay, send)
        finally:
            with self.stats["lock"]:
                self.stats["waiting"] -= 1
            if fresh is not None:
                PROMPT_CACHE.reset(fresh)


class ApiKeyCheck:
    """ASGI middleware: with an API key, every request but ``/health`` must carry it
    (``Authorization: Bearer KEY``, as the OpenAI clients send it, or ``X-Api-Key``),
    else HTTP 401 with llama-server's own error body. Checked before anything else
    reads the request."""

    PUBLIC = ("/health", "/v1/health")

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    def allowed(self, headers: list[tuple[bytes, bytes]]) -> bool:
        import hmac

        given = dict((k.lower(), v) for k, v in headers)
        value = given.get(b"authorization") or given.get(b"x-api-key") or b""
        value = value[7:] if value[:7].lower() == b"bearer " else value
        return hmac.compare_digest(value.strip(), self.key)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.PUBLIC or self.allowed(scope.get("headers", [])):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})


def with_server_defaults(path: str, raw: bytes) -> bytes:
    """The request body with llama-server's sampling defaults
    (:data:`gguf_exact.runtime.sampling_defaults.SERVER_SAMPLING`) where it names none,
    and, for ``/v1/completions`` without ``max_tokens``, no limit but the context, as
    llama-server answers (llama-cpp-python's own: ``repeat_penalty`` 1.1, 16 tokens)."""
    from gguf_exact.runtime.sampling_defaults import SERVER_SAMPLING

    body = json.loads(raw)
    filled = {k: v for k, v in SERVER_SAMPLING.items() if body.get(k) is None}
    if path == "/v1/completions" and "max_tokens" not in body:
        filled["max_tokens"] = None
    return json.dumps(body | filled).encode() if filled else raw


def metrics_text(llm: MtpLlama, in_flight: int) -> str:
    """Prometheus text: llama-server's metric names where it has them, ``gguf_exact:`` otherwise."""
    t = llm.totals

    def item(kind: str, name: str, help_: str, value: float) -> str:
        return f"# HELP {name} {help_}\n# TYPE {name} {kind}\n{name} {value:g}\n"

    out = [
        item("counter", "llamacpp:prompt_tokens_total", "Number of prompt tokens processed", t.prompt_tokens),
        item("counter", "llamacpp:tokens_predicted_total", "Number of generation tokens processed (end-of-generation tokens included)", t.tokens),
        item("counter", "llamacpp:tokens_predicted_seconds_total", "Total time spent generating tokens (after the first of each request)", t.generation_seconds),
        item("counter", "llamacpp:prompt_seconds_total", "Total time spent processing prompts (up to the first token)", t.prefill_seconds),
        item("counter", "llamacpp:n_decode_total", "Total number of target llama_decode() calls (target passes; a chunked prompt counts once)", t.target_passes),
        item("counter", "llamacpp:spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", t.draft_tokens),
        item("counter", "llamacpp:spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model", t.accepted_tokens),
        item("counter", "llamacpp:spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", t.drafts),
        item("counter", "gguf_exact:requests_total", "Completed generation calls", t.requests),
        item("counter", "gguf_exact:target_decode_seconds_total", "Time inside the target's llama_decode", t.target_seconds),
        item("counter", "gguf_exact:target_rows_total", "Batch rows the target decoded (prompt rows not reused from the cache included)", llm.target_rows),
        item("counter", "gguf_exact:draft_decode_seconds_total", "Time inside the drafter's llama_decode", t.drafter_seconds),
        item("counter", "gguf_exact:generate_seconds_total", "Time inside generate calls (prompt included)", t.wall_seconds),
        item("gauge", "llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s", t.tokens_per_second or 0.0),
        item("gauge", "llamacpp:requests_processing", "Number of requests processing or waiting", in_flight),
        item("gauge", "gguf_exact:spec_decode_acceptance_rate", "Accepted share of draft tokens", t.acceptance_rate or 0.0),
        item("gauge", "gguf_exact:tokens_per_target_pass", "Generated tokens per target pass", t.tokens_per_target_pass or 0.0),
        item("gauge", "gguf_exact:python_us_per_target_pass", "Time inside generate but outside llama_decode, per target pass (us)", t.python_us_per_pass or 0.0),
        item("gauge", "gguf_exact:spec_draft_n_max", "Most draft tokens per target pass", llm.n_max),
    ]  # fmt: skip
    if t.accepted_per_position:
        name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        out.append(f"# HELP {name} Accepted tokens per draft position\n# TYPE {name} counter\n")
        out += [f'{name}{{position="{i}"}} {n}\n' for i, n in enumerate(t.accepted_per_position)]
    return "".join(out)


def acceptance_line(g: Any) -> str:
    """llama-server's per-request line (``gguf_exact.engines.stats.parse_acceptance`` reads it)."""
    rate = g.drafts_accepted / g.drafts_generated
    return (
        f"draft acceptance = {rate:.5f} ({g.drafts_accepted:5d} accepted / {g.drafts_generated:5d} generated), "
        f"mean len = {g.mean_accepted_length:5.2f}"
    )


def build_app(llm: MtpLlama, alias: str, api_key: str | None = None) -> Any:
    """The FastAPI app: llama-cpp-python's router on ``llm``, plus /health, /metrics and the checks."""
    from fastapi import FastAPI
    from fastapi.middleware import Middleware
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import JSONResponse, PlainTextResponse
    from llama_cpp.server import app as upstream
    from llama_cpp.server.settings import ServerSettings
    from starlette_context.middleware import RawContextMiddleware
    from starlette_context.plugins import RequestIdPlugin

    upstream.set_server_settings(ServerSettings(api_key=api_key, interrupt_requests=False))
    upstream._llama_proxy = SingleModel(llm, alias)  # the routes read this module global
    app = FastAPI(
        middleware=[Middleware(RawContextMiddleware, plugins=(RequestIdPlugin(),))],
        title="gguf-exact: llama-cpp-python with an MTP drafter",
    )
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])
    app.include_router(upstream.router)
    stats = {"lock": threading.Lock(), "waiting": 0}

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics_text(llm, stats["waiting"]), media_type="text/plain; version=0.0.4")

    def on_generation(g: Any) -> None:
        if g.drafts_generated:
            log.info("%s", acceptance_line(g))

    llm.on_generation = on_generation
    names = {alias, str(llm.model_path), Path(llm.model_path).name}
    checked = RequestChecks(app, llm, names, stats)
    return ApiKeyCheck(checked, api_key) if api_key else checked


def default_alias(target: str | Path) -> str:
    """The model name clients send: the target file's name without ``.gguf``."""
    return Path(target).name.removesuffix(".gguf")


__all__ = ["ApiKeyCheck", "RequestChecks", "build_app", "default_alias", "metrics_text"]
