"""``gguf-exact serve --engine python``: llama-cpp-python's OpenAI-compatible server on the engine.

The routes are llama-cpp-python's own (``llama_cpp.server.app.router``:
``/v1/completions`` and ``/v1/chat/completions``, streaming or not, ``/v1/models``,
``/v1/embeddings``, ``/extras/*``), serving one :class:`~gguf_exact.engines.python.engine.MtpLlama`
(the target with its MTP drafter). Added here:

- ``/health`` (``{"status": "ok"}``, as llama-server answers once loaded) and
  ``/metrics`` in Prometheus text with llama-server's names where it has them
  (``llamacpp:spec_decode_num_draft_tokens_total``, ``..._accepted_tokens_total``,
  ``..._drafts_total``, ``..._accepted_tokens_per_pos_total{position=}``,
  ``llamacpp:n_decode_total``, ``tokens_predicted_total`` ...) and ``gguf_exact:``
  names where it has none (acceptance rate, tokens per target pass, Python time);
- :class:`RequestGuard`, the request guard both engines share (:mod:`gguf_exact.engines.shared.request_guard`):
  a body over the size limit (413), JSON or a grammar nested past the depth limits (400)
  is refused before any parser reads it;
- :class:`RequestChecks`, which handles each request once (:mod:`.request`: parsed,
  checked, tokenized) and answers malformed JSON, a negative ``max_tokens``, a prompt
  that does not fit the context and unsupported logprobs with HTTP 4xx and an
  OpenAI-style ``{"error": {...}}`` *before* the request reaches the route; any model
  name is served (as llama-server serves it), and the body is read as JSON whatever its
  Content-Type; a client that leaves before its answer stops its generation;
  ``stream_options.include_usage`` gets OpenAI's usage chunk;
- one request at a time: llama-cpp-python's lock queues the others, and
  ``interrupt_requests`` is off so a waiting request never cuts a stream short;
- per request, llama-server's log line ``draft acceptance = ... (A accepted / G
  generated), mean len = ...``, which ``gguf-exact status`` reads;
- llama-server's ``cache_prompt``: ``false`` decodes the request's prompt whole instead
  of resuming from the previous request's cache (:data:`.engine.PROMPT_CACHE`);
- llama-server's sampling defaults for requests that name none
  (:func:`.request.with_server_defaults`), and :class:`ApiKeyCheck` when started with an API key
  (``$GGUF_EXACT_API_KEY``): 401 for every request without it but ``/health``.

Why not ``llama_cpp.server.app.create_app``: it always builds its own ``Llama``
from ``ModelSettings``; :func:`build_app` does what it does (same middleware,
same router, same settings object) around the engine that is already loaded.

Served by the llama-cpp-python engine's process (:mod:`gguf_exact.engines.python.server_main`),
which :func:`gguf_exact.engines.launch.start_server` starts after checking the files and
the port, and which keeps the pid file and log like a llama-server's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from gguf_exact.engines.python.engine import PROMPT_CACHE, MtpLlama
from gguf_exact.engines.python.llama_adapter import serve_one_model
from gguf_exact.engines.python.request import COMPLETION_PATHS, CURRENT_REQUEST, CheckedRequest, Refusal, check_request
from gguf_exact.engines.python.request_queue import MAX_WAITING, RequestQueue
from gguf_exact.engines.shared.generation import Generation
from gguf_exact.engines.shared.policy_snapshot import snapshot_metrics
from gguf_exact.engines.shared.request_guard import LIMITS, RequestLimits, body_too_large, check_body

log = logging.getLogger("gguf_exact.server")


class SingleModel:
    """The model proxy the upstream routes call (``llama_proxy(body.model)``): one engine, one name."""

    def __init__(self, llm: MtpLlama, alias: str) -> None:
        self.llm = llm
        self.alias = alias

    def __call__(self, model: str | None = None) -> MtpLlama:
        return self.llm  # any name is this model, as llama-server serves it

    def __iter__(self):
        yield self.alias

    def __getitem__(self, model: str) -> dict:
        return {"model": str(self.llm.model_path), "model_alias": self.alias}

    def free(self) -> None:
        self.llm.close()


class RequestChecks:
    """ASGI middleware: each completion request parsed, checked and tokenized once
    (:func:`.request.check_request`) before it reaches the route; refused there with
    HTTP 4xx when it cannot be served (a streamed answer has sent its 200 by the time
    the model would notice). While the route runs, a request that is not streamed has
    its client watched: when it disconnects, the engine stops generating for it
    (llama-cpp-python's route notices only a streamed client's going). A streamed
    request with ``stream_options.include_usage`` gets OpenAI's last chunk (no choices,
    the usage) before ``[DONE]``."""

    def __init__(self, app: Any, llm: MtpLlama, queue: RequestQueue, served: str | None = None) -> None:
        self.app = app
        self.llm = llm
        self.queue = queue
        self.served = served  # the one name answers carry, as /v1/models lists it (whatever name the request used)

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
        checked = check_request(scope["path"], b"".join(chunks), self.llm)
        if isinstance(checked, Refusal):
            log.info("refused %s: HTTP %d %s", scope["path"], checked.status, checked.message)
            await _refuse(send, checked)
            return
        if self.served is not None:
            checked.body = {**checked.body, "model": self.served}
        # The body is JSON whatever its Content-Type says, as llama-server reads it (curl -d
        # sends form-urlencoded): the route is told so, not left to echo the body in an error.
        scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]}
        scope["headers"].append((b"content-type", b"application/json"))

        # The route runs the engine in a worker thread, which sees this task's context
        # variables: the checked request (its tokens) and llama-server's cache_prompt
        # (false: this request's prompt is decoded whole, not resumed from the previous one's).
        current = CURRENT_REQUEST.set(checked)
        fresh = PROMPT_CACHE.set(False) if not checked.cache_prompt else None
        admitted = self.queue.admit()
        if admitted is None:
            busy = f"the server is busy (queue full: {self.queue.max_waiting} waiting); the engine answers one request at a time"
            await _refuse(
                send, Refusal(503, busy, "server_busy"), ((b"retry-after", b"%d" % self.queue.retry_after()),)
            )
            CURRENT_REQUEST.reset(current)
            if fresh is not None:
                PROMPT_CACHE.reset(fresh)
            return
        try:
            if checked.stream:
                await self.app(scope, _replay(checked.raw, receive), _with_usage(send, checked))
            else:
                await _answer_watching_the_client(self.app, scope, checked, receive, send)
        finally:
            self.queue.leave(admitted, checked.started)
            if fresh is not None:
                PROMPT_CACHE.reset(fresh)
            CURRENT_REQUEST.reset(current)


def _replay(raw: bytes, receive: Any) -> Any:
    """The receive channel with the body read already given back first."""
    replayed = False

    async def replay() -> dict:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


async def _answer_watching_the_client(app: Any, scope: dict, checked: CheckedRequest, receive: Any, send: Any) -> None:
    """Run the route while reading the client's channel: an ``http.disconnect`` before the
    answer is sent marks the request abandoned, and the engine stops at its next token
    (llama-server cancels the task so). The route reads what was read here."""
    import anyio

    to_route, for_route = anyio.create_memory_object_stream[dict](max_buffer_size=8)
    answered = False

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not answered:
                    checked.abandoned.set()
                    log.info("client disconnected from %s before its answer: stopping its generation", scope["path"])
                await to_route.send(message)
                return
            await to_route.send(message)

    body_given = False

    async def route_receive() -> dict:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": checked.raw, "more_body": False}
        return await for_route.receive()

    async def route_send(message: dict) -> None:
        nonlocal answered
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered = True
        await send(message)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(watch)
        try:
            await app(scope, route_receive, route_send)
        finally:
            tasks.cancel_scope.cancel()


def _with_usage(send: Any, checked: CheckedRequest) -> Any:
    """``send`` for a streamed answer: with ``stream_options.include_usage``, OpenAI's usage
    chunk (``choices`` empty, the request's ``usage``) goes out before ``data: [DONE]``."""
    if not checked.include_usage:
        return send
    last_event = b""

    async def send_with_usage(message: dict) -> None:
        nonlocal last_event
        if message["type"] == "http.response.body":
            body = message.get("body", b"")
            if body.startswith(b"data: [DONE]") and last_event and (g := checked.generation) is not None:
                await send({"type": "http.response.body", "body": _usage_event(last_event, g), "more_body": True})
            elif body.startswith(b"data: {"):
                last_event = body
        await send(message)

    return send_with_usage


def _usage_event(last_event: bytes, g: Generation) -> bytes:
    """The usage chunk of the request's generation ``g``, with the stream's id, time, model and object;
    counted as llama-cpp-python counts an answer that is not streamed (the end-of-generation token not)."""
    last = json.loads(last_event.removeprefix(b"data: ").strip())
    completion = g.n_tokens - (1 if g.stopped else 0)
    usage = {"prompt_tokens": g.n_prompt, "completion_tokens": completion, "total_tokens": g.n_prompt + completion}
    chunk = {k: last[k] for k in ("id", "object", "created", "model") if k in last} | {"choices": [], "usage": usage}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def _refuse(send: Any, refusal: Refusal, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = refusal.body()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": refusal.status, "headers": head})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware: every request's body against the request guard's limits
    (:mod:`gguf_exact.engines.shared.request_guard`: size, JSON depth, grammar depth) before any
    parser reads it; refused with HTTP 413 or 400 naming the limit. A declared
    ``Content-Length`` over the limit is refused unread; a body is read no further than
    the limit."""

    def __init__(self, app: Any, limits: RequestLimits = LIMITS) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length", b"")
        if declared.isdigit() and (too_large := body_too_large(int(declared), self.limits)) is not None:
            await self._refuse(send, too_large)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if (too_large := body_too_large(size, self.limits)) is not None:
                await self._refuse(send, too_large)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        if (refused := check_body(raw, self.limits)) is not None:
            await self._refuse(send, refused)
            return
        await self.app(scope, _replay(raw, receive), send)

    @staticmethod
    async def _refuse(send: Any, refused: Any) -> None:
        log.info("refused by the request guard: HTTP %d %s", refused.status, refused.message)
        await _refuse(send, Refusal(refused.status, refused.message, "limit_exceeded", refused.param))


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


def metrics_text(llm: MtpLlama, queue: RequestQueue | None = None) -> str:
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
        item("gauge", "llamacpp:requests_processing", "Number of requests processing", min(1, queue.in_flight) if queue else 0),
        item("gauge", "gguf_exact:spec_decode_acceptance_rate", "Accepted share of draft tokens", t.acceptance_rate or 0.0),
        item("gauge", "gguf_exact:tokens_per_target_pass", "Generated tokens per target pass", t.tokens_per_target_pass or 0.0),
        item("gauge", "gguf_exact:python_us_per_target_pass", "Time inside generate but outside llama_decode, per target pass (us)", t.python_us_per_pass or 0.0),
        item("gauge", "gguf_exact:spec_draft_n_max", "Most draft tokens per target pass", llm.n_max),
    ]  # fmt: skip
    out += [item(*row) for row in (queue.metrics() if queue else [])]
    if t.accepted_per_position:
        name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        out.append(f"# HELP {name} Accepted tokens per draft position\n# TYPE {name} counter\n")
        out += [f'{name}{{position="{i}"}} {n}\n' for i, n in enumerate(t.accepted_per_position)]
    if (snap := llm.draft_length.snapshot()) is not None:  # spec-draft-adaptive: as llama-server's
        out.append(snapshot_metrics(snap))
    return "".join(out)


def acceptance_line(g: Generation) -> str:
    """llama-server's per-request line (``gguf_exact.engines.shared.stats.parse_acceptance`` reads it)."""
    rate = g.drafts_accepted / g.drafts_generated
    return (
        f"draft acceptance = {rate:.5f} ({g.drafts_accepted:5d} accepted / {g.drafts_generated:5d} generated), "
        f"mean len = {g.mean_accepted_length:5.2f}"
    )


def build_app(llm: MtpLlama, alias: str, api_key: str | None = None, max_waiting: int = MAX_WAITING) -> Any:
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
    serve_one_model(SingleModel(llm, alias))
    app = FastAPI(
        middleware=[Middleware(RawContextMiddleware, plugins=(RequestIdPlugin(),))],
        title="gguf-exact: llama-cpp-python with an MTP drafter",
    )
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])
    app.include_router(upstream.router)
    queue = RequestQueue(max_waiting)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics_text(llm, queue), media_type="text/plain; version=0.0.4")

    def on_generation(g: Generation) -> None:
        if g.drafts_generated:
            log.info("%s", acceptance_line(g))

    llm.on_generation = on_generation
    guarded = RequestGuard(RequestChecks(app, llm, queue, served=alias))
    return ApiKeyCheck(guarded, api_key) if api_key else guarded


def default_alias(target: str | Path) -> str:
    """The model name clients send: the target file's name without ``.gguf``."""
    return Path(target).name.removesuffix(".gguf")


def served_name(target: str | Path) -> str:
    """The one name the server gives its model, in ``/v1/models`` and in every answer's
    ``model``: the target's full path, as llama-server (``--model``, resolved) gives it.
    Requests may name it so, by file name, or by :func:`default_alias`."""
    return str(Path(target).resolve())


__all__ = ["ApiKeyCheck", "RequestChecks", "RequestGuard", "build_app", "default_alias", "metrics_text", "served_name"]
