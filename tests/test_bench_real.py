"""bench-real's arms (gguf_exact/bench/real.py) on the tiny hidden-state pair, whose drafts are
all accepted: both engines loaded side by side answer the same requests with the same text,
round after round, and concurrent clients' tokens are each request's own."""

from __future__ import annotations

import pytest
from _llama_server import TEST_SETTINGS

from gguf_exact.bench.real import concurrent_arm, engines_arm
from gguf_exact.tiny.hidden_pair import CYCLE, write_hidden_state_pair

PROMPTS = ("the a of", "to in is")
WORDS = [w.lstrip("▁") for w in CYCLE]


@pytest.fixture(scope="module")
def pair(run_dir, tmp_path_factory):
    return write_hidden_state_pair(tmp_path_factory.mktemp("hidden"))


def walks_the_cycle(text: str) -> bool:
    """Every word is the cycle's word after the one before it (the target's own walk)."""
    words = text.split()
    start = WORDS.index(words[0])
    return words == [WORDS[(start + i) % len(WORDS)] for i in range(len(words))]


@pytest.mark.bindings
@pytest.mark.llama_server
def test_both_engines_side_by_side_give_the_same_text_and_counts_every_round(pair):
    arms = engines_arm(pair[0], pair[1], ("llama-server", "python"), 2, PROMPTS, 9, TEST_SETTINGS, rounds=2)
    assert [a.engine for a in arms] == ["llama-server", "python"]
    server, python = arms
    for a in arms:
        assert a.n_max == 2 and a.rounds == 2 and a.same_every_round
        assert a.tokens == 18  # 9 per prompt, none stops early on this pair
        # per prompt: the prefill's token, then passes carrying 2, 2 and 1 drafts (the last
        # only as many as the 9 tokens leave room for), every draft accepted: 4 passes, 5 drafts
        assert (a.target_passes, a.drafts_generated, a.drafts_accepted) == (2 * 4, 2 * 5, 2 * 5)
        assert a.acceptance_rate == 1.0
        assert 0 < a.generation_seconds < a.wall_seconds and a.load_seconds > 0 and a.peak_rss_mib > 0
        assert a.ttft_prompt_tokens > 10 and a.ttft_seconds > 0
    assert server.texts == python.texts
    assert walks_the_cycle(server.texts[0]) and walks_the_cycle(server.texts[1])


@pytest.mark.bindings
@pytest.mark.llama_server
def test_the_target_alone_side_by_side(pair):
    arms = engines_arm(pair[0], None, ("python", "llama-server"), 0, PROMPTS[:1], 5, TEST_SETTINGS, rounds=1)
    assert [(a.engine, a.tokens, a.target_passes, a.drafts_generated) for a in arms] == [
        ("python", 5, 5, 0),
        ("llama-server", 5, 5, 0),
    ]
    assert arms[0].texts == arms[1].texts and walks_the_cycle(arms[0].texts[0])


@pytest.mark.bindings
@pytest.mark.llama_server
def test_an_adaptive_arm_serves_the_policy_in_both_engines_with_the_same_text(pair):
    """bench-real's adaptive arm: spec-draft-adaptive on, n-max its bound; whatever length the
    policy picks on this pair (a tiny drafter step costs what a target pass does: often none),
    the text is the target alone's in both engines and nothing drafted is wasted here."""
    alone = engines_arm(pair[0], None, ("llama-server", "python"), 0, PROMPTS, 9, TEST_SETTINGS, rounds=1)
    arms = engines_arm(
        pair[0], pair[1], ("llama-server", "python"), 4, PROMPTS, 9, TEST_SETTINGS, rounds=1, adaptive=True
    )
    for a, base in zip(arms, alone):
        assert (a.engine, a.n_max, a.adaptive, base.adaptive) == (base.engine, 4, True, False)
        assert a.texts == base.texts and a.tokens == 18
        assert a.drafts_accepted == a.drafts_generated  # every draft right on this pair, however many
        assert a.as_dict()["adaptive"] is True
        # what each engine's policy measured, from its /metrics: the 1-row pass at least, timed
        pol = a.policy
        assert pol is not None and pol["draft_n"] in range(5) and len(pol["acceptance"]) == 4
        assert dict(pol["pass_seconds"])[1] > 0
    # the Python engine's own time outside llama_decode, per arm; llama-server does not report one
    py = {a.engine: a.python_seconds for a in arms}
    assert py["llama-server"] is None and 0 <= py["python"] < next(a.wall_seconds for a in arms if a.engine == "python")
    assert all(b.policy is None for b in alone)  # the target alone: no length chosen


