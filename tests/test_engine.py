"""The engine (llama-cpp-python's ``Llama`` with the MTP drafter) on tiny pairs.

- The hidden-state pair shows the drafter is fed the right row: acceptance 1, the
  same counts as llama-server's at n-max 1..3, and about 0 when it is fed a stale row.
- The high-level API (completion, chat through the GGUF's template, streaming,
  stop strings, sampling, grammar, logprobs) gives with the drafter what it gives
  without, and the counters add up.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from _llama_server import TEST_SETTINGS, complete, free_port, server_binary

from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.python.engine import MtpDraftModel
from gguf_exact.engines.python.llama_adapter import greedy_token
from gguf_exact.engines.python.load import load_with_drafter
from gguf_exact.engines.python.runner import Runner
from gguf_exact.engines.shared.engine_options import EngineOptions, server_threads
from gguf_exact.engines.shared.profiles import load_profile
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.engines.shared.settings import ServeSettings
from gguf_exact.engines.shared.status import stop_server
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.hidden_pair import CYCLE, next_in_cycle
from gguf_exact.tiny.pairs import write_runner_pairs

pytestmark = [pytest.mark.bindings, pytest.mark.llama_server]

PROMPTS = load_prompts()
N_PREDICT = 64


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    return write_runner_pairs(tmp_path_factory.mktemp("pairs"))


def acceptance(target: Path, drafter: Path, n_max: int) -> tuple[int, int, list[list[int]]]:
    """(accepted, generated, outputs) over the shipped prompts, in-process."""
    acc = gen = 0
    outs = []
    with Runner(target, drafter, n_ctx=512) as r:
        for text in PROMPTS.values():
            g = r.generate(text, N_PREDICT, n_max)
            acc, gen = acc + g.drafts_accepted, gen + g.drafts_generated
            outs.append(g.tokens)
    return acc, gen, outs


def test_hidden_pair_target_walks_its_cycle(pairs):
    target, _ = pairs["hidden"]
    with Runner(target, None, n_ctx=512) as r:
        ids = r.tokenize(PROMPTS["prose"])
        g = r.generate(ids, 30, 0, record_margins=True)
    expected, last = [], ids[-1]
    for _ in range(30):
        last = next_in_cycle(last)
        expected.append(last)
    assert g.tokens == expected
    assert min(g.margins) > 2.0  # no near-ties: batched and single passes cannot part
    assert g.text.split()[:3] == [c.lstrip("▁") for c in CYCLE][CYCLE.index("▁" + g.text.split()[0]) :][:3]


@pytest.mark.parametrize("n_max", [1, 2, 3])
def test_hidden_pair_acceptance_equals_llama_servers(pairs, n_max, tmp_path, monkeypatch):
    server_binary()
    target, drafter = pairs["hidden"]
    acc, gen, outs = acceptance(target, drafter, n_max)
    assert acc == gen > 0  # fed the right row, every draft is accepted
    monkeypatch.setenv("GGUF_EXACT_RUN_DIR", str(tmp_path / "run"))
    launch = plan_launch(
        ServeSettings(target, drafter, "cpu", [*TEST_SETTINGS, f"spec-draft-n-max={n_max}"], port=free_port())
    )
    start_server(launch, detach=True, timeout=120)
    try:
        answers = [complete(launch.url, text, N_PREDICT) for text in PROMPTS.values()]
    finally:
        stop_server(launch.port)
    server_acc = sum(a["timings"]["draft_n_accepted"] for a in answers)
    server_gen = sum(a["timings"]["draft_n"] for a in answers)
    assert (acc, gen) == (server_acc, server_gen)
    assert outs == [a["tokens"] for a in answers]


def test_wrong_row_drops_acceptance_to_about_zero(pairs, monkeypatch):
    """The fixture sees the bug: fed the hidden state the previous draft started from
    (one position early once every pass advances by one) instead of its own row."""
    target, drafter = pairs["hidden"]
    right = MtpDraftModel.hidden
    kept: dict[str, np.ndarray] = {}

    def stale_row(self, pos):
        now = np.ctypeslib.as_array(right(self, pos), shape=(self.drafter.n_embd,)).copy()
        kept["fed"] = kept.get("previous", now)
        kept["previous"] = now
        return kept["fed"].ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    monkeypatch.setattr(MtpDraftModel, "hidden", stale_row)
    for n_max in (1, 2, 3):
        acc, gen, _ = acceptance(target, drafter, n_max)
        assert gen > 200 and acc / gen < 0.02, (n_max, acc, gen)


def test_stop_token_inside_an_accepted_draft_ends_the_output_there(pairs):
    """With n-max 3 and every draft right, pass p emits tokens 4p-3 .. 4p: three drafts,
    then the target's own. A stop token first met in a draft slot ends the output at
    it; the drafts after it are dropped, not counted."""
    target, drafter = pairs["hidden"]
    with Runner(target, drafter, n_ctx=512) as r:
        free = r.generate(PROMPTS["code"], 40, 3)
        j = next(i for i, t in enumerate(free.tokens) if i % 4 in (1, 2) and i > 4 and t not in free.tokens[:i])
        r.stop_tokens = frozenset({free.tokens[j]})
        stopped = r.generate(PROMPTS["code"], 40, 3)
        alone = r.generate(PROMPTS["code"], 40, 0)
    assert stopped.tokens == free.tokens[: j + 1] == alone.tokens and stopped.stopped
    assert stopped.drafts_accepted < stopped.drafts_generated
    assert stopped.n_tokens == stopped.target_passes + stopped.drafts_accepted


@pytest.mark.parametrize("n_predict", [1, 2, 3, 5, 6, 7])
def test_drafts_never_run_past_the_budget(pairs, n_predict):
    """The hidden pair's drafter is always right, so a draft is dropped only if it was
    drafted past the tokens the caller takes: none may be."""
    target, drafter = pairs["hidden"]
    with Runner(target, drafter, n_ctx=512) as r:
        g = r.generate(PROMPTS["code"], n_predict, 4)
        assert g.n_tokens == n_predict and g.drafts_accepted == g.drafts_generated
        assert (g.drafts_generated > 0) == (n_predict >= 3)
        r.llm.create_completion(PROMPTS["code"], max_tokens=n_predict, temperature=0)
        g = r.llm.last_generation
        assert g.n_tokens == n_predict and g.drafts_accepted == g.drafts_generated


@pytest.fixture(scope="module")
def engines(pairs):
    """The hidden pair with its drafter, and the target alone in plain llama-cpp-python."""
    target, drafter = pairs["hidden"]
    ours = load_with_drafter(target, drafter, n_max=3, adaptive=False, n_ctx=512, n_threads=2)
    plain = llama_cpp.Llama(str(target), n_ctx=512, n_threads=2, flash_attn=True, swa_full=True, verbose=False)
    yield ours, plain
    ours.close()
    plain.close()


def test_completion_greedy_and_seeded_equal_plain_llama(engines):
    ours, plain = engines
    for text in PROMPTS.values():
        for args in ({"temperature": 0}, {"temperature": 0.9, "seed": 5, "repeat_penalty": 1.2}):
            a = ours.create_completion(text, max_tokens=40, **args)
            b = plain.create_completion(text, max_tokens=40, **args)
            assert a["choices"][0]["text"] == b["choices"][0]["text"] and a["usage"] == b["usage"]
            assert ours.last_generation.drafts_accepted > 0
    assert ours.totals.accepted_tokens > 0 and ours.totals.requests >= 8


def llama_cpp_greedy(row: list[float]) -> int:
    """The index llama.cpp's own greedy sampler selects from ``row`` (its candidates in order)."""
    data = (llama_cpp.llama_token_data * len(row))(*[llama_cpp.llama_token_data(i, x, 0.0) for i, x in enumerate(row)])
    cur = llama_cpp.llama_token_data_array(data, len(row), -1, False)
    smpl = llama_cpp.llama_sampler_init_greedy()
    try:
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
    finally:
        llama_cpp.llama_sampler_free(smpl)
    return cur.selected


