"""``quality``: files against their bf16 reference through the built llama-perplexity, and
drafters' acceptance against one target through llama-server, on tiny models."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _llama_server import server_binary
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.core import bf16
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.errors import ArgumentError, InputError
from gguf_exact.quality.drafters import measure_drafters
from gguf_exact.quality.forms import run_quality
from gguf_exact.quality.measure import measure_quality
from gguf_exact.quality.perplexity import OUTPUT_ATTEMPTS, parse_kld, perplexity_binary
from gguf_exact.quality.request import QualityRequest
from gguf_exact.repack.pipeline import repack_model
from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint
from gguf_exact.tiny.models import char_vocabulary, write_agreeing_pair
from gguf_exact.tiny.pairs import write_mixed_target
from gguf_exact.verify import verify_file

CTX, CHUNKS = 128, 4  # 4 x 63 = 252 scored positions (llama-perplexity wants 100 or more)
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly bumpkins".split()


def write_text(path: Path, n_words: int = 900) -> Path:
    """Deterministic English-like text, longer than CHUNKS x CTX tokens of the byte-level tiny vocabulary."""
    words = [WORDS[(i * 7 + i // 5) % len(WORDS)] for i in range(n_words)]
    path.write_text(" ".join(words) + "\n")
    return path


def measure(source: Path, files: list[Path], text: Path, **fields):
    """:func:`measure_quality` on the request of main models these fields make."""
    return measure_quality(QualityRequest(files, source=source, text=text, **fields))


@pytest.fixture(scope="module")
def main_model(tmp_path_factory) -> Path:
    server_binary()  # fails (never skips) when the llama.cpp build is missing
    root = tmp_path_factory.mktemp("quality")
    write_main_checkpoint(root / "src", TINY, seed=0)
    write_donor(root / "donor.gguf", root / "src", TINY)
    repack_model(root / "donor.gguf", root / "src", root / "exact.gguf")
    repack_model(root / "donor.gguf", root / "src", root / "bf16.gguf", bf16_reference=True)
    write_text(root / "text.txt")
    return root


@pytest.fixture(scope="module")
def measured(main_model):
    m = main_model
    files = [m / "bf16.gguf", m / "exact.gguf", m / "donor.gguf"]
    report = measure(m / "src", files, m / "text.txt", reference=m / "bf16.gguf", chunks=CHUNKS, ctx=CTX)
    return {Path(r.file).name: r for r in report.rows}, report


@pytest.mark.llama_server
def test_reference_against_itself(measured):
    rows, report = measured
    ref = rows["bf16.gguf"]
    assert ref.mean_kld == pytest.approx(0.0, abs=1e-5) and ref.p99_kld == pytest.approx(0.0, abs=1e-4)
    assert ref.same_top == 1.0 and ref.ppl_ratio == pytest.approx(1.0, abs=1e-4)
    assert ref.bytes == (report.reference).stat().st_size
    assert report.ppl_reference > 1


@pytest.mark.llama_server
def test_exact_repack_is_far_closer_to_the_reference_than_the_donor(measured, main_model, capsys):
    rows, _ = measured
    exact, donor = rows["exact.gguf"], rows["donor.gguf"]
    with capsys.disabled():
        print(f"\n  tiny E2B-structured model, {CHUNKS} x {CTX}: exact {exact}\n  donor {donor}")
    assert 0 < exact.mean_kld * 4 < donor.mean_kld  # by hand on this model: 0.0077 against 0.068
    assert exact.p99_kld < donor.p99_kld and exact.same_top > donor.same_top
    assert abs(exact.ppl_ratio - 1) < abs(donor.ppl_ratio - 1)
    assert exact.bytes == (main_model / "exact.gguf").stat().st_size
    assert donor.bytes == (main_model / "donor.gguf").stat().st_size


@pytest.mark.llama_server
def test_reference_is_built_once_from_the_donor_and_reused(main_model, tmp_path):
    m = main_model
    first = measure(
        m / "src", [m / "exact.gguf"], m / "text.txt", donor=m / "donor.gguf", chunks=2, ctx=CTX * 2, work=tmp_path
    )
    built = first.reference
    assert built.parent == tmp_path and verify_file(built, m / "src", donor=m / "donor.gguf").writer == "repack --bf16"
    assert built.read_bytes() == (m / "bf16.gguf").read_bytes()
    stamp = built.stat().st_mtime_ns
    again = measure(
        m / "src", [m / "exact.gguf"], m / "text.txt", donor=m / "donor.gguf", chunks=2, ctx=CTX * 2, work=tmp_path
    )
    assert again.reference == built and built.stat().st_mtime_ns == stamp
    assert again.rows == first.rows  # the same run gives the same figures
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".base-")]  # base log-probabilities removed


@pytest.mark.llama_server
def test_parse_real_output_and_fail_on_cut_output(main_model, tmp_path):
    m = main_model
    binary = perplexity_binary()
    base = tmp_path / "base.kld"
    args = ["-c", str(CTX), "-b", str(CTX), "--chunks", str(CHUNKS), "-t", "2"]
    subprocess.run(
        [binary, "-m", m / "bf16.gguf", "-f", m / "text.txt", "--kl-divergence-base", base, *args],
        check=True,
        capture_output=True,
    )
    for _ in range(OUTPUT_ATTEMPTS):  # as run_kld does: llama.cpp's logger can lose its last lines at exit
        done = subprocess.run(
            [binary, "-m", m / "exact.gguf", "--kl-divergence-base", base, "--kl-divergence", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True,
        )  # fmt: skip
        out = done.stdout
        if "====== KL divergence statistics" in out and "Same top p" in out:
            break
    figures = parse_kld(out, "exact.gguf")
    assert 0 < figures.mean_kld < figures.p99_kld and 0 < figures.same_top <= 1 and figures.ppl > 1
    cut = out[: out.index("====== KL divergence statistics")]
    with pytest.raises(InputError, match="exact.gguf: llama-perplexity printed no number on a 'Mean KLD' line"):
        parse_kld(cut, "exact.gguf")


@pytest.mark.llama_server
def test_text_too_short_and_window_too_small(main_model, tmp_path):
    m = main_model
    short = write_text(tmp_path / "short.txt", n_words=20)
    with pytest.raises(
        InputError,
        match=r"short.txt: llama-perplexity scored no windows with bf16.gguf \(it needs 256 tokens or more for --ctx 128\)",
    ):
        measure(m / "src", [m / "exact.gguf"], short, reference=m / "bf16.gguf", chunks=CHUNKS, ctx=CTX)
    with pytest.raises(ArgumentError, match="scores 31 positions"):
        measure(m / "src", [m / "exact.gguf"], m / "text.txt", reference=m / "bf16.gguf", chunks=1, ctx=64)
    with pytest.raises(ArgumentError, match="does not run alone in llama-perplexity"):
        measure(m / "src", [m / "exact.gguf"], m / "text.txt", vocab_from=m / "donor.gguf")


@pytest.mark.llama_server
def test_cli_json_is_exactly_the_rows_and_plot_is_a_png(main_model, tmp_path):
    m = main_model
    args = ["quality", "--source", str(m / "src"), "--reference", str(m / "bf16.gguf"), "--text", str(m / "text.txt")]
    args += ["--chunks", str(CHUNKS), "--ctx", str(CTX), str(m / "exact.gguf"), str(m / "donor.gguf")]
    res = CliRunner().invoke(main, [*args, "--json", "--plot", str(tmp_path / "q.png")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (
        list(data) == ["files"]
        and [list(f) for f in data["files"]] == [["file", "mean_kld", "p99_kld", "same_top", "ppl_ratio", "bytes"]] * 2
    )
    assert data["files"][0]["file"] == str(m / "exact.gguf") and 0 < data["files"][0]["same_top"] <= 1
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = CliRunner().invoke(main, args)
    assert table.exit_code == 0 and "mean KLD" in table.output and "exact.gguf" in table.output


@pytest.fixture(scope="module")
def drafters(tmp_path_factory) -> dict[str, Path]:
    server_binary()
    root = tmp_path_factory.mktemp("quality-drafters")
    target, hf = write_agreeing_pair(root / "agreeing")
    mixed = write_mixed_target(root / "mixed.gguf")
    exact = convert_drafter(hf, root / "exact.gguf", target).path
    q8 = root / "q8_0.gguf"  # llama.cpp's own way: llama-quantize from the bf16 drafter
    convert_drafter(hf, root / "bf16.gguf", target, bf16_reference=True)
    quantize = perplexity_binary().with_name("llama-quantize")
    subprocess.run([quantize, root / "bf16.gguf", q8, "Q8_0"], check=True, capture_output=True)
    (root / "prompts.txt").write_text("the cat sat on\n1 2 3 4 5\ndef f(x): return x + 1\n")
    return {"target": mixed, "hf": hf, "exact": exact, "q8": q8, "prompts": root / "prompts.txt", "root": root}


@pytest.mark.llama_server
def test_drafters_acceptance_against_the_bf16_drafter(drafters, run_dir, capsys):
    d = drafters
    report = measure_drafters(
        d["target"], d["prompts"], [d["exact"], d["q8"]], source=d["hf"], n_predict=24, work=d["root"] / "work"
    )
    ref, exact, q8 = report.rows
    with capsys.disabled():
        print(f"\n  drafters on the mixed pair: {[(Path(r.file).name, r.accepted, r.drafted) for r in report.rows]}")
    assert "bf16-drafter" in Path(ref.file).name and report.reference == ref.file and ref.acceptance_ratio == 1.0
    assert all(r.same_output and r.tokens == 3 * 24 for r in report.rows)  # speculation never changes the output
    assert 0 < ref.accepted < ref.drafted
    assert exact.accepted == ref.accepted and exact.drafted == ref.drafted  # every trained level kept
    assert exact.bytes < q8.bytes < ref.bytes


def test_a_request_is_checked_before_any_build_is_looked_for(tmp_path):
    """No llama.cpp build needed: the request's form is refused first."""
    with pytest.raises(ArgumentError, match="both target and prompts|both --target and --prompts"):
        run_quality(QualityRequest([tmp_path / "d.gguf"], target=tmp_path / "t.gguf"))
    with pytest.raises(ArgumentError, match="source"):
        run_quality(QualityRequest([tmp_path / "a.gguf"], text=tmp_path / "text.txt"))
    with pytest.raises(ArgumentError, match="source"):
        measure_quality(QualityRequest([tmp_path / "a.gguf"], donor=tmp_path / "donor.gguf"))
    with pytest.raises(ArgumentError, match="does not run alone in llama-perplexity"):
        measure(tmp_path, [tmp_path / "a.gguf"], tmp_path / "text.txt", vocab_from=tmp_path / "t.gguf")
    assert QualityRequest([tmp_path / "a.gguf"]).files == (tmp_path / "a.gguf",)


