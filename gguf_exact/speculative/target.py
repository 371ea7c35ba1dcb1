"""The target model in llama.cpp, as the speculative loop's :class:`~.speculative.Verifier`.

One context with its nextn hidden states exposed
(``llama_set_embeddings_nextn(ctx, True, masked=False)``: a dense row per batch
token), one token batch with a logits flag per row. ``verify`` decodes
``[last, d1..dk]`` with logits on every row and takes the argmax of each;
``keep`` rolls the KV cache back with ``llama_memory_seq_rm`` and remembers which
row's hidden state the drafter reads next (:meth:`hidden`).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Sequence

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from gguf_exact.errors import GgufExactError
from gguf_exact.speculative.bindings import _load_model, _new_context


class LlamaTarget:
    """A target context owned by ``stack`` (freed when the stack closes)."""

    def __init__(
        self, stack: ExitStack, path: str | Path, n_ctx: int, n_threads: int, n_batch: int, n_gpu_layers: int | None
    ) -> None:
        self.path = Path(path)
        self.model = _load_model(stack, self.path, "target", n_gpu_layers)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(llama_cpp.llama_model_n_embd(self.model))
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = max(1, min(n_ctx, n_batch))
        params.n_ubatch = params.n_batch
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.embeddings = False
        params.swa_full = True  # rolled-back positions must never have been evicted from the SWA cache
        self.ctx = _new_context(stack, self.model, params, f"target {self.path}")
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(self.ctx))
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        llama_cpp_ext.llama_set_embeddings_nextn(self.ctx, True, False)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        stack.callback(llama_cpp.llama_batch_free, self.batch)
        self._row = 0
        self.seconds = 0.0  # time inside llama_decode
        self.record_margins = False  # diagnostics: top-2 logit gap of every emitted token
        self.margins: list[float] = []
        self._gaps: list[float] = []

    def _decode(self, tokens: Sequence[int], pos0: int, all_logits: bool) -> None:
        b = self.batch
        n = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if all_logits or i == n - 1 else 0
        b.n_tokens = n
        t = time.perf_counter()
        rc = int(llama_cpp.llama_decode(self.ctx, b))
        self.seconds += time.perf_counter() - t
        if rc != 0:
            raise GgufExactError(f"target decode failed with code {rc} at position {pos0}")

    def _argmax_rows(self, n: int) -> list[int]:
        ptr = llama_cpp.llama_get_logits(self.ctx)
        if not ptr:
            raise GgufExactError("target: llama.cpp returned no logits")
        logits = np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab))
        if self.record_margins:
            top2 = np.partition(logits, -2, axis=1)[:, -2:]
            self._gaps = (top2[:, 1] - top2[:, 0]).tolist()
        return logits.argmax(axis=1).tolist()

    def prefill(self, prompt: Sequence[int]) -> int:
        llama_cpp.llama_memory_clear(self.mem, True)
        for start in range(0, len(prompt), self.n_batch):
            chunk = prompt[start : start + self.n_batch]
            self._decode(chunk, start, all_logits=False)
        self._row = len(chunk) - 1
        token = self._argmax_rows(1)[0]
        if self.record_margins:
            self.margins.extend(self._gaps)
        return token

    def verify(self, tokens: Sequence[int], pos: int) -> list[int]:
        self._decode(tokens, pos, all_logits=True)
        return self._argmax_rows(len(tokens))

    def keep(self, n_keep: int, row: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self.mem, 0, n_keep, -1):
            raise GgufExactError(f"target: llama.cpp could not roll the KV cache back to {n_keep} positions")
        self._row = row
        if self.record_margins:
            self.margins.extend(self._gaps[: row + 1])

    def hidden(self) -> Any:
        """Pointer to the kept row's nextn hidden state (``n_embd`` floats)."""
        ptr = llama_cpp_ext.llama_get_embeddings_nextn_ith(self.ctx, self._row)
        if not ptr:
            raise GgufExactError("target: llama.cpp returned no nextn hidden state")
        return ptr


def token_text(vocab: Any, token: int) -> bytes:
    """The vocabulary's stored text of ``token`` (raw bytes)."""
    return llama_cpp.llama_vocab_get_text(vocab, token) or b""


__all__ = ["LlamaTarget", "token_text"]
