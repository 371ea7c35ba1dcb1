"""The Vulkan build's headers where the system's are too old: Debian 13's libvulkan-dev .deb,
pinned in checksums/vulkan-headers.sha256, fetched (here from a loopback HTTP server, never the
real network), checked by size and sha256, unpacked into <cache>/vulkan-headers/<version>/include,
and taken by require_vulkan_tools without VULKAN_SDK; broken downloads are refused in one line."""

import functools
import hashlib
import http.server
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from gguf_exact.builds import vulkan_tools
from gguf_exact.cli import main
from gguf_exact.errors import BuildError
from gguf_exact.hub import checksums

NEW_CORE_H = """#define VK_HEADER_VERSION 309
#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 4, VK_HEADER_VERSION)
#define VK_EXT_layer_settings 1
"""
OLD_CORE_H = """#define VK_HEADER_VERSION 239
#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)
"""
DEB = "libvulkan-dev_1.4.309.0-1_amd64.deb"


def test_the_pinned_deb():
    pin = vulkan_tools.headers_pin()
    assert pin == vulkan_tools.HeadersPin(
        DEB,
        "1.4.309.0-1",
        "http://deb.debian.org/debian/pool/main/v/vulkan-loader/" + DEB,
        1556388,
        "8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a",
    )
    cs = checksums.read(vulkan_tools.HEADERS_CHECKSUMS)
    assert vulkan_tools.parse_headers_pin(cs, "arm64") is None  # only amd64 is pinned
    no_from = checksums.Checksums(entries=cs.entries, sizes=cs.sizes)  # without its "# from" folder: no pin
    assert vulkan_tools.parse_headers_pin(no_from, "amd64") is None


