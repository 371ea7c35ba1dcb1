"""``repack``: a Google-style gemma4 donor re-packed as exact Q4_0 from its QAT source."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from helpers import source_bits

from gguf_exact.core import bf16, q4_0
from gguf_exact.core.exact import plan_matrix
from gguf_exact.errors import GgufExactError, OffGridError
from gguf_exact.repack.pipeline import repack_model
from gguf_exact.tiny.main_model import (
    TINY,
    TINY_MOE,
    MainSpec,
    hf_config,
    model_tensors,
    write_donor,
    write_main_checkpoint,
)

Q4_0, Q6_K, F16, F32, Q8_0 = (GGMLQuantizationType[n] for n in ("Q4_0", "Q6_K", "F16", "F32", "Q8_0"))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny QAT checkpoint, its Google-style donor, an F32 reference and the re-pack."""
    root = tmp_path_factory.mktemp("main")
    write_main_checkpoint(root / "src", TINY, seed=0)
    write_main_checkpoint(root / "src-sharded", TINY, seed=0, shards=3)
    write_donor(root / "donor.gguf", root / "src", TINY)
    f32 = {t.gguf_name: F32 for t in model_tensors(TINY)}
    write_donor(root / "reference-f32.gguf", root / "src", TINY, types=f32)
    repack_model(root / "donor.gguf", root / "src", root / "out.gguf", report_path=root / "report.json")
    return root


def tensors(path) -> dict:
    return {t.name: t for t in GGUFReader(path).tensors}


def raw_field(field) -> bytes:
    return b"".join(bytes(p.tobytes()) for p in field.parts)


def test_donor_is_written_the_way_googles_are(model):
    t = tensors(model / "donor.gguf")
    assert t["token_embd.weight"].tensor_type == Q6_K and t["per_layer_token_embd.weight"].tensor_type == Q6_K
    assert t["per_layer_model_proj.weight"].tensor_type == F16
    assert t["blk.0.ffn_up.weight"].tensor_type == Q4_0 and t["blk.7.inp_gate.weight"].tensor_type == Q4_0
    assert "blk.3.attn_k.weight" in t and "blk.4.attn_k.weight" not in t  # KV-shared layers have no K/V
    for name in ("per_layer_proj_norm.weight", "blk.0.proj.weight", "blk.0.post_norm.weight", "rope_freqs.weight"):
        assert name in t
    # layer matrices as llama.cpp quantizes them: d = max / -8 (gguf-py's reference quantizer)
    from gguf import quants

    up = source_bits(model / "src", "model.language_model.layers.0.mlp.up_proj.weight")
    assert np.array_equal(np.asarray(t["blk.0.ffn_up.weight"].data), quants.quantize(bf16.to_f32(up), Q4_0))


def test_metadata_equals_the_donors_except_file_type(model):
    donor, out = GGUFReader(model / "donor.gguf"), GGUFReader(model / "out.gguf")
    assert list(donor.fields) == list(out.fields)
    differ = [k for k in donor.fields if raw_field(donor.fields[k]) != raw_field(out.fields[k])]
    assert differ in ([], ["general.file_type"])
    assert out.fields["general.file_type"].contents() == 2  # MOSTLY_Q4_0
    assert out.fields["tokenizer.chat_template"].contents() == donor.fields["tokenizer.chat_template"].contents()
    assert [(t.name, t.shape.tolist()) for t in donor.tensors] == [(t.name, t.shape.tolist()) for t in out.tensors]


def test_every_mapped_tensor_is_q4_0_as_planned_and_the_rest_is_copied(model):
    donor, out = tensors(model / "donor.gguf"), tensors(model / "out.gguf")
    specs = {t.gguf_name: t for t in model_tensors(TINY)}
    n_q4 = 0
    for name, t in out.items():
        spec = specs.get(name)
        if spec is not None and spec.what == "matrix":
            assert t.tensor_type == Q4_0, name
            bits = source_bits(model / "src", spec.hf_name).reshape(-1, spec.shape[-1])
            plan = plan_matrix(bits)  # the whole matrix at once: chunking changed nothing
            assert np.array_equal(np.asarray(t.data).reshape(plan.data.shape), plan.data), name
            decoded = q4_0.dequantize(np.asarray(t.data).reshape(-1, 18))
            assert bf16.ulp_distance(bf16.from_f32(decoded).reshape(bits.shape), bits).max() <= 1, name
            n_q4 += 1
        else:
            assert t.tensor_type == donor[name].tensor_type, name
            assert np.asarray(t.data).tobytes() == np.asarray(donor[name].data).tobytes(), name
    assert n_q4 == sum(t.what == "matrix" for t in model_tensors(TINY)) == 3 + 9 * 4 + 7 * 4


