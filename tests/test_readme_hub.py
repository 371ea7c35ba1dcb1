"""README's "Get the real files, verified" block, run as written (issue 30), against a
loopback Hub (tests/hubserver.py) that serves the real repositories, file names and
commits with tiny stand-ins for their bytes; a checksum folder of the test's own
(GGUF_EXACT_CHECKSUMS) pins the stand-ins' sizes and sha256 at the project's commits.
So the README cannot promise a command that fails, nor a line wider than 80 columns."""

import hashlib
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from hubserver import FakeHub
from huggingface_hub import constants
from rich.console import Console

from gguf_exact.cli import console, main
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.hub import checksums
from gguf_exact.hub.checksums import Entry
from gguf_exact.hub.recipes import load_recipe
from gguf_exact.tiny.kit import write_tiny_kit

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def readme_commands(heading: str) -> list[list[str]]:
    """The commands of the first ```sh block after ``heading``: continuation lines joined,
    comments dropped, each split as a shell would."""
    start = README.index(heading)
    block = re.compile(r"```sh\n(.*?)```", re.S).search(README, start).group(1)
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def hub_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(console, "out", Console(highlight=False, width=80))


def stand_ins(tmp_path: Path) -> dict[str, dict[str, bytes]]:
    """repo -> file -> bytes: the tiny kit's target and drafter checkpoint, and the exact
    drafter converted from them, under the real repositories' names."""
    kit = write_tiny_kit(tmp_path / "kit")
    exact = convert_drafter(kit.drafter_hf, tmp_path / "kit" / "exact.gguf", kit.target).path
    r = load_recipe("e2b-assistant")
    return {
        r.part("target").repo: {r.part("target").files[0]: kit.target.read_bytes()},
        r.part("source").repo: {f: (kit.drafter_hf / f).read_bytes() for f in r.part("source").files},
        r.part("exact").repo: {r.output: exact.read_bytes()},
    }


def test_get_the_real_files_runs_as_the_readme_writes_it(tmp_path, monkeypatch):
    commands = readme_commands("## Get the real files, verified")
    assert [c[:3] for c in commands] == [
        ["gguf-exact", "recipes"],
        ["gguf-exact", "fetch", "e2b-assistant"],
        ["gguf-exact", "fetch", "e2b-assistant"],
        ["gguf-exact", "fetch", "e2b-assistant"],
        ["gguf-exact", "fetch", "e2b-assistant"],
        ["gguf-exact", "fetch", "e2b-assistant"],
        ["gguf-exact", "inspect", "models/google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant"],
        ["gguf-exact", "convert", "models/google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant"],
    ]
    files = stand_ins(tmp_path)
    recipe = load_recipe("e2b-assistant")
    real = checksums.read(recipe.checksums)
    # the test's pins: the project's commits, the stand-ins' sizes and sha256
    entries = [Entry(hashlib.sha256(d).hexdigest(), f"{repo}/{f}") for repo, fs in files.items() for f, d in fs.items()]
    sizes = {f"{repo}/{f}": len(d) for repo, fs in files.items() for f, d in fs.items()}
    pins = checksums.Checksums(real.header, real.pins, entries, sizes)
    (tmp_path / "pins").mkdir()
    checksums.write(tmp_path / "pins" / recipe.checksums.name, pins)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with FakeHub(lifetime=120) as hub:
        for repo, fs in files.items():
            commit = real.pins[repo].commit
            if commit:
                hub.commit_at(repo, commit, fs)
            else:  # sha256 pinned, commit not pinned: whatever main is
                hub.commit(repo, fs)
        env = {"HF_ENDPOINT": hub.url, "GGUF_EXACT_CHECKSUMS": str(tmp_path / "pins")}
        outputs = []
        for argv in commands:
            r = CliRunner().invoke(main, argv[1:], env=env)
            assert r.exit_code == 0, (argv, r.output)
            assert all(len(ln) <= 80 for ln in r.stdout.splitlines()), (argv, r.stdout)
            outputs.append(r.stdout)
    recipes, dry_run, target, drafter, exact, source, inspect, convert = outputs
    target_repo = recipe.part("target").repo
    assert "      commit 675cff42a74c pinned, sha256 " in recipes
    assert f"  to      models/{target_repo}/gemma-4-E2B_q4_0-it.gguf" in dry_run
    size = len(files[target_repo]["gemma-4-E2B_q4_0-it.gguf"])
    assert (
        " ".join(dry_run.split()).count(
            f"would download {size:,} bytes ({console.human_size(size)}) from commit 675cff42a74c774d6cb76f76d8eacb49b48c9b93"
        )
        == 1
    )
    assert target.splitlines()[1] == f"  downloaded, {size:,} bytes, commit 675cff42a74c774d6cb76f76d8eacb49b48c9b93"
    # the default: the checkpoint and the published file fetched, the checkpoint converted with its head
    assert drafter.count("  downloaded, ") == 3 and "with its ordered-embedding head" in " ".join(drafter.split())
    converted = work / "models" / "converted" / recipe.output
    assert converted.read_bytes() == files[recipe.part("exact").repo][recipe.output]  # the stand-in has the head
    assert "sha256 pinned, commit not pinned (from main)" in " ".join(exact.split())
    assert exact.count("  in place, ") == 1 and source.count("  in place, ") == 2
    assert "QAT 4-bit: all 23 weight matrices are on the Q4_0 grid" in " ".join(inspect.split())
    assert "verified" in convert
    for repo, fs in files.items():
        for name, data in fs.items():
            assert (work / "models" / repo / name).read_bytes() == data
    built = work / "gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf"
    assert built.read_bytes() == files[recipe.part("exact").repo][recipe.output]  # the published bytes, rebuilt
