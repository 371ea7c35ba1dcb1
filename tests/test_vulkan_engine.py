"""The Python engine (llama-cpp-python with the MTP drafter) on the Vulkan bindings, on a Vulkan
device (Mesa's lavapipe where there is no card), through the real profile, beside the CPU bindings.

The test process imports the CPU bindings (every other test uses them); the cached Vulkan wheel
is unpacked into a folder of its own (``unpack_wheel``) that only the engine's child processes
put first on ``PYTHONPATH``: ``tests/_engine_child.py`` (``load_with_drafter(profile=...)``, its
tokens and draft counts as JSON) and ``serve --engine python``. The device is made visible as
``serve --vulkan-devices`` makes it (``GGML_VK_VISIBLE_DEVICES``).

What would break first on a user's card: layers that do not reach the device (llama.cpp's own
log says where they went), the drafter's text differing from the target alone's or the CPU's,
acceptance unlike the CPU's, and the engine disagreeing with llama-server on the same device.
Where batched Vulkan arithmetic may flip a near-tie (test_vulkan_serve.py: a product of more
than 8 rows, or an attention product of 2 rows or more a sequence, runs the mat-mat shader, in
float16 tiles on lavapipe): one slot verifies 1 + n-max = 3 rows a pass and reads each prompt in
one batch of at most 64 rows, in the engine as in llama-server. What else differs between the two
graphs was not pinned down; one thing does: the engine keeps the whole sliding-window cache
(``swa_full``, for its roll-backs), 512 cells of which attention reads 256 (``n_kv`` is padded to
256), so the sliding layers' transposed V is a strided view where llama-server's 256-cell cache
gives a contiguous one, and ggml-vulkan picks its matmul path by contiguity. The hidden pair has
no near-ties (its top logit leads by about 2.7) and is held to exact equality; the random-weight
mixed pair to the near-tie rule of the slot tests (``near_tie_departure``: equal up to the first
token whose top-2 gap is under 0.02 nats, the runner-up there; measured: the third prompt leaves
the CPU bindings' and llama-server's text at token 19, a 0.0021-nat tie).
`make test-vulkan`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _llama_server import TEST_SETTINGS, free_port
from test_vulkan_serve import (  # noqa: F401  (device, pairs: the fixtures)
    N_PREDICT,
    PROFILE,
    PROMPTS,
    SEEDED,
    Served,
    answers,
    device,
    near_tie_departure,
    pairs,
    top2_run,
)

from gguf_exact.builds import build_probe
from gguf_exact.builds.bindings_build import find_wheel, unpack_wheel
from gguf_exact.engines.serve import plan_serve, start_planned
from gguf_exact.engines.shared.settings import LOG_FILE, ServeSettings
from gguf_exact.engines.shared.status import stop_server

pytestmark = [pytest.mark.vulkan, pytest.mark.bindings, pytest.mark.llama_server]

CHILD = Path(__file__).with_name("_engine_child.py")
# the llama-server tests' settings (n-max 2 fixed, 64-token batches), flash attention off (lavapipe), exact
# match (seeded text is then the target alone's: in process the profile's knob says it, not a request field)
OVERRIDES = (*TEST_SETTINGS, "flash-attn=off", "spec-rejection-sampling=false")
GREEDY = {"temperature": 0}
ENGINE_SEEDED = {k: v for k, v in SEEDED.items() if not k.startswith("speculative.")}  # create_completion's keywords
KINDS = ("hidden", "mixed")  # a drafter always right (fed the right row), and one right part of the time
CHILD_TIMEOUT_S = 900  # lavapipe compiles each pipeline on its first use, in every new process


@pytest.fixture(scope="module")
def vulkan_site(tmp_path_factory) -> Path:
    """The cached Vulkan wheel, unpacked for the children only."""
    wheel = find_wheel("vulkan")
    if wheel is None:
        pytest.fail(
            "the Vulkan bindings are not built; run `make test-vulkan` (python -m gguf_exact.builds.bindings_build --vulkan)"
        )
    return unpack_wheel(wheel.wheel, tmp_path_factory.mktemp("vulkan-site"))


def child_env(site: Path | None, visible: str | None) -> dict[str, str]:
    """This environment with ``site`` first on PYTHONPATH (None: the CPU bindings) and the device
    made visible as serve makes it."""
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    if visible is not None:
        env["GGML_VK_VISIBLE_DEVICES"] = visible
    return env


def run_engine(tmp_path: Path, env: dict[str, str], target, drafter, profile: str, samplings, verbose=False):
    """(report, stderr) of the engine in a child: each prompt with each sampling."""
    job = {
        "target": str(target), "drafter": str(drafter) if drafter else None, "profile": profile,
        "overrides": list(OVERRIDES), "prompts": list(PROMPTS), "samplings": samplings, "n_predict": N_PREDICT,
        "verbose": verbose,
    }  # fmt: skip
    path = tmp_path / f"job-{len(list(tmp_path.glob('job-*')))}.json"
    path.write_text(json.dumps(job))
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(path)], capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def tokens_and_counts(report: dict) -> list[tuple[list[int], int, int]]:
    return [(a["tokens"], a["drafted"], a["accepted"]) for a in report["answers"]]


@pytest.fixture(scope="module")
def cpu_engine(pairs, tmp_path_factory) -> dict[str, dict]:  # noqa: F811
    """The CPU bindings' answers with the drafter (profile cpu), per pair: greedy and seeded per prompt."""
    tmp = tmp_path_factory.mktemp("cpu-engine")
    return {kind: run_engine(tmp, child_env(None, None), *pairs[kind], "cpu", [GREEDY, ENGINE_SEEDED])[0] for kind in KINDS}


