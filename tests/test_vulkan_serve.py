"""The GPU path where there is no GPU: the Vulkan llama-server on a Vulkan device (Mesa's lavapipe,
a CPU-type device llama.cpp hides unless named), through the real profiles, beside the CPU build.

What would break first on a user's card: serve running on the CPU without a word (refused),
layers that do not reach the device (the log says where they went), draft-mtp on an
asynchronous backend giving other text than the target alone (greedy and seeded), acceptance
unlike the CPU's, several slots (-np 2, 4) with prompts of different lengths (the #27572
race), and the memory plan's GPU figures against what llama-server allocates on the device.
`make test-vulkan` (not `make test`: the Vulkan build takes about 35 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from _llama_server import TEST_SETTINGS, free_port, server_binary
from helpers import cli

from gguf_exact.builds.build_probe import probe_device
from gguf_exact.builds.devices import tensor_limit
from gguf_exact.builds.llama_build import find_build
from gguf_exact.engines.device_check import is_software
from gguf_exact.engines.logged_buffers import logged_buffers
from gguf_exact.engines.serve import plan_serve, start_planned
from gguf_exact.engines.shared.http import health
from gguf_exact.engines.shared.memory_plan import MIB, plan_memory
from gguf_exact.engines.shared.profiles import load_profile
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.engines.shared.settings import LOG_FILE, ServeSettings
from gguf_exact.engines.shared.status import stop_server
from gguf_exact.tiny.full_pair import write_pair
from gguf_exact.tiny.pairs import write_runner_pairs

pytestmark = [pytest.mark.vulkan, pytest.mark.llama_server]

LAVAPIPE_ICD = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
PROFILE = "gtx1650ti-vulkan"
# flash attention off: lavapipe (Mesa 22.3.6) crashes in its shader (serve refuses it there: below)
SETS = (*TEST_SETTINGS, "flash-attn=off", "log-verbosity=4")
PROMPTS = ("def f(x): return x + 1", "the quick brown fox", "abc abc abc")
# seeded requests on exact match: the same seed gives the target alone's text (the profile's rejection
# sampling would not; these requests once kept exact match only because ignore_eos is a logit bias)
SEEDED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 11, "speculative.rejection_sampling": False}
N_PREDICT = 24
REQUEST_TIMEOUT_S = 600  # a first request on lavapipe compiles its pipelines: tens of seconds to minutes


@pytest.fixture(scope="module")
def device() -> str | None:
    """What GGML_VK_VISIBLE_DEVICES must name for the Vulkan build to see a device here: None
    where it sees one by itself (a real card), lavapipe's index where there is only lavapipe."""
    build = find_build("vulkan")
    if build is None:
        pytest.fail(
            "the Vulkan llama-server is not built; run `make test-vulkan` (scripts/build-llama-cpp.sh --vulkan)"
        )
    visible, dev = probe_device(build.binary(), "vulkan")
    if dev is None:
        pytest.fail("no Vulkan device here, not even lavapipe; run scripts/install-vulkan-deps.sh")
    return visible


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    return write_runner_pairs(tmp_path_factory.mktemp("pairs"))


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
        return json.loads(r.read())


def complete(url: str, prompt: str, sampling: dict | None = None, n_predict: int = N_PREDICT) -> dict:
    body = {"prompt": prompt, "n_predict": n_predict, "return_tokens": True, "cache_prompt": False, "ignore_eos": True}
    return post(url + "/completion", body | (sampling or {"temperature": 0}))


def answers(url: str, sampling: dict | None = None) -> list[tuple[list[int], int, int]]:
    """(tokens, drafted, accepted) of each prompt."""
    out = []
    for p in PROMPTS:
        r = complete(url, p, sampling)
        out.append((r["tokens"], r["timings"].get("draft_n", 0), r["timings"].get("draft_n_accepted", 0)))
    return out


