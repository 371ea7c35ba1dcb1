"""``gguf-exact fetch``: the files a recipe names, from the revision its checksum file
pins, each checked against its size and then its sha256 (a wrong size needs no hash to be
refused) before it is placed at its final path; :func:`gguf_exact.hub.plan.plan_fetch`
says what a fetch would do (``fetch --dry-run``) without downloading.

Final paths are ``MODELS_DIR/<repo>/<file>``, the paths the checksum file lists, so
``cd MODELS_DIR && sha256sum -c --ignore-missing ../checksums/<recipe>.sha256`` checks
them again. A file already there with the pinned sha256 is kept; one with another
sha256 is replaced once the pinned one is verified beside it (and said: changed here?). The
bytes come from the Hub cache when they are there (and always with ``HF_HUB_OFFLINE=1``),
otherwise from the Hub (see :mod:`.client` for the cache and how downloads resume).

A placed file is a reflink of the cache's blob where the file system has them (btrfs, XFS:
no extra disk until either is written) and otherwise a copy, never a hard link: a hard link
is the cache's blob itself, so editing ``models/<repo>/<file>`` would change the cache too.
A cached blob whose bytes changed after it was verified is said to have changed here,
removed from the cache and downloaded again, never blamed on the download.
"""

import hashlib
import os

try:
    import fcntl
except ImportError:  # not a POSIX system: no reflinks, files are copied
    fcntl = None  # type: ignore[assignment]  # the module or None, as its users check
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from gguf_exact.errors import GgufExactError, HubError
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.formats.paths import check_not_input, one_command, reads
from gguf_exact.formats.safe_write import atomic_output, output_folder
from gguf_exact.hub import checksums
from gguf_exact.hub.client import cached_file, cached_sha256, download, evict
from gguf_exact.hub.names import SHA256, check_relative_path, check_revision
from gguf_exact.hub.recipes import ROLES, Recipe, RepoPart, is_pattern
from gguf_exact.hub.session import HubConfig


@dataclass(frozen=True)
class PinnedFile:
    """One file to fetch: where it is on the Hub and the size and sha256 it must have."""

    repo: str
    filename: str
    sha256: str
    revision: str  # the pinned commit when known, else the pinned revision
    commit: str | None
    size: int | None = None  # bytes, where the checksum file records it

    @property
    def path(self) -> str:
        """Its path in the checksum file and under the models dir."""
        return f"{self.repo}/{self.filename}"

    @property
    def pinned(self) -> str:
        """What is pinned, in words: ``sha256 and commit 675cff42a74c pinned``, or ``sha256
        pinned, commit not pinned (from main)``: then it comes from the recipe's revision."""
        if self.commit:
            return f"sha256 and commit {self.commit[:12]} pinned"
        return f"sha256 pinned, commit not pinned (from {self.revision})"


def size_problem(actual: int, pinned: int | None) -> str | None:
    """Why a file of ``actual`` bytes is not the pinned one, or None (also when no size is pinned)."""
    if pinned is None or actual == pinned:
        return None
    return f"{actual:,} bytes, the pin says {pinned:,}"


@dataclass(frozen=True)
class Fetched:
    file: PinnedFile
    path: Path
    how: str  # "in place", "from cache", "downloaded" or "resumed"; then, in brackets, what had changed here
    size: int
    commit: str | None  # the commit it came from, when known


