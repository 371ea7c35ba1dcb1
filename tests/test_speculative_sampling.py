"""Speculative sampling's rule on its own (issue 38): the sampler chain it mirrors, and the
output distribution, measured against the target alone's on synthetic Markov models."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from goodness_of_fit import chi2_threshold, g_test

from gguf_exact.engines.shared.sampling_defaults import SERVER_SAMPLING
from gguf_exact.engines.shared.speculative_sampling import (
    Support,
    acceptance_rate,
    chain_probabilities,
    speculative_step,
    verify_row,
    why_not_mirrored,
)
from gguf_exact.engines.shared.speculative_sampling import draw as draw_token


@dataclass(frozen=True)
class Chain:
    """The four mirrored fields, off by default (temperature 1, untruncated)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0


LN2 = math.log(2)


def softmax(values: list[float]) -> list[float]:
    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


# ---------------------------------------------------------------- the chain, by hand


@pytest.mark.parametrize(
    "logits, chain, expected",
    [
        ([2.0, 1.0, 0.0, -1.0], Chain(), softmax([2.0, 1.0, 0.0, -1.0])),
        # top-k 2 keeps ids 1 and 2, then the temperature divides their logits
        ([1.0, 3.0, 2.0, 0.5], Chain(0.7, top_k=2), [0.0, *softmax([3 / 0.7, 2 / 0.7]), 0.0]),
        # top-p 0.9: 0.5, 0.8, 0.95: the token that crosses 0.9 stays
        (np.log([0.5, 0.3, 0.15, 0.05]), Chain(top_p=0.9), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
        # dyadic probabilities, exact in float32: 0.5, 0.25, 0.125, 0.0625, 0.0625; a cumulative sum
        # that equals top-p exactly stops there (cum >= p), one a hair above it goes one further
        ([0, -LN2, -2 * LN2, -3 * LN2, -3 * LN2], Chain(top_p=0.75), [2 / 3, 1 / 3, 0, 0, 0]),
        ([0, -LN2, -2 * LN2, -3 * LN2, -3 * LN2], Chain(top_p=0.7500001), [4 / 7, 2 / 7, 1 / 7, 0, 0]),
        ([0, -LN2, -2 * LN2, -3 * LN2, -3 * LN2], Chain(top_p=0.875), [4 / 7, 2 / 7, 1 / 7, 0, 0]),
        # min-p 0.05 against the top probability *before* the temperature: 0.06 of it stays,
        # 0.04 goes, though at temperature 2 the ratio would be sqrt(0.04) = 0.2
        (
            [0.0, math.log(0.06), math.log(0.04)],
            Chain(2.0, min_p=0.05),
            [1 / (1 + math.sqrt(0.06)), math.sqrt(0.06) / (1 + math.sqrt(0.06)), 0.0],
        ),
        # top-p also cuts on the temperature-1 probabilities, 0.6 and 0.4 (p 0.65 keeps both),
        # not on the tempered ones (0.69 alone would reach it)
        ([0.0, math.log(0.4 / 0.6)], Chain(0.5, top_p=0.65), [0.36 / 0.52, 0.16 / 0.52]),
        # top-k beyond the vocabulary, or negative, keeps all
        ([0.0, 1.0, 2.0], Chain(top_k=7), softmax([0.0, 1.0, 2.0])),
        ([0.0, 1.0, 2.0], Chain(top_k=-1), softmax([0.0, 1.0, 2.0])),
        # equal logits, both inside the cut; at the cut the lower id goes first
        ([1.0, 2.0, 2.0, 0.0], Chain(top_k=2), [0.0, 0.5, 0.5, 0.0]),
        ([2.0, 1.0, 1.0, 0.0], Chain(top_k=2), [*softmax([2.0, 1.0]), 0.0, 0.0]),
        # temperature 0 is greedy whatever the truncation; a tie goes to the lower id
        ([0.5, 3.0, 1.0], Chain(0.0, top_k=2, top_p=0.1, min_p=0.5), [0.0, 1.0, 0.0]),
        ([3.0, 0.5, 3.0], Chain(0.0), [1.0, 0.0, 0.0]),
        # a suppressed token (logit bias -inf) has probability 0
        ([0.0, -math.inf, 0.0], Chain(), [0.5, 0.0, 0.5]),
    ],
)
def test_chain_probabilities_by_hand(logits, chain, expected):
    got = chain_probabilities(np.asarray(logits, dtype=np.float32), chain)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-12)