class Served:
    """A server started through plan_serve/start_planned, as `serve` starts it; stopped on exit."""

    def __init__(self, runs: Path, target, drafter, profile=PROFILE, sets=SETS, vulkan_devices=None):
        settings = ServeSettings(
            target, drafter, profile, overrides=tuple(sets), port=free_port(), runs=runs,
            vulkan_devices=vulkan_devices, no_draft=drafter is None,
        )  # fmt: skip
        self.plan = plan_serve(settings)
        self.started = start_planned(self.plan, detach=True, timeout=600, probe=False)
        self.url, self.runs = self.plan.launch.url, runs

    def log(self) -> str:
        return (self.plan.launch.run_dir / LOG_FILE).read_text()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc) -> None:
        stop_server(self.plan.launch.port, self.runs)


@pytest.fixture(scope="module")
def cpu_answers(pairs, tmp_path_factory) -> dict[str, dict[str, list]]:
    """The CPU build's answers (greedy and seeded) with the drafter, per pair: the reference."""
    server_binary()
    out = {}
    for kind in ("hidden", "mixed"):
        with Served(tmp_path_factory.mktemp(f"cpu-{kind}"), *pairs[kind], profile="cpu") as s:
            out[kind] = {"greedy": answers(s.url), "seeded": answers(s.url, SEEDED)}
    return out


def test_a_vulkan_profile_that_sees_no_device_is_refused(pairs, tmp_path, device):
    """Only lavapipe enumerated (VK_ICD_FILENAMES), GGML_VK_VISIBLE_DEVICES unset: llama.cpp hides it,
    and serve says so in one line instead of serving on the CPU."""
    target, drafter = pairs["hidden"]
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    env |= {"VK_ICD_FILENAMES": str(LAVAPIPE_ICD), "GGUF_EXACT_RUN_DIR": str(tmp_path / "run")}
    r = cli(
        "serve",
        "--profile",
        PROFILE,
        "--model",
        str(target),
        "--draft",
        str(drafter),
        "--port",
        str(free_port()),
        env=env,
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    binary = find_build("vulkan").binary()
    assert re.fullmatch(
        rf"error: {re.escape(str(binary))} \(profile {PROFILE}, build vulkan\) sees no Vulkan device here, so it would run "
        r"every layer on the CPU; vulkaninfo lists GPU0 llvmpipe \(.*\) \(cpu, llvmpipe\): a CPU-type device, which llama.cpp "
        r"hides; pass --vulkan-devices 0 to serve on it \(a software device: slow\), or serve with --profile cpu",
        lines[0],
    ), lines[0]
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("server.pid"))  # nothing started


@pytest.fixture(scope="module")
def vulkan_hidden(pairs, device, tmp_path_factory):
    with Served(tmp_path_factory.mktemp("vk-hidden"), *pairs["hidden"], vulkan_devices=device) as s:
        yield s


