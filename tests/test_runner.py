"""The in-process draft-mtp runner on tiny models in llama.cpp.

Lossless: with the drafter, every token is the target's own choice, greedy and
sampled, for every shipped prompt and n-max 1..4. llama.cpp's CPU kernels do not
compute a row of a batched pass bit for bit as they compute a single-token pass
(flash attention, the F16 KV cache, matmul kernels chosen by batch size), by an
amount that depends on the build's CPU features; where the target's top two choices
are that close, a batched verification may pick the other one, so comparing token
ids with the target run one token per pass cannot be exact on every build.

So :func:`check_lossless` judges a drafted run by the logits it really computed: a
fresh sampler with the run's settings and seed (llama.cpp's own sampler chain,
applied row by row as ``llama_sampler_sample`` does) is given the target's logits
behind each emitted token, in order, and must choose exactly the run's tokens; and
those logits must be the target's at that position: within ``BATCH_NOISE`` of the
target's single-token pass there (0.012 measured at most; another position's
logits differ by whole units). ``test_lossless_check_catches_a_wrong_acceptance``
and ``test_lossless_check_catches_a_wrong_row`` show the check has teeth.
"""

from __future__ import annotations

import ctypes
import os
import resource
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from conftest import GENERATION_JSON_KEYS
from gguf import GGUFReader

from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.engines.python.engine import MtpLlama
from gguf_exact.engines.python.runner import GREEDY, Generation, Runner, Sampling, generate, live_contexts
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.models import (
    TinyDrafter,
    TinyTarget,
    write_tiny_drafter,
    write_tiny_target,
)
from gguf_exact.tiny.pairs import PAIRS, write_runner_pairs

pytestmark = pytest.mark.bindings

BATCH_NOISE = 0.05  # batched vs single-token logits of one position: 0.012 measured at most
N_PREDICT = 64
PROMPTS = load_prompts()


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    return write_runner_pairs(tmp_path_factory.mktemp("pairs"))


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def target_alone_along(r: Runner, prompt: str, spec: Generation, sampling: Sampling) -> tuple[list[int], list]:
    """The target alone, with the same sampler and seed, walked along ``spec``'s tokens
    one token per pass: at each position it samples (one draw, as in any run) and
    records its own choice, then continues with ``spec``'s token. Returns its choices
    and its logits there."""
    own: list[int] = []

    def forced(self, *args, idx=None, **kwargs):
        own.append(original(self, *args, idx=idx, **kwargs))
        return spec.tokens[len(own) - 1]

    original = MtpLlama.sample
    with pytest.MonkeyPatch.context() as m:
        m.setattr(MtpLlama, "sample", forced)
        r.generate(prompt, spec.n_tokens, 0, record_margins=True, sampling=sampling)
    return own, r.llm.last_logits


