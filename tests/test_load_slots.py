"""No slot left behind (issue 39): llama-server at --parallel 4 with 4 clients at once on the tiny
hidden-state pair (every draft accepted by construction). Forks of llama.cpp report slots > 0
accepting almost nothing (a per-slot MTP state mixed up between slots, as in #27572): here every
slot's drafts and acceptance are the one-slot run's, request for request, and every text is the
target alone's (greedy), token for token. The same on lavapipe: tests/test_vulkan_serve.py calls
:func:`four_slots_keep_what_one_slot_does` with the Vulkan profile (`make test-vulkan`)."""

from __future__ import annotations

import subprocess

import pytest
from _llama_server import TEST_SETTINGS, get_json
from policy_traces import read_trace, replay_python
from test_draft_policy_cpp import driver, patched_tree  # noqa: F401  (fixtures: the C++ twin's replay driver)

from gguf_exact.bench.load import client_streams, per_slot
from gguf_exact.bench.real import running
from gguf_exact.engines.shared.http import get_text
from gguf_exact.tiny.hidden_pair import write_hidden_state_pair

# prompts of different lengths: the slots' sequences are never at the same position
PROMPTS = {
    "code": "def f(x): return x + 1",
    "prose": "the quick brown fox",
    "repeat": "abc abc abc",
    "mixed": "print(1) if x: for",
}
N_PREDICT = 64  # long enough that the 4 requests of a wave overlap


@pytest.fixture(scope="module")
def pair(run_dir, tmp_path_factory):
    return write_hidden_state_pair(tmp_path_factory.mktemp("hidden"))


def one_at_a_time(target, drafter, sets, profile: str = "cpu", devices: str | None = None) -> dict:
    """Each prompt once on one slot: ``{prompt: reply}``."""
    with running(target, drafter, "llama-server", [*sets, "parallel=1"], profile, devices) as (launch, _, _):
        replies, _ = client_streams(launch.url, PROMPTS, 1, N_PREDICT, requests=len(PROMPTS))
    assert sorted(r.prompt for r in replies) == sorted(PROMPTS) and not any(r.error for r in replies)
    return {r.prompt: r for r in replies}


@pytest.mark.llama_server
def test_four_slots_at_once_accept_what_one_slot_does_and_keep_the_target_alones_text(pair):
    four_slots_keep_what_one_slot_does(*pair, TEST_SETTINGS)


def four_slots_keep_what_one_slot_does(target, drafter, sets, profile: str = "cpu", devices: str | None = None) -> None:
    """The check, on the build ``profile`` names (``devices``: its Vulkan devices, lavapipe's index)."""
    fixed = (*sets, "spec-draft-n-max=3")
    alone = one_at_a_time(target, None, sets, profile, devices)
    one_slot = one_at_a_time(target, drafter, fixed, profile, devices)
    # one slot: 64 tokens are the prefill's, then 15 passes of 3 drafts + 1, then 2 drafts + 1
    assert {p: (r.draft_n, r.draft_n_accepted) for p, r in one_slot.items()} == {p: (47, 47) for p in PROMPTS}
    assert {p: r.tokens for p, r in one_slot.items()} == {p: r.tokens for p, r in alone.items()}
    with running(target, drafter, "llama-server", [*fixed, "parallel=4", "ctx-size=2048"], profile, devices) as (
        launch,
        _,
        _,
    ):
        replies, _ = client_streams(launch.url, PROMPTS, 4, N_PREDICT, requests=3)
    assert len(replies) == 12 and not any(r.error for r in replies)
    assert [sum(r.client == c for r in replies) for c in range(4)] == [3, 3, 3, 3]
    # every text is the target alone's, and every request drafts and accepts what it did alone
    assert [r.tokens for r in replies] == [alone[r.prompt].tokens for r in replies]
    assert [(r.draft_n, r.draft_n_accepted) for r in replies] == [(47, 47)] * 12
    # all four slots served, each accepting all it drafted: 47 per request it answered
    slots = per_slot(replies)
    assert sorted(slots) == [0, 1, 2, 3]
    served = {s: sum(r.slot == s for r in replies) for s in slots}
    assert slots == {s: (47 * n, 47 * n) for s, n in served.items()} and sum(served.values()) == 12


