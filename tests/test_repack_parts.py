"""The pieces under ``repack``: GGUF header by hand, streaming writer, row reader,
chunked planning and statistics, the Q6_K encoder, the gemma4 name table."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

from gguf_exact.core import bf16, q6_k
from gguf_exact.core.error_stats import ErrorStats, compare_chunk
from gguf_exact.core.exact import plan_matrix, plan_rows
from gguf_exact.formats.gguf_layout import TensorEntry, encode_header, parse_header
from gguf_exact.formats.gguf_stream import StreamingGGUF, pwrite_all
from gguf_exact.gemma4.names import (
    Mapping,
    gguf_tensor_name,
    split_expert_source,
    tensor_kind,
)
from gguf_exact.tiny.synthetic import qat_matrix

T = GGMLQuantizationType


def gguf_py_file(path):
    w = GGUFWriter(path, "gemma4")
    w.add_uint32("gemma4.block_count", 3)
    w.add_float32("gemma4.rope.freq_base", 1e6)
    w.add_bool("flag", True)
    w.add_string("tokenizer.chat_template", "{{ x }} é")
    w.add_array("gemma4.attention.sliding_window_pattern", [True, False, True])
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "bé", ""])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0, -3.0])
    w.add_uint64("big", 1 << 40)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.normal(size=(3, 7)).astype(np.float32))
    w.add_tensor("q4", quants.quantize(rng.normal(size=(4, 64)).astype(np.float32), T.Q4_0), raw_dtype=T.Q4_0)
    w.add_tensor("f16", rng.normal(size=(5,)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_header_parsed_by_hand_matches_gguf_py(tmp_path):
    path = gguf_py_file(tmp_path / "a.gguf")
    raw = path.read_bytes()
    header = parse_header(raw)
    reader = GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert [kv.key for kv in header.kv] == list(fields)
    for kv in header.kv:
        assert kv.raw == b"".join(p.tobytes() for p in fields[kv.key].parts), kv.key
    assert header.value("gemma4.block_count") == 3 and header.value("tokenizer.chat_template") == "{{ x }} é"
    assert header.value("tokenizer.ggml.tokens") == (GGUFValueType.STRING, 4)
    assert header.data_start == reader.data_offset
    for mine, theirs in zip(header.tensors, reader.tensors):
        assert (mine.name, mine.ne, mine.type, header.data_start + mine.offset, mine.nbytes) == (
            theirs.name, tuple(int(x) for x in theirs.shape), theirs.tensor_type, theirs.data_offset, theirs.n_bytes,
        )  # fmt: skip
    # and written back, the header is the same bytes
    assert (
        encode_header(header.version, [kv.raw for kv in header.kv], header.tensors, header.alignment)
        == raw[: header.data_start]
    )


def test_short_or_foreign_headers():
    raw = b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (1).to_bytes(8, "little")
    with pytest.raises(EOFError):
        parse_header(raw)
    with pytest.raises(ValueError, match="no GGUF magic"):
        parse_header(b"PK\x03\x04" + b"\0" * 100)


def test_streaming_writer_places_tensors_and_rewrites_a_fallback(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    q8 = quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), T.Q8_0)
    entries = [TensorEntry("a", (4, 3), T.F32), TensorEntry("b", (32, 2), T.Q4_0)]
    from gguf_exact.formats.gguf_layout import encode_kv

    kv = [encode_kv("general.architecture", GGUFValueType.STRING, "gemma4")]
    w = StreamingGGUF(tmp_path / "s.gguf", 3, kv, entries, 32)
    pwrite_all(w.fd, a.view(np.uint8), w.place(entries[0]))
    pwrite_all(w.fd, np.full(36, 0xAB, np.uint8), w.place(entries[1]))  # Q4_0 bytes, then replaced:
    pwrite_all(w.fd, q8, w.replace_last(TensorEntry("b", (32, 2), T.Q8_0)))
    w.finish(kv)
    w.close()
    r = GGUFReader(tmp_path / "s.gguf")
    t = {x.name: x for x in r.tensors}
    assert np.array_equal(t["a"].data, a) and t["b"].tensor_type == T.Q8_0
    assert np.array_equal(np.asarray(t["b"].data).reshape(q8.shape), q8)
    assert (tmp_path / "s.gguf").stat().st_size % 32 == 0


def test_row_chunks_plan_the_same_bytes_as_the_whole_matrix():
    rng = np.random.default_rng(1)
    bits = qat_matrix(rng, 100, 96, zero_fraction=0.05)
    whole = plan_matrix(bits)
    parts = [plan_rows(bits[r0 : r0 + 7], r0) for r0 in range(0, 100, 7)]
    assert np.array_equal(np.concatenate([p.data for p in parts]), whole.data)
    assert sum(p.exact_values for p in parts) == whole.exact_values
    bits[57, 40] ^= 0x0010  # knock one value off the grid
    off = [plan_rows(bits[r0 : r0 + 7], r0) for r0 in range(0, 100, 7)]
    assert sum(p.off_grid_blocks for p in off) == 1 and off[57 // 7].first_off_grid[0][:2] == (57, 32)
    assert off[57 // 7].data is None


def reference_figures(decoded, src):
    """The figures computed the plain way, every value looked at."""
    rounded = bf16.from_f32(decoded)
    exact = int(bf16.same_value(rounded, src).sum())
    max_ulps = int(bf16.ulp_distance(rounded, src).max(initial=0))
    source = bf16.to_f32(src).astype(np.float64)
    diff = bf16.to_f32(rounded).astype(np.float64) - source
    return exact, max_ulps, float(diff @ diff), float(source @ source)


def test_chunk_statistics_equal_the_plain_computation():
    rng = np.random.default_rng(2)
    for noise in (0.0, 1e-4, 1e-2):
        src = bf16.from_f32(rng.normal(0, 0.02, 4000).astype(np.float32))
        src[rng.random(4000) < 0.1] = 0x8000  # -0
        decoded = bf16.to_f32(src) * (1 + noise * rng.normal(size=4000)).astype(np.float32)
        decoded[rng.random(4000) < 0.02] *= -1
        exact, max_ulps, sq_error, sq_source = reference_figures(decoded, src)
        s = compare_chunk(decoded, src)
        assert (s.exact, s.max_ulps) == (exact, max_ulps)
        assert s.sq_error == pytest.approx(sq_error) and s.sq_source == pytest.approx(sq_source, rel=1e-5)
        quick = compare_chunk(decoded, src, ulps=False)
        assert quick.max_ulps == -1 and quick.exact == exact and "max_ulps" not in quick.as_dict()
    total = ErrorStats()
    total.add(ErrorStats(10, 10, 0, 0.0, 1.0))
    total.add(ErrorStats(10, 5, 3, 1.0, 1.0))
    assert (total.n_values, total.exact, total.max_ulps, total.rel_error) == (20, 15, 3, pytest.approx(np.sqrt(0.5)))


def test_q6_k_encoder_decodes_with_gguf_py():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 0.05, (6, 512)).astype(np.float32)
    x[2] = 0
    q = q6_k.quantize(x)
    assert q.shape == (6, 2 * 210)
    y = quants.dequantize(q, T.Q6_K)
    assert np.all(y[2] == 0)
    assert np.sqrt(((y - x) ** 2).mean() / (x**2).mean()) < 0.03
    with pytest.raises(ValueError):
        q6_k.quantize(x[:, :100])


def test_row_source_reads_rows_and_expert_halves(tmp_path):
    from gguf_exact.formats.checkpoint import Checkpoint
    from gguf_exact.formats.safetensors_stream import StreamTensor, write_folder
    from gguf_exact.stream.source_rows import RowSource, locate

    bank = np.arange(3 * 8 * 32, dtype=np.uint16).reshape(3, 8, 32)
    f32 = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    write_folder(tmp_path, {"architectures": []}, [
        StreamTensor("bank", bank.shape, "BF16", lambda r0, r1: bank[r0:r1]),
        StreamTensor("f32", f32.shape, "F32", lambda r0, r1: f32[r0:r1]),
    ])  # fmt: skip
    with Checkpoint(tmp_path) as ckpt:
        loc = locate(ckpt)
    whole = RowSource(loc["bank"])
    assert whole.shape == (24, 32) and np.array_equal(whole.read(5, 19), bank.reshape(24, 32)[5:19])
    up = RowSource(loc["bank"], (4, 4, 8))  # rows 4..7 of every expert
    assert up.shape == (12, 32)
    assert np.array_equal(up.read(0, 12), bank[:, 4:, :].reshape(12, 32))
    assert np.array_equal(up.read(3, 9), bank[:, 4:, :].reshape(12, 32)[3:9])
    f32_rows = RowSource(loc["f32"]).read(0, 2)  # in its own precision, not rounded to bf16
    assert f32_rows.dtype == np.float32 and np.array_equal(f32_rows.view(np.uint32), f32.view(np.uint32))


def test_gemma4_name_table():
    p = "model.language_model."
    assert gguf_tensor_name(p + "embed_tokens_per_layer.weight") == Mapping("per_layer_token_embd.weight", "qat")
    assert gguf_tensor_name(p + "per_layer_model_projection.weight") == Mapping("per_layer_model_proj.weight", "qat")
    assert gguf_tensor_name(p + "layers.3.per_layer_input_gate.weight") == Mapping("blk.3.inp_gate.weight", "qat")
    assert gguf_tensor_name(p + "layers.3.post_per_layer_input_norm.weight") == Mapping(
        "blk.3.post_norm.weight", "copy"
    )
    assert gguf_tensor_name(p + "layers.12.experts.gate_up_proj") == Mapping("blk.12.ffn_gate_up_exps.weight", "qat")
    assert gguf_tensor_name(p + "layers.12.router.proj.weight") == Mapping("blk.12.ffn_gate_inp.weight", "probe")
    assert gguf_tensor_name(p + "layers.0.layer_scalar") == Mapping("blk.0.layer_output_scale.weight", "copy")
    assert gguf_tensor_name("model.layers.0.mlp.down_proj.weight") == Mapping(
        "blk.0.ffn_down.weight", "qat"
    )  # text-only checkpoints
    assert gguf_tensor_name("model.vision_tower.encoder.layers.0.mlp.fc1.weight") is None
    assert split_expert_source("blk.2.ffn_up_exps.weight") == ("blk.2.ffn_gate_up_exps.weight", 1)
    assert (
        tensor_kind("blk.2.ffn_up_exps.weight", 3) == "expert banks"
        and tensor_kind("blk.0.attn_norm.weight", 1) == "norms, scales, other"
    )
