"""The probe every llama.cpp build must pass before it is used: a batched Q4_0 matmul.

A build whose CPU code this machine cannot run (AMX tiles without the kernel's
permission, an AVX-512 the hypervisor hides) does not fail until a Q4_0 matrix meets a
batch of tokens; F32 models and single-token decodes take other kernels. So after every
build a tiny Q4_0 ``gemma4`` target (made on the spot) gets a 64-token prompt, through
``llama-bench`` for a llama-server build and through ``llama_cpp.Llama`` in a child
interpreter for the bindings (which report the devices they saw). A probe that dies is one error line naming the signal, the
CPU features the build used, and how to build for fewer. A GPU build's probe runs on the
device it was built for, every layer offloaded (``-ngl 99``), a CPU-type Vulkan device
(lavapipe) made visible as ``serve`` would (:mod:`.devices`); where this machine has no
such device it runs on the CPU, and its record says so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from gguf_exact.builds import devices
from gguf_exact.builds.cpu_features import OVERRIDE_ENV, X86_FEATURES, CpuTarget
from gguf_exact.errors import BuildError

INFO_FILE = "build-info.json"
"""What an installed build records (beside its bin/): how it was made, and its probe."""
PROMPT_TOKENS = 64
"""A batch wide enough for every quantized matmul path (AMX takes batches of 16 and up)."""
TIMEOUT_S = 300
DEVICE_TIMEOUT_S = 900
"""On a device: lavapipe compiles every shader pipeline on first use (the probe took 159 s on 2 busy cores)."""


@dataclass(frozen=True)
class ProbeResult:
    """One probe run: ``ok``, or how it died (``returncode``, ``signal``) and its last output."""

    what: str
    ok: bool
    returncode: int
    signal: str = ""
    tail: str = ""
    device: str = ""  # "Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB)"; "" on the CPU
    visible_devices: str = ""  # GGML_VK_VISIBLE_DEVICES the probe set ("" = none set)
    gpu_layers: int = 0
    stdout: str = field(default="", repr=False)

    def record(self) -> dict:
        """What ``build-info.json`` keeps (``doctor`` prints it)."""
        return {k: v for k, v in asdict(self).items() if k not in ("tail", "stdout")} | {"prompt_tokens": PROMPT_TOKENS}


def write_probe_model(path: Path) -> Path:
    from gguf import GGMLQuantizationType

    from gguf_exact.tiny.models import write_tiny_target

    return write_tiny_target(path, seed=0, matrix_type=GGMLQuantizationType.Q4_0)


BINDINGS_PROBE = f"""
import json, sys, llama_cpp
from gguf_exact.builds.devices import ggml_gpu_devices
m = llama_cpp.Llama(sys.argv[1], n_ctx=256, n_batch={PROMPT_TOKENS}, n_threads=2, n_gpu_layers=int(sys.argv[2]), verbose=False)
m.eval(list(range(3, 3 + {PROMPT_TOKENS})))
print("probe ok", m.n_tokens)
print("devices", json.dumps([d.line() for d in ggml_gpu_devices(llama_cpp.llama_cpp._lib)]))
"""
"""``n_gpu_layers`` (argv[2]) every layer on a GPU build; the devices the bindings saw, as
``llama-server --list-devices`` names them (:func:`.devices.ggml_gpu_devices`)."""


def _run(what: str, cmd: list[str], env: dict | None = None, timeout: float = TIMEOUT_S) -> ProbeResult:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return ProbeResult(what, False, -1, "", f"no answer in {timeout:.0f} s")
    except OSError as e:
        return ProbeResult(what, False, -1, "", f"cannot run {cmd[0]}: {e.strerror}")
    rc = proc.returncode
    # A child killed by a signal: -N from subprocess, 128+N from a shell in between.
    signum = -rc if rc < 0 else rc - 128 if rc > 128 else 0
    name = signal.Signals(signum).name if signum in signal.valid_signals() and signum else ""
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])[-400:]
    return ProbeResult(what, rc == 0, rc, name, tail, stdout=proc.stdout or "")


def probe_device(server: Path, backend: str) -> tuple[str | None, devices.Device | None]:
    """The device a ``backend`` build runs on here, as its ``server`` (llama-server) sees it:
    (``GGML_VK_VISIBLE_DEVICES`` to set, or None; the device, or None for the CPU)."""
    if backend == "cpu":
        return None, None
    seen = devices.list_devices(server)
    if seen:
        return None, seen[0]
    soft = devices.software_visible() if backend == "vulkan" else None
    seen = devices.list_devices(server, devices.device_env(soft)) if soft else []
    return (soft, seen[0]) if seen else (None, None)


def probe_server_build(bin_dir: Path, backend: str = "cpu") -> ProbeResult:
    """``llama-bench`` from ``bin_dir`` on the probe model: a 64-token prompt, 2 threads; a GPU
    build's on its device (:func:`probe_device`), failed when llama-bench did not report it."""
    visible, device = probe_device(bin_dir / "llama-server", backend)
    layers = 99 if device else 0
    with tempfile.TemporaryDirectory(prefix="gguf-exact-probe-") as tmp:
        model = write_probe_model(Path(tmp) / "probe-q4_0.gguf")
        cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-p", str(PROMPT_TOKENS), "-n", "2", "-r", "1"]
        args = cmd + ["-ngl", str(layers), "-t", "2", "-o", "csv"]
        result = _run("llama-bench", args, devices.device_env(visible), DEVICE_TIMEOUT_S if device else TIMEOUT_S)
    result = replace(result, device=device.line() if device else "", visible_devices=visible or "", gpu_layers=layers)
    gpu_info = _csv_column(result.stdout, "gpu_info")
    if device is not None and result.ok and device.description not in gpu_info:
        return replace(
            result, ok=False, tail=f"llama-bench ran without {device.name} (its gpu_info: {gpu_info or 'none'})"
        )
    return result