def pinned_files(recipe: Recipe, role: str, pins: checksums.Checksums) -> list[PinnedFile]:
    """The files of a recipe part with their pinned sha256 and revision (no I/O).

    Every name in the part's ``files`` must have a line in the checksum file, and every
    pattern must match at least one."""
    part = recipe.part(role)
    pin = pins.pins.get(part.repo)
    revision = pin.commit if pin and pin.commit else (pin.revision if pin else part.revision)
    check_revision(revision, f"{recipe.checksums}: {part.repo}")
    entries = {
        check_relative_path(e.path[len(part.repo) + 1 :], f"{recipe.checksums}: {e.path}"): e.sha256
        for e in pins.repo_entries(part.repo)
    }
    chosen: dict[str, str] = {}
    for wanted in part.files:
        matched = [f for f in entries if f == wanted or (is_pattern(wanted) and fnmatchcase(f, wanted))]
        if not matched:
            raise HubError(
                f"{recipe.checksums}: no sha256 pinned for {part.repo}/{wanted}; "
                f"run `gguf-exact pin {recipe.name} --what {role}` to record it from the Hub"
            )
        chosen |= {f: entries[f] for f in matched}
    commit = pin.commit if pin else None
    return [
        PinnedFile(part.repo, f, sha, revision, commit, pins.size(f"{part.repo}/{f}"))
        for f, sha in sorted(chosen.items())
    ]


def pin_state(recipe: Recipe, role: str) -> str:
    """One phrase: whether ``fetch RECIPE --what ROLE`` can run (every file has a pinned
    sha256), and if not what to run first."""
    try:
        files = pinned_files(recipe, role, checksums.read(recipe.checksums))
    except GgufExactError:
        return f"not pinned: `gguf-exact pin {recipe.name} --what {role}` first"
    return f"{files[0].pinned}, {len(files)} file{'s' if len(files) != 1 else ''}"


def part_dir(models_dir: str | Path, part: RepoPart) -> Path:
    """Where a part's files are placed: ``MODELS_DIR/<repo>``."""
    return Path(models_dir) / part.repo


def fetch_file(pf: PinnedFile, dest: Path, config: HubConfig, progress: bool = True) -> Fetched:
    """Place ``pf`` at ``dest``, verified; nothing is left at ``dest`` on failure."""
    changed = []  # what was found changed on this machine, said in ``how``
    if dest.is_file():
        problem = difference(pf, dest)
        if problem is None:
            return Fetched(pf, dest, "in place", dest.stat().st_size, pf.commit)
        # another file there is replaced only once the pinned one is verified beside it
        changed.append(f"{dest} was not the pinned file ({problem}): edited? replaced by the pinned file")
    cached = cached_file(pf.repo, pf.filename, pf.revision, config)
    evicted = cache_state(pf, cached, config) if cached is not None else ""
    if evicted is None and cached is not None:  # None: the cached file is the pinned one
        _place(cached, dest, pf.sha256)
        return Fetched(pf, dest, _how("from cache", changed), dest.stat().st_size, pf.commit)
    if config.offline:
        raise HubError(
            f"{pf.path}: {evicted + '; so it is ' if evicted else ''}not in the Hub cache ({config.cache_dir}) and "
            "HF_HUB_OFFLINE is set; run the same command without HF_HUB_OFFLINE=1 to download it"
        )
    if evicted:
        changed.append(evicted)
    got = download(pf.repo, pf.filename, pf.revision, config, pf.sha256, progress, pf.size)
    _place(got.path, dest, pf.sha256)
    how = "resumed" if got.resumed_from else ("downloaded" if got.transferred else "from cache")
    return Fetched(pf, dest, _how(how, changed), got.size, got.commit)


def _how(how: str, changed: list[str]) -> str:
    return f"{how} ({'; '.join(changed)})" if changed else how


def difference(pf: PinnedFile, path: Path) -> str | None:
    """How ``path`` differs from the pinned file, or None when it is the pinned file: its size
    first (no hash of a file of another size), then its sha256."""
    size = path.stat().st_size
    problem = size_problem(size, pf.size)
    if problem is not None:
        return problem
    digest = sha256_file(path)
    return None if digest == pf.sha256 else f"sha256 {digest}, the pin says {pf.sha256}"


def in_place(pf: PinnedFile, path: Path) -> bool:
    """``path`` holds the pinned file: its size first (no hash of a file of another size), then its sha256."""
    return difference(pf, path) is None


