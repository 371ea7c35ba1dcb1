"""The distribution a request's sampler chain draws one row from, computed by llama.cpp itself.

Speculative sampling (:mod:`.rejection`) needs p and q exactly as llama.cpp's chain samples
them, because the rows it does not verify (the prompt's last, the bonus row) are sampled by
that chain. The numpy mirror :func:`~gguf_exact.engines.shared.speculative_sampling.chain_probabilities`
agrees everywhere except where a top-k or top-p cut falls between equal logits: which of
the tied tokens survive is up to llama.cpp's partial sort, so there the mirror's p is
another distribution and the engine's output drifted from the target alone's (issue 38:
G 630 against a threshold of 100 on the tiny hidden pair at top-p 0.9, whose cut falls
among ~290 tokens of logit 0). Rather than re-implement the sort's tie order, the engine
runs llama.cpp's own samplers: the chain llama-cpp-python's ``Llama._init_sampler`` builds
for a request, less its final ``dist`` draw, applied to the row laid out as
``llama_sampler_sample`` lays it out (token order, unsorted). Like ``dist``, the
survivors' probabilities are the softmax of their logits after the temperature.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Protocol

import llama_cpp
import numpy as np

from gguf_exact.engines.shared.speculative_sampling import ChainSettings, Support

MIN_KEEP = 1  # llama-cpp-python's chain keeps at least one candidate (Llama._init_sampler)

# llama_token_data, one entry of llama_token_data_array (llama.h): id, logit, p
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data) == 12


def _words(row: np.ndarray) -> np.ndarray:
    return row.view(np.uint32).reshape(-1, 3)


class TruncatingSampler(ChainSettings, Protocol):
    """The fields of a request's sampler the chain is built from (``rejection.SamplerView``): the
    mirrored chain's, and typical-p, which llama-cpp-python's chain also runs."""

    @property
    def typical_p(self) -> float: ...


class ChainDistribution:
    """llama.cpp's chain for one request's sampler: call it on a row of logits for the
    distribution (float64 over the vocabulary, 0 outside the candidates) it samples from, or
    :meth:`support` for the candidates alone.
    Only for chains the rule mirrors (``why_not_mirrored`` is None) at temperature > 0:
    penalties and grammar need the chain's accepted tokens, which this chain never sees."""

    def __init__(self, sampler: TruncatingSampler) -> None:
        if not sampler.temperature > 0:
            raise ValueError(f"temperature {sampler.temperature!r}: a chain distribution needs a sampled request")
        # the order and min_keep of Llama._init_sampler's non-mirostat branch, by llama.h's public calls
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._free = weakref.finalize(self, llama_cpp.llama_sampler_free, self._chain)
        for stage in (
            llama_cpp.llama_sampler_init_top_k(sampler.top_k),
            llama_cpp.llama_sampler_init_typical(sampler.typical_p, MIN_KEEP),
            llama_cpp.llama_sampler_init_top_p(sampler.top_p, MIN_KEEP),
            llama_cpp.llama_sampler_init_min_p(sampler.min_p, MIN_KEEP),
            llama_cpp.llama_sampler_init_temp(sampler.temperature),
        ):
            llama_cpp.llama_sampler_chain_add(self._chain, stage)  # the chain owns it from here
        self._row = np.zeros(0, TOKEN_DATA)
        self._fresh = np.zeros(0, TOKEN_DATA)  # a row's ids in token order, logits and p 0

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """The distribution as a dense row over the vocabulary."""
        values = np.asarray(logits)
        return self.support(values).dense(values.size)

    def support(self, logits: np.ndarray) -> Support:
        """The distribution as its survivors (what the rule verifies with: :class:`Support`)."""
        values = np.asarray(logits, dtype=np.float32)
        if values.ndim != 1 or values.size == 0 or np.isnan(values).any():
            raise ValueError(f"logits: one row with no NaN expected, got shape {values.shape}")
        if self._row.size != values.size:  # once per vocabulary; a sampler may reorder ids, so reset below
            self._row = np.zeros(values.size, TOKEN_DATA)
            self._fresh = np.zeros(values.size, TOKEN_DATA)
            self._fresh["id"] = np.arange(values.size, dtype=np.int32)
        # as rows of three 32-bit words (id, logit, p): one copy and one column per row, half the time of
        # three field writes (0.13 against 0.27 ms at 262,144 tokens), the same bytes
        row = self._row
        np.copyto(_words(row), _words(self._fresh))
        _words(row)[:, 1] = values.view(np.uint32)
        cur = llama_cpp.llama_token_data_array(
            data=row.ctypes.data_as(llama_cpp.llama_token_data_p), size=row.size, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(cur))
        # the samplers may point data elsewhere (llama.h): read the survivors where it points now
        survivors = np.ctypeslib.as_array(
            (ctypes.c_char * (cur.size * TOKEN_DATA.itemsize)).from_address(ctypes.addressof(cur.data.contents))
        ).view(TOKEN_DATA)
        scaled = survivors["logit"].astype(np.float64)
        weights = np.exp(scaled - scaled.max())
        return Support.of(survivors["id"].astype(np.intp), weights / weights.sum())  # summed in the chain's order

    def close(self) -> None:
        self._free()


__all__ = ["MIN_KEEP", "ChainDistribution", "TruncatingSampler"]
