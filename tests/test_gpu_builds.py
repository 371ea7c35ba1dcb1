"""CUDA and Vulkan builds of llama.cpp without compiling them: toolkit discovery, the cuBLAS
wheel, the libcuda link stub, CMake arguments, the errors, and what `doctor` reads back.

The real compiles take an hour on 2 cores and are run by hand (docs/building-llama-cpp.md); a fake
``nvcc`` here is a stand-in for a toolkit, the code under test is what reads it.
"""

import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gguf_exact import doctor
from gguf_exact.builds import gpu_toolchains, llama_build, vulkan_tools
from gguf_exact.builds.gpu_toolchains import (
    Cublas,
    CudaSetup,
    CudaToolkit,
    WheelPin,
    driver_symbols,
    find_cublas,
    missing_libraries,
    parse_gpu_archs,
    parse_nvcc_root,
    parse_nvcc_version,
    parse_wheel_pins,
    wheel_pin_for,
)
from gguf_exact.builds.llama_build import COMMIT, TARGETS, backend_name, build_command, cmake_args
from gguf_exact.cli import main
from gguf_exact.engines.shared.profiles import load_profile
from gguf_exact.errors import GgufExactError
from gguf_exact.hub import checksums

NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
CUBLAS13_SHA = "ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171"


def _fake_nvcc(bin_dir: Path, root: Path, archs: str) -> None:
    """An ``nvcc`` that answers --version, --list-gpu-arch and --dryrun like CUDA 13.0's."""
    bin_dir.mkdir(parents=True)
    (bin_dir / "nvcc").write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --version) printf '%s' '{NVCC_VERSION}';;\n"  # shell builtins only: PATH holds just this folder
        f"  --list-gpu-arch) for a in {archs}; do echo compute_$a; done;;\n"
        f"  --dryrun) echo '#$ _NVVM_BRANCH_=nvvm' >&2; echo '#$ _HERE_={root}/bin' >&2;;\n"
        "  *) exit 1;;\n"
        "esac\n"
    )
    (bin_dir / "nvcc").chmod(0o755)


def _toolkit(root: Path) -> CudaToolkit:
    (root / "lib64").mkdir(parents=True, exist_ok=True)
    (root / "lib64" / "libcudart.so.13").write_bytes(b"")
    (root / "include").mkdir(exist_ok=True)
    (root / "include" / "cuda_runtime.h").write_text("/* cuda */\n")
    return CudaToolkit(root, root / "bin" / "nvcc", "13.0.88", ("75", "86"))


def _wheel_tree(base: Path, sub: str = "cu13", major: int = 13) -> Path:
    (base / "nvidia" / sub / "lib").mkdir(parents=True)
    (base / "nvidia" / sub / "include").mkdir(parents=True)
    (base / "nvidia" / sub / "include" / "cublas_v2.h").write_text("/* cublas */\n")
    for lib in ("cublas", "cublasLt"):
        (base / "nvidia" / sub / "lib" / f"lib{lib}.so.{major}").write_bytes(b"\x7fELF")
    return base / "nvidia" / sub


def test_nvcc_output_parsing():
    assert parse_nvcc_version(NVCC_VERSION) == "13.0.88"
    assert parse_nvcc_version("Cuda compilation tools, release 12.4") == "12.4"
    assert parse_nvcc_version("no version here") is None
    assert parse_gpu_archs("compute_75\ncompute_80\ncompute_86\ncompute_90a\ncompute_120\n") == (
        "75",
        "80",
        "86",
        "90",
        "120",
    )
    assert parse_gpu_archs("nvcc fatal: Unknown option") == ()
    dryrun = "#$ _NVVM_BRANCH_=nvvm\n#$ _HERE_=/usr/local/cuda-13.0/bin\n#$ _THERE_=/usr/local/cuda-13.0/bin\n"
    assert parse_nvcc_root(dryrun) == Path("/usr/local/cuda-13.0")
    assert parse_nvcc_root("") is None
    ldd = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n"
        "\tlibcudart.so.13 => /usr/local/cuda-13.0/lib/libcudart.so.13 (0x00007f22)\n"
        "\tlibcuda.so.1 => not found\n"
        "\tlibcublasLt.so.13 => not found\n"
    )
    assert missing_libraries(ldd) == ["libcuda.so.1", "libcublasLt.so.13"]
    assert missing_libraries("\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n") == []