@pytest.mark.bindings
@pytest.mark.llama_server
@pytest.mark.parametrize("engine, parallel", [("python", 1), ("llama-server", 2)])
def test_concurrent_clients_each_count_their_own_tokens(pair, engine, parallel):
    r = concurrent_arm(pair[0], pair[1], engine, 2, parallel, PROMPTS, 6, TEST_SETTINGS)
    assert (r.engine, r.parallel, r.clients) == (engine, parallel, 2)
    counts = [len(x["tokens"]) if "tokens" in x else x["n_tokens"] for x in r.per_request]
    assert counts == [6, 6] and r.tokens == 12  # not the other request's tokens as well
    assert walks_the_cycle(r.per_request[0]["text"]) and walks_the_cycle(r.per_request[1]["text"])
    assert all(0 < x["seconds"] <= r.wall_seconds for x in r.per_request)
    if engine == "llama-server":
        # 6 tokens: the prefill's, a pass with 2 drafts, one with the 1 that room is left for
        assert [(x["draft_n"], x["draft_n_accepted"]) for x in r.per_request] == [(3, 3), (3, 3)]


def test_the_cost_model_on_a_card_is_the_cpu_model_with_the_cards_pass():
    """card_prediction: verification as one card pass, the drafter scaled by card pass / CPU pass."""
    from gguf_exact.bench.real import card_prediction, predicted_speedup

    # E2B hidden at n-max 3 (3.56 tokens a pass), a 12.24 ms card pass, CPU 158 ms, drafter 4.9 ms
    assert card_prediction(3.56, 0.01224, 0.158, 0.0049, 3) == pytest.approx(3.56 / (1 + 3 * 0.0049 / 0.158))
    assert card_prediction(3.56, 0.01224, 0.158, 0.0049, 3) == predicted_speedup(
        3.56, 0.01224, 0.01224, 0.0049 * 0.01224 / 0.158, 3
    )
    # a cheaper drafter step predicts more on the card; none at all: tokens per pass
    assert card_prediction(3.56, 0.01224, 0.158, 0.0015, 3) > card_prediction(3.56, 0.01224, 0.158, 0.0049, 3)
    assert card_prediction(3.56, 0.01224, 0.158, 0.0, 3) == pytest.approx(3.56)


ORDERED_HEAD = (
    "ordered_head.centroids", "ordered_head.top_k", "ordered_head.top_k (reshaped)",
    "ordered_head.candidates", "ordered_head.candidates (reshaped)", "ordered_head.candidates (reshaped) (reshaped)",
    "ordered_head.rows", "ordered_head.rows (view)", "ordered_head.rows (view) (reshaped)",
    "ordered_head.scores", "ordered_head.scores (reshaped)",
    "ordered_head.fill", "ordered_head.fill (reshaped)", "ordered_head.scatter", "result_output",
)  # fmt: skip


def test_vocab_ids_stay_inside_the_vocabulary():
    """drafter_profile's and target_pass_seconds' token ids: 300-331, 400, 500... on Gemma 4's
    vocabulary as before; moved down to the last ids of the tiny pairs' 320 (320 itself was fed)."""
    from gguf_exact.bench.real import vocab_ids

    assert vocab_ids(300, 32, 262_144) == list(range(300, 332)) and vocab_ids(400, 1, 262_144) == [400]
    assert vocab_ids(300, 32, 320) == list(range(288, 320)) and vocab_ids(400, 1, 320) == [319]
    assert vocab_ids(500, 3, 320) == [317, 318, 319]


@pytest.mark.bindings
def test_drafter_profile_times_the_ordered_head_as_the_head(pair, tmp_path):
    """With the head (patch #24) the step has the ordered_head.* nodes, timed as its head; the
    same drafter converted --full-head has only the 320-row head (result_output)."""
    from gguf_exact.bench.real import drafter_profile
    from gguf_exact.drafter.convert import convert_drafter

    target, drafter = pair
    full = convert_drafter(drafter.parent / "drafter-hf", tmp_path / "full.gguf", target, ordered_head=False).path
    ordered, plain = drafter_profile(target, drafter, 2, steps=3), drafter_profile(target, full, 2, steps=3)
    # the full head is one node (mul_mat, result_output); the ordered head the 15 nodes of patch #24's graph in
    # its order: centroids, top_k and its flat view, candidates and two views, rows (their bytes, as I32), their
    # view as Q4_0 and its 3-D view, scores and their view, fill (one row per output) and its row-per-token view,
    # scatter, and the logits' 2-D view. Beside them, untimed as the head (views, no work): the ordering viewed as
    # clusters, the tied head's bytes viewed as I32, and the hidden state's 3-D view
    assert plain.head_nodes == ("result_output",) and ordered.head_nodes == ORDERED_HEAD
    assert (plain.nodes, ordered.nodes) == (126, 126 - 1 + 15 + 3)
    # each node's median over the steps: the breakdown bench_head.py prints
    assert len(ordered.head_node_seconds) == 15 and all(t >= 0 for t in ordered.head_node_seconds)
    assert plain.head_node_seconds[0] > 0
    for p in (ordered, plain):
        assert 0 < p.head_seconds < p.profiled_step_seconds and p.step_seconds > 0
        assert p.as_dict()["head_share"] == p.head_seconds / p.profiled_step_seconds
