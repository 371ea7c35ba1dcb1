"""Build llama.cpp's ``llama-server`` (and friends) from the pinned llama-cpp-python sdist.

The server and the Python bindings then run the same llama.cpp commit: the sdist
vendors llama.cpp at :data:`COMMIT` in ``vendor/llama.cpp``. The sdist is fetched with
pip from the package registry, its sha256 checked against ``checksums/``, and the
binaries built with CMake into a temp dir, then moved into
``<cache>/llama.cpp/<commit>-<backend>-<cpu features>/bin`` only once the probe
(:mod:`.build_probe`: a batched Q4_0 matmul) has run on them. A second call finds them
there and returns at once. The CPU features are named, never ``-march=native``
(:mod:`.cpu_features`: no AMX at the pinned commit), and are part of the folder's name,
so a cache from another machine is never used where it would trap. Backends: ``cpu``, ``cuda<arch>`` (``cuda75``, ``cuda86``:
the toolkit, cuBLAS and driver library come from :mod:`.gpu_toolchains`) and ``vulkan``.
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
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from gguf_exact.builds import build_probe, gpu_toolchains, source_patches
from gguf_exact.builds.cpu_features import CpuTarget, host_cpu
from gguf_exact.builds.gpu_toolchains import CudaSetup, VulkanTools
from gguf_exact.constants import cache_root
from gguf_exact.errors import ArgumentError, BuildError, GgufExactError, Param
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub import checksums

VENDORED_COMMITS = {"0.3.36": "0c1e57098"}
"""llama-cpp-python version -> the llama.cpp commit its sdist vendors."""
COMMIT = VENDORED_COMMITS["0.3.36"]

TARGETS = ("llama-server", "llama-bench", "llama-perplexity", "llama-quantize")
CUDA_ARCHS = ("75", "86")
"""75: Turing (GTX 1650 Ti); 86: Ampere (RTX 3050). Others are accepted too."""
BACKEND = re.compile(r"cpu|vulkan|cuda[0-9]{2,3}")
"""Every backend name: the suffix of a build's cache folder and a profile's ``build``."""

PACKAGE = "llama-cpp-python"
CHECKSUM_FILE = checksums.CHECKSUMS_DIR / checksums.LLAMA_CPP_PYTHON
INFO_FILE = "build-info.json"

Log = Callable[[str], None]

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


@dataclass(frozen=True)
class PinnedSdist:
    version: str
    sha256: str
    filename: str


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


def build_key(backend: str, cpu: CpuTarget | None = None, commit: str = COMMIT, bindings: bool = False) -> str:
    """``<commit>[+<patch ids>]-<backend>-<cpu tag>``: one cache entry per backend, CPU feature
    set and set of carried patches (:mod:`.source_patches`; the bindings' (``bindings``) leave
    out those that change only llama-server)."""
    return f"{commit}{source_patches.patch_tag(backend, bindings)}-{backend}-{(cpu or host_cpu()).tag}"


def install_dir(backend: str = "cpu", commit: str = COMMIT, cpu: CpuTarget | None = None) -> Path:
    return cache_root() / "llama.cpp" / build_key(backend, cpu, commit)


def find_build(backend: str = "cpu", commit: str = COMMIT, cpu: CpuTarget | None = None) -> LlamaBuild | None:
    """This machine's installed build for ``backend``, or None if it is missing or incomplete."""
    cpu = cpu or host_cpu()
    bin_dir = install_dir(backend, commit, cpu) / "bin"
    if all(os.access(bin_dir / t, os.X_OK) for t in TARGETS):
        return LlamaBuild(commit, backend, bin_dir)
    return None


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


def cmake_args(
    src: Path,
    build: Path,
    backend: str,
    cuda: CudaSetup | None = None,
    vulkan: VulkanTools | None = None,
    cpu: CpuTarget | None = None,
) -> list[str]:
    """The CMake configure command line for ``backend`` (CUDA needs ``cuda``; ``vulkan``
    pins the headers and glslc that :func:`.gpu_toolchains.require_vulkan_tools` checked)."""
    args = [
        "cmake",
        "-S",
        str(src),
        "-B",
        str(build),
        "-G",
        "Ninja" if shutil.which("ninja") else "Unix Makefiles",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",  # self-contained binaries: they can move out of the build dir
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",  # no downloads from the server
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_UI=OFF",  # no web UI fetch at build time
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        f"-DLLAMA_BUILD_COMMIT={COMMIT}",  # the sdist has no .git; --version would say 'unknown'
    ]
    return args + backend_cmake_args(backend, cuda, vulkan, cpu)


def backend_cmake_args(
    backend: str, cuda: CudaSetup | None = None, vulkan: VulkanTools | None = None, cpu: CpuTarget | None = None
) -> list[str]:
    """The options that choose what the code runs on: the CPU features (every backend
    compiles ggml's CPU code), then CUDA or Vulkan. llama-server and the bindings share them."""
    args = (cpu or host_cpu()).cmake_args()
    if backend == "vulkan":
        args += ["-DGGML_VULKAN=ON"]
        if vulkan is not None:
            args += [f"-DVulkan_INCLUDE_DIR={vulkan.include_dir}", f"-DVulkan_GLSLC_EXECUTABLE={vulkan.glslc_path}"]
    if backend.startswith("cuda"):
        if cuda is None:
            raise ValueError(f"cmake_args: backend {backend} needs a CudaSetup")
        args += cuda_cmake_args(backend[4:], cuda)
    return args


