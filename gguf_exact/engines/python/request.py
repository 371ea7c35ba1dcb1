"""One completion request to ``serve --engine python``, handled once: parsed, checked and tokenized.

:func:`check_request` reads the body's JSON once, checks it (the token limit: ``max_tokens``,
or ``max_completion_tokens`` / ``n_predict`` as llama-server reads them; ``n``, the fields
llama-cpp-python's request models take, the prompt against the context, logprobs), tokenizes its prompt once and fills llama-server's
sampling defaults: a :class:`CheckedRequest`, or a :class:`Refusal` (HTTP 4xx with an
OpenAI-style error). While the route runs, :data:`CURRENT_REQUEST` holds it:
:meth:`~.engine.MtpLlama.tokenize` answers a text it has tokenized already from
:attr:`CheckedRequest.tokens` (llama-cpp-python tokenizes the prompt again in
``create_completion`` and in the chat handler), and ``create_completion`` does not check
a request that was checked here.
"""

from __future__ import annotations

import json
import threading
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gguf_exact.engines.python.draft_length import RequestSpeculation, request_speculation

if TYPE_CHECKING:
    from gguf_exact.engines.python.engine import MtpLlama
    from gguf_exact.engines.shared.generation import Generation

CHAT_PATH, COMPLETION_PATH = "/v1/chat/completions", "/v1/completions"
COMPLETION_PATHS = (COMPLETION_PATH, CHAT_PATH)
TokenKey = tuple[bytes, bool, bool]  # (text, add_bos, special): one tokenize call


@dataclass
class CheckedRequest:
    """A request that passed :func:`check_request`: its body (llama-server's sampling
    defaults filled in) and every tokenization of it, by (text, add_bos, special)."""

    path: str
    body: dict[str, Any]
    tokens: dict[TokenKey, list[int]] = field(default_factory=dict)
    tokenizations: int = 0  # calls that reached the tokenizer (the rest came from ``tokens``)
    checked: bool = False  # the prompt, max_tokens and logprobs passed the engine's check
    abandoned: threading.Event = field(default_factory=threading.Event)  # the client left: stop generating
    generation: Generation | None = None  # the engine's count of this request's generation, once it ends
    started: float | None = None  # time.monotonic() when the engine took it (the queue's wait ends)

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def include_usage(self) -> bool:
        """OpenAI's ``stream_options.include_usage``: a last chunk with the usage, no choices."""
        options = self.body.get("stream_options")
        return self.stream and isinstance(options, dict) and options.get("include_usage") is True

    @property
    def raw(self) -> bytes:
        """The body as the route reads it (written once, after the defaults)."""
        return json.dumps(self.body).encode()

    @property
    def cache_prompt(self) -> bool:
        return self.body.get("cache_prompt") is not False

    @property
    def speculation(self) -> RequestSpeculation:
        """llama-server's per-request ``speculative.n_max``, ``.p_min`` and ``.adaptive``
        (checked by :func:`check_request`)."""
        found = request_speculation(self.body)
        return found if isinstance(found, RequestSpeculation) else RequestSpeculation()


@dataclass(frozen=True)
class Refusal:
    """An HTTP 4xx answer: status, message and the OpenAI error's code and param."""

    status: int
    message: str
    code: str | None = None
    param: str | None = None

    def body(self) -> bytes:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()


# The request the route is serving now (its worker thread inherits the task's context).
CURRENT_REQUEST: ContextVar[CheckedRequest | None] = ContextVar("gguf_exact_request", default=None)


def check_request(path: str, raw: bytes, llm: MtpLlama) -> CheckedRequest | Refusal:
    """The request parsed, checked and tokenized once (see the module doc)."""
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        return Refusal(400, f"the request body is not valid JSON: {e}", "invalid_json")
    if not isinstance(body, dict):
        return Refusal(400, "the request body must be a JSON object", "invalid_json")
    body, limit_field = with_token_limit(body)
    bad = _body_problem(path, body, limit_field) or _grammar_problem(body, llm)
    if bad is not None:
        return bad
    request = CheckedRequest(path, body)
    scope = CURRENT_REQUEST.set(request)  # the tokenizations below are kept in it
    try:
        bad = _prompt_problem(path, body, llm)
    finally:
        CURRENT_REQUEST.reset(scope)
    if bad is not None:
        return bad
    request.checked = True
    request.body = with_server_defaults(path, body)
    return request


# llama-server reads the token limit from the first of these a request names (not null):
# n_predict, then max_completion_tokens (the openai SDK's chat field), then max_tokens.
TOKEN_LIMIT_FIELDS = ("n_predict", "max_completion_tokens", "max_tokens")