def test_report_compares_donor_and_output_per_kind(model):
    report = json.loads((model / "report.json").read_text())
    kinds = {k["kind"]: k for k in report["kinds"]}
    assert list(kinds) == [
        "token_embd",
        "per_layer_token_embd",
        "per_layer_model_proj",
        "layer matrices",
        "norms, scales, other",
    ]
    assert kinds["token_embd"]["donor_types"] == "Q6_K" and kinds["token_embd"]["output_types"] == "Q4_0"
    assert kinds["per_layer_model_proj"]["donor_types"] == "F16"
    assert kinds["layer matrices"]["output_bytes"] == kinds["layer matrices"]["donor_bytes"]
    for k in ("token_embd", "per_layer_token_embd", "layer matrices"):
        assert kinds[k]["exact_fraction"] > 0.998 and kinds[k]["donor_exact_fraction"] < 0.7, k
        assert kinds[k]["rel_error"] * 10 < kinds[k]["donor_rel_error"], k
    assert kinds["norms, scales, other"]["rewritten"] == 0 and kinds["norms, scales, other"]["exact_fraction"] == 1.0
    assert report["bytes"] == (model / "out.gguf").stat().st_size < report["donor_bytes"]
    assert report["repacked"]["max_ulps"] == 1 and report["source_only"] == [] and report["unmapped"] == []
    assert report["file_type"] == {"donor": 2, "output": 2}


def test_sharded_source_and_a_second_run_give_the_same_bytes(model, tmp_path):
    a = repack_model(model / "donor.gguf", model / "src-sharded", tmp_path / "a.gguf")
    assert (tmp_path / "a.gguf").read_bytes() == (model / "out.gguf").read_bytes()
    b = repack_model(model / "donor.gguf", model / "src", tmp_path / "b.gguf", workers=1, donor_stats="all")
    c = repack_model(model / "donor.gguf", model / "src", tmp_path / "c.gguf", workers=3)
    assert a.sha256 == b.sha256 == c.sha256


def test_chunk_size_does_not_change_the_bytes(model, tmp_path, monkeypatch):
    from gguf_exact.stream import writer as repack

    monkeypatch.setattr(repack, "CHUNK_VALUES", 3000)  # chunks of 11 rows of 256, 1 row of 8960...
    repack_model(model / "donor.gguf", model / "src", tmp_path / "small-chunks.gguf")
    assert (tmp_path / "small-chunks.gguf").read_bytes() == (model / "out.gguf").read_bytes()


def greedy_and_logits(path: Path, prompts: list[str], n: int = 8):
    import llama_cpp  # a missing binding fails the run, never skips it

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_threads=2, verbose=False, logits_all=True)
    texts, logits = [], []
    for prompt in prompts:
        tokens = llm.tokenize(prompt.encode())
        llm.reset()
        llm.eval(tokens)
        logits.append(np.array(llm.scores[: len(tokens)], dtype=np.float64))
        out = []
        for _ in range(n):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(tok)
            llm.eval([tok])
        texts.append(out)
    del llm
    return texts, np.concatenate(logits)


