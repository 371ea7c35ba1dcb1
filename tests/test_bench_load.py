"""bench-load's parts (gguf_exact/bench/load.py) on the tiny hidden-state pair, whose drafts are
all accepted, not timed: every client's stream completes with its own counts, greedy texts are
the same with the drafter and without, and the table's reading of where the drafter stops paying."""

from __future__ import annotations

import pytest
from _llama_server import TEST_SETTINGS

from gguf_exact.bench.load import (
    LoadArm,
    LoadRequest,
    LoadResult,
    Reply,
    changed,
    client_streams,
    load_arm,
    measure_load,
    per_slot,
    prompt_order,
    stops_paying,
    table,
)
from gguf_exact.bench.real import running
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.hidden_pair import write_hidden_state_pair

PROMPTS = {"short": "the a of", "code": "def f(x): return x + 1", "prose": "the quick brown fox"}


@pytest.fixture(scope="module")
def pair(run_dir, tmp_path_factory):
    return write_hidden_state_pair(tmp_path_factory.mktemp("hidden"))


@pytest.mark.llama_server
def test_every_clients_stream_completes_with_its_own_counts(pair):
    req = LoadRequest(
        "hidden", *pair, PROMPTS, parallels=(1, 2), arms=(LoadArm("off", 0), LoadArm("n-max 3", 3)),
        n_predict=12, requests=2, rounds=2, sets=TEST_SETTINGS,
    )  # fmt: skip
    groups: list[list] = []
    results = measure_load(req, on_group=groups.append)
    assert [[(r.arm, r.users) for r in g] for g in groups] == [
        [(arm, p) for arm in ("off", "n-max 3") for _ in ("greedy", "gemma")] for p in (1, 2)
    ]  # each slot count's results as soon as it is done
    assert [(r.arm, r.users, r.sampler) for r in results] == [
        (arm, p, s) for arm in ("off", "n-max 3") for p in (1, 2) for s in ("greedy", "gemma")
    ]
    for r in results:
        # every client sent its 2 requests a round, in its own prompt order, and each got 12 tokens
        assert [(x.client, x.index, x.prompt) for x in r.replies] == [
            (c, i, prompt_order(list(PROMPTS), c, i))
            for rnd in (0, 1)
            for c in range(r.users)
            for i in (2 * rnd, 2 * rnd + 1)
        ]
        # greedy requests ignore end-of-generation (12 tokens each); sampled ones stop there as users'
        # do: llama-server makes ignore_eos a logit bias, and that keeps exact match
        lengths = [len(x.tokens) for x in r.replies]
        assert r.lost == 0 and (lengths == [12] * 4 * r.users if r.sampler == "greedy" else max(lengths) <= 12)
        assert r.tokens == sum(lengths) and r.tokens_per_second > 0 and r.load_average > 0
        # the rule each server counted on /metrics: sampled drafts verified by rejection sampling, none fell back
        rule = ("rejection", 4 * r.users, 0) if r.sampler == "gemma" and r.n_max else ("exact", 0, 0)
        assert (r.rule, r.rejection_requests, r.rejection_fallbacks) == rule
        assert {x.slot for x in r.replies} <= set(range(r.users)) and all(x.seconds > 0 for x in r.replies)
        # the decode's time as the server timed it: within each request's, after its prefill; one user's decode
        # speed is above its total tokens/s, which has the prefill in it
        assert all(0 < x.decode_seconds < x.seconds for x in r.replies)
        assert r.decode_tokens_per_second == r.tokens / sum(x.decode_seconds for x in r.replies)
        assert r.decode_tokens_per_second > r.tokens_per_second or r.users > 1
        med, high = r.latency()
        assert 0 < med <= high <= max(x.seconds for x in r.replies)
        # a rate a round, each round's tokens over its wall: greedy rounds give the same tokens, so the arm's
        # tokens/s is their harmonic mean
        assert len(r.round_rates) == 2 and all(x > 0 for x in r.round_rates)
        if r.sampler == "greedy":
            assert r.tokens_per_second == pytest.approx(2 / sum(1 / x for x in r.round_rates), rel=1e-12)
        d = r.as_dict()
        assert (d["requests"], d["tokens"], d["lost"], len(d["replies"]), d["rule"]) == (
            4 * r.users,
            sum(lengths),
            0,
            4 * r.users,
            rule[0],
        )
    by = {(r.arm, r.users, r.sampler): r for r in results}
    for p in (1, 2):
        off, drafted = by["off", p, "greedy"], by["n-max 3", p, "greedy"]
        assert [x.tokens for x in drafted.replies] == [x.tokens for x in off.replies]  # the target alone's text
        assert all(x.draft_n == 0 for x in off.replies)
        # 12 tokens: the prefill's, passes carrying 3 and 3 drafts, then the 2 room is left for
        assert [(x.draft_n, x.draft_n_accepted) for x in drafted.replies] == [(8, 8)] * 4 * p
        assert sum(d for _, d in per_slot(drafted.replies).values()) == 32 * p
    assert by["n-max 3", 1, "gemma"].replies[0].draft_n > 0  # the sampled requests draft too
    lines = table([r.as_dict() for r in results]).splitlines()
    assert len([x for x in lines if x.startswith("| hidden |")]) == 8
    assert sum(x.startswith("- hidden, ") for x in lines) == 2


