"""Build the llama-cpp-python bindings the way llama-server is built, as a cached wheel.

``pip install llama-cpp-python`` compiles the sdist with ``-march=native`` for the CPU only,
and pip's wheel cache then hands that wheel to any later install, whatever the machine or
backend. Here the bindings come from the same pinned sdist as llama-server, with the same
CMake options (:func:`.llama_build.backend_cmake_args`: named CPU features without AMX,
CUDA ``<arch>`` or Vulkan), into ``<cache>/wheels/<commit>-<backend>-<cpu tag>/``, and a
wheel is kept only once the probe (:mod:`.build_probe`) has run through it. One wheel per
backend and CPU feature set; ``build-info.json`` beside it says what it was built with.

``gguf-exact build-bindings`` and ``make setup`` (``python -m
gguf_exact.builds.bindings_build --install``) call :func:`build_bindings` and
:func:`install_bindings`.
"""

from __future__ import annotations

import ctypes.util
import email.parser
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from gguf_exact.builds import build_probe, gpu_toolchains, source_patches
from gguf_exact.builds.cpu_features import CpuTarget, host_cpu
from gguf_exact.builds.llama_build import (
    INFO_FILE,
    Log,
    _run,
    backend_cmake_args,
    backend_name,
    build_key,
    build_main,
    build_record,
    cache_root,
    compiler_cache,
    prepare_sources,
    toolchain_info,
    unpack_patched_sdist,
)
from gguf_exact.errors import BuildError

DIST = "llama_cpp_python"
EXTRA_CMAKE_ARGS = ["-DLLAVA_BUILD=OFF"]
"""The multimodal (mtmd) library: Gemma 4 text serving never loads it, and it costs build time."""


@dataclass(frozen=True)
class BindingsWheel:
    """A cached, probed bindings wheel and what ``build-info.json`` says of it."""

    backend: str
    wheel: Path
    info: dict


def build_command(backend: str) -> str:
    if backend.startswith("cuda"):
        return f"gguf-exact build-bindings --cuda {backend[4:]}"
    return "gguf-exact build-bindings" + (" --vulkan" if backend == "vulkan" else "")


def config_settings(cmake_args: list[str]) -> list[str]:
    """``-DKEY=VALUE`` options as scikit-build-core's ``-C cmake.define.KEY=VALUE`` (one per
    option, so values with spaces, such as CUDA's ``-isystem DIR``, arrive whole). A CUDA
    build's run path goes on the shared libraries, which is what the bindings are."""
    out = []
    for arg in cmake_args:
        key, _, value = arg.removeprefix("-D").partition("=")
        if key == "CMAKE_EXE_LINKER_FLAGS":
            key = "CMAKE_SHARED_LINKER_FLAGS"
        out += ["-C", f"cmake.define.{key}={value}"]
    return out


def wheel_dir(backend: str = "cpu", cpu: CpuTarget | None = None) -> Path:
    return cache_root() / "wheels" / build_key(backend, cpu, bindings=True)


def find_wheel(backend: str = "cpu", cpu: CpuTarget | None = None) -> BindingsWheel | None:
    """This machine's cached wheel for ``backend``, if it was built and its probe passed."""
    folder = wheel_dir(backend, cpu)
    wheels = sorted(folder.glob(f"{DIST}-*.whl"))
    info = _read_info(folder / INFO_FILE)
    if len(wheels) == 1 and info.get("probe", {}).get("ok") in (True, None):
        return BindingsWheel(backend, wheels[0], info)
    return None


