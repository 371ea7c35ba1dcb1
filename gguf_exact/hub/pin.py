"""``gguf-exact pin``: resolve a recipe's revisions to commits and record every file's
size and sha256 in its checksum file, from the Hub's file metadata, without downloading.

LFS files (weights, GGUFs) carry their sha256 in the Hub's metadata. Small files kept in
git (``config.json``) have only a git id there: those are read (a few KB, through the Hub
cache), checked against that id, its size and the git id the Hub's HEAD gives, and
hashed; one that does not match is removed from the cache and nothing is written.
Every name, commit and hash in the Hub's listing is checked (:mod:`.names`) before use.
"""

import hashlib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from gguf_exact.errors import ArgumentError, HubError, Param
from gguf_exact.formats.paths import check_not_input, one_command, reads
from gguf_exact.formats.safe_write import output_folder
from gguf_exact.hub import checksums
from gguf_exact.hub.checksums import Entry, RepoPin
from gguf_exact.hub.client import RepoListing, read_small_file, repo_listing
from gguf_exact.hub.names import check_revision
from gguf_exact.hub.recipes import ROLES, Recipe, RepoPart, is_pattern
from gguf_exact.hub.session import HubConfig

SMALL_FILE = 64 << 20  # a non-LFS file larger than this is not read to hash it


@dataclass(frozen=True)
class PinnedEntry:
    path: str  # <repo>/<file>
    sha256: str
    size: int | None
    how: str  # "hub metadata" or "read and hashed"
    previous: str | None  # the sha256 pinned before, or None if there was none


@dataclass(frozen=True)
class PartPin:
    role: str
    pin: RepoPin
    entries: list[PinnedEntry]


@dataclass
class PinReport:
    checksums: Path
    parts: list[PartPin]

    @property
    def changed(self) -> list[PinnedEntry]:
        """Entries whose sha256 differs from what was pinned before."""
        return [e for p in self.parts for e in p.entries if e.previous is not None and e.previous != e.sha256]


@one_command()
def pin_recipe(
    recipe: Recipe, roles: list[str] | None = None, revision: str | None = None, config: HubConfig | None = None
) -> PinReport:
    """Pin the parts ``roles`` (default: all the recipe has) at their recipe revision, or
    at ``revision`` (one part only), and rewrite the recipe's checksum file."""
    config = config or HubConfig.from_env()
    reads(recipe.path, "recipe")  # its checksum file is the output, rewritten in place by design
    check_not_input(recipe.pin_destination)
    if roles is None:
        roles = [r for r in ROLES if r in recipe.parts]
    parts = [recipe.part(r) for r in roles]
    if revision is not None:
        check_revision(revision, Param("revision"))
    if revision is not None and len(parts) != 1:
        raise ArgumentError(
            Param("revision"),
            f" {revision}: each part has its own revision; name one with ",
            Param("roles"),
            f" {'|'.join(r for r in ROLES if r in recipe.parts)}",
        )
    current = checksums.read(recipe.checksums)
    updated = current if current.header else checksums.Checksums(default_header(recipe), current.pins, current.entries)
    dest = recipe.pin_destination  # the recipe's own file, or the user's copy where that is read-only
    report = PinReport(dest, [])
    for part in parts:
        listing = repo_listing(part.repo, revision or part.revision, config)
        entries = [pin_entry(part, listing, name, current, config) for name in select(part, listing)]
        pin = RepoPin(part.repo, revision or part.revision, listing.commit)
        earlier = [p for p in report.parts if p.pin.repo == part.repo]
        if earlier and earlier[0].pin.commit != pin.commit:
            raise HubError(
                f"{recipe.path}: the {earlier[0].role} and {part.role} sections use {part.repo} at different revisions; use one"
            )
        merged = [e for p in earlier for e in p.entries] + entries
        sizes = {e.path: e.size for e in merged if e.size is not None}
        updated = updated.with_repo(pin, [Entry(e.sha256, e.path) for e in merged], sizes)
        report.parts.append(PartPin(part.role, pin, entries))
    output_folder(dest.parent)
    checksums.write(dest, updated)
    return report


def select(part: RepoPart, listing: RepoListing) -> list[str]:
    """The repository's files that the part names; every name and pattern must match."""
    chosen: list[str] = []
    for wanted in part.files:
        matched = sorted(f for f in listing.files if f == wanted or (is_pattern(wanted) and fnmatchcase(f, wanted)))
        if not matched:
            have = ", ".join(sorted(listing.files)[:12]) or "no files"
            raise HubError(
                f"{part.repo}@{listing.commit}: no file matches {wanted!r} (the repo has: {have}); fix the files of the recipe's {part.role} section"
            )
        chosen += [f for f in matched if f not in chosen]
    return chosen


def pin_entry(
    part: RepoPart, listing: RepoListing, name: str, current: checksums.Checksums, config: HubConfig
) -> PinnedEntry:
    entry = listing.files[name]
    path = f"{part.repo}/{name}"
    if entry.sha256:
        sha, how = entry.sha256.lower(), "hub metadata"
    elif entry.size is not None and entry.size > SMALL_FILE:
        raise HubError(
            f"{path}: {entry.size:,} bytes in git without LFS metadata, so the Hub reports no sha256 for it; pin it by hand"
        )
    elif entry.blob_id is None:
        raise HubError(
            f"{path}: the Hub's listing at {listing.commit} gives neither a sha256 nor a git id for it; "
            "nothing to check a download against: pin it by hand"
        )
    else:
        data = read_small_file(part.repo, name, listing.commit, config, entry.blob_id)
        if entry.size is not None and len(data) != entry.size:
            raise HubError(
                f"{path}: {len(data):,} bytes read, the Hub's listing at {listing.commit} says {entry.size:,}; check HF_ENDPOINT"
            )
        sha, how = hashlib.sha256(data).hexdigest(), "read and hashed"
    return PinnedEntry(path, sha, entry.size, how, current.sha256(path))


def default_header(recipe: Recipe) -> list[str]:
    return [
        f"# Pinned files of recipe {recipe.name} (convert/{recipe.path.name}): per file its size and sha256, per",
        "# repository the commit its revision resolved to (commit=unknown: sha256 pinned, commit not pinned).",
        f"# `gguf-exact pin {recipe.name}` rewrites it from the Hub's metadata. Check from the models dir:",
        f"#   cd models && sha256sum -c --ignore-missing ../checksums/{recipe.checksums.name}",
    ]
