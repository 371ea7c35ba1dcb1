"""A ``gemma4-assistant`` MTP drafter in llama.cpp, beside a target context.

The drafter context is built with ``ctx_type = LLAMA_CONTEXT_TYPE_MTP`` and
``ctx_other`` = the target context: it has no K/V projections and attends to
the target's KV cache. Each step decodes one row ``(token, pos, h)``: the first
``h`` is the target's hidden state of the position before ``pos`` (the row that
produced ``token``; :mod:`.engine` finds it), later ones the drafter's own
projected-back state. As upstream does for Gemma 4 assistants (``common/speculative.cpp``,
``is_mem_shared``), every step of a draft sits at the same position ``pos``.

:func:`check_compatible` refuses a drafter that does not fit the target
(architecture, backbone width, vocabulary) before any context is built on it.
"""

from __future__ import annotations

import ctypes
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from gguf_exact.engines.python.bindings import (
    _load_model,
    _meta_str,
    _new_context,
)
from gguf_exact.errors import InputError, PairError
from gguf_exact.gemma4.assistant import ARCH as ASSISTANT_ARCH

if TYPE_CHECKING:
    # The hidden state a draft starts from: ``n_embd`` floats, llama.cpp's row (a pointer into
    # its output) or an array of them.
    HiddenState = Union["ctypes._Pointer[ctypes.c_float]", "ctypes.Array[ctypes.c_float]"]


@dataclass(frozen=True)
class TargetSide:
    """What the drafter needs of the target: its context, vocabulary and sizes."""

    path: Path
    ctx: Any  # llama_context_p, with nextn hidden states on
    vocab: Any  # llama_vocab_p
    n_ctx: int
    n_embd: int
    n_vocab: int


def check_compatible(target: TargetSide, drafter_model: Any, path: Path) -> None:
    """Raise :class:`GgufExactError` unless the loaded drafter fits the loaded target
    (what llama.cpp made of the files: widths, vocabulary size and type, BOS/EOS)."""
    arch = _meta_str(drafter_model, "general.architecture")
    if arch != ASSISTANT_ARCH:
        raise PairError(f"drafter model {path}: architecture is {arch!r}, expected {ASSISTANT_ARCH!r}")
    width = int(llama_cpp.llama_model_n_embd_out(drafter_model))
    if width != target.n_embd:
        raise PairError(
            f"drafter model {path}: backbone width (n_embd_out) {width} does not match the target's n_embd {target.n_embd} ({target.path})"
        )
    dv = llama_cpp.llama_model_get_vocab(drafter_model)
    n = int(llama_cpp.llama_vocab_n_tokens(dv))
    if n != target.n_vocab:
        raise PairError(
            f"drafter model {path}: vocab size {n} does not match the target's {target.n_vocab} ({target.path})"
        )
    tv = target.vocab
    if int(llama_cpp.llama_vocab_type(dv)) != int(llama_cpp.llama_vocab_type(tv)):
        raise PairError(f"drafter model {path}: vocabulary type differs from the target's ({target.path})")
    for what, f in (("BOS", llama_cpp.llama_vocab_bos), ("EOS", llama_cpp.llama_vocab_eos)):
        if int(f(dv)) != int(f(tv)):
            raise PairError(f"drafter model {path}: {what} token {int(f(dv))} differs from the target's {int(f(tv))}")
    # The token texts themselves were compared as bytes, from the GGUF headers, by
    # pair.checks.check_pair before either model was loaded (MtpLlama).


