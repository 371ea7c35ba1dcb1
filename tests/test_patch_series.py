"""Moving the carried patches to another llama.cpp (scripts/rebase_patches.py, builds/patch_series.py),
tried on the pinned base: a git repository made from the sdist's vendor/llama.cpp."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import sdist_files

from gguf_exact.builds import llama_build, patch_series, source_patches
from gguf_exact.builds.sdist import COMMIT
from gguf_exact.errors import BuildError

ROOT = Path(__file__).parent.parent
UPSTREAM = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


@pytest.fixture(scope="module")
def sdist():
    return llama_build.fetch_sdist(llama_build.pinned_sdist(), log=lambda _m: None)


@pytest.fixture(scope="module")
def pinned(sdist) -> Path:
    """The pinned checkout, made once per sdist and kept under the temp folder (15 s to make)."""
    path = Path(tempfile.gettempdir()) / f"gguf-exact-llama.cpp-{COMMIT}-{llama_build.pinned_sdist().sha256[:12]}"
    if not path.is_dir():
        try:
            patch_series.pinned_checkout(path, sdist)
        except BuildError:  # made meanwhile by another run
            assert path.is_dir()
    return path


@pytest.fixture
def checkout(pinned, tmp_path) -> Path:
    """A clone of the pinned checkout to change."""
    dest = tmp_path / "llama.cpp"
    subprocess.run(["git", "clone", "-q", str(pinned), str(dest)], check=True)
    return dest


def git(checkout: Path, *args: str) -> str:
    return patch_series.git(checkout, *args).stdout


def test_the_pinned_checkout_is_the_sdists_tree_at_its_upstream_commit(sdist, pinned, tmp_path):
    assert patch_series.upstream_commit(sdist) == UPSTREAM
    assert git(pinned, "log", "--format=%s%n%(trailers:key=Upstream-commit,valueonly)").split("\n")[:2] == [
        f"llama.cpp {UPSTREAM} from llama_cpp_python-0.3.36.tar.gz",
        UPSTREAM,
    ]
    files = git(pinned, "ls-files").split("\n")[:-1]
    assert len(files) == 3665 and ".git" not in files  # every file but the submodule's pointer
    sample = ["CMakeLists.txt", "src/llama-context.cpp", "tools/server/server-context.cpp", "common/arg.cpp"]
    want = sdist_files(sdist, sample, tmp_path)
    assert all((pinned / f).read_bytes() == (want / f).read_bytes() for f in sample)


def test_every_commit_applies_to_the_pinned_base_and_writes_back_the_same_files(checkout, sdist, tmp_path):
    """git am -3 takes every patch, the branch's files are the build's (patch --fuzz=0 on the
    unpacked sdist), and the branch written back with format-patch is the series byte for byte."""
    results = patch_series.apply_series(checkout, log=lambda _m: None)
    assert [(p.id, why, moved) for p, why, moved in results] == [(p.id, "", "") for p in source_patches.PATCHES]
    assert git(checkout, "rev-parse", "--abbrev-ref", "HEAD").strip() == patch_series.BRANCH
    subjects = git(checkout, "log", "--reverse", "--format=%(trailers:key=Gguf-exact-id,valueonly)", f"-{len(source_patches.PATCHES)}")
    assert subjects.split() == [p.id for p in source_patches.PATCHES]

    changed = git(checkout, "diff", "--name-only", f"HEAD~{len(source_patches.PATCHES)}", "HEAD").split()
    built = sdist_files(sdist, changed, tmp_path / "built")
    assert source_patches.apply_patches(built, "cuda86") == [p.id for p in source_patches.PATCHES]
    assert all((checkout / f).read_bytes() == (built / f).read_bytes() for f in changed), changed
    # 20, ggml-cpu's repack.cpp, repack.h, arch/x86/repack.cpp (38m, 38n, 38o), ops.cpp (39f, 39g),
    # arch/x86/quants.c and tiled/tiled-kernel.cpp (39h), llamafile/sgemm.cpp (39j)
    assert len(changed) == 27

    out = tmp_path / "exported"
    out.mkdir()
    written = patch_series.export_series(checkout, out, log=lambda _m: None)
    assert [p.name for p in written] == [p.file for p in source_patches.PATCHES]
    assert all(p.read_bytes() == (source_patches.PATCH_DIR / p.name).read_bytes() for p in written)


def test_the_script_names_each_commit_that_conflicts_and_applies_the_rest(checkout):
    """Upstream moved on under three patches: 24 replaces the edited loader line, 27572 deletes
    the comment edited here, 23a the edited line of draft-mtp's loop. One run names the first two
    with their files in conflict and applies the other eleven; 23a applies, but git placed its
    second hunk in eagle3's loop, whose lines read alike, and the report says so (and of 38's
    draft-mtp hunk, one line off for the line 23a's did not add there)."""
    context = checkout / "src/llama-context.cpp"
    context.write_text(
        context.read_text().replace("// that the previous compute is still reading.", "// that it still reads.")
    )
    head = checkout / "src/models/gemma4-assistant.cpp"
    old = '    create_tensor(tn(LLM_TENSOR_MASKED_EMBD_CENTROIDS, "weight"), {}, TENSOR_NOT_REQUIRED);'
    assert head.read_text().count(old) == 1
    head.write_text(head.read_text().replace(old, old.replace("{}", "{ }")))
    spec = checkout / "common/speculative.cpp"
    eagle3, mtp, rest = spec.read_text().partition("struct common_speculative_impl_draft_mtp ")
    old = "if (params.n_max <= (int) result.size()) {"
    assert rest.count(old) == 1 and eagle3.count(old) == 1
    spec.write_text(eagle3 + mtp + rest.replace(old, "if ((int) result.size() >= params.n_max) {"))
    git(checkout, "commit", "-q", "-am", "upstream moved on")

    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "rebase_patches.py"), str(checkout)], capture_output=True, text=True
    )
    assert proc.returncode == 1
    expected = [f"{p.file}: applied" for p in source_patches.PATCHES]
    expected[0] = "0001-24-ordered-embedding-head.patch: conflicts in src/models/gemma4-assistant.cpp"
    expected[1] = "0002-27572-sync-before-set-inputs.patch: conflicts in src/llama-context.cpp"
    expected[2] = (
        "0003-23a-draft-mtp-sequence-bounds.patch: applied, but hunk #2 of common/speculative.cpp matched 856 lines "
        "off its place (at line 818): check where it went"
    )
    expected[12] = (
        "0013-38-rejection-sampling.patch: applied, but hunk #2 of common/speculative.cpp matched 1 lines "
        "off its place (at line 1401): check where it went"
    )
    assert proc.stdout.splitlines() == expected
    assert proc.stderr == (
        f"2 of {len(source_patches.PATCHES)} patches do not apply: 0001-24-ordered-embedding-head.patch, 0002-27572-sync-before-set-inputs.patch; "
        "2 applied with a hunk off its place (above): check where it went\n"
    )
    ids = git(checkout, "log", "--reverse", "--format=%(trailers:key=Gguf-exact-id,valueonly)", f"-{len(source_patches.PATCHES) - 2}").split()
    assert ids == [p.id for p in source_patches.PATCHES if p.id not in ("24", "27572")]
    assert git(checkout, "log", "-1", "--format=%s", f"HEAD~{len(source_patches.PATCHES) - 2}") == "upstream moved on\n"
    assert git(checkout, "status", "--porcelain") == ""
    assert not (checkout / ".git" / "rebase-apply").exists()
    eagle3, _, rest = spec.read_text().partition("struct common_speculative_impl_draft_mtp ")
    assert "n_max_seq" in eagle3 and "n_max_seq" not in rest  # where 23a's second hunk went

    # the branch is not the series (two commits missing): writing it back is refused, naming why
    with pytest.raises(BuildError) as e:
        patch_series.export_series(checkout, checkout.parent, log=lambda _m: None)
    assert re.fullmatch(
        rf"{re.escape(str(checkout))}: commit [0-9a-f]{{12}} \(HEAD~{len(source_patches.PATCHES) - 1}\) has Gguf-exact-id: none, but patch 1 of "
        r"source_patches.PATCHES is 24; the branch must end with the series in its order",
        str(e.value),
    )


def test_a_checkout_that_is_not_ready_is_refused_in_one_line(checkout, tmp_path):
    (checkout / "CMakeLists.txt").write_text("edited\n")
    with pytest.raises(BuildError) as e:
        patch_series.apply_series(checkout)
    assert str(e.value) == f"{checkout}: has uncommitted changes; commit or discard them first"
    git(checkout, "checkout", "CMakeLists.txt")
    git(checkout, "branch", patch_series.BRANCH)
    with pytest.raises(BuildError) as e:
        patch_series.apply_series(checkout)
    assert str(e.value) == (
        f"{checkout}: branch gguf-exact-patches exists; delete it (git branch -D gguf-exact-patches) or name another"
    )
    with pytest.raises(BuildError) as e:
        patch_series.apply_series(tmp_path)
    assert str(e.value) == f"{tmp_path}: not a git checkout of llama.cpp"
