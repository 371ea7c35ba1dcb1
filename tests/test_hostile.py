"""Every command that reads a file, fed the corpus of broken and hostile inputs in
tests/hostile.py: one `error:` line naming the file and what is wrong, exit 1, no
traceback, nothing left at the output path (issue 10 §4; paths that are not files and
corrupt server state, issue 16 §7)."""

import errno
import os
import resource
import shutil
import stat
from pathlib import Path

import hostile
import pytest
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.drafter.convert import convert_drafter

SOURCE_CASES = hostile.SAFETENSORS + hostile.INDEX + hostile.CONFIG
BOUNDED_SOURCE_CASES = hostile.BOUNDED_SAFETENSORS + hostile.BOUNDED_INDEX + hostile.BOUNDED_CONFIG


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


def not_file_commands(bad, good, out):
    return {
        "verify": ["verify", bad, "--source", good / "src"],
        "compare": ["compare", "--source", good / "src", bad],
        "convert --vocab-from": ["convert", good / "src", out, "--vocab-from", bad],
        "verify --vocab-from": ["verify", good / "drafter.gguf", "--source", good / "src", "--vocab-from", bad],
        "verify --donor": ["verify", good / "drafter.gguf", "--source", good / "src", "--donor", bad],
        "repack --donor": ["repack", "--donor", bad, "--source", good / "src", out],
        "serve --model": ["serve", "--dry-run", "--model", bad],
    }


@pytest.mark.parametrize("command", list(not_file_commands(None, Path("."), None)))
@pytest.mark.parametrize("case", hostile.NOT_FILES, ids=lambda c: c.__name__)
def test_an_input_that_is_not_a_file_is_named_for_what_it_is(good, tmp_path, case, command):
    bad, what = case(tmp_path)
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    line = expect_one_line(not_file_commands(bad, good, out)[command], [bad], [out])
    assert line.endswith(f"{bad}: {what}"), line


def test_a_source_that_is_a_file_is_named_for_what_it_is(good, tmp_path):
    line = expect_one_line(["verify", good / "drafter.gguf", "--source", good / "target.gguf"], [good / "target.gguf"])
    assert line == f"error: {good / 'target.gguf'}: is a regular file, not a Hugging Face model folder", line


@pytest.mark.parametrize("command", ["convert", "repack", "convert --report", "repack --report"])
def test_an_output_that_is_a_directory_is_refused_before_any_work(good, tmp_path, command, monkeypatch):
    folder = tmp_path / "already-a-folder.gguf"
    folder.mkdir()
    report = tmp_path / "report.json"
    target = report if "--report" in command else folder
    if "--report" in command:
        report.mkdir()
    out = tmp_path / "x.gguf" if "--report" in command else folder
    from gguf_exact.stream import writer

    def no_work(*args, **kwargs):  # the check is up front: no tensor is written
        raise AssertionError("tensors were written before the output path was checked")

    monkeypatch.setattr(writer.TensorWriter, "tensor", no_work)
    args = {
        "convert": ["convert", good / "src", out, "--vocab-from", good / "target.gguf"],
        "repack": ["repack", "--donor", good / "drafter.gguf", "--source", good / "src", out],
    }[command.split()[0]]
    if "--report" in command:
        args += ["--report", report]
    what = "report" if "--report" in command else "output"
    line = expect_one_line(args, [target])
    assert line == f"error: {target}: the {what} path is a directory; name a file to write", line
    left = {folder.name} | ({report.name} if "--report" in command else set())
    assert {p.name for p in tmp_path.iterdir()} == left and list(target.iterdir()) == []


@pytest.mark.parametrize("command", ["status", "stop"])
@pytest.mark.parametrize("case", hostile.SERVER_STATE, ids=lambda c: c.__name__)
def test_a_corrupt_server_state_is_one_error_line(tmp_path, case, command):
    state = hostile.good_server_state(tmp_path / "run", 18080)
    what = case(state)
    result = CliRunner().invoke(main, [command, "--port", "18080"], env={"GGUF_EXACT_RUN_DIR": str(tmp_path / "run")})
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {state}: {what}"), lines
    assert lines[0].endswith(f"remove {state.parent} and start the server again"), lines[0]


@pytest.fixture
def permissions_enforced(monkeypatch):
    """A file with no read permission refused to this process as the kernel refuses any
    user but root: as root, ``os.open`` (the one way the readers open an input) is made to
    refuse it with the error a user would get."""
    if os.geteuid() != 0:
        return
    real_open = os.open

    def open_as_a_user(path, flags, *args, **kwargs):
        try:
            st = os.stat(path)
        except (OSError, TypeError, ValueError):
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and not st.st_mode & 0o444:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_as_a_user)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.mark.parametrize("command", ["inspect", "convert", "verify", "compare", "repack"])
@pytest.mark.parametrize("case", BOUNDED_SOURCE_CASES, ids=lambda c: c.__name__)
def test_a_hostile_source_is_refused_in_one_line(good, tmp_path, case, command, permissions_enforced):
    """Nesting too deep for the JSON parser, a number too long to convert, a file too large
    to read whole, one that cannot be opened: one line naming the file (and the field),
    before the parser's stack or memory is spent (issue 42)."""
    src, what = hostile.broken_copy(good / "src", tmp_path / "src", case)
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    peak = peak_rss_bytes()
    line = expect_one_line(source_commands(src, good, out)[command], [f"{src}/"], [out])
    assert what in line, line
    assert peak_rss_bytes() - peak < 256 << 20  # a 3 GB config.json is not read


@pytest.mark.parametrize(
    "command", ["convert --vocab-from", "verify", "compare", "repack --donor", "serve --model", "serve --draft"]
)
@pytest.mark.parametrize("case", hostile.BOUNDED_GGUF, ids=lambda c: c.__name__)
def test_a_hostile_gguf_is_refused_in_one_line(good, tmp_path, case, command, permissions_enforced):
    which = "target.gguf" if command in ("convert --vocab-from", "serve --model") else "drafter.gguf"
    bad, what = hostile.broken_copy(good / which, tmp_path / f"bad-{which}", case)
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    line = expect_one_line(gguf_commands(bad, good, out)[command], [f"{bad}: "], [out])
    assert what in line, line


@pytest.mark.parametrize(
    "case, expected",
    [
        ("deep", "error: profile {p}: not a profile (values nested too deep for TOML's parser)"),
        ("bigint", "error: profile {p}: not a profile (an integer of more than 4,300 digits)"),
        (
            "sparse",
            "error: {p}: 3,221,225,472 bytes, more than the 16,777,216 a profile may hold; a profile is a few lines of TOML",
        ),
    ],
)
def test_a_hostile_profile_is_one_line(tiny, tmp_path, case, expected):
    """`serve --profile FILE.toml`: TOML nested 100,000 deep, a 5,000-digit integer, a 3 GB sparse
    file (never read whole) - one line each, where tomllib gave tracebacks."""
    p = tmp_path / f"{case}.toml"
    if case == "deep":
        p.write_text("[server]\nx = " + "[" * 100000 + "]" * 100000 + "\n")
    elif case == "bigint":
        p.write_text("[server]\nctx-size = " + "9" * 5000 + "\n")
    else:
        with open(p, "wb") as f:
            f.truncate(3 << 30)
    r = CliRunner().invoke(
        main, ["serve", "--model", str(tiny / "target.gguf"), "--no-draft", "--profile", str(p), "--dry-run"]
    )
    assert r.exit_code == 1 and r.stderr.strip().splitlines() == [expected.format(p=p)], r.output
