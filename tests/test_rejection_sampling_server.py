"""Speculative sampling in llama-server (--spec-rejection-sampling, patch 38, issue 38) on the tiny
hidden pair, through the HTTP API: the first two or three generated tokens of seeded requests follow
the target alone's joint distribution, computed exactly from its own rows (llama-server without a
drafter, n_probs over every candidate after its chain) and compared by the G-test at the 1e-4 level; at
temperature 1 the rule accepts more drafts than exact match; greedy text is the target alone's;
a chain the drafter cannot mirror keeps exact match and is counted on /metrics.

The pair is the far kind: its drafter is sure of one token (q 0.95) that the target, at temperature
1, gives 0.17 or about 0.016, so most drafts are rejected and the residual max(0, p - q) draws the
token. A request with ``n_predict`` k + 1 drafts k tokens after the first (llama-server keeps one
token of the budget for the pass's own), so the cases with three tokens verify depths 1 and 2."""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from _llama_server import TEST_SETTINGS, free_port, server_binary
from goodness_of_fit import chi2_threshold, g_test

from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.python.engine import MtpLlama
from gguf_exact.engines.shared.http import get_metrics
from gguf_exact.engines.shared.settings import CONSOLE_FILE, LOG_FILE, ServeSettings
from gguf_exact.engines.shared.status import stop_server
from gguf_exact.tiny.pairs import write_runner_pairs

pytestmark = [pytest.mark.llama_server, pytest.mark.bindings]

CLIENTS = 1  # one at a time: on 2 busy cores, parallel slots were slower (the compute threads spin)
SETTINGS = (*TEST_SETTINGS, "spec-rejection-sampling=true", f"parallel={CLIENTS}", "spec-draft-n-max=3")
N_SAMPLES = 6_000
ACCEPTANCE_RUNS = 200  # seeded 32-token requests per rule
VOCAB, EOG = 320, {2}  # the tiny vocabulary's size and its end-of-generation token (checked)
PROMPT = b"hello world"
UNTRUNCATED = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
# (sampler, the request's speculative.n_max, tokens compared)
CASES = {
    "t1 untruncated, n_max 1": (UNTRUNCATED, 1, 2),
    "t0.7 top-k 20, n_max 3": ({"temperature": 0.7, "top_k": 20, "top_p": 1.0, "min_p": 0.0}, 3, 3),
    "t1 top-p 0.9, n_max 3": ({"temperature": 1.0, "top_k": 0, "top_p": 0.9, "min_p": 0.0}, 3, 3),
    # a logit bias is one stateless sampler of the chain, so p and q (a clone of the chain) both hold it:
    # ignore_eos bans the end-of-generation token (one drawn would be a cell the target cannot reach:
    # G infinite) and "the" is pushed up 20-fold (before top-k, as the chain runs); the target alone is
    # asked with the same fields
    "t0.7 top-k 20, ignore_eos and a logit bias, n_max 3": (
        {"temperature": 0.7, "top_k": 20, "top_p": 1.0, "min_p": 0.0, "ignore_eos": True, "logit_bias": [["the", 3.0]]},
        3,
        3,
    ),
}
ACCEPTED, DRAFTED = "llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_draft_tokens_total"
RULE, FALLBACKS = "llamacpp:spec_rejection_requests_total", "llamacpp:spec_rejection_fallbacks_total"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return write_runner_pairs(tmp_path_factory.mktemp("pairs"))["hidden"]


@pytest.fixture(scope="module")
def prompt(pair) -> list[int]:
    llm = MtpLlama(pair[0], None, n_ctx=256, n_threads=1)
    try:
        assert llm.n_vocab() == VOCAB and [
            t for t in range(VOCAB) if llama_cpp.llama_vocab_is_eog(llm.vocab_handle, t)
        ] == sorted(EOG)
        return llm.tokenize(PROMPT)
    finally:
        llm.close()


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    server_binary()
    launch = served(pair[0], pair[1], tmp_path_factory.mktemp("run"))
    yield launch
    stop_server(launch.port, root=launch.run_dir.parent)


