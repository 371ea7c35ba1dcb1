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

Where the row's k+1 highest logits are all distinct (any row of a real model's 262,144, almost
always), the chain is given those k sorted instead of the whole row (:func:`sorted_head`): its
top-k then only truncates what its partial sort would have left (the same entries in the same
order, flagged sorted), and the later samplers see the same array: 0.2 ms a row against 0.5 for
copying and partially sorting the whole row (``scripts/bench_sampling.py``), twice a drafted
token (q and p).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Protocol

import llama_cpp
import numpy as np

from gguf_exact.engines.shared.speculative_sampling import ChainSettings, Support

MIN_KEEP = 1  # llama-cpp-python's chain keeps at least one candidate (Llama._init_sampler)
PARTIAL_SORT_MAX_K = 128  # llama.cpp's top-k sorts up to this many with std::partial_sort, more by buckets
HEAD_ROWS = 64  # sorted_head lays a row out as 64 rows and searches the columns with the highest maxima

# llama_token_data, one entry of llama_token_data_array (llama.h): id, logit, p
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data) == 12


def _words(row: np.ndarray) -> np.ndarray:
    return row.view(np.uint32).reshape(-1, 3)


def sorted_head(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The ids and logits of ``values``' k highest, highest first, where that is the one thing
    llama.cpp's top-k (``std::partial_sort`` by logit, k <= 128) can leave: the k+1 highest are all
    distinct. None otherwise (a tie decides which tokens or which order the sort leaves; a NaN; a row flat
    below its few best, as a made-up pair's often is, is passed at the first sign), or where the row
    is too small for the shortcut to pay or not a whole number of groups.

    The row as 64 rows of ``size / 64`` columns: the (k+1)-th highest column maximum T has k+1 values
    at or above it, so the k+1 highest values are all >= T and each lies in a column whose maximum
    is >= T; only those columns (about k+1 of 4,096) are searched."""
    need = k + 1
    if not 0 < k <= PARTIAL_SORT_MAX_K or values.size < HEAD_ROWS * 4 * need or values.size % HEAD_ROWS:
        return None
    width = values.size // HEAD_ROWS
    grid = values.reshape(HEAD_ROWS, width)  # column j: tokens j, j + width, j + 2 width, ...
    column_max = grid.max(axis=0)
    if np.isnan(column_max).any():  # a maximum is NaN where its column holds one
        return None
    threshold = np.partition(column_max, width - need)[width - need]
    columns = np.flatnonzero(column_max >= threshold)
    if columns.size > 4 * need:  # column maxima tied at the threshold (a flat row): the sort decides
        return None
    candidates = grid[:, columns].ravel()
    best = np.argpartition(candidates, candidates.size - need)[-need:]
    best = best[np.argsort(candidates[best])[::-1]]
    logits = candidates[best]
    if not np.all(logits[:-1] > logits[1:]):
        return None
    rows, at = np.divmod(best[:k], columns.size)
    return (rows * width + columns[at]).astype(np.int32), logits[:k]


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

    def __init__(self, sampler: TruncatingSampler, by_head: bool = True) -> None:
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
        self._top_k = sampler.top_k
        self._by_head = by_head  # False: always the whole row (scripts/bench_sampling.py's peer arm)
        self._rows_without_head = 0  # in a row: after two, sorted_head is tried every 16th row only
        self._row = np.zeros(0, TOKEN_DATA)
        self._fresh = np.zeros(0, TOKEN_DATA)  # a row's ids in token order, logits and p 0

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """The distribution as a dense row over the vocabulary."""
        values = np.asarray(logits)
        return self.support(values).dense(values.size)

    def support(self, logits: np.ndarray) -> Support:
        """The distribution as its survivors (what the rule verifies with: :class:`Support`)."""
        values = np.asarray(logits, dtype=np.float32)
        if values.ndim != 1 or values.size == 0:
            raise ValueError(f"logits: one row with no NaN expected, got shape {values.shape}")
        head = sorted_head(values, self._top_k) if self._head_worth_trying() else None  # None where a NaN is
        self._rows_without_head = 0 if head is not None else self._rows_without_head + 1
        if head is None:
            nan = np.isnan(values)
            if nan.any():
                raise ValueError(f"logits: one row with no NaN expected, got a NaN at {int(np.argmax(nan))}")
            row = self._laid_out(values)
        else:
            row = np.zeros(head[0].size, TOKEN_DATA)  # the chain's array this call: k entries, p 0
            row["id"], row["logit"] = head
        cur = llama_cpp.llama_token_data_array(
            data=row.ctypes.data_as(llama_cpp.llama_token_data_p), size=row.size, selected=-1, sorted=head is not None
        )
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(cur))
        # the samplers may point data elsewhere (llama.h): read the survivors where it points now
        survivors = np.ctypeslib.as_array(
            (ctypes.c_char * (cur.size * TOKEN_DATA.itemsize)).from_address(ctypes.addressof(cur.data.contents))
        ).view(TOKEN_DATA)
        scaled = survivors["logit"].astype(np.float64)
        weights = np.exp(scaled - scaled.max())
        return Support.of(survivors["id"].astype(np.intp), weights / weights.sum())  # summed in the chain's order

    def _head_worth_trying(self) -> bool:
        """A real model's rows have a head nearly always; a made-up pair's flat rows never (0.08 ms a try)."""
        return self._by_head and (self._rows_without_head < 2 or self._rows_without_head % 16 == 0)

    def _laid_out(self, values: np.ndarray) -> np.ndarray:
        """The whole row as ``llama_sampler_sample`` lays it out: ids in token order, p 0."""
        if self._row.size != values.size:  # once per vocabulary; a sampler may reorder ids, so reset below
            self._row = np.zeros(values.size, TOKEN_DATA)
            self._fresh = np.zeros(values.size, TOKEN_DATA)
            self._fresh["id"] = np.arange(values.size, dtype=np.int32)
        # as rows of three 32-bit words (id, logit, p): one copy and one column per row, half the time of
        # three field writes (0.13 against 0.27 ms at 262,144 tokens), the same bytes
        row = self._row
        np.copyto(_words(row), _words(self._fresh))
        _words(row)[:, 1] = values.view(np.uint32)
        return row

    def close(self) -> None:
        self._free()


__all__ = ["MIN_KEEP", "ChainDistribution", "TruncatingSampler", "sorted_head"]
