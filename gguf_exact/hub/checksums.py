"""Checksum files (``checksums/*.sha256``): the single source of truth for pinned files.

Each file is in ``sha256sum`` format, so ``sha256sum -c`` checks it as it is: a line
``<sha256>  <path>`` per file, ``#`` lines are comments to sha256sum. For a recipe the
paths are ``<repo>/<file>``, relative to the models dir that ``gguf-exact fetch`` fills,
and a comment line per repository records the commit its files were pinned at::

    # pin google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant revision=main commit=ebc7e1a2...
    # size 2356  google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant/config.json
    <sha256>  google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant/config.json

``commit=unknown`` means the files are pinned by sha256 only (the revision they came
from was not recorded). A ``# size <bytes>  <path>`` line gives a file's size in bytes,
checked before its sha256 (a wrong size needs no multi-GB hash to be refused); a size
may be known where the sha256 is not, and then the file is not pinned yet. Other files (e.g. ``llama-cpp-python.sha256``) are plain
sha256sum lines, looked up by name with :func:`expected_sha256`.

:func:`parse` and :func:`render` are pure; :func:`read`, :func:`write` and the lookups
touch the disk.
"""

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from gguf_exact.constants import CHECKSUMS_ENV
from gguf_exact.errors import HubError
from gguf_exact.formats.safe_write import write_text
from gguf_exact.hub.names import COMMIT
from gguf_exact.resources import shipped_dir, user_dir

CHECKSUMS_DIR = shipped_dir("checksums")  # the project's checksums/ (a wheel carries a copy)
LLAMA_CPP_PYTHON = "llama-cpp-python.sha256"  # the sdist pin that the llama.cpp build reads

_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](\S.*)")
_PIN = re.compile(r"#\s*pin\s+(\S+)\s+revision=(\S+)\s+commit=(\S+)\s*")
_SIZE = re.compile(r"#\s*size\s+([0-9]+)\s+(\S.*)")
_SDIST = re.compile(r"llama_cpp_python-([0-9][0-9A-Za-z.]*)\.tar\.gz")


@dataclass(frozen=True)
class Entry:
    """One pinned file: its sha256 and its path (``<repo>/<file>`` for recipe files)."""

    sha256: str
    path: str


@dataclass(frozen=True)
class RepoPin:
    """The revision a repository's files were pinned at, and the commit it resolved to."""

    repo: str
    revision: str
    commit: str | None  # None: not known (the files are pinned by sha256 only)


@dataclass
class Checksums:
    """A parsed checksum file."""

    header: list[str] = field(default_factory=list)  # leading comment lines, kept on rewrite
    pins: dict[str, RepoPin] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)  # path -> bytes, where known

    def size(self, path: str) -> int | None:
        """The pinned size of ``path`` in bytes, or None."""
        return self.sizes.get(path)

    def sha256(self, path: str) -> str | None:
        """The pinned sha256 of ``path``, or None."""
        return next((e.sha256 for e in self.entries if e.path == path), None)

    def repo_entries(self, repo: str) -> list[Entry]:
        """Entries of files in ``repo`` (paths under ``repo/``)."""
        return [e for e in self.entries if e.path.startswith(repo + "/")]

    def with_repo(self, pin: RepoPin, entries: list[Entry], new_sizes: dict[str, int] | None = None) -> "Checksums":
        """A copy in which ``pin.repo``'s pin line, entries and sizes are replaced."""
        kept = [e for e in self.entries if not e.path.startswith(pin.repo + "/")]
        sizes = {p: n for p, n in self.sizes.items() if not p.startswith(pin.repo + "/")}
        sizes |= new_sizes or {}
        return replace(self, pins={**self.pins, pin.repo: pin}, entries=kept + list(entries), sizes=sizes)


def parse(text: str, where: str = "checksums") -> Checksums:
    """Parse sha256sum text with ``# pin`` lines; a line that is neither stops with its number."""
    cs = Checksums()
    seen_content = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            pin = _PIN.fullmatch(line)
            if pin:
                repo, revision, commit = pin.groups()
                if commit != "unknown" and not COMMIT.fullmatch(commit):
                    raise HubError(f"{where}:{number}: commit {commit!r} is not a 40-hex commit id or 'unknown'")
                cs.pins[repo] = RepoPin(repo, revision, None if commit == "unknown" else commit)
                seen_content = True
            elif sized := _SIZE.fullmatch(line):
                size, path = sized.groups()
                cs.sizes[path] = int(size)
                seen_content = True
            elif not seen_content:
                cs.header.append(line)
            continue
        m = _LINE.fullmatch(line)
        if not m:
            raise HubError(f"{where}:{number}: not a sha256sum line ('<sha256>  <path>'): {line[:60]!r}")
        cs.entries.append(Entry(m.group(1).lower(), m.group(2)))
        seen_content = True
    return cs