def test_toolkit_found_through_nvcc_on_path(tmp_path, monkeypatch):
    # a wrapper script on PATH (as /usr/local/bin/nvcc is here) still leads to the toolkit root
    root = tmp_path / "cuda-13.0"
    _fake_nvcc(tmp_path / "bin", root, "75 80 86")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    t = gpu_toolchains.find_cuda_toolkit()
    assert t == CudaToolkit(root, tmp_path / "bin" / "nvcc", "13.0.88", ("75", "80", "86"))
    assert t.major == 13 and gpu_toolchains.require_cuda_toolkit("86") == t


def test_arch_the_toolkit_cannot_compile(tmp_path, monkeypatch):
    _fake_nvcc(tmp_path / "bin", tmp_path / "cuda", "80 86 90")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("GGUF_EXACT_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(main, ["build-llama", "--cuda", "75"])
    assert r.exit_code == 1
    assert r.output.strip().splitlines()[-1] == (
        f"error: --cuda 75: CUDA 13.0.88 at {tmp_path / 'cuda'} cannot compile for sm_75 (`nvcc --list-gpu-arch` "
        "lists 80, 86, 90); use a toolkit that lists compute_75 (GTX 1650 Ti and other Turing cards: CUDA 10.0 to 13.x)"
    )


def test_no_nvcc_and_no_glslc_are_one_line_errors(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("VULKAN_SDK", raising=False)
    monkeypatch.setenv("GGUF_EXACT_CACHE", str(tmp_path / "cache"))  # no cached build answers first
    r = CliRunner().invoke(main, ["build-llama", "--cuda", "86"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.startswith("error: --cuda 86: nvcc not found on PATH; install a CUDA toolkit")
    r = CliRunner().invoke(main, ["build-llama", "--vulkan"])
    assert r.exit_code == 1 and r.output.startswith("error: --vulkan: glslc not found; install them (Debian: apt-get")
    r = CliRunner().invoke(main, ["build-llama", "--vulkan", "--cuda", "86"])
    assert r.exit_code == 1 and "choose one backend per build" in r.output
    assert not (tmp_path / "cache" / "llama.cpp").exists()  # nothing started, nothing half-made


def test_backend_names_and_build_commands():
    assert [backend_name(None), backend_name("75"), backend_name(None, vulkan=True)] == ["cpu", "cuda75", "vulkan"]
    assert [build_command(b) for b in ("cpu", "cuda75", "cuda86", "vulkan")] == [
        "gguf-exact build-llama",
        "gguf-exact build-llama --cuda 75",
        "gguf-exact build-llama --cuda 86",
        "gguf-exact build-llama --vulkan",
    ]


def test_cmake_arguments_for_wheel_cublas_and_vulkan(tmp_path):
    toolkit = _toolkit(tmp_path / "cuda")
    lib = _wheel_tree(tmp_path / "wheel") / "lib"
    cublas = find_cublas([lib.parent / "include"], [lib], "wheel", "nvidia-cublas==13.1.0.3")
    assert cublas == Cublas(
        "wheel",
        lib.parent / "include",
        lib,
        (lib / "libcublas.so.13", lib / "libcublasLt.so.13"),
        "nvidia-cublas==13.1.0.3",
    )
    setup = CudaSetup(toolkit, cublas, tmp_path / "stub" / "libcuda.so", "generated stub")
    args = cmake_args(Path("s"), Path("b"), "cuda86", setup)
    assert args[args.index("-DGGML_CUDA=ON") :] == [
        "-DGGML_CUDA=ON",
        "-DCMAKE_CUDA_ARCHITECTURES=86",
        f"-DCMAKE_CUDA_COMPILER={tmp_path / 'cuda' / 'bin' / 'nvcc'}",
        f"-DCUDAToolkit_ROOT={tmp_path / 'cuda'}",
        f"-DCUDA_cuda_driver_LIBRARY={tmp_path / 'stub' / 'libcuda.so'}",
        f"-DCUDA_cublas_LIBRARY={lib / 'libcublas.so.13'}",
        f"-DCUDA_cublasLt_LIBRARY={lib / 'libcublasLt.so.13'}",
        f"-DCMAKE_CUDA_FLAGS=-isystem {lib.parent / 'include'}",
        "-DCMAKE_SKIP_BUILD_RPATH=ON",
        # libcudart's folder and the wheel's; never the build-local stub's
        f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath,{tmp_path / 'cuda' / 'lib64'}:{lib}",
    ]
    system = CudaSetup(
        toolkit,
        Cublas("system", toolkit.root / "include", toolkit.root / "lib64", (Path("a"), Path("b"))),
        Path("/usr/lib/libcuda.so"),
        "system",
    )
    sys_args = cmake_args(Path("s"), Path("b"), "cuda75", system)
    assert "-DCMAKE_CUDA_ARCHITECTURES=75" in sys_args and not any("cublas" in a for a in sys_args)
    assert sys_args[-1] == f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath,{tmp_path / 'cuda' / 'lib64'}"
    with pytest.raises(ValueError, match="needs a CudaSetup"):
        cmake_args(Path("s"), Path("b"), "cuda86")
    vk = cmake_args(Path("s"), Path("b"), "vulkan")
    assert vk[-1] == "-DGGML_VULKAN=ON" and not any("CUDA" in a for a in vk)
    tools = vulkan_tools.VulkanTools(Path("/sdk/bin/glslc"), "shaderc 2025.2", Path("/sdk/include"), "1.4.309")
    assert cmake_args(Path("s"), Path("b"), "vulkan", vulkan=tools)[-3:] == [
        "-DGGML_VULKAN=ON",
        "-DVulkan_INCLUDE_DIR=/sdk/include",
        "-DVulkan_GLSLC_EXECUTABLE=/sdk/bin/glslc",
    ]
    assert llama_build.toolchain_info(None, tools) == {
        "glslc": "shaderc 2025.2",
        "vulkan_headers": "1.4.309 (/sdk/include)",
    }
    info = llama_build.toolchain_info(setup, None)
    assert info["cublas"] == {"source": "wheel", "package": "nvidia-cublas==13.1.0.3", "lib_dir": str(lib)}
    assert info["min_driver"] == "580.65.06" and info["driver_link"]["source"] == "generated stub"


def test_cublas_discovery_needs_header_and_both_libraries(tmp_path):
    sub = _wheel_tree(tmp_path / "w")
    (sub / "lib" / "libcublasLt.so.13").unlink()
    assert find_cublas([sub / "include"], [sub / "lib"]) is None
    (sub / "lib" / "libcublasLt.so").write_bytes(b"")
    (sub / "include" / "cublas_v2.h").unlink()
    assert find_cublas([sub / "include"], [sub / "lib"]) is None


def test_pinned_cublas_wheels():
    pins = parse_wheel_pins(checksums.read(gpu_toolchains.CUBLAS_CHECKSUMS).entries)
    assert [(p.package, p.version, p.cuda_major) for p in pins] == [
        ("nvidia-cublas", "13.1.0.3", 13),
        ("nvidia-cublas-cu12", "12.9.1.4", 12),
    ]
    assert wheel_pin_for(pins, 13, "x86_64").sha256 == CUBLAS13_SHA
    assert (
        wheel_pin_for(pins, 12, "x86_64").filename == "nvidia_cublas_cu12-12.9.1.4-py3-none-manylinux_2_27_x86_64.whl"
    )
    assert wheel_pin_for(pins, 11, "x86_64") is None and wheel_pin_for(pins, 13, "aarch64") is None


def test_wheel_cublas_uses_the_unpacked_wheel_and_refuses_other_majors(tmp_path):
    cache = tmp_path / "cuda-cache"
    dest = cache / "nvidia-cublas-13.1.0.3"
    lib = _wheel_tree(dest) / "lib"
    (dest / ".sha256").write_text(CUBLAS13_SHA + "\n")
    toolkit = _toolkit(tmp_path / "cuda")
    got = gpu_toolchains.wheel_cublas(toolkit, cache, log=lambda m: pytest.fail(f"fetched: {m}"))
    assert (got.source, got.package, got.lib_dir, got.libraries[1]) == (
        "wheel",
        "nvidia-cublas==13.1.0.3",
        lib,
        lib / "libcublasLt.so.13",
    )
    old = CudaToolkit(toolkit.root, toolkit.nvcc, "11.8.89", ("75", "86"))
    with pytest.raises(GgufExactError, match="no cuBLAS wheel pinned for CUDA 11 on"):
        gpu_toolchains.wheel_cublas(old, cache)


def test_unpack_wheel_checks_sha256(tmp_path):
    wheel = tmp_path / "nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("nvidia/cu13/lib/libcublas.so.13", b"lib")
        z.writestr("nvidia/cu13/lib/libcublasLt.so.13", b"lt")
        z.writestr("nvidia/cu13/include/cublas_v2.h", b"h")
        z.writestr("nvidia_cublas-13.1.0.3.dist-info/RECORD", b"")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    bad = WheelPin("nvidia-cublas", "13.1.0.3", wheel.name, "00" * 32, 13)
    with pytest.raises(GgufExactError, match=f"sha256 {digest} differs from {'00' * 32}"):
        gpu_toolchains.unpack_wheel(wheel, bad, tmp_path / "out")
    assert not (tmp_path / "out").exists() and wheel.is_file()
    dest = gpu_toolchains.unpack_wheel(
        wheel, WheelPin("nvidia-cublas", "13.1.0.3", wheel.name, digest, 13), tmp_path / "out"
    )
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        ".sha256",
        "nvidia/cu13/include/cublas_v2.h",
        "nvidia/cu13/lib/libcublas.so.13",
        "nvidia/cu13/lib/libcublasLt.so.13",
    ]
    assert (dest / "nvidia/cu13/lib/libcublasLt.so.13").read_bytes() == b"lt" and not wheel.exists()


def _fake_cuda_h(include: Path, extra: int) -> None:
    include.mkdir(parents=True, exist_ok=True)
    decls = "".join(f"CUresult CUDAAPI cuFake{i}(int x);\n" for i in range(extra))
    (include / "cuda.h").write_text(
        "typedef int CUresult;\n#define CUDAAPI\n#define cuMemGetInfo cuMemGetInfo_v2\n"
        "CUresult CUDAAPI cuMemGetInfo(unsigned long *free, unsigned long *total);\n"
        "CUresult CUDAAPI\ncuDeviceGet(int *device, int ordinal);\n" + decls
    )


def test_driver_symbols_follow_cuda_h_renames():
    text = "CUresult CUDAAPI cuMemGetInfo_v2(size_t *a);\nCUresult cuInit(unsigned int f);\nint cuNotDriver(void);\n"
    assert driver_symbols(text) == ["cuInit", "cuMemGetInfo_v2"]
    assert gpu_toolchains.stub_source(["cuInit"]) == "void cuInit(void) {}\n"


def test_generated_libcuda_stub(tmp_path):
    toolkit = _toolkit(tmp_path / "cuda")
    _fake_cuda_h(toolkit.root / "include", 120)
    stub = gpu_toolchains.generate_driver_stub(toolkit, tmp_path / "stub")
    assert stub == tmp_path / "stub" / "libcuda.so"
    dyn = subprocess.run(["readelf", "-d", str(stub)], capture_output=True, text=True).stdout
    assert "Library soname: [libcuda.so.1]" in dyn  # the binary will ask for the driver's libcuda.so.1
    names = subprocess.run(["nm", "-D", "--defined-only", str(stub)], capture_output=True, text=True).stdout.split()
    assert "cuMemGetInfo_v2" in names and "cuDeviceGet" in names and "cuFake119" in names
    assert "cuMemGetInfo" not in names
    _fake_cuda_h(toolkit.root / "include", 3)
    with pytest.raises(GgufExactError, match=r"cuda.h: found 5 driver functions; cannot make a libcuda stub"):
        gpu_toolchains.generate_driver_stub(toolkit, tmp_path / "stub2")


def _cached_build(cache: Path, backend: str, info: dict | None, server: str) -> Path:
    folder = cache / "llama.cpp" / llama_build.build_key(backend)
    (folder / "bin").mkdir(parents=True)
    for t in TARGETS:
        (folder / "bin" / t).write_text("#!/bin/sh\necho 'version: 1 (0c1e57098)'\n")
        (folder / "bin" / t).chmod(0o755)
    if server:
        shutil.copy2(server, folder / "bin" / "llama-server")
    if info is not None:
        (folder / "build-info.json").write_text(json.dumps(info))
    return folder


def test_doctor_reports_what_each_build_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_EXACT_CACHE", str(tmp_path))
    cuda_info = {
        "backend": "cuda86",
        "build_seconds": 3600.4,
        "jobs": 2,
        "cuda_toolkit": {"version": "13.0.88", "root": "/usr/local/cuda-13.0", "nvcc": "/usr/local/cuda-13.0/bin/nvcc"},
        "cublas": {"source": "wheel", "package": "nvidia-cublas==13.1.0.3", "lib_dir": "/c/nvidia/cu13/lib"},
        "min_driver": "580.65.06",
    }
    assert doctor.describe_build(cuda_info) == (
        "CUDA 13.0.88 (/usr/local/cuda-13.0), cuBLAS nvidia-cublas==13.1.0.3 wheel (/c/nvidia/cu13/lib), "
        "needs NVIDIA driver >= 580.65.06, built in 3600 s with -j2"
    )
    system = {**cuda_info, "cublas": {"source": "system", "lib_dir": "/usr/lib/x86_64-linux-gnu"}}
    assert "cuBLAS system (/usr/lib/x86_64-linux-gnu)" in doctor.describe_build(system)
    vk_info = {"glslc": "shaderc 2023.2-1", "vulkan_headers": "1.4.309 (/sdk/include)", "build_seconds": 900}
    assert doctor.describe_build(vk_info) == (
        "glslc: shaderc 2023.2-1, Vulkan headers 1.4.309 (/sdk/include), built in 900 s"
    )

    # a real ELF that needs a library no machine has: doctor says it is broken and how to rebuild
    src = tmp_path / "main.c"
    src.write_text("void cuGone(void); int main(void) { cuGone(); return 0; }\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "stub.c").write_text("void cuGone(void) {}\n")
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libgguf_exact_gone.so.1",
            "-o",
            str(tmp_path / "lib" / "libgone.so"),
            str(tmp_path / "lib" / "stub.c"),
        ],
        check=True,
    )
    subprocess.run(["cc", "-o", str(tmp_path / "srv"), str(src), f"-L{tmp_path / 'lib'}", "-lgone"], check=True)
    _cached_build(tmp_path, "cuda86", cuda_info, str(tmp_path / "srv"))
    _cached_build(tmp_path, "vulkan", {"glslc": "shaderc 2023.2-1", "build_seconds": 900, "jobs": 2}, "")
    (tmp_path / "llama.cpp" / llama_build.build_key("cuda75")).mkdir()  # an interrupted or removed build
    (tmp_path / "llama.cpp" / ".build-cuda75-x1y2").mkdir()  # a build in progress is not listed
    (tmp_path / "llama.cpp" / f"{COMMIT}-cpu-other.cpu").mkdir()  # another machine's CPU: not listed
    found = {f.name: f for f in doctor.server_builds()}
    assert list(found) == ["llama-server (cuda75)", "llama-server (cuda86)", "llama-server (vulkan)"]
    assert found["llama-server (cuda75)"].value == "not built; run `gguf-exact build-llama --cuda 75`"
    bad = found["llama-server (cuda86)"]
    assert not bad.ok and bad.value == (
        f"{tmp_path}/llama.cpp/{llama_build.build_key('cuda86')}/bin/llama-server: missing libgguf_exact_gone.so.1; "
        "run `gguf-exact build-llama --cuda 86 --force`"
    )
    vk = found["llama-server (vulkan)"]
    assert vk.ok and vk.value == (
        f"{tmp_path}/llama.cpp/{llama_build.build_key('vulkan')}/bin/llama-server  [version: 1 (0c1e57098); glslc: shaderc 2023.2-1, built in 900 s with -j2]"
    )
    # the one library allowed to be missing is the NVIDIA driver's, on a machine without one
    monkeypatch.setattr(doctor, "unresolved_libraries", lambda binary: ["libcuda.so.1"])
    assert doctor.build_finding("cuda86").value.endswith(
        "needs NVIDIA driver >= 580.65.06, built in 3600 s with -j2; runs where the NVIDIA driver is: not here]"
    )


def test_gtx1650ti_has_a_vulkan_variant():
    cuda, vulkan = load_profile("gtx1650ti"), load_profile("gtx1650ti-vulkan")
    assert (cuda.build, vulkan.build) == ("cuda75", "vulkan")
    assert vulkan.draft_table == cuda.draft_table and vulkan.server_table["ctx-size"] == cuda.server_table["ctx-size"] == 4096
    assert vulkan.server_table["flash-attn"] == "auto"
    text = (Path(llama_build.__file__).parents[2] / "serve" / "gtx1650ti-vulkan.toml").read_text()
    assert (
        "#26017" in text
        and "gtx1650ti-vulkan" in (Path(llama_build.__file__).parents[2] / "serve" / "gtx1650ti.toml").read_text()
    )
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            assert "#" in line, line
    with pytest.raises(GgufExactError, match="expected 'cpu', 'vulkan' or 'cudaNN'"):
        cuda.with_overrides(["build=metal"])
    assert cuda.with_overrides(["build=vulkan"]).build == "vulkan"


def test_makefile_passes_the_backend():
    text = (Path(llama_build.__file__).parents[2] / "Makefile").read_text()
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "-f", "-", "llama-server", "CUDA=86"],
        input=text.replace("llama-server: setup", "llama-server:"),
        capture_output=True,
        text=True,
        cwd=Path(llama_build.__file__).parents[2],
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")},
    )
    assert out.stdout.strip() == "scripts/build-llama-cpp.sh --cuda 86"
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "-f", "-", "llama-server", "VULKAN=1"],
        input=text.replace("llama-server: setup", "llama-server:"),
        capture_output=True,
        text=True,
        cwd=Path(llama_build.__file__).parents[2],
    )
    assert out.stdout.strip() == "scripts/install-vulkan-deps.sh && scripts/build-llama-cpp.sh --vulkan"