@pytest.fixture(scope="module")
def vulkan_engine(pairs, device, vulkan_site, tmp_path_factory) -> dict[str, tuple[dict, str]]:  # noqa: F811
    """The Vulkan bindings' (report, llama.cpp's log) with the drafter through the profile, per pair."""
    tmp, env = tmp_path_factory.mktemp("vk-engine"), child_env(vulkan_site, device)
    return {kind: run_engine(tmp, env, *pairs[kind], PROFILE, [GREEDY, ENGINE_SEEDED], verbose=True) for kind in KINDS}


def test_the_engine_runs_target_and_drafter_on_the_device(vulkan_engine, vulkan_site):
    report, log = vulkan_engine["hidden"]
    assert report["bindings"].startswith(str(vulkan_site)) and report["backends"] == ["Vulkan"]
    assert len(report["devices"]) == 1 and re.fullmatch(r"Vulkan0: .+ \(\d+ MiB\)", report["devices"][0])
    offloaded = re.findall(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU", log)
    assert len(offloaded) == 2 and all(a == b for a, b in offloaded), offloaded  # target, then drafter: every layer
    weights = re.findall(r"load_tensors: +(\S+) model buffer size", log)
    assert weights.count("Vulkan0") == 2, weights  # each model's layers in a Vulkan0 buffer
    assert re.findall(r"llama_kv_cache: +(\S+) KV buffer size", log)[:1] == ["Vulkan0"], "the target's cache"


def test_the_drafters_text_is_the_target_alones_and_the_cpu_bindings(
    vulkan_engine,
    pairs,  # noqa: F811
    device,  # noqa: F811
    vulkan_site,
    cpu_engine,
    tmp_path,
):
    """Greedy and seeded (temperature 0.8, seed 11): with the drafter, the target alone's tokens on
    the device; the hidden pair has no near-ties (top logit ahead by about 2.7), so the CPU
    bindings' too, with every draft accepted on both."""
    report, _ = vulkan_engine["hidden"]
    alone, _ = run_engine(tmp_path, child_env(vulkan_site, device), pairs["hidden"][0], None, PROFILE, [GREEDY, ENGINE_SEEDED])
    got, want = tokens_and_counts(report), tokens_and_counts(alone)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert all(w[1] == 0 for w in want)
    greedy = got[::2]  # fed the right hidden row every greedy draft is accepted (seeded ones need not be)
    assert all(drafted > 0 and accepted == drafted for _, drafted, accepted in greedy), got
    assert got == tokens_and_counts(cpu_engine["hidden"])


@pytest.fixture(scope="module")
def prompts_top2(pairs, device, tmp_path_factory):  # noqa: F811
    """The mixed target alone on llama-server on the device, -np 1: per prompt its greedy tokens and
    each token's runner-up and top-2 gap (test_vulkan_serve.top2_run)."""
    return top2_run(tmp_path_factory.mktemp("vk-top2-prompts"), pairs, device, {}, prompts=PROMPTS)


def check_near_ties(
    got: list[tuple[list[int], int, int]], want: list[tuple[list[int], int, int]], top2
) -> list[int | None]:
    """Each of ``got`` is ``want``'s up to its first token whose top-2 gap is under NEAR_TIE, where,
    if it leaves, it takes the runner-up (:func:`near_tie_departure`); one that never leaves has
    ``want``'s draft counts too. Where each left (None: nowhere)."""
    out = []
    for have, ref, (_, gaps) in zip(got, want, top2, strict=True):
        n = min(len(have[0]), len(ref[0]))
        left = near_tie_departure(ref[0][:n], have[0][:n], gaps)
        if left is None:
            assert have == ref, (have, ref)
        else:
            print(f"left at token {left}: {ref[0][left]} -> {have[0][left]}, gap {gaps[left][1]:.5f}")
        out.append(left)
    return out


def test_mixed_pair_acceptance_equals_the_cpu_bindings(vulkan_engine, cpu_engine, prompts_top2):
    """A drafter right part of the time, greedy: per prompt, the CPU bindings' tokens, drafts and
    accepted drafts, up to a near-tie. Measured: the third prompt left the CPU's at token 19, for
    the runner-up; llama-server on the device keeps the CPU's there (test_vulkan_serve), the
    engine does not (its graph differs: the module doc). Seeded answers of this random-weight target are
    not compared across backends: a sample drawn at temperature 0.8 from its flat distributions
    moves with any rounding of the logits (the first prompt's left the CPU's at token 5)."""
    got = tokens_and_counts(vulkan_engine["mixed"][0])[::2]
    assert 0 < sum(a for _, _, a in got) < sum(d for _, d, _ in got)  # right part of the time
    left = check_near_ties(got, tokens_and_counts(cpu_engine["mixed"])[::2], prompts_top2)
    print("left the CPU bindings' text at", left)


def test_the_engines_tokens_are_llama_servers_on_the_device(vulkan_engine, pairs, device, prompts_top2, tmp_path):  # noqa: F811
    """llama-server on the same device, same settings (one slot, n-max 2, 64-token batches), greedy:
    the hidden pair's tokens, drafts and accepted drafts are the Python engine's; the mixed pair's
    up to a near-tie (the module doc)."""
    with Served(tmp_path / "hidden", *pairs["hidden"], vulkan_devices=device) as s:
        assert tokens_and_counts(vulkan_engine["hidden"][0])[::2] == answers(s.url)
    with Served(tmp_path / "mixed", *pairs["mixed"], vulkan_devices=device) as s:
        server = answers(s.url)
    assert [tokens for tokens, _ in prompts_top2] == [a[0] for a in server]  # the drafter's text is the target's
    left = check_near_ties(tokens_and_counts(vulkan_engine["mixed"][0])[::2], server, prompts_top2)
    print("left llama-server's text at", left)


def test_serve_engine_python_on_the_device_answers_as_llama_server(pairs, device, vulkan_site, tmp_path, monkeypatch):  # noqa: F811
    """`serve --engine python --profile gtx1650ti-vulkan --vulkan-devices N` as serve starts it (its
    process gets the Vulkan bindings first on PYTHONPATH): it reports the device it offloads to,
    and its greedy completions are llama-server's on the device, with the same draft counts."""
    import urllib.request

    target, drafter = pairs["hidden"]  # whole words: the two servers' texts compare (the mixed pair's bytes do not)
    monkeypatch.setenv("PYTHONPATH", child_env(vulkan_site, None)["PYTHONPATH"])
    runs = tmp_path / "runs"
    settings = ServeSettings(
        target, drafter, PROFILE, overrides=OVERRIDES, port=free_port(), runs=runs, engine="python",
        vulkan_devices=device,
    )  # fmt: skip
    plan = plan_serve(settings)
    start_planned(plan, detach=True, timeout=600, probe=False)
    texts = []
    try:
        for prompt in PROMPTS:
            body = {"prompt": prompt, "max_tokens": N_PREDICT, "temperature": 0}
            req = urllib.request.Request(
                plan.launch.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=CHILD_TIMEOUT_S) as r:
                texts.append(json.loads(r.read())["choices"][0]["text"])
        log = (plan.launch.run_dir / LOG_FILE).read_text()
    finally:
        stop_server(plan.launch.port, runs)
    assert re.search(r"Python engine: layers offloaded to Vulkan0: .+ \(\d+ MiB\)", log), log[-2000:]
    counts = [
        tuple(map(int, m))
        for m in re.findall(r"draft acceptance = [0-9.]+ \( *(\d+) accepted / *(\d+) generated\)", log)
    ]
    with Served(tmp_path / "server", target, drafter, vulkan_devices=device) as s:
        server = [
            urllib.request.urlopen(
                urllib.request.Request(
                    s.url + "/completion",
                    json.dumps({"prompt": p, "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": False}).encode(),
                    {"Content-Type": "application/json"},
                ),
                timeout=CHILD_TIMEOUT_S,
            )
            for p in PROMPTS
        ]
        server = [json.loads(r.read()) for r in server]
    assert texts == [r["content"] for r in server]
    assert counts == [(r["timings"]["draft_n_accepted"], r["timings"]["draft_n"]) for r in server]


def test_vulkan_bindings_that_see_no_device_say_so(pairs, vulkan_site, tmp_path):  # noqa: F811
    """Lavapipe alone, not made visible: llama.cpp hides it, and the engine says in one line that
    these Vulkan bindings see no device and how to use the one vulkaninfo lists (not that they are
    CPU-only), then runs on the CPU."""
    env = child_env(vulkan_site, None) | {"VK_ICD_FILENAMES": "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"}
    report, log = run_engine(tmp_path, env, pairs["hidden"][0], None, PROFILE, [GREEDY])
    assert report["backends"] == ["Vulkan"] and report["devices"] == []
    lines = [x for x in log.splitlines() if "offloads layers to the GPU" in x]
    assert len(lines) == 1, log[-2000:]
    assert re.fullmatch(
        rf"profile {PROFILE} offloads layers to the GPU, but these llama-cpp-python bindings \(Vulkan\) see no Vulkan "
        r"device, so the Python engine runs on the CPU; vulkaninfo lists GPU0 llvmpipe \(.*\) \(cpu, llvmpipe\): a "
        r"CPU-type device, which llama.cpp hides; set GGML_VK_VISIBLE_DEVICES=0 to run on it \(what serve's "
        r"vulkan_devices sets; a software device: slow\)",
        lines[0],
    ), lines[0]


def test_the_bindings_probe_runs_on_the_device_and_fails_without_it(vulkan_site, device):  # noqa: F811
    """The wheel's probe (a 64-token Q4_0 prompt, every layer offloaded) on the device the build is
    for, made visible as serve makes it; the CPU bindings probed as Vulkan ones fail in one line."""
    result = build_probe.probe_bindings(sys.executable, pythonpath=vulkan_site, backend="vulkan")
    assert result.ok, result.tail
    assert re.fullmatch(r"Vulkan0: .+ \(\d+ MiB\)", result.device) and result.gpu_layers == 99
    assert result.visible_devices == (device or "")
    cpu = build_probe.probe_bindings(sys.executable, backend="vulkan")  # this environment's CPU bindings
    assert not cpu.ok and cpu.tail == "the bindings saw no Vulkan device (they saw: none)", cpu.tail
