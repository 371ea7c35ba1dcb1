"""`verify` judges exactness, header to last block (issue 16): a converted file passes with
its verdict line, a changed one fails naming what and where with the true figures, what
cannot be judged is named; sources keep their own precision end to end (issue 10 §2).
The mutation suite is tests/test_verify_mutations.py; the block rule's unit tests are
tests/test_block_exactness.py."""

import hashlib
import json
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType
from gguf_edit import block_message, read_all, rewrite
from helpers import off_grid_checkpoint, source_bits
from rich.console import Console

from gguf_exact.cli import console, main
from gguf_exact.core import q4_0
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.drafter.verify import verify_gguf
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_reader import open_gguf
from gguf_exact.tiny.models import drafter_config, drafter_tensors, write_checkpoint
from gguf_exact.tiny.peers import float_drafter_gguf

Q4_0, F32, F16, BF16, Q8_0 = (GGMLQuantizationType[n] for n in ("Q4_0", "F32", "F16", "BF16", "Q8_0"))
TOKENIZER_KEYS = (
    "10 keys (tokenizer.ggml.model, tokenizer.ggml.tokens, tokenizer.ggml.scores, tokenizer.ggml.token_type, ...): "
    "copied from the target GGUF by convert --vocab-from; give --vocab-from TARGET.gguf to compare them as bytes"
)


@pytest.fixture(autouse=True)
def whole_lines(monkeypatch):
    """verify's lines whole, as a terminal wider than them shows them (a narrower one gets them wrapped)."""
    monkeypatch.setattr(console, "out", Console(highlight=False, width=2000))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "d.gguf"
    convert_drafter(tiny / "drafter-fp32", out, tiny / "target.gguf")
    return out


def verify_args(path, tiny, *extra):
    return ["verify", path, "--source", tiny / "drafter-fp32", "--vocab-from", tiny / "target.gguf", *extra]


def expect_failure(args, expected: str, n_failures: int = 1) -> str:
    """exit 1, the failures printed, the verdict last on stdout, one `error:` line whose
    first failure is ``expected`` exactly."""
    result = run(*args)
    assert result.exit_code == 1, result.output
    path = args[1]
    more = f" (and {n_failures - 1} more failure{'s' if n_failures > 2 else ''})" if n_failures > 1 else ""
    assert result.stderr.splitlines() == [f"error: {path}: verification failed: {expected}{more}"], result.stderr
    lines = result.stdout.strip().splitlines()
    listed = f" ({n_failures - 1} more listed)" if n_failures > 1 else ""
    assert (
        lines[-1]
        == f"verify: FAIL — {path}: {n_failures} failure{'s' if n_failures > 1 else ''}; first: {expected}{listed}"
    )
    assert f"FAIL        {expected}" in lines
    return expected


def pass_verdict(path, tiny, report, equally=0, more=0):
    tail = f" ({equally:,} equally exact with another scale, {more:,} more exact)" if equally or more else ""
    return (
        f"verify: PASS — {path}: 51 tensors and 36 keys judged against {tiny / 'drafter-fp32'}; 23 Q4_0 matrices, "
        f"{report['exact_values'] / report['values_q4']:.4%} of {report['values_q4']:,} values bit-exact, every block "
        f"as exact as the plan{tail}; 1 matrix off the grid, stored as convert defines"  # the head's bf16 centroids
    )


@pytest.fixture(scope="module")
def report(tiny, converted):
    r = convert_drafter(tiny / "drafter-fp32", converted.with_name("again.gguf"), tiny / "target.gguf").report
    q4 = [t for t in r["tensors"] if t["type"] == "Q4_0"]
    return {"exact_values": sum(t["exact_values"] for t in q4), "values_q4": sum(t["values"] for t in q4)}


def test_a_converted_file_passes_with_one_verdict_line(converted, tiny, report):
    result = run(*verify_args(converted, tiny))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == pass_verdict(converted, tiny, report)
    assert result.stderr == ""
    digest = hashlib.sha256(converted.read_bytes()).hexdigest()
    assert f"sha256 {digest}" in result.stdout.splitlines()


