"""Every Gemma 4 size in miniature (``gguf_exact.tiny.structural``): the real layer
counts, sliding/full pattern, query and per-type KV heads, K-equals-V full layers, KV
sharing, per-layer embeddings and MoE, at tiny widths.

For each size: the assistant converts, the target re-packs, the pair serves with
draft-mtp in llama-server and in the in-process engine, llama.cpp reads the drafter's
KV geometry as the target's, and the output equals the target alone.
"""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from _llama_server import (
    TEST_SETTINGS,
    complete,
    free_port,
    model_infos,
    per_layer,
    server_binary,
    shared_kv_mismatches,
)
from gguf import GGUFReader

from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.shared.settings import LOG_FILE, ServeSettings
from gguf_exact.engines.shared.status import stop_server
from gguf_exact.gemma4.hparams import FULL, SLIDING, TextHparams
from gguf_exact.gemma4.sizes import SIZES, SOURCES
from gguf_exact.repack.pipeline import repack_model
from gguf_exact.tiny.structural import HEAD_DIM_DIVISOR, HIDDEN, tiny_shapes, write_structural_pair

PROMPTS = ("def f(x): return x + 1", "the quick brown fox")
N_PREDICT = 16
# What llama.cpp's converter writes for each real assistant's KV heads (conversion/gemma.py):
# one number when the config has no global KV heads, else one per layer (sliding x3, full).
HEAD_COUNT_KV = {"E2B": 1, "E4B": 2, "26B-A4B": [8, 8, 8, 2], "31B": [16, 16, 16, 4]}
LLAMA_CPP_LAYERS = {"26B-A4B": 30, "E2B": 35, "E4B": 42, "31B": 60}  # src/models/gemma4.cpp model types


def field(reader: GGUFReader, key: str):
    f = reader.fields[key]
    return f.contents()


@pytest.fixture(scope="module", params=list(SIZES))
def pair(request, tmp_path_factory) -> SimpleNamespace:
    """One size's tiny pair: the converted drafter and the re-packed target."""
    size = request.param
    root = tmp_path_factory.mktemp(size)
    fixture = write_structural_pair(root, size)
    drafter = convert_drafter(fixture.drafter_hf, root / "drafter.gguf", vocab_from=fixture.target)
    target = repack_model(fixture.target, fixture.target_hf, root / "target-exact.gguf")
    return SimpleNamespace(size=size, fixture=fixture, drafter=drafter.path, target=target)


# the size table


@pytest.mark.parametrize("name", list(SIZES))
def test_size_table_is_consistent_with_llama_cpp(name):
    size = SIZES[name]
    t, a = size.target, size.assistant.text
    assert set(size.sources) <= set(SOURCES)
    assert t.num_hidden_layers == LLAMA_CPP_LAYERS[name]
    types = t.layer_types()
    # llama.cpp hands the assistant's sliding layers the target's layer n-2 cache, its full layer n-1's
    assert types[-2:] == [SLIDING, FULL] and a.layer_types() == [SLIDING] * 3 + [FULL]
    assert (a.head_dim, a.global_head_dim, a.sliding_window) == (t.head_dim, t.global_head_dim, t.sliding_window)
    assert size.assistant.backbone_hidden_size == t.hidden_size
    target, assistant = TextHparams.from_hf(t.text_config()), TextHparams.from_hf(a.text_config(), assistant=True)
    assert assistant.n_embd_k_gqa(2) == target.n_embd_k_gqa(t.num_hidden_layers - 2)
    assert assistant.n_embd_k_gqa(3) == target.n_embd_k_gqa(t.num_hidden_layers - 1)
    if t.num_kv_shared_layers:  # llama.cpp's reuse: shared layers read the last full / sliding layer with KV
        first_shared = t.num_hidden_layers - t.num_kv_shared_layers
        assert types[first_shared - 2 : first_shared] == [SLIDING, FULL]


