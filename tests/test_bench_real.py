"""bench-real's arms (gguf_exact/bench/real.py) on the tiny hidden-state pair, whose drafts are
all accepted: both engines loaded side by side answer the same requests with the same text,
round after round, and concurrent clients' tokens are each request's own."""

from __future__ import annotations

import statistics
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from _llama_server import TEST_SETTINGS
from policy_traces import read_trace, replay_python

from gguf_exact.bench.parity import engine_parity, parity_line, parity_modes
from gguf_exact.bench.real import (
    Arm,
    arms_side_by_side,
    check_room,
    concurrent_arm,
    engines_arm,
    proc_kib,
    trace_env,
)
from gguf_exact.engines.shared.engine_options import server_threads
from gguf_exact.errors import InputError
from gguf_exact.tiny.hidden_pair import CYCLE, write_hidden_state_pair

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench_real  # noqa: E402  (scripts/bench_real.py: its table and goals)

from gguf_exact.bench.real_table import rule_goals  # noqa: E402

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
def test_an_adaptive_arm_serves_the_policy_in_both_engines_with_the_same_text(pair, tmp_path, monkeypatch):
    """bench-real's adaptive arm: spec-draft-adaptive on, n-max its bound; whatever length the
    policy picks on this pair (a tiny drafter step costs what a target pass does: often none),
    the text is the target alone's in both engines and nothing drafted is wasted here. Traced, each
    server loaded beside the other writes a trace of its own, which replays its choices."""
    alone = engines_arm(pair[0], None, ("llama-server", "python"), 0, PROMPTS, 9, TEST_SETTINGS, rounds=1)
    monkeypatch.setenv("LLAMA_SPEC_DRAFT_TRACE", str(tmp_path / "policy"))
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
    # one path given, a file per server (before: one file, the two engines' lines interleaved)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["policy.0-llama-server.0", "policy.1-python.0"]
    for f in tmp_path.iterdir():
        [(settings, events, chosen)] = read_trace(f)
        assert settings.n_max == 4 and chosen and replay_python(settings, events) == chosen


@pytest.mark.bindings
@pytest.mark.llama_server
def test_three_arms_side_by_side_take_turns_at_going_first(pair):
    """bench_real.py --interleave kind: the target alone, a fixed length and an adaptive arm with
    an override of its own, loaded at once; each request to every arm before the next, the arm
    served first rotated by one from request to request."""
    arms = [
        Arm("python", 0),
        Arm("llama-server", 2),
        Arm("llama-server", 2, adaptive=True, sets=("spec-draft-p-min=0.25",)),
    ]
    order: list[tuple[int, int, int]] = []
    results = arms_side_by_side(
        pair[0], pair[1], arms, PROMPTS, 9, TEST_SETTINGS, rounds=2, on_request=lambda *x: order.append(x)
    )
    # (arm, round, prompt): requests 0..3 start at arms 0, 1, 2, 0
    assert order == [
        (0, 0, 0), (1, 0, 0), (2, 0, 0),
        (1, 0, 1), (2, 0, 1), (0, 0, 1),
        (2, 1, 0), (0, 1, 0), (1, 1, 0),
        (0, 1, 1), (1, 1, 1), (2, 1, 1),
    ]  # fmt: skip
    assert [(r.engine, r.n_max, r.adaptive, r.sets, r.rounds, r.tokens) for r in results] == [
        ("python", 0, False, [], 2, 18),
        ("llama-server", 2, False, [], 2, 18),
        ("llama-server", 2, True, ["spec-draft-p-min=0.25"], 2, 18),
    ]
    alone, fixed, adaptive = results
    assert (alone.target_passes, alone.drafts_generated) == (18, 0)  # a pass a token
    # as in the test of both engines at n-max 2: per prompt 4 passes, 5 drafts, all accepted
    assert (fixed.target_passes, fixed.drafts_generated, fixed.drafts_accepted) == (2 * 4, 2 * 5, 2 * 5)
    assert adaptive.drafts_accepted == adaptive.drafts_generated and adaptive.policy["draft_n"] in range(3)
    assert alone.policy is None and fixed.policy is None
    assert all(r.same_every_round for r in results)
    assert alone.texts == fixed.texts == adaptive.texts and walks_the_cycle(alone.texts[0])
    assert adaptive.as_dict()["sets"] == ["spec-draft-p-min=0.25"] and adaptive.as_dict()["label"] == ""
    # each request's generation rate, per round and prompt: 9 tokens each; the arm's generation time is, per
    # prompt, the median (of 2 rounds: the mean) of its requests' times
    for r in results:
        assert [len(x) for x in r.request_rates] == [2, 2] and all(x > 0 for xs in r.request_rates for x in xs)
        per_prompt = [statistics.median(9 / r.request_rates[k][i] for k in range(2)) for i in range(2)]
        assert sum(per_prompt) == pytest.approx(r.generation_seconds, rel=1e-9)