def test_json_carries_ok_the_verdict_and_every_tensors_judgement(converted, tiny, report):
    result = run(*verify_args(converted, tiny, "--json"))
    assert result.exit_code == 0, result.output
    v = json.loads(result.stdout)
    assert (v["ok"], v["failures"], v["unchecked"], v["verdict"]) == (
        True,
        [],
        [],
        pass_verdict(converted, tiny, report),
    )
    assert v["keys"] == {"judged": 36, "not_judged": 0}
    assert v["blocks"] == {"total": 7040, "as_planned": 7040, "equally_exact": 0, "more_exact": 0, "less_exact": 0}
    by_name = {t["name"]: t for t in v["tensors"]}
    assert len(by_name) == 51 and {t["status"] for t in v["tensors"]} == {"pass"}
    embd = by_name["token_embd.weight"]
    assert (embd["type"], embd["planned"], embd["note"]) == (
        "Q4_0",
        "Q4_0",
        "exact Q4_0: every block by the block rule",
    )
    assert embd["blocks"] == {"total": 640, "as_planned": 640, "equally_exact": 0, "more_exact": 0, "less_exact": 0}
    assert by_name["output_norm.weight"]["note"] == "F32: the source's values, every bit"
    assert by_name["rope_freqs.weight"]["note"] == "generated from config.json"
    assert v["total"]["exact_values"] == report["exact_values"] + sum(
        t["values"] for t in v["tensors"] if t["type"] in ("F32", "BF16") and "values" in t
    )
    centroids, ordering = by_name["masked_embd_centroids.weight"], by_name["masked_embd_ordering"]
    assert (centroids["type"], centroids["planned"], centroids["note"], centroids["values"]) == (
        "BF16", "BF16", "off the grid: the source as BF16, every bit", 32 * 64,
    )  # fmt: skip
    assert (ordering["type"], ordering["note"]) == ("I32", "the source's masked_embedding.token_ordering as I32")
    assert v["sha256"] == hashlib.sha256(converted.read_bytes()).hexdigest()


def test_without_the_target_the_tokenizer_is_named_and_verify_is_incomplete(converted, tiny, report):
    args = ["verify", converted, "--source", tiny / "drafter-fp32"]
    result = run(*args)
    assert result.exit_code == 1, result.output
    assert result.stdout.strip().splitlines()[-1] == (
        f"verify: INCOMPLETE — {converted}: everything judged passes, but not judged: {TOKENIZER_KEYS}; "
        "--allow-unchecked accepts that"
    )
    assert result.stderr.splitlines() == [
        f"error: {converted}: not verified: not judged: {TOKENIZER_KEYS}; pass --allow-unchecked to accept that"
    ]
    allowed = run(*args, "--allow-unchecked")
    assert allowed.exit_code == 0, allowed.output
    passed = pass_verdict(converted, tiny, report).replace("36 keys", "26 keys")
    assert allowed.stdout.strip().splitlines()[-1] == f"{passed}; not judged (--allow-unchecked): {TOKENIZER_KEYS}"
    as_json = json.loads(run(*args, "--json").stdout)
    assert (as_json["ok"], as_json["unchecked"], as_json["keys"]) == (
        False,
        [TOKENIZER_KEYS],
        {"judged": 26, "not_judged": 10},
    )


def test_json_on_bad_input_is_an_object_with_the_error(converted, tiny, tmp_path):
    (tmp_path / "folder.gguf").mkdir()
    result = run("verify", tmp_path / "folder.gguf", "--source", tiny / "drafter-fp32", "--json")
    message = f"{tmp_path / 'folder.gguf'}: is a directory, not a GGUF file"
    assert result.exit_code == 1 and result.stderr.splitlines() == [f"error: {message}"]
    assert json.loads(result.stdout) == {"ok": False, "path": str(tmp_path / "folder.gguf"), "error": message}