def test_doctor_toolkit_and_vulkan_lines(tmp_path, monkeypatch):
    root = tmp_path / "cuda-12.8"
    _fake_nvcc(tmp_path / "bin", root, "75 86")
    _wheel_tree(tmp_path / "w")  # a cuBLAS the toolkit ships, in its own lib64/ and include/
    shutil.copytree(tmp_path / "w" / "nvidia" / "cu13" / "lib", root / "lib64")
    shutil.copytree(tmp_path / "w" / "nvidia" / "cu13" / "include", root / "include")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("VULKAN_SDK", raising=False)
    f = doctor.cuda()
    assert f.ok and f.value == f"13.0.88 at {root}; sm_75 yes, sm_86 yes; cuBLAS system ({root / 'lib64'})"
    v = doctor.vulkan()
    assert not v.ok and v.value.startswith("glslc not found; install them (Debian: apt-get install libvulkan-dev")
    (tmp_path / "bin" / "nvcc").unlink()
    assert doctor.cuda() == doctor.Finding("CUDA toolkit", "nvcc not found on PATH (no --cuda builds)", False)


VULKAN_CORE_H = """#define VK_HEADER_VERSION 309
#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 4, VK_HEADER_VERSION)
"""


def _vulkan_sdk(sdk: Path, extension: bool) -> None:
    (sdk / "include" / "vulkan").mkdir(parents=True)
    (sdk / "bin").mkdir()
    text = VULKAN_CORE_H + ("#define VK_EXT_layer_settings 1\n" if extension else "")
    (sdk / "include" / "vulkan" / "vulkan_core.h").write_text(text)
    (sdk / "bin" / "glslc").write_text("#!/bin/sh\necho 'shaderc v2025.2 v2025.2'\necho 'spirv-tools v2025.1'\n")
    (sdk / "bin" / "glslc").chmod(0o755)


