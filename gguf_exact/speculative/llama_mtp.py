"""Run a ``gemma4-assistant`` MTP drafter beside its ``gemma4`` target in llama.cpp.

This drives the llama-cpp-python low-level ctypes bindings (``llama_cpp.llama_cpp``
plus the staging API in ``llama_cpp.llama_cpp_ext``) the way upstream's
``draft-mtp`` speculative mode does (``common/speculative.cpp``,
``common_speculative_impl_draft_mtp``, the ``is_mem_shared`` branch).

Call sequence
-------------
Opening (:class:`TargetWithDrafter`):

1. ``llama_backend_init()``; llama.cpp logging is silenced with a no-op
   ``llama_log_set`` callback (kept alive for the lifetime of the object; the
   previous callback is restored on close).
2. ``llama_model_load_from_file(target)``; ``llama_init_from_model`` with default
   context type; then ``llama_set_embeddings_nextn(target_ctx, True, masked=False)``
   so every decoded token of the target leaves its post-final-norm hidden state
   ``h`` (one dense row per batch token, read with
   ``llama_get_embeddings_nextn_ith(target_ctx, i)``).
3. ``llama_model_load_from_file(drafter)``; check that the drafter's
   ``llama_model_n_embd_out`` (its backbone width) equals the target's
   ``llama_model_n_embd`` and the vocab sizes agree, *before* any context is
   built for it.
4. ``llama_init_from_model(drafter, params)`` with
   ``ctx_type = LLAMA_CONTEXT_TYPE_MTP``, ``ctx_other = target_ctx`` (the drafter
   has no K/V projections: its KV cache mirrors the target's last sliding and
   last full layer, read-only) and ``n_outputs_max = 1``; then
   ``llama_set_embeddings_nextn(drafter_ctx, True, masked=True)`` so each output
   row of the drafter also yields its projected-back hidden state.
5. A drafter batch ``llama_batch_init(n_batch, n_embd_backbone, 1)``: it
   allocates ``embd`` only, so a Python-owned ``token`` array is attached as
   well; the gemma4-assistant graph reads both (target token embedding of the
   token, concatenated with the ``h`` row). The pointer is detached again before
   ``llama_batch_free``.

Drafting (:meth:`TargetWithDrafter.draft`), for a prompt of ``N`` tokens:

1. Clear the target memory and decode the prompt at positions ``0..N-1``
   (logits on the last token only).
2. ``t0 = argmax(target logits)`` (the target's own greedy next token) and
   ``h = nextn_ith(target_ctx, last row)`` (hidden state at position ``N-1``).
3. Drafter step: one batch row ``(token=t0, pos=N, embd=h, logits=1)``;
   ``llama_decode(drafter_ctx)``; ``d1 = argmax(drafter logits)``.
4. Chain: the next row is ``(token=d_k, pos=N, embd=nextn_ith(drafter_ctx, 0))``.
   Because the drafter shares the target's KV and writes none of its own, every
   step uses the *same* position ``N`` (as upstream does for Gemma 4 assistants).

Every llama.cpp object is owned by an :class:`contextlib.ExitStack` and freed in
reverse order of creation (drafter batch, drafter context, drafter model, target
batch, target context, target model) by :meth:`TargetWithDrafter.close`.

The whole speculative loop (verify in one batched target pass, accept, roll the
KV cache back) grew out of this into :mod:`.runner` (:class:`.runner.Runner`),
which reuses the loading helpers here.
"""

from __future__ import annotations

import ctypes
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from gguf_exact.errors import GgufExactError

ASSISTANT_ARCH = "gemma4-assistant"


def _noop_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    return None


# Kept at module level so the C side never calls a collected trampoline.
_NOOP_LOG_CALLBACK = llama_cpp.llama_log_callback(_noop_log)
_backend_ready = False


def _backend_init() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True


def quiet_logs(stack: ExitStack) -> None:
    """Silence llama.cpp/ggml logging until ``stack`` closes, then restore the
    callback that was installed before."""
    prev_cb = llama_cpp.llama_log_callback()
    prev_ud = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(prev_cb), ctypes.byref(prev_ud))
    llama_cpp.llama_log_set(_NOOP_LOG_CALLBACK, ctypes.c_void_p(0))

    def restore() -> None:
        llama_cpp.llama_log_set(prev_cb if prev_cb else None, prev_ud)

    stack.callback(restore)