@pytest.fixture(scope="module")
def alone(pair, tmp_path_factory):
    """The target without a drafter: the reference."""
    launch = served(pair[0], None, tmp_path_factory.mktemp("alone"))
    yield launch
    stop_server(launch.port, root=launch.run_dir.parent)


def served(target: Path, drafter: Path | None, run: Path):
    with pytest.MonkeyPatch.context() as env:  # the module's server outlives a test's monkeypatch
        env.setenv("GGUF_EXACT_RUN_DIR", str(run))
        launch = plan_launch(ServeSettings(target, drafter, "cpu", list(SETTINGS), port=free_port()))
        start_server(launch, detach=True, timeout=120)
    return launch


def metrics(launch) -> dict[str, float]:
    return get_metrics(launch.url)


def completions(launch, bodies: list[dict]) -> list[list[int]]:
    """Each body's generated token ids, ``CLIENTS`` requests at a time on kept-alive connections."""

    def run(share: list[dict]) -> list[list[int]]:
        conn = http.client.HTTPConnection(launch.host, launch.port, timeout=120)
        out = []
        for body in share:
            conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
            answer = conn.getresponse()
            raw = answer.read()
            assert answer.status == 200, raw[:300]
            out.append(json.loads(raw)["tokens"])
        conn.close()
        return out

    shares = [bodies[i::CLIENTS] for i in range(CLIENTS)]
    with ThreadPoolExecutor(CLIENTS) as pool:
        done = list(pool.map(run, shares))
    tokens: list[list[int]] = [[] for _ in bodies]
    for i, share in enumerate(done):
        tokens[i::CLIENTS] = share
    return tokens


def bodies(prompt: list[int], sampler: dict, n_max: int, depth: int, n: int, **extra) -> list[dict]:
    # no ignore_eos but where a case asks (a logit bias: its own case)
    base = {"prompt": prompt, "n_predict": depth + 1, "return_tokens": True, "speculative": {"n_max": n_max}}
    return [base | sampler | {"seed": seed} | extra for seed in range(n)]


def target_cells(alone, prompt: list[int], sampler: dict, depth: int, n: int) -> dict[tuple[int, ...], float]:
    """The target alone's probability of each first ``depth`` tokens: each row's distribution is
    what llama-server without a drafter samples it from (``n_probs`` over every candidate, after
    its chain: its own tie order, where the tiny target's logits tie at a top-k or top-p cut). A
    prefix expected fewer than 5 times in ``n`` is one cell (the G-test pools such cells anyway),
    as is one that ends in an end-of-generation token."""
    cells: dict[tuple[int, ...], float] = {}
    conn = http.client.HTTPConnection(alone.host, alone.port, timeout=120)

    def row(prefix: tuple[int, ...]) -> list[dict]:
        body = {"prompt": [*prompt, *prefix], "n_predict": 1, "n_probs": VOCAB, "post_sampling_probs": True}
        for seed in range(50):  # a token that ends inside a UTF-8 character comes without its probabilities
            conn.request("POST", "/completion", json.dumps(body | sampler | {"seed": seed}))
            answer = json.loads(conn.getresponse().read())
            if answer.get("completion_probabilities"):
                return answer["completion_probabilities"][0]["top_probs"]
        raise AssertionError(f"no probabilities for the row after {prefix} in 50 draws")

    def walk(prefix: tuple[int, ...], mass: float) -> None:
        if len(prefix) == depth or (prefix and (prefix[-1] in EOG or mass * n < 5)):
            cells[prefix] = mass
            return
        for c in row(prefix):
            walk((*prefix, c["id"]), mass * c["prob"])

    walk((), 1.0)
    conn.close()
    return cells


def g_of(samples: list[list[int]], cells: dict[tuple[int, ...], float]) -> tuple[float, int]:
    counts = dict.fromkeys(cells, 0)
    unreachable = 0
    for tokens in samples:
        key = next((tuple(tokens[:i]) for i in range(1, len(tokens) + 1) if tuple(tokens[:i]) in cells), None)
        if key is None:
            unreachable += 1
        else:
            counts[key] += 1
    observed = np.array([*counts.values(), unreachable], dtype=float)
    expected = np.array([*cells.values(), 0.0])
    return g_test(observed, expected / expected.sum())