@pytest.mark.llama_server
def test_a_timed_stream_keeps_sending_until_its_seconds_are_up_and_changed_finds_a_changed_text(pair):
    with running(pair[0], None, "llama-server", [*TEST_SETTINGS, "parallel=2", "ctx-size=1024"]) as (launch, _, _):
        # 5 s: room for 2 requests a client on 2 busy cores (at 1 s, one client got 1 beside another test run;
        # at 3 s once too, beside llama-server tests on the other worker)
        replies, wall = client_streams(launch.url, PROMPTS, 2, 8, seconds=5.0)
    assert wall >= 5.0 and {r.client for r in replies} == {0, 1}
    for c in (0, 1):
        own = [r for r in replies if r.client == c]
        assert [r.index for r in own] == list(range(len(own))) and len(own) >= 2
    reference = {r.prompt: r.text for r in replies}
    assert changed(replies, reference) == []
    assert changed(replies, reference | {"short": "x"}) == [r for r in replies if r.prompt == "short"]
    lost = Reply(0, 0, "code", error="no answer")
    assert changed([lost], reference) == [lost]


def test_per_slot_sums_each_slots_replies_and_leaves_lost_ones_out():
    replies = [Reply(0, 0, "a", slot=1, draft_n=6, draft_n_accepted=3), Reply(1, 0, "a", slot=0, draft_n=4, draft_n_accepted=4),
               Reply(0, 1, "a", slot=1, draft_n=2, draft_n_accepted=1), Reply(1, 1, "a", slot=0, draft_n=9, error="lost")]  # fmt: skip
    assert per_slot(replies) == {0: (4, 4), 1: (4, 8)}


def row(kind: str, arm: str, n_max: int, p: int, tps: float, adaptive: bool = False, decode: float = 0.0) -> dict:
    return {"kind": kind, "sampler": "greedy", "arm": arm, "n_max": n_max, "adaptive": adaptive, "users": p,
            "tokens_per_second": tps, "decode_tokens_per_second": decode or 3 * tps,
            "latency_median_seconds": 1.0, "latency_p90_seconds": 1.5,
            "per_slot": {"0": [3, 4]}, "requests": 2 * p, "lost": 0, "rule": "exact"}  # fmt: skip