def choose_along(r: Runner, rows: list[np.ndarray], sampling: Sampling) -> list[int]:
    """What a fresh sampler chain with ``sampling``'s settings and seed chooses from
    ``rows`` in order: llama.cpp's ``llama_sampler_sample`` on a logits row (apply the
    chain to every token's logit, take the selected one, accept it)."""
    llm = r.llm
    if sampling.seed is not None:
        llm.set_seed(sampling.seed)
    chain = llm._init_sampler(**sampling.generate_kwargs())
    chosen = []
    token_data = np.dtype([("id", np.intc), ("logit", np.float32), ("p", np.float32)], align=True)
    for row in rows:
        buf = np.zeros(len(row), dtype=token_data)
        buf["id"], buf["logit"] = np.arange(len(row)), row
        cur = llama_cpp.llama_token_data_array(
            data=buf.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
            size=len(row),
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(chain.sampler, ctypes.byref(cur))
        token = int(cur.data[cur.selected].id)
        llama_cpp.llama_sampler_accept(chain.sampler, token)
        chosen.append(token)
    chain.close()
    return chosen


def generate_lossless_checked(
    r: Runner, prompt: str, n_max: int, sampling: Sampling = GREEDY
) -> tuple[Generation, str | None]:
    spec = r.generate(prompt, N_PREDICT, n_max, record_margins=True, sampling=sampling)
    return spec, check_lossless(r, prompt, spec, r.llm.last_logits, sampling)


def check_lossless(r: Runner, prompt: str, spec: Generation, rows: list, sampling: Sampling = GREEDY) -> str | None:
    """None when the sampler, given ``rows`` (the target's logits behind each of
    ``spec``'s tokens, from ``record_margins``), chooses exactly ``spec``'s tokens, and
    each row is the target's at that position; else why not."""
    for j, (mine, theirs) in enumerate(zip(spec.tokens, choose_along(r, rows, sampling))):
        if mine != theirs:
            gap = float(rows[j][theirs] - rows[j][mine])
            return f"token {j}: {mine}, but the sampler chose {theirs} from the target's logits there (logit gap {gap:.4g})"
    _, single = target_alone_along(r, prompt, spec, sampling)
    for j, (a, b) in enumerate(zip(rows, single)):
        noise = float(np.max(np.abs(a - b)))
        if not noise < BATCH_NOISE:
            return f"token {j}: its logits differ from the target's single-token pass there by {noise:.4g}"
    return None


@pytest.mark.parametrize("pair", PAIRS)
def test_lossless_on_the_prompt_set(pairs, pair):
    target, drafter = pairs[pair]
    problems, exact = [], 0
    with Runner(target, drafter, n_ctx=512) as r:
        for name, text in PROMPTS.items():
            ref = r.target_greedy(text, N_PREDICT)
            assert ref.n_tokens == N_PREDICT and ref.target_passes == N_PREDICT
            for n_max in (1, 2, 3, 4):
                spec, why = generate_lossless_checked(r, text, n_max)
                assert spec.n_tokens == N_PREDICT
                if why:
                    problems.append(f"{name} n_max={n_max}: {why}")
                exact += spec.tokens == ref.tokens
    assert not problems, "; ".join(problems)
    if pair != "mixed":  # top-2 gaps above 2: no room for batch noise
        assert exact == len(PROMPTS) * 4


# No repeat penalty here: its history holds the tokens sampled, so after a near-tie
# parting the target alone's (walked along the drafted run) would differ from the run's.
SAMPLING = Sampling(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1234)


@pytest.mark.parametrize("pair", ["mixed", "hidden"])
def test_seeded_sampling_is_lossless(pairs, pair):
    """llama-cpp-python samples every emitted position once, with the same sampler
    state whether or not drafts were verified in the same pass: same seed, same
    tokens as the target alone, but for near-ties reordered by batched passes."""
    target, drafter = pairs[pair]
    problems, exact = [], 0
    with Runner(target, drafter, n_ctx=512) as r:
        for name, text in PROMPTS.items():
            alone = r.generate(text, N_PREDICT, 0, sampling=SAMPLING)
            other_seed = r.generate(text, N_PREDICT, 0, sampling=Sampling(temperature=0.8, seed=99))
            assert other_seed.tokens != alone.tokens  # the sampler really samples here
            for n_max in (1, 2, 3):
                spec, why = generate_lossless_checked(r, text, n_max, SAMPLING)
                assert spec.drafts_generated > 0 and spec.n_tokens == N_PREDICT
                if why:
                    problems.append(f"{name} n_max={n_max}: {why}")
                exact += spec.tokens == alone.tokens
    assert not problems, "; ".join(problems)
    if pair == "hidden":  # top logit 2.7 above the rest: no near-ties
        assert exact == len(PROMPTS) * 3


def test_seeded_sampling_with_penalties_equals_the_target_alone(pairs):
    sampling = Sampling(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.3, seed=7)
    target, drafter = pairs["hidden"]
    with Runner(target, drafter, n_ctx=512) as r:
        for text in PROMPTS.values():
            alone = r.generate(text, N_PREDICT, 0, sampling=sampling)
            assert len(set(alone.tokens) - set(r.tokenize(" the a of and to in is it on def return x"))) > 0
            for n_max in (1, 3):
                assert r.generate(text, N_PREDICT, n_max, sampling=sampling).tokens == alone.tokens


def run_broken_engine(pairs, monkeypatch, broken_sample) -> tuple[Generation, str | None, int, float, int]:
    """A greedy run on the mixed pair with ``MtpLlama.sample`` replaced by ``broken_sample``
    (given the real one), checked: (the run, the check's answer, the first token the
    sampler does not choose, its logit gap to the target's own choice, that choice)."""
    target, drafter = pairs["mixed"]
    text = PROMPTS["prose"]
    original = MtpLlama.sample
    with Runner(target, drafter, n_ctx=512) as r:
        with monkeypatch.context() as m:
            m.setattr(MtpLlama, "sample", lambda self, *a, **k: broken_sample(original, self, *a, **k))
            bad = r.generate(text, N_PREDICT, 2, record_margins=True)
        rows = r.llm.last_logits
        chosen = choose_along(r, rows, GREEDY)
        j = next(j for j, (a, b) in enumerate(zip(bad.tokens, chosen)) if a != b)
        want = int(np.argmax(rows[j]))  # greedy: the target's own choice
        gap = float(rows[j][want] - rows[j][bad.tokens[j]])
        return bad, check_lossless(r, text, bad, rows), j, gap, want


def test_lossless_check_catches_a_wrong_acceptance(pairs, monkeypatch):
    """An engine that takes a draft token without sampling that row: the sampler, given
    the logits the run computed, chooses otherwise at the first such token."""

    def take_the_draft(original, self, *args, idx=None, **kwargs):
        sampled = original(self, *args, idx=idx, **kwargs)
        return int(self.input_ids[idx + 1]) if idx is not None and idx + 1 < self.n_tokens else sampled

    bad, why, j, gap, want = run_broken_engine(pairs, monkeypatch, take_the_draft)
    assert bad.acceptance_rate == 1.0
    assert gap > 0.5  # far from a near-tie: a wrong token, not batch noise
    assert (
        why
        == f"token {j}: {bad.tokens[j]}, but the sampler chose {want} from the target's logits there (logit gap {gap:.4g})"
    )


def test_lossless_check_catches_a_wrong_row(pairs, monkeypatch):
    """An engine that samples a verification pass's next row instead of the right one
    (an off-by-one in the batch): caught though it accepts drafts by sampling."""

    def next_row(original, self, *args, idx=None, **kwargs):
        shifted = idx + 1 if idx is not None and idx + 1 < self.n_tokens else idx
        return original(self, *args, idx=shifted, **kwargs)

    bad, why, j, gap, want = run_broken_engine(pairs, monkeypatch, next_row)
    assert bad.drafts_generated > 0
    assert (
        why
        == f"token {j}: {bad.tokens[j]}, but the sampler chose {want} from the target's logits there (logit gap {gap:.4g})"
    )


def test_acceptance_with_the_agreeing_drafter(pairs):
    target, drafter = pairs["agreeing"]
    with Runner(target, drafter, n_ctx=512) as r:
        for n_max in (1, 2, 3, 4):
            g = r.generate(PROMPTS["code"], N_PREDICT, n_max)
            assert g.drafts_accepted > 0 and g.acceptance_rate == 1.0
            assert g.tokens_per_target_pass > 1.5
            assert g.mean_accepted_length == pytest.approx(1 + g.drafts_accepted / g.draft_rounds)
        # whatever token the text ends in: the ordered head keeps every token's cluster (issue 24)
        bos = r.llm.token_bos()
        for j in sorted(set(range(r.n_vocab)) - r.stop_tokens):
            g = r.generate([bos, j], 4, 3)
            assert (g.tokens, g.drafts_generated, g.drafts_accepted) == ([j] * 4, 2, 2), j  # the prompt pass gives the first


@pytest.mark.parametrize("pair", PAIRS)
def test_counters_are_consistent(pairs, pair):
    target, drafter = pairs[pair]
    with Runner(target, drafter, n_ctx=512) as r:
        for n_max in (0, 1, 3):
            for n_predict in (1, 2, 17):
                g = r.generate(PROMPTS["repetitive"], n_predict, n_max)
                assert g.n_tokens == n_predict
                assert g.drafts_accepted <= g.drafts_generated <= n_max * (g.target_passes - 1)
                assert g.n_tokens == g.target_passes + g.drafts_accepted
                assert sum(g.accepted_per_round) == g.drafts_accepted and len(g.accepted_per_round) == g.draft_rounds
                assert g.wall_seconds >= g.prefill_seconds > 0 and g.tokens_per_second > 0
                d = g.as_dict()
                assert GENERATION_JSON_KEYS <= set(d)
    if pair == "random":
        assert g.drafts_accepted == 0 and g.acceptance_rate == 0.0


def test_stop_token_in_a_drafting_pass_stops_output_there(pairs):
    """A stop token met in a pass that carried drafts: the output ends at it, equal to
    the target alone with the same stop token, and the runner stays usable.

    (On these tiny pairs an accepted draft always repeats the token before it, so a
    stop token cannot first appear *inside* an accepted draft; that case is covered on
    fake models in test_speculative.py.)"""
    target, drafter = pairs["mixed"]
    text = PROMPTS["prose"]
    with Runner(target, drafter, n_ctx=512) as r:
        free = r.generate(text, N_PREDICT, 4)
        chosen = next(i for i, t in enumerate(free.tokens) if i >= 3 and t not in free.tokens[:i])
        stop = free.tokens[chosen]
        r.stop_tokens = frozenset({stop})
        stopped = r.generate(text, N_PREDICT, 4)
        alone = r.target_greedy(text, N_PREDICT)
        r.stop_tokens = frozenset()
        again = r.generate(text, N_PREDICT, 4)
    assert stopped.tokens == free.tokens[: chosen + 1] and stopped.stopped
    assert stopped.draft_rounds > 0 and stopped.n_tokens == stopped.target_passes + stopped.drafts_accepted
    assert alone.tokens == stopped.tokens and alone.stopped
    assert again.tokens == free.tokens


def test_real_eos_token_stops_generation(pairs):
    target, drafter = pairs["agreeing"]
    with Runner(target, drafter, n_ctx=512) as r:
        assert 2 in r.stop_tokens  # </s> of the tiny vocabulary
        g = r.generate([1, 5, 2], N_PREDICT, 3)  # the agreeing target repeats </s> at once
    assert g.tokens == [2] and g.stopped and g.target_passes == 1


def test_prompt_longer_than_the_context_is_refused(pairs):
    target, drafter = pairs["mixed"]
    with Runner(target, drafter, n_ctx=128) as r:
        long_prompt = "the river ran slowly " * 40
        with pytest.raises(GgufExactError, match=r"the prompt is \d+ tokens, longer than the context of \d+"):
            r.generate(long_prompt, 8, 2)
        with pytest.raises(GgufExactError, match=r"plus n_predict \(300\) exceeds the context of \d+"):
            r.generate("hello", 300, 2)
        with pytest.raises(GgufExactError, match="outside the vocab"):
            r.generate([1, 10_000], 4, 2)
        assert r.generate("hello", 8, 2).n_tokens == 8  # still usable


def test_drafter_of_another_width_is_refused(pairs, tmp_path):
    _, drafter = pairs["random"]
    wide = write_tiny_target(tmp_path / "wide.gguf", spec=TinyTarget(n_embd=256))
    with pytest.raises(  # refused from the GGUF headers, before anything is loaded
        GgufExactError, match=r"embedding_length_out is 128 but the target's gemma4.embedding_length is 256"
    ):
        Runner(wide, drafter)
    assert live_contexts() == 0


def test_drafter_of_another_vocab_size_is_refused(pairs, tmp_path):
    target, _ = pairs["random"]
    big = write_tiny_target(tmp_path / "big-vocab.gguf", spec=TinyTarget(n_vocab=352))
    write_tiny_drafter(tmp_path / "d-hf", spec=TinyDrafter(vocab_size=352))
    other = convert_drafter(tmp_path / "d-hf", tmp_path / "d.gguf", big).path
    with pytest.raises(GgufExactError, match=r"vocabulary differs from the target's \(token count\)"):
        Runner(target, other)
    assert live_contexts() == 0


def test_drafter_with_other_token_texts_is_refused(pairs, tmp_path):
    target, _ = pairs["random"]
    renamed = write_tiny_target(tmp_path / "renamed.gguf")
    reader = GGUFReader(renamed, "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    part = field.parts[field.data[260]]
    assert bytes(part) == "▁the".encode()
    part[-1] = ord("y")  # "▁thy": same length, written through the memory map
    reader.data.flush()
    del reader
    write_tiny_drafter(tmp_path / "d-hf")
    other = convert_drafter(tmp_path / "d-hf", tmp_path / "d.gguf", renamed).path
    with pytest.raises(GgufExactError, match=r"token 260 is b'\\xe2\\x96\\x81thy', not b'\\xe2\\x96\\x81the'"):
        Runner(target, other)
    assert live_contexts() == 0


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def test_fifty_generate_calls_free_everything(pairs):  # Linux: reads /proc/self
    target, drafter = pairs["mixed"]
    assert live_contexts() == 0
    for _ in range(3):  # warm-up: first-call allocations of ggml and Python
        generate(target, "hello", drafter, n_predict=8, n_max=2, n_ctx=256)
    fds, rss = _open_fds(), _rss_mib()
    for i in range(50):
        g = generate(target, PROMPTS["code"], drafter, n_predict=16, n_max=1 + i % 4, n_ctx=256)
        assert g.n_tokens == 16
        assert live_contexts() == 0
    assert _open_fds() <= fds
    assert _rss_mib() - rss < 40, f"RSS grew from {rss:.0f} to {_rss_mib():.0f} MiB over 50 load/generate/free cycles"


def test_runner_closes_on_exit_and_is_idempotent(pairs):
    target, drafter = pairs["mixed"]
    r = Runner(target, drafter, n_ctx=256)
    assert live_contexts() == 2
    r.close()
    r.close()
    assert live_contexts() == 0
    with Runner(target, None, n_ctx=256) as alone:
        assert live_contexts() == 1
        g = alone.generate("hello", 8, n_max=3)  # no drafter: the target alone
        assert g.drafts_generated == 0 and g.target_passes == 8
    assert live_contexts() == 0
