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
HEAD = ("masked_embd_centroids.weight", "masked_embd_ordering")
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
    assert kv(r, f"{a}.num_centroids") == 32 and kv(r, f"{a}.centroid_intermediate_top_k") == 4
    types = {t.name: GGMLQuantizationType(t.tensor_type) for t in r.tensors}
    assert set(types) == EXPECTED_TENSORS | set(HEAD)
    assert {n for n, t in types.items() if t == GGMLQuantizationType.Q4_0} == MATRICES
    # the tiny's centroids are plain normal weights, off the grid: kept as their own bf16, every bit
    assert types["masked_embd_centroids.weight"] == GGMLQuantizationType.BF16
    assert types["masked_embd_ordering"] == GGMLQuantizationType.I32
    assert all(t == GGMLQuantizationType.F32 for n, t in types.items() if n not in MATRICES | set(HEAD))
    src = drafter_tensors(seed=1, step_kind="fp32")
    stored = {t.name: t for t in r.tensors}
    centroids = np.asarray(stored["masked_embd_centroids.weight"].data).view(np.uint16)
    assert centroids.shape == (32, 64) and np.array_equal(centroids, src["masked_embedding.centroids.weight"])
    ordering = np.asarray(stored["masked_embd_ordering"].data)
    assert ordering.dtype == np.int32 and list(stored["masked_embd_ordering"].shape) == [320]
    assert np.array_equal(ordering, src["masked_embedding.token_ordering"])
    assert sorted(ordering.tolist()) == list(range(320)) and ordering.tolist() != list(range(320))  # shuffled
    freqs = next(t for t in r.tensors if t.name == "rope_freqs.weight").data
    # 128 * 0.25 / 2 rotated half-dims, the rest 1e30 (float32)
    assert freqs.tolist() == np.array([1.0] * 16 + [1e30] * 48, dtype=np.float32).tolist()

    target = GGUFReader(tiny / "target.gguf")
    for key in [k for k in target.fields if k.startswith("tokenizer.")]:
        assert kv(r, key) == kv(target, key), key
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["sha256"] == result.sha256
    assert report["values"] == sum(
        int(np.prod(t.shape)) for t in r.tensors if t.name not in ("rope_freqs.weight", "masked_embd_ordering")
    )
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
    # the head's centroids are off the grid too, but kept in their own type whatever off_grid says
    assert result.report["off_grid_tensors"] == ["masked_embd_centroids.weight", "blk.2.ffn_up.weight"]
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


# --- the ordered-embedding head (issue 24) ---------------------------------------------------


def head_checkpoint(folder, **changes):
    """The fp32-step tiny drafter with some of its tensors or config fields replaced."""
    from gguf_exact.tiny.synthetic import qat_matrix

    tensors = drafter_tensors(seed=1, step_kind="fp32")
    config = drafter_config()
    for key, value in changes.items():
        if key == "qat_centroids":
            rng = np.random.default_rng(5)
            tensors["masked_embedding.centroids.weight"] = qat_matrix(rng, 32, 64, step_kind="bf16")
        elif key in tensors:
            tensors[key] = value
        elif value is None:
            del tensors[key.replace("drop:", "")]
        else:
            config[key] = value
    return write_checkpoint(folder, config, tensors)


def test_centroids_on_the_grid_are_exact_q4_0_and_verify_judges_them_by_block(tiny, tmp_path):
    src = head_checkpoint(tmp_path / "src", qat_centroids=True)
    result = convert_drafter(src, tmp_path / "d.gguf", tiny / "target.gguf")
    row = {t.name: t for t in result.tensors}["masked_embd_centroids.weight"]
    assert (row.out_type, row.note, row.n_blocks, row.off_grid_blocks) == ("Q4_0", "exact q4_0", 64, 0)
    assert row.ours.exact == row.ours.n_values == 32 * 64  # bf16 step: every value bit-exact
    assert result.report["off_grid_tensors"] == []
    v = verify_gguf(tmp_path / "d.gguf", src, vocab_from=tiny / "target.gguf")
    check = {c.name: c for c in v.tensors}["masked_embd_centroids.weight"]
    assert v.ok() and check.note == "exact Q4_0: every block by the block rule" and check.blocks.n_blocks == 64


def test_full_head_drops_the_head_and_its_keys(tiny, tmp_path):
    out = tmp_path / "full.gguf"
    with_head = convert_drafter(tiny / "drafter-fp32", tmp_path / "head.gguf", tiny / "target.gguf")
    full = convert_drafter(tiny / "drafter-fp32", out, tiny / "target.gguf", ordered_head=False)
    r = GGUFReader(out)
    assert {t.name for t in r.tensors} == EXPECTED_TENSORS
    assert not [k for k in r.fields if "centroid" in k]
    # the head adds 32 x 64 bf16 centroids, 320 int32 ids, their header entries and the two keys
    assert with_head.size - full.size >= 4096 + 1280
    head_tensors = {t.name: t for t in GGUFReader(tmp_path / "head.gguf").tensors}
    for t in r.tensors:
        assert np.array_equal(np.asarray(t.data), np.asarray(head_tensors[t.name].data)), t.name
    assert verify_gguf(out, tiny / "drafter-fp32", vocab_from=tiny / "target.gguf").ok()


def test_a_config_without_ordered_embeddings_drops_the_tensors(tiny, tmp_path):
    src = head_checkpoint(tmp_path / "src", use_ordered_embeddings=False)
    convert_drafter(src, tmp_path / "d.gguf", tiny / "target.gguf")
    assert {t.name for t in GGUFReader(tmp_path / "d.gguf").tensors} == EXPECTED_TENSORS


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"masked_embedding.token_ordering": np.zeros(320, np.int64)},
            r"tensor masked_embedding.token_ordering: not a permutation of the 320 token ids",
        ),
        ({"drop:masked_embedding.token_ordering": None}, r"there is no tensor masked_embedding.token_ordering"),
        ({"num_centroids": 30}, r"config.json: num_centroids 30 does not divide the vocabulary of 320 tokens"),
        ({"centroid_intermediate_top_k": 33}, r"config.json: centroid_intermediate_top_k 33 is not in 1..32"),
        ({"num_centroids": 64}, r"masked_embedding.centroids.weight: shape \[32, 64\] does not match the config, "
                                r"expected \[64, 64\]"),
    ],
)  # fmt: skip
def test_a_broken_head_is_one_line_and_leaves_nothing(tiny, tmp_path, change, message):
    src = head_checkpoint(tmp_path / "src", **change)
    out = tmp_path / "out" / "d.gguf"
    out.parent.mkdir()
    with pytest.raises(Exception, match=message) as e:
        convert_drafter(src, out, tiny / "target.gguf")
    assert "\n" not in str(e.value)
    assert list(out.parent.iterdir()) == []