def with_token_limit(body: dict) -> tuple[dict, str]:
    """The body with ``max_tokens`` (what llama-cpp-python reads) set from the field
    llama-server would read (:data:`TOKEN_LIMIT_FIELDS`), and that field's name."""
    for name in TOKEN_LIMIT_FIELDS:
        if body.get(name) is not None:
            return {**body, "max_tokens": body[name]}, name
    return body, "max_tokens"


def _body_problem(path: str, body: dict, limit_field: str = "max_tokens") -> Refusal | None:
    # Any model name is served, as llama-server serves it: a client's default ("gpt-4o") works.
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        return Refusal(400, f"{limit_field} must be an integer, got {max_tokens!r}", None, limit_field)
    if isinstance(max_tokens, int) and max_tokens < 0:
        return Refusal(
            400,
            f"{limit_field} must be >= 0 (0 or none: up to the end of the context), got {max_tokens}",
            None,
            limit_field,
        )
    for key in ("n", "best_of"):
        if body.get(key) not in (None, 1):
            return Refusal(400, f"{key} = {body[key]!r}: this server answers with one choice (n = 1)", None, key)
    bad_field = field_problem(path, body)
    if bad_field is None and not isinstance(found := request_speculation(body), RequestSpeculation):
        bad_field = found
    if bad_field is not None:
        return Refusal(400, bad_field[0], None, bad_field[1])
    return None


def _grammar_problem(body: dict, llm: MtpLlama) -> Refusal | None:
    """A ``grammar`` llama.cpp's parser refuses, as a 400 (see
    :meth:`.llama_adapter.LlamaAdapter._init_sampler`: it would crash the process), parsed by
    llama.cpp itself after the request guard bounded its nesting."""
    grammar = body.get("grammar")
    if isinstance(grammar, str) and not llm.grammar_parses(grammar):
        return Refusal(
            400, "the grammar does not parse as GBNF with a root rule (llama.cpp's parser refused it)", None, "grammar"
        )
    return None


def _prompt_problem(path: str, body: dict, llm: MtpLlama) -> Refusal | None:
    try:
        if path == CHAT_PATH:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return Refusal(400, "messages must be a non-empty list", None, "messages")
            kwargs = {k: body[k] for k in ("tools", "tool_choice") if body.get(k) is not None}
            prompt = llm.chat_prompt_tokens(messages, **kwargs)
            logprobs = body.get("logprobs") or None
        else:
            p = body.get("prompt", "")
            if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
                p = p[0]
            if not (isinstance(p, str) or (isinstance(p, list) and all(isinstance(t, int) for t in p))):
                return Refusal(400, "prompt must be a string or a list of token ids", None, "prompt")
            prompt = llm.prompt_tokens(p)
            logprobs = body.get("logprobs")
        llm.check_request(len(prompt) if prompt is not None else 0, body.get("max_tokens"), logprobs)
    except ValueError as e:
        text = str(e)
        code = "context_length_exceeded" if "context window" in text else None
        return Refusal(400, text, code, "messages" if "messages" in body else "prompt")
    except Exception as e:  # a chat template that fails on these messages, a bad field type
        return Refusal(400, f"cannot read the request: {e}")
    return None


def field_problem(path: str, body: dict) -> tuple[str, str] | None:
    """Checked against llama-cpp-python's own request models, which its routes would
    otherwise report as HTTP 500 (its error handler catches validation errors)."""
    import pydantic
    from llama_cpp.server.types import CreateChatCompletionRequest, CreateCompletionRequest

    model = CreateChatCompletionRequest if path == CHAT_PATH else CreateCompletionRequest
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


def with_server_defaults(path: str, body: dict) -> dict:
    """The body with llama-server's sampling defaults
    (:data:`gguf_exact.engines.shared.sampling_defaults.SERVER_SAMPLING`) where it names none,
    and, for ``/v1/completions`` without ``max_tokens``, no limit but the context, as
    llama-server answers (llama-cpp-python's own: ``repeat_penalty`` 1.1, 16 tokens)."""
    from gguf_exact.engines.shared.sampling_defaults import SERVER_SAMPLING

    filled: dict[str, float | int | None] = {k: v for k, v in SERVER_SAMPLING.items() if body.get(k) is None}
    if path == COMPLETION_PATH and "max_tokens" not in body:
        filled["max_tokens"] = None
    return body | filled


__all__ = [
    "COMPLETION_PATHS",
    "CURRENT_REQUEST",
    "CheckedRequest",
    "Refusal",
    "check_request",
    "field_problem",
    "with_token_limit",
    "with_server_defaults",
]
