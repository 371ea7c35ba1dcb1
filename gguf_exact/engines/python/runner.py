"""Token-level generation on the engine, for ``generate``, ``bench``, the demo and the tests.

>>> from gguf_exact.engines.python.runner import Runner
>>> with Runner("gemma-4-E2B_q4_0-it.gguf", draft="gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf") as r:
...     g = r.generate("def fib(n):", n_predict=64, n_max=2)
...     print(g.text, g.acceptance_rate, g.tokens_per_target_pass)

:class:`Runner` holds one :class:`.engine.MtpLlama` (the target, and the drafter
when given) and consumes its generate loop token by token: up to ``n_predict``
tokens or the first stop token, greedy unless a temperature is given, each run
from a clean cache. The figures come from the engine's own count of the call
(:attr:`.engine.MtpLlama.last_generation`), the same that the servers report.
:func:`run_completion` goes through ``create_completion`` /
``create_chat_completion`` instead (stop strings, chat template), for ``gguf-exact
generate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Sequence

import llama_cpp

from gguf_exact.engines.python.engine import MtpLlama, live_contexts
from gguf_exact.engines.shared.generation import Generation
from gguf_exact.engines.shared.sampling_defaults import SERVER_SAMPLING
from gguf_exact.errors import ArgumentError, Param


@dataclass(frozen=True)
class Sampling:
    """llama-cpp-python's sampler settings; ``temperature`` 0 is greedy. The others
    default to llama-server's (:data:`gguf_exact.engines.shared.sampling_defaults.SERVER_SAMPLING`)."""

    temperature: float = 0.0
    top_k: int = int(SERVER_SAMPLING["top_k"])
    top_p: float = SERVER_SAMPLING["top_p"]
    min_p: float = SERVER_SAMPLING["min_p"]
    repeat_penalty: float = SERVER_SAMPLING["repeat_penalty"]
    seed: int | None = None

    def generate_kwargs(self) -> dict[str, Any]:
        return {
            "temp": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
        }

    def completion_kwargs(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
            "seed": self.seed,
        }


GREEDY = Sampling()


