"""What is pinned per file, and what a fetch would do: ``recipes`` and ``fetch --dry-run``.

:func:`file_pins` lists every file a recipe's parts name with its pinned commit, sha256
and size and whether it is in the models dir (no network, nothing hashed).
:func:`plan_fetch` says, per file of one part, whether it is in place and verified (size
first, then sha256), verified in the Hub cache, or to be downloaded, and then from which
commit and how big the Hub says it is (one HEAD per file; none with ``HF_HUB_OFFLINE``),
and why the fetch would fail where it would. Nothing is downloaded, moved or removed.
"""

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from gguf_exact.errors import GgufExactError
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub import checksums
from gguf_exact.hub.client import RemoteFile, cached_file, remote_file
from gguf_exact.hub.fetch import PinnedFile, check_role, part_dir, pinned_files, size_problem
from gguf_exact.hub.recipes import ROLES, Recipe, is_pattern
from gguf_exact.hub.session import HubConfig

IN_PLACE, IN_CACHE, TO_DOWNLOAD = "in place", "in the Hub cache", "to download"


@dataclass(frozen=True)
class FilePin:
    """What the checksum file pins for one file of a recipe part."""

    role: str
    path: str  # <repo>/<file>; <repo>/<pattern> when the pattern matches no pinned file
    revision: str
    commit: str | None
    sha256: str | None
    size: int | None
    present: bool  # a file is at MODELS_DIR/<path> (not checked here)

    @property
    def pinned(self) -> bool:
        """``fetch`` can get it: its sha256 is pinned."""
        return self.sha256 is not None


def file_pins(recipe: Recipe, models_dir: str | Path) -> list[FilePin]:
    """Per file of every part of ``recipe``: pinned commit, sha256, size, and presence."""
    pins = checksums.read(recipe.checksums)
    known = [e.path for e in pins.entries] + [p for p in pins.sizes if pins.sha256(p) is None]
    out = []
    for role in (r for r in ROLES if r in recipe.parts):
        part = recipe.part(role)
        repo_pin = pins.pins.get(part.repo)
        commit = repo_pin.commit if repo_pin else None
        revision = repo_pin.revision if repo_pin else part.revision
        in_repo = sorted(p[len(part.repo) + 1 :] for p in known if p.startswith(part.repo + "/"))
        for wanted in part.files:
            matched = [f for f in in_repo if f == wanted or (is_pattern(wanted) and fnmatchcase(f, wanted))]
            for name in matched or [wanted]:
                path = f"{part.repo}/{name}"
                present = bool(matched) and (Path(models_dir) / path).is_file()
                out.append(FilePin(role, path, revision, commit, pins.sha256(path), pins.size(path), present))
    return out


@dataclass(frozen=True)
class PlannedFile:
    """What ``fetch`` would do with one pinned file."""

    file: PinnedFile
    dest: Path
    state: str  # IN_PLACE, IN_CACHE or TO_DOWNLOAD
    there: str | None  # what is at ``dest`` now when fetch would replace it
    remote: RemoteFile | None  # the Hub's answer for a file to download
    problem: str | None  # why the fetch would stop, or None


def plan_fetch(recipe: Recipe, role: str, models_dir: str | Path, config: HubConfig | None = None) -> list[PlannedFile]:
    """What ``fetch_recipe(recipe, role, models_dir)`` would do, file by file, changing nothing."""
    check_role(recipe, role)
    config = config or HubConfig.from_env()
    root = part_dir(models_dir, recipe.part(role))
    files = pinned_files(recipe, role, checksums.read(recipe.checksums))
    return [_plan_file(pf, root / pf.filename, config) for pf in files]


def _plan_file(pf: PinnedFile, dest: Path, config: HubConfig) -> PlannedFile:
    there = None
    if dest.is_file():
        wrong_size = size_problem(dest.stat().st_size, pf.size)
        if wrong_size is None and sha256_file(dest) == pf.sha256:
            return PlannedFile(pf, dest, IN_PLACE, None, None, None)
        there = f"a file of {wrong_size}" if wrong_size else "a file with another sha256"
    cached = cached_file(pf.repo, pf.filename, pf.revision, config)
    # size first, then the hash; a corrupt blob is left for fetch to evict (a plan changes nothing)
    if cached is not None and size_problem(cached.stat().st_size, pf.size) is None and sha256_file(cached) == pf.sha256:
        return PlannedFile(pf, dest, IN_CACHE, there, None, None)
    if config.offline:
        problem: str | None = f"not in the Hub cache ({config.cache_dir}) and HF_HUB_OFFLINE is set"
        return PlannedFile(pf, dest, TO_DOWNLOAD, there, None, problem)
    try:
        remote = remote_file(pf.repo, pf.filename, pf.revision, config)
    except GgufExactError as err:
        return PlannedFile(pf, dest, TO_DOWNLOAD, there, None, str(err))
    problem = None
    if remote.size is not None and size_problem(remote.size, pf.size):
        problem = f"the Hub's file at commit {remote.commit} is {size_problem(remote.size, pf.size)}"
    elif remote.lfs and remote.etag != pf.sha256:
        problem = f"the Hub's file at commit {remote.commit} has sha256 {remote.etag}, the pin says {pf.sha256}"
    return PlannedFile(pf, dest, TO_DOWNLOAD, there, remote, problem)
