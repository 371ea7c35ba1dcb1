"""What a CUDA build of llama.cpp compiles and links with: the CUDA toolkit, cuBLAS and the
driver library (the Vulkan tools: :mod:`.vulkan_tools`).

A CUDA build needs nvcc (from any toolkit: NVIDIA's installer, Debian's, or NVIDIA's
wheels), cuBLAS (headers and ``libcublas``), and ``libcuda.so`` to link against. When the
system has no cuBLAS, it comes from NVIDIA's wheel on the package registry
(``nvidia-cublas`` for CUDA 13, ``nvidia-cublas-cu12`` for CUDA 12), pinned by sha256 in
``checksums/nvidia-cublas.sha256`` and unpacked once into ``<cache>/cuda/``. When the
system has no ``libcuda.so`` (no NVIDIA driver, and a toolkit without ``lib64/stubs``),
a link-time stub is generated from the toolkit's own ``cuda.h``, the same thing NVIDIA
ships as ``stubs/libcuda.so``: it is named ``libcuda.so`` with soname ``libcuda.so.1``,
so the binary asks for the driver's ``libcuda.so.1`` at run time and the stub is never
loaded. :mod:`.llama_build` turns a :class:`CudaSetup` into CMake arguments.

The ``parse_*`` functions, :func:`driver_symbols`, :func:`stub_source`,
:func:`wheel_pin_for`, :func:`missing_libraries` and :func:`fatbin_archs` are pure; the
rest run tools or read the disk.
"""

import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.errors import BuildError, Param
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub import checksums

CUBLAS_CHECKSUMS = checksums.CHECKSUMS_DIR / "nvidia-cublas.sha256"
"""The cuBLAS wheels gguf-exact may fetch, one per CUDA major version."""

MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
"""CUDA major version -> the oldest Linux NVIDIA driver that runs its binaries."""

_WHEEL = re.compile(r"(nvidia_cublas(?:_cu(\d+))?)-([0-9][0-9.]*)-[^-]+-[^-]+-(\S+)\.whl")


@dataclass(frozen=True)
class CudaToolkit:
    """A CUDA toolkit found through its ``nvcc``."""

    root: Path  # the folder above nvcc's bin/ (nvcc's own ``_HERE_/..``, so wrappers on PATH resolve)
    nvcc: Path
    version: str  # "13.0.88"
    archs: tuple[str, ...]  # what `nvcc --list-gpu-arch` lists: ("75", "80", "86", ...); () if unknown

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def include_dirs(self) -> list[Path]:
        return [self.root / "include", self.root / "targets" / f"{platform.machine()}-linux" / "include"]

    def lib_dirs(self) -> list[Path]:
        return [self.root / "lib64", self.root / "lib", self.root / "targets" / f"{platform.machine()}-linux" / "lib"]


@dataclass(frozen=True)
class Cublas:
    """cuBLAS headers and libraries, from the system or from NVIDIA's wheel."""

    source: str  # "system" or "wheel"
    include_dir: Path
    lib_dir: Path
    libraries: tuple[Path, Path]  # libcublas, libcublasLt
    package: str = ""  # "nvidia-cublas==13.1.0.3" for a wheel

    def describe(self) -> str:
        return f"{self.package} (wheel, {self.lib_dir})" if self.source == "wheel" else f"system ({self.lib_dir})"


@dataclass(frozen=True)
class CudaSetup:
    """Everything a CUDA build is pointed at."""

    toolkit: CudaToolkit
    cublas: Cublas
    driver_library: Path  # libcuda.so to link against (the driver's, the toolkit's stub, or a generated stub)
    driver_source: str  # "system", "toolkit stub" or "generated stub"

    def runtime_dirs(self) -> list[Path]:
        """Folders the binary's RUNPATH needs: where libcudart and libcublas are."""
        cudart = next((d for d in self.toolkit.lib_dirs() if any(d.glob("libcudart.so*"))), None)
        dirs = [d for d in (cudart, self.cublas.lib_dir) if d is not None]
        return list(dict.fromkeys(dirs))


@dataclass(frozen=True)
class WheelPin:
    package: str  # "nvidia-cublas"
    version: str  # "13.1.0.3"
    filename: str
    sha256: str
    cuda_major: int


# --- pure parsing -------------------------------------------------------------------


def parse_nvcc_version(text: str) -> str | None:
    """``13.0.88`` from ``nvcc --version`` output (``... release 13.0, V13.0.88``)."""
    m = re.search(r"\bV(\d+\.\d+(?:\.\d+)?)", text) or re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