def test_target_and_drafter_are_on_the_device(vulkan_hidden):
    log = vulkan_hidden.log()
    assert vulkan_hidden.plan.device is not None and vulkan_hidden.plan.device.backend == "Vulkan"
    offloaded = re.findall(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU", log)
    assert len(offloaded) == 2 and all(a == b for a, b in offloaded), offloaded  # target, then drafter: every layer
    models = logged_buffers(log)
    assert len(models) >= 2 and all("Vulkan0" in m.weights for m in models[:2]), [m.weights for m in models]
    assert "Vulkan0" in models[0].kv and "Vulkan0" in models[0].compute


def test_drafter_text_is_the_target_alones_and_the_cpus(vulkan_hidden, pairs, device, cpu_answers, tmp_path):
    greedy, seeded = answers(vulkan_hidden.url), answers(vulkan_hidden.url, SEEDED)
    with Served(tmp_path, pairs["hidden"][0], None, vulkan_devices=device) as alone:
        want_greedy, want_seeded = answers(alone.url), answers(alone.url, SEEDED)
    assert [a[0] for a in greedy] == [a[0] for a in want_greedy]
    assert [a[0] for a in seeded] == [a[0] for a in want_seeded]
    # the hidden pair has no near-ties (its top logit leads by about 2.7): the CPU gives the same
    assert [a[0] for a in greedy] == [a[0] for a in cpu_answers["hidden"]["greedy"]]
    assert [a[0] for a in seeded] == [a[0] for a in cpu_answers["hidden"]["seeded"]]
    # fed the right hidden row every draft is accepted, on the device as on the CPU
    assert all(drafted > 0 and accepted == drafted for _, drafted, accepted in greedy), greedy
    assert [a[1:] for a in greedy] == [a[1:] for a in cpu_answers["hidden"]["greedy"]]


def test_adaptive_times_its_passes_on_the_device_at_start_up(pairs, device, cpu_answers, tmp_path):
    """The profile's adaptive length with its start-up timing (spec-draft-adaptive-warmup): llama-server
    decodes 1 to 5 rows on the device before any request, seeds the policy with them (its log, /slots)
    and then serves the CPU build's greedy text."""
    sets = (*SETS, "spec-draft-adaptive=true", "spec-draft-n-max=4")  # the profile's warmup stays on
    with Served(tmp_path, *pairs["hidden"], sets=sets, vulkan_devices=device) as s:
        slots = json.loads(urllib.request.urlopen(s.url + "/slots", timeout=60).read())
        greedy = answers(s.url)
        log = s.log()
    timed = re.search(r"verification pass by rows timed at start-up \(([0-9.]+) s\): (.*); a drafter step ([0-9.]+) ms", log)
    assert timed is not None, "no start-up timing in the log"
    rows = [(int(r), float(ms.removesuffix(" ms"))) for r, ms in (x.split(": ") for x in timed.group(2).split(", "))]
    assert [r for r, _ in rows] == [1, 2, 3, 4, 5] and all(ms > 0 for _, ms in rows) and float(timed.group(3)) > 0
    assert slots[0]["draft_policy"]["step_seconds"] == pytest.approx(float(timed.group(3)) / 1000, abs=5e-5)
    assert all("Vulkan0" in m.weights for m in logged_buffers(log)[:2])  # timed where it serves
    assert sorted(slots[0]["draft_policy"]["pass_seconds"]) == ["1", "2", "3", "4", "5"]
    assert [a[0] for a in greedy] == [a[0] for a in cpu_answers["hidden"]["greedy"]]


def test_serve_through_the_profile_names_the_device_and_drafts(pairs, device, tmp_path):
    """`serve --profile gtx1650ti-vulkan --vulkan-devices N` as a user types it: the device line,
    and the probe request (pipelines compiled on a software device's first request) says drafting."""
    target, drafter = pairs["hidden"]
    env = dict(os.environ, GGUF_EXACT_RUN_DIR=str(tmp_path / "run"))
    port = str(free_port())
    sets = [a for s in (*TEST_SETTINGS, "flash-attn=off") for a in ("--set", s)]
    devices = ["--vulkan-devices", device] if device is not None else []
    r = cli(
        "serve",
        "--profile",
        PROFILE,
        "--model",
        str(target),
        "--draft",
        str(drafter),
        "--port",
        port,
        "--detach",
        *devices,
        *sets,
        env=env,
    )
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert re.search(r"^device   Vulkan0: .+ \(\d+ MiB\)", r.stdout, re.MULTILINE), r.stdout
        assert "draft-mtp active: " in r.stdout, r.stdout
        assert "memory plan (GPU" in r.stdout
    finally:
        cli("stop", "--port", port, env=env)


# Prompts of different lengths: several slots' rows in one batch split it into ubatches unevenly.
SLOT_PROMPTS = (
    "a",
    "the quick brown fox jumps over the lazy dog",
    "def f(x):\n    return x + 1\n\nprint(f(2))",
    "abc abc abc abc",
)


def concurrently(url: str, prompts) -> list[dict]:
    """The prompts sent at once, one client thread each; the answers in prompt order."""
    out: list[dict | BaseException] = [RuntimeError("no answer")] * len(prompts)

    def one(i: int, p: str) -> None:
        try:
            out[i] = complete(url, p)
        except BaseException as e:  # noqa: BLE001  (reported below, in the test's thread)
            out[i] = e

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT_S)
    errors = [x for x in out if isinstance(x, BaseException)]
    assert not errors, errors
    return out  # type: ignore[return-value]