@pytest.mark.parametrize(
    "row",
    [
        [0.5, 2.0, -1.0, 2.0, 1.0],  # equal maxima: the first
        [3.0, 3.0, 3.0],
        [-np.inf, -np.inf, -np.inf],  # nothing finite: the first
        [1.0, np.inf, 2.0, np.inf],
        [-7.25, -7.0, -7.5],
    ],
)
def test_greedy_token_is_llama_cpps_greedy_sampler(row):
    assert greedy_token(np.array(row, dtype=np.float32)) == llama_cpp_greedy(row)


def test_greedy_token_leaves_a_row_with_a_nan_to_the_sampler():
    # argmax stops at the NaN (1), llama.cpp's scan passes it by (2): the engine asks the sampler
    assert llama_cpp_greedy([1.0, np.nan, 3.0]) == 2 and greedy_token(np.array([1.0, np.nan, 3.0])) is None
    assert llama_cpp_greedy([np.nan, 5.0]) == 0 and greedy_token(np.array([np.nan, 5.0])) is None


def test_plain_greedy_rows_skip_the_sampler_chain(engines, monkeypatch):
    """A greedy request with nothing that changes the row takes each row's token by argmax, never
    through llama.cpp's sampler (which copies the whole row first): the same text as plain
    llama-cpp-python's chain, drafts and all; penalties, a logit_bias or a grammar keep the chain."""
    from llama_cpp import _internals

    ours, plain = engines
    calls = []
    real = _internals.llama_cpp.llama_sampler_sample
    monkeypatch.setattr(_internals.llama_cpp, "llama_sampler_sample", lambda *a: calls.append(1) or real(*a))
    text = PROMPTS["prose"]
    first = ours.tokenize(text.encode())[1]  # a token the prompt holds, biased below
    for args, chain in (
        ({"temperature": 0}, False),
        ({"temperature": 0, "repeat_penalty": 1.1}, True),
        ({"temperature": 0, "logit_bias": {first: 0.5}}, True),
        ({"temperature": 0, "grammar": llama_cpp.LlamaGrammar.from_string("root ::= [a-z ]+")}, True),
    ):
        calls.clear()
        a = ours.create_completion(text, max_tokens=24, **args)
        ours_calls = len(calls)
        b = plain.create_completion(text, max_tokens=24, **args)
        assert a["choices"][0]["text"] == b["choices"][0]["text"] and a["usage"] == b["usage"]
        assert len(calls) > ours_calls if not chain else ours_calls > 0
        assert (ours_calls == 0) == (not chain) and not ours.greedy_alone
        assert ours.last_generation.drafts_generated > 0


