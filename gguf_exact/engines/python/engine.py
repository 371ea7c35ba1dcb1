"""The one speculative engine: llama-cpp-python's ``Llama`` with an MTP drafter as its draft model.

>>> from gguf_exact import load_with_drafter
>>> llm = load_with_drafter("gemma-4-E2B_q4_0-it.gguf", "gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf", n_max=2, profile="rtx3050")
>>> for chunk in llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], stream=True):
...     print(chunk["choices"][0]["delta"].get("content", ""), end="")
>>> llm.totals.acceptance_rate, llm.totals.tokens_per_target_pass

``Llama.generate`` (llama-cpp-python's own loop) already does speculative decoding with any ``draft_model``:
before each target pass it asks the draft model for tokens after the newest one, decodes ``[newest,
drafts...]`` in one batch, samples every row with the request's sampler and keeps a draft only while it equals
the token the sampler picked; on a mismatch it drops the rest from the KV cache. Each emitted token is sampled
once, from the target's logits, with the same sampler state as without drafts, so the output follows the
target's distribution. Greedy, the text is the target alone's but at rare near-ties; sampled, floating-point
differences between batched and single-token passes often move a draw: the same seed gives the same
distribution, not the same text (docs/python-engine.md, "Lossless, and where floating point gets in").

:class:`MtpLlama` is that ``Llama`` with these added:

- :class:`MtpDraftModel`, the draft model: the gemma4-assistant drafter (:class:`.drafter.LlamaDrafter`, an MTP
  context sharing the target's KV cache) fed the target's hidden state of the row that produced the newest token;
- ``eval`` that asks for logits on every row only for verification batches (a prompt gets them on its last row),
  keeps rows' logits in ``scores`` only when ``logits_all=True`` (logprobs), and records where the last batch
  started, so the draft model finds its hidden-state row;
- counters: each ``generate`` call becomes a :class:`.Generation` (:attr:`MtpLlama.last_generation`), added to
  :attr:`MtpLlama.totals` (what ``/metrics`` serves);
- ``rejection_sampling`` (spec-rejection-sampling): sampled requests verify drafts by min(1, p/q) (:mod:`.rejection`).

Everything else (``create_completion``, ``create_chat_completion`` with the GGUF's chat template, streaming,
stop strings, samplers, grammars, logprobs) is llama-cpp-python's.
"""

from __future__ import annotations

import inspect
import time
from contextlib import ExitStack
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator, Literal, Sequence

import llama_cpp
import numpy as np
from llama_cpp import llama_chat_format, llama_cpp_ext

from gguf_exact.engines.python.bindings import _meta_str, errors_only_logs
from gguf_exact.engines.python.completion_stop import CompletionStop
from gguf_exact.engines.python.draft_model import MtpDraftModel
from gguf_exact.engines.python.drafter import LlamaDrafter, TargetSide
from gguf_exact.engines.python.llama_adapter import LlamaAdapter
from gguf_exact.engines.python.rejection import RejectionSampling, call_class, greedy_alone, with_readable_bias
from gguf_exact.engines.python.request import CURRENT_REQUEST
from gguf_exact.engines.python.tokenizer import PieceCache
from gguf_exact.engines.python.totals import SpecTotals
from gguf_exact.engines.shared.generation import Generation
from gguf_exact.errors import ArgumentError, InputError
from gguf_exact.formats.paths import check_input_file
from gguf_exact.gemma4.names import ARCH as TARGET_ARCH

if TYPE_CHECKING:
    from gguf_exact.pair.checks import ServePair

# False: the next generate decodes its whole prompt, as llama-server does for a request with
# cache_prompt false, instead of resuming from the previous request's KV cache. A context
# variable, so a server sets it for one request (its worker thread inherits it).
PROMPT_CACHE: ContextVar[bool] = ContextVar("gguf_exact_prompt_cache", default=True)
_live_contexts = 0


def live_contexts() -> int:
    """llama.cpp contexts (targets and drafters) opened by :class:`MtpLlama` and not yet freed."""
    return _live_contexts


def _count_contexts(llm: MtpLlama, n: int) -> None:
    global _live_contexts
    _live_contexts += n

    def release() -> None:
        global _live_contexts
        _live_contexts -= n

    llm.on_close(release)