def test_vulkan_headers_checked_before_building(tmp_path, monkeypatch):
    assert vulkan_tools.parse_vulkan_header_version(VULKAN_CORE_H) == "1.4.309"
    assert vulkan_tools.parse_vulkan_header_version("#define VK_HEADER_VERSION 239\n") == "239"
    assert vulkan_tools.parse_vulkan_header_version("nothing") is None
    _vulkan_sdk(tmp_path / "sdk", extension=True)
    monkeypatch.setenv("VULKAN_SDK", str(tmp_path / "sdk"))
    assert vulkan_tools.require_vulkan_tools() == vulkan_tools.VulkanTools(
        tmp_path / "sdk" / "bin" / "glslc", "shaderc v2025.2 v2025.2", tmp_path / "sdk" / "include", "1.4.309"
    )
    # headers as old as Debian 12's (1.3.239): stopped with one line, before anything is fetched
    _vulkan_sdk(tmp_path / "old", extension=False)
    (tmp_path / "old" / "include" / "vulkan" / "vulkan_core.h").write_text(
        VULKAN_CORE_H.replace("309", "239").replace("1, 4,", "1, 3,")
    )
    monkeypatch.setenv("VULKAN_SDK", str(tmp_path / "old"))
    monkeypatch.setenv("GGUF_EXACT_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(main, ["build-llama", "--vulkan"])
    assert r.exit_code == 1 and r.output.startswith(
        f"error: --vulkan: the Vulkan headers in {tmp_path / 'old' / 'include'} are version 1.3.239, without "
        "VK_EXT_layer_settings, which the pinned llama.cpp's Vulkan backend uses"
    )
    assert not (tmp_path / "cache" / "llama.cpp").exists()


def _fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    """A fat binary as nvcc lays it out: header, then per entry a 64-byte header and payload."""
    body = b""
    for kind, arch, payload in entries:
        header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(payload), 0, 0, 0, 8, arch, 0, 0, 0, 0, 0)
        body += header.ljust(64, b"\0") + payload
    return struct.pack("<IHHQ", gpu_toolchains.FATBIN_MAGIC, 1, 16, len(body)) + body


