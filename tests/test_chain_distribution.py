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

from gguf_exact.bench.sampling import realistic_row
from gguf_exact.engines.python import chain_distribution
from gguf_exact.engines.python.chain_distribution import MIN_KEEP, TOKEN_DATA, ChainDistribution, sorted_head
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


def llama_cpp_top_k(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's own top-k on ``row`` laid out as ``llama_sampler_sample`` lays it out: the ids and
    logits it leaves, in its order."""
    smpl = llama_cpp.llama_sampler_init_top_k(k)
    data = np.zeros(row.size, TOKEN_DATA)
    data["id"], data["logit"] = np.arange(row.size), row
    cur = llama_cpp.llama_token_data_array(
        data=data.ctypes.data_as(llama_cpp.llama_token_data_p), size=row.size, selected=-1, sorted=False
    )
    llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
    llama_cpp.llama_sampler_free(smpl)
    return data["id"][: cur.size].copy(), data["logit"][: cur.size].copy()


HEAD_ROWS_OF = {
    "normal": lambda seed: (np.random.default_rng(seed).normal(size=262_144) * 3).astype(np.float32),
    "gemma-like": realistic_row,
    "ascending": lambda seed: np.linspace(-5, 5, 262_144, dtype=np.float32) + np.float32(seed),
    "descending": lambda seed: np.linspace(5, -5, 262_144, dtype=np.float32) + np.float32(seed),
    "best-in-one-column": lambda seed: np.where(  # the 64 best in one of sorted_head's columns
        np.arange(262_144) % 4096 == seed,
        np.arange(262_144, dtype=np.float32) / 1e3,
        np.random.default_rng(seed).normal(-10.0, 1.0, 262_144).astype(np.float32),
    ),
    "mostly-banned": lambda seed: np.where(
        np.arange(262_144) % 997 == seed, np.random.default_rng(seed).normal(size=262_144), -np.inf
    ).astype(np.float32),
}


@pytest.mark.parametrize("shape", HEAD_ROWS_OF)
@pytest.mark.parametrize("k", [1, 8, 40, 64, 128])
def test_sorted_head_is_llama_cpp_s_top_k(shape, k):
    row = HEAD_ROWS_OF[shape](3)
    head = sorted_head(row, k)
    assert head is not None
    ids, logits = llama_cpp_top_k(row, k)
    assert head[0].dtype == np.int32 and np.array_equal(head[0], ids) and np.array_equal(head[1], logits)


def tied(where: str) -> np.ndarray:
    """A normal row with equal logits spread over the vocabulary: its two highest (``inside``), its 64th
    and 65th highest (``boundary``) or its 70 highest (``all``)."""
    row = (np.random.default_rng(9).normal(size=262_144) * 3).astype(np.float32)
    spots = np.random.default_rng(10).choice(262_144, 70, replace=False)
    if where == "inside":
        row[spots[:2]] = 40.0
    elif where == "boundary":
        row[spots[:63]] = 40.0 + np.arange(63, dtype=np.float32)
        row[spots[63:65]] = 39.0
    else:
        row[spots] = 40.0
    return row


@pytest.mark.parametrize("where", ["inside", "boundary", "all"])
def test_sorted_head_leaves_a_tie_to_llama_cpp_s_sort(where):
    row = tied(where)
    assert sorted_head(row, 64) is None
    # and the chain decides as llama.cpp decides: top-p keeps a prefix of its own sort's order
    p = ChainDistribution(GEMMA).support(row)
    assert set(p.ids) == set(llama_cpp_top_k(row, 64)[0][: p.ids.size])
    assert p.ids.size == {"inside": 2, "boundary": 3, "all": 61}[where]


def test_sorted_head_passes_rows_it_does_not_pay_for():
    row = (np.random.default_rng(1).normal(size=262_144)).astype(np.float32)
    assert sorted_head(row, 0) is None  # top-k off: the chain's top-p sorts the whole row
    assert sorted_head(row, 129) is None  # above 128 llama.cpp sorts by buckets
    assert sorted_head(row[:262_143], 64) is None  # not whole columns
    assert sorted_head(row[:8192], 64) is None  # a small vocabulary: the whole row is cheap


@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: f"t{c.temperature}-k{c.top_k}-p{c.top_p}-m{c.min_p}")
@pytest.mark.parametrize("shape", ["normal", "gemma-like", "inside", "boundary"])
def test_support_by_the_head_is_the_whole_row_s(chain, shape):
    row = HEAD_ROWS_OF[shape](5) if shape in HEAD_ROWS_OF else tied(shape)
    fast = ChainDistribution(chain).support(row)
    whole = ChainDistribution(chain, by_head=False).support(row)
    assert np.array_equal(fast.ids, whole.ids) and np.array_equal(fast.weights, whole.weights)


def test_sorted_head_passes_a_flat_row_at_once():
    # a made-up pair's row: one token ahead, the rest at one logit (or -inf outside a head's candidates)
    flat = np.zeros(262_144, np.float32)
    flat[123] = 13.4
    banned = np.full(262_144, -np.inf, np.float32)
    banned[:4096] = 0.0
    banned[77] = 15.0
    for row, best in ((flat, 123), (banned, 77)):
        assert sorted_head(row, 64) is None
        assert list(ChainDistribution(GEMMA).support(row).ids) == [best]  # top-p 0.95 keeps the one ahead


def test_a_chain_seeing_flat_rows_tries_the_head_every_16th_row(monkeypatch):
    tried: list[int] = []
    real = chain_distribution.sorted_head
    monkeypatch.setattr(chain_distribution, "sorted_head", lambda values, k: tried.append(i) or real(values, k))
    flat = np.zeros(262_144, np.float32)
    flat[123] = 13.4
    chain = ChainDistribution(GEMMA)
    for i in range(36):  # 32 flat rows, then a real model's
        row = flat if i < 32 else realistic_row(i)
        assert (list(chain.support(row).ids) == [123]) == (i < 32)
    # two flat rows tried, then every 16th; the first real row after a 16th is tried and has a head
    assert tried == [0, 1, 16, 32, 33, 34, 35]


def test_a_nan_anywhere_is_refused_with_or_without_a_head():
    row = realistic_row(4)
    assert sorted_head(row, 64) is not None
    for spot in (0, 131_071, 262_143):
        broken = row.copy()
        broken[spot] = np.nan
        assert sorted_head(broken, 64) is None
        with pytest.raises(ValueError, match=f"a NaN at {spot}"):
            ChainDistribution(GEMMA).support(broken)


def test_bench_sampling_runs_and_checks_its_rows():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_sampling.py"
    out = subprocess.run([sys.executable, str(script), "--rows", "3", "--rounds", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("3 of 3 rows have a sorted head; same distribution as the whole row: True") == 2
    assert out.stdout.count("head / whole ") == 2


def test_llama_cpp_s_own_draws_fit_the_distribution_by_the_head():
    # a row with a head whose top-p 0.9 cut falls inside it (57 of 64): llama.cpp's sampler (the chain with
    # dist, on the whole row) draws what the head's distribution says, by a G-test at a fixed threshold
    row = np.random.default_rng(7).normal(size=262_144).astype(np.float32)
    chain = sampler(0.7, top_k=64, top_p=0.9)
    assert sorted_head(row, 64) is not None
    p = ChainDistribution(chain)(row)
    assert np.count_nonzero(p) == 57
    counts = llama_cpp_draws(row, chain, 4_000)
    g, df = g_test(counts, p)
    assert df >= 4 and g < chi2_threshold(df), (g, df)
