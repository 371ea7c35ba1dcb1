"""The packer's kernels compiled ahead of time: this machine's cache entry, and loading it without numba.

:mod:`.aot_kernels_build` compiles the kernels' own source (:mod:`gguf_exact.core.kernels`)
into an extension module under ``<cache>/kernels/<key>/`` beside a ``build-info.json``. The
key names what the extension depends on, as the other builds' keys do: the digest of the
kernels' source (and of the build module, which sets how it is compiled), numba's version
(the compiler), the Python ABI and numpy's version (what it links against), and this CPU's
features (:func:`.cpu_features.host_cpu`, as the llama.cpp builds name them).

:func:`load_cached` is the provider the package registers with
:func:`gguf_exact.core.kernels.set_provider`: it takes the entry only when its
``build-info.json`` holds this key and the extension's sha256, so a stale entry (another
key) or a damaged one (a truncated ``.so``) is never imported: it is passed over and the
numba JIT kernels are used, as by a user who never built them (``doctor`` says which, and
why). ``GGUF_EXACT_KERNELS=jit`` passes over a good entry too.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from gguf_exact import constants
from gguf_exact.builds.cpu_features import host_cpu
from gguf_exact.core import kernels

MODULE = "gguf_exact_kernels"
INFO_FILE = "build-info.json"  # the name every build's record has (build_probe.INFO_FILE)
BUILD_MODULE = Path(__file__).with_name("aot_kernels_build.py")


@dataclass(frozen=True)
class KernelKey:
    """What a compiled kernel module was built from and for."""

    source: str  # sha256 of the kernels' source files and of the build module
    numba: str
    python: str  # the extension suffix: interpreter and ABI (".cpython-311-x86_64-linux-gnu.so")
    numpy: str
    cpu: str  # the CPU features' tag, as the llama.cpp builds' keys have it

    @property
    def name(self) -> str:
        abi = self.python.strip(".").removesuffix(".so").replace(".", "-")
        return f"{self.source[:12]}-numba{self.numba}-{abi}-numpy{self.numpy}-cpu-{self.cpu}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def numba_version() -> str | None:
    """numba's version from its ``.dist-info`` folder beside the package, without importing
    it; ``importlib.metadata`` would be the library's way, but importing it took 0.05-0.09 s
    here, a tenth of what this cache saves. None when numba is not installed that way."""
    spec = importlib.util.find_spec("numba")
    if spec is None or not spec.submodule_search_locations:
        return None
    site = Path(next(iter(spec.submodule_search_locations))).parent
    with os.scandir(site) as entries:
        found = [e.name for e in entries if e.name.startswith("numba-") and e.name.endswith(".dist-info")]
    return found[0][len("numba-") : -len(".dist-info")] if len(found) == 1 else None


def source_digest() -> str:
    """sha256 of the kernels' source modules (:data:`gguf_exact.core.kernels.SOURCE_MODULES`)
    and of the build module, in that order."""
    core = Path(kernels.__file__).parent
    digest = hashlib.sha256()
    for path in [*(core / f"{m}.py" for m in kernels.SOURCE_MODULES), BUILD_MODULE]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key() -> KernelKey | None:
    """This machine's key; None without a numba installed as a distribution."""
    numba = numba_version()
    if numba is None:
        return None
    python = importlib.machinery.EXTENSION_SUFFIXES[0]
    return KernelKey(source_digest(), numba, python, np.__version__, host_cpu().tag)


def entry_dir(key: KernelKey) -> Path:
    return constants.cache_root() / "kernels" / key.name


def extension_path(folder: Path, key: KernelKey) -> Path:
    return folder / (MODULE + key.python)


def extension_sha256(path: Path) -> str:
    """The extension's sha256 (under a megabyte, read whole; not ``formats.gguf_file.sha256_file``,
    whose module loads gguf-py, 0.07 s, before anything that needs it)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Entry:
    """This machine's cache entry: ``path`` (the extension) when usable, else why not."""

    path: Path | None
    why_not: str = ""
    info: dict | None = None


def find_entry(key: KernelKey | None = None) -> Entry:
    """The cache entry for ``key`` (default: this machine's), checked against its
    ``build-info.json``: the key it records and the extension's size and sha256."""
    key = key or cache_key()
    if key is None:
        return Entry(None, "numba's version is unknown (no numba-*.dist-info beside it)")
    folder = entry_dir(key)
    try:
        info = json.loads((folder / INFO_FILE).read_text())
    except FileNotFoundError:
        return Entry(None, f"not built for this machine ({folder.name}): make setup, or gguf-exact build-kernels")
    except (OSError, ValueError) as e:
        return Entry(None, f"{folder / INFO_FILE}: unreadable ({e})")
    recorded = info.get("key") if isinstance(info, dict) else None
    if recorded != key.as_dict():
        return Entry(None, f"{folder / INFO_FILE}: built for another key", info)
    path = extension_path(folder, key)
    try:
        same = path.stat().st_size == info.get("bytes") and extension_sha256(path) == info.get("sha256")
    except OSError:
        same = False
    if not same:
        return Entry(None, f"{path}: not the extension its build-info.json records (changed or truncated)", info)
    return Entry(path, info=info)


def import_extension(path: Path) -> ModuleType:
    """The compiled kernels at ``path``, imported under :data:`MODULE` (not added to ``sys.modules``)."""
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_loader(MODULE, loader, origin=str(path))
    assert spec is not None  # a spec from a given loader is always made
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load_cached() -> ModuleType | None:
    """The provider of :mod:`gguf_exact.core.kernels`: this machine's compiled kernels, or
    None (JIT) when ``GGUF_EXACT_KERNELS=jit`` or the entry is missing, stale or damaged."""
    if constants.kernels_choice() == "jit":
        return None
    entry = find_entry()
    if entry.path is None:
        return None
    try:
        module = import_extension(entry.path)
    except (ImportError, OSError):
        return None
    return module if all(hasattr(module, name) for name in kernels.EXPORTS) else None


def describe() -> tuple[bool, str]:
    """For ``doctor``: (compiled kernels in use, what and why)."""
    if constants.kernels_choice() == "jit":
        return False, f"numba JIT ({constants.KERNELS_ENV}=jit)"
    entry = find_entry()
    if entry.path is None:
        return False, f"numba JIT; no compiled kernels: {entry.why_not}"
    seconds = (entry.info or {}).get("build_seconds")
    return True, f"compiled ahead of time, {entry.path} (built in {seconds} s; numba not loaded)"
