"""In-process draft-mtp generation on the llama-cpp-python bindings.

>>> from gguf_exact.speculative.runner import Runner
>>> with Runner("gemma-4-E2B-it.gguf", draft="assistant-q4_0-exact.gguf") as r:
...     g = r.generate("def fib(n):", n_predict=64, n_max=2)
...     print(g.text, g.acceptance_rate, g.tokens_per_target_pass)

:class:`Runner` loads the target (:class:`.LlamaTarget`) and, when given, the
drafter as an MTP context on it (:class:`.LlamaDrafter`), and runs the greedy
draft / verify / accept / roll-back loop of :func:`.speculative.speculate`.
Everything llama.cpp allocates is owned by one :class:`~contextlib.ExitStack`
and freed, in reverse order, by :meth:`Runner.close` (or leaving the ``with``).
:func:`live_contexts` counts the llama.cpp contexts open in this process.
"""

from __future__ import annotations

import ctypes
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Sequence

import llama_cpp

from gguf_exact.errors import GgufExactError
from gguf_exact.speculative.bindings import _backend_init, quiet_logs
from gguf_exact.speculative.drafter import LlamaDrafter
from gguf_exact.speculative.loop import Generation, speculate
from gguf_exact.speculative.target import LlamaTarget

_live_contexts = 0


def live_contexts() -> int:
    """llama.cpp contexts opened by :class:`Runner` and not yet freed."""
    return _live_contexts


def _count_context(stack: ExitStack) -> None:
    global _live_contexts
    _live_contexts += 1

    def release() -> None:
        global _live_contexts
        _live_contexts -= 1

    stack.callback(release)


class Runner:
    """A target and an optional MTP drafter, ready to generate greedily.

    ``n_ctx`` bounds prompt plus generated tokens; ``n_batch`` is the largest
    prompt chunk decoded at once. Use as a context manager.
    """

    def __init__(
        self,
        model: str | Path,
        draft: str | Path | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int = 2,
        n_batch: int = 512,
        n_gpu_layers: int | None = None,
        quiet: bool = True,
    ) -> None:
        self._stack = ExitStack()
        try:
            _backend_init()
            if quiet:
                quiet_logs(self._stack)
            self.target = LlamaTarget(self._stack, model, n_ctx, n_threads, n_batch, n_gpu_layers)
            _count_context(self._stack)
            self.drafter: LlamaDrafter | None = None
            if draft is not None:
                self.drafter = LlamaDrafter(self._stack, draft, self.target, n_threads, n_gpu_layers)
                _count_context(self._stack)
        except BaseException:
            self._stack.close()
            raise
        vocab = self.target.vocab
        self.n_vocab = self.target.n_vocab
        self.n_ctx = self.target.n_ctx
        self.stop_tokens = frozenset(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))

    # lifetime

    def close(self) -> None:
        """Free every llama.cpp object (idempotent)."""
        self._stack.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # text

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` (BOS first when ``add_bos``)."""
        data = text.encode("utf-8")
        vocab = self.target.vocab
        cap = len(data) + 8
        for _ in range(2):
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_bos, False)
            if n >= 0:
                return list(buf[:n])
            cap = -n
        raise GgufExactError(f"tokenize: llama.cpp failed on {text[:40]!r}")

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens left out)."""
        if not ids:
            return ""
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        cap = 8 * len(ids) + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = llama_cpp.llama_detokenize(self.target.vocab, arr, len(ids), buf, cap, True, False)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            cap = -n
        raise GgufExactError("detokenize: llama.cpp failed")

    # generation

    def _prompt_ids(self, prompt: str | Sequence[int], n_predict: int) -> list[int]:
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise GgufExactError("empty prompt")
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise GgufExactError(f"prompt token id {bad[0]} is outside the vocab [0, {self.n_vocab})")
        if len(ids) >= self.n_ctx:
            raise GgufExactError(
                f"the prompt is {len(ids)} tokens, longer than the context of {self.n_ctx}; raise n_ctx (--n-ctx) or shorten it"
            )
        if len(ids) + n_predict > self.n_ctx:
            raise GgufExactError(
                f"the prompt ({len(ids)} tokens) plus n_predict ({n_predict}) exceeds the context of {self.n_ctx}; raise n_ctx (--n-ctx) or lower n_predict"
            )
        return ids

    def generate(
        self, prompt: str | Sequence[int], n_predict: int = 128, n_max: int = 3, record_margins: bool = False
    ) -> Generation:
        """Greedy generation of up to ``n_predict`` tokens from ``prompt`` (text,
        tokenized with BOS, or token ids), drafting up to ``n_max`` tokens per
        target pass; ``n_max=0`` or no drafter runs the target alone. Stops at
        the first end-of-generation token (it is included in ``tokens``).
        ``record_margins`` also keeps, per token, the gap between the target's
        two highest logits (``Generation.margins``: how near a tie each was)."""
        if n_max < 0:
            raise GgufExactError(f"n_max must be >= 0, got {n_max}")
        ids = self._prompt_ids(prompt, n_predict)
        target = self.target
        t0 = target.seconds
        d0 = self.drafter.seconds if self.drafter else 0.0
        target.record_margins, target.margins = record_margins, []
        try:
            gen = speculate(target, self.drafter if n_max > 0 else None, ids, n_predict, n_max, self.stop_tokens)
        finally:
            target.record_margins = False
        gen.target_seconds = target.seconds - t0
        gen.drafter_seconds = (self.drafter.seconds - d0) if self.drafter else 0.0
        gen.margins = target.margins[: gen.n_tokens] if record_margins else None
        gen.text = self.detokenize(gen.tokens)
        return gen

    def target_greedy(
        self, prompt: str | Sequence[int], n_predict: int = 128, record_margins: bool = False
    ) -> Generation:
        """The target alone, one token per pass: the reference output."""
        return self.generate(prompt, n_predict, n_max=0, record_margins=record_margins)


def generate(
    model: str | Path,
    prompt: str | Sequence[int],
    draft: str | Path | None = None,
    n_predict: int = 128,
    n_max: int = 3,
    **runner_options,
) -> Generation:
    """Load, generate once, free: ``Runner(model, draft, **runner_options).generate(...)``."""
    with Runner(model, draft, **runner_options) as r:
        return r.generate(prompt, n_predict, n_max)


__all__ = ["Generation", "Runner", "generate", "live_contexts"]