# Why several slots may flip a token (ggml-vulkan at the pinned commit): a matrix product of at
# most 8 rows (`mul_mat_vec_max_cols`, ggml-vulkan-types.h), batched over nothing else, runs the
# mat-vec shaders in f32; any other runs the mat-mat shader (`ggml_vk_mul_mat`), whose tiles are
# float16 on a device with fp16 (`device->fp16`; lavapipe has it): its inputs are rounded to 11
# bits. The draft-mtp verification batch is 1 + 2 rows a slot (up to 12 rows with 4 slots), a
# slot still reading its prompt adds more, and the attention products (batched over heads) are
# mat-mat whenever a sequence has 2 rows or more; which rows share a pass is the clients' timing.
# Measured: the same position evaluated in a 1-row and in a 43-to-51-row batch, the gaps between
# its top 3 logits moved by up to 0.011 nats; the random-weight mixed target has top-2 gaps
# below that (the second prompt: 0.0036 at token 3, 0.0016 at token 8), and with 4 slots (and
# now and then 2) those flip. GGML_VK_DISABLE_F16=1 (f32 tiles) keeps every token and count.
NEAR_TIE = 0.02  # nats between the top two logits: about twice the largest move measured
F32_TILES = {"GGML_VK_DISABLE_F16": "1"}


def counts(r: dict) -> tuple[int, int]:
    return r["timings"].get("draft_n", 0), r["timings"].get("draft_n_accepted", 0)


def one_slot_run(
    runs: Path, pairs, device, env: dict[str, str], draft: bool = True, sampling=None, prompts=SLOT_PROMPTS
) -> list[dict]:
    """The mixed pair (or its target alone) at -np 1, the ``prompts`` one after another."""
    target, drafter = pairs["mixed"]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)  # the server inherits it
        with Served(
            runs, target, drafter if draft else None, sets=(*SETS, "ctx-size=2048"), vulkan_devices=device
        ) as s:
            return [complete(s.url, p, sampling) for p in prompts]


@pytest.fixture(scope="module")
def one_slot(pairs, device, tmp_path_factory) -> list[dict]:
    return one_slot_run(tmp_path_factory.mktemp("vk-one-slot"), pairs, device, {})


@pytest.fixture(scope="module")
def one_slot_f32_tiles(pairs, device, tmp_path_factory) -> list[dict]:
    return one_slot_run(tmp_path_factory.mktemp("vk-one-slot-f32"), pairs, device, F32_TILES)


def top2_run(
    runs: Path, pairs, device, env: dict[str, str], prompts=SLOT_PROMPTS
) -> list[tuple[list[int], list[tuple[int, float]]]]:
    """The target alone at -np 1 (one row a pass: the f32 mat-vec path), per SLOT_PROMPTS request:
    its tokens, and for each token of the prefix that llama-server gives probabilities for, the
    runner-up and the top-2 logit gap in nats. (No probabilities for tokens that a draft made,
    hence the target alone; none either for tokens held back as incomplete UTF-8, hence a prefix.)"""
    got = one_slot_run(
        runs, pairs, device, env, draft=False, sampling={"temperature": 0, "n_probs": 2}, prompts=prompts
    )
    out = []
    for r in got:
        top2 = []
        for tok, step in zip(r["tokens"], r["completion_probabilities"]):
            (first, a), (second, b) = [(c["id"], c["logprob"]) for c in step["top_logprobs"]]
            if not first == tok == step["id"]:
                break
            top2.append((second, a - b))
        out.append((r["tokens"], top2))
    return out


@pytest.fixture(scope="module")
def one_slot_top2(pairs, device, tmp_path_factory) -> list[tuple[list[int], list[tuple[int, float]]]]:
    return top2_run(tmp_path_factory.mktemp("vk-top2"), pairs, device, {})