def test_real_sizes_get_upstreams_per_layer_keys():
    e2b = TextHparams.from_hf(SIZES["E2B"].target.text_config())
    assert e2b.ff_per_layer and e2b.n_ff == (6144,) * 15 + (12288,) * 20
    assert not e2b.kv_per_layer and set(e2b.n_head_kv) == {1}
    b31 = TextHparams.from_hf(SIZES["31B"].target.text_config())
    assert b31.kv_per_layer and b31.n_head_kv == tuple(4 if (il + 1) % 6 == 0 else 16 for il in range(60))
    assert b31.n_embd_k_gqa(58) == 16 * 256 and b31.n_embd_k_gqa(59) == 4 * 512
    a4b = TextHparams.from_hf(SIZES["26B-A4B"].target.text_config())
    assert (a4b.n_expert, a4b.n_expert_used, a4b.n_ff_expert) == (128, 8, 704)


@pytest.mark.parametrize("name", list(SIZES))
def test_tiny_shapes_keep_the_structure(name):
    real = SIZES[name]
    for small, big in zip(tiny_shapes(real), (real.target, real.assistant.text)):
        if hasattr(small, "text"):
            small = small.text
        assert small.layer_types() == big.layer_types()
        assert (small.num_attention_heads, small.num_key_value_heads, small.num_global_key_value_heads) == (
            big.num_attention_heads,
            big.num_key_value_heads,
            big.num_global_key_value_heads,
        )
        assert (small.attention_k_eq_v, small.num_kv_shared_layers, small.use_double_wide_mlp) == (
            big.attention_k_eq_v,
            big.num_kv_shared_layers,
            big.use_double_wide_mlp,
        )
        assert (small.head_dim * HEAD_DIM_DIVISOR, small.global_head_dim * HEAD_DIM_DIVISOR) == (
            big.head_dim,
            big.global_head_dim,
        )
        assert bool(small.hidden_size_per_layer_input) == bool(big.hidden_size_per_layer_input)
        assert (small.num_experts is None, small.top_k_experts) == (big.num_experts is None, big.top_k_experts)
        assert small.hidden_size < big.hidden_size and small.vocab_size < big.vocab_size


# conversion and re-pack


def test_drafter_keys_are_what_llama_cpp_reads(pair):
    r = GGUFReader(pair.drafter)
    a = "gemma4-assistant"
    assert field(r, f"{a}.attention.head_count_kv") == HEAD_COUNT_KV[pair.size]
    real = SIZES[pair.size].assistant.text
    assert field(r, f"{a}.attention.head_count") == real.num_attention_heads
    assert (
        field(r, f"{a}.attention.key_length")
        == field(r, f"{a}.rope.dimension_count")
        == real.global_head_dim // HEAD_DIM_DIVISOR
    )
    assert field(r, f"{a}.attention.key_length_swa") == real.head_dim // HEAD_DIM_DIVISOR
    assert field(r, f"{a}.attention.sliding_window_pattern") == [True, True, True, False]
    assert field(r, f"{a}.embedding_length_out") == HIDDEN
    assert field(r, f"{a}.attention.sliding_window") == real.sliding_window
    freqs = next(t for t in r.tensors if t.name == "rope_freqs.weight").data
    n_rot = real.global_head_dim // HEAD_DIM_DIVISOR // 8  # a quarter of the half-dims rotate
    unrotated = real.global_head_dim // HEAD_DIM_DIVISOR // 2 - n_rot
    assert freqs.dtype == np.float32 and freqs.tolist() == [1.0] * n_rot + [float(np.float32(1e30))] * unrotated


def test_target_repacks_with_every_tensor_mapped(pair):
    t = pair.target
    assert t.unmapped == [] and t.source_only == []
    spec = pair.fixture.target_shape
    matrices = [x for x in t.tensors if x.role == "qat"]
    assert matrices and all(x.out_type == "Q4_0" and x.off_grid_blocks == 0 for x in matrices)
    names = {x.name for x in t.tensors}
    last = spec.num_hidden_layers - 1
    assert ("blk.0.inp_gate.weight" in names) == bool(spec.hidden_size_per_layer_input)
    assert ("blk.0.ffn_gate_up_exps.weight" in names) == bool(spec.num_experts)
    assert (f"blk.{last}.attn_v.weight" in names) == (not spec.attention_k_eq_v and not spec.num_kv_shared_layers)
    assert (f"blk.{last}.attn_k.weight" in names) == (not spec.num_kv_shared_layers)


# serving


