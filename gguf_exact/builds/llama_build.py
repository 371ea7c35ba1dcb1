"""Build llama.cpp's ``llama-server`` (and friends) from the pinned llama-cpp-python sdist.

The server and the Python bindings then run the same llama.cpp commit: the sdist
vendors llama.cpp at :data:`COMMIT` in ``vendor/llama.cpp``. The sdist is fetched with
pip from the package registry, its sha256 checked against ``checksums/`` (:mod:`.sdist`),
and the binaries built with CMake (:mod:`.cmake_args`) into a temp dir, then moved into
``<cache>/llama.cpp/<commit>-<backend>-<cpu features>/bin`` only once the probe
(:mod:`.build_probe`: a batched Q4_0 matmul) has run on them. A second call finds them
there and returns at once. The CPU features are named, never ``-march=native``
(:mod:`.cpu_features`: no AMX at the pinned commit), and are part of the folder's name,
so a cache from another machine is never used where it would trap. Backends: ``cpu``, ``cuda<arch>`` (``cuda75``, ``cuda86``:
the toolkit, cuBLAS and driver library come from :mod:`.gpu_toolchains`) and ``vulkan`` (glslc and headers: :mod:`.vulkan_tools`).
Each install holds ``build-info.json``: what it was built with and how long it took.

``scripts/build-llama-cpp.sh`` and ``gguf-exact build-llama`` both call
:func:`build_llama_cpp`.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from gguf_exact.builds import build_probe, gpu_toolchains, source_patches
from gguf_exact.builds import vulkan_tools as vulkan_toolchain
from gguf_exact.builds.cmake_args import (  # noqa: F401  (importable from here, as before)
    backend_cmake_args,
    cmake_args,
    compiler_cache,
    cuda_cmake_args,
    toolchain_info,
)
from gguf_exact.builds.cpu_features import CpuTarget, host_cpu
from gguf_exact.builds.sdist import (  # noqa: F401  (importable from here, as before)
    CHECKSUM_FILE,
    COMMIT,
    PACKAGE,
    VENDORED_COMMITS,
    Log,
    PinnedSdist,
    _extract_llama_cpp,
    extract_data,
    fetch_sdist,
    pinned_sdist,
    unpack_patched_sdist,
    verify_sdist,
)
from gguf_exact.builds.vulkan_tools import VulkanTools
from gguf_exact.constants import cache_root
from gguf_exact.errors import ArgumentError, BuildError, GgufExactError, Param

TARGETS = ("llama-server", "llama-bench", "llama-perplexity", "llama-quantize", "rpc-server")
"""Every llama-server build also builds llama.cpp's ``rpc-server`` (``GGML_RPC=ON``, same commit,
options and patches), so ``serve --rpc`` and ``gguf-exact rpc-server`` run one build."""
CMAKE_TARGETS = {"rpc-server": "ggml-rpc-server"}
"""Installed names whose CMake target (and built binary) is named otherwise at the pinned commit."""
BUILD_OPTIONS = "+rpc"
"""Options beyond the backend that change what a llama-server build holds, in its cache key
(a build from before RPC was added lacks ``--rpc`` and is never taken for one with it)."""
CUDA_ARCHS = ("75", "86")
"""75: Turing (GTX 1650 Ti); 86: Ampere (RTX 3050). Others are accepted too."""
BACKEND = re.compile(r"cpu|vulkan|cuda[0-9]{2,3}")
"""Every backend name: the suffix of a build's cache folder and a profile's ``build``."""

INFO_FILE = build_probe.INFO_FILE
RPC_HEADER = "ggml/include/ggml-rpc.h"  # in the llama.cpp source: the RPC protocol's version


def rpc_record(src: Path) -> dict:
    """What ``build-info.json`` says of the build's RPC backend: ``GGML_RPC=ON``, the worker
    binary, and the protocol version its header declares (workers and heads must agree on
    the major version: ``ggml-rpc.cpp`` refuses another at the hello)."""
    text = (src / RPC_HEADER).read_text()
    found = [re.search(rf"#define RPC_PROTO_{part}_VERSION +([0-9]+)", text) for part in ("MAJOR", "MINOR", "PATCH")]
    version = [m.group(1) for m in found if m is not None]
    if len(version) != len(found):
        raise BuildError(f"{src / RPC_HEADER}: no RPC_PROTO_*_VERSION defines; is it llama.cpp {COMMIT}?")
    return {"ggml_rpc": True, "server": "rpc-server", "protocol": ".".join(version)}


# Failures with a known cause: (text in the build log, what to do).
KNOWN_FAILURES = (
    (
        "CUDA::cublas",
        "the CUDA toolkit found has no cuBLAS (cublas_v2.h); install the full toolkit (NVIDIA's cuda-toolkit package, or Debian's nvidia-cuda-toolkit) and run again",
    ),
    ("No CMAKE_CUDA_COMPILER could be found", "CMake found no nvcc; put the CUDA toolkit's bin on PATH or set CUDACXX"),
    (
        "Could NOT find Vulkan",
        "CMake found no Vulkan headers, loader or glslc; install them (Debian: apt-get install libvulkan-dev glslc spirv-headers)",
    ),
    ("SPIRV-Headers", "CMake found no SPIRV-Headers; install them (Debian: apt-get install spirv-headers)"),
)


@dataclass(frozen=True)
class LlamaBuild:
    """An installed build: ``bin_dir`` holds every name in :data:`TARGETS`."""

    commit: str
    backend: str
    bin_dir: Path

    def binary(self, name: str = "llama-server") -> Path:
        return self.bin_dir / name

    @property
    def info(self) -> dict:
        path = self.bin_dir.parent / INFO_FILE
        return json.loads(path.read_text()) if path.is_file() else {}


def backend_name(cuda: str | None, vulkan: bool = False) -> str:
    """``cpu``, ``vulkan``, or ``cuda75``/``cuda86``/... for a CUDA build for that architecture."""
    if cuda is None or cuda == "":
        return "vulkan" if vulkan else "cpu"
    if vulkan:
        raise ArgumentError(Param("cuda"), f" {cuda} and ", Param("vulkan"), ": choose one backend per build")
    if not re.fullmatch(r"[0-9]{2,3}", str(cuda)):
        raise ArgumentError(
            Param("cuda"), f" {cuda}: expected a CUDA architecture number such as 75 (GTX 1650 Ti) or 86 (RTX 3050)"
        )
    return f"cuda{cuda}"


def build_command(backend: str) -> str:
    """The command that builds ``backend``: ``gguf-exact build-llama --cuda 75`` and so on."""
    if backend.startswith("cuda"):
        return f"gguf-exact build-llama --cuda {backend[4:]}"
    return "gguf-exact build-llama" + (" --vulkan" if backend == "vulkan" else "")


def make_command(backend: str) -> str:
    """The checkout's ``make`` line that builds ``backend``: ``make llama-server CUDA=86`` and so on."""
    if backend.startswith("cuda"):
        return f"make llama-server CUDA={backend[4:]}"
    return "make llama-server" + (" VULKAN=1" if backend == "vulkan" else "")