def test_stops_paying_names_the_fewest_users_at_which_no_drafting_arm_beats_off():
    results = [
        *(row("mixed", "off", 0, p, t) for p, t in ((1, 4.0), (2, 5.0), (4, 6.0))),
        *(row("mixed", "n-max 1", 1, p, t) for p, t in ((1, 5.0), (2, 5.5), (4, 5.4))),
        *(row("mixed", "adaptive", 4, p, t, True, d) for p, t, d in ((1, 4.9, 13.0), (2, 5.0, 0), (4, 5.8, 0))),
        *(row("hidden", "off", 0, p, 4.0) for p in (1, 2)),
        *(row("hidden", "n-max 3", 3, p, 8.0) for p in (1, 2)),
    ]
    hidden, mixed = stops_paying(results)
    assert (hidden["kind"], hidden["stops_at"], [u["best_vs_off"] for u in hidden["users"]]) == (
        "hidden",
        None,
        [2.0, 2.0],
    )
    assert mixed["stops_at"] == 4
    assert [(u["users"], u["best_arm"]) for u in mixed["users"]] == [(1, "n-max 1"), (2, "n-max 1"), (4, "adaptive")]
    assert [u["adaptive_vs_off"] for u in mixed["users"]] == pytest.approx([4.9 / 4.0, 1.0, 5.8 / 6.0])
    assert [u["adaptive_vs_better"] for u in mixed["users"]] == pytest.approx([4.9 / 5.0, 5.0 / 5.5, 5.8 / 6.0])
    lines = table(results).splitlines()
    assert "| mixed | greedy | 2 | n-max 1 | 5.50 | 1.10x | 16.50 | 1.10x | 1.00 | 1.50 | 0:3/4 | exact | 4 | 0 |" in lines
    assert "| mixed | greedy | 2 | off | 5.00 | 1.00x | 15.00 | 1.00x | 1.00 | 1.50 | - | - | 4 | 0 |" in lines
    # the decode's ratio apart from the total's: 13 against off's 12 tokens/s a request, where the total is 0.98x
    assert "| mixed | greedy | 1 | adaptive | 4.90 | 1.23x | 13.00 | 1.08x | 1.00 | 1.50 | 0:3/4 | exact | 2 | 0 |" in lines
    assert [u["adaptive_decode_vs_off"] for u in mixed["users"]] == pytest.approx([13 / 12, 1.0, 5.8 / 6.0])
    assert "1: n-max 1 1.25x (adaptive 1.23x off, 0.98x the better of off and fixed; decode 1.08x off)" in lines[-1]
    assert lines[-1].startswith("- mixed, greedy: the drafter stops paying at 4 users; ")
    # round by round: 1.01x off in either round however fast the round (the host's drift shared by both arms)
    results[0]["round_rates"], results[6]["round_rates"] = [4.0, 2.0, 5.0], [4.04, 2.02, 5.05]
    assert stops_paying(results)[1]["users"][0]["adaptive_vs_off_by_round"] == pytest.approx([1.01, 1.01, 1.01])
    assert "decode 1.08x off; by round 1.01x off, 95% 1.01-1.01)" in table(results).splitlines()[-1]
    results[6]["round_rates"] = [4.04, 2.02]  # not the same rounds: no interval
    assert stops_paying(results)[1]["users"][0]["adaptive_vs_off_by_round"] is None
    assert lines[-2].startswith("- hidden, greedy: the drafter pays up to 2 users (all measured); ")
    alone = table([row("mixed", "adaptive", 4, 4, 21.43, True)]).splitlines()  # an arm traced on its own
    assert alone[-1] == "- mixed, greedy: no user count has both speculation off and a drafting arm"


