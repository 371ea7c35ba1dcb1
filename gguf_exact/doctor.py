"""What this machine has for serving: bindings, llama-server builds, CUDA, GPUs.

Each finding is a (name, value, ok) row; nothing here fails, it only reports.
"""

import importlib.util
import platform
import shutil
import subprocess
from dataclasses import dataclass

from gguf_exact.builds import devices
from gguf_exact.builds.cpu_features import host_cpu
from gguf_exact.builds.gpu_toolchains import (
    CUBLAS_CHECKSUMS,
    binary_gpu_archs,
    find_cuda_toolkit,
    parse_wheel_pins,
    system_cublas,
    wheel_pin_for,
)
from gguf_exact.builds.llama_build import (
    BACKEND,
    COMMIT,
    build_command,
    find_build,
    install_dir,
    server_version,
    unresolved_libraries,
)
from gguf_exact.builds.vulkan_tools import require_vulkan_tools
from gguf_exact.constants import VULKAN_VISIBLE_ENV
from gguf_exact.errors import GgufExactError
from gguf_exact.hub import checksums


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


def bindings() -> list[Finding]:
    """The installed llama-cpp-python: the wheel it came from, its backend and CPU features,
    its probe; and what ``--engine python`` needs beside it (FastAPI, uvicorn)."""
    from gguf_exact.builds.bindings_build import build_command, find_wheel, installed_bindings

    found = installed_bindings()
    if found is None:
        return [Finding("bindings", f"llama-cpp-python not installed; run `{build_command('cpu')} --install`", False)]
    if found.info:
        probe = found.info.get("probe", {})
        ok = probe.get("ok") is not False
        value = (
            f"llama-cpp-python {found.version}, backend {found.backend}, CPU features "
            f"{found.info.get('cpu_features', '?')}, {PROBE_WORDS[probe.get('ok')]} ({found.wheel})"
        )
    else:
        ok = False
        value = (
            f"llama-cpp-python {found.version} not built by gguf-exact (pip's native build traps on "
            f"AMX CPUs); run `{build_command('cpu')} --install`"
        )
    rows = [Finding("bindings", value, ok)]
    if ok and find_wheel(found.backend) is None:
        rows.append(
            Finding(
                "bindings' CPU",
                f"built for other CPU features than this machine's; run `{build_command(found.backend)} --install`",
                False,
            )
        )
    needed = ("fastapi", "uvicorn", "sse_starlette", "starlette_context")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    text = (
        f"missing {', '.join(missing)}; pip install 'llama-cpp-python[server]==0.3.36'"
        if missing
        else ", ".join(needed) + " present"
    )
    rows.append(Finding("--engine python", text, not missing))
    return rows


PROBE_WORDS = {True: "probe passed", None: "probe not run here", False: "probe FAILED"}


def describe_probe(probe: dict, backend: str = "cpu") -> str:
    """A probe record in a few words: how it went and where it ran (``-ngl 99`` on which device)."""
    words = PROBE_WORDS[probe.get("ok")]
    if probe.get("device"):
        shown = f", {VULKAN_VISIBLE_ENV}={probe['visible_devices']}" if probe.get("visible_devices") else ""
        return f"{words} on {probe['device']} (-ngl {probe.get('gpu_layers', '?')}{shown})"
    if backend == "cpu" or probe.get("ok") is None:
        return words
    if "device" in probe:
        return f"{words} on the CPU: no {backend} device here"
    return f"{words} on the CPU (recorded before probes ran on the device; `{build_command(backend)} --reprobe`)"


def describe_build(info: dict) -> str:
    """What a build's ``build-info.json`` says it was made with, in one line."""
    parts = []
    if info.get("cpu_features"):
        parts.append(f"CPU features {info['cpu_features']}")
    if isinstance(info.get("probe"), dict):
        parts.append(describe_probe(info["probe"], info.get("backend", "cpu")))
    if "cuda_toolkit" in info:
        t, c = info["cuda_toolkit"], info.get("cublas", {})
        parts.append(f"CUDA {t.get('version', '?')} ({t.get('root', '?')})")
        if c.get("source") == "wheel":
            parts.append(f"cuBLAS {c.get('package', '?')} wheel ({c.get('lib_dir', '?')})")
        elif c:
            parts.append(f"cuBLAS system ({c.get('lib_dir', '?')})")
        if info.get("min_driver"):
            parts.append(f"needs NVIDIA driver >= {info['min_driver']}")
    if rpc := rpc_worker_build(info):
        parts.append(rpc)
    if info.get("glslc"):
        parts.append(f"glslc: {info['glslc']}")
    if info.get("vulkan_headers"):
        parts.append(f"Vulkan headers {info['vulkan_headers']}")
    if "build_seconds" in info:
        jobs = f" with -j{info['jobs']}" if "jobs" in info else ""
        parts.append(f"built in {info['build_seconds']:.0f} s{jobs}")
    return ", ".join(parts)