@pytest.mark.bindings
def test_output_loads_in_llama_cpp_and_generates(model, record_property, capsys):
    prompts = ["def f(x): return x + 1", "the cat sat on", "1 2 3 4 5"]
    ours, ours_logits = greedy_and_logits(model / "out.gguf", prompts)
    donor, donor_logits = greedy_and_logits(model / "donor.gguf", prompts)
    ref, ref_logits = greedy_and_logits(model / "reference-f32.gguf", prompts)
    for p, a, b, c in zip(prompts, ours, donor, ref):
        assert len(a) == len(b) == 8
        record_property(f"greedy {p!r}", {"exact q4_0": a, "donor": b, "f32 reference": c})
        with capsys.disabled():
            print(f"\n  greedy {p!r}: exact Q4_0 {a}  donor {b}  F32 reference {c}")
    # the re-pack is much closer to the unquantized model than the donor is
    ours_err = np.abs(ours_logits - ref_logits).mean()
    donor_err = np.abs(donor_logits - ref_logits).mean()
    top1 = ref_logits.argmax(axis=1)
    ours_top1, donor_top1 = (ours_logits.argmax(axis=1) == top1).mean(), (donor_logits.argmax(axis=1) == top1).mean()
    with capsys.disabled():
        print(f"  mean |logit - F32 reference|: exact Q4_0 {ours_err:.2e}, donor {donor_err:.2e}")
        print(
            f"  prompt positions whose top token matches the F32 reference: exact Q4_0 {ours_top1:.0%}, donor {donor_top1:.0%}"
        )
    assert ours_err * 3 < donor_err and ours_top1 >= donor_top1


# -- the MoE (26B-A4B-like) and a gemma4-assistant donor ---------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["fused-gate-up", "split-gate-up"])
def test_moe_expert_banks_are_repacked_row_by_row_and_the_router_kept(tmp_path, split):
    write_main_checkpoint(tmp_path / "src", TINY_MOE, seed=3)
    write_donor(tmp_path / "donor.gguf", tmp_path / "src", TINY_MOE, split_experts=split)
    result = repack_model(tmp_path / "donor.gguf", tmp_path / "src", tmp_path / "out.gguf")
    kinds = {k["kind"]: k for k in result.report["kinds"]}
    assert kinds["expert banks"]["output_types"] == f"Q4_0 x{(3 if split else 2) * TINY_MOE.n_layer}"
    assert kinds["expert banks"]["exact_fraction"] > 0.998
    assert kinds["router"]["output_types"] == "F32 x4"  # off the grid: kept as the donor has it
    assert all("kept as the donor has it" in t["note"] for t in result.report["off_grid"])
    out = tensors(tmp_path / "out.gguf")
    gate_up = source_bits(tmp_path / "src", "model.language_model.layers.1.experts.gate_up_proj")  # (E, 2F, C)
    if split:
        half = gate_up[:, TINY_MOE.n_ff_expert :, :]  # the up half of every expert
        data = np.asarray(out["blk.1.ffn_up_exps.weight"].data)
    else:
        half, data = gate_up, np.asarray(out["blk.1.ffn_gate_up_exps.weight"].data)
    rows = half.reshape(-1, half.shape[-1])
    assert np.array_equal(data.reshape(rows.shape[0], -1), plan_matrix(rows).data)


@pytest.mark.bindings
def test_moe_output_loads_in_llama_cpp(tmp_path):
    import llama_cpp  # a missing binding fails the run, never skips it

    write_main_checkpoint(tmp_path / "src", TINY_MOE, seed=3)
    write_donor(tmp_path / "donor.gguf", tmp_path / "src", TINY_MOE)
    repack_model(tmp_path / "donor.gguf", tmp_path / "src", tmp_path / "out.gguf")
    llm = llama_cpp.Llama(model_path=str(tmp_path / "out.gguf"), n_ctx=64, n_threads=2, verbose=False)
    assert len(llm.tokenize(b"abc")) > 1
    out = llm("def f(x):", max_tokens=4, temperature=0.0)
    assert out["usage"]["completion_tokens"] >= 1


def q8_0_drafter(folder: Path, target: Path, out: Path) -> Path:
    """A gemma4-assistant drafter stored as Q8_0, as llama.cpp's converter writes it
    (``--outtype q8_0``): matrices Q8_0, norms F32, the target's tokenizer."""
    from gguf_exact.tiny.peers import float_drafter_gguf

    return float_drafter_gguf(folder, target, out, Q8_0)


