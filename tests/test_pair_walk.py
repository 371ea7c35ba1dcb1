"""make-pair's drafters worked out (gguf_exact.tiny.pair_walk) and the weights that do it
(gguf_exact.tiny.full_pair.drafter_weights), without llama.cpp: the drafter's arithmetic
(projections, RMS norm, tied head, top-10 softmax) run on the E2B-size HF tensors in numpy
proposes what the walk says, with the confidence it says; the steady states are the figures
the docs state, from every start. Through llama-server and the Python engine:
tests/test_full_pair.py."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from gguf_exact.core import bf16
from gguf_exact.gemma4.sizes import SIZES
from gguf_exact.tiny.full_pair import cycle_ids, drafter_weights
from gguf_exact.tiny.pair_walk import (
    KINDS,
    N_AXES,
    REAL_DEEP_WRONG,
    REAL_FIRST_WRONG,
    predict_run,
    right,
    steady_state,
    top_probability,
)
from gguf_exact.tiny.vocab import gemma4_vocabulary

WIDTH = SIZES["E2B"].assistant.text.hidden_size


@pytest.fixture(scope="module")
def cycle():
    return cycle_ids(gemma4_vocabulary())


def test_the_cycle_has_its_tokens(cycle):
    assert len(cycle) == N_AXES == len(set(cycle))


class Drafter:
    """The gemma4-assistant graph on a one-hot ``h`` with pass-through layers: pre_projection
    of [token half (zero) | h], RMS norm times the final norm, then the tied head and
    post_projection. The ordered head scores the proposed token's cluster first, so the full
    head's argmax is what it proposes."""

    def __init__(self, kind: str, cycle: list[int]) -> None:
        _, t = drafter_weights("E2B", kind, cycle)
        self.backbone = SIZES["E2B"].assistant.backbone_hidden_size
        self.pre = bf16.to_f32(t["pre_projection.weight"])[:, self.backbone :]  # the hidden half
        assert not bf16.to_f32(t["pre_projection.weight"])[:, : self.backbone].any()  # reads h only
        self.post = bf16.to_f32(t["post_projection.weight"])
        self.norm = bf16.to_f32(t["model.norm.weight"])
        self.embed = bf16.to_f32(t["model.embed_tokens.weight"])

    def step(self, h: np.ndarray) -> tuple[int, float, np.ndarray]:
        x = self.pre @ h
        normed = x / np.sqrt(np.mean(x * x) + 1e-6) * self.norm
        logits = self.embed @ normed
        top = np.sort(logits)[-10:].astype(np.float64)
        p = 1.0 / np.exp(top - top.max()).sum()
        return int(np.argmax(logits)), float(p), self.post @ normed


@pytest.mark.parametrize("kind", KINDS)
def test_the_weights_propose_what_the_walk_says(kind, cycle):
    d = Drafter(kind, cycle)
    never = set()
    for s in range(N_AXES):
        h = np.zeros(d.backbone, np.float32)
        h[s] = 39.2  # the target's h: its axis s RMS-normed at width 1536
        for depth in range(1, 6):
            token, p, h = d.step(h)
            axis = (s + depth) % N_AXES
            if right(kind, axis, depth):
                assert token == cycle[axis], (s, depth)
            else:
                assert token not in cycle, (s, depth)
                never.add(token)
            assert p == pytest.approx(top_probability(kind, axis, depth, WIDTH), rel=1e-4)
    wrong = {"hidden": 0, "mixed": 8, "real": len(REAL_FIRST_WRONG) + len(REAL_DEEP_WRONG)}[kind]
    assert len(never) == wrong  # one token of its own for each wrong axis


def test_real_confidence_is_low_where_it_is_wrong():
    p = {(ok, depth): set() for ok in (True, False) for depth in (1, 2)}
    for a in range(N_AXES):
        for depth in (1, 2, 3):
            p[(right("real", a, depth), min(depth, 2))].add(round(top_probability("real", a, depth, WIDTH), 4))
    assert p == {(True, 1): {1.0}, (True, 2): {1.0}, (False, 1): {0.8585}, (False, 2): {0.4509}}


def test_steady_states_from_every_start():
    """The figures full_pair's docstring and docs/benchmarks.md state: (acceptance,
    per-depth acceptance, tokens per pass) at n-max 1..4, one orbit whatever the start."""
    expect = {
        "hidden": [(F(1), (F(1),) * n, F(n + 1)) for n in (1, 2, 3, 4)],
        "mixed": [
            (F(1, 2), (F(1, 2),), F(3, 2)),
            (F(1, 2), (F(1, 2), F(1)), F(2)),
            (F(1, 3), (F(1, 3), F(1), F(1)), F(2)),
            (F(7, 20), (F(2, 5), F(1), F(1), F(1, 2)), F(12, 5)),
        ],
        "real": [
            (F(11, 13), (F(11, 13),), F(24, 13)),
            (F(9, 14), (F(17, 21), F(10, 17)), F(16, 7)),
            (F(5, 9), (F(5, 6), F(3, 5), F(2, 3)), F(8, 3)),
            (F(1, 2), (F(7, 8), F(4, 7), F(3, 4), F(2, 3)), F(3)),
        ],
    }
    for kind, rows in expect.items():
        for n_max, row in enumerate(rows, 1):
            got = {steady_state(kind, n_max, start) for start in range(N_AXES)}
            assert {(s.acceptance, s.per_depth, s.tokens_per_pass) for s in got} == {row}, (kind, n_max)


def test_real_with_p_min_stops_before_wrong_drafts():
    # 0.5: the deeper wrong drafts (0.45) are not made, the first ones (0.86) are; 0.9: none wrong
    assert [steady_state("real", n, 0, 0.5).acceptance for n in (1, 2, 3, 4)] == [F(11, 13), F(9, 11), F(6, 7), F(16, 17)]
    assert {steady_state("real", n, s, 0.9).acceptance for n in (1, 2, 3, 4) for s in range(N_AXES)} == {F(1)}
    # the same tokens per pass: a draft not made would have been rejected
    for n in (1, 2, 3, 4):
        assert steady_state("real", n, 0, 0.9).tokens_per_pass == steady_state("real", n, 0).tokens_per_pass


def test_a_run_counts_from_its_first_token():
    # real from axis 0 at n-max 2, 8 tokens. From 0: draft 1 (axis 1) is wrong, +1; from 1:
    # axis 2 right, axis 3 wrong deeper, +2; from 3: axes 4 and 5 right, +3; from 6 one token
    # is left: no drafts (a pass drafts at most the tokens left less one)
    run = predict_run("real", 0, 8, 2)
    assert run.tokens == [0, 1, 2, 3, 4, 5, 6, 7]
    assert (run.passes, run.drafted, run.accepted) == (4, 6, 3)
    assert (run.tried, run.kept) == ([3, 2], [2, 1])
    assert run.acceptance() == [F(2, 3), F(1, 2)]
    # the request's budget bounds the drafts: 4 tokens at n-max 4 from axis 1: one pass of 2
    short = predict_run("hidden", 1, 4, 4)
    assert (short.passes, short.drafted, short.accepted, short.tokens) == (1, 2, 2, [1, 2, 3, 4])