def build_key(backend: str, cpu: CpuTarget | None = None, commit: str = COMMIT, bindings: bool = False) -> str:
    """``<commit>[+<patch ids>.<digest>]-<backend>-<cpu tag>``: one cache entry per backend, CPU feature
    set and set of carried patches (:mod:`.source_patches`; the bindings' (``bindings``) leave
    out those that change only llama-server), and llama-server's :data:`BUILD_OPTIONS`."""
    options = "" if bindings else BUILD_OPTIONS
    return f"{commit}{source_patches.patch_tag(backend, bindings)}{options}-{backend}-{(cpu or host_cpu()).tag}"


def install_dir(backend: str = "cpu", commit: str = COMMIT, cpu: CpuTarget | None = None) -> Path:
    return cache_root() / "llama.cpp" / build_key(backend, cpu, commit)


def find_build(backend: str = "cpu", commit: str = COMMIT, cpu: CpuTarget | None = None) -> LlamaBuild | None:
    """This machine's installed build for ``backend``, or None if it is missing or incomplete."""
    cpu = cpu or host_cpu()
    bin_dir = install_dir(backend, commit, cpu) / "bin"
    if all(os.access(bin_dir / t, os.X_OK) for t in TARGETS):
        return LlamaBuild(commit, backend, bin_dir)
    return None