def test_options_that_do_not_fit_the_file_are_refused(converted, tiny):
    keep = run(*verify_args(converted, tiny, "--off-grid", "keep"))
    assert keep.exit_code == 1 and keep.stderr.splitlines() == [
        "error: --off-grid keep keeps a donor's tensor: only a re-pack (with --donor) has one"
    ]


def flip_nibble(name, data):
    if name == "blk.1.ffn_gate.weight":
        data.reshape(-1, q4_0.BLOCK_BYTES)[37, 2 + 5] ^= 0x01  # the level of value 5 of block 37 moves by one
    return data


def test_one_flipped_nibble_fails_with_the_blocks_figures(converted, tiny, tmp_path):
    bad = rewrite(converted, tmp_path / "bad.gguf", flip_nibble)
    _, tensors = read_all(converted)
    plan = dict((n, d) for n, d, _ in tensors)["blk.1.ffn_gate.weight"].reshape(-1, 18)
    stored = plan.copy()
    stored[37, 7] ^= 0x01
    bits = source_bits(tiny / "drafter-fp32", "model.layers.1.mlp.gate_proj.weight").reshape(-1, 32)
    expected = block_message("blk.1.ffn_gate.weight", 64, 37, stored[37], plan[37], bits[37], 1, 256)
    assert "levels [" in expected  # a level moved: not the source grid's
    expect_failure(verify_args(bad, tiny), expected)
    # --json: the same failure, on stdout, with exit 1
    result = run(*verify_args(bad, tiny, "--json"))
    assert result.exit_code == 1
    v = json.loads(result.stdout)
    assert (v["ok"], v["failures"]) == (False, [expected])
    gate = next(t for t in v["tensors"] if t["name"] == "blk.1.ffn_gate.weight")
    assert (gate["status"], gate["failure"], gate["blocks"]["less_exact"]) == ("FAIL", expected.split(": ", 1)[1], 1)


def test_a_wrong_scale_with_the_right_levels_fails_with_its_figures(converted, tiny, tmp_path):
    def scale(name, data):
        if name == "nextn.post_projection.weight":
            blocks = data.reshape(-1, q4_0.BLOCK_BYTES)
            d = blocks[3, :2].copy().view(np.float16)
            blocks[3, :2] = (d * np.float16(1.02)).view(np.uint8)  # same levels, values ~2% off
        return data

    bad = rewrite(converted, tmp_path / "bad.gguf", scale)
    plan = dict((n, d) for n, d, _ in read_all(converted)[1])["nextn.post_projection.weight"].reshape(-1, 18)
    stored = dict((n, d) for n, d, _ in read_all(bad)[1])["nextn.post_projection.weight"].reshape(-1, 18)
    bits = source_bits(tiny / "drafter-fp32", "post_projection.weight").reshape(-1, 32)
    expected = block_message("nextn.post_projection.weight", 64, 3, stored[3], plan[3], bits[3], 1, 256)
    assert "same levels, scale " in expected
    expect_failure(verify_args(bad, tiny), expected)


def test_the_same_grid_stored_another_way_passes_and_is_counted(converted, tiny, tmp_path, report):
    # +8-style storage of ordinary blocks: -d and negated levels are the same grid points
    negated = []

    def negate(name, data):
        if name == "blk.0.ffn_up.weight":
            blocks = data.reshape(-1, q4_0.BLOCK_BYTES)
            levels, d = q4_0.unpack(blocks[:32])
            ok = (levels != -8).all(axis=1) & (levels != 0).any(axis=1)  # -(-8) is not a level; zeros negate to zeros
            blocks[:32][ok] = q4_0.pack(-levels[ok], -d[ok])
            negated.append(int(ok.sum()))
        return data

    same = rewrite(converted, tmp_path / "same.gguf", negate)
    n = negated[0]
    assert 0 < n < 32
    result = run(*verify_args(same, tiny, "--json"))
    assert result.exit_code == 0, result.output
    v = json.loads(result.stdout)
    up = next(t for t in v["tensors"] if t["name"] == "blk.0.ffn_up.weight")
    assert up["blocks"] == {"total": 256, "as_planned": 256 - n, "equally_exact": n, "more_exact": 0, "less_exact": 0}
    assert v["verdict"] == pass_verdict(same, tiny, report, equally=n)


