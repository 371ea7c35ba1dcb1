"""The draft-length policy on synthetic cost curves and acceptance streams: the exact k it picks."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from policy_traces import (
    CURVES,
    E2B_T2_SWITCH,
    LAVAPIPE_1_USER_SEEDS,
    LAVAPIPE_1_USER_STEP,
    LAVAPIPE_1_USER_STEP_SEED,
    LAVAPIPE_STEP,
    Stream,
    burst,
    class_switches,
    drift,
    lavapipe_mixed_walk,
    one_dear_timing,
    pass_yields,
    read_trace,
    replay_python,
    simulate,
)

from gguf_exact.engines.shared.acceptance_class import GREEDY, SAMPLED_EXACT, SAMPLED_REJECTION, acceptance_class
from gguf_exact.engines.shared.draft_policy import DraftPolicy, PolicySettings
from gguf_exact.engines.shared.policy_snapshot import parse_snapshot, snapshot_metrics
from gguf_exact.engines.shared.stats import parse_metrics

ZEN5_E2B = CURVES["e2b-zen5"]


def steady(ks: list[int], tail: int = 40) -> list[int]:
    return sorted(set(ks[-tail:]))


def test_cpu_like_curve_never_drafts_even_when_the_drafter_is_always_right() -> None:
    # k + 1 rows cost k + 1 passes: a draft can at best break even, minus the drafter step
    ks, policy = simulate(CURVES["cpu"], step=0.01, streams=[Stream(1.0)] * 4, passes=200)
    # each length twice: its first pass follows another length (a switch, timed provisionally),
    # its second times it steadily; 2 rows, then 3 (the drafter right), then known not to pay.
    # Each longer length, timed steadily once and within retime_margin of the target alone's
    # rate (0.93-0.95x here), is timed again once, one every 8 passes (12, 21; 4 rows, never
    # timed, might pay if the drafter were right at depth 3 as well: probed at 30, held once
    # more, then timed again at 40). Priced out then (not even an always-right drafter could pay),
    # one draft rechecks the costs after 32 passes (73), the next after 64 (137); a recheck's pass,
    # a switch, is not drafted once more to time it steadily (before patch 39zc: held at 74, that
    # steady timing re-timed at 83-84, the next recheck at 148-149, re-timed at 158-159). 128 passes
    # later the timings are stale, priced as timed (patch 39z): nothing drafts to time them again.
    # 186 of 200 passes the target alone (180 before 39zc; 172 when a stale count cost at most one
    # row fewer's and each was re-timed)
    assert ks[:8] == [0, 0, 1, 1, 2, 2, 0, 0]
    assert [(i, k) for i, k in enumerate(ks) if k] == [
        (2, 1), (3, 1), (4, 2), (5, 2), (12, 1), (13, 1), (21, 2), (22, 2), (30, 3), (31, 3), (40, 3), (41, 3),
        (73, 1), (137, 1),
    ]  # fmt: skip
    assert ks.count(0) == 186
    assert policy.pass_cost == {1: 0.1, 2: 0.2, 3: 0.1 * 3, 4: 0.4}  # 5+ rows never tried: they cannot pay
    assert policy.since_probe == 0  # no probe since


def test_gpu_like_curve_drafts_the_bound_with_an_always_right_drafter() -> None:
    ks, policy = simulate(CURVES["gpu"], step=0.001, streams=[Stream(1.0)] * 4, passes=100)
    # row counts explored one at a time; every draft right, so the climb goes on without a second
    # (steady) pass at each length: the bound's 5 rows are timed steadily, 2-4 rows only by a switch
    assert ks[:7] == [0, 0, 1, 2, 3, 4, 4]
    assert ks[5:] == [4] * 95
    assert sorted(policy.pass_cost) == [1, 2, 3, 4, 5]
    assert policy.provisional == {1: False, 2: True, 3: True, 4: True, 5: False}


def test_gpu_like_curve_with_middling_acceptance_picks_a_middle_length() -> None:
    streams = [Stream(0.45)] * 4
    ks, policy = simulate(CURVES["gpu"], step=0.001, streams=streams, passes=300)
    # 2; twice, the target alone re-times its 1-row pass (stale: two passes, the first a switch),
    # and probes of 3 drafts (every 64 passes; a pass of the target alone keeps their count), one
    # held once more to time 4 rows steadily (stale). (Depth 1 explored at once, passes 2-8.)
    assert ks[:9] == [0, 0, 1, 1, 1, 2, 2, 2, 2]
    after = [(i, k) for i, k in enumerate(ks) if i >= 120 and k != 2]
    assert after == [(129, 3), (131, 0), (132, 0), (195, 3), (196, 3), (260, 3), (262, 0), (263, 0)]
    assert [i for i, k in enumerate(ks) if k == 0 and i > 10] == [131, 132, 262, 263]
    assert policy.acceptance(1) == pytest.approx(0.45, abs=0.03)
    assert policy.acceptance(2) == pytest.approx(0.45, abs=0.03)


def test_avx512_curve_finds_the_cheap_four_row_pass() -> None:
    # 117, 188, 260, 202, 268 ms for 1..5 rows: 3 drafts (4 rows) beat 2 and 4 with an always-right drafter
    ks, policy = simulate(CURVES["avx512"], step=0.006, streams=[Stream(1.0)] * 4, passes=100)
    # the climb (every draft right) without a second pass at each length, then 4 drafts timed
    # steadily, then 3; no probe of 4: 5 rows timed, they cannot pay even with the drafter right;
    # but their one steady timing, within retime_margin, is timed again once (15-16): as dear
    assert ks[:8] == [0, 0, 1, 2, 3, 4, 4, 3]
    assert [(i, k) for i, k in enumerate(ks) if i >= 7 and k != 3] == [(15, 4), (16, 4)]
    assert policy.samples[5] == [0.268, 0.268]
    assert policy.best(99) == 3
    # Fixed at 2 drafts the policy would expect 2.9 tokens in 0.272 s; at 3, 3.8 in 0.22 s
    assert policy.rate(3) > policy.rate(4) > policy.rate(2) > policy.rate(1) > policy.rate(0)


def test_avx512_curve_with_real_like_acceptance_drafts_three_for_the_cheap_four_rows() -> None:
    # about 0.85 at the first draft, 0.62 deeper: 2.7 tokens for 0.220 s at 3 drafts beat
    # 1.84 for 0.194 s at 1 and 1 for 0.117 s alone
    streams = [Stream(0.85), Stream(0.62), Stream(0.62), Stream(0.62)]
    ks, policy = simulate(CURVES["avx512"], step=0.006, streams=streams, passes=300)
    # the first probe (pass 11) is the length with the best rate on trust, 3 drafts, so the cheap
    # 4 rows are found at once (a probe of 2 first, the shortest that could pay, found them at 242);
    # re-timing 1 row twice (two passes each); no probe of 4: at depth 4 even an always-right draft
    # (after 0.85 x 0.62 x 0.62 for the three before) does not pay for the fifth row, but its one
    # steady timing is timed again (17-18, 27-28)
    assert steady(ks) == [0, 3]
    assert ks[13:17] == [3, 3, 3, 3]
    assert [(i, k) for i, k in enumerate(ks) if i > 13 and k != 3] == [
        (17, 4), (18, 4), (27, 4), (28, 4), (131, 0), (132, 0), (262, 0), (263, 0),
    ]  # fmt: skip
    # the decayed estimate of the last ~20 drafts per depth, about the streams' 2.71
    assert policy.expected_tokens(3) == pytest.approx(2.71, abs=0.12)


def test_mixed_acceptance_on_avx512_curve_is_the_target_alone_with_rare_probes() -> None:
    ks, policy = simulate(CURVES["avx512"], step=0.006, streams=[Stream(0.45)] * 4, passes=400)
    assert steady(ks, 200) == [0, 1]
    probes = [(i, ks[i]) for i in range(200, 400) if ks[i]]
    # 8 of 200 passes draft: probes of one draft (a failed one doubles the interval, a right one
    # halves it); once a right probe made one draft the best (286-287)
    assert probes == [(214, 1), (222, 1), (238, 1), (270, 1), (286, 1), (287, 1), (319, 1), (383, 1)]
    assert policy.interval == 32


def test_one_slow_timing_of_two_rows_does_not_stop_drafting_for_good() -> None:
    # a card (up to 5 rows cost 1.1 passes), an always-right drafter, and pass 2 (the first
    # timing of 2 rows) at 40x while the machine was busy: 2 rows look dearer than 2 passes,
    # so one draft is held once more (a steady timing replaces the switch pass's) and the climb
    # goes on; pass 7 (the second steady timing of 5 rows) at 40x: not averaged in, the row
    # count costs the lowest of its recent steady timings, so 4 drafts stay
    ks, policy = simulate(CURVES["gpu"], step=0.001, streams=[Stream(1.0)] * 4, passes=300, slow={2: 40.0})
    assert ks[:8] == [0, 0, 1, 1, 2, 3, 4, 4]
    ks, policy = simulate(CURVES["gpu"], step=0.001, streams=[Stream(1.0)] * 4, passes=300, slow={7: 40.0})
    assert ks[:10] == [0, 0, 1, 2, 3, 4, 4, 4, 4, 4]
    # from then on 4 drafts but where 1 row is stale and timed again (131-132, 262-263)
    assert [(i, k) for i, k in enumerate(ks) if k != 4 and i > 4] == [(131, 0), (132, 0), (262, 0), (263, 0)]
    assert policy.pass_cost[5] == 0.011 and policy.samples[5] == [0.011] * 3


def test_one_slow_timing_of_one_row_does_not_keep_a_useless_drafter_drafting() -> None:
    # k rows cost k passes, the drafter never right, and pass 1 (the steady timing of 1 row) at
    # 5x: drafting looks cheaper than the target alone until 1 row is timed again
    ks, policy = simulate(CURVES["cpu"], step=0.01, streams=[Stream(0.0)] * 4, passes=400, slow={1: 5.0})
    retimed = ks.index(0, 2)
    assert retimed == 131
    # until then one draft (two explored once); no probes of two: a drafter never right at depth
    # 1 makes a second draft worthless whatever it gets right at depth 2
    assert [(i, k) for i, k in enumerate(ks[:retimed]) if k != 1] == [(0, 0), (1, 0), (4, 2), (5, 2)]
    assert policy.pass_cost[1] == pytest.approx(0.1)
    # then the target alone, but for the rechecks of a priced-out length (one draft after 32 passes
    # at 0, then 64, then 128: 164, 228, 356), each one pass (patch 39zc; before, each was drafted
    # once more to time 2 rows steadily and that timing re-timed 10 passes on: 259 passes the target
    # alone). (A stale row count was priced at one row fewer's cost before patch 39z: 3 rows' stale
    # timing then drew probes of 2 at 142 and 288, and 253 passes were the target alone.)
    assert ks.count(0) == 268 and [(i, k) for i, k in enumerate(ks) if i >= retimed and k] == [
        (164, 1), (228, 1), (356, 1),
    ]  # fmt: skip


def test_one_dear_steady_timing_at_the_bound_is_timed_again() -> None:
    # issue 23's 19:10 run: an always-right drafter climbs to 4 drafts, the bound, and its first
    # steady 5-row pass is timed at 1.38x (0.345 s against 0.25): 3 drafts look better than 4.
    # 5 rows, timed steadily once 8 passes ago, with a rate (4 drafts: 5 / 0.352 s) within
    # retime_margin of 3 drafts' (4 / 0.230 s), are timed again at 15-16: 4 drafts from then on
    ks, policy = one_dear_timing()
    assert ks[:17] == [0, 0, 1, 2, 3, 4, 4, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4]
    assert [(i, k) for i, k in enumerate(ks) if i >= 15 and k != 4] == [(131, 0), (132, 0)]  # 1 row stale
    assert policy.samples[5] == [0.25, 0.25, 0.25] and policy.pass_cost[5] == 0.25
    # without the re-time: 3 drafts for good (a stale timing is priced as timed: nothing else times
    # it again), but for the target alone re-timing its stale 1 row
    ks, _ = one_dear_timing(settings=PolicySettings(retime_margin=0.0))
    assert [(i, k) for i, k in enumerate(ks) if i >= 7 and k != 3] == [(131, 0), (132, 0)]


def test_a_burst_of_busy_passes_does_not_price_a_length_out() -> None:
    # issue 23 (policy_traces.BURST): 3 passes in a row at 10x while the policy drafts 3, the
    # best here. A row count costs the lowest of its last 3 steady timings, so the burst filled
    # 4 rows' window: 3 drafts priced at 2.11 s, one draft from then on, until 4 rows went stale.
    # A steady timing above burst_ratio (2x) its row count's cost is not kept: as if no burst
    ks, policy = burst()
    assert ks == burst(slow=None)[0]
    assert ks[42:] == [3] * 78 and max(policy.samples[4]) == 0.211
    before, old = burst(settings=PolicySettings(burst_ratio=0.0))
    # (its last two passes of 4 drafts re-time 5 rows, timed steadily once, 8 passes before)
    assert before[:50] == ks[:50] and before[53:55] == [4, 4] and set(before[55:]) == {1, 2}
    assert old.pass_cost[4] == 2.11


def test_a_spuriously_low_timing_holds_its_length_only_while_it_is_in_the_window() -> None:
    # 1 row 0.1 s, 2 rows 0.16 s, acceptance 0.5: one draft (1.5 / 0.16 = 9.4 tokens/s) loses to
    # the target alone (10); the first steady 2-row timing (pass 3) at 0.75x (0.12 s) makes it
    # look better (12.5): drafted every pass, timed at 0.16 each, until the low timing leaves
    # the window of the last three (pass 6), and on while depth 1, tried 6 times, is still
    # explored (0.5 + one standard error could pay); then the target alone, but for probes
    curve, streams = {1: 0.1, 2: 0.16}, [Stream(0.5)]
    ks, policy = simulate(curve, step=0.0, streams=streams, passes=30, n_max=1, slow={3: 0.75})
    assert ks == [0, 0, 1, 1, 1, 1, 1, 1, 1] + [0] * 7 + [1] + [0] * 7 + [1] + [0] * 5
    assert policy.samples[2] == [0.16, 0.16, 0.16]
    assert simulate(curve, step=0.0, streams=streams, passes=30, n_max=1)[0][:10] == [0, 0, 1, 1, 1, 1, 1, 1, 1, 0]
    unexplored = PolicySettings(explore_weight=0.0)  # as before depth 1 was explored
    assert simulate(curve, 0.0, streams, 30, n_max=1, settings=unexplored)[0][:7] == [0, 0, 1, 1, 0, 0, 0]


def test_a_switch_pass_timing_is_not_kept_and_a_close_rate_does_not_switch() -> None:
    # llama.cpp rebuilds its graph when a pass's row count changes: 2 rows after 1 cost 0.165
    # here, 2 rows after 2 cost 0.139 (E2B on 2 CPU cores, as llama-server's /metrics showed)
    policy = DraftPolicy(PolicySettings(n_max=1))
    for rows, seconds in [(1, 0.105), (1, 0.105), (2, 0.165), (2, 0.139)]:
        policy.observe_pass(rows, seconds)
    assert policy.pass_cost == {1: 0.105, 2: 0.139} and policy.provisional == {1: False, 2: False}
    policy.observe_pass(1, 0.130)  # a switch back to 1 row: not kept
    policy.observe_pass(2, 0.170)  # and to 2 rows: not kept
    assert policy.pass_cost == {1: 0.105, 2: 0.139} and policy.timed_at == {1: 2, 2: 4}
    policy.tried, policy.accepted = [20.0], [10.0]  # acceptance (10 + 0.5) / 21 = 0.5
    # one draft: 1.5 tokens / 0.139 s = 10.8 tokens/s against 1 / 0.105 = 9.5 alone
    assert policy.acceptance(1) == 0.5 and policy.best(9) == 1
    policy.pass_cost[2] = 1.5 / (1.01 / 0.105)  # one draft's rate now 1% above the target alone's
    policy.last_rows = 1
    assert policy.best(9) == 0  # within switch_margin (2%) of the last length: it stays
    policy.last_rows = 2
    assert policy.best(9) == 1  # and from one draft, one draft stays


def test_a_pass_without_drafts_is_not_taken_for_an_all_right_one() -> None:
    # the engines tell the policy no result for a pass without drafts: the 1-row pass that
    # re-times a stale 1 row (a switch) is held once more for a steady timing all the same,
    # though the last pass with drafts kept every one
    ks, policy = simulate(
        CURVES["gpu"], step=0.001, streams=[Stream(1.0)] * 4, passes=300, results_without_drafts=False
    )
    assert ks[260:266] == [4, 4, 0, 0, 4, 4]
    assert ks == simulate(CURVES["gpu"], step=0.001, streams=[Stream(1.0)] * 4, passes=300)[0]
    assert policy.provisional[1] is False and policy.pass_cost[1] == 0.010


def test_limit_bounds_the_draft() -> None:
    ks, _ = simulate(CURVES["gpu"], step=0.001, streams=[Stream(1.0)] * 4, passes=30, limit=2)
    assert max(ks) == 2 and ks[-1] == 2
    policy = DraftPolicy(PolicySettings(n_max=4))
    policy.observe_pass(1, 0.1)
    assert policy.choose(0) == 0


def test_a_change_of_text_brings_drafting_back() -> None:
    # 200 passes where the drafter is never right, then text it always gets right
    streams = [Stream(0.0, then=1.0, after=200)] * 4
    ks, _ = simulate(CURVES["gpu"], step=0.001, streams=streams, passes=400)
    assert set(ks[150:200]) == {0, 3}  # probes only (of 3: the best length on trust where rows are cheap)
    # the first probe after the change: 258 (3 drafts, the best on trust), right: its interval
    # halved, the next at 290 makes 4 drafts the best
    assert [(i, ks[i]) for i in range(200, 290) if ks[i]] == [(258, 3)]
    back = next(i for i in range(200, 400) if ks[i] == 4)
    assert back == 290
    assert [(i, k) for i, k in enumerate(ks) if i > back and k != 4] == []


def test_prior_and_decay_give_the_acceptance_estimate() -> None:
    policy = DraftPolicy(PolicySettings(n_max=2))
    assert policy.acceptance(1) == 0.5
    policy.observe_result(2, 1)  # depth 1 right, depth 2 wrong
    assert policy.acceptance(1) == (1.0 + 0.5) / (1.0 + 1.0)
    assert policy.acceptance(2) == (0.0 + 0.5) / (1.0 + 1.0)
    policy.observe_result(2, 0)  # depth 1 wrong: depth 2 not tried
    assert policy.tried == [0.95 + 1.0, 1.0]
    assert policy.accepted == [0.95, 0.0]


def test_cost_estimates_are_the_lowest_recent_steady_timing_and_unknown_rows_borrow_one_row_fewer() -> None:
    policy = DraftPolicy(PolicySettings(n_max=3))
    assert policy.choose(5) == 0  # nothing measured: the target alone
    policy.observe_pass(1, 0.100)  # the first pass: provisional (it follows no pass of its size)
    assert policy.provisional == {1: True} and policy.choose(5) == 0  # held: once more for a steady timing
    policy.observe_pass(1, 0.150)  # steady: replaces the provisional timing
    policy.observe_pass(1, 0.200)  # steady: the lowest of the last three
    assert policy.pass_cost[1] == 0.150 and policy.provisional == {1: False} and policy.samples[1] == [0.150, 0.200]
    costs = []
    for seconds in (0.120, 0.210, 0.220, 0.230):  # 0.120 leaves the window after three more
        policy.observe_pass(1, seconds)
        costs.append(policy.pass_cost[1])
    assert costs == [0.120, 0.120, 0.120, 0.210] and policy.samples[1] == [0.210, 0.220, 0.230]
    assert policy.cost(2) == policy.cost(1)
    assert policy.cost(3) is None
    policy.observe_steps(2, 0.02)
    policy.observe_steps(1, 0.02)
    assert policy.step_cost == pytest.approx(0.012)


def test_snapshot_survives_metrics_text_as_both_engines_write_it() -> None:
    from gguf_exact.engines.shared.policy_snapshot import parse_snapshot, snapshot_metrics
    from gguf_exact.engines.shared.stats import parse_metrics

    _, policy = simulate(CURVES["avx512"], step=0.006, streams=[Stream(1.0)] * 4, passes=30)
    snap = policy.snapshot()
    back = parse_snapshot(parse_metrics(snapshot_metrics(snap)))
    assert back is not None and back.draft_n == snap.draft_n == 3
    assert back.acceptance == pytest.approx(snap.acceptance, rel=1e-5)
    assert [r for r, _ in back.pass_seconds] == [1, 2, 3, 4, 5]
    assert back.pass_seconds[3][1] == pytest.approx(0.202) and back.step_seconds == pytest.approx(0.006)
    assert parse_snapshot(parse_metrics("llamacpp:n_decode_total 3\n")) is None  # not adaptive


def test_snapshot_reports_choice_acceptance_and_costs() -> None:
    ks, policy = simulate(CURVES["gpu"], step=0.001, streams=[Stream(1.0)] * 2, passes=10, n_max=2)
    snap = policy.snapshot()
    assert snap.draft_n == 2 == ks[-1]
    assert [r for r, _ in snap.pass_seconds] == [1, 2, 3]
    assert snap.step_seconds == pytest.approx(0.001)
    assert len(snap.acceptance) == 2 and snap.acceptance[0] > 0.9


# --- costs seeded before the first pass (spec-draft-adaptive-warmup) ---


@pytest.mark.parametrize(
    ("curve", "learned", "seeded"),
    [
        # k rows cost k passes: learning explores 1, 2 and 3 drafts (12 of the first 40 passes);
        # seeded, the policy knows at once that no draft can pay (but rechecks that once after
        # 32 passes: one draft, one pass; patch 39zc)
        ("cpu", "0012200000003322000000044330000000440000", "0" * 31 + "1" + "0" * 8),
        # up to 5 rows cost 1.1 passes: the bound from the first pass, not the fourth
        ("gpu", "0012344444444444444444444444444444444444", "4" * 40),
        # 4 rows cheaper than 3: the best (3 drafts) from the first pass, no detour through 4
        ("avx512", "0012344333333334433333333333333333333333", "3" * 40),
    ],
)
def test_seeded_costs_start_at_the_machines_best_length(curve: str, learned: str, seeded: str) -> None:
    always_right = [Stream(1.0)] * 4
    assert "".join(map(str, simulate(CURVES[curve], 0.001, always_right, 40)[0])) == learned
    ks, policy = simulate(CURVES[curve], 0.001, always_right, 40, seeds=CURVES[curve])
    assert "".join(map(str, ks)) == seeded
    # no draft was ever rejected; on the cpu curve the recheck's draft, timed, was priced out (patch 39za)
    assert policy.climbing is (curve != "cpu")


def test_a_seeded_policy_climbs_until_a_draft_is_rejected() -> None:
    # E2B on 2 CPU cores: with seeded costs and the prior's 0.5 at every depth no draft pays, so an
    # always-right drafter would wait for the first scheduled probe (8 passes); the climb drafts
    # after each all-right pass instead, the length with the best rate were the next depth right: 3
    # at once (the prior's 0.5 deeper, 4 rows 2.25 passes), then depth 3 (always wrong here) is
    # rejected and the climb stops; 3 drafts stay while their rate is within switch_margin of 2
    # drafts' (a probe of 4 at 38, 8 passes after the switch)
    streams = [Stream(1.0), Stream(1.0), Stream(0.0), Stream(1.0)]
    ks, policy = simulate(CURVES["e2b"], 0.0017, streams, 40, seeds=CURVES["e2b"])
    assert "".join(map(str, ks)) == "3333333333333333333333333333332222222422"
    assert not policy.climbing
    # the mixed drafter on the AVX-512 curve: the prior prices 3 drafts over 4 cheap rows best once;
    # rejected at depth 1 (0.25), explored while depth 1 one standard error up could pay with 4 cheap
    # rows (0.56 after one rejection; 0.39 after two could not); probes of 3 drafts over the cheap 4
    # rows (the best length on trust) every 8 to 10 passes, some held once more to time 4 rows
    # steadily; depth 1 tried about 7 times then (its estimate 0.40, the truth 0.45): 3 drafts at 0.45
    # are 0.99x the target alone
    ks, policy = simulate(CURVES["avx512"], 0.001, [Stream(0.45)] * 4, 40, seeds=CURVES["avx512"])
    assert "".join(map(str, ks)) == "3300000003300000003300000003000000030000"
    assert policy.tried[0] == pytest.approx(6.732, abs=0.001) and policy.acceptance(1) == pytest.approx(0.399, abs=0.001)
    unexplored = PolicySettings(explore_weight=0.0)
    ks, _ = simulate(CURVES["avx512"], 0.001, [Stream(0.45)] * 4, 40, seeds=CURVES["avx512"], settings=unexplored)
    assert "".join(map(str, ks)) == "3000000030000000000000003000000030000000"


@pytest.mark.parametrize(
    ("shadow", "start", "speed"),
    [(True, "000112020223011000000022", 0.9730), (False, "001122300000110000000000", 0.9893)],
)
def test_the_climb_ends_where_a_drafted_length_timed_is_priced_out(shadow: bool, start: str, speed: float) -> None:
    # the tiny `hidden` pair on lavapipe, one user: start-up timed every row count 20-35% below the passes that
    # followed, so each seed a climb had not yet re-timed looked cheap, and an always-right drafter never ends the
    # climb by a rejection: it climbed again after passes without drafts, at 0.84x the target alone live. Now the
    # first priced-out pass after one that drafted ends it (before patch 39za: 0.9544x / 0.9699x, 9 / 8 passes of
    # 3-4 drafts against 1 / 1); a recheck is one pass of one draft, not two (before patch 39zc: 0.9689x / 0.9846x,
    # 16 passes of one draft against 7 / 7)
    events: list[tuple] = []
    ks, policy = simulate(CURVES["lavapipe-1-user"], LAVAPIPE_1_USER_STEP, [Stream(1.0)] * 4, 300, events=events,
                          seeds=LAVAPIPE_1_USER_SEEDS, step_seed=LAVAPIPE_1_USER_STEP_SEED,
                          settings=PolicySettings(shadow=shadow), results_without_drafts=False)  # fmt: skip
    assert "".join(map(str, ks[: len(start)])) == start and not policy.climbing
    assert sum(k >= 3 for k in ks) == 1 and ks.count(1) == 7
    seconds = sum(e[2] for e in events if e[0] in ("pass", "steps"))
    tokens = len(ks) + sum(e[2] for e in events if e[0] == "result")
    assert tokens / seconds * CURVES["lavapipe-1-user"][1] == pytest.approx(speed, abs=5e-5)


def test_a_right_probes_shadow_comes_no_sooner_than_its_steps_are_the_shadow_budget() -> None:
    # lavapipe, one user, the `mixed` walk: the seeded 2 rows (83 ms, 113 after) are never verified, so a probe
    # of depth 1 from the target alone looks payable at every interval; its shadow is right 2 times in 3, each
    # right one halves the interval back to 8, and a step of 41 ms every 8 passes of 71 cost 7%: 0.937x the
    # target alone, 43 shadows (before patch 39zb). Now a right probe's shadow comes no sooner than its steps are
    # SHADOW_BUDGET of the passes in between: 41 / (0.02 * 70.6) = 29.04, about every 30 passes (29 at the end, at
    # the policy's own step and 1-row estimates then)
    events: list[tuple] = []
    ks, policy = lavapipe_mixed_walk(events)
    shadows, n = [], -1
    for event in events:
        n += event[0] == "choose"
        shadows += [(n, event[1])] if event[0] == "shadow" else []
    at = [2, 3, 11, 39, 68, 76, 104, 119, 120, 150, 181, 243, 305, 336, 367]
    assert shadows == [(i, 1) for i in at] and sum(ks) == 0 and policy.interval == 29
    seconds = sum(e[2] for e in events if e[0] in ("pass", "steps"))
    assert len(ks) / seconds * CURVES["lavapipe-1-user"][1] == pytest.approx(0.97754, abs=5e-5)


def test_a_seed_prices_its_rows_until_the_first_steady_pass_replaces_it() -> None:
    policy = DraftPolicy(PolicySettings(n_max=2))
    for rows, seconds in {1: 0.1, 2: 0.12, 3: 0.13, 4: 0.5}.items():  # 4 rows: above the bound, ignored
        policy.seed(rows, seconds)
    assert policy.pass_cost == {1: 0.1, 2: 0.12, 3: 0.13} and policy.climbing
    policy.observe_pass(2, 0.4)  # a switch pass (the first pass): its timing is not kept
    assert policy.pass_cost[2] == 0.12 and policy.samples[2] == []
    assert not policy.provisional[2]  # a seed is not drafted once more to be timed steadily
    policy.observe_pass(2, 0.3)  # the first steady pass: replaces the seed, 2.5x it (no burst)
    assert policy.pass_cost[2] == 0.3 and policy.samples[2] == [0.3] and policy.timed_at[2] == 2
    policy.observe_pass(2, 0.9)  # now a burst against the steady timing: not kept
    assert policy.samples[2] == [0.3]
    # a policy that drafted already is not climbing when seeded later
    late = DraftPolicy(PolicySettings(n_max=2))
    late.observe_result(1, 1)
    late.seed(1, 0.1)
    assert not late.climbing


def test_a_first_rejection_does_not_hold_a_good_drafter_at_the_target_alone() -> None:
    # issue 38 on the Zen 5 (E2B, 2 threads: 1-5 rows 40, 70, 94, 77, 104 ms), Gemma's sampler with rejection:
    # right 0.84, 0.86, 0.81, 0.8 of the time, the first answer at each depth wrong (the even streams). The
    # climb's first draft (3, the best length on trust) is rejected at depth 1: 0.25 (0.56 one standard error
    # up: nothing pays). The first probe (pass 8, 3 drafts) is right: 0.51, 0.80 one standard error up, where 3
    # drafts would pay. Explored while depth 1 was tried fewer than 7 times, the policy drafts 3 from then on;
    # unexplored, a probe of 3 every 8 passes, it drafts 3 from pass 16 (51 when probes were of the
    # shortest length that could pay, 1 draft)
    zen5 = {1: 0.040, 2: 0.070, 3: 0.094, 4: 0.077, 5: 0.104}
    streams = [Stream(0.84), Stream(0.86), Stream(0.81), Stream(0.8)]
    runs = {}
    for weight in (6.0, 0.0):
        events: list[tuple] = []
        ks, policy = simulate(zen5, 0.0017, streams, 120, seeds=zen5, events=events, results_without_drafts=False,
                              settings=PolicySettings(explore_weight=weight))  # fmt: skip
        yields = pass_yields(events)
        runs[weight] = ("".join(map(str, ks)), sum(t for t, _ in yields) / sum(t for _, t in yields))
    explored, unexplored = runs[6.0], runs[0.0]
    assert explored[0] == "30000000" + "3" * 112
    assert unexplored[0] == "300000003" + "0" * 7 + "3" * 104
    assert round(explored[1], 2) == 37.83 and round(unexplored[1], 2) == 38.15  # tokens/s (the target alone: 25)


def test_exploring_drafts_only_where_nothing_would_be_and_depth_1_is_thin() -> None:
    policy = DraftPolicy(PolicySettings(n_max=3))
    for rows, seconds in {1: 0.040, 2: 0.070, 3: 0.094, 4: 0.077}.items():
        policy.seed(rows, seconds)
    policy.observe_result(1, 0)  # depth 1: (0 + 0.5) / (1 + 1) = 0.25, one standard error 0.306
    assert policy.plausible() == 0.25 + math.sqrt(0.25 * 0.75 / 2)
    assert policy.best(3) == 0 and policy.explore_length(0, 3) == 3  # 1 + 0.556 (1 + 0.5 + 0.25) / 77 ms > 1 / 40
    assert policy.explore_length(0, 2) == 0 and policy.explore_length(1, 3) == 0  # 1-2 drafts cannot; one is drafted
    assert policy.choose(3) == 3 and policy.reason == "exploring: 3 drafts, depth 1 not known yet"
    policy.tried[0] = 6.0  # tried about 7 times: the estimate alone prices drafting
    assert policy.explore_length(0, 3) == 0
    policy.tried[0] = 0.0
    assert policy.plausible() == 1.0  # the prior alone: 0.5 + 0.5, at most 1
    del policy.pass_cost[4]  # a guessed cost is not explored (cost()'s optimism is)
    assert policy.explore_length(0, 3) == 1


def test_a_drafter_step_seeded_at_start_up_prices_the_climb() -> None:
    # issue 39, lavapipe: start-up timed the target's passes but not the drafter's step, so a seeded policy
    # climbed as if steps were free (a step there costs 2x the 1-row pass: no draft can pay). Seeded with the
    # step too, it drafts only at the recheck (pass 32: 2 rows and a step re-timed, one pass: patch 39zc)
    curve, always_right = CURVES["lavapipe"], [Stream(1.0)] * 4
    speeds = {}
    for step_seed in (None, LAVAPIPE_STEP):
        events: list[tuple] = []
        ks, policy = simulate(curve, LAVAPIPE_STEP, always_right, 64, seeds=curve, step_seed=step_seed, events=events)
        seconds = sum(e[2] for e in events if e[0] in ("pass", "steps"))
        speeds[step_seed] = sum(1 + e[2] for e in events if e[0] == "result") / seconds
        assert policy.step_cost == pytest.approx(LAVAPIPE_STEP)
        unseeded, seeded = "13" + "0" * 31 + "1" + "0" * 30, "0" * 31 + "1" + "0" * 32
        assert "".join(map(str, ks)) == (unseeded if step_seed is None else seeded)
    assert events[5] == ("step-seed", 1, LAVAPIPE_STEP)  # after the passes' seeds, before the first choice
    # the target alone: 21.88 tokens/s; unseeded 0.90x of it, seeded 0.98x (the recheck's pass; its two passes
    # before patch 39zc: 19.45 and 20.94)
    assert round(speeds[None], 2) == 19.79 and round(speeds[LAVAPIPE_STEP], 2) == 21.40


@pytest.mark.parametrize("seeded", [False, True])
def test_shadows_replace_the_drafts_that_only_learn(seeded: bool) -> None:
    # E2B's curve, a drafter right 0.45 at every depth (nothing pays), 300 passes: the real drafts of probes,
    # explorations and the first climb (nothing counted yet) become shadows (drafter steps only), told as the
    # streams answer; those left are the optimism's (a row count timed by drafting it) and the re-times'. A failed
    # probe's shadow (2 steps, 4 ms) is within SHADOW_BUDGET of 8 passes (16 ms): the interval stays at 8 (patch
    # 39x; 15 and 16 shadows before, 9.914 and 9.937 tokens/s). A stale row count priced as timed (39z): the
    # only verified drafts left are the unseeded policy's first 2 rows (3-4), none seeded: 9.95 and 9.969 tokens/s
    # (9.876 and 9.889 before, every stale count re-timed); without shadows, a pass of the target alone keeping
    # the probes' count, 9.8 and 9.716 (9.806 before)
    speeds, counts = {}, {}
    for shadow in (False, True):
        events: list[tuple] = []
        settings = PolicySettings(shadow=shadow)
        seeds = CURVES["e2b"] if seeded else None
        ks, policy = simulate(CURVES["e2b"], 0.002, [Stream(0.45)] * 4, 300, events=events, seeds=seeds, settings=settings)
        seconds = sum(e[2] for e in events if e[0] in ("pass", "steps"))
        speeds[shadow] = (len(ks) + sum(e[2] for e in events if e[0] == "result")) / seconds
        counts[shadow] = (sum(ks), sum(1 for e in events if e[0] == "shadow"))
        assert all(e[1] >= 1 and 0 <= e[2] <= e[1] for e in events if e[0] == "shadow")
    assert counts == ({False: (30, 0), True: (0, 40)} if seeded else {False: (19, 0), True: (2, 37)})
    # the target alone: 10.0 tokens/s
    assert (round(speeds[False], 3), round(speeds[True], 3)) == ((9.716, 9.969) if seeded else (9.8, 9.95))


def test_a_shadow_counts_at_half_weight_and_a_probes_sets_the_probe_schedule() -> None:
    policy = DraftPolicy(PolicySettings(n_max=3, shadow=True))
    policy.seed(1, 0.05)  # a failed probe's shadow doubles the interval where its steps cost over SHADOW_BUDGET
    policy.seed_steps(1, 0.0085)  # (0.02) of the interval's passes: 3 steps of 8.5 ms against 16 of 50 ms, 16 ms
    policy.interval, policy.shadow_probe, policy.probe_from = 16, True, 1  # a probe from 1 draft: depth 2 on trust
    policy.observe_shadow(3, 1)  # a probe's: depths 1 and 2 compared, right, then wrong; SHADOW_WEIGHT 0.5 (39y)
    assert policy.tried == [0.5, 0.5, 0.0] and policy.accepted == [0.5, 0.0, 0.0] and policy.interval == 32
    policy.observe_shadow(2, 2, (0.75, 0.5))  # rejection sampling: each depth's sum min(p, q) counted; right, the
    # interval halves to 16, yet no sooner than its 2 steps (17 ms) are SHADOW_BUDGET of the passes: 17 (39zb)
    assert policy.tried == [0.975, 0.975, 0.0] and policy.accepted == [0.85, 0.25, 0.0] and policy.interval == 17
    policy.interval = 16
    policy.shadow_probe = False  # an exploration's (patch 39w): counted, the schedule kept, as a verified one's
    assert not policy.missed
    policy.observe_shadow(1, 0)
    assert policy.tried[0] == pytest.approx(1.42625) and policy.interval == 16
    assert policy.missed and policy.after_miss == [0.0, 0.0]  # a first draft's miss marks the token just given
    # patch 39x: a failed probe's shadow whose steps cost at most SHADOW_BUDGET of the interval's passes keeps
    # the interval (2 steps of 7 ms: 14 ms); dearer, it doubles it (2 of 8.5 ms: 17 ms)
    policy.seed_steps(1, 0.007)
    policy.shadow_probe = True
    policy.observe_shadow(2, 1)  # asked before that miss: not counted after it (patch 39zd; before, it was)
    assert policy.interval == 16 and policy.after_miss == [0.0, 0.0] and not policy.missed
    policy.seed_steps(1, 0.0085)
    policy.shadow_after_miss = True  # asked right after a miss (choose remembers it): depth 1 counted there too
    policy.observe_shadow(2, 1)
    assert policy.interval == 32 and policy.after_miss == [0.5, 0.5]


def test_an_explorations_failed_shadows_leave_the_probes_as_often_as_verified_ones() -> None:
    # E2B as llama-server's start-up timed it (2026-12-05, the `real` pair at Gemma's sampler), a drafter right
    # 0.82, 0.58, 0.66, 0.6 by depth whose first draft is wrong, 190 passes (two prompts of 96 tokens): the
    # explorations of depth 1 are shadows; when each failed one doubled the probe interval (8 to 64 passes)
    # the policy drafted 12 tokens (0.99x the target alone, s26's llama-server cell at 0.96x); scheduled only
    # by probes, as verified explorations are, 198 (1.05x, as with verified probes; fixed n-max 3: 1.12x); with
    # the first climb a shadow and failed probes' shadows within SHADOW_BUDGET leaving the interval at 8 (39x),
    # 455 from pass 37 on (1.10x); shadows at half weight (39y), the early failed shadows weigh less: 497 from
    # pass 23 on (1.105x); 39z's stale pricing: 495 (3 drafts from pass 23, the target alone re-timing its 1 row
    # at 152-153), 1.117x, and verified 480 (1.113x: probes of 3 drafts, judged by the depth on trust)
    card = ZEN5_E2B
    speeds, drafted = {}, {}
    for shadow in (False, True):
        events: list[tuple] = []
        streams = [Stream(0.82), Stream(0.58), Stream(0.66), Stream(0.6)]
        ks, _ = simulate(card, 0.00095, streams, 190, events=events, seeds=card, step_seed=0.00095,
                         settings=PolicySettings(shadow=shadow), results_without_drafts=False)  # fmt: skip
        seconds = sum(e[2] for e in events if e[0] in ("pass", "steps"))
        speeds[shadow] = (len(ks) + sum(e[2] for e in events if e[0] == "result")) / seconds * card[1]
        drafted[shadow] = sum(ks)
    assert drafted == {False: 480, True: 495} and speeds[True] > 1.117 and speeds[False] > 1.112, speeds


def walk_speed(kind: str, start: int) -> tuple[float, list[tuple]]:
    """Tokens/s against the target alone, 190 passes of ``kind``'s full-size pair's walk from axis ``start``,
    shadows told as the engines tell them (:func:`policy_traces.simulate`'s ``live_shadows``)."""
    events: list[tuple] = []
    ks, _ = simulate(ZEN5_E2B, 0.00095, [], 190, events=events, seeds=ZEN5_E2B, step_seed=0.00095,
                     settings=PolicySettings(shadow=True), results_without_drafts=False, walk=(kind, start),
                     live_shadows=True)  # fmt: skip
    seconds = sum(e[2] for e in events if e[0] in ("pass", "steps"))
    return (len(ks) + sum(e[2] for e in events if e[0] == "result")) / seconds * ZEN5_E2B[1], events


def test_right_after_a_miss_a_draft_that_would_not_pay_is_a_shadow() -> None:
    # patch 39y: a_1 0.88 overall pays 3 drafts (4 rows cost 2.2 passes); right after a miss depth 1 is also
    # counted apart, around a_1 at explore_weight (39zd; prior_weight before): the first misses say little yet
    # (drafted again), the fourth that misses come in runs here (0.49 after one), so a shadow goes first until
    # one matches. (Before 39zd, around a_1 at prior_weight, the second miss held drafting back: 0.40.)
    policy = DraftPolicy(PolicySettings(n_max=3, shadow=True))
    for rows, seconds in ZEN5_E2B.items():
        policy.seed(rows, seconds)
    policy.seed_steps(1, 0.00095)
    policy.tried, policy.accepted = [20.0] * 3, [18.0] * 3
    seen = []
    for kept in (0, 0, 0, 0, 0, 1, 3, 0, 3):
        k = policy.choose(99)
        shadow = policy.shadow
        policy.observe_pass(k + 1, ZEN5_E2B[k + 1])
        policy.observe_steps(k + shadow, (k + shadow) * 0.00095)
        if k:
            policy.observe_result(k, kept)
        else:
            policy.observe_shadow(shadow, kept)
        seen.append((k, shadow, policy.missed, round(policy.after_a_miss(), 4)))
    assert seen == [
        (3, 0, True, 0.8381),  # a miss: nothing counted after one yet, so a_1
        (3, 0, True, 0.6835),  # drafted (verified) again: missed, so (0 + 0.7974 * 6) / (1 + 6)
        (3, 0, True, 0.5726),
        (3, 0, True, 0.4893),
        (0, 3, True, 0.4585),  # 3 drafts at 0.49 would not beat the target alone: a shadow, missed
        (0, 3, False, 0.4989),  # a shadow again; its first draft matches
        (3, 0, False, 0.5076),  # verified, all kept
        (3, 0, True, 0.4846),  # a miss after a right pass: verified (the count applies right after a miss only)
        (0, 3, False, 0.5215),  # right after it: a shadow
    ]
    # right after a miss: three verified drafts at weight 1 (each 0), the shadows at half weight: 0, 1, 1
    assert policy.after_miss == pytest.approx([3.8719121875, 0.975])


def test_a_simulated_shadow_is_told_as_the_engines_tell_it() -> None:
    # simulate(live_shadows=True), as llama-server's check_shadow and the Python engine's _check_shadow: the
    # `mixed` walk from axis 4 (right on axes 0-7 of every 12), nothing counted yet, so the first draft is a
    # shadow: 5, 6, 7 all match, told at pass 2 (its last draft's token), none drafted while it is in flight
    # (passes 1 and 2 draw no steps); pass 3 verifies 3 from axis 7 and misses at once (8); right after that
    # miss pass 4's shadow misses at 9, told in its own pass
    events: list[tuple] = []
    ks, _ = simulate(ZEN5_E2B, 0.00095, [], 6, events=events, seeds=ZEN5_E2B, step_seed=0.00095,
                     settings=PolicySettings(shadow=True), results_without_drafts=False, walk=("mixed", 4),
                     live_shadows=True)  # fmt: skip
    told, i = [], -1
    for e in events:
        i += e[0] == "choose"
        if e[0] in ("result", "shadow") or (e[0] == "steps" and e[1]):
            told.append((i, e[0], e[1], e[2] if e[0] != "steps" else None))
    assert ks == [0, 0, 0, 3, 0, 0]
    assert told == [(0, "steps", 3, None), (2, "shadow", 3, 3), (3, "steps", 3, None), (3, "result", 3, 0),
                    (4, "steps", 3, None), (4, "shadow", 3, 0)]  # fmt: skip


def test_where_misses_come_in_runs_drafting_waits_for_a_shadow(monkeypatch) -> None:
    # the `mixed` pair's walk (right on 8 axes of every 12; a kept draft moves it on two axes, so verified
    # drafts linger in the wrong third: shadows matched 0.91, verified drafts 0.36-0.40 on llama-server),
    # 190 passes from each of the 24 axes, on the Zen 5 card, shadows told as the engines tell them (at the pass
    # that shows their first miss): 0.9588x the target alone without patch 39y's rules, 0.9747x with shadows at
    # half weight and a shadow first right after a miss where misses come in runs. The `real` walk 1.0643x ->
    # 1.0689x; an always-right drafter's 1.7215x. (Before 39zd, where a shadow's miss marked every pass until the
    # next draft was counted: 0.9717x, 0.9661x with half weight alone. Told at once, as before: 0.9647x ->
    # 0.9978x, 1.0006x before 39zd; `real` 1.0427x -> 1.0258x.)
    def mean_speed(kind: str) -> float:
        return round(sum(walk_speed(kind, start)[0] for start in range(24)) / 24, 4)

    assert (mean_speed("mixed"), mean_speed("real"), mean_speed("hidden")) == (0.9747, 1.0689, 1.7215)
    monkeypatch.setattr("gguf_exact.engines.shared.draft_policy.SHADOW_WEIGHT", 1.0)  # each rule's part
    assert mean_speed("mixed") == 0.9731
    monkeypatch.setattr(DraftPolicy, "held_back", lambda self, k: False)
    assert (mean_speed("mixed"), mean_speed("real")) == (0.9588, 1.0643)


def test_start_up_seeds_out_of_line_are_forgotten_and_explored() -> None:
    # issue 41 §6: two tiny servers started back to back seeded "1: 0.2 ms, 2: 540.7 ms"; 2 rows at
    # 2700x one row cannot be the pass (r rows cost at most about r passes of one): forgotten, so
    # priced as one row fewer and drafted (timed) at once; 3 rows in line with 1 row are kept
    policy = DraftPolicy(PolicySettings(n_max=2))
    for rows, seconds in ((1, 0.0002), (2, 0.5407), (3, 0.0003)):
        policy.seed(rows, seconds)
    assert policy.pass_cost == {1: 0.0002, 3: 0.0003} and policy.doubted == {1: False, 2: True, 3: False}
    assert policy.choose(2) == 1
    # a second timing as far out of line stands (the machine is so)
    policy.observe_pass(2, 0.5)
    assert policy.pass_cost[2] == 0.5 and policy.doubted[2]
    kept = DraftPolicy(PolicySettings(n_max=2, outlier_ratio=0.0))
    kept.seed(1, 0.0002)
    kept.seed(2, 0.5407)
    assert kept.pass_cost == {1: 0.0002, 2: 0.5407} and kept.choose(2) == 0


def test_the_policy_says_why_it_chose_its_length() -> None:
    policy = DraftPolicy(PolicySettings(n_max=2, outlier_ratio=0.0))
    assert policy.choose(2) == 0 and policy.reason == "timing 1 row"
    policy.observe_pass(1, 0.17)
    policy.observe_pass(1, 0.17)
    policy.seed(2, 3.55)
    assert policy.choose(2) == 0
    assert policy.reason == "priced out: 2 rows cost 3.55 s vs 0.17 s"
    for _ in range(30):
        policy.observe_pass(1, 0.17)
        policy.choose(2)
    assert policy.reason.startswith("priced out")
    policy.observe_pass(1, 0.17)
    assert policy.choose(2) == 1 and policy.reason == "rechecking: priced out for 32 passes"
    snap = policy.snapshot()
    assert snap.reason == policy.reason
    text = snapshot_metrics(snap)
    assert 'llamacpp:spec_draft_reason{reason="rechecking: priced out for 32 passes"} 1' in text
    assert parse_snapshot(parse_metrics(text)) == snap
    low = DraftPolicy(PolicySettings(n_max=1))
    low.observe_pass(1, 0.1)
    low.observe_pass(1, 0.1)
    low.observe_pass(2, 0.11)
    low.observe_pass(2, 0.11)
    for _ in range(40):
        low.observe_result(1, 0)
    assert low.choose(1) == 0 and low.reason.startswith("acceptance too low: ")


def test_a_requests_acceptance_class_is_its_temperature_and_rule() -> None:
    cases = ((0.0, False), (0.0, True), (-1.0, True), (0.8, False), (1.0, True))
    assert [acceptance_class(t, rule) for t, rule in cases] == [
        GREEDY,
        GREEDY,
        GREEDY,
        SAMPLED_EXACT,
        SAMPLED_REJECTION,
    ]


def test_each_acceptance_class_keeps_its_own_counts() -> None:
    policy = DraftPolicy(PolicySettings(n_max=2))
    policy.observe_result(2, 2)  # greedy, the class a policy starts in
    assert policy.set_class(SAMPLED_EXACT) and not policy.set_class(SAMPLED_EXACT)
    assert policy.tried == [0.0, 0.0] and policy.acceptance(1) == 0.5  # never seen: the prior
    policy.observe_result(2, 0)
    assert policy.tried == [1.0, 0.0] and policy.acceptance(1) == 0.25 and policy.missed  # (0 + 0.5) / (1 + 1)
    policy.drafted_after_miss = True  # chosen right after that miss (choose remembers it, patch 39zd)
    policy.observe_result(1, 1)  # right after a miss: depth 1 counted there too (patch 39y), around a_1 at 6
    assert policy.after_miss == [1.0, 1.0] and policy.after_a_miss() == pytest.approx((1.0 + 6 * 1.5 / 2.95) / 7)
    assert policy.set_class(GREEDY)  # its counts as it left them; a miss of another class's text is not this one's
    assert (policy.tried, policy.accepted, policy.acceptance(1)) == ([1.0, 1.0], [1.0, 1.0], 0.75)
    assert policy.parked == {SAMPLED_EXACT: ([1.95, 0.0], [1.0, 0.0], [1.0, 1.0])} and not policy.missed
    with pytest.raises(ValueError, match="unknown acceptance class 'hot'"):
        policy.set_class("hot")


def test_sampled_requests_after_greedy_ones_are_never_drafted_at_a_loss() -> None:
    # issue 38 item 4, E2B's curve: greedy requests (real-like drafter: 3 drafts pay, 11.7 tokens/s
    # expected against the target alone's 10) and sampled ones (exact match right at 0.3: no length
    # pays) in turn, 40 passes each. Told each request's class, the policy prices each by its own counts
    ev_new: list[tuple] = []
    ev_old: list[tuple] = []
    new, _ = class_switches(events=ev_new)
    old, _ = class_switches(events=ev_old, tell_class=False)
    assert new[:40] == old[:40]  # the first greedy request alike
    # the first sampled request: the old policy drafts 3 on the greedy counts until five misses
    # pulled them down; the new one starts from the prior, explores 3 drafts (0.5 one standard
    # error up, 1.0, could pay; rejected, 0.25 + 0.31 could not) and probes
    assert old[40:48] == [3, 3, 3, 3, 3, 3, 0, 0] and new[40:48] == [3] + [0] * 7
    # greedy again: the new policy drafts 3 from its first pass; the old one stays at the target
    # alone (a probe's three drafts at 109 its only drafts)
    assert new[80:120] == [3] * 40 and old[80:120] == [0] * 29 + [3] + [0] * 10
    sampled = [i for i in range(240) if (i // 40) % 2]
    assert sum(new[i] for i in sampled) == 12 and sum(old[i] for i in sampled) == 33
    # tokens and seconds, each pass's accepted drafts + 1 against its pass and drafter steps: the
    # target alone makes 10 tokens/s. Whole run: 1.075x it against 0.958x (a loss); the sampled
    # requests alone 0.938x (three explored drafts, probes of 3, the switches back to one row) against 0.890x
    rates = []
    for ev in (ev_new, ev_old):
        y = pass_yields(ev)
        tokens, seconds = sum(t for t, _ in y), sum(s for _, s in y)
        s_tokens, s_seconds = sum(y[i][0] for i in sampled), sum(y[i][1] for i in sampled)
        rates.append((tokens, round(seconds, 4), s_tokens, round(s_seconds, 4)))
    assert rates == [(422, 39.252, 120, 12.7994), (288, 30.0769, 122, 13.7101)]


@pytest.mark.parametrize("factor", [1.4, 0.75])
def test_a_machine_whose_speed_drifts_is_priced_at_its_speed_now(factor) -> None:
    # the whole machine slower (or faster) from pass 150 on: every row count costs `factor` times as
    # much, so what pays is what paid. Priced at its speed now, the choices are the steady machine's
    # up to the turn and as few after it (probes of one draft: at 0.45 at depth 1 nothing pays). One
    # timing straddles the turn: the probe's 2 rows at pass 150, the first pass at `factor`, against 1
    # row's cost from before it. Slower, drafting looks priced out until a recheck re-times 2 rows (182),
    # by its switch pass (patch 39zc: not drafted once more): 0.1548 s with the 5 ms switch, so one draft on
    # trust, 2 / (0.1548 + 0.002), ties the target alone's 1 / 0.0784 and no probe is drafted (from the
    # steady timing, 2 / 0.1518, each was): only the rechecks draft. Faster, one draft looks cheap and is
    # drafted once (167), which times 2 rows at the speed now
    steady_ks, _ = drift(None)
    ks, policy = drift(factor)
    assert ks[:150] == steady_ks[:150]
    turned = {
        1.4: [(182, 1), (246, 1), (374, 1)],
        0.75: [(166, 1), (167, 1), (175, 1), (183, 1), (199, 1), (207, 1), (223, 1), (255, 1), (271, 1), (303, 1),
               (304, 1), (320, 1), (328, 1), (344, 1), (352, 1), (368, 1)],
    }  # fmt: skip
    assert [(i, k) for i, k in enumerate(ks) if k and i > 150] == turned[factor]
    assert [(i, k) for i, k in enumerate(steady_ks) if k and i > 150] == [
        (166, 1), (174, 1), (190, 1), (198, 1), (214, 1), (222, 1), (238, 1), (270, 1), (286, 1), (287, 1), (319, 1), (383, 1),
    ]  # fmt: skip
    # 2 rows last timed steadily at the speed now (the machine already at `factor`) against 1 row then:
    # priced at 1 row's cost now over 1 row's cost then
    assert policy.ref[2] > 0 and policy.now(2) == policy.pass_cost[2] * policy.pass_cost[1] / policy.ref[2]
    assert policy.now(2) == pytest.approx(0.107 * factor + (E2B_T2_SWITCH if factor > 1 else 0.0))


def test_a_rule_that_prices_each_row_count_as_timed_drafts_where_the_machine_slowed(monkeypatch) -> None:
    # the attack: 2 rows timed before the slowdown against 1 row timed after it make a draft look
    # cheap; priced as timed, the policy drafts where nothing pays (2 drafts at 170-171, then 3),
    # where priced at the speed now it drafts one at most
    assert max(drift(1.4)[0][150:]) == 1
    monkeypatch.setattr(DraftPolicy, "now", lambda self, rows: self.pass_cost[rows])
    ks, _ = drift(1.4)
    assert ks[170:172] == [2, 2] and max(ks[150:]) == 3


def test_one_slow_timing_of_one_row_is_no_speed_to_price_others_by() -> None:
    # 2 rows timed while 1 row's window held one timing only (the start) are priced as timed: a slow
    # first 1-row pass would otherwise make 2 rows look 5x cheaper once 1 row is timed again
    policy = DraftPolicy(PolicySettings(n_max=4))
    policy.observe_pass(1, 0.5)
    policy.observe_pass(1, 0.5)
    policy.observe_pass(2, 0.2)
    assert policy.ref[2] == 0.0
    for _ in range(3):
        policy.observe_pass(1, 0.1)
    assert policy.cost(2) == 0.2
    # once 1 row's window is full, a row count timed then carries its speed (the switch pass to 2 rows is
    # not kept, the steady one after it is)
    policy.observe_pass(2, 0.2)
    policy.observe_pass(2, 0.21)
    assert policy.ref[2] == 0.1 and policy.pass_cost[2] == 0.21
    policy.observe_pass(1, 0.15)  # a switch pass: not kept
    for _ in range(3):
        policy.observe_pass(1, 0.15)
    assert policy.pass_cost[1] == 0.15 and policy.cost(2) == pytest.approx(0.315)


def test_a_drafter_step_dearer_than_a_whole_target_pass_is_doubted_once():
    # patch 39d: llama-server's first drafter call is cold (E2B at 4 users: 48 ms a step, later 1.7; the
    # target's 1-row pass 39 ms). Kept, it priced every probe out beside other slots. A step above the
    # 1-row pass is forgotten once; a second in a row stands; one in line ends the doubt
    policy = DraftPolicy(PolicySettings(n_max=4))
    policy.observe_steps(1, 0.048)  # no 1-row cost known yet: nothing to doubt it by
    assert policy.step_cost == 0.048
    policy = DraftPolicy(PolicySettings(n_max=4))
    for rows, seconds in {1: 0.039, 2: 0.071, 3: 0.093, 4: 0.077, 5: 0.102}.items():
        policy.seed(rows, seconds)
    policy.observe_steps(1, 0.048)
    assert policy.step_cost is None and policy.step_doubted
    policy.observe_steps(4, 4 * 0.0017)
    assert policy.step_cost == pytest.approx(0.0017) and not policy.step_doubted
    policy.observe_steps(1, 0.050)  # doubted, then a second in a row stands (0.2 of the way)
    assert policy.step_cost == pytest.approx(0.0017)
    policy.observe_steps(1, 0.050)
    assert policy.step_cost == pytest.approx(0.0017 + 0.2 * (0.050 - 0.0017))


def test_the_python_twin_chooses_llama_servers_k_on_a_recorded_real_scale_sampled_run():
    """llama-server's adaptive length (the C++ twin, the 39zb series) at E2B on the `sampled` pair, Gemma's sampler,
    rejection, 12 requests of 96 tokens (results/traces-s33-e2b-sampled-gemma-rejection-fixed-3-beside-adaptive):
    the Python twin, replaying what it was told, chooses its k at every one of the 1,105 passes, and the run is the
    one the docs describe (16 verified passes, 142 shadows, 99 of them of 3 drafts)."""
    folder = Path(__file__).parent.parent / "results" / "traces-s33-e2b-sampled-gemma-rejection-fixed-3-beside-adaptive"
    [(settings, events, chosen)] = read_trace(folder / "policy.adaptive")
    assert (settings.n_max, settings.shadow, len(chosen)) == (4, True, 1105)
    assert replay_python(settings, events) == chosen
    assert Counter(chosen) == {0: 1089, 1: 6, 3: 5, 4: 4, 2: 1}
    assert Counter(e[1] for e in events if e[0] == "shadow") == {3: 99, 1: 43}


@pytest.mark.parametrize(
    ("trace", "chosen_counts", "verified"),
    [
        ("policy.adaptive-greedy", {0: 5, 1: 6, 2: 4, 3: 255, 4: 17}, (282, 847, 847)),
        ("policy.adaptive-gemma-rejection", {0: 5, 1: 6, 2: 4, 3: 172, 4: 85}, (267, 870, 867)),
    ],
)
def test_the_python_twin_chooses_llama_servers_k_on_a_recorded_real_scale_hidden_run(
    trace, chosen_counts, verified
):
    """llama-server with patch 39zc at E2B on the `hidden` pair, greedy and Gemma's sampler with rejection, 12 requests
    of 96 tokens each (results/bench-real-s34-e2b-hidden-39zc: 1.01x fixed n-max 3): the Python twin, replaying what
    it was told, chooses its k at every pass; one shadow (the first draft), then drafts verified at every pass but
    the five of the target alone that start it and time one row."""
    folder = Path(__file__).parent.parent / "results" / "bench-real-s34-e2b-hidden-39zc"
    [(settings, events, chosen)] = [s for s in read_trace(folder / trace) if s[2]]
    assert (settings.n_max, settings.shadow) == (4, True)
    assert replay_python(settings, events) == chosen
    assert Counter(chosen) == chosen_counts
    assert [e[1:3] for e in events if e[0] == "shadow"] == [(1, 1)]
    results = [e for e in events if e[0] == "result"]  # passes that verified drafts, drafts verified, drafts kept
    assert (len(results), sum(e[1] for e in results), sum(e[2] for e in results)) == verified
