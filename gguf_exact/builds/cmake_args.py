"""The CMake arguments of both builds: the CPU features named one by one, the backend's (CUDA, Vulkan), and what the toolchains were."""

import shutil
from pathlib import Path

from gguf_exact.builds import gpu_toolchains
from gguf_exact.builds.cpu_features import CpuTarget, host_cpu
from gguf_exact.builds.gpu_toolchains import CudaSetup
from gguf_exact.builds.sdist import COMMIT
from gguf_exact.builds.vulkan_tools import VulkanTools


def cmake_args(
    src: Path,
    build: Path,
    backend: str,
    cuda: CudaSetup | None = None,
    vulkan: VulkanTools | None = None,
    cpu: CpuTarget | None = None,
) -> list[str]:
    """The CMake configure command line for ``backend`` (CUDA needs ``cuda``; ``vulkan``
    pins the headers and glslc that :func:`.vulkan_tools.require_vulkan_tools` checked)."""
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
        "-DGGML_RPC=ON",  # llama-server --rpc and the rpc-server worker (serving across machines)
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


def compiler_cache(base: Path) -> tuple[list[str], dict[str, str]]:
    """ccache as the compiler launcher, when it is on PATH: the CMake options and the
    environment (paths under ``base``, the build's temporary folder, hashed relative to it,
    so two builds in two folders share objects). A rebuild after a patch is edited then
    recompiles only the files the edit reaches. Not in the cache key: ccache returns an
    object only for the same preprocessed source, compiler and flags, so it changes no output."""
    if not shutil.which("ccache"):
        return [], {}
    return (
        ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"],
        {"CCACHE_BASEDIR": str(base), "CCACHE_NOHASHDIR": "1"},
    )


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


__all__ = ["backend_cmake_args", "cmake_args", "cuda_cmake_args", "toolchain_info"]
