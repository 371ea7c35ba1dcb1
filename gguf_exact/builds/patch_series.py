"""The carried patches as commits on a llama.cpp git checkout: move them to another llama.cpp.

:func:`apply_series` applies ``patches/`` (:mod:`.source_patches`) to any llama.cpp checkout on a
new branch with ``git am -3``, one commit per patch, and names every patch that conflicts (it is
skipped, the rest still tried on top, so one run names them all); :func:`export_series` writes
the branch back to ``patches/`` as ``git format-patch`` files under the registry's names, each
with its base commit; :func:`pinned_checkout` makes the pinned base a git repository from the
sdist's ``vendor/llama.cpp`` (the sdist has no history), for editing a patch and for the tests.
The procedure is in docs/building-llama-cpp.md; ``scripts/rebase_patches.py`` is the command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from gguf_exact.builds import source_patches
from gguf_exact.builds.sdist import COMMIT, _extract_llama_cpp, extract_data, fetch_sdist, pinned_sdist
from gguf_exact.errors import BuildError, GgufExactError

BRANCH = "gguf-exact-patches"
ID_TRAILER = "Gguf-exact-id"  # in every commit message: which registry entry the commit is
UPSTREAM_TRAILER = "Upstream-commit"  # in a pinned checkout's one commit: the llama.cpp commit it is
# A fixed identity and date for the commits made here, so a checkout made twice has the same
# hashes; git am keeps each patch's own author and date.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "gguf-exact",
    "GIT_AUTHOR_EMAIL": "gguf-exact@localhost",
    "GIT_COMMITTER_NAME": "gguf-exact",
    "GIT_COMMITTER_EMAIL": "gguf-exact@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


def git(checkout: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``git -C checkout args``, the commits made with gguf-exact's identity (a checkout may have none)."""
    proc = subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, text=True, env={**os.environ, **_IDENTITY}
    )
    if check and proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BuildError(f"{checkout}: git {' '.join(args[:2])} failed ({tail[0]})")
    return proc


def _require_checkout(checkout: Path) -> None:
    if git(checkout, "rev-parse", "--is-inside-work-tree", check=False).returncode != 0:
        raise BuildError(f"{checkout}: not a git checkout of llama.cpp")
    if (Path(git(checkout, "rev-parse", "--absolute-git-dir").stdout.strip()) / "rebase-apply").exists():
        raise BuildError(f"{checkout}: a git am is in progress; finish it (git am --continue) or git am --abort")
    if git(checkout, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise BuildError(f"{checkout}: has uncommitted changes; commit or discard them first")


def apply_series(checkout: Path, branch: str = BRANCH, log=print) -> list[tuple[source_patches.SourcePatch, str, str]]:
    """Apply every patch in order onto a new ``branch`` at ``checkout``'s HEAD with ``git am -3``;
    each patch with why it did not apply ("": it is a commit) and where a hunk of it went off its
    place (git places a hunk wherever its context matches, maybe in another function with the
    same lines: check it). A patch that does not apply is aborted and the next still tried, so
    one run names every conflict (a patch that builds on a skipped one usually conflicts too)."""
    _require_checkout(checkout)
    if git(checkout, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False).returncode == 0:
        raise BuildError(f"{checkout}: branch {branch} exists; delete it (git branch -D {branch}) or name another")
    git(checkout, "checkout", "-q", "-b", branch)
    results = []
    for p in source_patches.PATCHES:
        dry = git(checkout, "apply", "--check", "-v", str(p.path), check=False)
        moved = source_patches.first_misfit(dry.stdout + dry.stderr) if dry.returncode == 0 else ""
        am = git(checkout, "am", "-3", "--keep-cr", str(p.path), check=False)
        why = ""
        if am.returncode != 0:
            conflicts = git(checkout, "diff", "--name-only", "--diff-filter=U").stdout.split()
            errors = [line for line in (am.stdout + am.stderr).splitlines() if line.startswith("error: patch failed")]
            why = f"conflicts in {', '.join(conflicts)}" if conflicts else (errors or ["git am failed"])[0]
            git(checkout, "am", "--abort", check=False)
        log(f"{p.file}: {why or 'applied'}" + (f", but {moved}: check where it went" if moved and not why else ""))
        results.append((p, why, moved))
    return results


def _trailer(checkout: Path, rev: str, key: str) -> str:
    return git(checkout, "log", "-1", f"--format=%(trailers:key={key},valueonly,separator=%x2c)", rev).stdout.strip()


def export_series(checkout: Path, dest: Path | None = None, log=print) -> list[Path]:
    """Write the checkout's last commits, the series (each carrying its registry id, in the
    registry's order), to ``dest`` (``patches/``) under the registry's file names: one
    ``git format-patch`` per commit, each with its base commit (the pinned checkout's
    upstream commit where it is one) and the patches before it as prerequisites. The files."""
    _require_checkout(checkout)
    dest = dest or source_patches.PATCH_DIR
    wanted = source_patches.PATCHES
    commits = git(checkout, "rev-list", "--reverse", f"-{len(wanted)}", "HEAD").stdout.split()
    if len(commits) != len(wanted):
        raise BuildError(f"{checkout}: HEAD has {len(commits)} commits, fewer than the series' {len(wanted)}")
    for i, (commit, p) in enumerate(zip(commits, wanted)):
        found = _trailer(checkout, commit, ID_TRAILER)
        if found != p.id:
            raise BuildError(
                f"{checkout}: commit {commit[:12]} (HEAD~{len(wanted) - 1 - i}) has {ID_TRAILER}: {found or 'none'}, "
                f"but patch {i + 1} of source_patches.PATCHES is {p.id}; the branch must end with the series in its order"
            )
    base = git(checkout, "rev-parse", f"{commits[0]}^").stdout.strip()
    upstream = _trailer(checkout, base, UPSTREAM_TRAILER)
    written = []
    for commit, p in zip(commits, wanted):
        # --zero-commit, --no-signature, --full-index: the bytes depend on the change and its
        # message only, not on the local hashes, git's version or the repository's size
        text = git(
            checkout, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--full-index",
            f"--base={base}", commit,
        ).stdout  # fmt: skip
        if upstream:
            text = text.replace(f"\nbase-commit: {base}\n", f"\nbase-commit: {upstream}\n")
        (dest / p.file).write_text(text)
        written.append(dest / p.file)
        log(f"wrote {dest / p.file}")
    return written


def upstream_commit(sdist: Path) -> str:
    """The full llama.cpp commit the sdist vendors: ``vendor/llama.cpp``'s gitlink in the tree of
    the llama-cpp-python commit whose git metadata the sdist carries."""
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == [".git"]]
        extract_data(tar, Path(tmp), members)
        gitdirs = sorted(Path(tmp).glob("*/.git"))
        proc = subprocess.run(
            ["git", f"--git-dir={gitdirs[0] if gitdirs else tmp}", "ls-tree", "HEAD", "vendor/llama.cpp"],
            capture_output=True,
            text=True,
        )
    fields = proc.stdout.split()
    if proc.returncode != 0 or fields[:2] != ["160000", "commit"] or not fields[2].startswith(COMMIT):
        raise BuildError(
            f"{sdist}: no vendor/llama.cpp gitlink to {COMMIT} in its git metadata ({proc.stdout.strip()})"
        )
    return fields[2]


