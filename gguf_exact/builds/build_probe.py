"""The probe every llama.cpp build must pass before it is used: a batched Q4_0 matmul.

A build whose CPU code this machine cannot run (AMX tiles without the kernel's
permission, an AVX-512 the hypervisor hides) does not fail until a Q4_0 matrix meets a
batch of tokens; F32 models and single-token decodes take other kernels. So after every
build a tiny Q4_0 ``gemma4`` target (made on the spot) gets a 64-token prompt, through
``llama-bench`` for a llama-server build and through ``llama_cpp.Llama`` in a child
interpreter for the bindings. A probe that dies is one error line naming the signal, the
CPU features the build used, and how to build for fewer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from gguf_exact.builds.cpu_features import OVERRIDE_ENV, X86_FEATURES, CpuTarget
from gguf_exact.errors import BuildError

PROMPT_TOKENS = 64
"""A batch wide enough for every quantized matmul path (AMX takes batches of 16 and up)."""
TIMEOUT_S = 300


@dataclass(frozen=True)
class ProbeResult:
    """One probe run: ``ok``, or how it died (``returncode``, ``signal``) and its last output."""

    what: str
    ok: bool
    returncode: int
    signal: str = ""
    tail: str = ""

    def record(self) -> dict:
        """What ``build-info.json`` keeps (``doctor`` prints it)."""
        return {k: v for k, v in asdict(self).items() if k != "tail"} | {"prompt_tokens": PROMPT_TOKENS}


def write_probe_model(path: Path) -> Path:
    from gguf import GGMLQuantizationType

    from gguf_exact.tiny.models import write_tiny_target

    return write_tiny_target(path, seed=0, matrix_type=GGMLQuantizationType.Q4_0)


BINDINGS_PROBE = f"""
import sys, llama_cpp
m = llama_cpp.Llama(sys.argv[1], n_ctx=256, n_batch={PROMPT_TOKENS}, n_threads=2, verbose=False)
m.eval(list(range(3, 3 + {PROMPT_TOKENS})))
print("probe ok", m.n_tokens)
"""


def _run(what: str, cmd: list[str], env: dict | None = None) -> ProbeResult:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return ProbeResult(what, False, -1, "", f"no answer in {TIMEOUT_S} s")
    except OSError as e:
        return ProbeResult(what, False, -1, "", f"cannot run {cmd[0]}: {e.strerror}")
    rc = proc.returncode
    # A child killed by a signal: -N from subprocess, 128+N from a shell in between.
    signum = -rc if rc < 0 else rc - 128 if rc > 128 else 0
    name = signal.Signals(signum).name if signum in signal.valid_signals() and signum else ""
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])[-400:]
    return ProbeResult(what, rc == 0, rc, name, tail)


def probe_server_build(bin_dir: Path) -> ProbeResult:
    """``llama-bench`` from ``bin_dir`` on the probe model: a 64-token prompt, 2 threads."""
    with tempfile.TemporaryDirectory(prefix="gguf-exact-probe-") as tmp:
        model = write_probe_model(Path(tmp) / "probe-q4_0.gguf")
        cmd = [
            str(bin_dir / "llama-bench"),
            "-m",
            str(model),
            "-p",
            str(PROMPT_TOKENS),
            "-n",
            "2",
            "-r",
            "1",
            "-ngl",
            "0",
        ]
        return _run("llama-bench", cmd + ["-t", "2", "-o", "csv"])


def probe_bindings(python: str = sys.executable, pythonpath: Path | None = None) -> ProbeResult:
    """``llama_cpp.Llama`` in a child ``python`` evaluating a 64-token prompt on the probe model."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="gguf-exact-probe-") as tmp:
        model = write_probe_model(Path(tmp) / "probe-q4_0.gguf")
        return _run("the llama-cpp-python bindings", [python, "-c", BINDINGS_PROBE, str(model)], env)


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
