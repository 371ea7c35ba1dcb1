"""What this machine has for serving: bindings, llama-server builds, CUDA, GPUs.

Each finding is a (name, value, ok) row; nothing here fails, it only reports.
"""

import shutil
import subprocess
from dataclasses import dataclass

from gguf_exact.serving.llama_build import (
    COMMIT,
    find_build,
    install_dir,
    server_version,
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


def server_builds() -> list[Finding]:
    found = []
    backends = sorted({p.name.split("-", 1)[1] for p in install_dir("cpu").parent.glob(f"{COMMIT}-*") if "-" in p.name})
    for backend in backends or ["cpu"]:
        build = find_build(backend)
        if build is None:
            found.append(
                Finding(
                    f"llama-server ({backend})",
                    f"not built; run `gguf-exact build-llama{'' if backend == 'cpu' else ' --cuda ' + backend[4:]}`",
                    False,
                )
            )
            continue
        version = " ".join(server_version(build.binary()).split())
        found.append(Finding(f"llama-server ({backend})", f"{build.binary()}  [{version}]", True))
    return found


def cuda() -> Finding:
    nvcc = shutil.which("nvcc")
    out = _run([nvcc, "--version"]) if nvcc else None
    if out:
        release = next((ln.strip() for ln in out.splitlines() if "release" in ln), out.splitlines()[-1])
        return Finding("CUDA toolkit", f"{nvcc}: {release}", True)
    return Finding("CUDA toolkit", "nvcc not found (CPU builds only)", False)


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
    return [bindings(), *server_builds(), cuda(), gpus()]
