"""Drafter conversion end to end on tiny generated checkpoints."""

import hashlib
import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from helpers import off_grid_checkpoint

from gguf_exact.core import bf16, q4_0
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.drafter.verify import verify_gguf
from gguf_exact.errors import OffGridError
from gguf_exact.tiny.models import drafter_config, drafter_tensors, write_checkpoint

N_LAYERS = 4
EXPECTED_TENSORS = {
    "token_embd.weight", "output_norm.weight", "rope_freqs.weight",
    "nextn.pre_projection.weight", "nextn.post_projection.weight",
} | {
    f"blk.{i}.{part}.weight"
    for i in range(N_LAYERS)
    for part in (
        "attn_norm", "attn_q", "attn_q_norm", "attn_output", "post_attention_norm", "ffn_norm",
        "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm", "layer_output_scale",
    )
}  # fmt: skip
MATRICES = {"token_embd.weight", "nextn.pre_projection.weight", "nextn.post_projection.weight"} | {
    f"blk.{i}.{p}.weight" for i in range(N_LAYERS) for p in ("attn_q", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
}


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def kv(reader, key):
    return reader.fields[key].contents()


def test_convert_writes_the_gemma4_assistant_form(tiny, tmp_path):
    out = tmp_path / "drafter.gguf"
    result = convert_drafter(tiny / "drafter-fp32", out, tiny / "target.gguf", report_path=tmp_path / "r.json")
    assert result.sha256 == sha256(out) and result.size == out.stat().st_size
    r = GGUFReader(out)
    a = "gemma4-assistant"
    assert kv(r, "general.architecture") == a
    expected = {
        "block_count": 4, "nextn_predict_layers": 4, "embedding_length": 64, "embedding_length_out": 128,
        "feed_forward_length": 128, "context_length": 4096, "attention.head_count": 2,
        "attention.head_count_kv": 1, "attention.key_length": 128, "attention.value_length": 128,
        "attention.key_length_swa": 64, "attention.value_length_swa": 64, "attention.sliding_window": 64,
        "attention.shared_kv_layers": 4, "rope.dimension_count": 128, "rope.dimension_count_swa": 64,
        "embedding_length_per_layer_input": 0, "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4,
    }  # fmt: skip
    for key, value in expected.items():
        assert kv(r, f"{a}.{key}") == pytest.approx(value), key
    assert kv(r, f"{a}.attention.sliding_window_pattern") == [True, True, True, False]
    assert kv(r, "general.file_type") == 2  # MOSTLY_Q4_0
    types = {t.name: GGMLQuantizationType(t.tensor_type) for t in r.tensors}
    assert set(types) == EXPECTED_TENSORS
    assert {n for n, t in types.items() if t == GGMLQuantizationType.Q4_0} == MATRICES
    assert all(t == GGMLQuantizationType.F32 for n, t in types.items() if n not in MATRICES)
    freqs = next(t for t in r.tensors if t.name == "rope_freqs.weight").data
    # 128 * 0.25 / 2 rotated half-dims, the rest 1e30 (float32)
    assert freqs.tolist() == np.array([1.0] * 16 + [1e30] * 48, dtype=np.float32).tolist()

    target = GGUFReader(tiny / "target.gguf")
    for key in [k for k in target.fields if k.startswith("tokenizer.")]:
        assert kv(r, key) == kv(target, key), key
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["sha256"] == result.sha256
    assert report["values"] == sum(int(np.prod(t.shape)) for t in r.tensors if t.name != "rope_freqs.weight")
    matrices = [t for t in report["tensors"] if t["type"] == "Q4_0"]
    assert sum(t["values"] for t in matrices) == sum(int(np.prod(t.shape)) for t in r.tensors if t.name in MATRICES)
    assert sum(t["exact_values"] for t in matrices) / sum(t["values"] for t in matrices) >= 0.995


def test_q4_0_bytes_decode_to_the_source_within_one_ulp(tiny, tmp_path):
    out = tmp_path / "d.gguf"
    convert_drafter(tiny / "drafter-fp32", out, tiny / "target.gguf")
    src = drafter_tensors(seed=1, step_kind="fp32")
    embd = next(t for t in GGUFReader(out).tensors if t.name == "token_embd.weight")
    decoded = q4_0.dequantize(np.asarray(embd.data).reshape(-1, 18)).reshape(320, 64)
    assert bf16.ulp_distance(bf16.from_f32(decoded), src["model.embed_tokens.weight"]).max() <= 1
    _, d = q4_0.unpack(np.asarray(embd.data))
    assert (d < 0).any() and (d == 0).any()  # +8 blocks and zero blocks are present


def test_bf16_step_is_bit_exact_everywhere(tiny, tmp_path):
    result = convert_drafter(tiny / "drafter-bf16", tmp_path / "d.gguf", tiny / "target.gguf")
    total = result.total
    assert total.exact == total.n_values == result.report["values"]
    assert total.max_ulps == 0 and total.rel_error == 0.0


def test_output_is_reproducible_and_independent_of_sharding(tiny, tmp_path):
    a = convert_drafter(tiny / "drafter-fp32", tmp_path / "a.gguf", tiny / "target.gguf")
    b = convert_drafter(tiny / "drafter-fp32", tmp_path / "b.gguf", tiny / "target.gguf")
    c = convert_drafter(tiny / "drafter-sharded", tmp_path / "c.gguf", tiny / "target.gguf")
    assert a.sha256 == b.sha256 == c.sha256
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "c.gguf").read_bytes()