def reprobe_install(install: Path, backend: str) -> ProbeResult:
    """The probe of an installed llama-server build (``install``: the folder above its bin/)
    run again, on its device, and recorded in its ``build-info.json``: for a build made before
    its probe ran on the device, without building it again."""
    return record_probe(install / INFO_FILE, probe_server_build(install / "bin", backend))


def install_entry(staged: Path, final: Path, info: dict) -> None:
    """``info`` written as ``staged``'s ``build-info.json``, then ``staged`` renamed into place as
    the cache entry ``final``, replacing an older entry whole (a rename: never half an entry)."""
    (staged / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.rename(staged, final)


def record_probe(path: Path, result: ProbeResult) -> ProbeResult:
    """``result`` written as the ``probe`` of the ``build-info.json`` at ``path`` (replaced whole)."""
    info = json.loads(path.read_text()) if path.is_file() else {}
    info["probe"] = result.record()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, path)
    return result


def _csv_column(csv_text: str, name: str) -> str:
    """``name``'s value in the first row of llama-bench's CSV ('' when absent)."""
    import csv

    rows = list(csv.DictReader(csv_text.splitlines()))
    return (rows[0].get(name) or "") if rows else ""


def bindings_visible(backend: str) -> str | None:
    """``GGML_VK_VISIBLE_DEVICES`` for a ``backend`` bindings probe, as ``serve`` would set it:
    none where the Vulkan loader lists a device llama.cpp takes by itself (a card), else the
    CPU-type devices (lavapipe); none for other backends."""
    if backend != "vulkan":
        return None
    listed = devices.vulkan_devices() or []
    return None if any(not d.software for d in listed) else devices.software_visible()


def probe_bindings(python: str = sys.executable, pythonpath: Path | None = None, backend: str = "cpu") -> ProbeResult:
    """``llama_cpp.Llama`` in a child ``python`` evaluating a 64-token prompt on the probe model;
    a GPU build's with every layer on its device (made visible as by :func:`bindings_visible`),
    failed when the bindings saw no device of theirs."""
    visible = bindings_visible(backend)
    env = devices.device_env(visible)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    layers = 0 if backend == "cpu" else 99
    with tempfile.TemporaryDirectory(prefix="gguf-exact-probe-") as tmp:
        model = write_probe_model(Path(tmp) / "probe-q4_0.gguf")
        cmd = [python, "-c", BINDINGS_PROBE, str(model), str(layers)]
        result = _run("the llama-cpp-python bindings", cmd, env, DEVICE_TIMEOUT_S if layers else TIMEOUT_S)
    if backend == "cpu" or not result.ok:
        return result
    seen: list[str] = next((json.loads(x[8:]) for x in result.stdout.splitlines() if x.startswith("devices ")), [])
    kind = {"vulkan": "Vulkan"}.get(backend, "CUDA")
    device = next((d for d in seen if d.startswith(kind)), None)
    if device is None:
        return replace(
            result, ok=False, tail=f"the bindings saw no {kind} device (they saw: {', '.join(seen) or 'none'})"
        )
    return replace(result, device=device, visible_devices=visible or "", gpu_layers=layers)


def failure_message(result: ProbeResult, cpu: CpuTarget, build: str, rebuild: str) -> str:
    """The one line for a probe that failed: what died, the features built in, what to do."""
    how = f"died with {result.signal}" if result.signal else f"exited {result.returncode}"
    if result.signal == "SIGILL":
        how += " (illegal instruction: the build uses a CPU feature this machine cannot run)"
    if cpu.native:
        advice = f"set {OVERRIDE_ENV} to a comma list of features and run `{rebuild} --force`"
    else:
        order = [n for n, _ in X86_FEATURES if n in cpu.features]
        fewer = ",".join(order[:-1]) or "sse42"
        advice = f"the newest feature built in is {order[-1] if order else 'none'}; build for fewer with `{OVERRIDE_ENV}={fewer} {rebuild} --force`"
    detail = f" ({result.tail})" if result.tail and not result.signal else ""
    return f"{build}: the probe (a {PROMPT_TOKENS}-token Q4_0 prompt through {result.what}) {how}{detail}; CPU features built in: {cpu.describe()}; {advice}"


def require_ok(result: ProbeResult, cpu: CpuTarget, build: str, rebuild: str) -> ProbeResult:
    if not result.ok:
        raise BuildError(failure_message(result, cpu, build, rebuild))
    return result
