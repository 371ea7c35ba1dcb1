"""The CLI: happy paths, and bad input giving one clear line and no output file."""

import json
import struct

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader

from gguf_exact.cli import main
from gguf_exact.core import bf16
from gguf_exact.tiny.models import (
    TinyDrafter,
    TinyTarget,
    drafter_config,
    drafter_tensors,
    write_checkpoint,
    write_tiny_target,
)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_inspect_json_and_table(tiny):
    result = run("inspect", tiny / "drafter-bf16", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["is_qat"] is True
    planned = {t["name"]: t["planned"] for t in report["tensors"]}
    assert planned["model.embed_tokens.weight"] == "Q4_0"
    assert planned["masked_embedding.centroids.weight"] == "kept"  # the head's: Q4_0 if on the grid, else bf16
    assert planned["masked_embedding.token_ordering"] == "I32"
    assert planned["model.norm.weight"] == "F32"
    assert sum(1 for p in planned.values() if p == "Q4_0") == 23
    embd = next(t for t in report["tensors"] if t["name"] == "model.embed_tokens.weight")
    assert embd["blocks"] == 320 * 64 // 32 and embd["on_grid_fraction"] == 1.0 and embd["exact_fraction"] == 1.0
    table = run("inspect", tiny / "drafter-bf16")
    assert "QAT 4-bit: all 23 weight matrices are on the Q4_0 grid; 100.0000%" in table.stdout


def test_convert_verify_compare(tiny, tmp_path):
    out = tmp_path / "d.gguf"
    result = run("convert", tiny / "drafter-bf16", out, "--vocab-from", tiny / "target.gguf")
    assert result.exit_code == 0, result.output
    assert "bit-exact (100.0000%), largest error 0 bf16 ULP" in result.stdout
    digest = result.stdout.split("sha256 ")[1].split()[0]
    verify = run("verify", out, "--source", tiny / "drafter-bf16", "--vocab-from", tiny / "target.gguf", "--json")
    assert verify.exit_code == 0
    v = json.loads(verify.stdout)
    assert v["ok"] and v["sha256"] == digest and v["total"]["exact_fraction"] == 1.0 and len(v["tensors"]) == 51
    compare = run("compare", "--source", tiny / "drafter-bf16", out)
    assert compare.exit_code == 0 and "Q4_0 x23" in compare.stdout and "I32 x1" in compare.stdout and "100.00" in compare.stdout


def expect_error(args, message, out):
    result = run(*args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0], lines[0]
    leftovers = [p.name for p in out.parent.iterdir()] if out.parent.exists() else []
    assert leftovers == [], leftovers


def convert_args(src, out, target):
    return ["convert", src, out, "--vocab-from", target]


@pytest.fixture
def out(tmp_path):
    (tmp_path / "out").mkdir()
    return tmp_path / "out" / "drafter.gguf"


def test_truncated_safetensors(drafter_copy, out, tiny):
    f = drafter_copy / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    expect_error(convert_args(drafter_copy, out, tiny / "target.gguf"), "model.safetensors: truncated: tensor", out)


def test_header_length_past_end(drafter_copy, out, tiny):
    f = drafter_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(struct.pack("<Q", len(data) * 2) + data[8:])
    expect_error(convert_args(drafter_copy, out, tiny / "target.gguf"), "header length", out)


def test_missing_config_key(drafter_copy, out, tiny):
    cfg = json.loads((drafter_copy / "config.json").read_text())
    del cfg["text_config"]["num_attention_heads"]
    (drafter_copy / "config.json").write_text(json.dumps(cfg))
    expect_error(
        convert_args(drafter_copy, out, tiny / "target.gguf"),
        "config.json: missing text_config.num_attention_heads",
        out,
    )


def test_unsupported_architecture(drafter_copy, out, tiny):
    cfg = json.loads((drafter_copy / "config.json").read_text())
    cfg["architectures"] = ["Gemma4ForCausalLM"]
    (drafter_copy / "config.json").write_text(json.dumps(cfg))
    expect_error(
        convert_args(drafter_copy, out, tiny / "target.gguf"),
        "architectures ['Gemma4ForCausalLM'] is not supported",
        out,
    )


def test_unsupported_dtype(tmp_path, out, tiny):
    tensors = drafter_tensors(seed=1)
    tensors["model.norm.weight"] = bf16.to_f32(tensors["model.norm.weight"]).astype(np.float64)
    src = write_checkpoint(tmp_path / "src", drafter_config(), tensors)
    expect_error(convert_args(src, out, tiny / "target.gguf"), "tensor model.norm.weight has dtype F64", out)


def test_row_length_not_multiple_of_32(tmp_path, out, tiny):
    spec = TinyDrafter(hidden_size=48)
    src = write_checkpoint(tmp_path / "src", drafter_config(spec), drafter_tensors(spec, seed=1))
    expect_error(
        convert_args(src, out, tiny / "target.gguf"),
        "model.embed_tokens.weight: row length 48 is not a multiple of 32",
        out,
    )


def test_nan(tmp_path, out, tiny):
    tensors = drafter_tensors(seed=1)
    tensors["model.layers.1.mlp.down_proj.weight"][3, 70] = 0x7FC0
    src = write_checkpoint(tmp_path / "src", drafter_config(), tensors)
    expect_error(
        convert_args(src, out, tiny / "target.gguf"),
        "down_proj.weight: 1 values are NaN or Inf (first at row 3, column 70)",
        out,
    )


def test_off_grid_matrix(tmp_path, out, tiny):
    tensors = drafter_tensors(seed=1)
    tensors["post_projection.weight"] = bf16.from_f32(
        np.random.default_rng(0).normal(0, 0.02, (128, 64)).astype(np.float32)
    )
    src = write_checkpoint(tmp_path / "src", drafter_config(), tensors)
    expect_error(
        convert_args(src, out, tiny / "target.gguf"),
        "post_projection.weight: 256 of 256 blocks are off the 4-bit grid",
        out,
    )
    inspect = run("inspect", src, "--json")
    assert json.loads(inspect.stdout)["is_qat"] is False


def test_unwritable_output_directory(tiny, tmp_path):
    missing = tmp_path / "no-such-dir" / "d.gguf"
    expect_error(convert_args(tiny / "drafter-fp32", missing, tiny / "target.gguf"), "output directory", missing)
    (tmp_path / "a-file").write_text("x")
    under_file = tmp_path / "a-file" / "d.gguf"
    result = run(*convert_args(tiny / "drafter-fp32", under_file, tiny / "target.gguf"))
    assert result.exit_code == 1 and "output directory" in result.stderr


def test_target_without_tokenizer(tmp_path, out, tiny):
    target = write_tiny_target(tmp_path / "t.gguf", with_tokenizer=False)
    expect_error(convert_args(tiny / "drafter-fp32", out, target), "t.gguf: has no tokenizer.* keys", out)


def test_target_vocab_size_differs(tmp_path, out, tiny):
    target = write_tiny_target(tmp_path / "t.gguf", spec=TinyTarget(n_vocab=352))
    expect_error(
        convert_args(tiny / "drafter-fp32", out, target),
        "vocabulary has 352 tokens but the drafter's vocab_size is 320",
        out,
    )


def test_target_is_not_gguf(tmp_path, out, tiny):
    (tmp_path / "t.gguf").write_bytes(b"not a gguf file at all")
    expect_error(convert_args(tiny / "drafter-fp32", out, tmp_path / "t.gguf"), "t.gguf: not a GGUF file", out)


def test_missing_shard(tmp_path, out, tiny):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny / "drafter-sharded", src)
    (src / "model-00002-of-00003.safetensors").unlink()
    expect_error(
        convert_args(src, out, tiny / "target.gguf"),
        "lists shard model-00002-of-00003.safetensors, which is missing",
        out,
    )


def test_convert_full_head_drops_the_ordered_head(tiny, tmp_path):
    out = tmp_path / "full.gguf"
    result = run("convert", tiny / "drafter-bf16", out, "--vocab-from", tiny / "target.gguf", "--full-head")
    assert result.exit_code == 0, result.output
    assert "F32 x26, Q4_0 x23" in result.stdout and "I32" not in result.stdout
    names = {t.name for t in GGUFReader(out).tensors}
    assert len(names) == 49 and not any(n.startswith("masked_embd") for n in names)
    verify = run("verify", out, "--source", tiny / "drafter-bf16", "--vocab-from", tiny / "target.gguf")
    assert verify.exit_code == 0 and "49 tensors and 34 keys judged" in verify.stdout
