"""The Python engine's p and q (engines/python/chain_distribution.py): llama.cpp's own chain, not
a copy of it. Where no cut falls between equal logits it agrees with the numpy mirror
(speculative_sampling.chain_probabilities) to float rounding; where one does, it keeps the tied
tokens llama.cpp's sort keeps, and llama.cpp's own sampler (the same chain ending in ``dist``,
as llama-cpp-python samples a row) draws only those, in those proportions."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import llama_cpp
import numpy as np
import pytest
from goodness_of_fit import chi2_threshold, g_test

from gguf_exact.engines.python.chain_distribution import MIN_KEEP, TOKEN_DATA, ChainDistribution
from gguf_exact.engines.shared.speculative_sampling import chain_probabilities

pytestmark = [pytest.mark.bindings]


def sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0):
    return SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p)


GEMMA = sampler(top_k=64, top_p=0.95)
CHAINS = [sampler(), sampler(top_p=0.9), sampler(0.7, top_k=8), GEMMA, sampler(0.8, 40, 0.95, 0.05)]


@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: f"t{c.temperature}-k{c.top_k}-p{c.top_p}-m{c.min_p}")
@pytest.mark.parametrize("vocab", [320, 262_144])
def test_it_is_the_mirror_where_nothing_ties(chain, vocab):
    row = (np.random.default_rng(vocab).normal(size=vocab) * 3).astype(np.float32)
    ours = ChainDistribution(chain)
    p, mirrored = ours(row), chain_probabilities(row, chain, min_keep=MIN_KEEP)
    ours.close()
    assert np.array_equal(np.flatnonzero(p), np.flatnonzero(mirrored))
    np.testing.assert_allclose(p, mirrored, rtol=1e-6, atol=1e-12)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)


def llama_cpp_draws(row: np.ndarray, chain, n: int) -> np.ndarray:
    """Tokens llama.cpp's chain with its final ``dist`` draws from ``row``, laid out as
    ``llama_sampler_sample`` lays it out, seeds 0..n-1."""
    counts = np.zeros(row.size, np.int64)
    for seed in range(n):
        smpl = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        for stage in (
            llama_cpp.llama_sampler_init_top_k(chain.top_k),
            llama_cpp.llama_sampler_init_typical(chain.typical_p, 1),
            llama_cpp.llama_sampler_init_top_p(chain.top_p, 1),
            llama_cpp.llama_sampler_init_min_p(chain.min_p, 1),
            llama_cpp.llama_sampler_init_temp(chain.temperature),
            llama_cpp.llama_sampler_init_dist(seed),
        ):
            llama_cpp.llama_sampler_chain_add(smpl, stage)
        data = np.zeros(row.size, TOKEN_DATA)
        data["id"], data["logit"] = np.arange(row.size), row
        cur = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p), size=row.size, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
        counts[cur.data[cur.selected].id] += 1
        llama_cpp.llama_sampler_free(smpl)
    return counts


# (chain, whether llama.cpp keeps other tied tokens than the mirror's lowest ids): top-k's
# partial sort happens to keep the lowest here, top-p's sort does not
TIED_CUTS = {"top-p": (sampler(top_p=0.5), True), "top-k": (sampler(0.7, top_k=8), False)}


@pytest.mark.parametrize("name", TIED_CUTS)
def test_a_cut_between_ties_keeps_llama_cpp_s_tokens(name):
    chain, differs = TIED_CUTS[name]
    # five tokens well ahead, then 315 equal logits: the cut falls among the equal ones
    row = np.zeros(320, np.float32)
    row[:5] = 2.0
    p = ChainDistribution(chain)(row)
    mirrored = chain_probabilities(row, chain, min_keep=MIN_KEEP)
    assert np.count_nonzero(p) == np.count_nonzero(mirrored) > 5  # as many kept, some of the tied ones
    assert (not np.array_equal(np.flatnonzero(p), np.flatnonzero(mirrored))) == differs
    counts = llama_cpp_draws(row, chain, 4_000)
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(p))  # llama.cpp never draws outside them
    g, df = g_test(counts, p)
    assert df >= 5 and g < chi2_threshold(df), (g, df)
    # where the sets differ, the mirror's is another distribution: llama.cpp's draws land outside it
    assert (counts[mirrored == 0].sum() > 0) == differs


def test_refusals():
    with pytest.raises(ValueError, match="temperature 0.0"):
        ChainDistribution(sampler(0.0))
    with pytest.raises(ValueError, match="no NaN"):
        ChainDistribution(sampler())(np.array([0.0, np.nan], np.float32))