def test_gemma4_assistant_donor_gives_the_converters_q4_0(tiny, tmp_path):
    from gguf_exact.drafter.convert import convert_drafter

    donor = q8_0_drafter(tiny / "drafter-fp32", tiny / "target.gguf", tmp_path / "drafter-q8_0.gguf")
    result = repack_model(donor, tiny / "drafter-fp32", tmp_path / "repacked.gguf")
    # upstream's Q8_0 has no ordered head, so neither has the re-pack: convert's form without it
    convert_drafter(tiny / "drafter-fp32", tmp_path / "converted.gguf", tiny / "target.gguf", ordered_head=False)
    repacked, converted = tensors(tmp_path / "repacked.gguf"), tensors(tmp_path / "converted.gguf")
    assert set(repacked) == set(converted)
    for name, t in converted.items():
        assert repacked[name].tensor_type == t.tensor_type, name
        assert np.asarray(repacked[name].data).tobytes() == np.asarray(t.data).tobytes(), name
    kinds = {k["kind"]: k for k in result.report["kinds"]}
    assert (
        kinds["layer matrices"]["donor_types"] == "Q8_0 x20" and kinds["layer matrices"]["output_types"] == "Q4_0 x20"
    )
    assert result.source_only == [] and result.report["file_type"] == {"donor": 7, "output": 2}


# -- bounded memory ---------------------------------------------------------------------

RSS_SCRIPT = """
import resource, sys
from gguf_exact.repack.pipeline import repack_model
import gguf_exact.formats.checkpoint, gguf_exact.tiny.main_model  # everything imported before the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
repack_model(sys.argv[1], sys.argv[2], sys.argv[3])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest forked worker
print(before // 1024, after // 1024, workers // 1024)
"""


def test_memory_is_bounded_by_a_chunk_not_by_the_tensor(tmp_path):
    # per_layer_token_embd of 4096 x 8192 values: 64 MiB of bf16, 128 MiB as float32
    spec = MainSpec(n_layer=2, n_embd=256, n_ff=256, n_vocab=4096, n_embd_per_layer=4096)
    write_main_checkpoint(tmp_path / "src", spec, seed=1)
    write_donor(tmp_path / "donor.gguf", tmp_path / "src", spec)
    proc = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(tmp_path / "donor.gguf"), str(tmp_path / "src"), str(tmp_path / "out.gguf")],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )  # fmt: skip
    before, after, workers = map(int, proc.stdout.split())
    assert after - before < 48, f"peak RSS grew by {after - before} MiB for a 64 MiB tensor"
    assert workers - before < 48, f"a worker's peak RSS is {workers - before} MiB above the parent's baseline"


# -- bad input: one line, nothing left at OUT -------------------------------------------