def rpc_worker_build(info: dict) -> str | None:
    """The build's RPC part in a few words (``rpc-server, GGML_RPC=ON, protocol 7.0.0``), or None
    for a build without it. Builds made before ``build-info.json`` had its ``rpc`` record
    say so only in their CMake arguments."""
    rpc = info.get("rpc")
    if isinstance(rpc, dict) and rpc.get("ggml_rpc"):
        return f"{rpc.get('server', 'rpc-server')}, GGML_RPC=ON, RPC protocol {rpc.get('protocol', '?')}"
    if "-DGGML_RPC=ON" in info.get("cmake", []):
        return "rpc-server, GGML_RPC=ON"
    return None


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
    """This machine's builds (those for its CPU features), one finding per backend."""
    cpu = host_cpu()
    folders = install_dir("cpu").parent.glob(f"{COMMIT}*-{cpu.tag}")
    # <commit>[+<carried fixes>]-<backend>-<tag>: a backend counts when its own key names the folder
    names = [p.name[: -len(cpu.tag) - 1].partition("-")[2] for p in folders]
    backends = sorted({n for n in names if BACKEND.fullmatch(n) and install_dir(n, cpu=cpu).is_dir()})
    return [build_finding(b) for b in backends or ["cpu"]]


def cpu() -> Finding:
    """The CPU features every build here compiles in (AMX never; see cpu_features)."""
    return Finding("CPU features", host_cpu().describe(), True)


def packer_kernels() -> Finding:
    """Which build of the packer's kernels convert and verify load (``build-kernels``)."""
    from gguf_exact.builds.aot_kernels import describe

    compiled, what = describe()
    return Finding("packer kernels", what, compiled)


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
        tools = require_vulkan_tools(fetch=False)  # doctor downloads nothing
        return Finding(
            "Vulkan build tools", f"glslc: {tools.glslc}, headers {tools.header_version} ({tools.include_dir})", True
        )
    except GgufExactError as e:
        return Finding(
            "Vulkan build tools", e.render(lambda p: "").removeprefix(": "), False
        )  # the problem, not the flag


def vulkan_devices() -> Finding:
    """The Vulkan devices the loader lists (vulkaninfo) and which of them the Vulkan
    llama-server sees: a CPU-type device (lavapipe) only when named (``serve --vulkan-devices``)."""
    name = "Vulkan devices"
    listed = devices.vulkan_devices()
    if listed is None:
        return Finding(name, "vulkaninfo not found (scripts/install-vulkan-deps.sh installs vulkan-tools)", False)
    there = "; ".join(d.line() for d in listed) or "none"
    build = find_build("vulkan")
    if build is None or not listed:
        return Finding(name, f"vulkaninfo: {there}", bool(listed))
    try:
        seen = devices.list_devices(build.binary())
        soft = None if seen else devices.software_visible()
        named = devices.list_devices(build.binary(), devices.device_env(soft)) if soft else []
    except GgufExactError as e:
        return Finding(name, f"vulkaninfo: {there}; llama-server (vulkan): {e}", False)
    if seen:
        return Finding(
            name, f"vulkaninfo: {there}; llama-server (vulkan) uses {', '.join(d.line() for d in seen)}", True
        )
    if named:
        shown = ", ".join(d.line() for d in named)
        return Finding(
            name,
            f"vulkaninfo: {there}; llama-server (vulkan) sees none by itself (llama.cpp hides CPU-type devices), "
            f"{shown} with {VULKAN_VISIBLE_ENV}={soft}: `gguf-exact serve --vulkan-devices {soft}`",
            True,
        )
    return Finding(name, f"vulkaninfo: {there}; llama-server (vulkan) sees none of them", False)


def gpus() -> Finding:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return Finding("GPUs", "nvidia-smi not found: no NVIDIA GPU visible", False)
    out = _run([smi, "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader"])
    if not out:
        return Finding("GPUs", "nvidia-smi found no usable GPU", False)
    return Finding("GPUs", "; ".join(ln.strip() for ln in out.splitlines()), True)


def local_workers() -> list[str]:
    """The endpoints of the RPC workers ``gguf-exact rpc-server`` runs on this machine (their run folders)."""
    from gguf_exact import constants
    from gguf_exact.engines.shared.process import read_state, running_pid
    from gguf_exact.engines.shared.settings import RPC_ENGINE, STATE_FILE

    found = []
    for rdir in sorted(constants.run_root().glob("*")):
        if not (rdir / STATE_FILE).is_file() or running_pid(rdir) is None:
            continue
        state = read_state(rdir)
        if state.get("engine") == RPC_ENGINE:
            found.append(state["url"].removeprefix("rpc://"))
    return found


def rpc_workers(endpoints: tuple[str, ...] = ()) -> list[Finding]:
    """Each RPC worker given (``doctor --rpc``) or running here: what it answers and its devices'
    memory (the protocol's hello and device queries, bounded: a worker serving a llama-server
    is ``busy``, not waited for)."""
    from gguf_exact.engines.shared.rpc_probe import parse_endpoints, probe_worker

    given = parse_endpoints(endpoints) if endpoints else ()
    every = list(given) + [e for e in local_workers() if e not in given]
    if not every:
        return [Finding("RPC workers", "none given or running here (`gguf-exact rpc-server` starts one)", True)]
    reports = [probe_worker(e) for e in every]
    return [Finding("RPC worker", r.line(), r.state in ("ok", "busy")) for r in reports]


def diagnose(rpc: tuple[str, ...] = ()) -> list[Finding]:
    """Every finding, in the order ``gguf-exact doctor`` prints them; ``rpc``: RPC workers to ask."""
    return [
        cpu(),
        *bindings(),
        *server_builds(),
        packer_kernels(),
        cuda(),
        vulkan(),
        vulkan_devices(),
        gpus(),
        *rpc_workers(rpc),
    ]
