"""Every line fits an 80-column terminal (issue 30): verify's compact table, bench and tune
tables, doctor, demo, recipes and fetch; the missing-build hint names the make line of the
profile's backend."""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import compact_names
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
    # the blocks column's header wraps (its cells are narrower), giving the names 5 more columns
    assert lines[head].split() == ["tensor", "type", "judged", "values", "exact", "ULP", "rel.err", "blocks"]
    assert lines[head + 1].split() == ["p/e/m/l"]
    # every name whole on a line: on its row's when it fits the column, else on its own above the row
    assert lines[head + 3 : head + 6] == [
        "masked_embd_centroids.weight",
        "                         BF16  pass      2,048  100.00%    0  0.0e+00          -",
        "masked_embd_ordering     I32   pass          0        -    -        -          -",
    ]
    with open_gguf(out) as g:
        assert compact_names(r.stdout, "tensor") == [t.name for t in g.tensors]
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
def test_demo_rules_are_ascii_and_fit(tmp_path, monkeypatch):
    from gguf_exact.demo import run_demo

    captured = Console(highlight=False, width=WIDTH, record=True, file=open("/dev/null", "w"))
    monkeypatch.chdir(tmp_path)  # a relative folder, as `make demo`'s build/demo: its paths are short
    run_demo(Path("build/demo"), captured)
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
    from gguf_exact.engines.shared.profiles import load_profile
    from gguf_exact.errors import GgufExactError

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


def test_shorten_middle_keeps_the_start_and_the_end():
    assert console.shorten_middle("blk.12.ffn_gate.weight", 40) == "blk.12.ffn_gate.weight"
    assert console.shorten_middle("blk.12.ffn_gate.weight", 15) == "blk.12.….weight"
    assert (
        console.shorten_middle("/home/someone/models/gemma-4-E2B/drafter.gguf", 30) == "/home/someone/…2B/drafter.gguf"
    )
    assert len(console.shorten_middle("x" * 200, 80)) == 80


def shown_whole_or_shortened(name: str, shown: str) -> bool:
    """``shown`` is ``name``, or ``name`` longer than a line, shortened to one in its middle."""
    if shown == name:
        return True
    head, _, tail = shown.partition("…")
    return len(name) > WIDTH and len(shown) == WIDTH and name.startswith(head) and name.endswith(tail)


def test_inspect_verify_compare_keep_names_whole_under_a_long_folder(tmp_path, narrow):
    """Issue 41: at 80 columns names were broken mid-word across lines; each is now whole on a
    line (its row's, or its own above the row's figures), a path longer than a line shortened
    in the middle, and no line is wider than 80."""
    from gguf_exact.formats.checkpoint import Checkpoint
    from gguf_exact.formats.gguf_reader import open_gguf

    tiny = tmp_path / "a_folder_whose_name_is_long_enough_to_push_every_path_past_eighty_columns"
    assert run("make-tiny", tiny).exit_code == 0
    drafter, exact = tiny / "drafter.gguf", tiny / "main-exact.gguf"
    assert run("convert", tiny / "drafter-hf", drafter, "--vocab-from", tiny / "target.gguf").exit_code == 0
    assert run("repack", "--donor", tiny / "main-q4_0.gguf", "--source", tiny / "main-hf", exact).exit_code == 0

    for src in (tiny / "drafter-hf", tiny / "main-hf"):
        r = run("inspect", src)
        assert r.exit_code == 0, r.output
        assert too_wide(r.stdout) == []
        assert console.shorten_middle(str(src), WIDTH) in [ln.strip() for ln in r.stdout.splitlines()]  # the title
        prefix = re.search(r"\(… = (\S+)\)", r.stdout).group(1)
        shown = [n.replace("…", prefix, 1) if n.startswith("…") else n for n in compact_names(r.stdout, "tensor")]
        with Checkpoint(src) as ckpt:
            assert shown == sorted(ckpt.tensors)
    r = run("inspect", tiny / "main-hf")
    lines = r.stdout.splitlines()
    at = lines.index("…0.per_layer_input_gate.weight")  # longer than its column: on a line of its own
    assert lines[at - 1 : at + 2] == [
        "…0.mlp.up_proj.weight       512x256   BF16     4096  100.00%     99.88%  Q4_0",
        "…0.per_layer_input_gate.weight",
        "                            32x256    BF16      256  100.00%     99.90%  Q4_0",
    ]

    for gguf, extra in (
        (drafter, ["--vocab-from", tiny / "target.gguf"]),
        (exact, ["--donor", tiny / "main-q4_0.gguf"]),
    ):
        source = tiny / ("drafter-hf" if gguf == drafter else "main-hf")
        r = run("verify", gguf, "--source", source, *extra)
        assert r.exit_code == 0, r.output
        assert too_wide(r.stdout) == []
        with open_gguf(gguf) as g:
            assert compact_names(r.stdout, "tensor") == [t.name for t in g.tensors]
    assert r.stdout.splitlines()[:1] == [console.shorten_middle(str(exact), WIDTH)]

    paths = [exact, tiny / "main-q4_0.gguf"]
    r = run("compare", "--source", tiny / "main-hf", *paths)
    assert r.exit_code == 0, r.output
    assert too_wide(r.stdout) == []
    names = compact_names(r.stdout, "file")
    assert len(names) == 2 and all(shown_whole_or_shortened(str(p), n) for p, n in zip(paths, names))
    lines = r.stdout.splitlines()
    at = lines.index(names[1])
    assert lines[at : at + 3] == [
        names[1],
        "      3,516,800  F16 x1, F32 x63, Q4_0 x64, Q6_K     60.61%   1.114e-02       64",
        "                 x2",
    ]


def test_status_lines_wrap_under_their_value_at_80_columns(tmp_path):
    """Issue 41: `status` printed its lines whole (soft-wrapped), a terminal broke them at
    column 0; off one at COLUMNS=80 they went past 80. Now each wraps under its value."""
    import json
    import os

    from helpers import cli
    from test_stop_status import fake_server

    port = 47125
    proc = fake_server(tmp_path / "run", port)
    proc.kill()
    proc.wait()
    state_file = tmp_path / "run" / str(port) / "server.json"
    state = json.loads(state_file.read_text())
    state["target"] = "/models/a_folder_whose_name_is_long_enough_to_wrap/gemma-4-E2B-it-qat-q4_0-exact.gguf"
    state_file.write_text(json.dumps(state))
    r = cli("status", "--port", str(port), env=dict(os.environ, GGUF_EXACT_RUN_DIR=str(tmp_path / "run"), COLUMNS="80"))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert too_wide(r.stdout) == []
    server = f"server       http://127.0.0.1:{port}  pid {proc.pid}  down: process not running (exited or killed)"
    assert lines[0] == server[: server.rindex(" ", 0, 81)]  # broken at the last space that fits
    assert lines[1] == " " * 13 + server[server.rindex(" ", 0, 81) + 1 :]  # continued under the value
    target = lines.index("target       /models/a_folder_whose_name_is_long_enough_to_wrap/")
    assert lines[target + 1] == "             gemma-4-E2B-it-qat-q4_0-exact.gguf"
    assert all(ln.startswith(" " * 13) or ln[:13].strip() for ln in lines)
