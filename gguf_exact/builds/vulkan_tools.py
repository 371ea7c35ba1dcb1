"""What a Vulkan build of llama.cpp compiles with: glslc, and Vulkan headers new enough for
the pinned backend, fetched once where the system's are too old.

The pinned ``ggml-vulkan`` uses ``VK_EXT_layer_settings`` without a guard; Debian 12's
headers (1.3.239) lack it. :func:`require_vulkan_tools` looks as CMake's FindVulkan does
(``$VULKAN_SDK``, else the system's ``/usr/include``); where the system's are too old and no
SDK is named, it takes the headers of Debian 13's ``libvulkan-dev`` 1.4.309: the ``.deb``
pinned (URL, size, sha256) in ``checksums/vulkan-headers.sha256``, fetched once, unpacked
with Debian's own ``dpkg-deb`` (it checks the archive's structure) into
``<cache>/vulkan-headers/<deb version>/include``. Headers only: the build links the
system's loader (``libvulkan.so.1``), which looks up every entry point at run time.

The system packages (glslc, spirv-headers, libvulkan-dev, and for running on Mesa's
lavapipe mesa-vulkan-drivers and vulkan-tools) are ``scripts/install-vulkan-deps.sh``'s.
:func:`parse_vulkan_header_version` and :func:`parse_headers_pin` are pure.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.builds.gpu_toolchains import _output
from gguf_exact.constants import cache_root
from gguf_exact.errors import BuildError, Param
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub import checksums

VULKAN_NEEDS = "VK_EXT_layer_settings"
"""An extension the pinned llama.cpp's Vulkan backend uses without a guard
(``vk::LayerSettingEXT``): headers without it (Debian 12's 1.3.239) fail to compile."""
HEADERS_CHECKSUMS = checksums.CHECKSUMS_DIR / "vulkan-headers.sha256"
"""The libvulkan-dev .deb whose headers a Vulkan build takes where the system's are too old."""
SYSTEM_INCLUDE = Path("/usr/include")
INSTALL_DEPS = "scripts/install-vulkan-deps.sh"
DEPS_HINT = (
    "Debian: apt-get install libvulkan-dev glslc spirv-headers mesa-vulkan-drivers vulkan-tools, as "
    + INSTALL_DEPS
    + " does"
)
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
FETCH_TIMEOUT_S = 60

_DEB = re.compile(r"libvulkan-dev_([0-9][0-9A-Za-z.+~-]*)_([a-z0-9]+)\.deb")
_FROM = re.compile(r"#\s*from\s+(\S+/)\s*")


@dataclass(frozen=True)
class VulkanTools:
    glslc_path: Path
    glslc: str  # first line of ``glslc --version``: "shaderc 2023.2-1"
    include_dir: Path  # holds vulkan/vulkan_core.h
    header_version: str  # "1.4.309"


@dataclass(frozen=True)
class HeadersPin:
    """The pinned libvulkan-dev .deb: where it is fetched from, its size and sha256."""

    filename: str  # libvulkan-dev_1.4.309.0-1_amd64.deb
    version: str  # the Debian version, "1.4.309.0-1": the cache folder's name
    url: str
    size: int
    sha256: str


def parse_vulkan_header_version(vulkan_core_h: str) -> str | None:
    """``1.4.309`` from ``vulkan_core.h`` (``VK_HEADER_VERSION`` and ``..._COMPLETE``)."""
    patch = re.search(r"#define VK_HEADER_VERSION (\d+)", vulkan_core_h)
    full = re.search(r"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(\d+, (\d+), (\d+),", vulkan_core_h)
    if not patch:
        return None
    return f"{full.group(1)}.{full.group(2)}.{patch.group(1)}" if full else patch.group(1)


def parse_headers_pin(cs: checksums.Checksums, arch: str) -> HeadersPin | None:
    """The .deb for Debian architecture ``arch`` (``amd64``) in a parsed checksum file: its
    ``<sha256>  <file>`` line, ``# size`` line and the ``# from <url>/`` folder it is fetched from."""
    base = next((m.group(1) for line in cs.header if (m := _FROM.fullmatch(line))), None)
    for e in cs.entries:
        m = _DEB.fullmatch(e.path)
        if m and m.group(2) == arch and base and (size := cs.size(e.path)):
            return HeadersPin(e.path, m.group(1), base + e.path, size, e.sha256)
    return None


def headers_pin(checksum_file: Path | None = None) -> HeadersPin:
    """This machine's pinned .deb (in :data:`HEADERS_CHECKSUMS` unless ``checksum_file``);
    one line when there is none for its architecture."""
    checksum_file = checksum_file or HEADERS_CHECKSUMS
    arch = DEB_ARCH.get(platform.machine(), platform.machine())
    pin = parse_headers_pin(checksums.read(checksum_file), arch) if checksum_file.is_file() else None
    if pin is None:
        raise BuildError(
            f"{checksum_file.name}: no libvulkan-dev .deb pinned for {arch} (with its # size and # from lines)"
        )
    return pin


def _has_extension(include: Path) -> bool:
    core = include / "vulkan" / "vulkan_core.h"
    return core.is_file() and VULKAN_NEEDS in core.read_text(errors="replace")


def cached_headers(pin: HeadersPin, cache: Path | None = None) -> Path | None:
    """``<cache>/vulkan-headers/<version>/include`` when it holds headers with :data:`VULKAN_NEEDS`."""
    include = (cache or cache_root()) / "vulkan-headers" / pin.version / "include"
    return include if _has_extension(include) else None


def download(url: str, dest: Path, size: int) -> None:
    """``url`` into ``dest``, at most ``size`` + 1 bytes read (a longer answer is refused by its size)."""
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as r, open(dest, "wb") as f:
            remaining = size + 1
            while remaining > 0 and (chunk := r.read(min(1 << 20, remaining))):
                f.write(chunk)
                remaining -= len(chunk)
    except (urllib.error.URLError, OSError) as e:
        raise BuildError(f"{url}: cannot fetch it ({getattr(e, 'reason', e)})") from None


def fetch_headers(pin: HeadersPin, cache: Path | None = None, log=print) -> Path:
    """The pinned .deb fetched, its size and sha256 checked, ``usr/include`` unpacked with
    ``dpkg-deb`` and renamed into ``<cache>/vulkan-headers/<version>/include``; a download
    that is not the pinned file leaves nothing there."""
    dest = (cache or cache_root()) / "vulkan-headers" / pin.version
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest.parent) as tmp:
        deb = Path(tmp) / pin.filename
        log(f"fetching {pin.url} (newer Vulkan headers for the Vulkan build)")
        download(pin.url, deb, pin.size)
        got = deb.stat().st_size
        if got != pin.size:
            raise BuildError(
                f"{pin.url}: {got:,} bytes{' or more' if got > pin.size else ''}, not the {pin.size:,} pinned in {HEADERS_CHECKSUMS.name} (a truncated or altered download); nothing was unpacked"
            )
        digest = sha256_file(deb)
        if digest != pin.sha256:
            raise BuildError(
                f"{pin.url}: sha256 {digest} differs from {pin.sha256} pinned in {HEADERS_CHECKSUMS.name} (an altered download); nothing was unpacked"
            )
        if shutil.which("dpkg-deb") is None:
            raise BuildError(
                f"{pin.filename}: dpkg-deb not found to unpack it; install dpkg, or set VULKAN_SDK to newer headers"
            )
        staged = Path(tmp) / "deb"
        proc = subprocess.run(["dpkg-deb", "-x", str(deb), str(staged)], capture_output=True, text=True)
        if proc.returncode != 0 or not _has_extension(staged / "usr" / "include"):
            why = proc.stderr.strip().splitlines()[-1:] or [f"no vulkan/vulkan_core.h with {VULKAN_NEEDS}"]
            raise BuildError(f"{pin.filename}: not the Vulkan headers expected ({why[0]}); nothing was unpacked")
        tree = Path(tmp) / "tree"
        tree.mkdir()
        os.rename(staged / "usr" / "include", tree / "include")
        if dest.exists():
            shutil.rmtree(dest)  # a folder without the headers (cached_headers said so)
        os.rename(tree, dest)
    return dest / "include"