def test_gpu_code_read_from_the_binary(tmp_path):
    section = (
        _fatbin([(2, 86, b"\x7fELF" + b"\0" * 60), (1, 86, b"ptx text" * 3)])
        + b"\0" * 8  # padding between fat binaries
        + _fatbin([(2, 86, b"cubin"), (1, 86, b"ptx"), (2, 75, b"cubin75")])
    )
    assert gpu_toolchains.fatbin_archs(section) == {"sm_86": 2, "compute_86": 2, "sm_75": 1}
    assert gpu_toolchains.fatbin_archs(b"\0" * 64) == {}
    # the same bytes as the .nv_fatbin section of a real ELF, found through readelf
    (tmp_path / "m.c").write_text("int main(void) { return 0; }\n")
    (tmp_path / "blob").write_bytes(section)
    subprocess.run(["cc", "-o", str(tmp_path / "exe"), str(tmp_path / "m.c")], check=True)
    subprocess.run(
        ["objcopy", f"--add-section=.nv_fatbin={tmp_path / 'blob'}", str(tmp_path / "exe"), str(tmp_path / "gpu")],
        check=True,
    )
    assert gpu_toolchains.binary_gpu_archs(tmp_path / "gpu") == {"sm_86": 2, "compute_86": 2, "sm_75": 1}
    assert gpu_toolchains.binary_gpu_archs(tmp_path / "exe") == {}