def _serve(target: Path, drafter: Path | None):
    server_binary()
    launch = plan_launch(ServeSettings(target, drafter, "cpu", (*TEST_SETTINGS, "log-verbosity=4"), port=free_port()))
    proc, _ = start_server(launch, detach=True, timeout=120)
    return launch, proc


def _stop(launch, proc):
    stop_server(launch.port)
    proc.wait(timeout=30)


@pytest.mark.llama_server
def test_pair_serves_with_draft_mtp_as_the_target_alone(pair, run_dir):
    target = pair.target.path
    launch, proc = _serve(target, pair.drafter)
    try:
        drafted = [complete(launch.url, p, N_PREDICT) for p in PROMPTS]
        log = (launch.run_dir / LOG_FILE).read_text(errors="replace")
    finally:
        _stop(launch, proc)
    alone_launch, alone_proc = _serve(target, None)
    try:
        alone = [complete(alone_launch.url, p, N_PREDICT) for p in PROMPTS]
    finally:
        _stop(alone_launch, alone_proc)
    for d, a in zip(drafted, alone):
        assert len(d["tokens"]) == N_PREDICT and d["tokens"] == a["tokens"]
    assert sum(d["timings"].get("draft_n", 0) for d in drafted) > 0
    assert shared_kv_mismatches(log, [True, True, True, False]) == []
    infos = {i["arch"]: i for i in model_infos(log)}
    expected = HEAD_COUNT_KV[pair.size]
    assert per_layer(infos["gemma4-assistant"], "n_head_kv", 4) == (
        expected if isinstance(expected, list) else [expected] * 4
    )


@pytest.mark.bindings
def test_pair_runs_in_process_as_the_target_alone(pair):
    from gguf_exact.engines.python.runner import Runner

    with Runner(pair.target.path, pair.drafter, n_ctx=256, n_threads=2) as r:
        for prompt in PROMPTS:
            alone = r.generate(prompt, N_PREDICT, n_max=0)
            drafted = r.generate(prompt, N_PREDICT, n_max=3)
            assert drafted.tokens == alone.tokens and len(drafted.tokens) == N_PREDICT
            assert drafted.drafts_generated > 0


# the KV-geometry check itself


def _log(target_rows: str, drafter_rows: str) -> str:
    lines = ["print_info: arch = gemma4", "print_info: n_layer_all = 6"]
    lines += [f"print_info: n_embd_k_gqa = {target_rows}", f"print_info: n_embd_v_gqa = {target_rows}"]
    lines += ["print_info: arch = gemma4-assistant", "print_info: n_layer_all = 4"]
    lines += [f"print_info: n_embd_k_gqa = {drafter_rows}", f"print_info: n_embd_v_gqa = {drafter_rows}"]
    return "\n".join(f"0.00.001.000 I {line}" for line in lines)


def test_shared_kv_check_catches_a_drafter_with_one_kv_head_count():
    target = "[512, 512, 512, 512, 512, 256]"  # 16 KV heads of 32 sliding, 4 of 64 full
    assert shared_kv_mismatches(_log(target, "[512, 512, 512, 256]"), [True, True, True, False]) == []
    # a scalar head_count_kv (16) in the drafter: its full layer views 16 x 64 on rows of 4 x 64
    wrong = shared_kv_mismatches(_log(target, "[512, 512, 512, 1024]"), [True, True, True, False])
    assert wrong == [
        "drafter layer 3 n_embd_k_gqa 1024 != target layer 5 256",
        "drafter layer 3 n_embd_v_gqa 1024 != target layer 5 256",
    ]


def test_a_unified_source_repacks_like_gemma4(tmp_path):
    """The 12B is a Gemma4UnifiedForConditionalGeneration: the same text-model tensor
    names (upstream converts it with Gemma4Model's table), so repack takes it too."""
    import json

    from gguf_exact.tiny.main_model import MainSpec, write_donor, write_main_checkpoint

    spec = MainSpec(n_layer=2, n_embd_per_layer=0)
    src = write_main_checkpoint(tmp_path / "src", spec)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(config | {"architectures": ["Gemma4UnifiedForConditionalGeneration"]}))
    write_donor(tmp_path / "donor.gguf", src, spec)
    result = repack_model(tmp_path / "donor.gguf", src, tmp_path / "out.gguf")
    assert result.unmapped == [] and sum(t.role == "qat" for t in result.tensors) == 2 * 7 + 1