@pytest.fixture(scope="module")
def one_slot_top2_f32_tiles(pairs, device, tmp_path_factory) -> list[tuple[list[int], list[tuple[int, float]]]]:
    return top2_run(tmp_path_factory.mktemp("vk-top2-f32"), pairs, device, F32_TILES)


def run_slots(pairs, device, runs: Path, slots: int, env: dict[str, str]) -> list[dict]:
    """-np ``slots`` with the drafter, one client a prompt, all at once."""
    target, drafter = pairs["mixed"]
    sets = (*SETS, f"parallel={slots}", "ctx-size=2048")  # 2048 cells: every slot holds its request
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        with Served(runs, target, drafter, sets=sets, vulkan_devices=device) as s:
            got = concurrently(s.url, SLOT_PROMPTS[:slots])
            log = s.log()
    assert f"n_slots = {slots}" in log
    assert sum(counts(r)[1] for r in got) > 0  # the drafter is right part of the time
    return got


@pytest.mark.parametrize("slots", [2, 4])
@pytest.mark.parametrize("tiles", ["f32", "f16"])
def test_slots_flip_only_near_ties(pairs, device, tmp_path, request, slots, tiles):
    """-np 2 and 4, clients at once with prompts of different lengths, on the asynchronous backend
    with the #27572 fix (a synchronize before each graph's inputs are set), in f32 mat-mat tiles
    (GGML_VK_DISABLE_F16=1) and in the device's own float16 tiles: each request is its one-slot
    run's (same arithmetic) up to its first token whose top-2 logits are within NEAR_TIE, and
    there, if it leaves, it takes the runner-up; a request that never leaves keeps its draft
    counts too. f32 tiles do not make the arithmetic independent of the batch: a product of at
    most 8 rows runs the mat-vec shader, a larger one the mat-mat shader, which sum in other
    orders, so the 0.0016-nat tie at token 8 of the second prompt flipped at -np 4 in 1 run of 3
    with the fix and 1 of 5 without it (the same token, the same draft counts: not the race).
    (Without the fix, upstream reports acceptance collapsing to 0: docs/building-llama-cpp.md.)"""
    f32 = tiles == "f32"
    one_slot = request.getfixturevalue("one_slot_f32_tiles" if f32 else "one_slot")
    one_slot_top2 = request.getfixturevalue("one_slot_top2_f32_tiles" if f32 else "one_slot_top2")
    assert [tokens for tokens, _ in one_slot_top2] == [r["tokens"] for r in one_slot]  # the drafter's text
    # the 43-character prompt's near-ties in its first 10 tokens: 0.016, 0.0036 and 0.0016 nats
    assert [i for i, (_, gap) in enumerate(one_slot_top2[1][1][:10]) if gap < NEAR_TIE] == [2, 3, 8]
    got = run_slots(pairs, device, tmp_path, slots, F32_TILES if f32 else {})
    for want, have, (_, top2) in zip(one_slot, got, one_slot_top2[:slots]):
        left = near_tie_departure(want["tokens"], have["tokens"], top2)
        if left is None:
            assert counts(have) == counts(want), (counts(have), counts(want))
        else:
            print(f"left at token {left}: {want['tokens'][left]} -> {have['tokens'][left]}, gap {top2[left][1]:.5f}")


def near_tie_departure(want: list[int], have: list[int], top2: list[tuple[int, float]]) -> int | None:
    """Where ``have`` first leaves ``want`` (None: nowhere), failing unless that token's top-2
    gap is below NEAR_TIE and ``have`` took the runner-up there."""
    left = next((i for i, (a, b) in enumerate(zip(want, have, strict=True)) if a != b), None)
    if left is None:
        return None
    assert left < len(top2), f"left at token {left}, past the {len(top2)} tokens with probabilities"
    runner_up, gap = top2[left]
    assert gap < NEAR_TIE, f"left at token {left}, whose top-2 gap is {gap:.5f} nats: no near-tie"
    assert have[left] == runner_up, f"left at token {left} for {have[left]}, not the runner-up {runner_up}"
    return left


