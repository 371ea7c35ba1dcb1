"""The draft / verify / accept / roll-back loop on fake models (no llama.cpp)."""

from __future__ import annotations

import pytest

from gguf_exact.speculative.loop import agreeing_prefix, speculate


def greedy_next(seq: list[int]) -> int:
    """A deterministic 'target': the next token is a function of the whole sequence."""
    return (sum(seq) * 7 + len(seq)) % 50


class FakeTarget:
    """Keeps its 'KV cache' as a list of tokens; checks every position it is given."""

    def __init__(self) -> None:
        self.kv: list[int] = []
        self.passes: list[int] = []  # batch size of every pass
        self.row = None

    def prefill(self, prompt):
        self.kv = list(prompt)
        self.passes.append(len(prompt))
        self.row = len(prompt) - 1
        return greedy_next(self.kv)

    def verify(self, tokens, pos):
        assert pos == len(self.kv), "verify must start right after the cached positions"
        self.passes.append(len(tokens))
        out = []
        for t in tokens:
            self.kv.append(t)
            out.append(greedy_next(self.kv))
        return out

    def keep(self, n_keep, row):
        assert n_keep <= len(self.kv)
        del self.kv[n_keep:]
        self.row = row


class FakeDrafter:
    """Proposes the target's true continuation, corrupting the ``wrong_at``-th draft of each call."""

    def __init__(self, target: FakeTarget, wrong_at: int | None = None) -> None:
        self.target = target
        self.wrong_at = wrong_at
        self.calls: list[tuple[int, int, int]] = []
        self.proposals: list[list[int]] = []

    def draft(self, token, pos, n):
        assert pos == len(self.target.kv), "a draft starts at the first position not in the cache"
        self.calls.append((token, pos, n))
        seq = self.target.kv + [token]
        out = []
        for i in range(n):
            nxt = greedy_next(seq)
            if i == self.wrong_at:
                nxt = (nxt + 1) % 50
            out.append(nxt)
            seq.append(nxt)
        self.proposals.append(out)
        return out


def reference(prompt, n, stop=()):
    seq, out = list(prompt), []
    while len(out) < n:
        t = greedy_next(seq)
        out.append(t)
        seq.append(t)
        if t in stop:
            break
    return out


PROMPT = [1, 5, 9, 3]


@pytest.mark.parametrize("n_max", [1, 2, 3, 4])
@pytest.mark.parametrize("wrong_at", [None, 0, 1, 2])
def test_output_equals_greedy_and_counters_add_up(n_max, wrong_at):
    t = FakeTarget()
    g = speculate(t, FakeDrafter(t, wrong_at), PROMPT, 40, n_max)
    assert g.tokens == reference(PROMPT, 40)
    assert g.n_tokens == 40
    assert g.drafts_accepted <= g.drafts_generated
    assert g.n_tokens == g.target_passes + g.drafts_accepted
    assert len(t.passes) == g.target_passes
    assert all(p <= n_max + 1 for p in t.passes[1:])
    assert sum(g.accepted_per_round) == g.drafts_accepted
    assert len(t.kv) == len(PROMPT) + g.n_tokens - 1  # every token but the newest is cached
    if wrong_at is None:
        assert g.acceptance_rate == 1.0
        assert g.tokens_per_target_pass > 1.0
    if wrong_at == 0:
        assert g.drafts_accepted == 0 and g.tokens_per_target_pass == 1.0


def test_target_alone_is_one_token_per_pass():
    t = FakeTarget()
    g = speculate(t, None, PROMPT, 10, 3)
    assert g.tokens == reference(PROMPT, 10)
    assert g.target_passes == 10 and g.drafts_generated == 0 and g.acceptance_rate is None
    assert t.passes == [len(PROMPT)] + [1] * 9


@pytest.mark.parametrize("n_predict", [1, 2, 5, 6, 7])
def test_budget_is_never_exceeded(n_predict):
    t = FakeTarget()
    g = speculate(t, FakeDrafter(t), PROMPT, n_predict, 4)
    assert g.tokens == reference(PROMPT, n_predict)


def test_eos_inside_an_accepted_draft_stops_there():
    ref = reference(PROMPT, 40)
    # With n_max 4 and every draft right, pass p emits ref[5p-4 .. 5p]: four drafts, then the
    # target's own token. Pick a first appearance in draft slot 1-3, so drafts follow it.
    j, eos = next((i, tok) for i, tok in enumerate(ref) if i % 5 in (1, 2, 3) and i > 5 and tok not in ref[:i])
    t = FakeTarget()
    d = FakeDrafter(t)
    g = speculate(t, d, PROMPT, 40, 4, stop={eos})
    assert g.tokens == ref[: j + 1] and g.tokens[-1] == eos and g.stopped
    assert g.n_tokens == g.target_passes + g.drafts_accepted
    # the pass that produced EOS carried drafts beyond it: they were dropped, not counted
    assert g.drafts_accepted < g.drafts_generated
    # EOS was proposed by the drafter, agreed by the target, and drafts after it were dropped
    last = d.proposals[-1]
    k = last.index(eos)
    assert k < len(last) - 1 and g.tokens[-(k + 1) :] == last[: k + 1]


def test_eos_first_token():
    first = reference(PROMPT, 1)[0]
    t = FakeTarget()
    g = speculate(t, FakeDrafter(t), PROMPT, 40, 3, stop={first})
    assert g.tokens == [first] and g.stopped and g.target_passes == 1


def test_agreeing_prefix():
    assert agreeing_prefix([], [4]) == 0
    assert agreeing_prefix([1, 2, 3], [1, 2, 9, 7]) == 2
    assert agreeing_prefix([5], [1, 2]) == 0
    assert agreeing_prefix([1, 2], [1, 2, 3]) == 2
