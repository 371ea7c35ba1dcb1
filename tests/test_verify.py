"""`verify` can fail: every rule it checks gets a file that breaks it (issue 10 §1), and
sources keep their own precision end to end (issue 10 §2)."""

import hashlib
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType

from gguf_exact.cli import main
from gguf_exact.core import q4_0
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.drafter.verify import verify_gguf
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import encode
from gguf_exact.formats.gguf_reader import open_gguf
from gguf_exact.formats.gguf_stream import write_gguf
from gguf_exact.tiny.models import drafter_config, drafter_tensors, write_checkpoint
from gguf_exact.tiny.peers import float_drafter_gguf

Q4_0, F32, F16, BF16 = (GGMLQuantizationType[n] for n in ("Q4_0", "F32", "F16", "BF16"))
TYPED = {F32: np.float32, F16: np.float16}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def read_all(path):
    """(kv pairs as bytes, [(name, data as write_gguf takes it, type)]) of a GGUF."""
    with open_gguf(path) as g:
        kv = [kv.raw for kv in g.header.kv]
        tensors = []
        for t in g.tensors:
            raw = g.read_rows(t, 0, t.rows)
            data = raw.view(TYPED[t.type]).reshape(t.shape) if t.type in TYPED else raw.reshape(*t.shape[:-1], -1)
            tensors.append((t.name, data.copy(), t.type))
    return kv, tensors


def rewrite(src, dst, change=None, drop=(), add=()):
    kv, tensors = read_all(src)
    out = []
    for name, data, qtype in tensors:
        if name in drop:
            continue
        out.append((name, change(name, data) if change else data, qtype))
    write_gguf(dst, kv, out + list(add))
    return dst


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "d.gguf"
    convert_drafter(tiny / "drafter-fp32", out, tiny / "target.gguf")
    return out


def expect_verify_failure(path, source, *needles):
    result = run("verify", path, "--source", source)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "verification failed" in lines[0], result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_converted_file_passes(converted, tiny):
    result = run("verify", converted, "--source", tiny / "drafter-fp32", "--json")
    assert result.exit_code == 0, result.output
    import json

    v = json.loads(result.stdout)
    notes = {t["name"]: t["note"] for t in v["tensors"]}
    assert notes["token_embd.weight"] == "exact Q4_0: levels and scales checked"
    assert notes["output_norm.weight"] == "values checked"
    assert v["total"]["max_ulps"] == 1 and v["total"]["exact_fraction"] > 0.998


def test_one_flipped_nibble_fails_naming_tensor_and_block(converted, tiny, tmp_path):
    def flip(name, data):
        if name == "blk.1.ffn_gate.weight":
            blocks = data.reshape(-1, q4_0.BLOCK_BYTES)
            blocks[37, 2 + 5] ^= 0x01  # level of value 5 of block 37 moves by one
        return data

    bad = rewrite(converted, tmp_path / "bad.gguf", flip)
    expect_verify_failure(
        bad,
        tiny / "drafter-fp32",
        "tensor blk.1.ffn_gate.weight: Q4_0 block 37 (row 18, column 32)",
        "not the source grid's",
    )


def test_a_wrong_scale_with_the_right_levels_fails(converted, tiny, tmp_path):
    def scale(name, data):
        if name == "nextn.post_projection.weight":
            blocks = data.reshape(-1, q4_0.BLOCK_BYTES)
            d = blocks[3, :2].copy().view(np.float16)
            blocks[3, :2] = (d * np.float16(1.02)).view(np.uint8)  # same levels, values ~2% off
        return data

    bad = rewrite(converted, tmp_path / "bad.gguf", scale)
    expect_verify_failure(
        bad, tiny / "drafter-fp32", "tensor nextn.post_projection.weight: Q4_0 block 3", "bf16 ULP from the source"
    )


def test_same_grid_stored_another_way_passes(converted, tiny, tmp_path):
    # +8-style storage of an ordinary block: -d and negated levels are the same grid points
    def negate(name, data):
        if name == "blk.0.ffn_up.weight":
            blocks = data.reshape(-1, q4_0.BLOCK_BYTES)
            levels, d = q4_0.unpack(blocks[:4])
            ok = (levels != -8).all(axis=1)
            blocks[:4][ok] = q4_0.pack(-levels[ok], -d[ok])
        return data

    same = rewrite(converted, tmp_path / "same.gguf", negate)
    assert run("verify", same, "--source", tiny / "drafter-fp32").exit_code == 0