def test_a_norm_off_by_one_bit_fails(converted, tiny, tmp_path):
    def nudge(name, data):
        if name == "blk.2.ffn_norm.weight":
            data.view(np.uint32)[7] ^= 1
        return data

    bad = rewrite(converted, tmp_path / "bad.gguf", nudge)
    norm = dict((n, d) for n, d, _ in read_all(converted)[1])["blk.2.ffn_norm.weight"]
    got = float(np.array([norm.view(np.uint32)[7] ^ 1], np.uint32).view(np.float32)[0])
    expect_failure(
        verify_args(bad, tiny),
        f"tensor blk.2.ffn_norm.weight: value at row 0, column 7 is {got!r}; the source's, exactly as F32, is {float(norm[7])!r}",
    )


@pytest.mark.llama_server
def test_llama_quantize_q4_0_of_the_same_source_fails(tiny, tmp_path):
    from _llama_server import server_binary

    quantize = server_binary().with_name("llama-quantize")
    src = float_drafter_gguf(tiny / "drafter-fp32", tiny / "target.gguf", tmp_path / "bf16.gguf", BF16)
    out = tmp_path / "llama-quantize-q4_0.gguf"
    done = subprocess.run([str(quantize), "--pure", str(src), str(out), "Q4_0", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    v = verify_gguf(out, tiny / "drafter-fp32", vocab_from=tiny / "target.gguf")
    assert not v.ok() and v.failures
    # every Q4_0 matrix fails: max / -8 steps lose exact values in most blocks, each named with its figures
    q4 = [t for t in v.tensors if t.type == "Q4_0"]
    assert len(q4) == 23 and all(t.status == "FAIL" and "is less exact than the plan" in t.failure for t in q4)
    blocks = v.blocks
    assert blocks.less_exact > blocks.n_blocks // 2
    # measured, not judged, it is still readable: most values are off the source
    measured = verify_gguf(out, tiny / "drafter-fp32", judge=False).total
    assert measured.exact_fraction < 0.9


# --- off-grid matrices: the bytes --off-grid defines ------------------------------------------


@pytest.fixture(scope="module")
def off_grid(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("off-grid")
    src = off_grid_checkpoint(root / "src")
    convert_drafter(src, root / "q8.gguf", tiny / "target.gguf", off_grid="q8_0")
    return root


def test_an_off_grid_fallback_is_judged_as_the_bytes_off_grid_defines(off_grid, tiny):
    src, q8 = off_grid / "src", off_grid / "q8.gguf"
    base = ["verify", q8, "--source", src, "--vocab-from", tiny / "target.gguf"]
    for extra in ([], ["--off-grid", "q8_0"]):  # the type the file records, or the choice given
        result = run(*base, *extra, "--json")
        assert result.exit_code == 0, result.output
        up = next(t for t in json.loads(result.stdout)["tensors"] if t["name"] == "blk.2.ffn_up.weight")
        assert (up["type"], up["planned"], up["status"]) == ("Q8_0", "Q8_0", "pass")
        assert up["note"] == "off the grid: the source as Q8_0, as --off-grid q8_0 writes it"
    where = "its source model.layers.2.mlp.up_proj.weight is off the 4-bit grid (256 blocks, first at row 0, column 0)"
    expect_failure(
        [*base, "--off-grid", "f16"],
        f"tensor blk.2.ffn_up.weight: is Q8_0, but {where}: no exact Q4_0 form; convert stores such a matrix as F16 (--off-grid)",
    )


def test_an_off_grid_matrix_stored_as_zeros_fails(off_grid, tiny, tmp_path):
    base = ["--source", off_grid / "src", "--vocab-from", tiny / "target.gguf"]
    f16_zeros = rewrite(
        off_grid / "q8.gguf",
        tmp_path / "z.gguf",
        retype={"blk.2.ffn_up.weight": (np.zeros((128, 64), np.float16), F16)},
    )
    with Checkpoint(off_grid / "src") as ckpt:
        first = float(np.array(ckpt.read("model.layers.2.mlp.up_proj.weight")[0, 0]).astype(np.uint32) << 16)
    value = float(np.array([int(first)], np.uint32).view(np.float32)[0])
    expected_value = float(np.float16(value))
    expect_failure(
        ["verify", f16_zeros, *base],
        f"tensor blk.2.ffn_up.weight: value at row 0, column 0 is 0.0; the source's, rounded once as F16, is {expected_value!r}",
    )
    # Q4_0 zeros (what the writer holds for an off-grid block before its fallback) have no exact form to match
    q4_zeros = rewrite(
        off_grid / "q8.gguf",
        tmp_path / "q.gguf",
        retype={"blk.2.ffn_up.weight": (np.zeros((128, 2 * 18), np.uint8), Q4_0)},
    )
    where = "its source model.layers.2.mlp.up_proj.weight is off the 4-bit grid (256 blocks, first at row 0, column 0)"
    expect_failure(
        ["verify", q4_zeros, *base],
        f"tensor blk.2.ffn_up.weight: is Q4_0, but {where}: no exact Q4_0 form; convert stores such a matrix as "
        "Q8_0 or F16 or BF16 or F32 (--off-grid)",
    )


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
    args = ["verify", out, "--source", src, "--vocab-from", tiny / "target.gguf"]
    for extra in ([], ["--off-grid", off_grid]):
        result = run(*args, *extra, "--json")
        assert result.exit_code == 0, result.output
        up = next(t for t in json.loads(result.stdout)["tensors"] if t["name"] == "blk.2.ffn_up.weight")
        assert up["note"] == f"off the grid: the source as {off_grid.upper()}, as --off-grid {off_grid} writes it"
        assert up["status"] == "pass"
    other = {"f32": "f16", "f16": "bf16", "bf16": "f32"}[off_grid]
    assert run(*args, "--off-grid", other).exit_code == 1


def test_an_f32_matrix_bf16_cannot_hold_stored_as_q4_0_fails_naming_why(tiny, tmp_path):
    src = precise_checkpoint(tmp_path / "src", np.float32)
    out = convert_drafter(src, tmp_path / "d.gguf", tiny / "target.gguf", off_grid="f16").path
    zeros = rewrite(out, tmp_path / "z.gguf", retype={"blk.2.ffn_up.weight": (np.zeros((128, 36), np.uint8), Q4_0)})
    expect_failure(
        ["verify", zeros, "--source", src, "--vocab-from", tiny / "target.gguf"],
        "tensor blk.2.ffn_up.weight: is Q4_0, but its source model.layers.2.mlp.up_proj.weight holds F32 values that "
        "bf16 cannot (256 blocks, first at row 0, column 0): no exact Q4_0 form; convert stores such a matrix as "
        "Q8_0 or F16 or BF16 or F32 (--off-grid)",
    )


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
    norm = dict((n, d) for n, d, _ in read_all(out)[1])["output_norm.weight"]
    from gguf_exact.core import bf16

    rounded = bf16.to_f32(bf16.from_f32(norm))
    col = int(np.flatnonzero(rounded.view(np.uint32) != norm.view(np.uint32))[0])
    expect_failure(
        ["verify", bad, "--source", src, "--vocab-from", tiny / "target.gguf"],
        f"tensor output_norm.weight: value at row 0, column {col} is {float(rounded[col])!r}; "
        f"the source's, exactly as F32, is {float(norm[col])!r}",
    )


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
    # without the ordered head (issue 24), which adds tensors of its own: the others' bytes stay
    convert_drafter(tiny / name, out, tiny / "target.gguf", ordered_head=False)
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
