"""Checks for every value from outside (a recipe, a checksum file, the Hub's answers)
before it becomes part of a path on disk.

Repository ids become ``MODELS_DIR/<owner>/<name>`` and a Hub cache folder, commits
become ``snapshots/<commit>``, hashes become ``blobs/<hash>``, file names become
``MODELS_DIR/<repo>/<file>`` and ``snapshots/<commit>/<file>``. A value that fails
here stops the command with one line naming where it came from; nothing is written.
Pure functions, no I/O.
"""

import re
from pathlib import PurePosixPath, PureWindowsPath

from gguf_exact.errors import ArgumentError, HubError, Param

COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit id (also a git blob id)
SHA256 = re.compile(r"[0-9a-f]{64}")
# owner/name as the Hub spells them, ASCII only; "--" and ".." are refused as the Hub
# refuses them ("--" would make two repos share one cache folder name).
_REPO_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
REPO_ID = re.compile(rf"{_REPO_PART}/{_REPO_PART}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_repo_id(repo: object, where: str) -> str:
    """``repo`` if it is ``owner/name`` of letters, digits, ``_``, ``.`` and ``-``."""
    if not isinstance(repo, str) or not REPO_ID.fullmatch(repo) or "--" in repo or ".." in repo:
        raise HubError(
            f'{where}: repo = {repo!r} is not a Hub repo id like "google/gemma-4-E2B-it" '
            "(owner/name of letters, digits, '_', '.', '-')"
        )
    return repo


def check_commit(commit: object, where: str) -> str:
    """``commit`` if it is a full git commit id: 40 lower-case hex digits."""
    if not isinstance(commit, str) or not COMMIT.fullmatch(commit):
        raise HubError(f"{where}: commit {str(commit)[:80]!r} is not a 40-hex commit id")
    return commit


def check_sha256(value: object, where: str) -> str:
    """``value`` if it is a sha256: 64 lower-case hex digits."""
    if not isinstance(value, str) or not SHA256.fullmatch(value):
        raise HubError(f"{where}: sha256 {str(value)[:80]!r} is not 64 lower-case hex digits")
    return value


def relative_path_problem(name: object) -> str | None:
    """Why ``name`` is not a safe path inside a repository, or None when it is.

    Safe: a non-empty string of ``/``-separated parts, none of them empty, ``.`` or
    ``..``; no backslash, no control character (a newline would also break the
    checksum file's lines), nothing that is absolute on POSIX or Windows (``/x``,
    ``C:x``, ``\\\\host``)."""
    if not isinstance(name, str) or not name:
        return "an empty name"
    if "\\" in name:
        return "a backslash"
    if _CONTROL.search(name):
        return "a control character"
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).drive or PureWindowsPath(name).root:
        return "an absolute path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' part"
    return None


def check_relative_path(name: object, where: str) -> str:
    """``name`` if :func:`relative_path_problem` finds nothing wrong with it."""
    problem = relative_path_problem(name)
    if problem:
        raise HubError(
            f"{where}: file name {str(name)[:120]!r} has {problem}; only relative paths inside the repository are used"
        )
    assert isinstance(name, str)  # relative_path_problem finds a problem with anything else
    return name


def check_revision(revision: object, where: str | Param) -> str:
    """``revision`` if it is a commit, or a branch or tag name that is safe as
    ``refs/<revision>`` in the Hub cache (``main``, ``v1.0``, ``refs/pr/1``)."""
    problem = relative_path_problem(revision) or (
        "a space" if isinstance(revision, str) and any(c.isspace() for c in revision) else None
    )
    if problem:
        raise ArgumentError(
            where,
            f': revision {str(revision)[:80]!r} has {problem}; use a branch, tag or commit, e.g. revision = "main"',
        )
    assert isinstance(revision, str)  # relative_path_problem finds a problem with anything else
    return revision
