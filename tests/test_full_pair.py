"""``make-pair``: a full-size E2B pair with weights (gguf_exact.tiny.full_pair).

The files carry E2B's real structure (every key against gemma4/sizes.py, every tensor
at its real shape and type, the Gemma-size vocabulary), the target walks its cycle in
llama-server and in the in-process engine with and without the drafter, and the
draft counts are exactly what the kinds' walks predict (gguf_exact.tiny.pair_walk) on a
short run (12 tokens: a full-size pass costs about a second on two shared cores).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _llama_server import TEST_SETTINGS, complete, completion_body, free_port, post_json, server_binary
from _pair_drafter import Drafter
from click.testing import CliRunner
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from gguf_exact.bench.request import fixed_length
from gguf_exact.cli import main
from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.python.runner import Runner
from gguf_exact.engines.shared.profiles import load_profile
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.engines.shared.settings import ServeSettings
from gguf_exact.engines.shared.status import stop_server
from gguf_exact.formats.gguf_reader import open_gguf
from gguf_exact.gemma4.sizes import SIZES
from gguf_exact.tiny.full_pair import N_AXES, next_token, write_drafter, write_pair
from gguf_exact.tiny.main_model import MainSpec, model_tensors
from gguf_exact.tiny.pair_walk import predict_run

pytestmark = [pytest.mark.bindings, pytest.mark.llama_server]

N_PREDICT = 12
REAL_PREDICT = 24
HEAD_HEADER_BYTES = 224  # the head's two tensor entries and two keys in the header, with alignment
PROMPT = "hello world"
E2B = SIZES["E2B"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("full-pair")
    p = write_pair(root, "e2b", "hidden")
    mixed = write_drafter(root / "mixed-drafter.gguf", "E2B", "mixed", list(p.cycle), p.target)
    real = write_drafter(root / "real-drafter.gguf", "E2B", "real", list(p.cycle), p.target)
    return p, mixed, real


class Keys:
    """A GGUF's values by key: numbers as a number or a per-layer list, arrays' lengths, strings."""

    def __init__(self, g) -> None:
        self.g = g

    def __getitem__(self, key: str):
        nums = self.g.numbers(key)
        if nums is not None and self.g.array_length(key) is None:
            return nums[0]
        return nums if nums is not None else self.g.value(key)


def header(path: Path) -> tuple[Keys, dict]:
    g = open_gguf(path)
    return Keys(g), {t.name: (tuple(t.ne), t.type) for t in g.tensors}


def test_target_has_e2b_structure(pair):
    p = pair[0]
    f, tensors = header(p.target)
    t = E2B.target
    assert f["general.architecture"] == "gemma4"
    assert (f["gemma4.block_count"], f["gemma4.embedding_length"]) == (t.num_hidden_layers, t.hidden_size)
    assert (f["gemma4.attention.head_count"], f["gemma4.attention.head_count_kv"]) == (8, 1)
    assert (f["gemma4.attention.key_length"], f["gemma4.attention.key_length_swa"]) == (512, 256)
    assert (f["gemma4.attention.shared_kv_layers"], f["gemma4.attention.sliding_window"]) == (20, 512)
    assert f["gemma4.embedding_length_per_layer_input"] == 256
    # double-wide MLP in the 20 KV-shared layers
    assert list(f["gemma4.feed_forward_length"]) == [6144] * 15 + [12288] * 20
    pattern = [bool(x) for x in f["gemma4.attention.sliding_window_pattern"]]
    assert pattern == [(i + 1) % 5 != 0 and i != 34 for i in range(35)]
    lengths = (f.g.array_length("tokenizer.ggml.tokens"), f.g.array_length("tokenizer.ggml.merges"))
    assert lengths == (262_144, 500_000)
    assert f["tokenizer.ggml.model"] == "gemma4"
    expected = {m.gguf_name: (tuple(reversed(m.shape)), m.donor_type) for m in model_tensors(MainSpec.from_shape(t))}
    assert {k: v for k, v in tensors.items() if k != "rope_freqs.weight"} == expected
    assert len(tensors) == 541 and tensors["rope_freqs.weight"] == ((256,), GGMLQuantizationType.F32)
    assert tensors["blk.20.ffn_gate.weight"] == ((1536, 12288), GGMLQuantizationType.Q4_0)
    assert "blk.20.attn_k.weight" not in tensors and "blk.14.attn_k.weight" in tensors


def test_drafter_has_e2b_assistant_structure(pair):
    p = pair[0]
    f, tensors = header(p.drafter)
    a = E2B.assistant
    assert f["general.architecture"] == "gemma4-assistant"
    key = "gemma4-assistant."
    assert (f[key + "embedding_length"], f[key + "embedding_length_out"]) == (256, a.backbone_hidden_size)
    assert (f[key + "block_count"], f[key + "feed_forward_length"], f[key + "attention.head_count"]) == (4, 2048, 4)
    assert tensors["token_embd.weight"] == ((256, 262_144), GGMLQuantizationType.Q4_0)  # the full tied head
    assert tensors["nextn.pre_projection.weight"] == ((2 * 1536, 256), GGMLQuantizationType.Q4_0)
    assert tensors["blk.3.attn_q.weight"] == ((256, 4 * 512), GGMLQuantizationType.Q4_0)
    assert len(tensors) == 51
    # the ordered head: 2,048 clusters of 128 tokens, the top 32 scored (issue 24)
    assert (f[key + "num_centroids"], f[key + "centroid_intermediate_top_k"]) == (2048, 32)
    assert tensors["masked_embd_centroids.weight"] == ((256, 2048), GGMLQuantizationType.Q4_0)
    assert tensors["masked_embd_ordering"] == ((262_144,), GGMLQuantizationType.I32)
    # the size `convert` gives the E2B assistant (66,154,144 bytes without its head)
    assert p.drafter.stat().st_size == 66_154_144 + 294_912 + 1_048_576 + HEAD_HEADER_BYTES


def test_the_drafters_clusters_hold_the_tokens_it_proposes(pair):
    """make-pair's head is consistent: the cluster of every token the tied head can propose (a
    nonzero row) has a centroid on that token's axis, so the top clusters hold the full head's pick."""
    p = pair[0]
    g = open_gguf(p.drafter)
    t = {x.name: x for x in g.tensors}

    def matrix(name):
        return dequantize(g.read_rows(t[name], 0, t[name].rows), GGMLQuantizationType.Q4_0).reshape(t[name].rows, -1)

    embed, centroids = matrix("token_embd.weight"), matrix("masked_embd_centroids.weight")
    ordering = g.read_rows(t["masked_embd_ordering"], 0, 1).view("<i4").reshape(-1)
    cluster_of = np.empty(262_144, np.int64)
    cluster_of[ordering] = np.arange(262_144) // 128
    tokens, axes = np.nonzero(embed)
    assert len(tokens) >= N_AXES  # every axis proposes one token
    assert np.all(centroids[cluster_of[tokens], axes] > 0)
    # and a cluster scores nothing on an axis none of its tokens carries
    assert np.count_nonzero(centroids) == len(set(zip(cluster_of[tokens].tolist(), axes.tolist())))


def test_target_weights_make_the_cycle(pair):
    p = pair[0]
    with open_gguf(p.target) as g:
        embd = g.tensor("token_embd.weight")
        picked = np.concatenate([g.read_rows(embd, r, r + 1) for r in (p.cycle[0], p.cycle[1], 1000)])
        down = g.read_rows(g.tensor("blk.0.ffn_down.weight"), 0, N_AXES)
    rows = dequantize(picked, GGMLQuantizationType.Q6_K)
    assert rows[0, 0] == 0.5 and rows[1, 1] == 0.5 and rows[2, 1000 % N_AXES] == 0.25
    assert np.count_nonzero(rows) == 3
    first = dequantize(down, GGMLQuantizationType.Q4_0)[:, :N_AXES]
    assert first[1, 0] == 1.0 and first[0, 0] == -1.0 and first[0, N_AXES - 1] == 1.0
    assert np.count_nonzero(first) == 2 * N_AXES


def expected_walk(first_next: int, cycle: list[int], n: int) -> list[int]:
    out = [first_next]
    while len(out) < n:
        out.append(next_token(out[-1], cycle))
    return out


def serve(tmp_path, monkeypatch, target, drafter, n_max, extra=None, n_predict=N_PREDICT):
    """Greedy completions of PROMPT (and of PROMPT with each body in ``extra``: per-request
    fields) on one llama-server at a fixed n-max."""
    monkeypatch.setenv("GGUF_EXACT_RUN_DIR", str(tmp_path / f"run-{n_max}"))
    profile = load_profile("cpu").with_overrides([*TEST_SETTINGS, "threads=2", *fixed_length(max(n_max, 1))])
    launch = plan_launch(ServeSettings(target, drafter, profile, port=free_port()))
    start_server(launch, detach=True, timeout=300)
    url = f"http://127.0.0.1:{launch.port}"
    try:
        first = complete(url, PROMPT, n_predict)
        more = [post_json(url + "/completion", completion_body(PROMPT, n_predict) | body) for body in extra or []]
        return first if extra is None else [first, *more]
    finally:
        stop_server(launch.port)


def counts(timings: dict) -> tuple[int, int]:
    return timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)


def test_llama_server_same_text_and_the_predicted_counts(pair, tmp_path, monkeypatch):
    server_binary()
    p, mixed, real = pair
    cycle = list(p.cycle)
    alone = serve(tmp_path, monkeypatch, p.target, None, 0)
    assert alone["tokens"] == expected_walk(alone["tokens"][0], cycle, N_PREDICT)
    assert alone["tokens"][0] in cycle
    first = cycle.index(alone["tokens"][0])
    hidden = serve(tmp_path, monkeypatch, p.target, p.drafter, 3)
    assert hidden["tokens"] == alone["tokens"] and hidden["content"] == alone["content"]
    run = predict_run("hidden", first, N_PREDICT, 3)
    assert counts(hidden["timings"]) == (run.drafted, run.accepted) == (8, 8)
    half = serve(tmp_path, monkeypatch, p.target, mixed, 1)
    assert half["tokens"] == alone["tokens"]
    run = predict_run("mixed", first, N_PREDICT, 1)
    assert counts(half["timings"]) == (run.drafted, run.accepted)
    # real: wrong on some first drafts and more deeper ones; per request, p-min 0.5 stops
    # before the unsure deeper drafts (the same accepted), 0.9 before every wrong one (24
    # tokens: the walk from the prompt's token reaches wrong drafts of both kinds)
    p_mins = [{"speculative.p_min": 0.5}, {"speculative.p_min": 0.9}]
    plain, p5, p9 = serve(tmp_path, monkeypatch, p.target, real, 3, p_mins, n_predict=REAL_PREDICT)
    for r in (plain, p5, p9):
        assert r["tokens"] == expected_walk(alone["tokens"][0], cycle, REAL_PREDICT)
    conf = Drafter("real", cycle).confidence()  # the drafter's top probabilities, from its weights
    runs = [predict_run("real", first, REAL_PREDICT, 3, p_min, conf) for p_min in (0.0, 0.5, 0.9)]
    assert [counts(r["timings"]) for r in (plain, p5, p9)] == [(x.drafted, x.accepted) for x in runs]
    assert runs[0].drafted > runs[1].drafted > runs[2].drafted == runs[2].accepted == runs[0].accepted


def test_engine_same_text_and_the_predicted_counts(pair):
    p, mixed, real = pair
    cycle = list(p.cycle)
    with Runner(p.target, None, n_ctx=512) as r:
        alone = r.generate(PROMPT, N_PREDICT, 0).tokens
    assert alone == expected_walk(alone[0], cycle, N_PREDICT)
    first = cycle.index(alone[0])
    for kind, drafter, n_max in (("hidden", p.drafter, 3), ("mixed", mixed, 1), ("real", real, 3)):
        with Runner(p.target, drafter, n_ctx=512) as r:
            g = r.generate(PROMPT, N_PREDICT, n_max)
        run = predict_run(kind, first, N_PREDICT, n_max)
        assert g.tokens == alone and (g.drafts_generated, g.drafts_accepted) == (run.drafted, run.accepted), kind
    conf = Drafter("real", cycle).confidence()
    with Runner(p.target, real, n_ctx=512) as r:
        for p_min in (0.5, 0.9):  # a profile's spec-draft-p-min, as load_with_drafter sets it
            r.llm.draft_length.p_min = p_min
            g = r.generate(PROMPT, REAL_PREDICT, 3)
            run = predict_run("real", first, REAL_PREDICT, 3, p_min, conf)
            assert (g.drafts_generated, g.drafts_accepted) == (run.drafted, run.accepted), p_min


def test_make_pair_refuses_bad_input_in_one_line(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["make-pair", str(tmp_path / "p"), "--shape", "e3b", "--kind", "hidden"])
    assert (r.exit_code, r.output) == (1, "error: --shape e3b: expected one of e2b, e4b, tiny\n")
    r = runner.invoke(main, ["make-pair", str(tmp_path / "p"), "--shape", "e2b", "--kind", "half"])
    assert (r.exit_code, r.output) == (1, "error: --kind half: expected one of hidden, mixed, real, sampled\n")
    (tmp_path / "f").write_text("x")
    r = runner.invoke(main, ["make-pair", str(tmp_path / "f"), "--shape", "e2b", "--kind", "hidden"])
    assert (r.exit_code, r.output) == (1, f"error: {tmp_path / 'f'}: exists and is not a folder\n")
    assert not (tmp_path / "p").exists()


def test_memory_plan_equals_llama_server_log_at_real_shape(pair, tmp_path, monkeypatch):
    """The plan's weights (memory-mapped span plus the CPU's repacked Q4_0 copies), KV cache
    and compute buffers against what llama-server logs for the full-size E2B pair."""
    from gguf_exact.engines.logged_buffers import compare, logged_buffers
    from gguf_exact.engines.shared.memory_plan import plan_memory
    from gguf_exact.engines.shared.settings import LOG_FILE

    server_binary()
    p = pair[0]
    monkeypatch.setenv("GGUF_EXACT_RUN_DIR", str(tmp_path / "run"))
    profile = load_profile("cpu").with_overrides(["threads=2", "no-warmup=true", "log-verbosity=4"])
    plan = plan_memory(p.target, p.drafter, serving_config(profile, p.drafter is not None).memory_inputs())
    launch = plan_launch(ServeSettings(p.target, p.drafter, profile, port=free_port()))
    start_server(launch, detach=True, timeout=300)
    try:
        log = (launch.run_dir / LOG_FILE).read_text()
    finally:
        stop_server(launch.port)
    models = logged_buffers(log)
    assert models[0].weights == {"CPU_Mapped": 3179.26, "CPU_REPACK": 999.42}  # the layer matrices, twice
    assert models[0].kv == {"CPU": 36.0}  # 4096 cells x 3 full layers + 1024 x 12 sliding, 512 / 256 wide
    rows = {r.what: r for r in compare(plan, models)}
    assert list(rows) == ["target weights", "drafter weights", "KV cache", "compute buffers"]
    for what in ("target weights", "drafter weights", "KV cache"):
        assert abs(rows[what].ratio - 1) < 0.001, rows[what]
    assert abs(rows["compute buffers"].ratio - 1) < 0.10, rows["compute buffers"]


def test_over_two_rpc_workers_the_full_size_pair_says_the_same_with_buffers_as_planned(pair, tmp_path, monkeypatch):
    """Issue 29 at real size: the E2B hidden pair served over two loopback `rpc-server` workers
    (CPU) gives the one-machine walk and draft counts exactly, and each worker holds the
    weights and KV cache the plan gives it (within 10%), with the drafter where the plan puts it."""
    from gguf_exact.engines.logged_buffers import logged_buffers
    from gguf_exact.engines.rpc_worker import plan_worker, start_worker
    from gguf_exact.engines.serve import plan_serve
    from gguf_exact.engines.shared.memory_plan import MIB
    from gguf_exact.engines.shared.settings import LOG_FILE, WorkerSettings

    server_binary()
    p = pair[0]
    cycle = list(p.cycle)
    runs = tmp_path / "run"
    monkeypatch.setenv("GGUF_EXACT_RUN_DIR", str(runs))
    ports: list[int] = []
    while len(ports) < 2:
        port = free_port()
        ports += [port] if port not in ports else []
    for port in ports:
        start_worker(plan_worker(WorkerSettings(profile="cpu", port=port, threads=1, runs=runs)), detach=True)
    endpoints = tuple(f"127.0.0.1:{port}" for port in ports)
    try:
        sets = [*TEST_SETTINGS, "threads=2", *fixed_length(3), "tensor-split=1,1", "log-verbosity=4"]
        profile = load_profile("cpu").with_overrides(sets)
        settings = ServeSettings(p.target, p.drafter, profile, port=free_port(), rpc=endpoints, runs=runs)
        plan = plan_serve(settings)
        assert [w.state for w in plan.workers] == ["ok", "ok"]
        cmd = plan.launch.command
        assert cmd[cmd.index("--spec-draft-device") + 1] == plan.devices.draft_device
        start_server(plan.launch, detach=True, timeout=600)
        try:
            got = complete(plan.launch.url, PROMPT, N_PREDICT)
            log = (runs / str(plan.launch.port) / LOG_FILE).read_text()
        finally:
            stop_server(plan.launch.port, runs)
    finally:
        for port in ports:
            stop_server(port, runs)
    # the walk and the counts the one-machine test asserts (hidden, n-max 3: 8 drafted, 8 accepted)
    assert got["tokens"] == expected_walk(got["tokens"][0], cycle, N_PREDICT)
    run = predict_run("hidden", cycle.index(got["tokens"][0]), N_PREDICT, 3)
    assert counts(got["timings"]) == (run.drafted, run.accepted) == (8, 8)
    models = logged_buffers(log)
    for i, endpoint in enumerate(endpoints):
        share, name = plan.devices.shares[i], f"RPC0[{endpoint}]"
        # E2B's last 20 layers share the KV of earlier ones: a worker holding only those has no KV buffer
        weights, kv = models[0].weights[name] * MIB, models[0].kv.get(name, 0.0) * MIB
        assert abs(weights - share.weights) <= 0.1 * share.weights, (name, weights, share)
        assert abs(kv - share.kv) <= 0.1 * share.kv, (name, kv, share)
        drafter = models[1].weights.get(name, 0.0) * MIB
        assert abs(drafter - share.drafter_weights) <= 0.1 * max(share.drafter_weights, 1), (name, drafter, share)
    assert [s.kv > 0 for s in plan.devices.shares[:2]] == [True, False]