def pinned_checkout(dest: Path, sdist: Path | None = None) -> Path:
    """``dest`` (new) made a git repository of the pinned sdist's ``vendor/llama.cpp``: one commit,
    its message naming the upstream commit (the sdist has no history, so not that commit itself)."""
    if dest.exists():
        raise BuildError(f"{dest}: exists; give a new folder for the pinned checkout")
    sdist = sdist or fetch_sdist(pinned_sdist(), log=lambda _m: None)
    upstream = upstream_commit(sdist)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        tree = _extract_llama_cpp(sdist, work)
        (tree / ".git").unlink()  # the submodule's pointer into llama-cpp-python's own .git
        git(tree, "init", "-q", "-b", "pinned")
        git(tree, "add", "-A", "-f")
        message = (
            f"llama.cpp {upstream} from {sdist.name}\n\n"
            "vendor/llama.cpp of the pinned sdist, which carries no history: the files of this\n"
            "upstream commit as the sdist ships them, in a commit of their own.\n\n"
            f"{UPSTREAM_TRAILER}: {upstream}\n"
        )
        git(tree, "commit", "-q", "-m", message)
        tree.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    """``scripts/rebase_patches.py CHECKOUT [--pinned] [--branch NAME] | CHECKOUT --export``."""
    import argparse

    parser = argparse.ArgumentParser(prog="rebase_patches.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a llama.cpp git checkout (with --pinned: a new folder)")
    parser.add_argument("--pinned", action="store_true", help="make CHECKOUT from the pinned sdist first")
    parser.add_argument("--branch", default=BRANCH, help=f"the branch the series is applied on (default {BRANCH})")
    parser.add_argument("--export", action="store_true", help="write CHECKOUT's series back to patches/")
    args = parser.parse_args(argv)
    try:
        if args.export:
            export_series(args.checkout)
            return 0
        if args.pinned:
            pinned_checkout(args.checkout)
        results = apply_series(args.checkout, args.branch)
    except GgufExactError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    failed = [p.file for p, why, _moved in results if why]
    moved = [p.file for p, why, off in results if off and not why]
    check = f"; {len(moved)} applied with a hunk off its place (above): check where it went" if moved else ""
    if failed:
        print(f"{len(failed)} of {len(results)} patches do not apply: {', '.join(failed)}{check}", file=sys.stderr)
        return 1
    print(f"all {len(results)} patches applied on branch {args.branch} of {args.checkout}{check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