@pytest.mark.llama_server
def test_killed_build_stops_its_tools_and_leaves_nothing(tmp_path):
    # a real build (the CPU one, from the pinned sdist already fetched for `make test`),
    # killed with SIGTERM while CMake runs: exit 130, no temp dir, no process left behind
    sdist = llama_build.cache_root() / "sdist" / llama_build.pinned_sdist().filename
    assert sdist.is_file(), f"{sdist}: missing; run `make llama-server` first"
    env = {**os.environ, "GGUF_EXACT_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "gguf_exact.builds.llama_build", "--sdist", str(sdist)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "cache" / "logs" / f"llama.cpp-{llama_build.build_key('cpu')}.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and "$ cmake -S" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # CMake is now probing compilers in its own process group
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted; nothing was installed"
    assert [p.name for p in (tmp_path / "cache" / "llama.cpp").iterdir()] == []
    time.sleep(0.5)
    assert _processes_naming(str(tmp_path)) == []


def _processes_naming(marker: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:
            pass
    return found


def test_interrupted_step_stops_grandchildren(tmp_path):
    # as ninja runs compilers under cmake: a grandchild that would outlive a killed child
    marker = str(tmp_path / "grandchild")
    script = (
        "import sys; from pathlib import Path\n"
        "from gguf_exact.builds import llama_build\n"
        "with llama_build.sigterm_as_interrupt():\n"
        f"    llama_build._run(['sh', '-c', '{sys.executable} -c \"import time; time.sleep(300)\" {marker} & wait'],"
        f" Path({str(tmp_path / 'log')!r}), print, 'build', every=0.2)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    grandchild = marker + "\0"  # its last argument; in the parent's and sh's command lines a space follows
    try:
        deadline = time.monotonic() + 30
        while not _processes_naming(grandchild) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_processes_naming(grandchild)) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGINT and err.strip().splitlines()[-1] == "KeyboardInterrupt"
    time.sleep(0.3)
    assert _processes_naming(marker) == []
