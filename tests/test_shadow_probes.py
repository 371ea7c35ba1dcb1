"""Shadows (``spec-draft-shadow``, patch 39u): where the adaptive length drafts nothing, its probes are drafted
and not verified, and compared with the tokens the target samples next, in both engines. The text is the
target alone's (nothing a shadow drafts is verified), each comparison is told the policy once known, and
llama-server's trace replays in both twins."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from policy_traces import read_trace, replay_python
from test_draft_policy_cpp import driver, patched_tree  # noqa: F401  (fixtures: the C++ twin's replay driver)

from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.engines.shared.batch_cost import BatchPolicy
from gguf_exact.engines.shared.draft_policy import PolicySettings
from gguf_exact.tiny.models import TinyTarget, write_tiny_drafter, write_tiny_target
from gguf_exact.tiny.pairs import write_runner_pairs
from gguf_exact.tiny.sampled_pair import write_tiny_pair

PROMPT = "def f(x): return x + 1"
N_PREDICT = 48


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    return write_runner_pairs(tmp_path_factory.mktemp("pairs"))


@pytest.fixture(scope="module")
def wide_random_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The random pair (a drafter all but never right) with a feed-forward 32x as wide (n_ff 8192, 64 MB of
    F32): a pass of its target costs ten drafter steps and more (Zen 5: 1.65 ms against 0.16 ms; 2 rows 1.44x
    1 row, 5 rows 2.2x), so an always-right drafter would pay at any depth and this one at none: the policy
    never drafts for real, yet a probe could pay on any CPU, and it learns by shadows. (On the tiny pairs that
    is timing: their drafter step, 0.07-0.17 ms, against their passes, 0.09-0.38 ms, decides it by microseconds;
    a fresh clone's CI priced every probe out on three servers in a row.)"""
    root = tmp_path_factory.mktemp("wide")
    target = write_tiny_target(root / "target.gguf", spec=TinyTarget(n_ff=8192))
    write_tiny_drafter(root / "drafter-hf")
    return target, convert_drafter(root / "drafter-hf", root / "drafter.gguf", target).path


class EveryThirdShadow(BatchPolicy):
    """Never drafts; every third choice asks for a shadow of 2 drafts, and what the engine tells of each is
    kept. The engine's shadows are under test here, not the policy's choice of them."""

    def choose(self, limit: int, *args, **kwargs) -> int:
        self.calls = getattr(self, "calls", 0) + 1
        self.shadow, self.last_k = (min(2, limit) if self.calls % 3 == 0 else 0), 0
        return 0

    def observe_shadow(self, drafted: int, accepted: int, chances=()) -> None:
        self.told.append((drafted, accepted, tuple(chances)))
        super().observe_shadow(drafted, accepted, chances)


def forced(runner) -> EveryThirdShadow:
    runner.llm.n_max = 4  # before the policy is replaced: a new bound makes a new policy
    policy = EveryThirdShadow(PolicySettings(n_max=4, shadow=True))
    policy.told = []
    runner.llm.draft_length.policy = policy
    return policy


@pytest.mark.bindings
@pytest.mark.parametrize("kind", ["hidden", "mixed"])
def test_the_python_engines_shadows_are_compared_with_the_next_tokens(pairs, kind):
    from gguf_exact.engines.python.runner import Runner

    target, drafter = pairs[kind]
    with Runner(target, drafter, n_ctx=512) as r:
        alone = r.generate(PROMPT, N_PREDICT, 0)
        policy = forced(r)
        shadowed = r.generate(PROMPT, N_PREDICT, 4, adaptive=True)
    assert shadowed.tokens == alone.tokens and shadowed.drafts_generated == 0  # nothing verified
    # a shadow every third pass, each told once its two drafts are compared (at a miss: at once)
    assert len(policy.told) >= N_PREDICT // 3 - 2 and all(d == 2 and c == () for d, _, c in policy.told)
    hits = [a for _, a, _ in policy.told]
    if kind == "hidden":  # always right when fed the right row: every shadow matched, both depths
        assert hits == [2] * len(hits)
    else:  # right part of the time: both outcomes seen
        assert 0 in hits or 1 in hits
        assert any(a > 0 for a in hits)
    assert policy.tried[0] > 0 and policy.accepted[0] <= policy.tried[0]