class Runner:
    """A target and an optional MTP drafter, on the engine.

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
        **llama_kwargs: Any,
    ) -> None:
        self.llm = MtpLlama(
            model,
            draft,
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_gpu_layers=n_gpu_layers or 0,
            **llama_kwargs,
        )
        self.drafter = self.llm.drafter
        self.n_vocab = self.llm.n_vocab()
        # llama.cpp rounds a small context up (to 256): the bound a caller asked for is the one
        # kept, and the one its messages name
        self.n_ctx = min(n_ctx, self.llm.n_ctx())
        vocab = self.llm.vocab_handle
        self.stop_tokens = frozenset(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))

    def time_passes(self, n_max: int) -> None:
        """The adaptive draft length's pass costs (1 to ``n_max`` + 1 rows) and drafter step timed now, as a
        profile's spec-draft-adaptive-warmup has them timed at load (not learned on the
        first request's passes)."""
        from gguf_exact.engines.python.warmup import time_start_up_costs

        self.llm.draft_length.seed(time_start_up_costs(self.llm, n_max + 1))

    # lifetime

    def close(self) -> None:
        """Free every llama.cpp object (idempotent)."""
        self.llm.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # text

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` (BOS first when ``add_bos``), as ``create_completion`` reads a prompt."""
        ids = self.llm.prompt_tokens(text)
        bos = self.llm.token_bos()
        return ids if add_bos or not ids or ids[0] != bos else ids[1:]

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens left out)."""
        return self.llm.detokenize(list(ids)).decode("utf-8", "replace")

    # generation

    def _prompt_ids(self, prompt: str | Sequence[int], n_predict: int) -> list[int]:
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ArgumentError("empty prompt")
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise ArgumentError(f"prompt token id {bad[0]} is outside the vocab [0, {self.n_vocab})")
        if len(ids) >= self.n_ctx:
            raise ArgumentError(
                f"the prompt is {len(ids)} tokens, longer than the context of {self.n_ctx}; raise n_ctx",
                Param("n_ctx", aside=" ({})"),
                " or shorten it",
            )
        if len(ids) + n_predict > self.n_ctx:
            raise ArgumentError(
                f"the prompt ({len(ids)} tokens) plus n_predict ({n_predict}) exceeds the context of {self.n_ctx}; raise n_ctx",
                Param("n_ctx", aside=" ({})"),
                " or lower n_predict",
            )
        return ids

    def generate(
        self,
        prompt: str | Sequence[int],
        n_predict: int = 128,
        n_max: int = 3,
        record_margins: bool = False,
        sampling: Sampling = GREEDY,
        adaptive: bool = False,
    ) -> Generation:
        """Up to ``n_predict`` tokens from ``prompt`` (text, tokenized with BOS, or
        token ids), drafting up to ``n_max`` tokens per target pass (``adaptive``: as
        many, up to ``n_max``, as the draft-length policy chooses); ``n_max=0`` or
        no drafter runs the target alone. Stops after the first token in
        :attr:`stop_tokens` (end-of-generation tokens; it is included in ``tokens``).
        ``record_margins`` also keeps, per token, the gap between the target's two
        highest logits (``Generation.margins``: how near a tie each was)."""
        if n_max < 0:
            raise ArgumentError(f"n_max must be >= 0, got {n_max}")
        ids = self._prompt_ids(prompt, n_predict)
        llm = self.llm
        llm.n_max = n_max
        llm.draft_length.adaptive = adaptive
        llm.reset()  # every run from a clean cache: runs are independent
        if sampling.seed is not None:
            llm.set_seed(sampling.seed)
        llm.record_margins = record_margins
        out: list[int] = []
        stream = llm.generate(ids, max_new_tokens=n_predict, **sampling.generate_kwargs())
        try:
            if n_predict > 0:
                for token in stream:
                    out.append(token)
                    if token in self.stop_tokens or len(out) >= n_predict:
                        break
        finally:
            stream.close()
            llm.record_margins = False
        g = llm.last_generation
        if g is None or n_predict <= 0:
            g = Generation(tokens=[], n_prompt=len(ids), n_max=llm.n_max)
        g.stopped = bool(out) and out[-1] in self.stop_tokens
        g.text = self.detokenize(g.tokens)
        return g

    def complete(
        self,
        prompt: str,
        n_predict: int = 128,
        n_max: int = 3,
        sampling: Sampling = GREEDY,
        stop: Sequence[str] = (),
        chat: bool = False,
        adaptive: bool = False,
    ) -> Generation:
        """:func:`run_completion` on this runner's engine (``create_completion``, or with
        ``chat`` the GGUF's chat template), checked against the context first; ``adaptive``
        as for :meth:`generate`."""
        if n_max < 0:
            raise ArgumentError(f"n_max must be >= 0, got {n_max}")
        self.llm.draft_length.adaptive = adaptive
        if chat:
            if self.llm.chat_formatter is None:
                raise ArgumentError(
                    f"{self.llm.model_path}: no tokenizer.chat_template in the GGUF; drop ",
                    Param("chat", api="chat=True"),
                )
            ids = self.llm.chat_prompt_tokens([{"role": "user", "content": prompt}]) or []
            self._prompt_ids(ids, n_predict)
            self.llm.n_max = n_max
            return run_completion(self.llm, prompt, n_predict, sampling, stop, chat)
        ids = self._prompt_ids(prompt, n_predict)  # tokenized once: create_completion gets the ids
        self.llm.n_max = n_max
        return run_completion(self.llm, ids, n_predict, sampling, stop)

    def target_greedy(
        self, prompt: str | Sequence[int], n_predict: int = 128, record_margins: bool = False
    ) -> Generation:
        """The target alone, one token per pass: the reference output."""
        return self.generate(prompt, n_predict, n_max=0, record_margins=record_margins)


def run_completion(
    llm: MtpLlama,
    prompt: str | list[int],
    n_predict: int,
    sampling: Sampling = GREEDY,
    stop: Sequence[str] = (),
    chat: bool = False,
) -> Generation:
    """One ``create_completion`` (or, with ``chat``, a one-message
    ``create_chat_completion`` through the GGUF's chat template) on a clean cache:
    the engine's figures, with the answer's text. ``prompt``: text, or its token ids as
    :meth:`MtpLlama.prompt_tokens` gives them (not tokenized again); a chat takes text."""
    llm.reset()
    args = sampling.completion_kwargs() | {"max_tokens": n_predict, "stop": list(stop) or None}
    if chat:
        res = llm.create_chat_completion(messages=[{"role": "user", "content": prompt}], **args)
        text = res["choices"][0]["message"]["content"] or ""
    else:
        res = llm.create_completion(prompt, **args)
        text = res["choices"][0]["text"]
    g = llm.last_generation
    assert g is not None
    g.text = text
    return g


def generate(
    model: str | Path,
    prompt: str | Sequence[int],
    draft: str | Path | None = None,
    n_predict: int = 128,
    n_max: int = 3,
    **runner_options: Any,
) -> Generation:
    """Load, generate once, free: ``Runner(model, draft, **runner_options).generate(...)``."""
    with Runner(model, draft, **runner_options) as r:
        return r.generate(prompt, n_predict, n_max)


__all__ = ["GREEDY", "Generation", "Runner", "Sampling", "generate", "live_contexts", "run_completion"]