def test_streaming_and_stop_strings(engines):
    ours, plain = engines
    whole = ours.create_completion(PROMPTS["prose"], max_tokens=30, temperature=0)["choices"][0]["text"]
    parts = [
        c["choices"][0]["text"]
        for c in ours.create_completion(PROMPTS["prose"], max_tokens=30, temperature=0, stream=True)
    ]
    assert len(parts) > 5 and "".join(parts) == whole
    stop = " " + whole.split()[4]
    cut = ours.create_completion(PROMPTS["prose"], max_tokens=30, temperature=0, stop=[stop])["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == whole[: whole.index(stop)]
    streamed = ours.create_completion(PROMPTS["prose"], max_tokens=30, temperature=0, stop=[stop], stream=True)
    assert "".join(c["choices"][0]["text"] for c in streamed) == cut["text"]


def test_chat_uses_the_gguf_template(engines):
    ours, plain = engines
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    turns = "<start_of_turn>system\nbe brief<end_of_turn>\n<start_of_turn>user\nhello there<end_of_turn>\n<start_of_turn>model\n"
    assert ours.chat_formatter(messages=messages).prompt == "<s>" + turns
    tokens = ours.chat_prompt_tokens(messages)
    assert tokens[0] == ours.token_bos() and tokens.count(ours.token_bos()) == 1
    assert ours.detokenize(tokens[1:]).decode() == " " + turns  # the tokenizer's space prefix after <s>
    for args in ({"temperature": 0}, {"temperature": 1.0, "seed": 11}):
        a = ours.create_chat_completion(messages=messages, max_tokens=24, **args)
        b = plain.create_chat_completion(messages=messages, max_tokens=24, **args)
        assert a["choices"][0]["message"] == b["choices"][0]["message"]
        assert ours.last_generation.drafts_generated > 0 and ours.last_generation.n_prompt == len(
            ours.chat_prompt_tokens(messages)
        )
    chunks = ours.create_chat_completion(messages=messages, max_tokens=24, temperature=0, stream=True)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert (
        text
        == ours.create_chat_completion(messages=messages, max_tokens=24, temperature=0)["choices"][0]["message"][
            "content"
        ]
    )


def test_grammar_constrains_drafted_output(engines):
    ours, plain = engines
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    args = {"max_tokens": 40, "temperature": 0.7, "seed": 3}
    fmt = {"type": "json_object", "schema": schema}
    a = ours.create_chat_completion(messages=[{"role": "user", "content": "n?"}], response_format=fmt, **args)
    b = plain.create_chat_completion(messages=[{"role": "user", "content": "n?"}], response_format=fmt, **args)
    text = a["choices"][0]["message"]["content"]
    assert text == b["choices"][0]["message"]["content"]
    assert isinstance(json.loads(text)["n"], int)


def test_logprobs_need_logits_all(pairs, engines):
    ours, _ = engines
    with pytest.raises(ValueError, match="logprobs need every row's logits kept"):
        ours.create_completion("the", max_tokens=4, logprobs=2)
    target, drafter = pairs["hidden"]
    kept = load_with_drafter(target, drafter, n_max=2, adaptive=False, n_ctx=256, logits_all=True)  # drafts every pass
    plain = llama_cpp.Llama(str(target), n_ctx=256, flash_attn=True, swa_full=True, logits_all=True, verbose=False)
    try:
        a = kept.create_completion(PROMPTS["code"][:60], max_tokens=12, temperature=0, logprobs=2)["choices"][0]
        b = plain.create_completion(PROMPTS["code"][:60], max_tokens=12, temperature=0, logprobs=2)["choices"][0]
        assert kept.last_generation.drafts_accepted > 0
        assert a["text"] == b["text"] and a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
        assert np.allclose(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"], atol=1e-2)
    finally:
        kept.close()
        plain.close()


def test_requests_that_cannot_fit_are_refused_before_streaming(engines):
    ours, _ = engines
    with pytest.raises(ValueError, match=r"Requested tokens \(\d+\) exceed context window of 512"):
        ours.create_completion("abc " * 600, max_tokens=4, stream=True)  # raised here, not at the first chunk
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        ours.create_completion("abc", max_tokens=-3)
    assert ours.create_completion("abc", max_tokens=3, temperature=0)["usage"]["completion_tokens"] == 3


def test_engine_options_follow_the_profiles():
    opts, ignored = serving_config(load_profile("rtx3050"), True).engine_options()
    assert opts == EngineOptions(
        n_ctx=8192,
        n_max=4,
        adaptive=True,
        adaptive_warmup=True,
        shadow=True,
        rejection_sampling=True,
        n_gpu_layers=99,
        n_gpu_layers_draft=-1,
        flash_attn=True,
    )
    assert ignored == []
    assert serving_config(load_profile("gtx1650ti"), True).engine_options()[0].n_max == 4
    cpu = load_profile("cpu").with_overrides(["ctx-size=512", "threads=1", "spec-draft-n-max=3", "mlock=true"])
    opts, ignored = serving_config(cpu, True).engine_options()
    kw = opts.llama_kwargs()
    assert (kw["n_ctx"], kw["n_threads"], kw["n_threads_batch"], opts.n_max, kw["n_gpu_layers"]) == (512, 1, 1, 3, 0)
    assert ignored == ["mlock"]
    with pytest.raises(GgufExactError, match="drafts with the MTP drafter only"):
        serving_config(load_profile("cpu").with_overrides(["spec-type=ngram-simple"]), True).engine_options()
    with pytest.raises(GgufExactError, match="one request at a time"):
        serving_config(load_profile("cpu").with_overrides(["parallel=4"]), True).engine_options()


def test_threads_default_to_llama_servers(pairs, tmp_path, monkeypatch):
    """A profile without threads decodes on llama-server's default threads, one-row passes too
    (llama-cpp-python's own default is cpu_count() // 2 for them: 1 of 2 cores, issue 40): the
    count llama.cpp's own tools print as their default, here and in a loaded engine."""
    import re
    import subprocess

    helped = subprocess.run([server_binary().with_name("llama-bench"), "--help"], capture_output=True, text=True)
    theirs = int(re.search(r"--threads <n>\s+\(default: (\d+)\)", helped.stdout + helped.stderr).group(1))
    assert server_threads() == theirs
    kw = serving_config(load_profile("cpu"), True).engine_options()[0].llama_kwargs()
    assert (kw["n_threads"], kw["n_threads_batch"]) == (theirs, theirs)
    llm = load_with_drafter(*pairs["hidden"], profile="cpu", overrides=["ctx-size=256"])
    try:
        assert (llm.n_threads, llm.n_threads_batch, llm.context_params.n_threads) == (theirs, theirs, theirs)
    finally:
        llm.close()
    kw = serving_config(load_profile("cpu").with_overrides(["threads-batch=3"]), True).engine_options()[0].llama_kwargs()
    assert (kw["n_threads"], kw["n_threads_batch"]) == (theirs, 3)
    # 3 cores of 2 hyperthreads each (sibling masks as Linux writes them), cpu6 missing: 3
    for cpu, mask in enumerate(["03", "03", "0c", "0c", "30", "30"]):
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings").write_text(mask + "\n")
    assert server_threads(tmp_path) == 3
    # no topology (not Linux): llama.cpp's fallback, every logical CPU up to 4, half above
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    assert server_threads(tmp_path / "absent") == 3
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert server_threads(tmp_path / "absent") == 8


def test_load_with_drafter_takes_the_profile(pairs):
    import gguf_exact

    assert gguf_exact.load_with_drafter is load_with_drafter  # the package's entry point
    target, drafter = pairs["hidden"]
    llm = load_with_drafter(target, drafter, profile="cpu", overrides=["ctx-size=768"])
    try:
        assert (llm.n_ctx(), llm.n_max, llm.draft_length.adaptive) == (768, 4, True)
    finally:
        llm.close()
    llm = load_with_drafter(target, drafter, n_max=1, profile="gtx1650ti", overrides=["ctx-size=256", "n-gpu-layers=0"])
    try:
        assert (llm.n_ctx(), llm.n_max) == (256, 1)
        assert isinstance(llm, llama_cpp.Llama)
    finally:
        llm.close()
    with pytest.raises(GgufExactError, match="no such file"):
        load_with_drafter(target, target.parent / "missing.gguf")