@pytest.mark.parametrize("case", CASES)
def test_the_first_tokens_follow_the_target(server, alone, prompt, case):
    sampler, n_max, depth = CASES[case]
    before = metrics(server)
    t = time.perf_counter()
    samples = completions(server, bodies(prompt, sampler, n_max, depth, N_SAMPLES))
    seconds = time.perf_counter() - t
    after = metrics(server)
    cells = target_cells(alone, prompt, sampler, depth, N_SAMPLES)
    g, df = g_of(samples, cells)
    drafted, accepted = (after[k] - before.get(k, 0.0) for k in (DRAFTED, ACCEPTED))
    print(
        f"{case}: G {g:.1f}, df {df}, threshold {chi2_threshold(df):.1f}, {len(cells)} cells; "
        f"accepted {accepted:.0f}/{drafted:.0f}; {N_SAMPLES} requests in {seconds:.1f} s"
    )
    # every request went by the rule, and drafted (the draft is what the rule verifies)
    assert after[RULE] - before.get(RULE, 0.0) == N_SAMPLES and after.get(FALLBACKS, 0.0) == before.get(FALLBACKS, 0.0)
    assert drafted >= N_SAMPLES * (depth - 1) * 0.95 and 0 < accepted < drafted
    assert df >= 30 and g < chi2_threshold(df), (g, df, chi2_threshold(df))
    if "logit_bias" in sampler:  # the test can tell: the same samples are not the unbiased target's
        unbiased = {k: v for k, v in sampler.items() if k not in ("logit_bias", "ignore_eos")}
        g_u, df_u = g_of(samples, target_cells(alone, prompt, unbiased, depth, N_SAMPLES))
        print(f"  against the target without the bias: G {g_u:.1f}, df {df_u}")  # inf: tokens it cannot draw
        assert g_u == float("inf") or g_u > chi2_threshold(df_u), (g_u, df_u)


def test_the_rule_accepts_more_than_exact_match_at_temperature_1(server, prompt):
    # sum_x min(p(x), q(x)) against p(argmax q): where the drafter's sure token is one the target
    # gives little, only the rule keeps a draft drawn elsewhere in q (at the first depth, after the
    # prompt, the drafter's token is the target's top one and the two rules keep about as much)
    rates = {}
    for on in (True, False):
        before = metrics(server)
        extra = {"speculative": {"n_max": 3, "rejection_sampling": on}}
        completions(
            server, [b | {"n_predict": 32} for b in bodies(prompt, UNTRUNCATED, 3, 2, ACCEPTANCE_RUNS, **extra)]
        )
        after = metrics(server)
        rates[on] = tuple(after[k] - before.get(k, 0.0) for k in (ACCEPTED, DRAFTED))
    print(
        f"accepted {rates[True][0]:.0f}/{rates[True][1]:.0f} by the rule, {rates[False][0]:.0f}/{rates[False][1]:.0f} on exact match"
    )
    assert rates[True][0] / rates[True][1] > 1.3 * rates[False][0] / rates[False][1]


def test_greedy_text_is_the_target_alones_and_other_chains_keep_exact_match(server, alone, prompt):
    body = {"prompt": prompt, "n_predict": 40, "return_tokens": True, "temperature": 0}
    ours, want = completions(server, [body])[0], completions(alone, [body])[0]
    assert ours == want and len(ours) > 0
    before = metrics(server)
    completions(server, [body | {"temperature": 0.7, "repeat_penalty": 1.1, "seed": 1}])
    completions(server, [body | {"temperature": 0.7, "seed": 1, "speculative.rejection_sampling": False}])
    after = metrics(server)
    assert after[FALLBACKS] - before.get(FALLBACKS, 0.0) == 1 and after[RULE] == before[RULE]
    log = "".join((server.run_dir / f).read_text(errors="replace") for f in (LOG_FILE, CONSOLE_FILE))
    assert "spec-rejection-sampling: this request keeps exact match: repeat_penalty 1.1 changes the target's" in log