def _read_info(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's own run-time requirements (``Requires-Dist`` without an extra)."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    return [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]


def _pip(args: list[str], python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True, text=True)


def _pip_or_fail(args: list[str], what: str, python: str = sys.executable) -> None:
    proc = _pip(args, python)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BuildError(f"pip {what} failed ({tail[0]})")


def build_bindings(
    cuda: str | None = None,
    vulkan: bool = False,
    sdist: Path | None = None,
    jobs: int = 2,
    force: bool = False,
    log: Log = print,
) -> BindingsWheel:
    """Build (once) the bindings wheel for the CPU (default), ``cuda="75"``/``"86"`` or Vulkan,
    probe it, and return it; a second call returns the cached wheel at once."""
    backend = backend_name(cuda, vulkan)
    cpu = host_cpu()
    found = find_wheel(backend, cpu)
    if found and not force:
        return found
    pin, sdist_path, vulkan_tools = prepare_sources(backend, sdist, log, bindings=True)

    final = wheel_dir(backend, cpu)
    final.parent.mkdir(parents=True, exist_ok=True)
    logs = cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    logfile = logs / f"bindings-{final.name}.log"
    logfile.write_text("")
    log(f"CPU features: {cpu.describe()}")
    work = Path(tempfile.mkdtemp(prefix=f".build-{backend}-", dir=final.parent))
    try:
        t0 = time.monotonic()
        setup = (
            gpu_toolchains.cuda_setup(backend[4:], work, cache_root() / "cuda", log)
            if backend.startswith("cuda")
            else None
        )
        launcher, launcher_env = compiler_cache(work)
        cmake = backend_cmake_args(backend, setup, vulkan_tools, cpu) + EXTRA_CMAKE_ARGS + launcher
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(work / "dist")]
        source = sdist_path
        # the same fixes as this backend's llama-server, less those only llama-server compiles
        if carried := source_patches.patches_for(backend, bindings=True):
            source = unpack_patched_sdist(sdist_path, work / "src", backend)
            log("carried fixes applied: " + ", ".join(f"#{p.id}" for p in carried))
        with _environ({"CMAKE_BUILD_PARALLEL_LEVEL": str(jobs), **launcher_env}):
            _run([*cmd, *config_settings(cmake), str(source)], logfile, log, "bindings build")
        wheels = sorted((work / "dist").glob(f"{DIST}-*.whl"))
        if len(wheels) != 1:
            raise BuildError(f"bindings build left {len(wheels)} wheels instead of one; full log: {logfile}")
        build_seconds = round(time.monotonic() - t0, 1)
        probe = _probe_wheel(wheels[0], work, backend, cpu, log)
        staged = work / "install"
        staged.mkdir()
        shutil.move(str(wheels[0]), staged / wheels[0].name)
        info = {
            **build_record(backend, cpu, probe, pin, bindings=True),
            "cmake_args": cmake,
            "build_seconds": build_seconds,
            "jobs": jobs,
            **toolchain_info(setup, vulkan_tools),
        }
        build_probe.install_entry(staged, final, info)
        log(f"built the bindings in {build_seconds:.0f} s -> {final}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = find_wheel(backend, cpu)
    if result is None:
        raise BuildError(f"{final}: the bindings wheel did not land; full log: {logfile}")
    return result


def _probe_wheel(wheel: Path, work: Path, backend: str, cpu: CpuTarget, log: Log) -> dict:
    """The probe's record, or one error line when it failed."""
    if backend.startswith("cuda") and ctypes.util.find_library("cuda") is None:
        return {"ok": None, "what": "the llama-cpp-python bindings", "note": "not run here: no libcuda.so.1"}
    log(
        "probe: a batched Q4_0 matmul through the bindings"
        + ("" if backend == "cpu" else ", every layer on the device")
    )
    result = _run_probe(wheel, work, backend)
    build_probe.require_ok(
        result, cpu, f"llama-cpp-python bindings {wheel_dir(backend, cpu).name}", build_command(backend)
    )
    return result.record()


def _run_probe(wheel: Path, work: Path, backend: str) -> build_probe.ProbeResult:
    """Run the probe through the wheel unpacked beside (not into) this environment; the
    wheel's own requirements (numpy, jinja2, ...) are installed here first."""
    _pip_or_fail(["install", "-q", *wheel_requirements(wheel)], "install of the bindings' requirements")
    site = unpack_wheel(wheel, work / "probe-site")
    return build_probe.probe_bindings(sys.executable, pythonpath=site, backend=backend)


def unpack_wheel(wheel: Path, site: Path) -> Path:
    """``wheel``'s files in ``site``, a folder to put first on a child's ``PYTHONPATH``: the bindings
    used beside, not instead of, this environment's (the Vulkan tests' CPU and Vulkan engines).
    A binary wheel without scripts needs nothing else of an install."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def reprobe_bindings(backend: str) -> build_probe.ProbeResult:
    """The cached ``backend`` wheel's probe run again (a GPU build's on its device) and recorded
    in its ``build-info.json``; nothing is built (for a wheel made before its probe ran there)."""
    found = find_wheel(backend)
    if found is None:
        raise BuildError(
            f"llama-cpp-python bindings {backend}: not built here, nothing to probe; run `{build_command(backend)}`"
        )
    with tempfile.TemporaryDirectory(prefix="gguf-exact-reprobe-") as tmp:
        result = _run_probe(found.wheel, Path(tmp), backend)
    return build_probe.record_probe(found.wheel.parent / INFO_FILE, result)


class _environ:
    """Set environment variables for the duration of a ``with`` block."""

    def __init__(self, values: dict[str, str]):
        self.values = values
        self.saved: dict[str, str | None] = {}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass(frozen=True)
class InstalledBindings:
    """The llama-cpp-python in this environment: its version, the wheel it came from (when
    it was one of ours) and that wheel's ``build-info.json``."""

    version: str
    wheel: Path | None
    info: dict

    @property
    def backend(self) -> str:
        return self.info.get("backend", "unknown (not built by gguf-exact)")


def installed_bindings() -> InstalledBindings | None:
    """Read from the installed distribution's metadata (PEP 610 ``direct_url.json``);
    imports nothing of llama_cpp."""
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    wheel = None
    try:
        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    except ValueError:
        url = ""
    if url.startswith("file://"):
        wheel = Path(unquote(urlparse(url).path))
    info = _read_info(wheel.parent / INFO_FILE) if wheel is not None else {}
    return InstalledBindings(dist.version, wheel, info)


def install_bindings(wheel: BindingsWheel, log: Log = print) -> InstalledBindings:
    """Install ``wheel`` (and llama_cpp.server's requirements) into this environment,
    replacing any other llama-cpp-python (a native build from pip's cache, say)."""
    current = installed_bindings()
    if current is None or current.wheel != wheel.wheel:
        log(f"installing {wheel.wheel.name} ({wheel.backend}, CPU features {wheel.info.get('cpu_features', '?')})")
        _pip_or_fail(["install", "-q", "--force-reinstall", "--no-deps", str(wheel.wheel)], f"install of {wheel.wheel}")
    _pip_or_fail(["install", "-q", f"{wheel.wheel}[server]"], "install of llama_cpp.server's requirements")
    done = installed_bindings()
    if done is None or done.wheel != wheel.wheel:
        raise BuildError(f"{wheel.wheel}: installed, but this environment's llama-cpp-python is another one")
    return done


def main(argv: list[str] | None = None) -> int:
    """``python -m gguf_exact.builds.bindings_build [--cuda ARCH | --vulkan] [--install]``: prints the wheel."""

    def build(a, log: Log) -> Path:
        built = build_bindings(a.cuda or None, a.vulkan, a.sdist, a.jobs, a.force, log)
        if a.install:
            install_bindings(built, log)
        return built.wheel

    return build_main(argv, "build-bindings", build_bindings.__doc__, build, install_flag=True)


if __name__ == "__main__":
    sys.exit(main())