@pytest.mark.bindings
def test_the_python_engines_shadows_count_rejection_samplings_chances(tmp_path):
    # at Gemma's sampler with the rule on, each depth compared counts sum min(p, q) (p the target's row that
    # sampled the token, q the drafter's row through the request's chain); the text is the target alone's
    # with the same seed: no draft is verified, every token comes from the target's own sampler
    from gguf_exact.engines.python.runner import Runner, Sampling

    target, drafter = write_tiny_pair(tmp_path / "sampled")
    gemma = Sampling(temperature=1.0, top_k=64, top_p=0.95, min_p=0.0, repeat_penalty=1.0, seed=5)
    with Runner(target, drafter, n_ctx=512) as r:
        alone = r.generate(PROMPT, N_PREDICT, 0, sampling=gemma)
        r.llm.rejection_sampling = True
        policy = forced(r)
        shadowed = r.generate(PROMPT, N_PREDICT, 4, sampling=gemma, adaptive=True)
    assert shadowed.tokens == alone.tokens and shadowed.drafts_generated == 0
    assert len(policy.told) >= N_PREDICT // 3 - 2
    for drafted, accepted, chances in policy.told:
        assert drafted == 2 and len(chances) == min(accepted + 1, drafted)
        assert all(0.0 <= c <= 1.0 + 1e-9 for c in chances)
    assert sum(c for *_, chances in policy.told for c in chances) > 0


@pytest.mark.llama_server
def test_llama_servers_shadows_leave_the_text_and_replay_in_both_twins(wide_random_pair, driver, tmp_path, monkeypatch):  # noqa: F811
    # a pair where drafting never pays but a probe could: llama-server's policy learns by shadows (exploring
    # depth 1, then probing), the greedy text is the target alone's, and both twins choose on its trace what it
    # chose
    from _llama_server import TEST_SETTINGS, post_json
    from test_adaptive_server import served

    from gguf_exact.engines.shared.status import stop_server

    target, drafter = wide_random_pair
    body = {"n_predict": N_PREDICT, "return_tokens": True, "cache_prompt": False, "ignore_eos": True, "temperature": 0}
    prompts = (PROMPT, "the quick brown fox", "abc abc abc")
    alone = served(target, None, TEST_SETTINGS, tmp_path, monkeypatch, "alone")
    try:
        want = [post_json(alone.url + "/completion", body | {"prompt": p})["tokens"] for p in prompts]
    finally:
        stop_server(alone.port)
    sets = (*TEST_SETTINGS, "spec-draft-adaptive=true", "spec-draft-n-max=4", "spec-draft-shadow=true")
    # one start-up timing descheduled for 0.2 s on a busy machine could still price drafting out for a whole run
    # (rechecks, no probes); a fresh server's policy starts again: up to 3 servers
    for attempt in range(3):
        trace = tmp_path / f"policy-{attempt}"
        monkeypatch.setenv("LLAMA_SPEC_DRAFT_TRACE", str(trace))
        launch = served(target, drafter, sets, tmp_path, monkeypatch, f"shadow-{attempt}")
        try:
            got = [post_json(launch.url + "/completion", body | {"prompt": p})["tokens"] for p in prompts]
        finally:
            stop_server(launch.port)
        assert got == want
        [(settings, events, chosen)] = read_trace(f"{trace}.0")
        assert settings.shadow and settings.n_max == 4
        with open(f"{trace}.0") as f:
            out = subprocess.run([str(driver)], stdin=f, capture_output=True, text=True, check=True)
        assert [int(x) for x in out.stdout.split()] == chosen == replay_python(settings, events)
        shadows = [e for e in events if e[0] == "shadow"]
        if shadows:
            break
    assert shadows and all(len(e) == 3 and 1 <= e[1] <= 4 and 0 <= e[2] <= e[1] for e in shadows)
