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
import re
import threading
import urllib.request
from pathlib import Path

import pytest
from _llama_server import TEST_SETTINGS, free_port, server_binary
from helpers import cli

from gguf_exact.builds.build_probe import probe_device
from gguf_exact.builds.llama_build import find_build
from gguf_exact.engines.logged_buffers import logged_buffers
from gguf_exact.engines.serve import plan_serve, start_planned
from gguf_exact.engines.settings import LOG_FILE, ServeSettings
from gguf_exact.engines.status import stop_server
from gguf_exact.runtime.memory_plan import MIB, plan_memory
from gguf_exact.tiny.pairs import write_runner_pairs

pytestmark = [pytest.mark.vulkan, pytest.mark.llama_server]

LAVAPIPE_ICD = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
PROFILE = "gtx1650ti-vulkan"
SETS = (*TEST_SETTINGS, "log-verbosity=4")
PROMPTS = ("def f(x): return x + 1", "the quick brown fox", "abc abc abc")
SEEDED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 11}
N_PREDICT = 24
REQUEST_TIMEOUT_S = 600  # a first request on lavapipe compiles its pipelines: tens of seconds to minutes


@pytest.fixture(scope="module")
def device() -> str | None:
    """What GGML_VK_VISIBLE_DEVICES must name for the Vulkan build to see a device here: None
    where it sees one by itself (a real card), lavapipe's index where there is only lavapipe."""
    build = find_build("vulkan")
    if build is None:
        pytest.fail("the Vulkan llama-server is not built; run `make test-vulkan` (scripts/build-llama-cpp.sh --vulkan)")
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
    env = {k: v for k, v in __import__("os").environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    env |= {"VK_ICD_FILENAMES": str(LAVAPIPE_ICD), "GGUF_EXACT_RUN_DIR": str(tmp_path / "run")}
    r = cli("serve", "--profile", PROFILE, "--model", str(target), "--draft", str(drafter), "--port", str(free_port()), env=env)
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