def test_a_trace_path_is_each_servers_own_only_where_one_is_set_and_the_server_named():
    assert trace_env("1-python", {"LLAMA_SPEC_DRAFT_TRACE": "/t/policy"}) == {"LLAMA_SPEC_DRAFT_TRACE": "/t/policy.1-python"}
    assert trace_env("1-python", {}) == {} and trace_env("1-python", {"LLAMA_SPEC_DRAFT_TRACE": ""}) == {}
    assert trace_env(None, {"LLAMA_SPEC_DRAFT_TRACE": "/t/policy"}) == {}  # serve's own: FILE.<slot>, as before


def test_anonymous_memory_is_read_from_smaps_rollup():
    rollup = (
        "561c82352000-7ffd6c667000 ---p 00000000 00:00 0                          [rollup]\n"
        "Rss:             4821004 kB\nPss_Anon:         1362000 kB\nAnonymous:        1363148 kB\n"
        "AnonHugePages:          0 kB\n"
    )
    assert proc_kib(rollup, "Anonymous") == 1363148  # not Pss_Anon nor AnonHugePages
    assert proc_kib(rollup, "Swap") == 0
    assert proc_kib("MemTotal:       24000000 kB\nMemAvailable:   23657760 kB\n", "MemAvailable") == 23657760


