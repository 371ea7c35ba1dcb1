"""Every command that reads a file, fed the corpus of broken and hostile inputs in
tests/hostile.py: one `error:` line naming the file and what is wrong, exit 1, no
traceback, nothing left at the output path (issue 10 §4)."""

import shutil

import hostile
import pytest
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.drafter.convert import convert_drafter

SOURCE_CASES = hostile.SAFETENSORS + hostile.INDEX + hostile.CONFIG


@pytest.fixture(scope="module")
def good(tiny, tmp_path_factory):
    """A good source, target and converted drafter to break copies of."""
    root = tmp_path_factory.mktemp("good")
    shutil.copytree(tiny / "drafter-fp32", root / "src")
    shutil.copy(tiny / "target.gguf", root / "target.gguf")
    convert_drafter(root / "src", root / "drafter.gguf", root / "target.gguf")
    return root


def expect_one_line(args, names, outputs=()):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 1, (args, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert any(str(n) in lines[0] for n in names), (names, lines[0])
    for out in outputs:
        assert not out.exists() and not list(out.parent.glob(f".{out.name}.*")), out
    return lines[0]


def source_commands(src, good, out):
    return {
        "inspect": ["inspect", src],
        "convert": ["convert", src, out, "--vocab-from", good / "target.gguf"],
        "verify": ["verify", good / "drafter.gguf", "--source", src],
        "compare": ["compare", "--source", src, good / "drafter.gguf"],
        "repack": ["repack", "--donor", good / "drafter.gguf", "--source", src, out],
    }


@pytest.mark.parametrize("command", ["inspect", "convert", "verify", "compare", "repack"])
@pytest.mark.parametrize("case", SOURCE_CASES, ids=lambda c: c.__name__)
def test_broken_source(good, tmp_path, case, command):
    src, what = hostile.broken_copy(good / "src", tmp_path / "src", case)
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    if case is hostile.config_wrong_architecture and command == "inspect":
        # inspect reads any checkpoint: an unknown architecture is looked at generically
        assert CliRunner().invoke(main, ["inspect", str(src)]).exit_code == 0
        return
    line = expect_one_line(source_commands(src, good, out)[command], [src], [out])
    if command == "convert":
        assert what in line, line


def gguf_commands(bad, good, out):
    return {
        "convert --vocab-from": ["convert", good / "src", out, "--vocab-from", bad],
        "verify": ["verify", bad, "--source", good / "src"],
        "compare": ["compare", "--source", good / "src", bad],
        "repack --donor": ["repack", "--donor", bad, "--source", good / "src", out],
        "serve --model": ["serve", "--dry-run", "--model", bad],
        "serve --draft": ["serve", "--dry-run", "--model", good / "target.gguf", "--draft", bad],
    }


@pytest.mark.parametrize(
    "command", ["convert --vocab-from", "verify", "compare", "repack --donor", "serve --model", "serve --draft"]
)
@pytest.mark.parametrize("case", hostile.GGUF, ids=lambda c: c.__name__)
def test_broken_gguf(good, tmp_path, case, command):
    which = "target.gguf" if command in ("convert --vocab-from", "serve --model") else "drafter.gguf"
    bad, what = hostile.broken_copy(good / which, tmp_path / f"bad-{which}", case)
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    line = expect_one_line(gguf_commands(bad, good, out)[command], [bad], [out])
    assert what in line, line