def parse_gpu_archs(text: str) -> tuple[str, ...]:
    """``("75", "86", ...)`` from ``nvcc --list-gpu-arch`` output (``compute_75`` lines)."""
    return tuple(dict.fromkeys(re.findall(r"\bcompute_(\d+)[a-z]?\b", text)))


def parse_nvcc_root(dryrun: str) -> Path | None:
    """The toolkit root from ``nvcc --dryrun`` output: its ``#$ _HERE_=<root>/bin`` line."""
    m = re.search(r"^#\$ _HERE_=(.+)$", dryrun, re.MULTILINE)
    return Path(m.group(1).strip()).parent if m else None


def driver_symbols(preprocessed_cuda_h: str) -> list[str]:
    """The driver API's function names in preprocessed ``cuda.h``, after its ``#define``
    renames (``cuMemGetInfo`` -> ``cuMemGetInfo_v2``), which are the names libcuda exports."""
    names = re.findall(r"\bCUresult\s+(?:CUDAAPI\s+)?(cu[A-Z]\w*)\s*\(", preprocessed_cuda_h)
    return sorted(set(names))


def stub_source(symbols: list[str]) -> str:
    """C source of a link-time stub exporting ``symbols`` (never run: it only satisfies ld)."""
    return "".join(f"void {name}(void) {{}}\n" for name in symbols)


def parse_wheel_pins(entries: list[checksums.Entry]) -> list[WheelPin]:
    """cuBLAS wheel pins from checksum entries named like pip's wheel files."""
    pins = []
    for e in entries:
        m = _WHEEL.fullmatch(e.path.rsplit("/", 1)[-1])
        if m:
            name, cu, version, _ = m.groups()
            major = int(cu) if cu else int(version.split(".")[0])
            pins.append(WheelPin(name.replace("_", "-"), version, m.group(0), e.sha256, major))
    return pins


def wheel_pin_for(pins: list[WheelPin], cuda_major: int, machine: str) -> WheelPin | None:
    """The pinned cuBLAS wheel for this CUDA major version and CPU (``x86_64``, ``aarch64``)."""
    return next((p for p in pins if p.cuda_major == cuda_major and p.filename.endswith(f"_{machine}.whl")), None)


def missing_libraries(ldd_output: str) -> list[str]:
    """Names ``ldd`` could not resolve (``libfoo.so.1 => not found``)."""
    return re.findall(r"^\s*(\S+)\s+=>\s+not found", ldd_output, re.MULTILINE)


FATBIN_MAGIC = 0xBA55ED50