def test_a_peer_arm_is_measured_beside_the_arms_and_left_out_of_where_the_drafter_stops_paying():
    peer = load_arm("adaptive@kv-unified=false")
    assert (peer.label, peer.n_max, peer.adaptive, peer.overrides()) == (
        "adaptive@kv-unified=false", 4, True, ["kv-unified=false"]
    )
    assert load_arm("n-max 3@kvu=false@ctx-size=2048").overrides()[-2:] == ["kvu=false", "ctx-size=2048"]
    assert load_arm("off").overrides() == [] and load_arm("off@kvu=false").n_max == 0
    for bad in ("n-max 2", "adaptive@kvu", "fast@kvu=false"):
        with pytest.raises(GgufExactError, match=f"arm '{bad}': expected one of off, n-max 1, n-max 3, adaptive"):
            load_arm(bad)
    results = [
        row("mixed", "off", 0, 4, 20.0),
        row("mixed", "off@kvu=false", 0, 4, 10.0),  # a slower peer of off: no arm's ratio is to it
        row("mixed", "adaptive", 4, 4, 21.0, True),
        row("mixed", "adaptive@kvu=false", 4, 4, 30.0, True),  # a faster peer: not the best arm, not the adaptive one
    ]
    (mixed,) = stops_paying(results)
    assert mixed["users"] == [
        {"users": 4, "off_tokens_per_second": 20.0, "best_arm": "adaptive", "best_vs_off": 1.05,
         "adaptive_vs_off": 1.05, "adaptive_vs_better": 1.05, "adaptive_decode_vs_off": 1.05,
         "adaptive_vs_off_by_round": None}
    ]  # fmt: skip  (results without round rates: no interval)
    lines = table(results).splitlines()
    assert "| mixed | greedy | 4 | adaptive@kvu=false | 30.00 | 1.50x | 90.00 | 1.50x | 1.00 | 1.50 | 0:3/4 | exact | 8 | 0 |" in lines
    assert "| mixed | greedy | 4 | off@kvu=false | 10.00 | 0.50x | 30.00 | 0.50x | 1.00 | 1.50 | - | - | 8 | 0 |" in lines
    # results written before the decode was timed: no decode figures, the rest as before
    old = [{k: v for k, v in r.items() if k != "decode_tokens_per_second"} for r in results]
    assert stops_paying(old)[0]["users"][0]["adaptive_decode_vs_off"] is None
    assert "| mixed | greedy | 4 | adaptive | 21.00 | 1.05x | - | - | 1.00 | 1.50 | 0:3/4 | exact | 8 | 0 |" in table(old).splitlines()


def test_the_rule_names_requests_that_fell_back_to_exact_match():
    """A sampled arm whose requests kept exact match (the bench's own ignore_eos once did this
    unseen: a logit bias) must not read as rejection sampling, even where some were verified by it."""
    arm = lambda requests, fallbacks: LoadResult("sampled", "n-max 3", 3, False, 2, "gemma", 1.0, [],  # noqa: E731
                                                 rejection_requests=requests, rejection_fallbacks=fallbacks)  # fmt: skip
    assert [arm(*c).rule for c in ((4, 0), (0, 0), (0, 4), (3, 1))] == [
        "rejection",
        "exact",
        "exact (4 fell back)",
        "rejection (1 of 4 fell back)",
    ]
    row_ = arm(0, 4).as_dict() | {"per_slot": {"0": [3, 9]}}
    assert "| sampled | gemma | 2 | n-max 3 | 0.00 | - | - | - | 0.00 | 0.00 | 0:3/9 | exact (4 fell back) | 0 | 0 |" in table(
        [row_]
    ).splitlines()


def test_the_soak_refuses_a_server_bin_that_is_not_an_executable_in_one_line(tmp_path):
    """``soak_load.py --server-bin`` runs another build's llama-server for both servers; a path that is no
    executable stops it in one line, before any pair is written or server started (it once left a traceback
    after writing the tiny pairs)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "soak_load.py"
    not_run = tmp_path / "llama-server"
    not_run.write_text("#!/bin/sh\n")  # there, but not executable
    for path in (tmp_path / "missing", not_run):
        r = subprocess.run([sys.executable, str(script), "--server-bin", str(path)], capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
            f"soak_load.py: error: --server-bin {path}: no such executable"
        )
