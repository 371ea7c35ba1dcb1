"""make-pair's drafters worked out (gguf_exact.tiny.pair_walk) and the weights that do it
(gguf_exact.tiny.full_pair.drafter_weights), without llama.cpp: the drafter's arithmetic
(projections, RMS norm, ordered head, top-10 softmax; tests/_pair_drafter.py) run on the
E2B-size HF tensors in numpy proposes what the walk says, with the confidence it says; the steady states are the figures
the docs state, from every start. Through llama-server and the Python engine:
tests/test_full_pair.py."""

from __future__ import annotations

from fractions import Fraction as F

import pytest
from _pair_drafter import Drafter

from gguf_exact.tiny.full_pair import cycle_ids
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


@pytest.fixture(scope="module")
def cycle():
    return cycle_ids(gemma4_vocabulary())


def test_the_cycle_has_its_tokens(cycle):
    assert len(cycle) == N_AXES == len(set(cycle))


@pytest.mark.parametrize("kind", KINDS)
def test_the_weights_propose_what_the_walk_says(kind, cycle):
    """Along every chain while its drafts are right (what acceptance depends on): the token the
    walk's rule says, a token of its own where wrong, and a top probability on the same side
    of p-min 0.5, 0.7 and 0.9 as the rule's. After a wrong draft the chain reads an h the wrong
    axis's small weight scaled and the ordered head may find nothing (top probability 0.1):
    those drafts are rejected either way, and test_full_pair.py takes their probabilities
    from this simulation."""
    d = Drafter(kind, cycle)
    never: dict[int, int] = {}
    for s in range(N_AXES):
        for depth, (token, p) in enumerate(d.chain(s, 5), 1):
            axis = (s + depth) % N_AXES
            model = top_probability(kind, axis, depth)
            assert [p < t for t in (0.5, 0.7, 0.9)] == [model < t for t in (0.5, 0.7, 0.9)], (s, depth)
            if not right(kind, axis, depth):
                assert token not in cycle, (s, depth)
                assert never.setdefault(token, axis) == axis  # one token of its own per wrong axis
                break
            assert token == cycle[axis], (s, depth)
    assert len(never) == {"hidden": 0, "mixed": 8, "real": len(REAL_FIRST_WRONG) + len(REAL_DEEP_WRONG)}[kind]


def test_real_confidence_is_low_where_it_is_wrong():
    p = {(ok, depth): set() for ok in (True, False) for depth in (1, 2)}
    for a in range(N_AXES):
        for depth in (1, 2, 3):
            p[(right("real", a, depth), min(depth, 2))].add(round(top_probability("real", a, depth), 3))
    assert p == {(True, 1): {1.0}, (True, 2): {1.0}, (False, 1): {0.838}, (False, 2): {0.431}}


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


def test_real_with_p_min_stops_before_wrong_drafts(cycle):
    """With the drafter's own probabilities (the simulation's): 0.5 stops before the unsure
    deeper wrong drafts (0.43) and after most wrong ones, 0.9 before every wrong one (0.84)."""
    conf = Drafter("real", cycle).confidence()
    got = [{steady_state("real", n, s, 0.5, conf).acceptance for s in range(N_AXES)} for n in (1, 2, 3, 4)]
    assert got == [{F(11, 13)}, {F(27, 32)}, {F(10, 11)}, {F(16, 17)}]
    assert {steady_state("real", n, s, 0.9, conf).acceptance for n in (1, 2, 3, 4) for s in range(N_AXES)} == {F(1)}
    # the same tokens per pass: a draft not made would have been rejected
    for n in (1, 2, 3, 4):
        for p_min in (0.5, 0.9):
            assert steady_state("real", n, 0, p_min, conf).tokens_per_pass == steady_state("real", n, 0).tokens_per_pass


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