class LlamaDrafter:
    """An MTP drafter context on ``target``, owned by ``stack``."""

    def __init__(
        self, stack: ExitStack, path: str | Path, target: TargetSide, n_threads: int, n_gpu_layers: int | None
    ) -> None:
        self.path = Path(path)
        self.target = target
        self.model = _load_model(stack, self.path, "drafter", n_gpu_layers)
        check_compatible(target, self.model, self.path)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = target.n_ctx
        params.n_batch = 1
        params.n_ubatch = 1
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.embeddings = False
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.n_outputs_max = 1
        params.ctx_other = target.ctx
        self.ctx = _new_context(stack, self.model, params, f"drafter {self.path} (MTP context)")
        if llama_cpp_ext.llama_get_ctx_other(self.ctx) != target.ctx:
            raise InputError(f"drafter {self.path}: MTP context is not linked to the target context")
        llama_cpp_ext.llama_set_embeddings_nextn(self.ctx, True, True)
        self.n_embd = target.n_embd
        self.n_vocab = target.n_vocab
        # embd is allocated by llama_batch_init; the token array is ours (the graph reads both).
        batch = llama_cpp.llama_batch_init(1, self.n_embd, 1)
        self._tokens = (llama_cpp.llama_token * 1)()
        batch.token = self._tokens

        def free() -> None:
            batch.token = ctypes.POINTER(llama_cpp.llama_token)()
            llama_cpp.llama_batch_free(batch)

        stack.callback(free)
        self.batch = batch
        self._embd_bytes = self.n_embd * ctypes.sizeof(ctypes.c_float)
        self._logits: dict[int, np.ndarray] = {}  # numpy views of llama.cpp's logits rows, by address
        batch.n_seq_id[0] = 1
        batch.seq_id[0][0] = 0
        batch.logits[0] = 1
        batch.n_tokens = 1
        self.seconds = 0.0  # time inside llama_decode
        self.last_steps = 0  # decodes of the latest draft

    def draft(
        self, token: int, pos: int, n: int, h: HiddenState, p_min: float = 0.0,
        pick: Callable[[np.ndarray], int] | None = None,
    ) -> list[int]:  # fmt: skip
        """Up to ``n`` draft tokens after ``token`` at ``pos``; ``h`` points to the
        target's hidden state (``n_embd`` floats) of the row that produced ``token``. The
        draft stops before a token whose probability is below ``p_min``, as llama.cpp's
        draft-mtp measures it: softmax over the drafter's 10 best logits. Each token is
        the row's argmax (greedy), or ``pick(row)``'s (speculative sampling draws it)."""
        b, ctx = self.batch, self.ctx
        out: list[int] = []
        self.last_steps = 0
        for step in range(n):
            ctypes.memmove(b.embd, h, self._embd_bytes)
            b.token[0] = token
            b.pos[0] = pos  # shared KV: every draft step sits at the same position
            t = time.perf_counter()
            rc = int(llama_cpp.llama_decode(ctx, b))
            self.seconds += time.perf_counter() - t
            self.last_steps += 1
            if rc != 0:
                raise InputError(f"drafter decode failed with code {rc} at draft step {step}")
            row = self._logits_row()
            if p_min > 0 and top_probability(row) < p_min:
                break
            token = int(row.argmax()) if pick is None else pick(row)
            out.append(token)
            if step + 1 < n:
                h = llama_cpp_ext.llama_get_embeddings_nextn_ith(ctx, 0)
                if not h:
                    raise InputError(f"drafter: llama.cpp returned no nextn hidden state at step {step}")
        return out

    def _logits_row(self) -> np.ndarray:
        # llama.cpp keeps its output buffer between decodes: one numpy view per address
        # instead of a new one per step (a few microseconds each, per draft token).
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, 0)
        if not ptr:
            raise InputError("drafter: llama.cpp returned no logits")
        address = ctypes.cast(ptr, ctypes.c_void_p).value or 0  # not 0: ptr is not NULL
        view = self._logits.get(address)
        if view is None:
            view = self._logits[address] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        return view


def top_probability(logits: np.ndarray, k: int = 10) -> float:
    """The best token's probability among the ``k`` best (llama.cpp's draft-mtp samples
    its drafts through top-k 10 and compares that to p-min)."""
    top = np.partition(logits, -k)[-k:].astype(np.float64)
    return float(1.0 / np.exp(top - top.max()).sum())


__all__ = ["LlamaDrafter", "TargetSide", "check_compatible", "top_probability"]