def test_the_memory_guard_counts_the_servers_left_and_each_model_page_once():
    gib = 1024**3
    # 9 servers left at 1.5 GiB, the model files 4 GiB, 1 GiB spare: 18.5 GiB
    check_room(10, 9, 3 * gib // 2, 4 * gib, 37 * gib // 2)
    with pytest.raises(InputError) as e:
        check_room(10, 9, 3 * gib // 2, 4 * gib, 18 * gib)
    assert str(e.value) == (
        "10 servers side by side: the 9 still to start need 18.5 GiB (1.5 GiB each, the model files 4.0 GiB and "
        "1 GiB spare) but 18.0 GiB is available; interleave fewer arms (bench_real.py --interleave none, or fewer "
        "--n-max values or engines)"
    )


def test_arms_side_by_side_stops_what_it_started_when_the_next_server_would_not_fit(tmp_path, monkeypatch):
    """The guard before the second server: 2 left at the first's 2 GiB, the target and drafter
    (1.5 GiB, sparse files here) and 1 GiB spare need 6.5 GiB, 6 are available; the first server
    is stopped, the second never started."""
    import gguf_exact.bench.real as real
    import gguf_exact.engines.shared.http as http

    gib = 1024**3
    target, drafter = tmp_path / "target.gguf", tmp_path / "drafter.gguf"
    for path, size in ((target, gib), (drafter, gib // 2)):
        with open(path, "wb") as f:
            f.truncate(size)
    started, stopped = [], []

    @contextmanager
    def fake_running(target, drafter, engine, sets, profile, trace_label=None):
        started.append((engine, drafter, list(sets)))
        try:
            yield SimpleNamespace(url="http://127.0.0.1:1"), SimpleNamespace(pid=1), 1.0
        finally:
            stopped.append(engine)

    monkeypatch.setattr(real, "running", fake_running)
    monkeypatch.setattr(http, "openai_generate", lambda *a, **k: None)  # the warm-up
    monkeypatch.setattr(real, "anonymous_bytes", lambda pid: 2 * gib)
    monkeypatch.setattr(real, "memory_available_bytes", lambda: 6 * gib)
    arms = [Arm("llama-server", 0), Arm("llama-server", 2, sets=("spec-draft-p-min=0.5",)), Arm("python", 2)]
    with pytest.raises(InputError, match="^3 servers side by side: the 2 still to start need 6.5 GiB .* 6.0 GiB is"):
        arms_side_by_side(target, drafter, arms, PROMPTS, 9, ["threads=2"])
    assert started == [("llama-server", None, ["threads=2"])] and stopped == ["llama-server"]
    # the arm's own sets come after the length's, over the run's
    assert Arm("llama-server", 2, sets=("spec-draft-p-min=0.5",)).overrides() == [
        "spec-draft-adaptive=false",
        "spec-draft-n-max=2",
        "spec-draft-p-min=0.5",
    ]


def bench_arm(kind: str, group: str | None, n_max: int, generation_tps: float, adaptive: bool = False, sets=()) -> dict:
    """An arm's dict as bench_real.py writes it: 2 prompts, 20 tokens, 5 target passes."""
    return {
        "kind": kind, "group": group, "engine": "llama-server", "n_max": n_max, "adaptive": adaptive,
        "sets": list(sets), "label": "", "texts": ["a", "b"], "tokens": 20, "target_passes": 5,
        "tokens_per_second": generation_tps / 2, "generation_tokens_per_second": generation_tps,
        "acceptance": 1.0 if n_max else None, "tokens_per_pass": 4.0, "ttft_seconds": 0.5,
        "load_seconds": 2.0, "peak_rss_mib": 1000.0, "python_seconds": None, "policy": None,
    }  # fmt: skip


def test_interleaved_groups_compare_each_arm_with_their_own_target_alone():
    """bench_real.py --interleave kind: every kind's arms with the target alone loaded beside them
    (10 and 8 tokens/s here), an adaptive arm with an override of its own labelled and compared."""
    arms = [
        bench_arm("none", "hidden", 0, 10.0),
        bench_arm("hidden", "hidden", 2, 20.0),
        bench_arm("hidden", "hidden", 2, 19.0, adaptive=True),
        bench_arm("hidden", "hidden", 2, 21.0, adaptive=True, sets=["spec-draft-p-min=0.5"]),
        bench_arm("none", "mixed", 0, 8.0),
        bench_arm("mixed", "mixed", 2, 8.8),
        bench_arm("mixed", "mixed", 2, 8.0, adaptive=True),
    ]
    alone = {bench_real.alone_key(a): a for a in arms if not a["n_max"]}
    assert bench_real.adaptive_goals(arms, alone) == [
        "- llama-server, hidden, adaptive up to n-max 2: 1.90x the target alone, 0.95x the best fixed length (n-max 2)",
        "- llama-server, hidden, adaptive up to n-max 2 (spec-draft-p-min=0.5): 2.10x the target alone, "
        "1.05x the best fixed length (n-max 2)",
        "- llama-server, mixed, adaptive up to n-max 2: 1.00x the target alone, 0.91x the best fixed length (n-max 2)",
    ]
    result = {
        "shape": "e2b",
        "arms": arms,
        "costs": {
            "target_pass_seconds": {"1": 0.1, "3": 0.125},
            "drafter": {"step_seconds": 0.0125, "head_share": 0.5},
        },
    }
    rows = [line for line in bench_real.table(result).splitlines() if line.startswith("| ")][1:]
    # predicted for n-max 2: (20 - 2) / (5 - 2) = 6 tokens a pass x 0.1 / (0.125 + 2 x 0.0125) = 4.00x
    # runs before the sampled arms name no sampler: greedy, exact match
    assert [row.split(" | ")[:8] for row in rows] == [
        ["| none (hidden)", "0", "llama-server", "greedy", "-", "5.00", "10.00", "1.00x"],
        ["| hidden", "2", "llama-server", "greedy", "exact", "10.00", "20.00", "2.00x"],
        ["| hidden", "<=2 adaptive", "llama-server", "greedy", "exact", "9.50", "19.00", "1.90x"],
        ["| hidden", "<=2 adaptive (spec-draft-p-min=0.5)", "llama-server", "greedy", "exact", "10.50", "21.00", "2.10x"],
        ["| none (mixed)", "0", "llama-server", "greedy", "-", "4.00", "8.00", "1.00x"],
        ["| mixed", "2", "llama-server", "greedy", "exact", "4.40", "8.80", "1.10x"],
        ["| mixed", "<=2 adaptive", "llama-server", "greedy", "exact", "4.00", "8.00", "1.00x"],
    ]  # fmt: skip
    assert [row.split(" | ")[8] for row in rows] == ["-", "4.00x", "-", "-", "-", "4.00x", "-"]
    # the same arm in the other engine, matched within its group and with the same overrides
    python = [
        a | {"engine": "python", "generation_tokens_per_second": a["generation_tokens_per_second"] / 2} for a in arms
    ]
    both = bench_real.table(result | {"arms": arms + python}).splitlines()
    assert next(line for line in both if line.startswith("Python engine / llama-server")) == (
        "Python engine / llama-server, generation tokens/s: none (hidden) n-max 0: 0.50x, hidden n-max 2: 0.50x, "
        "hidden n-max <=2 adaptive: 0.50x, hidden n-max <=2 adaptive (spec-draft-p-min=0.5): 0.50x, "
        "none (mixed) n-max 0: 0.50x, mixed n-max 2: 0.50x, mixed n-max <=2 adaptive: 0.50x"
    )
    assert [bench_real.same_arm(arms[2], b) for b in arms] == [False, False, True, False, False, False, False]


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
    from gguf_exact.bench.pass_costs import card_prediction, predicted_speedup

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
    from gguf_exact.bench.pass_costs import vocab_ids

    assert vocab_ids(300, 32, 262_144) == list(range(300, 332)) and vocab_ids(400, 1, 262_144) == [400]
    assert vocab_ids(300, 32, 320) == list(range(288, 320)) and vocab_ids(400, 1, 320) == [319]
    assert vocab_ids(500, 3, 320) == [317, 318, 319]


@pytest.mark.bindings
def test_drafter_profile_times_the_ordered_head_as_the_head(pair, tmp_path):
    """With the head (patch #24) the step has the ordered_head.* nodes, timed as its head; the
    same drafter converted --full-head has only the 320-row head (result_output)."""
    from gguf_exact.bench.pass_costs import drafter_profile
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


@pytest.mark.bindings
@pytest.mark.llama_server
def test_parity_runs_both_engines_one_at_a_time_then_side_by_side(pair):
    """bench_real.py --parity: per mode the engines alone A B B A, then side by side, on the
    profile's own threads (none pinned); the same text in both, a ratio per adjacent pair."""
    sets = [s for s in TEST_SETTINGS if not s.startswith("threads")]
    logged: list[str] = []
    modes = parity_modes(["hidden"], [1], 0)
    assert [m.label() for m in modes] == ["target alone", "hidden n-max 1"]
    out = engine_parity(pair[0], {"hidden": pair}, modes, PROMPTS[:1], 5, sets, "cpu", rounds=2, log=logged.append)
    assert out["server_threads"] == server_threads()
    assert [line.split(": ", 1)[1] for line in logged if line.startswith("parity, target")] == [
        "python alone", "llama-server alone", "llama-server alone", "python alone", "both engines side by side",
    ]  # fmt: skip
    for row in out["modes"]:
        one = row["one_at_a_time"]
        assert len(one["python"]) == len(one["llama-server"]) == len(one["ratios"]) == 2
        assert min(one["python"] + one["llama-server"]) > 0 and one["ratio_min"] <= one["ratio_median"]
        assert row["same_text"] and len(row["side_by_side"]["ratios"]) == 1 and row["python_ms_per_token"] > 0
        # two rounds of one prompt: two request pairs, their geometric mean inside its interval
        by_request = row["side_by_side"]["request_pairs"]
        assert by_request["pairs"] == 2 and 0 < by_request["low"] <= by_request["ratio"] <= by_request["high"]
        rates = row["side_by_side"]["requests"]
        assert len(rates["python"]) == len(rates["llama-server"]) == 2 and min(rates["python"]) > 0
        ratios = [p / s for p, s in zip(rates["python"], rates["llama-server"])]
        assert by_request["ratio"] == pytest.approx(statistics.geometric_mean(ratios), rel=1e-12)
    assert logged[-1] == parity_line(out["modes"][1]) and logged[-1].startswith(
        "Python engine / llama-server, hidden n-max 1: one at a time "
    )


def test_parity_modes_carry_the_sampler_and_a_sampled_drafting_mode_verifies_by_rejection():
    greedy = parity_modes(["sampled"], [3], 4)
    assert [m.label() for m in greedy] == ["target alone", "sampled n-max 3", "sampled adaptive up to n-max 4"]
    assert [m.arm("python").overrides() for m in greedy] == [
        [], ["spec-draft-adaptive=false", "spec-draft-n-max=3"], ["spec-draft-adaptive=true", "spec-draft-n-max=4"]
    ]  # fmt: skip
    gemma = parity_modes(["sampled"], [3], 4, "gemma")
    assert [m.label() for m in gemma] == [
        "target alone, gemma sampler", "sampled n-max 3, gemma sampler, rejection",
        "sampled adaptive up to n-max 4, gemma sampler, rejection",
    ]  # fmt: skip
    assert gemma[0].arm("llama-server").overrides() == [] and gemma[0].arm("python").sampler == "gemma"
    assert gemma[1].arm("llama-server").overrides()[-1] == "spec-rejection-sampling=true"


def test_a_parity_line_names_the_ratios_and_speeds():
    one = {
        "python": [8.0, 9.0],
        "llama-server": [8.0, 10.0],
        "ratios": [1.0, 0.9],
        "ratio_min": 0.9,
        "ratio_median": 0.95,
    }
    side = {"python": [7.0], "llama-server": [7.5], "ratios": [7 / 7.5], "ratio_min": 7 / 7.5, "ratio_median": 7 / 7.5}
    row = {"mode": "target alone", "one_at_a_time": one, "side_by_side": side, "same_text": False}
    assert parity_line(row) == (
        "Python engine / llama-server, target alone: one at a time 0.95x (min 0.90; 8.50 vs 9.00 tokens/s), "
        "side by side 0.93x; **texts differ**"
    )
    side["request_pairs"] = {"ratio": 0.99, "low": 0.97, "high": 1.0125, "pairs": 16}
    row["same_text"] = None  # sampled: not compared
    assert parity_line(row) == (
        "Python engine / llama-server, target alone: one at a time 0.95x (min 0.90; 8.50 vs 9.00 tokens/s), "
        "side by side 0.93x (request by request 0.990x (95% 0.970-1.012, 16 request pairs))"
    )


def test_the_adaptive_goals_give_the_request_by_request_interval_where_both_arms_have_one():
    """Each adaptive arm's goals with the paired interval of its requests (gguf_exact/bench/paired.py) where it and
    its peer kept per-request rates; results from before them (the best fixed length here) read as before."""
    arms = [
        bench_arm("none", "mixed", 0, 10.0) | {"request_rates": [[10.0, 8.0], [10.0, 8.0]]},
        bench_arm("mixed", "mixed", 2, 8.8),
        bench_arm("mixed", "mixed", 2, 9.9, adaptive=True) | {"request_rates": [[9.9, 7.92], [9.9, 7.92]]},
    ]
    alone = {bench_real.alone_key(a): a for a in arms if not a["n_max"]}
    assert bench_real.adaptive_goals(arms, alone) == [
        "- llama-server, mixed, adaptive up to n-max 2: 0.99x the target alone (request by request 0.990x "
        "(95% 0.990-0.990, 4 request pairs)), 1.12x the best fixed length (n-max 2)"
    ]
    arms[0]["request_rates"] = [[10.0, 8.0]]  # one round: not the adaptive arm's requests
    assert bench_real.adaptive_goals(arms, alone)[0].startswith("- llama-server, mixed, adaptive up to n-max 2: "
                                                                "0.99x the target alone, 1.12x")  # fmt: skip


def test_sampled_arms_compare_rejection_with_exact_match_and_their_own_target_alone():
    """bench_real.py --samplers greedy,gemma --rules exact,rejection: each sampler its own target
    alone; a sampled arm once per rule, matched with the other engine's by sampler and rule."""
    args = dict(kind="sampled", group="sampled", n_max=3, adaptive=True)
    arms = [
        bench_arm("none", "sampled", 0, 10.0),
        bench_arm(**args, generation_tps=20.0),
        bench_arm("none", "sampled", 0, 8.0) | {"sampler": "gemma"},
        bench_arm(**args, generation_tps=8.0) | {"sampler": "gemma", "rule": "exact"},
        bench_arm(**args, generation_tps=9.6) | {"sampler": "gemma", "rule": "rejection"},
    ]
    arms[4]["acceptance_per_depth"] = [0.8125, 0.6, 0.5]
    alone = {bench_real.alone_key(a): a for a in arms if not a["n_max"]}
    assert sorted(alone) == [("sampled", "llama-server", "gemma"), ("sampled", "llama-server", "greedy")]
    assert rule_goals(arms, alone) == [
        "- llama-server, sampled, n-max <=3 adaptive, gemma: rejection 1.20x exact match; "
        "the target alone: rejection 1.20x, exact match 1.00x"
    ]
    # the adaptive goal's fixed lengths and target alone are its sampler's and rule's: none fixed here
    assert bench_real.adaptive_goals(arms, alone)[1:] == [
        "- llama-server, sampled, adaptive up to n-max 3, gemma, exact: 1.00x the target alone",
        "- llama-server, sampled, adaptive up to n-max 3, gemma, rejection: 1.20x the target alone",
    ]
    result = {
        "shape": "e2b",
        "arms": arms,
        "costs": {"target_pass_seconds": {"1": 0.1}, "drafter": {"step_seconds": 0.01, "head_share": 0.5}},
    }
    python = [
        a | {"engine": "python", "generation_tokens_per_second": a["generation_tokens_per_second"] * 0.96} for a in arms
    ]
    lines = bench_real.table(result | {"arms": arms + python}).splitlines()
    rows = [line.split(" | ") for line in lines if line.startswith("| ")][1:]
    cells = [(r[0], r[2], r[3], r[4], r[7], r[10], r[-1]) for r in rows[:5]]
    assert cells == [
        ("| none (sampled)", "llama-server", "greedy", "-", "1.00x", "-", "yes |"),
        ("| sampled", "llama-server", "greedy", "exact", "2.00x", "-", "yes |"),
        ("| none (sampled)", "llama-server", "gemma", "-", "1.00x", "-", "yes |"),
        ("| sampled", "llama-server", "gemma", "exact", "1.00x", "-", "yes |"),
        ("| sampled", "llama-server", "gemma", "rejection", "1.20x", "0.81/0.60/0.50", "- |"),
    ]
    assert "Greedy arms verify by exact match only: at temperature 0 rejection sampling keeps the same drafts." in lines
    assert next(line for line in lines if line.startswith("Python engine / llama-server")) == (
        "Python engine / llama-server, generation tokens/s: none (sampled) n-max 0: 0.96x, sampled n-max <=3 adaptive: "
        "0.96x, none (sampled) n-max 0, gemma: 0.96x, sampled n-max <=3 adaptive, gemma, exact: 0.96x, "
        "sampled n-max <=3 adaptive, gemma, rejection: 0.96x"
    )


def test_kind_arms_run_each_sampled_drafting_arm_once_per_rule_and_greedy_ones_once():
    arms = bench_real.kind_arms(
        ["llama-server", "python"], [(0, False, ()), (4, True, ())], ["greedy", "gemma"], ["exact", "rejection"]
    )
    assert [a.describe() for a in arms] == [
        "llama-server, the target alone", "python, the target alone",
        "llama-server, adaptive up to n-max 4", "python, adaptive up to n-max 4",
        "llama-server, the target alone, gemma", "python, the target alone, gemma",
        "llama-server, adaptive up to n-max 4, gemma, exact", "python, adaptive up to n-max 4, gemma, exact",
        "llama-server, adaptive up to n-max 4, gemma, rejection", "python, adaptive up to n-max 4, gemma, rejection",
    ]  # fmt: skip
    # the rule reaches the launch overrides of sampled drafting arms only (false given too: a profile
    # that turns it on does not decide an exact-match arm)
    assert [a.overrides() for a in arms[::2]] == [
        [],
        ["spec-draft-adaptive=true", "spec-draft-n-max=4"],
        [],
        ["spec-draft-adaptive=true", "spec-draft-n-max=4", "spec-rejection-sampling=false"],
        ["spec-draft-adaptive=true", "spec-draft-n-max=4", "spec-rejection-sampling=true"],
    ]


def test_bench_real_refuses_an_unknown_sampler_or_rule_in_one_line():
    import subprocess

    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_real.py"
    for option, value, known in (
        ("--samplers", "greedy,hot", "greedy, gemma"),
        ("--rules", "exact,typical", "exact, rejection"),
    ):
        r = subprocess.run([sys.executable, str(script), option, value], capture_output=True, text=True)
        bad = value.split(",")[1]
        assert r.returncode == 2 and r.stderr.splitlines()[-1].endswith(
            f"error: {option}: {bad}: expected some of {known}"
        )


@pytest.mark.bindings
@pytest.mark.llama_server
def test_sampled_arms_send_gemmas_sampler_with_a_seed_per_prompt_and_launch_with_their_rule(pair, monkeypatch):
    """bench-real's sampled arms: every measured request carries Gemma's sampler and prompt i's
    seed 1 + i (in every arm and round); each drafting arm's rule reaches its server's profile as
    spec-rejection-sampling (whichever engine applies it); draft counters per depth from /metrics."""
    import gguf_exact.engines.launch as launch_mod
    import gguf_exact.engines.shared.http as http

    bodies: list[tuple[str, dict]] = []
    post = http.post_json
    monkeypatch.setattr(
        http, "post_json", lambda url, body, *a, **k: bodies.append((url, body)) or post(url, body, *a, **k)
    )
    launches = []
    plan = launch_mod.plan_launch
    monkeypatch.setattr(launch_mod, "plan_launch", lambda *a, **k: launches.append(plan(*a, **k)) or launches[-1])
    arms = [
        Arm("llama-server", 0, sampler="gemma"),
        Arm("python", 2, sampler="gemma", rule="exact"),
        Arm("python", 2, sampler="gemma", rule="rejection"),
        Arm("llama-server", 2, sampler="gemma", rule="rejection"),
    ]
    results = arms_side_by_side(pair[0], pair[1], arms, PROMPTS, 9, TEST_SETTINGS, rounds=2)
    measured = [b for url, b in bodies if url.endswith("/v1/completions") and b["max_tokens"] == 9]
    assert len(measured) == 4 * 2 * 2  # arms x rounds x prompts
    gemma = {"temperature": 1.0, "top_k": 64, "top_p": 0.95, "min_p": 0.0}
    assert all({k: b[k] for k in gemma} == gemma for b in measured)
    assert {(b["prompt"], b["seed"]) for b in measured} == {(PROMPTS[0], 1), (PROMPTS[1], 2)}
    # the warm-up and time-to-first-token requests stay greedy
    assert all(b["temperature"] == 0.0 and "top_k" not in b for url, b in bodies if b.get("max_tokens") in (1, 2))
    assert [launch.settings.overrides[len(TEST_SETTINGS) :] for launch in launches] == [
        (),
        ("spec-draft-adaptive=false", "spec-draft-n-max=2", "spec-rejection-sampling=false"),
        ("spec-draft-adaptive=false", "spec-draft-n-max=2", "spec-rejection-sampling=true"),
        ("spec-draft-adaptive=false", "spec-draft-n-max=2", "spec-rejection-sampling=true"),
    ]
    assert [launch.settings.config.value("rejection_sampling") for launch in launches] == [False, False, True, True]
    assert [launch.settings.engine_options.rejection_sampling for launch in launches[1:3]] == [False, True]
    assert [(r.engine, r.sampler, r.rule, r.tokens, r.same_every_round) for r in results] == [
        ("llama-server", "gemma", "exact", 18, True),
        ("python", "gemma", "exact", 18, True),
        ("python", "gemma", "rejection", 18, True),
        ("llama-server", "gemma", "rejection", 18, True),
    ]
    alone, *drafting = results
    assert (alone.draft_rounds, alone.accepted_per_position, alone.acceptance_per_depth) == (0, [], [])
    for r in drafting:
        # counted over both rounds (the same seeds: the same drafts twice), one entry per depth
        assert len(r.accepted_per_position) == 2 and 0 < r.draft_rounds and r.draft_rounds >= r.accepted_per_position[0]
        assert sum(r.accepted_per_position) == 2 * r.drafts_accepted
        depth = r.as_dict()["acceptance_per_depth"]
        assert depth[0] == r.accepted_per_position[0] / r.draft_rounds and len(depth) == 1 + (
            r.accepted_per_position[0] > 0
        )
    # at temperature 1 the rejection rule draws other tokens from the same seeds than exact match
    assert results[2].texts != results[1].texts


def test_a_kind_the_pair_writer_refuses_stops_bench_real_before_any_pair_is_written(tmp_path):
    """Kinds other than the cycle target's drafters go to make-pair's writer (their own target),
    first: an unknown one costs no multi-GB pair before its one-line error."""
    from gguf_exact.errors import ArgumentError

    with pytest.raises(ArgumentError, match="^kind bogus: expected one of hidden, mixed, real"):
        bench_real.make_pairs(tmp_path, "e2b", ["mixed", "bogus"])
    assert list(tmp_path.iterdir()) == []