def test_min_keep_keeps_a_longer_head():
    dyadic = [0, -LN2, -2 * LN2, -3 * LN2, -3 * LN2]
    np.testing.assert_allclose(chain_probabilities(dyadic, Chain(top_p=0.5)), [1, 0, 0, 0, 0])
    np.testing.assert_allclose(chain_probabilities(dyadic, Chain(top_p=0.5), min_keep=3), [4 / 7, 2 / 7, 1 / 7, 0, 0])
    # min-p 0.5 keeps the top one alone; min_keep 2 keeps the next too
    np.testing.assert_allclose(chain_probabilities([0, -3, -4, -5], Chain(min_p=0.5)), [1, 0, 0, 0])
    np.testing.assert_allclose(
        chain_probabilities([0, -3, -4, -5], Chain(min_p=0.5), min_keep=2), [*softmax([0, -3]), 0, 0], rtol=1e-6
    )
    # llama-server's min_keep 0 and llama-cpp-python's 1 cut alike
    rng = np.random.default_rng(5)
    server = Chain(float(SERVER_SAMPLING["temperature"]), int(SERVER_SAMPLING["top_k"]), SERVER_SAMPLING["top_p"], SERVER_SAMPLING["min_p"])
    for _ in range(50):
        logits = rng.normal(0, 3, 200).astype(np.float32)
        a, b = chain_probabilities(logits, server, min_keep=0), chain_probabilities(logits, server, min_keep=1)
        assert np.array_equal(a, b)


def test_server_defaults_on_a_known_row():
    # 0.8 / top-k 40 / top-p 0.95 / min-p 0.05 on logits 0, -1, -2, ... -59: top-k keeps 40;
    # temperature-1 probabilities (e-1) e^-i: cum >= 0.95 first at i = 2 (0.9502); min-p
    # keeps i <= 2 too (e^-2 = 0.135 >= 0.05); then e^(-i/0.8) over i = 0, 1, 2
    server = Chain(0.8, 40, 0.95, 0.05)
    got = chain_probabilities(-np.arange(60, dtype=np.float32), server)
    assert np.count_nonzero(got) == 3
    np.testing.assert_allclose(got[:3], softmax([0, -1 / 0.8, -2 / 0.8]), rtol=2e-6)


def test_bad_logits_say_so():
    for bad in ([], [[0.0, 1.0]], [0.0, math.nan], [-math.inf, -math.inf]):
        with pytest.raises(ValueError, match="logits: one row"):
            chain_probabilities(np.asarray(bad, dtype=np.float32), Chain())


def test_why_not_mirrored():
    @dataclass(frozen=True)
    class Request(Chain):
        repeat_penalty: float = 1.0
        grammar: str | None = None
        logit_bias: dict | None = None

    assert why_not_mirrored(Chain()) is None
    assert why_not_mirrored(Request(0.8, 40, 0.95, 0.05, logit_bias={})) is None
    assert "negative temperature" in why_not_mirrored(Chain(-1.0))
    assert why_not_mirrored(Request(repeat_penalty=1.1)).startswith("repeat_penalty 1.1 changes")
    assert why_not_mirrored(Request(grammar="root ::= [a-z]+")).startswith("grammar 'root ::= [a-z]+' changes")
    assert why_not_mirrored(Request(logit_bias={5: -math.inf})).startswith("logit_bias {5: -inf} changes")
    assert why_not_mirrored(Chain(top_p=math.nan)) == "top_p nan is not a finite number"
    assert why_not_mirrored(Chain(top_k=2.5)) == "top_k 2.5 is not an integer"


def test_speculative_step_refuses_bad_input():
    rng = np.random.default_rng(0)
    p, q = np.full((2, 3), 1 / 3), np.array([[0.5, 0.5, 0.0]])
    with pytest.raises(ValueError, match="probability 0 under its q row"):
        speculative_step(p, q, np.array([2]), rng)
    with pytest.raises(ValueError, match=r"p_rows \(..., k \+ 1, V\) expected"):
        speculative_step(p[:1], q, np.array([0]), rng)
    with pytest.raises(ValueError, match="below the vocabulary size 3"):
        speculative_step(p, q, np.array([3]), rng)