def render(cs: Checksums) -> str:
    """sha256sum text: header, then per pinned repo its pin line and, per file, its size
    and sha256 lines; then the rest."""
    lines = list(cs.header)
    placed: set[str] = set()
    shas = {e.path: e.sha256 for e in cs.entries}

    def file_lines(path: str) -> list[str]:
        placed.add(path)
        size = [f"# size {cs.sizes[path]}  {path}"] if path in cs.sizes else []
        return size + ([f"{shas[path]}  {path}"] if path in shas else [])

    for repo, pin in cs.pins.items():
        lines.append(f"# pin {repo} revision={pin.revision} commit={pin.commit or 'unknown'}")
        for path in sorted({p for p in (*shas, *cs.sizes) if p.startswith(repo + "/")}):
            lines += file_lines(path)
    for path in [*shas, *cs.sizes]:
        if path not in placed:
            lines += file_lines(path)
    return "\n".join(lines) + "\n"


def read(path: str | Path) -> Checksums:
    """The checksum file at ``path``; an empty one when it does not exist yet."""
    path = Path(path)
    if not path.exists():
        return Checksums()
    return parse(path.read_text(), str(path))


def write(path: str | Path, cs: Checksums) -> None:
    """Write ``cs`` to ``path`` atomically (temp file beside it, then rename)."""
    write_text(path, render(cs))


def user_checksums_dir() -> Path:
    """Where ``gguf-exact pin`` writes when the project's checksum files are read-only
    (an installed package): ``$GGUF_EXACT_CHECKSUMS``, else ``~/.config/gguf-exact/checksums``."""
    return user_dir("checksums", CHECKSUMS_ENV)


def checksum_files(directory: str | Path | None = None) -> list[Path]:
    """The ``*.sha256`` files of ``directory``; by default the project's, each replaced by
    the user's copy of the same name where there is one, then the user's others."""
    if directory is not None:
        return sorted(Path(directory).glob("*.sha256"))
    user = user_checksums_dir()
    files = {p.name: p for p in sorted(CHECKSUMS_DIR.glob("*.sha256"))}
    if user.is_dir():
        files |= {p.name: p for p in sorted(user.glob("*.sha256"))}
    return [files[n] for n in sorted(files)]


def expected_sha256(name: str, directory: str | Path = CHECKSUMS_DIR) -> str:
    """The pinned sha256 of a file, by its path in a checksum file or its base name.

    Searches every ``*.sha256`` file in ``directory`` (the project's ``checksums/``), e.g.
    ``expected_sha256("llama_cpp_python-0.3.36.tar.gz")``.
    """
    directory = Path(directory)
    found: dict[str, list[str]] = {}
    for file in sorted(directory.glob("*.sha256")):
        for e in read(file).entries:
            if e.path == name or e.path.rsplit("/", 1)[-1] == name:
                found.setdefault(e.sha256, []).append(f"{file.name}: {e.path}")
    if not found:
        raise HubError(f"{name}: no sha256 pinned for it in {directory}/*.sha256; add a '<sha256>  {name}' line")
    if len(found) > 1:
        where = "; ".join(f"{sha[:12]}... in {', '.join(places)}" for sha, places in found.items())
        raise HubError(f"{name}: pinned with different sha256 in {directory}: {where}; name the file by its full path")
    return next(iter(found))


def llama_cpp_python_sdist(directory: str | Path = CHECKSUMS_DIR) -> tuple[str, str, str] | None:
    """``(version, sha256, file name)`` of the pinned llama-cpp-python sdist, or None if
    ``checksums/llama-cpp-python.sha256`` has no such line."""
    path = Path(directory) / LLAMA_CPP_PYTHON
    for e in read(path).entries:
        m = _SDIST.fullmatch(e.path.rsplit("/", 1)[-1])
        if m:
            return m.group(1), e.sha256, m.group(0)
    return None
