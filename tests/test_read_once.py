"""Each command reads each GGUF header once and hashes each file at most once (issue 17):
the parsed header goes along (a ``ModelFile``, an open ``GgufFile``), not the path."""

import collections
import hashlib
import shutil

import pytest
from click.testing import CliRunner

import gguf_exact.formats.gguf_file as gguf_file
import gguf_exact.formats.gguf_reader as gguf_reader
from gguf_exact.cli import main


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from gguf_exact.tiny.kit import write_tiny_kit

    root = tmp_path_factory.mktemp("read-once")
    write_tiny_kit(root, pairs=True)
    return root


@pytest.fixture
def counts(monkeypatch):
    """(header parses, sha256 hashes) per file name."""
    parses, hashes = collections.Counter(), collections.Counter()
    parse, sha = gguf_reader._parse, gguf_file.sha256_file

    def counted_parse(fd, size, where):
        parses[where.split()[-1].rsplit("/", 1)[-1]] += 1
        return parse(fd, size, where)

    def counted_sha(path, *args, **kwargs):
        hashes[str(path).rsplit("/", 1)[-1]] += 1
        return sha(path, *args, **kwargs)

    monkeypatch.setattr(gguf_reader, "_parse", counted_parse)
    import gguf_exact.engines.drafter_lookup
    import gguf_exact.pair.checks
    import gguf_exact.verify

    for module in (gguf_file, gguf_exact.pair.checks, gguf_exact.engines.drafter_lookup, gguf_exact.verify):
        monkeypatch.setattr(module, "sha256_file", counted_sha)
    return parses, hashes


def invoke(*args, env=None):
    r = CliRunner().invoke(main, [str(a) for a in args], env=env)
    assert r.exit_code == 0, r.output
    return r


def test_serve_with_draft_auto_reads_each_header_once_and_hashes_once(kit, tmp_path, counts):
    """The drafter found beside the target, both files listed in a checksum file: one parse
    and one hash each (it was 7 and 6 parses, 3 and 2 hashes)."""
    parses, hashes = counts
    pair = tmp_path / "pair"
    shutil.copytree(kit / "pairs" / "hidden", pair)
    pins = tmp_path / "checksums"
    pins.mkdir()
    lines = [f"{hashlib.sha256((pair / n).read_bytes()).hexdigest()}  x/{n}" for n in ("target.gguf", "drafter.gguf")]
    (pins / "read-once.sha256").write_text("\n".join(lines) + "\n")
    env = {"GGUF_EXACT_CHECKSUMS": str(pins), "GGUF_EXACT_RUN_DIR": str(tmp_path / "run")}
    r = invoke("serve", "--model", pair / "target.gguf", "--dry-run", "--profile", "cpu", env=env)
    assert "sha256 matches checksums/" in r.stdout and "found in" in r.stdout
    assert parses == {"target.gguf": 1, "drafter.gguf": 1}
    assert hashes == {"target.gguf": 1, "drafter.gguf": 1}


@pytest.mark.bindings
@pytest.mark.parametrize("draft", ["given", "auto"])
def test_generate_reads_each_header_once(kit, counts, draft):
    parses, hashes = counts
    target, drafter = kit / "pairs" / "hidden" / "target.gguf", kit / "pairs" / "hidden" / "drafter.gguf"
    invoke("generate", "--model", target, "--draft", drafter if draft == "given" else "auto", "--prompt", "hi",
           "--n-predict", 2, "--n-ctx", 64)  # fmt: skip
    assert parses == {"target.gguf": 1, "drafter.gguf": 1} and not hashes


def test_file_commands_read_each_header_once(kit, tmp_path, counts):
    parses, hashes = counts
    invoke("convert", kit / "drafter-hf", tmp_path / "d.gguf", "--vocab-from", kit / "target.gguf")
    assert parses == {"target.gguf": 1} and not hashes  # the read-back hashes as it reads, not sha256_file
    parses.clear()
    invoke("verify", tmp_path / "d.gguf", "--source", kit / "drafter-hf", "--vocab-from", kit / "target.gguf")
    assert parses == {"d.gguf": 1, "target.gguf": 1} and hashes == {"d.gguf": 1}
    parses.clear(), hashes.clear()
    invoke("repack", "--donor", kit / "main-q4_0.gguf", "--source", kit / "main-hf", tmp_path / "m.gguf")
    invoke("compare", "--source", kit / "main-hf", kit / "main-q4_0.gguf", tmp_path / "m.gguf")
    assert parses == {"main-q4_0.gguf": 2, "m.gguf": 1} and not hashes  # the donor: once per command