def _meta_str(model: Any, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def _load_model(stack: ExitStack, path: str | Path, role: str, n_gpu_layers: int | None) -> Any:
    path = Path(path)
    if not path.is_file():
        raise GgufExactError(f"{role} model {path}: no such file")
    params = llama_cpp.llama_model_default_params()
    if n_gpu_layers is not None:
        params.n_gpu_layers = n_gpu_layers
    model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        raise GgufExactError(f"{role} model {path}: llama.cpp failed to load it")
    stack.callback(llama_cpp.llama_model_free, model)
    return model


def _new_context(stack: ExitStack, model: Any, params: Any, what: str) -> Any:
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise GgufExactError(f"{what}: llama.cpp failed to create the context")
    stack.callback(llama_cpp.llama_free, ctx)
    return ctx


def _argmax(logits_ptr: Any, n_vocab: int, what: str) -> int:
    if not logits_ptr:
        raise GgufExactError(f"{what}: llama.cpp returned no logits")
    logits = np.ctypeslib.as_array(logits_ptr, shape=(n_vocab,))
    return int(np.argmax(logits))


class _TokenBatch:
    """A token-only ``llama_batch`` (one sequence)."""

    def __init__(self, stack: ExitStack, n_batch: int) -> None:
        self.n_batch = n_batch
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        stack.callback(llama_cpp.llama_batch_free, self.batch)

    def fill(self, tokens: list[int], pos0: int, logits_last: bool) -> None:
        b = self.batch
        n = len(tokens)
        assert 0 < n <= self.n_batch
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = int(logits_last and i == n - 1)
        b.n_tokens = n


class _TokenEmbdBatch:
    """A ``llama_batch`` that carries a token *and* an embedding row per entry,
    as the gemma4-assistant graph needs."""

    def __init__(self, stack: ExitStack, n_batch: int, n_embd: int) -> None:
        self.n_batch = n_batch
        self.n_embd = n_embd
        self.batch = llama_cpp.llama_batch_init(n_batch, n_embd, 1)
        self._tokens = (llama_cpp.llama_token * n_batch)()
        self.batch.token = self._tokens
        self.embd = np.ctypeslib.as_array(self.batch.embd, shape=(n_batch, n_embd))

        def free() -> None:
            # llama_batch_free frees every non-null member; the token array is ours.
            self.batch.token = ctypes.POINTER(llama_cpp.llama_token)()
            llama_cpp.llama_batch_free(self.batch)

        stack.callback(free)

    def set_one(self, token: int, pos: int, h: np.ndarray) -> None:
        b = self.batch
        b.token[0] = token
        b.pos[0] = pos
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = 0
        b.logits[0] = 1
        self.embd[0, :] = h
        b.n_tokens = 1


class TargetWithDrafter:
    """A ``gemma4`` target and its ``gemma4-assistant`` MTP drafter, loaded
    together. Use as a context manager; :meth:`close` frees everything."""

    def __init__(
        self,
        target_path: str | Path,
        drafter_path: str | Path,
        n_ctx: int = 512,
        n_threads: int = 2,
        n_batch: int = 512,
        n_gpu_layers: int | None = None,
        quiet: bool = True,
    ) -> None:
        self._stack = ExitStack()
        try:
            self._open(Path(target_path), Path(drafter_path), n_ctx, n_threads, n_batch, n_gpu_layers, quiet)
        except BaseException:
            self._stack.close()
            raise

    def _open(
        self,
        target_path: Path,
        drafter_path: Path,
        n_ctx: int,
        n_threads: int,
        n_batch: int,
        n_gpu_layers: int | None,
        quiet: bool,
    ) -> None:
        s = self._stack
        _backend_init()
        if quiet:
            quiet_logs(s)

        # target
        self.target_model = _load_model(s, target_path, "target", n_gpu_layers)
        self.vocab = llama_cpp.llama_model_get_vocab(self.target_model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(llama_cpp.llama_model_n_embd(self.target_model))
        tparams = llama_cpp.llama_context_default_params()
        tparams.n_ctx = n_ctx
        tparams.n_batch = max(1, min(n_ctx, n_batch))
        tparams.n_ubatch = tparams.n_batch
        tparams.n_seq_max = 1
        tparams.n_threads = n_threads
        tparams.n_threads_batch = n_threads
        tparams.embeddings = False
        self.target_ctx = _new_context(s, self.target_model, tparams, f"target {target_path}")
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.target_ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(self.target_ctx))
        self.target_mem = llama_cpp.llama_get_memory(self.target_ctx)
        llama_cpp_ext.llama_set_embeddings_nextn(self.target_ctx, True, False)
        self._target_batch = _TokenBatch(s, self.n_batch)

        # drafter: check it fits the target before building anything on it
        self.drafter_model = _load_model(s, drafter_path, "drafter", n_gpu_layers)
        arch = _meta_str(self.drafter_model, "general.architecture")
        if arch != ASSISTANT_ARCH:
            raise GgufExactError(f"drafter model {drafter_path}: architecture is {arch!r}, expected {ASSISTANT_ARCH!r}")
        d_embd_out = int(llama_cpp.llama_model_n_embd_out(self.drafter_model))
        if d_embd_out != self.n_embd:
            raise GgufExactError(
                f"drafter model {drafter_path}: backbone width (n_embd_out) {d_embd_out} "
                f"does not match the target's n_embd {self.n_embd} ({target_path})"
            )
        d_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.drafter_model)))
        if d_vocab != self.n_vocab:
            raise GgufExactError(
                f"drafter model {drafter_path}: vocab size {d_vocab} does not match the target's {self.n_vocab}"
            )
        dparams = llama_cpp.llama_context_default_params()
        dparams.n_ctx = self.n_ctx
        dparams.n_batch = 1
        dparams.n_ubatch = 1
        dparams.n_seq_max = 1
        dparams.n_threads = n_threads
        dparams.n_threads_batch = n_threads
        dparams.embeddings = False
        dparams.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        dparams.n_outputs_max = 1
        dparams.ctx_other = self.target_ctx
        self.drafter_ctx = _new_context(s, self.drafter_model, dparams, f"drafter {drafter_path} (MTP context)")
        if llama_cpp_ext.llama_get_ctx_other(self.drafter_ctx) != self.target_ctx:
            raise GgufExactError(f"drafter {drafter_path}: MTP context is not linked to the target context")
        llama_cpp_ext.llama_set_embeddings_nextn(self.drafter_ctx, True, True)
        self._drafter_batch = _TokenEmbdBatch(s, 1, self.n_embd)

    # lifetime

    def close(self) -> None:
        """Free every llama.cpp object (idempotent)."""
        self._stack.close()

    def __enter__(self) -> TargetWithDrafter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # helpers

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` in the target vocab (BOS first when ``add_bos``)."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_bos, False)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_bos, False)
        if n < 0:
            raise GgufExactError(f"tokenize: llama.cpp failed on {text[:40]!r}")
        return list(buf[:n])

    def _check_ids(self, ids: list[int], what: str) -> list[int]:
        ids = [int(t) for t in ids]
        if not ids:
            raise GgufExactError(f"{what}: empty prompt")
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise GgufExactError(f"{what}: token id {bad[0]} outside the vocab [0, {self.n_vocab})")
        return ids

    def _decode_target(self, tokens: list[int], pos0: int, logits_last: bool) -> int:
        """Decode ``tokens`` at ``pos0..`` in chunks of n_batch; returns the batch
        index of the last token within the last chunk."""
        last = 0
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            is_last = start + self.n_batch >= len(tokens)
            self._target_batch.fill(chunk, pos0 + start, logits_last and is_last)
            rc = int(llama_cpp.llama_decode(self.target_ctx, self._target_batch.batch))
            if rc != 0:
                raise GgufExactError(f"target decode failed with code {rc} at position {pos0 + start}")
            last = len(chunk) - 1
        return last

    def _prefill(self, prompt_ids: list[int], n_more: int, what: str) -> int:
        ids = self._check_ids(prompt_ids, what)
        if len(ids) + n_more > self.n_ctx:
            raise GgufExactError(f"{what}: {len(ids)} prompt + {n_more} new tokens exceed n_ctx {self.n_ctx}")
        llama_cpp.llama_memory_clear(self.target_mem, True)
        return self._decode_target(ids, 0, logits_last=True)

    def _target_next(self) -> int:
        return _argmax(llama_cpp.llama_get_logits_ith(self.target_ctx, -1), self.n_vocab, "target")

    # public API

    def target_greedy(self, prompt_ids: list[int], n_predict: int) -> list[int]:
        """Greedy decoding with the target alone: ``n_predict`` argmax tokens."""
        if n_predict <= 0:
            return []
        n_prompt = len(prompt_ids)
        self._prefill(prompt_ids, n_predict, "target_greedy")
        out: list[int] = []
        while True:
            out.append(self._target_next())
            if len(out) == n_predict:
                return out
            self._decode_target([out[-1]], n_prompt + len(out) - 1, logits_last=True)

    def draft(self, prompt_ids: list[int], n_draft: int) -> list[int]:
        """Run the target over ``prompt_ids`` and let the drafter propose
        ``n_draft`` tokens greedily after the target's own next token."""
        if n_draft <= 0:
            return []
        n_prompt = len(prompt_ids)
        last = self._prefill(prompt_ids, 1, "draft")
        token = self._target_next()
        h_ptr = llama_cpp_ext.llama_get_embeddings_nextn_ith(self.target_ctx, last)
        if not h_ptr:
            raise GgufExactError("draft: the target produced no nextn hidden state")
        h = np.ctypeslib.as_array(h_ptr, shape=(self.n_embd,)).copy()

        drafted: list[int] = []
        while True:
            # Gemma 4 assistants share the target KV: every draft step sits at pos N.
            self._drafter_batch.set_one(token, n_prompt, h)
            rc = int(llama_cpp.llama_decode(self.drafter_ctx, self._drafter_batch.batch))
            if rc != 0:
                raise GgufExactError(f"drafter decode failed with code {rc} at draft step {len(drafted)}")
            token = _argmax(llama_cpp.llama_get_logits_ith(self.drafter_ctx, 0), self.n_vocab, "drafter")
            drafted.append(token)
            if len(drafted) == n_draft:
                return drafted
            h_ptr = llama_cpp_ext.llama_get_embeddings_nextn_ith(self.drafter_ctx, 0)
            if not h_ptr:
                raise GgufExactError(f"draft: the drafter produced no nextn hidden state at step {len(drafted)}")
            h = np.ctypeslib.as_array(h_ptr, shape=(self.n_embd,)).copy()


__all__ = ["ASSISTANT_ARCH", "TargetWithDrafter", "quiet_logs"]