@dataclass
class _Call:
    """Book-keeping of one ``generate`` call."""

    n_prompt: int
    n_max: int
    budget: int  # most tokens this call may emit (drafts never run past it)
    t0: float
    drafter_s0: float
    t_first: float | None = None
    tokens: list[int] = field(default_factory=list)
    pass_drafts: list[int] = field(default_factory=list)  # drafts carried by each target pass
    pass_emitted: list[int] = field(default_factory=list)  # tokens emitted from each target pass
    pending_drafts: int = 0
    target_seconds: float = 0.0
    logits: dict[int, np.ndarray] | None = None  # position -> the target's logits there (record_margins)

    def remaining(self) -> int:
        return self.budget - len(self.tokens)


class MtpLlama(LlamaAdapter):
    """A ``llama_cpp.Llama`` on a gemma4 target whose draft model is its MTP drafter.

    ``draft_path=None`` gives the target alone (same engine, same counters).
    ``logits_all=True`` keeps every row's logits (``n_ctx x n_vocab`` floats) for
    ``logprobs``; without it a request for logprobs is refused. Other keyword
    arguments go to ``Llama``; ``verbose`` defaults to False and ``swa_full`` is on
    (a rolled-back position must not have left the sliding-window cache). ``checked``: the pair as
    :func:`gguf_exact.pair.checks.check_pair` returned it for these files (the drafter lookup does), or True
    where another process checked them (serve's parent); their headers are then not read again.
    """

    draft_model: MtpDraftModel  # Llama's, always ours (given to Llama.__init__ below)

    def __init__(
        self,
        model_path: str | Path,
        draft_path: str | Path | None = None,
        *,
        n_max: int = 2,
        adaptive: bool = False,
        shadow: bool = False,
        n_gpu_layers_draft: int | None = None,
        rejection_sampling: bool = False,
        logits_all: bool = False,
        verbose: bool = False,
        checked: ServePair | Literal[True] | None = None,
        **kwargs: Any,
    ) -> None:
        path = Path(model_path)
        check_input_file(path, f"target model {path}")
        if draft_path is not None:
            check_input_file(Path(draft_path), f"drafter model {draft_path}")
        if n_max < 0:
            raise ArgumentError(f"n_max must be >= 0, got {n_max}")
        kwargs.setdefault("swa_full", True)
        # llama-server's default (flash attention "auto") turns it on for CPU and CUDA; without it
        # llama.cpp pads Gemma 4's V cache to the widest head and the drafter's view of it differs.
        kwargs.setdefault("flash_attn", True)
        self._keep_scores = logits_all
        self._verify_next = False
        self._batch_start = 0
        self._call: _Call | None = None
        self._pending_max_tokens: int | None = None
        self._sample_idx: int | None = None
        self.record_margins = False  # keep the target's logits of every emitted token (diagnostics)
        self.rejection_sampling = rejection_sampling  # spec-rejection-sampling (.rejection), for sampled requests
        self.rejection: RejectionSampling | None = None  # the rule of the generate call running, if it uses it
        self.last_logits: list[np.ndarray | None] = []  # with record_margins: the logits behind each token
        self.last_generation: Generation | None = None
        self.totals = SpecTotals()
        self.on_generation: Callable[[Generation], None] | None = None  # e.g. a server's log line
        self.draft_path = Path(draft_path) if draft_path is not None else None
        self.target_seconds = 0.0  # inside the target's llama_decode, since load
        self.target_rows = 0  # batch rows the target decoded since load (prompt rows included)
        draft = MtpDraftModel(n_max, adaptive, shadow=shadow)
        if checked is None:
            # Architecture, widths and the two vocabularies (as bytes) from the GGUF headers,
            # before llama.cpp loads anything: a 262,144-token vocabulary costs 0.2 s here
            # against a ctypes call per token after loading. A target alone too (a drafter as target).
            from gguf_exact.pair.checks import check_pair

            check_pair(path, draft_path, checksums={})
        quiet = ExitStack()
        if not verbose:
            errors_only_logs(quiet)
        try:
            super().__init__(str(path), draft_model=draft, logits_all=logits_all, verbose=verbose, **kwargs)
        except ValueError as e:
            quiet.close()
            raise InputError(f"target model {path}: {e}") from None
        self.close_with(quiet)  # the log callback is restored last, after every free
        self.bound_context_to_token_buffer()
        if "tokenizer" not in kwargs:
            self.tokenizer_ = PieceCache(self)
        try:
            _count_contexts(self, 1)
            if draft_path is not None:
                arch = _meta_str(self.model, "general.architecture")
                if arch != TARGET_ARCH:
                    raise InputError(
                        f"target model {path}: architecture is {arch!r}; MTP drafting needs a {TARGET_ARCH!r} target"
                    )
                llama_cpp_ext.llama_set_embeddings_nextn(self.ctx, True, False)
                side = TargetSide(
                    path=path,
                    ctx=self.ctx,
                    vocab=self.vocab_handle,
                    n_ctx=self.context_size,
                    n_embd=int(llama_cpp.llama_model_n_embd(self.model)),
                    n_vocab=self.vocab_size,
                )
                layers = kwargs.get("n_gpu_layers", 0) if n_gpu_layers_draft is None else n_gpu_layers_draft
                draft.drafter = LlamaDrafter(self.resources, draft_path, side, self.n_threads, layers)
                _count_contexts(self, 1)
        except BaseException:
            self.close()
            raise
        draft.llm = self
        # The GGUF's template, formatted here as Llama would: kept to count a chat prompt's
        # tokens before it streams. A chat_format or chat_handler given instead is used as is.
        own_format = kwargs.get("chat_handler") or kwargs.get("chat_format")
        self.chat_formatter = None if own_format else self._gguf_chat_formatter()
        if self.chat_formatter is not None:
            self.chat_handler = self.chat_formatter.to_chat_handler()

    def close(self) -> None:
        """Free the drafter, then the target (idempotent)."""
        if self.is_open:  # not when the constructor stopped before Llama's
            super().close()

    # --- configuration ---

    @property
    def drafter(self) -> LlamaDrafter | None:
        return self.draft_model.drafter

    @property
    def n_max(self) -> int:
        """Most draft tokens per target pass (0: the target alone)."""
        return self.draft_model.n_max if self.drafter is not None else 0

    @n_max.setter
    def n_max(self, value: int) -> None:
        if value < 0:
            raise ArgumentError(f"n_max must be >= 0, got {value}")
        self.draft_model.n_max = value

    draft_length = property(lambda self: self.draft_model.length, doc="The draft length: fixed or adaptive, its policy")

    def _gguf_chat_formatter(self) -> llama_chat_format.Jinja2ChatFormatter | None:
        """The GGUF's own ``tokenizer.chat_template``, formatted as ``Llama`` itself would;
        kept so that a request's prompt length can be checked before it streams."""
        template = self.metadata.get("tokenizer.chat_template")
        if not template:
            return None
        eos, bos = self.token_eos(), self.token_bos()
        return llama_chat_format.Jinja2ChatFormatter(
            template=template,
            eos_token=self.token_text(eos) if eos != -1 else "",
            bos_token=self.token_text(bos) if bos != -1 else "",
            stop_token_ids=[eos],
        )

    # --- the hooks into llama-cpp-python's loop ---

    def eval(self, tokens: Sequence[int]) -> None:
        """Decode ``tokens`` after the cached ones (llama-cpp-python's ``eval``, with
        logits on every row only for verification passes and the timings and
        hidden-state row kept; why it is re-written rather than wrapped: upstream
        copies every row's logits into ``scores``, which needs ``n_ctx x n_vocab``
        floats once a draft model is set)."""
        self.drop_cache_from(self.n_tokens)
        verify, self._verify_next = self._verify_next, False
        if not len(tokens):
            return
        all_rows = verify or self._keep_scores
        call = self._call
        for i in range(0, len(tokens), self.n_batch):
            batch = tokens[i : i + self.n_batch]
            n_past, n = self.n_tokens, len(batch)
            t = time.perf_counter()
            self.decode_batch(batch, n_past, all_rows)
            dt = time.perf_counter() - t
            self.target_seconds += dt
            self.target_rows += n
            self.input_ids[n_past : n_past + n] = batch
            if self._keep_scores:
                logits = self.batch_logits(n)
                self.scores[n_past : n_past + n, :].reshape(-1)[::] = logits
            if call is not None:
                call.target_seconds += dt
                if call.logits is not None:
                    self._record_logits(call.logits, n_past, n, all_rows)
            self._batch_start = n_past
            self.n_tokens += n
            self.mark_evaluated()
        if call is not None:
            call.pass_drafts.append(call.pending_drafts)
            call.pass_emitted.append(0)
            call.pending_drafts = 0

    def _record_logits(self, kept: dict[int, np.ndarray], n_past: int, n: int, all_rows: bool) -> None:
        rows = n if all_rows else 1
        logits = self.batch_logits(rows).reshape(rows, self.vocab_size)
        for r in range(rows):
            kept[n_past + n - rows + r] = logits[r].copy()

    def visible_input_ids(self) -> np.ndarray:
        # While a row is sampled, logits processors see the tokens up to that row only,
        # not the drafts decoded after it (upstream hands them everything decoded).
        end = self.n_tokens if self._sample_idx is None else self._sample_idx + 1
        return self.input_ids[:end]

    def sample(self, *args: Any, idx: int | None = None, **kwargs: Any) -> int:
        self._sample_idx = idx
        try:
            if self.rejection is not None and (token := self.rejection.token_at(self, idx)) is not None:
                return token  # the row verified a draft by speculative sampling
            return super().sample(*args, idx=idx, **kwargs)
        finally:
            self._sample_idx = None

    def generate(
        self, tokens: Sequence[int], *args: Any, max_new_tokens: int | None = None, **kwargs: Any
    ) -> Generator[int, Sequence[int] | None, None]:
        """llama-cpp-python's generate loop (drafting with the MTP drafter), counted:
        when the caller stops, :attr:`last_generation` holds the call's figures.
        ``max_new_tokens`` (or the ``max_tokens`` of the ``create_completion`` that
        calls it) keeps drafts from running past the tokens the caller will take."""
        n_prompt = len(tokens)
        room = self.context_size - n_prompt
        wanted = max_new_tokens if max_new_tokens is not None else self._pending_max_tokens
        self._pending_max_tokens = None
        budget = room if wanted is None or wanted <= 0 else min(wanted, room)
        drafter_s0 = self.drafter.seconds if self.drafter is not None else 0.0
        call = _Call(n_prompt, self.n_max, budget, time.perf_counter(), drafter_s0)
        call.logits = {} if self.record_margins else None
        self._call, self._verify_next = call, False
        if not PROMPT_CACHE.get():
            self.reset()  # no prefix in common with what is cached: the prompt is decoded whole
        rule = RejectionSampling.for_call  # the request's field, else ours; its sampler decides (and logs) the rest
        self.rejection = rule(args, kwargs, self._seed, self.rejection_sampling) if self.n_max > 0 else None
        self.draft_length.policy.set_class(call_class(args, kwargs, self.rejection))  # its acceptance's counts
        self.greedy_alone = greedy_alone(args, kwargs)  # its rows' tokens by argmax (.llama_adapter.greedy_token)
        inner = super().generate(tokens, *args, **kwargs)
        try:
            sent = None
            while True:
                try:
                    token = inner.send(sent)
                except StopIteration:
                    return
                call.t_first = time.perf_counter() if call.t_first is None else call.t_first
                call.tokens.append(token)
                if call.pass_emitted:
                    call.pass_emitted[-1] += 1
                sent = yield token
        finally:
            inner.close()
            self.draft_model.finish(call)  # its last pass, before the rule's chances go
            if self._call is call:
                self._call, self.rejection, self.greedy_alone = None, None, False
            self._finish(call)

    def _finish(self, call: _Call) -> None:
        now = time.perf_counter()
        rounds = [e - 1 for d, e in zip(call.pass_drafts, call.pass_emitted) if d > 0 and e > 0]
        drafts = [d for d in call.pass_drafts if d > 0]
        g = Generation(tokens=list(call.tokens), n_prompt=call.n_prompt, n_max=call.n_max)
        g.target_passes = len(call.pass_drafts)
        g.draft_rounds = len(drafts)
        g.drafts_generated = sum(drafts)
        g.accepted_per_round = rounds
        g.drafts_accepted = sum(rounds)
        g.stopped = bool(call.tokens) and bool(llama_cpp.llama_vocab_is_eog(self.vocab_handle, call.tokens[-1]))
        g.wall_seconds = now - call.t0
        g.prefill_seconds = (call.t_first or now) - call.t0
        g.target_seconds = call.target_seconds
        g.drafter_seconds = (self.drafter.seconds - call.drafter_s0) if self.drafter is not None else 0.0
        if call.logits is not None:
            rows = [call.logits.get(call.n_prompt - 1 + i) for i in range(len(call.tokens))]
            self.last_logits = rows
            g.margins = [float(np.diff(np.partition(r, -2)[-2:])[0]) if r is not None else float("nan") for r in rows]
        self.last_generation = g
        if (request := CURRENT_REQUEST.get()) is not None:
            request.generation = g
        self.totals.add(g)
        if self.on_generation is not None:
            self.on_generation(g)

    # --- requests ---

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """``Llama.tokenize``; while a served request is handled (:data:`.request.CURRENT_REQUEST`),
        each text is tokenized once: llama-cpp-python asks again for what the check tokenized."""
        request = CURRENT_REQUEST.get()
        if request is None:
            return super().tokenize(text, add_bos, special)
        key = (bytes(text), add_bos, special)
        tokens = request.tokens.get(key)
        if tokens is None:
            tokens = request.tokens[key] = super().tokenize(text, add_bos, special)
            request.tokenizations += 1
        return list(tokens)

    def prompt_tokens(self, prompt: str | list[int]) -> list[int]:
        """The tokens ``create_completion`` decodes for ``prompt`` (no suffix)."""
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        bos = self.token_bos()
        head = [bos] if self.adds_bos() and bos != -1 else []
        body = self.tokenize(prompt.encode("utf-8"), add_bos=False, special=True) if prompt else []
        return head + body

    def chat_prompt_tokens(self, messages: list[dict], **kwargs: Any) -> list[int] | None:
        """The prompt tokens of a chat request with the GGUF's template (None without one)."""
        f = self.chat_formatter
        if f is None:
            return None
        result = f(messages=messages, **kwargs)
        return self.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)

    def check_request(self, n_prompt: int, max_tokens: int | None, logprobs: Any = None) -> None:
        """Refuse, with llama-cpp-python's own wording for the context (the server maps
        it to HTTP 400), what would fail or misbehave once generation has started."""
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (0 or none: up to the end of the context), got {max_tokens}")
        if n_prompt >= self.context_size:
            raise ValueError(f"Requested tokens ({n_prompt}) exceed context window of {self.context_size}")
        if logprobs not in (None, False) and not self._keep_scores:
            raise ValueError("logprobs need every row's logits kept: load with logits_all=True (serve: --logprobs)")

    def create_completion(self, *args: Any, **kwargs: Any) -> Any:
        """``Llama.create_completion``, checked first (so a stream fails before its first chunk)."""
        bound = _COMPLETION_SIGNATURE.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        request = CURRENT_REQUEST.get()
        if request is None or not request.checked:  # a served request was checked before it got here
            self.check_request(len(self.prompt_tokens(a["prompt"])), a["max_tokens"], a["logprobs"])
        stop = CompletionStop(lambda: self._call, request, a)
        call_kwargs = with_readable_bias({k: v for k, v in a.items() if k != "self"})
        if not a["stream"]:
            self._pending_max_tokens = a["max_tokens"]
            try:
                return stop.correct(super().create_completion(**call_kwargs))
            finally:
                self._pending_max_tokens = None
        return self._stream(stop.corrected(super().create_completion(**call_kwargs)), a["max_tokens"])

    def _stream(self, chunks: Iterator[Any], max_tokens: int | None) -> Iterator[Any]:
        self._pending_max_tokens = max_tokens  # read when the first chunk starts generate
        try:
            yield from chunks
        finally:
            self._pending_max_tokens = None


_COMPLETION_SIGNATURE = inspect.signature(llama_cpp.Llama.create_completion)


__all__ = ["PROMPT_CACHE", "MtpDraftModel", "MtpLlama", "SpecTotals", "live_contexts"]
