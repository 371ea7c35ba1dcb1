"""What one sampled row costs the Python engine's rule against what llama.cpp's sampler pays for it
(``scripts/bench_sampling.py``).

Speculative sampling needs the request's distribution twice a drafted token (q on the drafter's row,
p on the target's): :class:`~gguf_exact.engines.python.chain_distribution.ChainDistribution`, by the
row's sorted head where it has one, else by the whole row. The peer is llama.cpp's own chain ending
in ``dist`` on the whole row laid out as ``llama_sampler_sample`` lays it out: what the target alone
pays a sampled token, and about what llama-server's ``common_sampler_probs`` pays a row.

The made-up pairs' rows are flat below their few best (the head never applies to them); a real
model's 262,144 logits are distinct, so these rows are drawn: most tokens far below a few hundred
that stand out, clustered in one stretch of the vocabulary.
"""

from __future__ import annotations

import ctypes
import statistics
import time
import weakref
from typing import Callable

import llama_cpp
import numpy as np

from gguf_exact.engines.python import chain_distribution
from gguf_exact.engines.python.chain_distribution import TOKEN_DATA, ChainDistribution, TruncatingSampler


def realistic_row(seed: int, vocab: int = 262_144) -> np.ndarray:
    """A row of distinct float32 logits shaped like a language model's (see the module)."""
    rng = np.random.default_rng(seed)
    row = rng.normal(-12.0, 2.0, vocab).astype(np.float32)
    stretch = int(rng.integers(0, vocab - 4096))
    row[stretch : stretch + 4096] += rng.gamma(2.0, 3.0, 4096).astype(np.float32)
    return row


def llama_cpp_sample(chain: TruncatingSampler, seed: int = 0) -> Callable[[np.ndarray], int]:
    """llama.cpp's chain for ``chain`` with its ``dist`` draw, as llama-cpp-python builds it: a function
    sampling one row laid out as ``llama_sampler_sample`` lays it out."""
    smpl = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for stage in (
        llama_cpp.llama_sampler_init_top_k(chain.top_k),
        llama_cpp.llama_sampler_init_typical(chain.typical_p, chain_distribution.MIN_KEEP),
        llama_cpp.llama_sampler_init_top_p(chain.top_p, chain_distribution.MIN_KEEP),
        llama_cpp.llama_sampler_init_min_p(chain.min_p, chain_distribution.MIN_KEEP),
        llama_cpp.llama_sampler_init_temp(chain.temperature),
        llama_cpp.llama_sampler_init_dist(seed),
    ):
        llama_cpp.llama_sampler_chain_add(smpl, stage)
    data = np.zeros(0, TOKEN_DATA)

    def sample(row: np.ndarray) -> int:
        nonlocal data
        if data.size != row.size:
            data = np.zeros(row.size, TOKEN_DATA)
        data["id"], data["logit"], data["p"] = np.arange(row.size), row, 0.0
        cur = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p), size=row.size, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
        return int(cur.data[cur.selected].id)

    weakref.finalize(sample, llama_cpp.llama_sampler_free, smpl)  # the chain lives as long as the function
    return sample


def same_by_head(rows: list[np.ndarray], chain: TruncatingSampler) -> bool:
    """Whether the distribution by the head is the whole row's, bit for bit, on every row."""
    head, whole = ChainDistribution(chain), ChainDistribution(chain, by_head=False)
    pairs = ((head.support(row), whole.support(row)) for row in rows)
    return all(np.array_equal(x.ids, y.ids) and np.array_equal(x.weights, y.weights) for x, y in pairs)


def time_rows(rows: list[np.ndarray], chain: TruncatingSampler, rounds: int) -> dict[str, list[float]]:
    """Milliseconds a row, per round (arms alternated A B C / C B A): the rule's distribution by the
    head (``head``), by the whole row (``whole``), and llama.cpp's sampler (``llama.cpp sample``)."""
    head, whole = ChainDistribution(chain), ChainDistribution(chain, by_head=False)
    arms: dict[str, Callable[[np.ndarray], object]] = {
        "head": head.support, "whole": whole.support, "llama.cpp sample": llama_cpp_sample(chain),
    }  # fmt: skip
    out: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:
            arms[name](rows[0])  # warm
            t = time.perf_counter()
            for row in rows:
                arms[name](row)
            out[name].append(1e3 * (time.perf_counter() - t) / len(rows))
    head.close()
    whole.close()
    return out


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(ms) for name, ms in times.items()}


__all__ = ["llama_cpp_sample", "medians", "realistic_row", "same_by_head", "time_rows"]