def expect_failure(out: Path, match: str, *args, error=GgufExactError, **kwargs) -> str:
    with pytest.raises(error) as info:
        repack_model(*args, out, **kwargs)
    message = str(info.value)
    assert "\n" not in message and match in message, message
    assert not out.exists() and [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []
    return message


@pytest.fixture
def outdir(tmp_path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


def test_donor_and_source_of_different_models(model, tmp_path, outdir):
    wider = replace(TINY, n_embd=512)
    write_main_checkpoint(tmp_path / "wide", wider, seed=0)
    expect_failure(outdir / "x.gguf", "gemma4.embedding_length is 256 but", model / "donor.gguf", tmp_path / "wide")
    write_main_checkpoint(tmp_path / "other", TINY, seed=7)  # same shapes, other weights
    msg = expect_failure(
        outdir / "x.gguf", "donor and source are different models", model / "donor.gguf", tmp_path / "other"
    )
    assert "tensor token_embd.weight differs from the source's model.language_model.embed_tokens.weight" in msg
    from gguf_exact.tiny.models import write_tiny_drafter

    write_tiny_drafter(tmp_path / "drafter", seed=0)
    expect_failure(outdir / "x.gguf", "do not match the donor's gemma4", model / "donor.gguf", tmp_path / "drafter")


def test_missing_shard(model, tmp_path, outdir):
    shutil.copytree(model / "src-sharded", tmp_path / "src")
    (tmp_path / "src" / "model-00002-of-00003.safetensors").unlink()
    expect_failure(
        outdir / "x.gguf",
        "lists shard model-00002-of-00003.safetensors, which is missing",
        model / "donor.gguf",
        tmp_path / "src",
    )


def test_source_tensor_missing(model, tmp_path, outdir):
    from gguf_exact.formats.safetensors_stream import StreamTensor, write_folder
    from gguf_exact.tiny.main_model import source_fill

    keep = [t for t in model_tensors(TINY) if t.hf_name != "model.language_model.layers.2.self_attn.k_proj.weight"]
    write_folder(
        tmp_path / "src", hf_config(TINY), [StreamTensor(t.hf_name, t.shape, "BF16", source_fill(t, 0)) for t in keep]
    )
    expect_failure(
        outdir / "x.gguf", "no tensor model.language_model.layers.2.self_attn.k_proj.weight for the donor's blk.2.attn_k.weight",
        model / "donor.gguf", tmp_path / "src",
    )  # fmt: skip


def test_shape_mismatch(model, tmp_path, outdir):
    from gguf_exact.formats.safetensors_stream import StreamTensor, write_folder
    from gguf_exact.tiny.main_model import source_fill

    stream = []
    for t in model_tensors(TINY):
        if t.hf_name.endswith("layers.1.mlp.gate_proj.weight"):
            t = t.__class__(t.hf_name, t.gguf_name, (t.shape[0] - 32, t.shape[1]), t.what, t.donor_type)
        stream.append(StreamTensor(t.hf_name, t.shape, "BF16", source_fill(t, 0)))
    write_folder(tmp_path / "src", hf_config(TINY), stream)
    expected = "tensor blk.1.ffn_gate.weight has shape [512, 256] but the source's model.language_model.layers.1.mlp.gate_proj.weight has [480, 256]"
    expect_failure(outdir / "x.gguf", expected, model / "donor.gguf", tmp_path / "src")


def off_grid_source(model: Path, folder: Path) -> Path:
    from gguf_exact.formats.safetensors_stream import StreamTensor, write_folder
    from gguf_exact.tiny.main_model import source_fill
    from gguf_exact.tiny.synthetic import random_matrix

    stream = []
    for t in model_tensors(TINY):
        fill = source_fill(t, 0)
        if t.hf_name.endswith("layers.2.mlp.up_proj.weight"):
            rng = np.random.default_rng(5)
            fill = lambda r0, r1, rng=rng: random_matrix(rng, r1 - r0, 256, scale=0.02)  # noqa: E731
        stream.append(StreamTensor(t.hf_name, t.shape, "BF16", fill))
    return write_folder(folder, hf_config(TINY), stream)


def test_off_grid_tensor_stops_or_is_stored_otherwise(model, tmp_path, outdir):
    src = off_grid_source(model, tmp_path / "src")
    # the donor must come from this source (its ffn_up is not the fixture's)
    write_donor(tmp_path / "donor.gguf", src, TINY)
    expect_failure(
        outdir / "x.gguf", "tensor model.language_model.layers.2.mlp.up_proj.weight: 4096 of 4096 blocks are off the 4-bit grid",
        tmp_path / "donor.gguf", src, error=OffGridError,
    )  # fmt: skip
    keep = repack_model(tmp_path / "donor.gguf", src, outdir / "keep.gguf", off_grid="keep")
    q8 = repack_model(tmp_path / "donor.gguf", src, outdir / "q8.gguf", off_grid="q8_0")
    donor, kept, stored = tensors(tmp_path / "donor.gguf"), tensors(outdir / "keep.gguf"), tensors(outdir / "q8.gguf")
    name = "blk.2.ffn_up.weight"
    assert np.asarray(kept[name].data).tobytes() == np.asarray(donor[name].data).tobytes()
    assert stored[name].tensor_type == Q8_0 and kept["blk.2.ffn_gate.weight"].tensor_type == Q4_0
    assert [t["name"] for t in keep.report["off_grid"]] == [name] == [t["name"] for t in q8.report["off_grid"]]
    assert next(t for t in q8.tensors if t.name == name).ours.rel_error < 0.01


def test_donor_that_is_not_gguf(model, tmp_path, outdir):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"<html>404 Not Found</html>" * 10)
    expect_failure(outdir / "x.gguf", f"{bad}: not a GGUF file (starts with b'<htm')", bad, model / "src")
    expect_failure(outdir / "x.gguf", "no such file", tmp_path / "absent.gguf", model / "src")


def test_truncated_donor(model, tmp_path, outdir):
    cut = tmp_path / "cut.gguf"
    data = (model / "donor.gguf").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    expect_failure(outdir / "x.gguf", "truncated: tensor", cut, model / "src")
    cut.write_bytes(data[:5000])  # inside the tokenizer
    expect_failure(outdir / "x.gguf", "truncated: the GGUF header runs past the end", cut, model / "src")


def test_expect_sha256(model, outdir):
    good = repack_model(model / "donor.gguf", model / "src", outdir / "a.gguf").sha256
    expect_failure(
        outdir / "b.gguf",
        f"sha256 {good} does not match the expected 0000",
        model / "donor.gguf",
        model / "src",
        expect_sha256="0" * 64,
    )
    assert (
        repack_model(model / "donor.gguf", model / "src", outdir / "c.gguf", expect_sha256=good.upper()).sha256 == good
    )


def test_cli_repack(model, outdir):
    from click.testing import CliRunner

    from gguf_exact.cli import main

    out = outdir / "cli.gguf"
    args = ["repack", "--donor", model / "donor.gguf", "--source", model / "src", out, "--report", outdir / "r.json"]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    assert "per_layer_token_embd" in result.stdout and "Q6_K" in result.stdout
    assert "re-packed values bit-exact" in result.stdout and "the donor's:" in result.stdout
    assert out.read_bytes() == (model / "out.gguf").read_bytes()
    bad = CliRunner().invoke(
        main,
        [
            "repack",
            "--donor",
            str(model / "src" / "config.json"),
            "--source",
            str(model / "src"),
            str(outdir / "bad.gguf"),
        ],
    )
    assert bad.exit_code == 1 and bad.stderr.strip().count("\n") == 0 and "not a GGUF file" in bad.stderr


def test_a_block_changed_after_writing_fails_verification(model, outdir, monkeypatch):
    from gguf_exact.formats.gguf_stream import StreamingGGUF, pwrite_all

    finish = StreamingGGUF.finish

    def finish_then_corrupt(self, kv_raw):
        size = finish(self, kv_raw)
        t = next(t for t in self.placed if t.name == "blk.1.ffn_up.weight")
        pos = self.data_start + t.offset + 5 * 18 + 3  # block 5, a level byte
        byte = os.pread(self.fd, 1, pos)[0]
        pwrite_all(self.fd, bytes([byte ^ 0x11]), pos)
        return size

    monkeypatch.setattr(StreamingGGUF, "finish", finish_then_corrupt)
    expected = "verification failed: tensor blk.1.ffn_up.weight: Q4_0 block 5 differs from the plan"
    expect_failure(outdir / "x.gguf", expected, model / "donor.gguf", model / "src")


def test_source_tensors_the_donor_lacks_and_donor_tensors_of_unknown_names_are_reported(model, tmp_path):
    from gguf_exact.formats.gguf_reader import open_gguf
    from gguf_exact.formats.gguf_stream import write_gguf
    from gguf_exact.formats.safetensors_stream import StreamTensor, write_folder
    from gguf_exact.tiny.main_model import ModelTensor, source_fill

    # E2B's checkpoint may carry K/V projections for KV-shared layers, which the GGUF omits
    extra = ModelTensor("model.language_model.layers.5.self_attn.k_proj.weight", "", (64, 256), "matrix", Q4_0)
    stream = [StreamTensor(t.hf_name, t.shape, "BF16", source_fill(t, 0)) for t in [*model_tensors(TINY), extra]]
    write_folder(tmp_path / "src", hf_config(TINY), stream)
    with open_gguf(model / "donor.gguf") as donor:
        kv_raw = [kv.raw for kv in donor.header.kv]
        blobs = [(t.name, donor.read_rows(t, 0, t.rows), t.type, t.shape) for t in donor.tensors]
    typed = {F32: np.float32, F16: np.float16}
    blobs = [(n, d.view(typed[q]).reshape(shape) if q in typed else d, q) for n, d, q, shape in blobs]
    write_gguf(tmp_path / "donor.gguf", kv_raw, [*blobs, ("mystery.weight", np.ones(8, dtype=np.float32), F32)])
    result = repack_model(tmp_path / "donor.gguf", tmp_path / "src", tmp_path / "out.gguf")
    assert result.source_only == [extra.hf_name] and result.unmapped == ["mystery.weight"]
    out = tensors(tmp_path / "out.gguf")
    assert np.array_equal(out["mystery.weight"].data, np.ones(8)) and out["blk.0.attn_q.weight"].tensor_type == Q4_0


def test_a_worker_failure_is_one_line_and_leaves_nothing(model, tmp_path, outdir, monkeypatch):
    from gguf_exact.formats.safetensors_stream import StreamTensor, write_folder
    from gguf_exact.stream import writer as repack
    from gguf_exact.tiny.main_model import source_fill

    stream = []
    for t in model_tensors(TINY):
        fill = source_fill(t, 0)
        if t.gguf_name == "per_layer_token_embd.weight":

            def fill(r0, r1, inner=fill):  # noqa: E306
                rows = inner(r0, r1).copy()
                if r0 <= 300 < r1:
                    rows[300 - r0, 17] = 0x7FC0  # NaN
                return rows

        stream.append(StreamTensor(t.hf_name, t.shape, "BF16", fill))
    write_folder(tmp_path / "src", hf_config(TINY), stream)
    monkeypatch.setattr(repack, "CHUNK_VALUES", 4096)  # 16 rows a chunk: the NaN is met by a worker
    expect_failure(
        outdir / "x.gguf", "tensor model.language_model.embed_tokens_per_layer.weight: 1 values are NaN or Inf (first at row 300, column 17)",
        model / "donor.gguf", tmp_path / "src",
    )  # fmt: skip


def test_verify_command_on_a_main_model_agrees_with_the_repack_report(model):
    from click.testing import CliRunner

    from gguf_exact.cli import main

    report = json.loads((model / "report.json").read_text())
    args = ["verify", str(model / "out.gguf"), "--source", str(model / "src")]
    out = CliRunner().invoke(main, [*args, "--donor", str(model / "donor.gguf"), "--json"])
    assert out.exit_code == 0, out.output
    v = json.loads(out.stdout)
    assert v["ok"] and v["sha256"] == report["sha256"] and v["unchecked"] == []
    checks = {t["name"]: t for t in v["tensors"]}
    assert (
        checks["rope_freqs.weight"]["note"] == "the donor's bytes" and checks["rope_freqs.weight"]["status"] == "pass"
    )
    assert checks["blk.0.attn_norm.weight"]["note"] == "the donor's bytes"
    embd = checks["per_layer_token_embd.weight"]
    assert embd["type"] == "Q4_0" and embd["max_ulps"] <= 1 and 0.995 <= embd["exact_fraction"] < 1
    assert embd["blocks"]["as_planned"] == embd["blocks"]["total"] == 320 * 256 // 32
    repacked = report["repacked"]
    q4 = [t for t in v["tensors"] if t["type"] == "Q4_0"]
    assert sum(t["exact_values"] for t in q4) == repacked["exact_values"]
    assert sum(t["values"] for t in q4) == repacked["values"]
    # without the donor: the tensors and the hyperparameters are judged from the source, the donor's own keys named
    alone = CliRunner().invoke(main, [*args, "--json"])
    assert alone.exit_code == 1
    a = json.loads(alone.stdout)
    assert (a["ok"], a["failures"], a["keys"]) == (False, [], {"judged": 22, "not_judged": 12})
    assert a["unchecked"] == [
        "12 keys (general.name, general.quantization_version, tokenizer.ggml.model, tokenizer.ggml.tokens, ...): "
        "repack copies them from the donor; give --donor DONOR.gguf to compare them as bytes"
    ]
    assert {t["name"]: t["note"] for t in a["tensors"]}["rope_freqs.weight"] == "generated from config.json"
    assert CliRunner().invoke(main, [*args, "--allow-unchecked"]).exit_code == 0
    vocab = CliRunner().invoke(main, [*args, "--vocab-from", str(model / "donor.gguf")])
    assert vocab.exit_code == 1 and vocab.stderr.splitlines() == [
        f"error: --vocab-from {model / 'donor.gguf'}: a re-packed file carries its donor's tokenizer; give --donor instead"
    ]
    # Google's donor fails: its max / -8 steps lose exact values; measured, its Q6_K table is far off
    donor = CliRunner().invoke(main, ["verify", str(model / "donor.gguf"), "--source", str(model / "src")])
    assert (
        donor.exit_code == 1
        and "verification failed: tensor token_embd.weight: is Q6_K, but its source" in donor.stderr
    )
    from gguf_exact.repack.check import verify_model

    dchecks = {t.name: t for t in verify_model(model / "donor.gguf", model / "src", judge=False).tensors}
    assert dchecks["per_layer_token_embd.weight"].type == "Q6_K"
    assert dchecks["per_layer_token_embd.weight"].exact_fraction < 0.5 < embd["exact_fraction"]
    total = v["total"]
    assert total["exact_values"] == sum(t["exact_values"] for t in v["tensors"] if "exact_values" in t)


def test_verify_fails_on_a_main_model_block_with_other_levels(model, tmp_path):
    from click.testing import CliRunner
    from gguf_edit import block_message

    from gguf_exact.cli import main
    from gguf_exact.formats.gguf_reader import open_gguf

    out = tmp_path / "flipped.gguf"
    raw = bytearray((model / "out.gguf").read_bytes())
    with open_gguf(model / "out.gguf") as g:
        t = g.tensor("blk.1.ffn_up.weight")
        at = g.header.data_start + t.offset + 9 * 18
    plan = np.frombuffer(bytes(raw[at : at + 18]), np.uint8)
    raw[at + 2 + 3] ^= 0x10  # value 19's level moves by one
    out.write_bytes(bytes(raw))
    bits = source_bits(model / "src", "model.language_model.layers.1.mlp.up_proj.weight").reshape(-1, 32)
    stored = np.frombuffer(bytes(raw[at : at + 18]), np.uint8)
    expected = block_message("blk.1.ffn_up.weight", 256, 9, stored, plan, bits[9], 1, 512 * 256 // 32)
    result = CliRunner().invoke(
        main, ["verify", str(out), "--source", str(model / "src"), "--donor", str(model / "donor.gguf")]
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [f"error: {out}: verification failed: {expected}"]


def test_outputs_have_ordinary_permissions(model, tmp_path):
    import os

    mask = os.umask(0o022)
    try:
        repack_model(model / "donor.gguf", model / "src", tmp_path / "r.gguf")
    finally:
        os.umask(mask)
    assert (tmp_path / "r.gguf").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


@pytest.mark.parametrize("split", [False, True])
def test_verify_judges_a_moe_repack_fused_or_split(tmp_path, split):
    """The router (off the grid here) is the donor's tensor: its bytes with --donor, named
    as not judged without; expert banks are judged block by block either way."""
    from gguf_exact.repack.check import verify_model

    write_main_checkpoint(tmp_path / "src", TINY_MOE, seed=0)
    write_donor(tmp_path / "donor.gguf", tmp_path / "src", TINY_MOE, split_experts=split)
    repack_model(tmp_path / "donor.gguf", tmp_path / "src", tmp_path / "out.gguf")
    v = verify_model(tmp_path / "out.gguf", tmp_path / "src", donor=tmp_path / "donor.gguf")
    assert v.ok() and v.failures == [] and v.unchecked == []
    notes = {t.name: t.note for t in v.tensors}
    assert notes["blk.0.ffn_gate_inp.weight"] == "off the grid: the donor's bytes (router)"
    banks = ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"] if split else ["blk.0.ffn_gate_up_exps.weight"]
    for name in banks + ["blk.0.ffn_down_exps.weight"]:
        assert notes[name] == "exact Q4_0: every block by the block rule"
    assert v.verdict().endswith("every block as exact as the plan; 4 matrices off the grid, stored as repack defines")
    alone = verify_model(tmp_path / "out.gguf", tmp_path / "src")
    assert alone.failures == [] and not alone.ok() and alone.ok(allow_unchecked=True)
    where = "its source model.language_model.layers.{0}.router.proj.weight is off the 4-bit grid (32 blocks, first at row 0, column 0)"
    assert alone.unchecked[1:] == [
        f"tensor blk.{il}.ffn_gate_inp.weight: {where.format(il)}, so repack keeps the donor's tensor; "
        "give donor=DONOR.gguf to judge it"
        for il in range(4)
    ]