def fatbin_archs(section: bytes) -> dict[str, int]:
    """What GPU code a binary's ``.nv_fatbin`` section holds: ``{"sm_86": 144, "compute_86": 144}``
    (cubins per real arch, PTX per virtual arch). Each fat binary is a header (magic, version,
    header size, payload size) and entries whose header gives kind (1 PTX, 2 cubin), sizes and,
    at byte 28, the arch; the payloads may be compressed, the headers are not."""
    counts: dict[str, int] = {}
    pos = 0
    while pos + 16 <= len(section):
        magic, _, header, size = struct.unpack_from("<IHHQ", section, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fat binaries are 8-byte aligned in the section
            continue
        entry, end = pos + header, pos + header + size
        while entry + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", section, entry)
            arch = struct.unpack_from("<I", section, entry + 28)[0]
            name = f"{'compute' if kind == 1 else 'sm'}_{arch}"
            counts[name] = counts.get(name, 0) + 1
            entry += entry_header + payload
        pos = end
    return counts


def binary_gpu_archs(binary: Path) -> dict[str, int]:
    """:func:`fatbin_archs` of ``binary``'s ``.nv_fatbin`` section ({} if none or no readelf)."""
    out = _output(["readelf", "-S", "-W", str(binary)]) or ""
    for line in out.splitlines():
        if ".nv_fatbin" in line:
            fields = line.split("]", 1)[1].split()  # name type address offset size ...
            offset, size = int(fields[3], 16), int(fields[4], 16)
            with open(binary, "rb") as f:
                f.seek(offset)
                return fatbin_archs(f.read(size))
    return {}


# --- discovery ----------------------------------------------------------------------


def _output(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout + proc.stderr if proc.returncode == 0 else None


def find_cuda_toolkit() -> CudaToolkit | None:
    """The toolkit whose ``nvcc`` is first on PATH, or None."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    version = parse_nvcc_version(_output([nvcc, "--version"]) or "")
    if version is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "probe.cu"
        source.write_text("")
        root = parse_nvcc_root(_output([nvcc, "--dryrun", "-c", str(source), "-o", str(source) + ".o"]) or "")
    root = root or Path(nvcc).resolve().parent.parent
    real_nvcc = root / "bin" / "nvcc"
    archs = parse_gpu_archs(_output([nvcc, "--list-gpu-arch"]) or "")
    return CudaToolkit(root, real_nvcc if real_nvcc.is_file() else Path(nvcc), version, archs)


def require_cuda_toolkit(arch: str) -> CudaToolkit:
    """The toolkit on PATH, checked to compile for ``sm_<arch>``; else one clear error."""
    toolkit = find_cuda_toolkit()
    if toolkit is None:
        raise BuildError(
            Param("cuda"),
            f" {arch}: nvcc not found on PATH; install a CUDA toolkit (NVIDIA's, Debian's nvidia-cuda-toolkit, or pip's nvidia-cuda-nvcc) and put its bin/ on PATH, or build for the CPU (no ",
            Param("cuda"),
            ") or Vulkan (",
            Param("vulkan"),
            ")",
        )
    if toolkit.archs and arch not in toolkit.archs:
        card = " (GTX 1650 Ti and other Turing cards: CUDA 10.0 to 13.x)" if arch == "75" else ""
        raise BuildError(
            Param("cuda"),
            f" {arch}: CUDA {toolkit.version} at {toolkit.root} cannot compile for sm_{arch} (`nvcc --list-gpu-arch` lists {', '.join(toolkit.archs)}); use a toolkit that lists compute_{arch}{card}",
        )
    return toolkit


def system_cublas(toolkit: CudaToolkit) -> Cublas | None:
    """cuBLAS from the toolkit or the system (Debian's nvidia-cuda-toolkit puts it in
    /usr/include and /usr/lib/<triplet>), or None."""
    triplet = f"{platform.machine()}-linux-gnu"
    libs = [*toolkit.lib_dirs(), Path("/usr/lib") / triplet, Path("/usr/lib64")]
    return find_cublas([*toolkit.include_dirs(), Path("/usr/include")], libs)


def find_cublas(
    include_dirs: list[Path], lib_dirs: list[Path], source: str = "system", package: str = ""
) -> Cublas | None:
    """The first folder with ``cublas_v2.h`` and the first with both ``libcublas`` and
    ``libcublasLt`` (``.so`` or ``.so.N``, as wheels ship them), or None."""
    header = next((d for d in include_dirs if (d / "cublas_v2.h").is_file()), None)
    lib_dir = next((d for d in lib_dirs if _so(d, "cublas") and _so(d, "cublasLt")), None)
    if header is None or lib_dir is None:
        return None
    cublas, cublas_lt = _so(lib_dir, "cublas"), _so(lib_dir, "cublasLt")
    assert cublas is not None and cublas_lt is not None  # lib_dir was chosen for holding both
    return Cublas(source, header, lib_dir, (cublas, cublas_lt), package)


def _so(folder: Path, name: str) -> Path | None:
    """``lib<name>.so``, else the highest ``lib<name>.so.N`` in ``folder``."""
    if (folder / f"lib{name}.so").is_file():
        return folder / f"lib{name}.so"
    found = sorted(folder.glob(f"lib{name}.so.[0-9]*")) if folder.is_dir() else []
    return found[-1] if found else None


def wheel_cublas(toolkit: CudaToolkit, cache: Path, log=print, checksum_file: Path = CUBLAS_CHECKSUMS) -> Cublas:
    """cuBLAS for ``toolkit``'s CUDA major version from NVIDIA's pinned wheel: fetched with
    pip, sha256 checked, unpacked once into ``<cache>/<package>-<version>``."""
    pins = parse_wheel_pins(checksums.read(checksum_file).entries) if checksum_file.is_file() else []
    pin = wheel_pin_for(pins, toolkit.major, platform.machine())
    if pin is None:
        raise BuildError(
            f"{checksum_file.name}: no cuBLAS wheel pinned for CUDA {toolkit.major} on {platform.machine()}, and CUDA {toolkit.version} at {toolkit.root} has no cuBLAS; install cuBLAS with the toolkit or add the wheel's sha256 there"
        )
    dest = cache / f"{pin.package}-{pin.version}"
    if not (dest / ".sha256").is_file() or (dest / ".sha256").read_text().strip() != pin.sha256:
        _fetch_wheel(pin, dest, log)
    # nvidia/cu13/{lib,include} in the CUDA 13 wheel, nvidia/cublas/{lib,include} in the cu12 one
    lib_dirs = sorted(dest.glob("nvidia/*/lib"))
    cublas = find_cublas([d.parent / "include" for d in lib_dirs], lib_dirs, "wheel", f"{pin.package}=={pin.version}")
    if cublas is None:
        raise BuildError(f"{dest}: no nvidia/*/lib/libcublas.so.* with include/cublas_v2.h; delete it and run again")
    return cublas


def _fetch_wheel(pin: WheelPin, dest: Path, log) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheel-", dir=dest.parent) as tmp:
        log(f"fetching {pin.package}=={pin.version} (cuBLAS) with pip")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest", tmp]
        proc = subprocess.run([*cmd, f"{pin.package}=={pin.version}"], capture_output=True, text=True)
        wheel = Path(tmp) / pin.filename
        if not wheel.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BuildError(
                f"pip download {pin.package}=={pin.version} did not give {pin.filename} ({tail[0]}); check access to the package registry"
            )
        unpack_wheel(wheel, pin, dest)


def unpack_wheel(wheel: Path, pin: WheelPin, dest: Path) -> Path:
    """Check ``wheel``'s sha256 against ``pin``, then unpack its ``nvidia/`` tree into
    ``dest`` (staged beside it, renamed into place) with a ``.sha256`` marker; delete the wheel."""
    digest = sha256_file(wheel)
    if digest != pin.sha256:
        raise BuildError(f"{wheel}: sha256 {digest} differs from {pin.sha256} pinned in {CUBLAS_CHECKSUMS.name}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".unpack-", dir=dest.parent) as tmp:
        staged = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(staged, members=[n for n in z.namelist() if n.startswith("nvidia/")])
        (staged / ".sha256").write_text(pin.sha256 + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(staged, dest)
    wheel.unlink()  # 400+ MB; the unpacked folder is what builds use
    return dest


def find_driver_library(toolkit: CudaToolkit) -> tuple[Path, str] | None:
    """``libcuda.so`` to link against: the installed driver's, or the toolkit's stub."""
    triplet = f"{platform.machine()}-linux-gnu"
    for d in (Path("/usr/lib") / triplet, Path("/usr/lib64"), Path("/usr/lib")):
        for name in ("libcuda.so", "libcuda.so.1"):
            if (d / name).is_file():
                return d / name, "system"
    for d in toolkit.lib_dirs():
        if (d / "stubs" / "libcuda.so").is_file():
            return d / "stubs" / "libcuda.so", "toolkit stub"
    return None


def generate_driver_stub(toolkit: CudaToolkit, dest: Path, min_symbols: int = 100) -> Path:
    """Build ``dest/libcuda.so`` (soname ``libcuda.so.1``) exporting every function in
    the toolkit's ``cuda.h``: what NVIDIA's ``stubs/libcuda.so`` is, for toolkits without it."""
    header = next((d for d in toolkit.include_dirs() if (d / "cuda.h").is_file()), None)
    cc = shutil.which("cc") or shutil.which("gcc")
    if header is None or cc is None:
        raise BuildError(
            f"no libcuda.so to link against (no NVIDIA driver, no {toolkit.root}/lib64/stubs) and no {'cuda.h' if header is None else 'C compiler'} to make a stub from; install the NVIDIA driver or a full CUDA toolkit"
        )
    pre = subprocess.run(
        [cc, "-E", "-P", f"-I{header}", "-x", "c", "-"], input="#include <cuda.h>\n", capture_output=True, text=True
    )
    symbols = driver_symbols(pre.stdout) if pre.returncode == 0 else []
    if len(symbols) < min_symbols:  # CUDA 12/13's cuda.h declares 400+; far fewer means it was not read
        raise BuildError(f"{header / 'cuda.h'}: found {len(symbols)} driver functions; cannot make a libcuda stub")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "libcuda.c").write_text(stub_source(symbols))
    out = dest / "libcuda.so"
    proc = subprocess.run(
        [cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out), str(dest / "libcuda.c")],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"{dest / 'libcuda.c'}: the libcuda link stub did not compile ({proc.stderr.strip()[:200]})")
    return out


def cuda_setup(arch: str, work: Path, cache: Path, log=print) -> CudaSetup:
    """Toolkit, cuBLAS (system, else the pinned wheel unpacked under ``cache``) and a
    ``libcuda.so`` to link with (a generated stub goes under ``work``, the build's temp dir)."""
    toolkit = require_cuda_toolkit(arch)
    cublas = system_cublas(toolkit) or wheel_cublas(toolkit, cache, log=log)
    found = find_driver_library(toolkit)
    if found is None:
        driver, source = generate_driver_stub(toolkit, work / "libcuda-stub"), "generated stub"
    else:
        driver, source = found
    return CudaSetup(toolkit, cublas, driver, source)