def _progress(logfile: Path) -> str | None:
    """The last ninja/make progress mark (``[123/218]``) in the log."""
    with open(logfile, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        marks = re.findall(rb"\[\s*(\d+/\d+|\d+%)\]", f.read())
    return marks[-1].decode() if marks else None


def _run(cmd: list[str], logfile: Path, log: Log, what: str, every: float = 60.0, env: dict | None = None) -> None:
    log("$ " + " ".join(cmd))
    with open(logfile, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        # A session (process group) of its own: an interrupt stops the whole tree (cmake,
        # ninja, nvcc, cc1plus), not only cmake, which would leave ninja compiling for an hour.
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})})  # fmt: skip
        t0 = time.monotonic()
        try:
            while True:
                try:
                    proc.wait(timeout=every)
                    break
                except subprocess.TimeoutExpired:
                    log(f"  {what}: {_progress(logfile) or 'running'} after {time.monotonic() - t0:.0f} s")
        except BaseException:  # Ctrl-C, or SIGTERM under sigterm_as_interrupt, while waiting or logging
            _stop_group(proc)
            raise
    if proc.returncode != 0:
        text = logfile.read_text(errors="replace")
        for needle, advice in KNOWN_FAILURES:
            if needle in text:
                raise BuildError(f"llama.cpp {what} failed: {advice}; full log: {logfile}")
        lines = text.splitlines()
        errors = [ln for ln in lines if "error" in ln.lower() and not ln.startswith("$ ")]
        hint = (errors or lines or ["no output"])[0 if errors else -1].strip()[:200]
        raise BuildError(f"llama.cpp {what} failed ({hint}); full log: {logfile}")


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM raises KeyboardInterrupt, so a killed build (``kill PID``, a CI
    timeout) stops its compilers and removes its temp dir as Ctrl-C does."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def prepare_sources(
    backend: str, sdist: Path | None, log: Log, bindings: bool = False
) -> tuple[PinnedSdist, Path, VulkanTools | None]:
    """What every build of ``backend`` needs before it starts, checked first (toolchain,
    cmake, the pin), then the verified sdist: ``sdist`` if given, else fetched with pip."""
    if backend.startswith("cuda"):
        gpu_toolchains.require_cuda_toolkit(backend[4:])  # fail before fetching anything
    vulkan_tools = vulkan_toolchain.require_vulkan_tools(log=log) if backend == "vulkan" else None
    for tool in ("cmake", "c++"):
        if not shutil.which(tool):
            raise BuildError(f"{tool} not found on PATH; install it (Debian: apt-get install cmake build-essential)")
    source_patches.require_patch_tool(backend, bindings)
    pin = pinned_sdist()
    if VENDORED_COMMITS.get(pin.version) != COMMIT:
        raise BuildError(
            f"{CHECKSUM_FILE}: pins llama-cpp-python {pin.version}, but llama_build.COMMIT is {COMMIT} (0.3.36); add the new version's llama.cpp commit to VENDORED_COMMITS"
        )
    return pin, verify_sdist(Path(sdist), pin) if sdist else fetch_sdist(pin, log=log), vulkan_tools


