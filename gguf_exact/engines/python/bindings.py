"""llama.cpp bindings for draft-mtp: a ``gemma4-assistant`` drafter beside its ``gemma4`` target.

The shared low-level pieces (model and context loading, GGUF metadata) for
:mod:`.drafter` and :mod:`.engine`; the call sequence they follow is below.

The target is llama-cpp-python's high-level ``Llama`` (:class:`.engine.MtpLlama`);
the drafter drives the low-level ctypes bindings (``llama_cpp.llama_cpp`` plus the
staging API in ``llama_cpp.llama_cpp_ext``) the way upstream's ``draft-mtp``
speculative mode does (``common/speculative.cpp``, ``common_speculative_impl_draft_mtp``,
the ``is_mem_shared`` branch).

Call sequence
-------------
Opening (:class:`.engine.MtpLlama`):

1. ``Llama(target)`` loads the target model and context (``swa_full`` on, so a
   rolled-back position was never evicted from the sliding-window cache); then
   ``llama_set_embeddings_nextn(target_ctx, True, masked=False)`` so every decoded
   token of the target leaves its post-final-norm hidden state ``h`` (one dense row
   per batch token, read with ``llama_get_embeddings_nextn_ith(target_ctx, row)``).
2. ``llama_model_load_from_file(drafter)``; check that the drafter's
   ``llama_model_n_embd_out`` (its backbone width) equals the target's
   ``llama_model_n_embd`` and the vocabularies agree, *before* any context is
   built for it (:func:`.drafter.check_compatible`).
3. ``llama_init_from_model(drafter, params)`` with
   ``ctx_type = LLAMA_CONTEXT_TYPE_MTP``, ``ctx_other = target_ctx`` (the drafter
   has no K/V projections: its KV cache mirrors the target's last sliding and
   last full layer, read-only) and ``n_outputs_max = 1``; then
   ``llama_set_embeddings_nextn(drafter_ctx, True, masked=True)`` so each output
   row of the drafter also yields its projected-back hidden state.
4. A drafter batch ``llama_batch_init(1, n_embd_backbone, 1)``: it allocates
   ``embd`` only, so a Python-owned ``token`` array is attached as well; the
   gemma4-assistant graph reads both (target token embedding of the token,
   concatenated with the ``h`` row). The pointer is detached again before
   ``llama_batch_free``.

Drafting (``Llama.generate`` calls the draft model before each verification pass):

1. The newest token ``t`` sits at position ``N`` and is not in the KV cache yet; the
   cache holds ``0..N-1``. ``h = nextn_ith(target_ctx, row)`` where ``row`` is the
   batch row of position ``N-1`` in the target's last decode: the row that produced
   ``t`` (after a rejected draft that is not the batch's last row).
2. Drafter step: one batch row ``(token=t, pos=N, embd=h, logits=1)``;
   ``llama_decode(drafter_ctx)``; ``d1 = argmax(drafter logits)``.
3. Chain: the next row is ``(token=d_k, pos=N, embd=nextn_ith(drafter_ctx, 0))``.
   Because the drafter shares the target's KV and writes none of its own, every
   step uses the *same* position ``N`` (as upstream does for Gemma 4 assistants).

Every llama.cpp object is owned by the ``Llama``'s :class:`contextlib.ExitStack`
and freed in reverse order of creation (drafter batch, drafter context, drafter
model, then the target's batch, context and model) by ``Llama.close()``.
"""

from __future__ import annotations

import ctypes
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import llama_cpp

from gguf_exact.builds.devices import Device, ggml_gpu_backends, ggml_gpu_devices
from gguf_exact.errors import InputError

# ggml.h at 0c1e57098: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line).
# (llama-cpp-python's own callback maps these one level too high, so its verbose=False
# still prints llama.cpp's warnings.)
GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT = 4, 5
_last_level = 0


def _errors_only(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _last_level
    if level != GGML_LOG_LEVEL_CONT:
        _last_level = level
    if _last_level == GGML_LOG_LEVEL_ERROR:
        sys.stderr.write(text.decode("utf-8", "replace"))


# Kept at module level so the C side never calls a collected trampoline.
_ERRORS_ONLY_CALLBACK = llama_cpp.llama_log_callback(_errors_only)


def errors_only_logs(stack: ExitStack) -> None:
    """llama.cpp logs errors only (on stderr) until ``stack`` closes, then the callback
    installed before is restored."""
    prev_cb = llama_cpp.llama_log_callback()
    prev_ud = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(prev_cb), ctypes.byref(prev_ud))
    llama_cpp.llama_log_set(_ERRORS_ONLY_CALLBACK, ctypes.c_void_p(0))

    def restore() -> None:
        llama_cpp.llama_log_set(prev_cb if prev_cb else None, prev_ud)

    stack.callback(restore)


def gpu_backends() -> list[str]:
    """The GPU backends these bindings were built with (``Vulkan``, ``CUDA``), devices or not."""
    return ggml_gpu_backends(llama_cpp.llama_cpp._lib)


def gpu_devices() -> list[Device]:
    """The GPU devices these bindings see in this process's environment, as llama-server's
    ``--list-devices`` names them (``Vulkan0: llvmpipe (...) (2048 MiB)``): where layers go.
    A CPU-type Vulkan device (lavapipe) is among them only when ``GGML_VK_VISIBLE_DEVICES``
    names it (:mod:`gguf_exact.builds.devices`)."""
    return ggml_gpu_devices(llama_cpp.llama_cpp._lib)


def _meta_str(model: Any, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def _load_model(stack: ExitStack, path: str | Path, role: str, n_gpu_layers: int | None) -> Any:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{role} model {path}: no such file")
    params = llama_cpp.llama_model_default_params()
    if n_gpu_layers is not None:
        params.n_gpu_layers = n_gpu_layers
    model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        raise InputError(f"{role} model {path}: llama.cpp failed to load it")
    stack.callback(llama_cpp.llama_model_free, model)
    return model


def _new_context(stack: ExitStack, model: Any, params: Any, what: str) -> Any:
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise InputError(f"{what}: llama.cpp failed to create the context")
    stack.callback(llama_cpp.llama_free, ctx)
    return ctx