def cuda_cmake_args(arch: str, cuda: CudaSetup) -> list[str]:
    """Point CMake's FindCUDAToolkit at exactly the toolkit, cuBLAS and libcuda of ``cuda``.

    A wheel's cuBLAS sits outside the toolkit, so its libraries are given by path and its
    headers by ``-isystem``. The RUNPATH names only the folders of libcudart and libcublas
    (not the build-local libcuda stub): the binary loads the driver's libcuda.so.1.
    """
    args = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}", f"-DCMAKE_CUDA_COMPILER={cuda.toolkit.nvcc}"]
    # Debian's split layout (nvcc under /usr/lib/nvidia-cuda-toolkit, headers in /usr/include)
    # is found by CMake itself; a root is given only where it holds the headers.
    if (cuda.toolkit.root / "include" / "cuda_runtime.h").is_file():
        args.append(f"-DCUDAToolkit_ROOT={cuda.toolkit.root}")
    args.append(f"-DCUDA_cuda_driver_LIBRARY={cuda.driver_library}")
    if cuda.cublas.source == "wheel":
        args += [
            f"-DCUDA_cublas_LIBRARY={cuda.cublas.libraries[0]}",
            f"-DCUDA_cublasLt_LIBRARY={cuda.cublas.libraries[1]}",
            f"-DCMAKE_CUDA_FLAGS=-isystem {cuda.cublas.include_dir}",
        ]
    rpath = ":".join(str(d) for d in cuda.runtime_dirs())
    args.append("-DCMAKE_SKIP_BUILD_RPATH=ON")
    if rpath:
        args.append(f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath,{rpath}")
    return args


def toolchain_info(cuda: CudaSetup | None, vulkan: VulkanTools | None) -> dict:
    """What ``build-info.json`` records about the toolchain (``doctor`` prints it)."""
    if cuda is not None:
        t, c = cuda.toolkit, cuda.cublas
        return {
            "cuda_toolkit": {"version": t.version, "root": str(t.root), "nvcc": str(t.nvcc)},
            "cublas": {"source": c.source, "package": c.package, "lib_dir": str(c.lib_dir)},
            "driver_link": {"source": cuda.driver_source, "library": str(cuda.driver_library)},
            "min_driver": gpu_toolchains.MIN_DRIVER.get(t.major, ""),
        }
    if vulkan is not None:
        return {"glslc": vulkan.glslc, "vulkan_headers": f"{vulkan.header_version} ({vulkan.include_dir})"}
    return {}


def _progress(logfile: Path) -> str | None:
    """The last ninja/make progress mark (``[123/218]``) in the log."""
    with open(logfile, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        marks = re.findall(rb"\[\s*(\d+/\d+|\d+%)\]", f.read())
    return marks[-1].decode() if marks else None


def _run(cmd: list[str], logfile: Path, log: Log, what: str, every: float = 60.0) -> None:
    log("$ " + " ".join(cmd))
    with open(logfile, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        # A session (process group) of its own: an interrupt stops the whole tree (cmake,
        # ninja, nvcc, cc1plus), not only cmake, which would leave ninja compiling for an hour.
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
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


def extract_data(tar: tarfile.TarFile, dest: Path, members: list[tarfile.TarInfo]) -> None:
    """``extractall`` with the "data" filter's rules: plain files and folders inside
    ``dest`` only. Python has the filter from 3.10.12 and 3.11.4 on; on older patch
    releases the same rules are checked here first (the project supports all of 3.10)."""
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(dest, members=members, filter="data")
        except tarfile.FilterError as err:
            raise BuildError(f"{tar.name}: {err}") from None
        return
    root = dest.resolve()
    for m in members:
        target = (root / m.name).resolve()
        if not (m.isfile() or m.isdir()) or Path(m.name).is_absolute() or not target.is_relative_to(root):
            raise BuildError(f"{tar.name}: member {m.name!r} is not a plain file inside the archive's folder")
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


def prepare_sources(
    backend: str, sdist: Path | None, log: Log, bindings: bool = False
) -> tuple[PinnedSdist, Path, VulkanTools | None]:
    """What every build of ``backend`` needs before it starts, checked first (toolchain,
    cmake, the pin), then the verified sdist: ``sdist`` if given, else fetched with pip."""
    if backend.startswith("cuda"):
        gpu_toolchains.require_cuda_toolkit(backend[4:])  # fail before fetching anything
    vulkan_tools = gpu_toolchains.require_vulkan_tools() if backend == "vulkan" else None
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
        "patches": [p.id for p in source_patches.patches_for(backend, bindings)],
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
        _run(cmake_args(src, build, backend, setup, vulkan_tools, cpu), logfile, log, "configure")
        _run(
            ["cmake", "--build", str(build), "--config", "Release", f"-j{jobs}", "--target", *TARGETS],
            logfile,
            log,
            "build",
        )
        staged = work / "install"
        (staged / "bin").mkdir(parents=True)
        for target in TARGETS:
            built = next((p for p in (build / "bin" / target, build / target) if p.is_file()), None)
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
            log("probe: a batched Q4_0 matmul through llama-bench")
            result = build_probe.probe_server_build(staged / "bin")
            build_probe.require_ok(result, cpu, f"llama.cpp {final.name}", build_command(backend))
            probe = result.record()
        info = {
            **build_record(backend, cpu, probe, pin),
            "cmake": cmake_args(Path("SRC"), Path("BUILD"), backend, setup, vulkan_tools, cpu)[7:],
            "targets": list(TARGETS),
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
    result = find_build(backend, cpu=cpu)
    if result is None:
        raise BuildError(f"{final}: build did not install every target; full log: {logfile}")
    return result


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