def test_perplexity_binary_from_the_environment_or_a_hint(tmp_path, monkeypatch):
    from gguf_exact.errors import BuildError
    from gguf_exact.quality import perplexity

    monkeypatch.setenv("GGUF_EXACT_LLAMA_PERPLEXITY", str(tmp_path / "missing"))
    with pytest.raises(BuildError, match=r"\$GGUF_EXACT_LLAMA_PERPLEXITY\): no such executable"):
        perplexity_binary()
    tool = tmp_path / "llama-perplexity"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("GGUF_EXACT_LLAMA_PERPLEXITY", str(tool))
    assert perplexity_binary() == tool
    monkeypatch.delenv("GGUF_EXACT_LLAMA_PERPLEXITY")
    monkeypatch.setattr(perplexity, "find_build", lambda backend: None)
    with pytest.raises(BuildError, match=r"run `gguf-exact build-llama` \(or `make llama-server`\) first"):
        perplexity_binary()


def test_char_vocabulary_is_one_character_per_token():
    """The vocabulary of `scripts/bench_quality.py`'s model: its sampled text must tokenize back
    to the tokens it was sampled as, so no token may be two others joined."""
    tokens, scores, types = char_vocabulary(262_144)
    chars = tokens[259:]
    assert len(tokens) == len(scores) == len(types) == 262_144 and tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert chars[0] == "▁" and all(len(c) == 1 for c in chars) and len(set(chars)) == len(chars)
    assert all(ord(c) >= 0x10000 and ord(c) & 0xFFFE != 0xFFFE for c in chars[1:])  # no surrogates, no nonchars