def build_record(backend: str, cpu: CpuTarget, probe: dict, pin: PinnedSdist, bindings: bool = False) -> dict:
    """What every ``build-info.json`` (llama-server's and the bindings') starts with."""
    return {
        "commit": COMMIT,
        "backend": backend,
        "cpu_features": cpu.tag,
        "cpu": cpu.describe(),
        "probe": probe,
        "package": f"{PACKAGE}=={pin.version}",
        "sdist_sha256": pin.sha256,
        "patches": source_patches.patch_record(backend, bindings),
    }


def build_llama_cpp(
    cuda: str | None = None,
    sdist: Path | None = None,
    jobs: int = 2,
    force: bool = False,
    log: Log = print,
    vulkan: bool = False,
) -> LlamaBuild:
    """Build (once) and return ``llama-server``, ``llama-bench``, ``llama-perplexity`` and
    ``llama-quantize`` for the CPU (default), a CUDA architecture (``cuda="75"``, ``"86"``)
    or Vulkan (``vulkan=True``).

    ``sdist`` is a local copy of the pinned sdist (still checked); otherwise pip fetches it.
    CUDA needs nvcc on PATH; cuBLAS comes from the system, else from NVIDIA's pinned wheel.
    """
    backend = backend_name(cuda, vulkan)
    cpu = host_cpu()
    found = find_build(backend, cpu=cpu)
    if found and not force:
        return found
    pin, sdist_path, vulkan_tools = prepare_sources(backend, sdist, log)

    final = install_dir(backend, cpu=cpu)
    final.parent.mkdir(parents=True, exist_ok=True)
    logs = cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    logfile = logs / f"llama.cpp-{final.name}.log"
    log(f"CPU features: {cpu.describe()}")
    logfile.write_text("")
    work = Path(tempfile.mkdtemp(prefix=f".build-{backend}-", dir=final.parent))
    try:
        t0 = time.monotonic()
        log(f"unpacking vendor/llama.cpp from {sdist_path.name}")
        src = _extract_llama_cpp(sdist_path, work / "src")
        patched = source_patches.apply_patches(src, backend)
        if patched:
            log("carried fixes applied: " + ", ".join(f"#{p}" for p in patched))
        build = work / "build"
        setup = (
            gpu_toolchains.cuda_setup(backend[4:], work, cache_root() / "cuda", log)
            if backend.startswith("cuda")
            else None
        )
        if setup is not None:
            log(f"CUDA {setup.toolkit.version} ({setup.toolkit.root}), cuBLAS {setup.cublas.describe()}")
        launcher, env = compiler_cache(work)
        _run(cmake_args(src, build, backend, setup, vulkan_tools, cpu) + launcher, logfile, log, "configure", env=env)
        targets = [CMAKE_TARGETS.get(t, t) for t in TARGETS]
        _run(["cmake", "--build", str(build), "--config", "Release", f"-j{jobs}", "--target", *targets], logfile, log, "build", env=env)  # fmt: skip
        staged = work / "install"
        (staged / "bin").mkdir(parents=True)
        for target in TARGETS:
            name = CMAKE_TARGETS.get(target, target)
            built = next((p for p in (build / "bin" / name, build / name) if p.is_file()), None)
            if built is None:
                raise BuildError(f"llama.cpp build finished without {target}; full log: {logfile}")
            shutil.copy2(built, staged / "bin" / target)
        server = staged / "bin" / "llama-server"
        missing = unresolved_libraries(server)
        if set(missing) - {"libcuda.so.1"}:  # libcuda.so.1 is the NVIDIA driver's: absent on a machine without one
            raise BuildError(
                f"llama.cpp build: {server.name} needs {', '.join(missing)}, which the loader cannot find; full log: {logfile}"
            )
        build_seconds = round(time.monotonic() - t0, 1)
        if missing:  # no libcuda.so.1: a CUDA build made without the driver cannot run here
            probe = {"ok": None, "what": "llama-bench", "note": "not run here: no libcuda.so.1"}
        else:
            log("probe: a batched Q4_0 matmul through llama-bench, on the device the build is for")
            result = build_probe.probe_server_build(staged / "bin", backend)
            build_probe.require_ok(result, cpu, f"llama.cpp {final.name}", build_command(backend))
            probe = result.record()
        info = {
            **build_record(backend, cpu, probe, pin),
            "cmake": cmake_args(Path("SRC"), Path("BUILD"), backend, setup, vulkan_tools, cpu)[7:],
            "targets": list(TARGETS),
            "rpc": rpc_record(src),
            "build_seconds": build_seconds,
            "jobs": jobs,
            **toolchain_info(setup, vulkan_tools),
            "version": server_version(server)
            if not missing
            else "not run here: no libcuda.so.1 (it comes with the NVIDIA driver)",
        }
        (staged / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        if final.exists() and (force or find_build(backend, cpu=cpu) is None):
            shutil.rmtree(final)  # a forced rebuild, or an install with binaries missing
        try:
            os.rename(staged, final)
        except OSError:
            if find_build(backend, cpu=cpu) is None:  # not a concurrent build that won the race
                raise
        log(f"built {', '.join(TARGETS)} in {info['build_seconds']:.0f} s -> {final / 'bin'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    installed = find_build(backend, cpu=cpu)
    if installed is None:
        raise BuildError(f"{final}: build did not install every target; full log: {logfile}")
    return installed


def reprobe_build(backend: str) -> build_probe.ProbeResult:
    """The installed ``backend`` build's probe run again on its device and recorded in its
    ``build-info.json`` (:func:`.build_probe.reprobe_install`); nothing is built."""
    found = find_build(backend)
    if found is None:
        raise BuildError(f"llama.cpp {backend}: not built here, nothing to probe; run `{build_command(backend)}`")
    return build_probe.reprobe_install(found.bin_dir.parent, backend)


def unresolved_libraries(binary: Path) -> list[str]:
    """Shared libraries of ``binary`` that the loader cannot find (``ldd``; [] without ldd)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    proc = subprocess.run([ldd, str(binary)], capture_output=True, text=True)
    return gpu_toolchains.missing_libraries(proc.stdout)


def server_version(binary: Path) -> str:
    """``llama-server --version`` output (build number, commit, compiler, target)."""
    try:
        proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise BuildError(f"{binary}: cannot run ({e.strerror}); rebuild with `gguf-exact build-llama`") from None
    return (proc.stdout + proc.stderr).strip()


def build_main(argv: list[str] | None, prog: str, description: str | None, build, install_flag: bool = False) -> int:
    """The command line of a build module: ``[--cuda ARCH | --vulkan] [--sdist PATH] [--force]
    [-j N]`` (and ``--install``), ``build(args, log)`` under :func:`sigterm_as_interrupt`,
    its result printed; an error is one line (exit 1), an interrupt exit 130."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--cuda", default=None)
    parser.add_argument("--vulkan", action="store_true")
    parser.add_argument("--sdist", type=Path, default=None)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    if install_flag:
        parser.add_argument("--install", action="store_true", help="install the result into this environment")
    args = parser.parse_args(argv)

    def log(m: str) -> None:
        print(m, file=sys.stderr)

    try:
        with sigterm_as_interrupt():
            result = build(args, log)
    except GgufExactError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; nothing was installed", file=sys.stderr)
        return 130
    print(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m gguf_exact.builds.llama_build [--cuda ARCH | --vulkan] [--sdist PATH] [--force]``: prints the bin dir."""

    def build(a, log: Log) -> Path:
        return build_llama_cpp(a.cuda, a.sdist, a.jobs, a.force, log=log, vulkan=a.vulkan).bin_dir

    return build_main(argv, "build-llama-cpp", build_llama_cpp.__doc__, build)


if __name__ == "__main__":
    sys.exit(main())
