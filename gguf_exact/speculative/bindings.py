"""llama.cpp bindings for draft-mtp: a ``gemma4-assistant`` drafter beside its ``gemma4`` target.

The shared low-level pieces (backend, quiet logs, model and context loading, the
token+embedding batch) for :mod:`.target`, :mod:`.drafter` and :mod:`.runner`; the
call sequence they follow is below.

This drives the llama-cpp-python low-level ctypes bindings (``llama_cpp.llama_cpp``
plus the staging API in ``llama_cpp.llama_cpp_ext``) the way upstream's
``draft-mtp`` speculative mode does (``common/speculative.cpp``,
``common_speculative_impl_draft_mtp``, the ``is_mem_shared`` branch).

Call sequence
-------------
Opening (:class:`.runner.Runner`, through :class:`.target.LlamaTarget` and :class:`.drafter.LlamaDrafter`):

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

Drafting (:meth:`.drafter.LlamaDrafter.draft`), after a prompt of ``N`` tokens:

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
batch, target context, target model) by :meth:`.runner.Runner.close`.
"""

from __future__ import annotations

import ctypes
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

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