def _deb(tmp: Path, core_h: str) -> Path:
    """A real .deb (dpkg-deb --build) holding usr/include/vulkan/vulkan_core.h, as libvulkan-dev does."""
    root = tmp / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: libvulkan-dev\nVersion: 1.4.309.0-1\nArchitecture: amd64\nMaintainer: t <t@t>\nDescription: test\n"
    )
    (root / "usr" / "include" / "vulkan").mkdir(parents=True)
    (root / "usr" / "include" / "vulkan" / "vulkan_core.h").write_text(core_h)
    (root / "usr" / "include" / "vk_video").mkdir()
    (root / "usr" / "include" / "vk_video" / "vulkan_video_codecs_common.h").write_text("/* codecs */\n")
    out = tmp / "served" / DEB
    out.parent.mkdir()
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(out)], check=True, capture_output=True)
    return out


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no request lines in the commands' output
        pass


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """A loopback HTTP server over a folder (the Debian pool's stand-in), the checksum file that
    pins what it serves, a cache of the test's own, and system headers as old as Debian 12's."""
    served = _deb(tmp_path, NEW_CORE_H).parent
    handler = functools.partial(QuietHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    deb = served / DEB
    pinned = tmp_path / "vulkan-headers.sha256"
    pinned.write_text(
        f"# from http://127.0.0.1:{server.server_address[1]}/\n# size {deb.stat().st_size}  {DEB}\n"
        f"{hashlib.sha256(deb.read_bytes()).hexdigest()}  {DEB}\n"
    )
    monkeypatch.setattr(vulkan_tools, "HEADERS_CHECKSUMS", pinned)
    monkeypatch.delenv("VULKAN_SDK", raising=False)
    monkeypatch.setenv("GGUF_EXACT_CACHE", str(tmp_path / "cache"))
    system = tmp_path / "usr-include"
    (system / "vulkan").mkdir(parents=True)
    (system / "vulkan" / "vulkan_core.h").write_text(OLD_CORE_H)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "glslc").write_text("#!/bin/sh\necho 'shaderc 2023.2-1'\n")
    (tmp_path / "bin" / "glslc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setattr(vulkan_tools, "SYSTEM_INCLUDE", system)  # what `build-llama` reads: never this machine's
    yield deb, system, tmp_path / "cache"
    server.shutdown()
    server.server_close()


def test_old_system_headers_are_replaced_by_the_fetched_ones(pool):
    deb, system, cache = pool
    include = cache / "vulkan-headers" / "1.4.309.0-1" / "include"
    lines: list[str] = []
    tools = vulkan_tools.require_vulkan_tools(log=lines.append, system_include=system)
    assert tools.include_dir == include and tools.header_version == "1.4.309"
    assert (include / "vulkan" / "vulkan_core.h").read_text() == NEW_CORE_H
    assert (include / "vk_video" / "vulkan_video_codecs_common.h").is_file()
    assert sorted(p.name for p in (cache / "vulkan-headers").iterdir()) == ["1.4.309.0-1"]  # no temp left
    assert sorted(p.name for p in include.parent.iterdir()) == ["include"]  # usr/include only, no .deb kept
    assert lines == [f"fetching {vulkan_tools.headers_pin().url} (newer Vulkan headers for the Vulkan build)"]
    deb.unlink()  # fetched once: the cache answers, the pool is not asked again
    assert vulkan_tools.require_vulkan_tools(log=lines.append, system_include=system) == tools and len(lines) == 1
    # doctor never fetches: with the cache gone it says what the build will do
    shutil.rmtree(cache / "vulkan-headers")
    with pytest.raises(
        BuildError,
        match=r"are version 1\.3\.239, without VK_EXT_layer_settings.*; `gguf-exact build-llama --vulkan` fetches Debian 13's 1\.4\.309\.0-1 \(pinned in vulkan-headers\.sha256\)",
    ):
        vulkan_tools.require_vulkan_tools(fetch=False, system_include=system)
    # headers new enough in the system are used as they are, nothing fetched
    (system / "vulkan" / "vulkan_core.h").write_text(NEW_CORE_H)
    assert vulkan_tools.require_vulkan_tools(system_include=system).include_dir == system


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "longer"])
def test_a_broken_download_is_refused_in_one_line(pool, damage):
    deb, system, cache = pool
    data = bytearray(deb.read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0x01
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data += b"\0"
    size = deb.stat().st_size
    deb.write_bytes(bytes(data))
    url = vulkan_tools.headers_pin().url
    with pytest.raises(BuildError) as err:
        vulkan_tools.fetch_headers(vulkan_tools.headers_pin(), cache)
    expected = {
        "flipped byte": f"{url}: sha256 {hashlib.sha256(data).hexdigest()} differs from ",
        "truncated": f"{url}: {len(data):,} bytes, not the {size:,} pinned in vulkan-headers.sha256 (a truncated or altered download); nothing was unpacked",
        "longer": f"{url}: {size + 1:,} bytes or more, not the {size:,} pinned in vulkan-headers.sha256 (a truncated or altered download); nothing was unpacked",
    }[damage]
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)
    assert list((cache / "vulkan-headers").iterdir()) == []  # nothing half-written in the cache
    # the build stops before anything else, in one line naming what failed and what to do
    r = CliRunner().invoke(main, ["build-llama", "--vulkan"], env={"GGUF_EXACT_CACHE": str(cache)})
    out = r.output.strip().splitlines()
    assert r.exit_code == 1 and out[0].startswith("fetching ") and len(out) == 2, r.output
    assert out[1].startswith("error: --vulkan: the Vulkan headers in ") and expected in out[1]


def test_no_fetch_possible_keeps_the_old_error(pool):
    deb, system, cache = pool
    pinned = vulkan_tools.HEADERS_CHECKSUMS
    pinned.write_text(
        pinned.read_text().replace("# from http://127.0.0.1:", "# from http://127.0.0.1:1")
    )  # a closed port
    with pytest.raises(BuildError) as err:
        vulkan_tools.require_vulkan_tools(system_include=system)
    text = str(err.value)
    assert text.startswith(
        f"vulkan: the Vulkan headers in {system} are version 1.3.239, without VK_EXT_layer_settings, which the pinned llama.cpp's Vulkan backend uses; Debian 13's pinned in vulkan-headers.sha256 could not be had (http://127.0.0.1:1"
    ), text
    assert text.endswith("and set VULKAN_SDK to the folder above their include/")
    assert not (cache / "vulkan-headers" / "1.4.309.0-1").exists()