@pytest.mark.bindings
def test_char_vocabulary_text_tokenizes_back_in_llama_cpp(tmp_path):
    import llama_cpp

    from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint

    write_main_checkpoint(tmp_path / "src", TINY, seed=0)
    write_donor(tmp_path / "donor.gguf", tmp_path / "src", TINY, char_tokens=True)
    llm = llama_cpp.Llama(model_path=str(tmp_path / "donor.gguf"), vocab_only=True, verbose=False)
    ids = [259 + (i * 7919) % 61 for i in range(1, 501)]  # "▁" and the 60 characters, scrambled
    text = llm.detokenize(ids).decode("utf-8")
    assert ids[0] != 259 and len(text) == 500
    # the same tokens, after the "▁" llama.cpp's SPM tokenizer puts before any text
    assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) == [259, *ids]


def test_peaked_embedding_changes_only_the_token_embedding(tmp_path):
    from gguf_exact.formats.checkpoint import Checkpoint
    from gguf_exact.tiny.main_model import PEAKED_EMBED_SCALE, TINY, write_main_checkpoint

    write_main_checkpoint(tmp_path / "plain", TINY, seed=0)
    write_main_checkpoint(tmp_path / "peaked", TINY, seed=0, embed_scale=PEAKED_EMBED_SCALE)
    with Checkpoint(tmp_path / "plain") as plain, Checkpoint(tmp_path / "peaked") as peaked:
        differ = [n for n in plain.tensors if not np.array_equal(plain.read(n), peaked.read(n))]
        assert differ == ["model.language_model.embed_tokens.weight"]
        rms = [float(np.sqrt(np.mean(bf16.to_f32(c.read(differ[0])) ** 2))) for c in (plain, peaked)]
    assert 14 < rms[1] / rms[0] < 16  # the QAT scale, 0.3 against 0.02