def test_a_departure_from_a_wide_gap_or_to_another_token_fails():
    """The checker above, fed what a race would give (no server)."""
    want, top2 = [5, 6, 7, 8], [(9, 0.5), (1, 0.3), (2, 0.004), (3, 0.2)]
    assert near_tie_departure(want, want, top2) is None
    assert near_tie_departure(want, [5, 6, 2, 0], top2) == 2  # the runner-up at a near-tie
    with pytest.raises(AssertionError, match="top-2 gap is 0.30000 nats: no near-tie"):
        near_tie_departure(want, [5, 1, 7, 8], top2)
    with pytest.raises(AssertionError, match="left at token 2 for 4, not the runner-up 2"):
        near_tie_departure(want, [5, 6, 4, 8], top2)
    with pytest.raises(AssertionError, match="past the 2 tokens with probabilities"):
        near_tie_departure(want, [5, 6, 2, 8], top2[:2])


def test_mixed_pair_acceptance_equals_the_cpus(pairs, device, cpu_answers, tmp_path):
    """A drafter right part of the time: per prompt, the same tokens, drafts and accepted drafts as
    the CPU build (tolerance: none; a near-tie that batched Vulkan arithmetic flipped would show here)."""
    with Served(tmp_path, *pairs["mixed"], vulkan_devices=device) as s:
        greedy = answers(s.url)
    assert greedy == cpu_answers["mixed"]["greedy"]


MEMORY_SETS = (
    "flash-attn=off",
    "threads=2",
    "no-warmup=true",
    "log-verbosity=4",
    "spec-draft-adaptive=false",
    "spec-draft-n-max=2",
)


@pytest.mark.parametrize("profile,extra", [("gtx1650ti-vulkan", ()), ("rtx3050", ("build=vulkan",))])
def test_memory_plan_gpu_figures_are_what_the_device_allocates(pairs, device, tmp_path, profile, extra):
    """The plan's device figures against the Vulkan0 buffers llama-server logs at the profile's own
    context and batch sizes (flash attention off: lavapipe): weights per model and KV cache within
    10%, what stays in RAM (the token embeddings) against its CPU_Mapped buffer, the compute
    estimate, which errs high, within 10% (1.04x and 1.02x measured; 1.6x before the scores were
    counted once), and the CPU's compute buffers beside the device's (Vulkan_Host: host memory)
    within 10% (0.99x measured)."""
    table = planned_and_logged(pairs["hidden"], profile, extra, device, tmp_path)
    for what, planned, logged in table:
        if what == "compute buffers":  # an estimate that errs high (measured 1.02-1.04x here)
            assert logged <= planned <= 1.10 * logged, (what, table)
        else:
            assert logged > 0 and abs(planned - logged) <= 0.10 * logged, (what, table)


def planned_and_logged(pair, profile: str, extra, device, tmp_path) -> list[tuple[str, float, float]]:
    """(what, planned MiB, logged MiB) of the pair served on the device with ``profile``'s
    memory settings: the plan made as `serve` makes it, with the device's tensor limit."""
    target, drafter = pair
    prof = load_profile(profile).with_overrides([*extra, *MEMORY_SETS])
    _, dev = probe_device(find_build("vulkan").binary(), "vulkan")
    plan = plan_memory(target, drafter, serving_config(prof, True).memory_inputs(), tensor_limit=tensor_limit(dev))
    with Served(tmp_path, target, drafter, profile=prof, sets=(), vulkan_devices=device) as s:
        models = logged_buffers(s.log())
    item = {i.what: i for i in plan.items}

    def host(m) -> float:
        return sum(v for k, v in m.weights.items() if k.startswith("CPU"))  # CPU_Mapped, CPU_REPACK

    rows = [
        ("target weights", item["target weights"].device_bytes, models[0].weights.get("Vulkan0", 0.0)),
        ("drafter weights", item["drafter weights"].device_bytes, models[1].weights.get("Vulkan0", 0.0)),
        ("KV cache", item["KV cache"].device_bytes, models[0].kv.get("Vulkan0", 0.0)),
        (
            "compute buffers",
            item["compute buffers"].device_bytes,
            sum(m.compute.get("Vulkan0", 0.0) for m in models[:2]),
        ),
        ("target weights in RAM", item["target weights"].host_bytes, host(models[0])),
        ("drafter weights in RAM", item["drafter weights"].host_bytes, host(models[1])),
        # the CPU's compute buffer beside the device's: graph inputs, embeddings' rows, refused heads
        (
            "compute buffers in RAM",
            item["compute buffers"].host_bytes,
            sum(m.compute.get("Vulkan_Host", 0.0) for m in models[:2]),
        ),
    ]
    table = [(what, round(planned / MIB, 3), logged) for what, planned, logged in rows]
    print(profile, table)  # the figures, for docs/building-llama-cpp.md (pytest -s)
    return table