def test_a_norm_off_by_one_bit_fails(converted, tiny, tmp_path):
    def nudge(name, data):
        if name == "blk.2.ffn_norm.weight":
            data.view(np.uint32)[7] ^= 1
        return data

    bad = rewrite(converted, tmp_path / "bad.gguf", nudge)
    expect_verify_failure(bad, tiny / "drafter-fp32", "tensor blk.2.ffn_norm.weight: value at row 0, column 7")


def test_missing_extra_reshaped_retyped_and_generated_tensors_fail(converted, tiny, tmp_path):
    src = tiny / "drafter-fp32"
    expect_verify_failure(
        rewrite(converted, tmp_path / "m.gguf", drop={"blk.3.ffn_down.weight"}),
        src,
        "tensor blk.3.ffn_down.weight is missing",
    )
    extra = ("blk.9.mystery.weight", np.ones(4, np.float32), F32)
    expect_verify_failure(
        rewrite(converted, tmp_path / "x.gguf", add=[extra]), src, "tensor blk.9.mystery.weight has no source tensor"
    )
    kv, tensors = read_all(converted)
    with Checkpoint(src) as ckpt:
        embd = ckpt.read("model.embed_tokens.weight")
    q8 = [(n, d, q) for n, d, q in tensors if n != "token_embd.weight"] + [
        ("token_embd.weight", encode(embd, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    ]
    write_gguf(tmp_path / "q8.gguf", kv, q8)
    expect_verify_failure(
        tmp_path / "q8.gguf", src, "tensor token_embd.weight is Q8_0, but its source", "exact Q4_0 expected"
    )

    def rope(name, data):
        return data * 2 if name == "rope_freqs.weight" else data

    expect_verify_failure(
        rewrite(converted, tmp_path / "r.gguf", rope),
        src,
        "tensor rope_freqs.weight differs from what the config gives",
    )


def test_llama_quantize_q4_0_of_the_same_source_fails(tiny, tmp_path):
    from _llama_server import server_binary

    quantize = server_binary().with_name("llama-quantize")
    src = float_drafter_gguf(tiny / "drafter-fp32", tiny / "target.gguf", tmp_path / "bf16.gguf", BF16)
    out = tmp_path / "llama-quantize-q4_0.gguf"
    done = subprocess.run([str(quantize), "--pure", str(src), str(out), "Q4_0", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    line = expect_verify_failure(out, tiny / "drafter-fp32", "Q4_0 block", "not the source grid's")
    assert "tensor " in line
    # measured, not judged, it is still readable: most values are off the source
    measured = verify_gguf(out, tiny / "drafter-fp32", judge=False).total
    assert measured.exact_fraction < 0.9


# --- sources keep their precision (issue 10 §2) -------------------------------------------


def precise_checkpoint(folder, norm_dtype):
    """The tiny drafter with norms in ``norm_dtype`` holding values bf16 cannot, and one
    matrix in float32 off the grid."""
    rng = np.random.default_rng(3)
    tensors = drafter_tensors(seed=1)
    for name in list(tensors):
        if name.endswith("norm.weight"):
            tensors[name] = (1.0 + rng.normal(0, 0.05, tensors[name].shape)).astype(norm_dtype)
    tensors["model.layers.2.mlp.up_proj.weight"] = rng.normal(0, 0.02, (128, 64)).astype(np.float32)
    return write_checkpoint(folder, drafter_config(), tensors)


@pytest.mark.parametrize("norm_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("off_grid", ["f32", "f16", "bf16"])
def test_f32_and_f16_sources_keep_their_bits(tiny, tmp_path, norm_dtype, off_grid):
    src = precise_checkpoint(tmp_path / "src", norm_dtype)
    out = tmp_path / "d.gguf"
    convert_drafter(src, out, tiny / "target.gguf", off_grid=off_grid)
    _, tensors = read_all(out)
    got = {n: d for n, d, _ in tensors}
    with Checkpoint(src) as ckpt:
        norm = ckpt.read("model.layers.0.input_layernorm.weight")
        up = ckpt.read("model.layers.2.mlp.up_proj.weight")
    # norms: F32 holding the source's own value, bit for bit
    assert got["blk.0.attn_norm.weight"].dtype == np.float32
    assert np.array_equal(got["blk.0.attn_norm.weight"], norm.astype(np.float32))
    # the F32 matrix off the grid: rounded once, from its float32 values, to the type asked for
    stored = got["blk.2.ffn_up.weight"]
    if off_grid == "f32":
        assert np.array_equal(stored.view(np.uint32), up.view(np.uint32))
    elif off_grid == "f16":
        assert np.array_equal(stored.view(np.uint16), up.astype(np.float16).view(np.uint16))
    else:
        import ml_dtypes

        assert np.array_equal(
            stored.reshape(-1).view(np.uint16), up.astype(ml_dtypes.bfloat16).view(np.uint16).reshape(-1)
        )
    assert run("verify", out, "--source", src).exit_code == 0


def test_a_norm_rounded_through_bf16_is_caught(tiny, tmp_path):
    src = precise_checkpoint(tmp_path / "src", np.float32)
    out = tmp_path / "d.gguf"
    convert_drafter(src, out, tiny / "target.gguf", off_grid="f32")

    def through_bf16(name, data):  # what gguf-exact did before: bf16(source), stored as F32
        if name == "output_norm.weight":
            from gguf_exact.core import bf16

            return bf16.to_f32(bf16.from_f32(data))
        return data

    bad = rewrite(out, tmp_path / "bad.gguf", through_bf16)
    expect_verify_failure(bad, src, "tensor output_norm.weight: value at row 0")


def test_an_f32_matrix_that_bf16_holds_is_packed_exactly(tiny, tmp_path):
    tensors = drafter_tensors(seed=1)
    from gguf_exact.core import bf16

    tensors["model.layers.1.mlp.gate_proj.weight"] = bf16.to_f32(tensors["model.layers.1.mlp.gate_proj.weight"])
    src = write_checkpoint(tmp_path / "src", drafter_config(), tensors)
    a = convert_drafter(src, tmp_path / "a.gguf", tiny / "target.gguf")
    b = convert_drafter(tiny / "drafter-fp32", tmp_path / "b.gguf", tiny / "target.gguf")
    assert a.sha256 == b.sha256  # the same values, so the same bytes


def test_an_f32_matrix_bf16_cannot_hold_is_refused_without_off_grid(tiny, tmp_path):
    src = precise_checkpoint(tmp_path / "src", np.float32)
    with pytest.raises(
        GgufExactError, match=r"tensor model.layers.2.mlp.up_proj.weight: F32 values that bf16 cannot hold exactly"
    ):
        convert_drafter(src, tmp_path / "d.gguf", tiny / "target.gguf")
    assert not (tmp_path / "d.gguf").exists()


# --- the packer's bytes do not move (issue 12) -----------------------------------------------

# sha256 of the tensor data (everything after the header) of files made by the packer as
# it was before the fused kernel (commit 5e92d89); a change here is a change in what
# users' files hold, not a refactor. (The header is not pinned: key order follows upstream.)
BEFORE = {
    "drafter-fp32": "3ef752c38f9c8a8f71333bbb013521ec3a3e001cb1b03ab92664442cc6043d41",
    "drafter-bf16": "9f2bf751a03cf4340dcde5ad9d30a902b69f85bd650869f9767bd135762be6e2",
    "bench set at 1/16": "6768b7834fa36e6f86e963ccafa2130b90ea9fc541b17395fb0f64812b274a88",
}


@pytest.mark.parametrize("name", ["drafter-fp32", "drafter-bf16"])
def test_converted_fixtures_hold_the_tensor_bytes_they_did_before(tiny, tmp_path, name):
    out = tmp_path / "d.gguf"
    convert_drafter(tiny / name, out, tiny / "target.gguf")
    with open_gguf(out) as g:
        start = g.header.data_start
    assert hashlib.sha256(out.read_bytes()[start:]).hexdigest() == BEFORE[name]


# The matrices of the E2B drafter (name, rows, cols), as the benchmark used them before
# the fused kernel; token_embd scaled by 1/16 to keep the test short.
E2B_DRAFTER = [
    ("token_embd.weight", 262144, 256),
    ("nextn.pre_projection.weight", 256, 3072),
    ("nextn.post_projection.weight", 1536, 256),
] + [
    (f"blk.{i}.{n}.weight", r, c)
    for i in range(4)
    for n, r, c in (
        ("attn_q", 2048 if i == 3 else 1024, 256),
        ("attn_output", 256, 2048 if i == 3 else 1024),
        ("ffn_gate", 2048, 256),
        ("ffn_up", 2048, 256),
        ("ffn_down", 256, 2048),
    )
]


def benchmark_set(scale: float, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    from gguf_exact.tiny.synthetic import qat_matrix

    rng = np.random.default_rng(seed)
    out = []
    for name, rows, cols in E2B_DRAFTER:
        rows = max(32, int(rows * scale) // 32 * 32) if name == "token_embd.weight" else rows
        out.append((name, qat_matrix(rng, rows, cols, step_kind="fp32", plus8_fraction=0.0)))
    return out


def test_benchmark_set_packs_to_the_bytes_it_did_before():
    from gguf_exact.core.exact import plan_matrix

    digest = hashlib.sha256()
    for _, bits in benchmark_set(1 / 16):
        digest.update(plan_matrix(bits).data.tobytes())
    assert digest.hexdigest() == BEFORE["bench set at 1/16"]
