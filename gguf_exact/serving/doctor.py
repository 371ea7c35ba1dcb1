"""What this machine has for serving: bindings, llama-server builds, CUDA, GPUs.

Each finding is a (name, value, ok) row; nothing here fails, it only reports.
"""

import platform
import shutil
import subprocess
from dataclasses import dataclass

from gguf_exact.errors import GgufExactError
from gguf_exact.hub import checksums
from gguf_exact.serving.gpu_toolchains import (
    CUBLAS_CHECKSUMS,
    binary_gpu_archs,
    find_cuda_toolkit,
    parse_wheel_pins,
    require_vulkan_tools,
    system_cublas,
    wheel_pin_for,
)
from gguf_exact.serving.llama_build import (
    BACKEND,
    COMMIT,
    build_command,
    find_build,
    install_dir,
    server_version,
    unresolved_libraries,
)


@dataclass(frozen=True)
class Finding:
    name: str
    value: str
    ok: bool


def _run(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout + proc.stderr).strip() if proc.returncode == 0 else None


def bindings() -> Finding:
    try:
        import llama_cpp
    except ImportError:
        return Finding("bindings", "llama-cpp-python not installed (pip install -e '.[llama]')", False)
    try:
        gpu = bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:  # noqa: BLE001 - an old or broken build: report, do not fail
        gpu = False
    return Finding(
        "bindings", f"llama-cpp-python {llama_cpp.__version__}, backend {'GPU offload' if gpu else 'CPU'}", True
    )


def describe_build(info: dict) -> str:
    """What a build's ``build-info.json`` says it was made with, in one line."""
    parts = []
    if "cuda_toolkit" in info:
        t, c = info["cuda_toolkit"], info.get("cublas", {})
        parts.append(f"CUDA {t.get('version', '?')} ({t.get('root', '?')})")
        if c.get("source") == "wheel":
            parts.append(f"cuBLAS {c.get('package', '?')} wheel ({c.get('lib_dir', '?')})")
        elif c:
            parts.append(f"cuBLAS system ({c.get('lib_dir', '?')})")
        if info.get("min_driver"):
            parts.append(f"needs NVIDIA driver >= {info['min_driver']}")
    if info.get("glslc"):
        parts.append(f"glslc: {info['glslc']}")
    if info.get("vulkan_headers"):
        parts.append(f"Vulkan headers {info['vulkan_headers']}")
    if "build_seconds" in info:
        jobs = f" with -j{info['jobs']}" if "jobs" in info else ""
        parts.append(f"built in {info['build_seconds']:.0f} s{jobs}")
    return ", ".join(parts)


def build_finding(backend: str) -> Finding:
    """One llama-server build: where it is, what it was built with, whether it loads here."""
    name = f"llama-server ({backend})"
    build = find_build(backend)
    if build is None:
        return Finding(name, f"not built; run `{build_command(backend)}`", False)
    made_with = describe_build(build.info)
    archs = binary_gpu_archs(build.binary()) if backend.startswith("cuda") else {}
    if archs:  # read from the binary itself: the code it really carries
        made_with = f"GPU code {', '.join(sorted(archs))}; {made_with}"
    missing = unresolved_libraries(build.binary())
    if missing == ["libcuda.so.1"]:
        return Finding(name, f"{build.binary()}  [{made_with}; runs where the NVIDIA driver is: not here]", True)
    if missing:
        return Finding(
            name, f"{build.binary()}: missing {', '.join(missing)}; run `{build_command(backend)} --force`", False
        )
    version = " ".join(server_version(build.binary()).split())
    return Finding(name, f"{build.binary()}  [{'; '.join(x for x in (version, made_with) if x)}]", True)


def server_builds() -> list[Finding]:
    folders = install_dir("cpu").parent.glob(f"{COMMIT}-*")
    backends = sorted({p.name.split("-", 1)[1] for p in folders if BACKEND.fullmatch(p.name.split("-", 1)[-1])})
    return [build_finding(b) for b in backends or ["cpu"]]


def cuda() -> Finding:
    """The toolkit on PATH, the archs it compiles, and the cuBLAS a ``--cuda`` build would use."""
    toolkit = find_cuda_toolkit()
    if toolkit is None:
        return Finding("CUDA toolkit", "nvcc not found on PATH (no --cuda builds)", False)
    archs = f"; sm_75 {'yes' if '75' in toolkit.archs else 'no'}, sm_86 {'yes' if '86' in toolkit.archs else 'no'}"
    cublas = system_cublas(toolkit)
    if cublas is None:
        pins = parse_wheel_pins(checksums.read(CUBLAS_CHECKSUMS).entries)
        pin = wheel_pin_for(pins, toolkit.major, platform.machine())
        cublas_text = (
            f"no cuBLAS here: builds use the {pin.package}=={pin.version} wheel"
            if pin
            else "no cuBLAS here and no wheel pinned for it"
        )
    else:
        cublas_text = f"cuBLAS {cublas.describe()}"
    return Finding(
        "CUDA toolkit", f"{toolkit.version} at {toolkit.root}{archs if toolkit.archs else ''}; {cublas_text}", True
    )


def vulkan() -> Finding:
    try:
        tools = require_vulkan_tools()
        return Finding(
            "Vulkan build tools", f"glslc: {tools.glslc}, headers {tools.header_version} ({tools.include_dir})", True
        )
    except GgufExactError as e:
        return Finding("Vulkan build tools", str(e).removeprefix("--vulkan: "), False)


def gpus() -> Finding:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return Finding("GPUs", "nvidia-smi not found: no NVIDIA GPU visible", False)
    out = _run([smi, "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader"])
    if not out:
        return Finding("GPUs", "nvidia-smi found no usable GPU", False)
    return Finding("GPUs", "; ".join(ln.strip() for ln in out.splitlines()), True)


def diagnose() -> list[Finding]:
    """Every finding, in the order ``gguf-exact doctor`` prints them."""
    return [bindings(), *server_builds(), cuda(), vulkan(), gpus()]