@pytest.fixture(scope="module")
def full_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The full-size E2B pair (262,144-token vocabulary, real widths; hidden-state drafter)."""
    p = write_pair(tmp_path_factory.mktemp("full-pair"), "e2b", "hidden")
    return p.target, p.drafter


@pytest.mark.parametrize("profile,extra", [("gtx1650ti-vulkan", ()), ("rtx3050", ("build=vulkan",))])
def test_at_full_size_the_heads_the_device_refuses_stay_in_ram_as_planned(full_pair, device, tmp_path, profile, extra):
    """At E2B's shape the tied heads' probe op (262,144 x 512 F32 logits, 512 MiB) is over
    lavapipe's 128 MiB maxStorageBufferRange: llama.cpp keeps the target's Q6_K head (mapped,
    no second copy) and the drafter's Q4_0 head and token ordering (repacked) in RAM. The plan
    says so: weights on the device and in RAM, and the KV cache, as logged to 1%; the compute
    estimate within 10%."""
    table = planned_and_logged(full_pair, profile, extra, device, tmp_path)
    got = {what: (planned, logged) for what, planned, logged in table}
    for what in ("target weights", "drafter weights", "KV cache", "target weights in RAM", "drafter weights in RAM"):
        planned, logged = got[what]
        assert logged > 0 and abs(planned - logged) <= 0.01 * logged, (what, table)
    planned, logged = got["compute buffers in RAM"]  # 54.11 / 53.51 and 70.11 / 69.51 measured
    assert logged > 0 and abs(planned - logged) <= 0.10 * logged, table
    # the heads are off the device: without the limit the plan would put 315 + 37 MiB more there
    _, dev = probe_device(find_build("vulkan").binary(), "vulkan")
    if is_software(dev):
        assert got["target weights"][1] < 1100 and got["drafter weights"][1] < 6, table
    planned, logged = got["compute buffers"]
    assert logged <= planned <= 1.10 * logged, table  # an estimate that errs high: 1.005-1.009x measured


def _software(device_visible: str | None) -> bool:
    build = find_build("vulkan")
    _, dev = probe_device(build.binary(), "vulkan")
    return dev is not None and is_software(dev)


def test_flash_attention_on_lavapipe_is_refused_and_why(pairs, device, tmp_path):
    """The profile's flash-attn auto on a software device: serve refuses in one line. Why: the same
    server with -fa on dies (SIGSEGV in libvulkan_lvp.so) on its first request, or one of the next
    few, in most launches; if a newer Mesa stops crashing, this test fails and the refusal can go."""
    if not _software(device):
        pytest.skip(
            "a real Vulkan card here: the lavapipe crash does not apply"
        )  # the only skip: a card, not a missing build
    target, drafter = pairs["hidden"]
    env = dict(os.environ, GGUF_EXACT_RUN_DIR=str(tmp_path / "run"))
    sets = [a for s in TEST_SETTINGS for a in ("--set", s)]
    r = cli(
        "serve",
        "--profile",
        PROFILE,
        "--model",
        str(target),
        "--draft",
        str(drafter),
        "--vulkan-devices",
        device,
        "--port",
        str(free_port()),
        *sets,
        env=env,
    )
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert re.fullmatch(
        r"error: flash-attn auto on Vulkan0: llvmpipe .* \(\d+ MiB\): this software device crashes \(SIGSEGV in libvulkan_lvp.so\) "
        r"on the first request that runs llama.cpp's flash-attention shader; pass --set flash-attn=off to serve on it",
        r.stderr.strip(),
    ), r.stderr
    # the evidence: the target alone, -fa on. The crash is a race in the driver, settled per process: a server
    # dies on its first request, mostly, or a few later (a request answered before the crash came in 3 of 6
    # tries on one machine), or (a Zen 4, 2026-12-05: 4 launches of 15) answers every request, at about 2 s each.
    # So up to 4 launches of up to 8 requests of growing length, within a minute each, until one dies
    outcomes: list[int | str] = []
    while len(outcomes) < 4 and -signal.SIGSEGV not in outcomes:
        outcomes.append(_flash_attention_outcome(target, device, tries=8, seconds=60))
    assert outcomes[-1] == -signal.SIGSEGV, f"lavapipe answered with flash attention in every launch: {outcomes}"


def _flash_attention_outcome(target: Path, device: str, tries: int, seconds: float) -> int | str:
    """The exit status of a Vulkan llama-server with -fa on after up to ``tries`` requests (or "answered N")."""
    port = free_port()
    cmd = [str(find_build("vulkan").binary()), "--model", str(target), "--port", str(port), "-ngl", "99", "-fa", "on",
           "-c", "512", "-t", "2", "-b", "64", "-ub", "64", "--no-warmup"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=dict(os.environ, GGML_VK_VISIBLE_DEVICES=device), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            if health(url) == "ok":
                break
            time.sleep(0.2)
        deadline, answered = time.monotonic() + seconds, 0
        while answered < tries and time.monotonic() < deadline:
            try:
                complete(url, "One, two, three, " * (1 + answered % 8), n_predict=4 + answered % 5)
            except OSError:
                return proc.wait(timeout=60)  # the connection died with the server
            answered += 1
        return f"answered {answered}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_context_beyond_the_devices_memory_is_said_before_starting(pairs, device, tmp_path):
    """The memory plan held against the memory the Vulkan device reports (nvidia-smi knows no
    lavapipe, and gtx1650ti-vulkan names no memory_mib): a context that cannot fit is one line
    before anything starts, not a draft context that fails to allocate later (llama.cpp #24758)."""
    target, drafter = pairs["hidden"]
    settings = ServeSettings(
        target, drafter, PROFILE, overrides=(*SETS, "ctx-size=16777216"), port=free_port(), runs=tmp_path,
        vulkan_devices=device,
    )  # fmt: skip
    plan = plan_serve(settings)
    assert plan.device is not None and plan.memory_warning is not None
    text = str(plan.memory_warning)
    assert re.fullmatch(
        rf"the plan needs [0-9,.]+ MiB on the GPU but Vulkan0 \(.+, as llama-server reports it\) has {plan.device.total_mib:,} MiB: "
        r"llama-server may fail to load or run out of memory; lower ctx-size.* or n-gpu-layers",
        text,
    ), text
    assert plan.memory.device_bytes > plan.device.total_mib * MIB


def test_four_slots_on_the_device_accept_what_one_slot_does_and_keep_the_target_alones_text(device, tmp_path):
    """Issue 39 item 3 on lavapipe: --parallel 4, 4 clients at once, the tiny hidden-state pair (every
    draft accepted by construction): each request drafts and accepts what it did on one slot, and every
    text is the target alone's on this device (tests/test_load_slots.py, the same check on the CPU)."""
    from test_load_slots import four_slots_keep_what_one_slot_does

    from gguf_exact.tiny.hidden_pair import write_hidden_state_pair

    target, drafter = write_hidden_state_pair(tmp_path)
    four_slots_keep_what_one_slot_does(target, drafter, SETS, PROFILE, device)