def cache_state(pf: PinnedFile, cached: Path, config: HubConfig) -> str | None:
    """None when the Hub cache's copy is the pinned file. A blob whose bytes are not those it
    is named after (its sha256) was changed after it was verified and named: removed from the
    cache (:func:`~.client.evict`) and that is returned, in words, naming it. ``""``: another
    file, left to the download's checks (the Hub's file at that commit is not the pin)."""
    blob = Path(os.path.realpath(cached))
    size = cached.stat().st_size
    problem = size_problem(size, pf.size)
    if problem is not None and blob.name == pf.sha256:
        evict(cached, pf.repo, config)  # named after the pinned sha256, yet of another size
    elif problem is not None and SHA256.fullmatch(blob.name):
        return ""  # another LFS file: not hashed, its size says enough
    else:
        digest = cached_sha256(cached, pf.repo, config)  # evicted when its bytes are not its name
        if digest is not None:
            return None if digest == pf.sha256 and problem is None else ""
        problem = "bytes that are not those it is named after"
    return (
        f"the Hub cache's copy {blob} had {problem}: changed on this machine after it was verified "
        "(edited through a hard link? a disk error?); removed from the cache"
    )


@one_command()
def fetch_recipe(
    recipe: Recipe, role: str, models_dir: str | Path, config: HubConfig | None = None, progress: bool = True
) -> list[Fetched]:
    """Fetch every file of one part (``exact``, ``source`` or ``target``) of ``recipe``."""
    check_role(recipe, role)
    config = config or HubConfig.from_env()
    reads(recipe.path, "recipe")
    reads(recipe.checksums, "checksum file")
    files = pinned_files(recipe, role, checksums.read(recipe.checksums))
    root = part_dir(models_dir, recipe.part(role))
    for pf in files:  # every destination checked before any download
        check_not_input(root / pf.filename)
    return [fetch_file(pf, root / pf.filename, config, progress) for pf in files]


def check_role(recipe: Recipe, role: str) -> None:
    """Stop with what to fetch instead when ``recipe`` has no ``role`` part."""
    if role not in recipe.parts:
        have = [r for r in ROLES if r in recipe.parts]
        raise HubError(
            f"recipe {recipe.name} has no {role} section ({recipe.path}), so there is no {role} file to fetch; "
            f"it has {', '.join(have)}: `gguf-exact fetch {recipe.name} --what {have[0]}`"
        )


# <linux/fs.h>: _IOW(0x94, 9, int). Python 3.12 names it fcntl.FICLONE; 3.11 does not, and no
# maintained library is worth a dependency for one ioctl.
FICLONE = getattr(fcntl, "FICLONE", 0x40049409)


def reflink(src_fd: int, dest_fd: int) -> bool:
    """Make ``dest_fd``'s file share ``src_fd``'s blocks (copy on write); False where the file
    system cannot (ext4, tmpfs, another file system: EOPNOTSUPP, EXDEV, EINVAL, ENOTTY)."""
    if fcntl is None:
        return False
    try:
        fcntl.ioctl(dest_fd, FICLONE, src_fd)
    except OSError:
        return False
    return True


def _place(src: Path, dest: Path, sha256: str) -> None:
    """``src`` (a verified cache blob) at ``dest``, atomically: a reflink where the file system
    has them, else a copy hashed as it is written. Never a hard link, which would make
    ``dest`` the cache's blob itself (an edit of one is an edit of both). The cost: where there
    are no reflinks (ext4) each placed file takes its size again on disk beside the cache's
    copy; ``hf cache delete`` frees the cache's, and a later fetch verifies the placed file in place."""
    output_folder(dest.parent)
    src = src.resolve()
    with atomic_output(dest) as tmp:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            if reflink(fin.fileno(), fout.fileno()):
                return
            digest = hashlib.sha256()
            for chunk in iter(lambda: fin.read(1 << 20), b""):
                digest.update(chunk)
                fout.write(chunk)
        if digest.hexdigest() != sha256:
            raise HubError(
                f"{dest}: the copy from {src} has sha256 {digest.hexdigest()}, expected {sha256}; nothing placed"
            )
