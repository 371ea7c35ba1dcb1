"""The Python engine with the draft length chosen while it runs (spec-draft-adaptive), on the tiny
pairs: text equal to the target alone's, the policy fed this machine's measured costs and the
drafter's hits, a request's own speculative fields, and the figures /metrics shows."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from policy_traces import read_trace, replay_python

from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.engines.python.draft_length import RequestSpeculation, StartUpCosts, request_speculation
from gguf_exact.engines.python.openai_server import metrics_text
from gguf_exact.engines.python.request import CURRENT_REQUEST, CheckedRequest
from gguf_exact.engines.python.runner import Runner, Sampling
from gguf_exact.engines.shared.policy_snapshot import parse_snapshot
from gguf_exact.engines.shared.profiles import load_profile
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.engines.shared.stats import parse_metrics
from gguf_exact.tiny.pairs import write_runner_pairs

pytestmark = [pytest.mark.bindings]

PROMPTS = list(load_prompts().values())
N_PREDICT = 48


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    return write_runner_pairs(tmp_path_factory.mktemp("pairs"))


SEEDED = Sampling(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, seed=7)


# Seeded on the mixed pair, fixed lengths part from the target alone too (batched rows' logits
# differ in the last bits, and sampling reads them): that pair is compared greedy only.
@pytest.mark.parametrize("kind,samplings", [("hidden", (Sampling(), SEEDED)), ("mixed", (Sampling(),))])
def test_adaptive_text_equals_the_target_alone_greedy_and_seeded(pairs, kind, samplings):
    target, drafter = pairs[kind]
    with Runner(target, drafter, n_ctx=512) as r:
        for sampling in samplings:
            for text in PROMPTS[:3]:
                alone = r.generate(text, N_PREDICT, 0, sampling=sampling)
                adaptive = r.generate(text, N_PREDICT, 4, sampling=sampling, adaptive=True)
                assert adaptive.tokens == alone.tokens
                assert adaptive.target_passes <= alone.target_passes


def test_the_policy_sees_this_machines_passes_and_the_drafters_hits(pairs):
    target, drafter = pairs["hidden"]  # always right when drafting
    with Runner(target, drafter, n_ctx=512) as r:
        fixed = r.generate(PROMPTS[0], N_PREDICT, 2)  # fixed length: every pass drafts two (the last what is left)
        policy = r.llm.draft_length.policy
        assert fixed.accepted_per_round[:-1] == [2] * (fixed.draft_rounds - 1)
        assert fixed.drafts_accepted == fixed.drafts_generated
        assert sorted(policy.pass_cost)[-1] == 3 and set(policy.pass_cost) <= {1, 2, 3}  # the prompt is not a pass
        assert policy.step_cost is not None and policy.step_cost > 0
        assert policy.tried[0] > 5 and policy.acceptance(1) > 0.9 and policy.acceptance(2) > 0.9
        r.llm.n_max = 4  # a new bound: estimates start again
        g = r.generate(PROMPTS[1], N_PREDICT, 4, adaptive=True)
        policy = r.llm.draft_length.policy
        assert 1 in policy.pass_cost  # the first pass ran alone and measured one row
        assert g.target_passes == len(g.accepted_per_round) + (g.target_passes - g.draft_rounds)
        snap = r.llm.draft_length.snapshot()
        assert snap is not None and len(snap.acceptance) == 4
        assert snap.draft_n == policy.last_k


def test_the_engines_trace_replays_to_its_own_choices(pairs, tmp_path, monkeypatch):
    # LLAMA_SPEC_DRAFT_TRACE, as llama-server's: the policy's inputs and choices, which the
    # Python twin replays to the same k (the C++ driver reads the same lines)
    monkeypatch.setenv("LLAMA_SPEC_DRAFT_TRACE", str(tmp_path / "policy"))
    target, drafter = pairs["mixed"]
    with Runner(target, drafter, n_ctx=512) as r:
        for text in PROMPTS[:2]:
            r.generate(text, N_PREDICT, 4, adaptive=True)
    settings, events, chosen = read_trace(tmp_path / "policy.0")[-1]  # the bound of 4's policy
    assert settings.n_max == 4 and len(chosen) >= 40 and {e[0] for e in events} >= {"choose", "pass"}
    assert replay_python(settings, events) == chosen


def test_the_policy_is_told_every_pass_a_request_verifies_its_last_too(pairs, tmp_path, monkeypatch):
    # as llama-server's policy is: each request's last pass (no draft follows to tell it) is told when
    # the request ends, so the trace counts what the generations count; a pass cut short inside its
    # run of kept drafts (the client gone) is told what it verified: the tokens given, all kept
    monkeypatch.setenv("LLAMA_SPEC_DRAFT_TRACE", str(tmp_path / "policy"))
    target, drafter = pairs["hidden"]  # always right when drafting
    with Runner(target, drafter, n_ctx=512) as r:
        gens = [r.generate(text, n, 3) for text, n in ((PROMPTS[0], 48), (PROMPTS[1], 30))]
        ids = r._prompt_ids(PROMPTS[2], 64)
        r.llm.reset()
        stream, given = r.llm.generate(ids, max_new_tokens=64, temp=0.0), []
        for token in stream:  # the prompt's pass gives 1, the next 4 (3 drafts kept), the third 2 of its 4
            given.append(token)
            if len(given) == 7:
                break
        stream.close()
        cut = r.llm.last_generation
    settings, events, chosen = read_trace(tmp_path / "policy.0")[-1]  # the bound of 3's policy
    passes = [e for e in events if e[0] == "pass"]
    results = [e[1:3] for e in events if e[0] == "result"]
    # 48 tokens: the prompt's pass, 11 of 4, one of 3; 30: the prompt's, 7 of 4, one of the target alone
    assert [(g.target_passes, g.drafts_generated) for g in gens] == [(13, 35), (9, 21)] and settings.n_max == 3
    assert len(passes) == sum(g.target_passes - 1 for g in (*gens, cut)) == 12 + 8 + 2
    assert results == [(3, 3)] * 11 + [(2, 2)] + [(3, 3)] * 7 + [(3, 3), (2, 2)]
    assert sum(a for _, a in results[:19]) == sum(g.drafts_accepted for g in gens) == 56
    assert cut.accepted_per_round == [3, 1]  # the generation's count: the tokens given less one
    assert cut.tokens == given
    assert replay_python(settings, events) == chosen


def test_a_request_switches_speculation_off_or_bounds_it(pairs):
    target, drafter = pairs["hidden"]
    with Runner(target, drafter, n_ctx=512) as r:
        r.llm.n_max = 3
        for fields, most in (({"speculative.n_max": 0}, 0), ({"speculative.n_max": 1}, 1), ({}, 3)):
            scope = CURRENT_REQUEST.set(CheckedRequest("/v1/completions", fields))
            try:
                res = r.llm.create_completion(PROMPTS[0], max_tokens=24, temperature=0)
            finally:
                CURRENT_REQUEST.reset(scope)
            g = r.llm.last_generation
            assert res["usage"]["completion_tokens"] == 24
            # the hidden drafter is always right: every pass but the budget's last drafts `most`
            assert g.accepted_per_round[:-1] == [most] * (g.draft_rounds - 1)
            assert (g.draft_rounds > 0) == (most > 0)


def test_request_fields_are_checked_as_llama_server_checks_them():
    assert request_speculation({}) == RequestSpeculation()
    assert request_speculation({"speculative.n_max": 2, "speculative.p_min": 0.5, "speculative.adaptive": False}) == (
        RequestSpeculation(2, 0.5, False)
    )
    assert request_speculation({"speculative.n_max": -1}) == (
        "speculative.n_max must be an integer from 0 (no drafts) to 2147483647, got -1",
        "speculative.n_max",
    )
    assert request_speculation({"speculative.p_min": 1.5})[1] == "speculative.p_min"
    assert request_speculation({"speculative.adaptive": "yes"})[1] == "speculative.adaptive"


def test_metrics_show_the_length_the_acceptance_by_depth_and_the_costs(pairs):
    target, drafter = pairs["hidden"]
    with Runner(target, drafter, n_ctx=512) as r:
        assert "llamacpp:spec_draft_n " not in metrics_text(r.llm)  # not adaptive: no such figures
        r.generate(PROMPTS[0], N_PREDICT, 3, adaptive=True)
        snap = parse_snapshot(parse_metrics(metrics_text(r.llm)))
        policy = r.llm.draft_length.policy
    assert snap is not None
    assert snap.draft_n == policy.last_k
    assert snap.acceptance == pytest.approx([policy.acceptance(j) for j in (1, 2, 3)], rel=1e-5)
    assert [rows for rows, _ in snap.pass_seconds] == sorted(policy.pass_cost)


def test_profile_keys_choose_adaptive_or_a_fixed_length():
    cpu = load_profile("cpu")
    opts, _ = serving_config(cpu, True).engine_options()
    assert (opts.adaptive, opts.n_max) == (True, 4)
    pinned, _ = serving_config(cpu.with_overrides(["spec-draft-adaptive=false", "spec-draft-n-max=2"]), True).engine_options()
    assert (pinned.adaptive, pinned.n_max) == (False, 2)
    p_min, _ = serving_config(cpu.with_overrides(["spec-draft-p-min=0.4"]), True).engine_options()
    assert p_min.p_min == 0.4
    # the shipped profiles time the passes at start-up; false is llama-server's default (left out)
    assert opts.adaptive_warmup is True
    assert serving_config(cpu.with_overrides(["spec-draft-adaptive-warmup=false"]), True).engine_options()[0].adaptive_warmup is False


def test_the_warmup_seeds_the_policy_with_this_machines_passes(pairs, tmp_path, monkeypatch):
    # spec-draft-adaptive-warmup: 1 to n_max + 1 rows timed at load, before any request; the
    # policy starts from them (the trace's first events), and a later bound keeps the seeds it has
    monkeypatch.setenv("LLAMA_SPEC_DRAFT_TRACE", str(tmp_path / "policy"))
    target, drafter = pairs["hidden"]
    from gguf_exact.engines.python.load import load_with_drafter

    llm = load_with_drafter(target, drafter, profile="cpu", overrides=["ctx-size=512", "spec-draft-n-max=3"])
    try:
        length = llm.draft_length
        passes, step = length.seeds.passes, length.seeds.step
        assert length.adaptive and sorted(passes) == [1, 2, 3, 4] and all(s > 0 for s in passes.values())
        # a seed out of line with a shorter one (a busy moment on shared cores) is forgotten, the rest price
        doubted = {r for r, d in length.policy.doubted.items() if d}
        assert length.policy.pass_cost == {r: s for r, s in passes.items() if r not in doubted}
        # the drafter step timed too, and priced as timed (not doubted: it is warm)
        assert step is not None and 0 < step < 10 and length.policy.step_cost == step
        assert length.policy.climbing
        assert llm.n_tokens == 0  # the cache emptied: the first request decodes its whole prompt
        settings, events, _ = read_trace(tmp_path / "policy.0")[-1]
        seeds = [("seed", r, s) for r, s in sorted(passes.items())]
        assert settings.n_max == 3 and events == [*seeds, ("step-seed", 1, step)]
        llm.n_max = 2  # a new bound: new estimates, the seeds that fit it kept
        bounded = llm.draft_length.policy
        assert bounded.pass_cost == {r: passes[r] for r in (1, 2, 3) if not bounded.doubted.get(r)}
        assert bounded.step_cost == step
        out = llm.create_completion(PROMPTS[0], max_tokens=24, temperature=0)
        assert out["usage"]["completion_tokens"] == 24
    finally:
        llm.close()
    unseeded = load_with_drafter(
        target, drafter, profile="cpu", overrides=["ctx-size=512", "spec-draft-adaptive-warmup=false"]
    )
    try:
        assert unseeded.draft_length.seeds == StartUpCosts() and unseeded.draft_length.policy.pass_cost == {}
        assert unseeded.draft_length.policy.step_cost is None
    finally:
        unseeded.close()


def test_the_warmup_decodes_on_a_thread_of_its_own_that_ends():
    # llama.cpp's OpenMP CPU backend keeps a team of worker threads per OS thread that computed a
    # graph: passes timed on the loading thread, which lives on beside the serving one, made every
    # later pass 20% slower and drafter steps 3x (E2B, 2-core Xeon). A stand-in for the Llama
    # records where and what it was asked to decode
    from gguf_exact.engines.python.warmup import time_start_up_costs

    class Recorder:
        drafter = None  # no drafter: no step timed (the real one's is test_the_warmup_seeds_the_policy...)

        def __init__(self) -> None:
            self.calls: list[tuple] = []
            self.threads: set[threading.Thread] = set()

        def token_bos(self) -> int:
            return 2

        def decode_batch(self, tokens, n_past, logits_all) -> None:
            self.threads.add(threading.current_thread())
            self.calls.append(("decode", list(tokens), n_past, logits_all))

        def drop_cache_from(self, position: int) -> None:
            self.calls.append(("drop", position))

        def reset(self) -> None:
            self.calls.append(("reset",))

    llm = Recorder()
    costs = time_start_up_costs(llm, 3, repeats=2)  # type: ignore[arg-type]
    assert sorted(costs.passes) == [1, 2, 3] and all(s >= 0 for s in costs.passes.values()) and costs.step is None
    expected = [c for rows in (1, 2, 3) for _ in range(2) for c in (("decode", [2] * rows, 0, True), ("drop", 0))]
    assert llm.calls == [*expected, ("reset",)]
    [worker] = llm.threads
    assert worker is not threading.current_thread() and worker.name == "gguf-exact-pass-timing"
    assert not worker.is_alive()


def test_each_request_names_its_acceptance_class_to_the_policy(pairs, tmp_path, monkeypatch):
    # issue 38 item 4: greedy, sampled with exact match, sampled with spec-rejection-sampling, greedy
    # again; each class's drafts counted apart (the hidden drafter always right greedy, not sampled),
    # the greedy counts kept while the sampled requests ran. The trace says each change ("class"
    # lines, as llama-server's) and replays to the policy's own choices
    target, drafter = pairs["hidden"]
    order = ((Sampling(), False), (SEEDED, False), (SEEDED, True), (Sampling(), True))
    for adaptive in (False, True):
        monkeypatch.setenv("LLAMA_SPEC_DRAFT_TRACE", str(tmp_path / f"policy-{adaptive}"))
        seen = []
        with Runner(target, drafter, n_ctx=512) as r:
            for sampling, rule in order:
                r.llm.rejection_sampling = rule
                r.generate(PROMPTS[0], 24, 3, sampling=sampling, adaptive=adaptive)
                p = r.llm.draft_length.policy
                # copies (they go on counting) of each parked class's tried and accepted (and depth 1 after a miss)
                parked = {c: (list(t), list(a)) for c, (t, a, _after_miss) in p.parked.items()}
                seen.append((p.current_class, list(p.tried), list(p.accepted), parked))
        assert [s[0] for s in seen] == ["greedy", "sampled-exact", "sampled-rejection", "greedy"]
        assert seen[1][3]["greedy"] == (seen[0][1], seen[0][2])  # parked as the first request left it
        assert seen[3][3] == {"sampled-exact": seen[1][1:3], "sampled-rejection": seen[2][1:3]}
        settings, events, chosen = read_trace(tmp_path / f"policy-{adaptive}.0")[-1]  # the bound of 3's
        assert [e[1] for e in events if e[0] == "class"] == ["sampled-exact", "sampled-rejection", "greedy"]
        assert replay_python(settings, events) == chosen
        if not adaptive:  # 3 drafts every pass: every class counted at depth 1
            assert seen[3][1] == seen[3][2] and seen[3][1][0] > seen[0][1][0] > 4  # greedy: all kept
            assert all(a < t for _, tried, accepted, _ in seen[1:3] for a, t in zip(accepted, tried))
        else:  # at most 4 tokens a pass at n-max 3: the trace holds a choice for every pass of the 4 requests
            # (how many passes the policy's timings lead to varies with the machine's load: 50 to over 60 seen)
            assert len(chosen) >= 4 * 24 // 4


