"""The pinned llama-cpp-python sdist both builds start from: its pin, fetch, sha256 check and unpacking.

The sdist vendors llama.cpp at :data:`COMMIT` in ``vendor/llama.cpp``; it is fetched with pip
from the package registry into ``<cache>/sdist``, checked against ``checksums/``, and
unpacked with the project's source patches (:mod:`.source_patches`) applied.
"""

import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gguf_exact.builds import source_patches
from gguf_exact.constants import cache_root
from gguf_exact.errors import BuildError, Param
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub import checksums

VENDORED_COMMITS = {"0.3.36": "0c1e57098"}
"""llama-cpp-python version -> the llama.cpp commit its sdist vendors."""


COMMIT = VENDORED_COMMITS["0.3.36"]


PACKAGE = "llama-cpp-python"


CHECKSUM_FILE = checksums.CHECKSUMS_DIR / checksums.LLAMA_CPP_PYTHON


Log = Callable[[str], None]


@dataclass(frozen=True)
class PinnedSdist:
    version: str
    sha256: str
    filename: str


def pinned_sdist(checksum_file: Path = CHECKSUM_FILE) -> PinnedSdist:
    """The sdist's version and sha256 from ``checksums/llama-cpp-python.sha256``."""
    if not checksum_file.is_file():
        raise BuildError(
            f"{checksum_file}: missing; it pins the llama-cpp-python sdist (sha256 and file name) that llama.cpp is built from"
        )
    if checksum_file.name == checksums.LLAMA_CPP_PYTHON:
        found = checksums.llama_cpp_python_sdist(checksum_file.parent)
    else:
        found = next(
            (
                (m.group(1), e.sha256, m.group(0))
                for e in checksums.read(checksum_file).entries
                if (m := re.fullmatch(r"llama_cpp_python-([0-9][0-9A-Za-z.]*)\.tar\.gz", e.path.rsplit("/", 1)[-1]))
            ),
            None,
        )
    if found is None:
        raise BuildError(
            f"{checksum_file}: no line '<sha256>  llama_cpp_python-<version>.tar.gz'; add the sdist's sha256 there"
        )
    version, sha, filename = found
    return PinnedSdist(version, sha, filename)


def fetch_sdist(pin: PinnedSdist, dest: Path | None = None, log: Log = print) -> Path:
    """The pinned sdist, verified: from ``dest`` if already there, else ``pip download``."""
    dest = dest or cache_root() / "sdist"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / pin.filename
    if not path.is_file():
        log(f"fetching {PACKAGE}=={pin.version} sdist with pip")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--dest",
            str(dest),
            f"{PACKAGE}=={pin.version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if not path.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BuildError(
                f"pip download {PACKAGE}=={pin.version} failed ({tail[0]}); check access to the package registry or pass ",
                Param("sdist"),
                " PATH",
            )
    return verify_sdist(path, pin)


def verify_sdist(path: Path, pin: PinnedSdist) -> Path:
    if not path.is_file():
        raise BuildError(f"{path}: sdist not found")
    digest = sha256_file(path)
    if digest != pin.sha256:
        raise BuildError(
            f"{path}: sha256 {digest} differs from {pin.sha256} pinned in {CHECKSUM_FILE.name}; delete the file and fetch it again"
        )
    return path


def extract_data(tar: tarfile.TarFile, dest: Path, members: list[tarfile.TarInfo]) -> None:
    """``extractall`` with the "data" filter's rules: plain files and folders inside
    ``dest`` only. Python has the filter from 3.10.12 and 3.11.4 on; on older patch
    releases the same rules are checked here first (the project supports all of 3.10)."""
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(dest, members=members, filter="data")
        except tarfile.FilterError as err:
            raise BuildError(f"{tar.name!s}: {err}") from None
        return
    root = dest.resolve()
    for m in members:
        target = (root / m.name).resolve()
        if not (m.isfile() or m.isdir()) or Path(m.name).is_absolute() or not target.is_relative_to(root):
            raise BuildError(f"{tar.name!s}: member {m.name!r} is not a plain file inside the archive's folder")
    tar.extractall(dest, members=members)


def _extract_llama_cpp(sdist: Path, dest: Path) -> Path:
    """Unpack only ``vendor/llama.cpp`` of the sdist under ``dest``; return it."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
        if not members:
            raise BuildError(f"{sdist}: no vendor/llama.cpp inside; is it the llama-cpp-python sdist?")
        extract_data(tar, dest, members)
    found = sorted(dest.glob("*/vendor/llama.cpp"))
    if not found or not (found[0] / "CMakeLists.txt").is_file():
        raise BuildError(f"{sdist}: vendor/llama.cpp has no CMakeLists.txt")
    return found[0]


def unpack_patched_sdist(sdist: Path, dest: Path, backend: str) -> Path:
    """The whole sdist unpacked under ``dest`` with ``backend``'s fixes applied to its
    ``vendor/llama.cpp`` (:mod:`.source_patches`): the folder pip builds the bindings from."""
    with tarfile.open(sdist) as tar:
        extract_data(tar, dest, tar.getmembers())
    roots = sorted(p.parent for p in dest.glob("*/pyproject.toml"))
    if len(roots) != 1 or not (roots[0] / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        raise BuildError(f"{sdist}: expected one package folder with vendor/llama.cpp inside")
    source_patches.apply_patches(roots[0] / "vendor" / "llama.cpp", backend, bindings=True)
    return roots[0]


__all__ = [
    "COMMIT",
    "PACKAGE",
    "CHECKSUM_FILE",
    "VENDORED_COMMITS",
    "Log",
    "PinnedSdist",
    "extract_data",
    "fetch_sdist",
    "pinned_sdist",
    "unpack_patched_sdist",
    "verify_sdist",
]