def test_expect_sha256(tiny, tmp_path):
    good = convert_drafter(tiny / "drafter-fp32", tmp_path / "a.gguf", tiny / "target.gguf").sha256
    out = tmp_path / "b.gguf"
    assert convert_drafter(tiny / "drafter-fp32", out, tiny / "target.gguf", expect_sha256=good.upper()).sha256 == good
    out.unlink()
    with pytest.raises(Exception, match=f"sha256 {good} does not match the expected 0000"):
        convert_drafter(tiny / "drafter-fp32", out, tiny / "target.gguf", expect_sha256="0" * 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf"]


def test_off_grid_matrix_stops_or_falls_back(tiny, tmp_path):
    src = off_grid_checkpoint(tmp_path / "src")
    out = tmp_path / "out" / "d.gguf"
    out.parent.mkdir()
    with pytest.raises(OffGridError, match=r"tensor model.layers.2.mlp.up_proj.weight: 256 of 256 blocks are off"):
        convert_drafter(src, out, tiny / "target.gguf")
    assert list(out.parent.iterdir()) == []
    result = convert_drafter(src, out, tiny / "target.gguf", off_grid="q8_0")
    assert result.report["off_grid_tensors"] == ["blk.2.ffn_up.weight"]
    types = {t.name: t.tensor_type for t in GGUFReader(out).tensors}
    assert types["blk.2.ffn_up.weight"] == GGMLQuantizationType.Q8_0
    assert types["blk.2.ffn_gate.weight"] == GGMLQuantizationType.Q4_0
    v = verify_gguf(out, src, vocab_from=tiny / "target.gguf")  # the fallback's bytes are judged, and pass
    check = {c.name: c for c in v.tensors}["blk.2.ffn_up.weight"]
    assert (
        v.ok()
        and check.status == "pass"
        and check.note == "off the grid: the source as Q8_0, as off_grid=q8_0 writes it"
    )
    assert check.n_values == 128 * 64 and 0 < check.rel_error < 0.01


def test_unified_assistant_converts_to_the_same_bytes(tiny, tmp_path):
    from gguf_exact.tiny.models import TinyDrafter

    spec = TinyDrafter(architecture="Gemma4UnifiedAssistantForCausalLM")
    tensors = drafter_tensors(spec, seed=1)
    # Unified checkpoints may nest the text model under model.language_model.
    tensors = {
        k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v for k, v in tensors.items()
    }
    src = write_checkpoint(tmp_path / "unified", drafter_config(spec), tensors)
    unified = convert_drafter(src, tmp_path / "u.gguf", tiny / "target.gguf")
    plain = convert_drafter(tiny / "drafter-fp32", tmp_path / "p.gguf", tiny / "target.gguf")
    assert unified.sha256 == plain.sha256


def test_inspect_predicts_what_convert_achieves(tiny, tmp_path):
    from gguf_exact.drafter.inspect_qat import inspect_checkpoint
    from gguf_exact.gemma4.assistant import gguf_tensor_name

    report = inspect_checkpoint(tiny / "drafter-fp32")
    result = convert_drafter(tiny / "drafter-fp32", tmp_path / "d.gguf", tiny / "target.gguf")
    achieved = {c.name: c.ours.exact for c in result.tensors if c.ours is not None}
    for t in report.tensors:
        if t.planned == "Q4_0":
            assert round(t.exact_fraction * np.prod(t.shape)) == achieved[gguf_tensor_name(t.name)], t.name


def test_target_of_another_width_is_refused(tiny, tmp_path):
    from gguf_exact.errors import GgufExactError
    from gguf_exact.tiny.models import TinyTarget, write_tiny_target

    target = write_tiny_target(tmp_path / "wide.gguf", spec=TinyTarget(n_embd=256))
    with pytest.raises(
        GgufExactError, match="target embedding_length 256 differs from the drafter's backbone_hidden_size 128"
    ):
        convert_drafter(tiny / "drafter-fp32", tmp_path / "d.gguf", target)
    assert not (tmp_path / "d.gguf").exists()