def test_speculative_step_by_hand():
    # q(1) = 0.6 > p(1) = 0.3: kept half the time; the residual max(0, p - q) is token 0 alone.
    # All kept: the bonus comes from the second row, one-hot on token 2.
    p, q = np.array([[0.5, 0.3, 0.2], [0.0, 0.0, 1.0]]), np.array([[0.2, 0.6, 0.2]])
    n, token = speculative_step(np.broadcast_to(p, (20000, 2, 3)), np.broadcast_to(q, (20000, 1, 3)), np.ones((20000, 1), int), np.random.default_rng(1))
    assert abs(n.mean() - 0.5) < 4 * math.sqrt(0.25 / 20000)
    assert set(token[n == 0]) == {0} and set(token[n == 1]) == {2}
    assert acceptance_rate(p[0], q[0]) == pytest.approx(0.7)


# ---------------------------------------------------------------- distribution exactness

V, N, TOKENS, START = 12, 20_000, 3, 0
def draw(rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling of each row (token order) at its uniform, as llama.cpp's dist."""
    cum = np.cumsum(rows, axis=-1)
    pick = np.count_nonzero(cum <= (u * cum[..., -1])[..., None], axis=-1)
    return np.minimum(pick, rows.shape[-1] - 1 - np.argmax(rows[..., ::-1] > 0, axis=-1))


Step = Callable[[np.ndarray, np.ndarray, np.ndarray, np.random.Generator], tuple[np.ndarray, np.ndarray]]


def first_false(kept: np.ndarray) -> np.ndarray:
    return np.argmin(np.concatenate([kept, np.zeros((len(kept), 1), bool)], axis=1), axis=1)


def mutant(accept: Callable, rejection: Callable) -> Step:
    """A rule that keeps draft i with probability accept(p_i(x), q_i(x)) and draws a rejected
    row's token from rejection(p_i, q_i) (the bonus from p_k)."""

    def step(p, q, x, rng):
        k = x.shape[1]
        u = rng.random((len(x), k + 1))
        px = np.take_along_axis(p[:, :k], x[..., None], -1)[..., 0]
        qx = np.take_along_axis(q, x[..., None], -1)[..., 0]
        n = first_false(u[:, :k] < accept(px, qx))
        rows = np.arange(len(x))
        q_pad = np.concatenate([q, np.zeros((len(x), 1, p.shape[-1]))], axis=1)
        dist = np.where((n < k)[:, None], rejection(p[rows, n], q_pad[rows, n]), p[rows, n])
        return n, draw(dist, rng.random(len(x)))

    return step


RESAMPLE_FROM_P = mutant(lambda px, qx: np.minimum(1, px / qx), lambda p, q: p)
ACCEPT_WITH_P = mutant(lambda px, qx: px, lambda p, q: np.maximum(p - q, 0))


def exact_match(p, q, x, rng):
    """Today's rule: the target samples each row; a draft stays while it is that token."""
    k = x.shape[1]
    y = draw(p, rng.random((len(x), k + 1)))
    n = first_false(y[:, :k] == x)
    return n, y[np.arange(len(x)), n]


def generate(step: Step, P: np.ndarray, Q: np.ndarray, k: int, seed: int, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """n sequences of TOKENS tokens from START, drafting k tokens from Q per pass and verifying
    with ``step`` against P (Markov rows: row t is the next token's distribution after t).
    Also the first pass's count of kept drafts."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, TOKENS + k + 1), int)
    length = np.zeros(n, int)
    last = np.full(n, START)
    first_kept = None
    while (live := np.nonzero(length < TOKENS)[0]).size:
        drafts, prev = [], last[live]
        for _ in range(k):
            drafts.append(draw(Q[prev], rng.random(live.size)))
            prev = drafts[-1]
        x = np.stack(drafts, axis=1)
        context = np.concatenate([last[live, None], x], axis=1)
        kept, token = step(P[context], Q[context[:, :k]], x, rng)
        if first_kept is None:
            first_kept = kept
        emitted = np.where(np.arange(k + 1) < kept[:, None], np.concatenate([x, x[:, :1]], axis=1), token[:, None])
        for j in range(k + 1):
            write = j <= kept
            out[live[write], length[live[write]] + j] = emitted[write, j]
        length[live] += kept + 1
        last[live] = token
    return out[:, :TOKENS], first_kept


def joint_counts(tokens: np.ndarray) -> np.ndarray:
    return np.bincount(np.ravel_multi_index(tokens.T, (V,) * TOKENS), minlength=V**TOKENS).reshape((V,) * TOKENS)


def target_joint(P: np.ndarray) -> np.ndarray:
    return P[START][:, None, None] * P[:, :, None] * P[None, :, :]


_models = np.random.default_rng(2024)
TARGET = _models.normal(0, 1.5, (V, V)).astype(np.float32)
DRAFTERS = {
    "near": TARGET + _models.normal(0, 0.4, (V, V)).astype(np.float32),
    "far": _models.normal(0, 1.5, (V, V)).astype(np.float32),
}
CHAINS = {"t1": Chain(), "t0.7-k5": Chain(0.7, top_k=5), "p0.9": Chain(top_p=0.9)}
CASES = [(c, d, k) for c in CHAINS for d in DRAFTERS for k in (1, 3)]


def tables(chain: str, drafter: str) -> tuple[np.ndarray, np.ndarray]:
    P = np.stack([chain_probabilities(row, CHAINS[chain]) for row in TARGET])
    Q = np.stack([chain_probabilities(row, CHAINS[chain]) for row in DRAFTERS[drafter]])
    return P, Q


def g_of(step: Step, chain: str, drafter: str, k: int) -> tuple[float, int]:
    P, Q = tables(chain, drafter)
    tokens, _ = generate(step, P, Q, k, seed=1000 + CASES.index((chain, drafter, k)))
    return g_test(joint_counts(tokens), target_joint(P))


@pytest.mark.parametrize("chain, drafter, k", CASES)
def test_rule_gives_the_target_distribution(chain, drafter, k):
    """The first three tokens' joint distribution (1,728 cells) under speculation, 20,000
    seeded sequences, against the target alone's exact one: G below the 1 - 1e-4 quantile."""
    g, df = g_of(speculative_step, chain, drafter, k)
    assert df >= 30 and g < chi2_threshold(df), (g, df, chi2_threshold(df))


@pytest.mark.parametrize("chain, drafter, k", CASES)
@pytest.mark.parametrize("rule", [RESAMPLE_FROM_P, ACCEPT_WITH_P], ids=["resample-from-p", "accept-with-p"])
def test_a_mutated_rule_fails(rule, chain, drafter, k):
    """The same test, same seeds, catches either mistake, near drafter included (G 1,048 to
    54,428 against thresholds 168 to 589 when written)."""
    g, df = g_of(rule, chain, drafter, k)
    assert g > chi2_threshold(df), (g, df, chi2_threshold(df))


def test_the_drafters_differ_as_intended():
    # near: most of the mass shared; far: a fifth to a third, some rows none (disjoint heads),
    # so the residual carries most of the weight
    for chain in CHAINS:
        for drafter, (low, high) in {"near": (0.75, 0.9), "far": (0.15, 0.4)}.items():
            P, Q = tables(chain, drafter)
            assert low < acceptance_rate(P, Q).mean() < high, (chain, drafter)


@pytest.mark.parametrize("chain, drafter", [(c, d) for c in CHAINS for d in DRAFTERS])
def test_acceptance_per_depth_is_sum_min(chain, drafter):
    """First pass at n-max 3: depth 1 is kept with sum min(p, q) at START; depth 2, given
    depth 1 kept, with the kept draft's own sum min, weighted by min(p, q) at START."""
    P, Q = tables(chain, drafter)
    _, kept = generate(speculative_step, P, Q, 3, seed=7)
    alpha = acceptance_rate(P, Q)
    overlap = np.minimum(P[START], Q[START])
    for measured, expected, count in (
        ((kept >= 1).mean(), alpha[START], len(kept)),
        ((kept[kept >= 1] >= 2).mean(), overlap @ alpha / alpha[START], np.count_nonzero(kept >= 1)),
    ):
        assert abs(measured - expected) < 4 * math.sqrt(expected * (1 - expected) / count), (measured, expected)


@pytest.mark.parametrize("target_chain", [Chain(0.7, top_k=5), Chain(top_p=0.9), Chain(0.0)])
def test_one_hot_q_is_exact_match(target_chain):
    """A greedy drafter (q one-hot): the same tokens and kept counts as exact match, seed for seed;
    at temperature 0 both are the target's own greedy text."""
    P = np.stack([chain_probabilities(row, target_chain) for row in TARGET])
    Q = np.stack([chain_probabilities(row, Chain(0.0)) for row in DRAFTERS["near"]])
    for k in (1, 3):
        rule, rule_kept = generate(speculative_step, P, Q, k, seed=11)
        match, match_kept = generate(exact_match, P, Q, k, seed=11)
        assert np.array_equal(rule, match) and np.array_equal(rule_kept, match_kept)
        if target_chain.temperature > 0:  # drafts both kept and refused (greedy: one path)
            assert 0 < rule_kept.mean() < k
    if target_chain.temperature == 0:
        greedy = [START]
        for _ in range(TOKENS):
            greedy.append(int(np.argmax(TARGET[greedy[-1]])))
        assert (rule == greedy[1:]).all()


def dense_verify_row(p: np.ndarray, q: np.ndarray, token: int, rng: np.random.Generator) -> int:
    """The rule on dense rows over the vocabulary, as the Python engine ran it before :class:`Support`."""
    if rng.random() < min(1.0, p[token] / q[token]):
        return token
    return draw_token(np.maximum(p - q, 0.0), rng)


def truncated_row(rng: np.random.Generator, vocab: int, keep: int) -> np.ndarray:
    """A chain's row: ``keep`` survivors of random logits (softmax at temperature 1), 0 elsewhere."""
    ids = rng.choice(vocab, keep, replace=False)
    row = np.zeros(vocab)
    w = np.exp(rng.normal(0.0, 2.0, keep))
    row[ids] = w / w.sum()
    return row


def as_support(row: np.ndarray) -> Support:
    ids = np.flatnonzero(row)
    shuffled = np.random.default_rng(0).permutation(ids.size)  # survivors come in the sampler's order
    return Support.of(ids[shuffled], row[ids][shuffled])


def test_support_verifies_as_the_dense_rows_do_seed_for_seed():
    # p and q as survivors only: every row's token, kept or drawn from the residual, is the dense
    # rule's for the same seed (the same float64 values, cumulated in token order)
    rng = np.random.default_rng(38)
    vocab, rejected, chances = 3000, 0, []
    for case in range(400):
        p = truncated_row(rng, vocab, 64)
        # a drafter near its target: p's candidates reweighted, 8 of them swapped for others
        q = p * np.exp(rng.normal(0.0, 1.0, vocab))
        q[rng.choice(np.flatnonzero(q), 8, replace=False)] = 0.0
        q[rng.choice(vocab, 8, replace=False)] += 0.01
        q = q / q.sum()
        token = draw_token(q, rng)
        dense = dense_verify_row(p, q, token, np.random.default_rng(case))
        kept, chance = verify_row(as_support(p), as_support(q), token, np.random.default_rng(case))
        assert kept == dense, case
        # the chance it reports is the dense rows' sum min(p, q), to the last bits of a float64 sum
        assert chance == pytest.approx(float(acceptance_rate(p, q)), rel=1e-12, abs=0.0), case
        rejected += dense != token
        chances.append(chance)
    assert 100 <= rejected <= 300, rejected  # the residual drawn from in many rows, not a few
    # the chances mean what the rows came to: 400 - rejected keeps within 4 standard deviations of
    # their sum (the exact-match chance p(x) alone, or a sum of max(p, q), is far outside)
    c = np.array(chances)
    assert abs((400 - rejected) - c.sum()) < 4 * math.sqrt((c * (1 - c)).sum()), (rejected, c.sum())


def test_support_holds_the_nonzero_entries_in_token_order():
    s = Support.of(np.array([9, 2, 5, 7]), np.array([0.5, 0.25, 0.0, 0.25]))
    assert s.ids.tolist() == [2, 7, 9] and s.weights.tolist() == [0.25, 0.25, 0.5]  # the zero one dropped
    assert s.at(np.array([0, 2, 5, 9, 10])).tolist() == [0.0, 0.25, 0.0, 0.5, 0.0]
    assert s.dense(11).tolist() == [0, 0, 0.25, 0, 0, 0, 0, 0.25, 0, 0.5, 0]
    r = s.residual(Support.of(np.array([2, 3]), np.array([0.5, 0.5])))
    assert r.ids.tolist() == [7, 9] and r.weights.tolist() == [0.25, 0.5]  # max(0, s - q): 2 and 3 gone