@pytest.mark.llama_server
def test_four_adaptive_slots_choose_in_the_batch_and_both_twins_replay_each_slots_trace(
    pair,
    driver,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    # issue 39 item 2: with spec-draft-adaptive at --parallel 4 each slot chooses knowing the rows the
    # other slots add to the pass (LLAMA_SPEC_DRAFT_TRACE: "choose LIMIT OTHERS_ROWS OTHERS_TOKENS OTHERS_DRAFTS AFTER", "pass
    # ROWS SECONDS TOTAL"); both twins replaying a slot's trace choose what it chose, pass by pass, and
    # every text is the target alone's
    target, drafter = pair
    alone = one_at_a_time(target, None, TEST_SETTINGS)
    monkeypatch.setenv("LLAMA_SPEC_DRAFT_TRACE", str(tmp_path / "policy"))
    sets = [*TEST_SETTINGS, "spec-draft-adaptive=true", "spec-draft-n-max=3", "parallel=4", "ctx-size=2048"]
    with running(target, drafter, "llama-server", sets) as (launch, _, _):
        replies, _ = client_streams(launch.url, PROMPTS, 4, N_PREDICT, requests=2)
        slots = get_json(launch.url + "/slots")
        status, metrics = get_text(launch.url + "/metrics")
    assert len(replies) == 8 and not any(r.error for r in replies)
    assert [r.tokens for r in replies] == [alone[r.prompt].tokens for r in replies]
    beside, shared, after, drafted = 0, 0, 0, 0
    for slot in range(4):
        [(settings, events, chosen)] = read_trace(tmp_path / f"policy.{slot}")
        assert settings.n_max == 3 and chosen and replay_python(settings, events) == chosen
        with open(tmp_path / f"policy.{slot}") as f:
            out = subprocess.run([str(driver)], stdin=f, capture_output=True, text=True, check=True)
        assert [int(x) for x in out.stdout.split()] == chosen
        beside += sum(1 for e in events if e[0] == "choose" and e[3] > 0)
        shared += sum(1 for e in events if e[0] == "pass" and e[3] > e[1])
        # llama-server writes the batch fields and the generating slots still to choose (0-3 at --parallel 4),
        # and, the tiny target's cells weighing half its weights (serve gives each slot a cache of its own:
        # ServingConfig.kv_unified), the batch's layout: a slot's rows, 0 out of the batch, -1 still to choose
        # (written beside other slots' rows; trailing slots out of the batch left off)
        choices = [e for e in events if e[0] == "choose"]
        assert all(len(e) >= 7 and 0 <= e[6] <= 3 and e[6] <= e[3] for e in choices)
        beside_others = [e for e in choices if e[3] > 0]
        assert beside_others and all(0 < len(e) - 8 <= 4 and e[8:].count(-1) == e[6] + 1 for e in beside_others)
        assert all(r >= -1 for e in beside_others for r in e[8:]) and all(len(e) == 8 for e in choices if e[3] == 0)
        # patch 39v: the others' drafts in all (at least the longest, 0 with it), each drafter call's
        # sequence-steps (at least its steps, at most 4 slots' worth), a step of the 4 slots' sequences timed
        assert all(e[7] >= e[5] and (e[7] == 0) == (e[5] == 0) for e in choices)
        calls = [e for e in events if e[0] == "steps"]
        assert all(len(e) == 4 and e[1] <= e[3] <= 4 * e[1] for e in calls)
        assert [e[3:] for e in events if e[0] == "step-seed"] == [(), (4,)]
        after += sum(1 for e in events if e[0] == "choose" and e[6] > 0)
        drafted += len(calls)
    # choices made beside other slots' rows (some before other slots chose), passes priced by the batch, drafter
    # calls where they were drawn (`drafted`, checked above): not asserted, since the tiny pair's costs as measured
    # decide it. A slot may draw none (since 39x its first draft is a shadow, and beside others it may never pay),
    # and all four drew none in 2 runs of about 45 here (s34); in the one inspected, start-up timed a drafter step
    # at 0.8 of a 1-row pass (0.085 ms against 0.107; 0.73 in a run that drew): no probe paid even on trust.
    # The twins choosing alike at every pass, asserted above, is what this test holds either way.
    assert beside > 0 and shared > 0 and after > 0, (beside, shared, after, drafted)
    policies = [s["draft_policy"] for s in slots]
    assert all(p["batch_rows"] >= p["others_rows"] + 1 >= 1 for p in policies)
    assert status == 200 and "llamacpp:spec_batch_rows " in metrics
    assert sorted(
        line.split("}")[0] for line in metrics.splitlines() if line.startswith("llamacpp:spec_slot_draft_n{")
    ) == [f'llamacpp:spec_slot_draft_n{{slot="{i}"' for i in range(4)]