def require_vulkan_tools(
    fetch: bool = True, cache: Path | None = None, log=print, system_include: Path | None = None
) -> VulkanTools:
    """glslc and Vulkan headers new enough, looked up as CMake's FindVulkan does
    (``$VULKAN_SDK`` first, then the system); system headers without :data:`VULKAN_NEEDS`
    are replaced by the pinned Debian 13 ones (cached, else fetched when ``fetch``); else one clear error."""
    sdk = Path(os.environ["VULKAN_SDK"]) if os.environ.get("VULKAN_SDK") else None
    sdk_glslc = sdk / "bin" / "glslc" if sdk else None
    glslc = str(sdk_glslc) if sdk_glslc and sdk_glslc.is_file() else shutil.which("glslc")
    include_dirs = ([sdk / "include"] if sdk else []) + [system_include or SYSTEM_INCLUDE]
    include = next((d for d in include_dirs if (d / "vulkan" / "vulkan_core.h").is_file()), None)
    if glslc is None or include is None:
        missing = "glslc" if glslc is None else "the Vulkan headers (vulkan/vulkan_core.h)"
        raise BuildError(
            Param("vulkan"),
            f": {missing} not found; install them ({DEPS_HINT}) or the LunarG Vulkan SDK (set VULKAN_SDK)",
        )
    version = (
        parse_vulkan_header_version((include / "vulkan" / "vulkan_core.h").read_text(errors="replace")) or "unknown"
    )
    if not _has_extension(include):
        newer, why = None, ""
        if sdk is None:
            try:
                pin = headers_pin()
                newer = cached_headers(pin, cache) or (fetch_headers(pin, cache, log) if fetch else None)
                why = (
                    ""
                    if fetch
                    else f"; `gguf-exact build-llama --vulkan` fetches Debian 13's {pin.version} (pinned in {HEADERS_CHECKSUMS.name})"
                )
            except BuildError as e:
                why = f"; Debian 13's pinned in {HEADERS_CHECKSUMS.name} could not be had ({e})"
        if newer is None:
            raise BuildError(
                Param("vulkan"),
                f": the Vulkan headers in {include} are version {version}, without {VULKAN_NEEDS}, which the pinned llama.cpp's Vulkan backend uses{why}; install newer ones (Debian 13's libvulkan-dev 1.4.309 has it, or the LunarG Vulkan SDK) and set VULKAN_SDK to the folder above their include/",
            )
        include = newer
        version = (
            parse_vulkan_header_version((include / "vulkan" / "vulkan_core.h").read_text(errors="replace")) or "unknown"
        )
    glslc_version = ((_output([glslc, "--version"]) or "").strip().splitlines() or ["version unknown"])[0]
    return VulkanTools(Path(glslc), glslc_version, include, version)


__all__ = [
    "HEADERS_CHECKSUMS",
    "VULKAN_NEEDS",
    "HeadersPin",
    "VulkanTools",
    "cached_headers",
    "fetch_headers",
    "headers_pin",
    "parse_headers_pin",
    "parse_vulkan_header_version",
    "require_vulkan_tools",
]
