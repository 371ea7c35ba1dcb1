"""llama-cpp-python's draft-model hook on the MTP drafter: :class:`MtpDraftModel`."""

from __future__ import annotations

from typing import Any

import numpy as np
from llama_cpp import llama_cpp_ext
from llama_cpp.llama_speculative import LlamaDraftModel

from gguf_exact.errors import InputError
from gguf_exact.speculative.drafter import LlamaDrafter

_NO_DRAFTS = np.zeros(0, dtype=np.intc)


class MtpDraftModel(LlamaDraftModel):
    """llama-cpp-python's draft-model hook, drafting with a gemma4-assistant MTP drafter.

    ``Llama.generate`` calls it with every token so far; the last one is the newest,
    at position ``len(input_ids) - 1``, not yet decoded. The drafter starts from the
    target's hidden state of the position before it, which is row
    ``pos - 1 - batch_start`` of the target's last decode. ``n_max`` may be changed
    between calls; 0 (or no drafter) drafts nothing: the target alone.
    """

    def __init__(self, n_max: int) -> None:
        self.n_max = n_max
        self.drafter: LlamaDrafter | None = None
        self.llm: Any = None  # the MtpLlama it drafts for (set once both exist)

    def hidden(self, pos: int) -> Any:
        """The target's hidden state for a draft at ``pos``: that of position ``pos - 1``,
        row ``pos - 1 - batch_start`` of the target's last decode (a pointer to
        ``n_embd`` floats)."""
        llm = self.llm
        h = llama_cpp_ext.llama_get_embeddings_nextn_ith(llm.ctx, pos - 1 - llm._batch_start)  # type: ignore[union-attr]
        if not h:
            raise InputError(f"target: llama.cpp returned no hidden state for position {pos - 1}")
        return h

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        llm = self.llm
        assert llm is not None
        llm._verify_next = True  # the next eval is a verification pass: logits on every row
        call = llm._call
        pos = len(input_ids) - 1
        k = self.n_max if self.drafter is not None else 0
        if call is not None:
            k = min(k, call.remaining() - 1)  # a pass yields at most k + 1 tokens
        k = min(k, llm.context_size - pos - 2)  # leave room in the context, as llama-server does
        if k <= 0:
            return _NO_DRAFTS
        drafts = self.drafter.draft(int(input_ids[-1]), pos, k, self.hidden(pos))  # type: ignore[union-attr]
        if call is not None:
            call.pending_drafts = len(drafts)
        return np.asarray(drafts, dtype=np.intc)


__all__ = ["MtpDraftModel"]
