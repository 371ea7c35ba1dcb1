"""Every line fits an 80-column terminal (issue 30): verify's compact table, bench and tune
tables, doctor, demo, recipes and fetch; the missing-build hint names the make line of the
profile's backend."""

import re

import pytest
from click.testing import CliRunner
from rich.console import Console

from gguf_exact.cli import console, main

WIDTH = 80


@pytest.fixture
def narrow(monkeypatch):
    """The CLI's console as an 80-column terminal prints to (what CliRunner captures)."""
    monkeypatch.setattr(console, "out", Console(highlight=False, width=WIDTH))


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def too_wide(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if len(ln) > WIDTH or "\ufffd" in ln]


def test_fit_breaks_at_spaces_then_slashes_and_keeps_every_character():
    line = "  to      models/xbill9/gemma-4-E2B-it-qat-assistant-q4_0-exact-gguf/gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf"
    lines = console.fit(line, 40, " " * 8)
    assert lines == [
        "  to      models/xbill9/",
        "          gemma-4-E2B-it-qat-assistant-q",  # a name longer than a line: cut where it must
        "          4_0-exact-gguf/",
        "          gemma-4-E2B-it-qat-assistant-q",
        "          4_0-exact.gguf",
    ]
    assert "".join(ln.strip() for ln in lines).replace(" ", "") == line.replace(" ", "")
    assert console.fit("short", 40) == ["short"]
    word = "x" * 100
    assert [len(ln) for ln in console.fit(word, 40)] == [40, 40, 28]  # 4 + 36, 4 + 24 after the first
    assert "".join(ln.strip() for ln in console.fit(word, 40)) == word


def test_verify_at_80_columns_is_compact_and_keeps_every_name(tiny, tmp_path, narrow):
    from gguf_exact.drafter.convert import convert_drafter
    from gguf_exact.formats.gguf_reader import open_gguf

    out = convert_drafter(tiny / "drafter-fp32", tmp_path / "d.gguf", tiny / "target.gguf").path
    r = run("verify", out, "--source", tiny / "drafter-fp32", "--vocab-from", tiny / "target.gguf")
    assert r.exit_code == 0, r.output
    assert too_wide(r.stdout) == []
    lines = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("tensor "))
    assert lines[head].split() == ["tensor", "type", "judged", "values", "exact", "ULP", "rel.err", "blocks", "p/e/m/l"]
    # names wrapped in their column, never cut: joined back, they are the file's tensors in order
    cut = len(lines[head]) - len(lines[head][len("tensor") :].lstrip())
    names: list[str] = []
    for ln in lines[head + 2 :]:
        if ln.startswith("(all)"):
            break
        cell, rest = ln[:cut].strip(), ln[cut:].strip()
        if rest:
            names.append(cell)
        else:
            names[-1] += cell
    with open_gguf(out) as g:
        assert names == [t.name for t in g.tensors]
    assert "…" not in r.stdout
    assert re.search(r"^\(all\) +228,740 +99\.9\d% +1 ", r.stdout, re.M)
    assert "blocks p/e/m/l: as planned / equally exact / more exact / less exact than the" in r.stdout
    verdict = r.stdout[r.stdout.index("verify: PASS — ") :]
    # the tiny drafter's ordered-head centroids are off the grid: stored in their own float type
    assert " ".join(verdict.split()).endswith(
        "every block as exact as the plan; 1 matrix off the grid, stored as convert defines"
    )


def test_bench_and_tune_tables_fit(narrow):
    from gguf_exact.bench.run import ArmSummary, BenchReport

    rows = [
        ArmSummary("target", None, 4, 512, 2548.31, 2550.12, 1.0, None, None, None, None, None),
        ArmSummary("n-max 3", 3, 4, 512, 2583.04, 2583.44, 2.61, 0.853, 2.56, 1.014, 37.0, True),
    ]
    report = BenchReport({"backend": "cpu", "n_predict": 64, "prompts": ["code"], "rounds": 2}, [], rows)
    assert max(map(len, report.table())) > WIDTH  # the Markdown file keeps the whole table
    captured = Console(highlight=False, width=WIDTH, record=True)
    console.out = captured
    console.say_markdown(report.markdown())
    text = captured.export_text()
    assert too_wide(text) == []
    assert text.splitlines()[:7] == [
        "target",
        "  n-max -; runs 4; tokens/s 2548.3; median tokens/s 2550.1; speed-up -;",
        "  tokens/pass 1.00; acceptance -; mean len -; Python µs/step -; same as target -",
        "n-max 3",
        "  n-max 3; runs 4; tokens/s 2583.0; median tokens/s 2583.4; speed-up 1.01;",
        "  tokens/pass 2.61; acceptance 0.853; mean len 2.56; Python µs/step 37;",
        "  same as target yes",
    ]
    wide = Console(highlight=False, width=200, record=True)
    console.out = wide
    console.say_markdown(report.markdown())
    assert wide.export_text().splitlines()[:2] == report.table()[:2]  # wide enough: the table as it is


def test_doctor_lines_fit(narrow):
    r = run("doctor")
    assert r.exit_code == 0, r.output
    assert too_wide(r.stdout) == []
    firsts = [ln for ln in r.stdout.splitlines() if ln[:2] in ("ok", "--")]
    assert [ln[4:26].strip() for ln in firsts][:2] == ["CPU features", "bindings"]
    assert all(ln.startswith(" " * 27) for ln in r.stdout.splitlines() if ln[:2] not in ("ok", "--"))


@pytest.mark.bindings
@pytest.mark.llama_server
def test_demo_rules_are_ascii_and_fit(tmp_path):
    from gguf_exact.demo import run_demo

    captured = Console(highlight=False, width=WIDTH, record=True, file=open("/dev/null", "w"))
    run_demo(tmp_path / "demo", captured)
    text = captured.export_text()
    assert too_wide(text) == []
    rules = [ln for ln in text.splitlines() if re.fullmatch(r"-+ \d\. .* -+", ln)]
    assert len(rules) == 4 and all(len(ln) == WIDTH and ln.isascii() for ln in rules)
    assert "4. llama.cpp: the target alone and with the drafter (draft-mtp, in-process)" in rules[3]
    assert "…" not in text and text.replace("µ", "").isascii()
    for pair in ("random", "agreeing", "mixed", "hidden"):
        assert re.search(rf"^\| {pair} +\|", text, re.M), pair  # every pair's row, its name whole


def test_missing_build_names_the_make_line_of_its_backend(monkeypatch, tmp_path):
    from gguf_exact.builds.llama_build import make_command
    from gguf_exact.engines.llama_server import resolve_server_binary
    from gguf_exact.errors import GgufExactError
    from gguf_exact.runtime.profiles import load_profile

    assert [make_command(b) for b in ("cpu", "cuda86", "cuda75", "vulkan")] == [
        "make llama-server", "make llama-server CUDA=86", "make llama-server CUDA=75", "make llama-server VULKAN=1",
    ]  # fmt: skip
    monkeypatch.setenv("GGUF_EXACT_CACHE", str(tmp_path))  # no build here
    monkeypatch.delenv("GGUF_EXACT_LLAMA_SERVER", raising=False)
    with pytest.raises(GgufExactError) as err:
        resolve_server_binary(load_profile("rtx3050"))
    assert str(err.value) == (
        "llama-server for build 'cuda86' (profile rtx3050) not found; run `gguf-exact build-llama --cuda 86` "
        "(or `make llama-server CUDA=86`) first"
    )
