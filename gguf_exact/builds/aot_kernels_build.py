"""Build the packer's kernels ahead of time: ``numba.pycc`` over the JIT kernels' own source, probed, cached.

Why a build at all: every ``convert`` or ``verify`` process otherwise loads numba and its
cached kernels first, about 0.9 s on this 2-core machine, as long as llama-quantize's whole
run (``scripts/bench_convert.py``). numba's ahead-of-time compiler turns the same Python
functions (the ``py_func`` of :func:`gguf_exact.core.exact_kernel.pack_blocks` and
:func:`gguf_exact.core.string_walk.skip_strings`, with everything they call) into an
extension module that imports in a few hundredths of a second without numba. So there is
one source and two builds of it, and this module makes the second: compiled in a child
process, probed in another (the extension and the JIT kernels give the same bytes and
counters on :func:`probe_cases`, or nothing is installed), then moved into
``<cache>/kernels/<key>/`` (:mod:`.aot_kernels`) with its ``build-info.json``. It lives
among the builds because it is one: made where it runs, keyed by CPU features, ``make
setup`` and ``gguf-exact build-kernels`` make it, ``doctor`` reports it; seconds, not minutes.

Two choices numba's defaults would get wrong here:

- **The GIL.** pycc's wrappers hold the GIL while the kernel runs (it has no ``nogil``), so
  the writer's and the verifier's two threads would share one core. numba's own wrapper
  generator releases it when the compile flags ask (``Flags.release_gil``, what ``nogil=True``
  sets for the JIT); pycc builds its flags in ``ModuleCompiler._cull_exports`` with no way in,
  so :func:`compile_into` swaps the ``Flags`` class that module uses for one whose
  ``release_gil`` is set, for the compile only, in a child process. The kernels touch no
  Python object, as the JIT's ``nogil`` kernels do not.
- **The CPU.** pycc compiles for a generic x86-64 unless told; ``target_cpu`` is set to the
  x86-64 micro-architecture level this CPU's features reach (:func:`llvm_cpu`: ``x86-64-v3``
  for AVX2 and FMA), not ``host``, so an entry keyed by the features never holds an
  instruction a CPU with the same features lacks. The bytes do not depend on it (the
  kernels are exact in any vector width: ``tests/test_same_bytes.py``).

``numba.pycc`` is pending deprecation (since numba 0.57, ``NumbaPendingDeprecationWarning``:
"Replacement technology is being developed"). When it goes, this build stops building
(``BuildError``) and the JIT path, which never depended on it, is what everyone runs; its
replacement (numba's announced AOT successor, or the same functions compiled by another
ahead-of-time tool) would take this module's place behind the same cache entry. Building
needs setuptools and a C compiler, as pycc does; running the result needs neither.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np

from gguf_exact import constants
from gguf_exact.builds.aot_kernels import (
    MODULE,
    KernelKey,
    cache_key,
    entry_dir,
    extension_path,
    extension_sha256,
    find_entry,
    import_extension,
)
from gguf_exact.builds.build_probe import install_entry
from gguf_exact.builds.cpu_features import CpuTarget, host_cpu
from gguf_exact.core import kernels
from gguf_exact.errors import BuildError

TIMEOUT_S = 600
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where the child processes import gguf_exact from

COMPILE = "import sys; from pathlib import Path; from gguf_exact.builds.aot_kernels_build import compile_into; " \
    "compile_into(Path(sys.argv[1]), sys.argv[2])"  # fmt: skip
PROBE = "import sys; from pathlib import Path; from gguf_exact.builds.aot_kernels_build import probe; " \
    "print(probe(Path(sys.argv[1])))"  # fmt: skip


def llvm_cpu(cpu: CpuTarget) -> str:
    """The LLVM CPU name to compile for: the x86-64 psABI level ``cpu``'s features reach
    (every CPU with AVX2, FMA, F16C and BMI2 also has the LZCNT and MOVBE that v3 adds),
    or ``host`` where the features are not named (another architecture, ``native``)."""
    if cpu.native:
        return "host"
    have = set(cpu.features)
    v3 = {"avx", "avx2", "fma", "f16c", "bmi2", "sse42"}
    if v3 | {"avx512"} <= have:
        return "x86-64-v4"
    if v3 <= have:
        return "x86-64-v3"
    return "x86-64-v2" if "sse42" in have else "x86-64"


def compile_into(out_dir: Path, target_cpu: str) -> Path:
    """Compile :data:`gguf_exact.core.kernels.EXPORTS` into ``out_dir`` (run in a child
    process: it imports numba and swaps pycc's ``Flags``; see the module docstring)."""
    import warnings

    from numba.core.compiler import Flags
    from numba.core.errors import NumbaPendingDeprecationWarning

    warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
    import numba.pycc.compiler as pycc_compiler
    from numba.pycc import CC

    from gguf_exact.core.exact_kernel import pack_blocks
    from gguf_exact.core.string_walk import skip_strings

    class ReleasingGil(Flags):  # noqa: D401  (pycc's flags with the JIT's nogil=True)
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.release_gil = True  # type: ignore[assignment]  # numba's stubs type an option as its descriptor

    sources = {"pack_blocks": pack_blocks.py_func, "skip_strings": skip_strings.py_func}
    cc = CC(MODULE)
    cc.output_dir, cc.target_cpu = str(out_dir), target_cpu
    for name, signature in kernels.EXPORTS.items():
        cc.export(name, signature)(sources[name])
    pycc_compiler.Flags = ReleasingGil  # type: ignore[misc]  # pycc takes no flags: its class swapped
    cc.compile()
    return out_dir / cc.output_file


# --- the probe: both builds on the same inputs ------------------------------------------------


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).reshape(-1, 32)


def probe_cases() -> dict[str, tuple[np.ndarray, bool, bool]]:
    """Fixed inputs of ``pack_blocks`` (bits, score_partial, with_histogram) covering each
    of its paths: QAT blocks with fp32 steps (extreme level -8, and +8 with a negative
    scale), all-zero and signed-zero blocks, off-grid blocks (scored or skipped), tiny and
    huge steps (fp16 subnormal scales; beyond fp16's range), NaN and inf."""
    rng = np.random.default_rng(25)
    n = 2048
    levels = rng.integers(-8, 8, (n, 32)).astype(np.float32)
    levels[: n // 4, 0] = -8  # fitted at m = 8
    plus8 = rng.integers(-7, 9, (n // 4, 32)).astype(np.float32)
    plus8[:, 3] = 8  # +8 present, -8 absent: the negative-scale case
    steps = rng.uniform(2.0**-12, 2.0**-3, (n, 1)).astype(np.float32)
    qat = np.concatenate([levels * steps, plus8 * steps[: n // 4]])
    zeros = np.zeros((64, 32), np.float32)
    zeros[::2] = -0.0
    off = rng.standard_normal((256, 32)).astype(np.float32)
    mixed = np.concatenate([qat[:512], off[:64], zeros[:8], qat[512:1024]])
    tiny = levels[:256] * np.float32(2.0**-20)  # scales in fp16's subnormal range
    huge = levels[:16] * np.float32(2.0**17)  # a step beyond fp16's largest finite value
    non_finite = qat[:64].copy()
    non_finite[5, 7], non_finite[40, 1] = np.nan, np.inf
    return {
        "qat": (_bf16_bits(qat), False, True),
        "zeros": (_bf16_bits(zeros), False, True),
        "mixed-scored": (_bf16_bits(mixed), True, True),
        "mixed-skipped": (_bf16_bits(mixed), False, False),
        "tiny-steps": (_bf16_bits(tiny), False, True),
        "huge-step": (_bf16_bits(huge), False, True),
        "non-finite": (_bf16_bits(non_finite), False, True),
    }


def pack_outputs(pack_blocks, bits: np.ndarray, score_partial: bool, with_histogram: bool) -> dict[str, np.ndarray]:
    """Every array ``pack_blocks`` writes, from zeros (rows it stops before stay zero)."""
    n = bits.shape[0]
    out: dict[str, np.ndarray] = {
        "q4_0": np.zeros((n, 18), np.uint8),
        "counters": np.zeros(kernels.N_COUNTERS, np.int64),
        "sq": np.zeros(2, np.float64),
        "histogram": np.zeros(16, np.int64),
        "off_blocks": np.zeros(5, np.int64),
        "off_residual": np.zeros(5, np.float32),
    }
    pack_blocks(bits, *out.values(), score_partial, with_histogram, kernels.GCD_BY_LEVEL_SET)
    return out


def string_cases() -> dict[str, tuple[np.ndarray, int, int]]:
    """``skip_strings`` inputs: 300 strings whole, cut short, and with a length past the end."""
    words = [bytes(range(k % 50)) for k in range(300)]
    buf = b"".join(len(w).to_bytes(8, "little") + w for w in words)
    huge = bytearray(buf)
    huge[0:8] = (1 << 62).to_bytes(8, "little")
    as_array = lambda b: np.frombuffer(bytes(b), np.uint8)  # noqa: E731
    return {"whole": (as_array(buf), 0, 300), "cut": (as_array(buf[:-3]), 0, 300), "huge": (as_array(huge), 0, 300)}


def differences(compiled: ModuleType | SimpleNamespace, jit: SimpleNamespace | None = None) -> list[str]:
    """Where ``compiled`` and the JIT kernels (``jit``: default the numba ones) disagree on
    :func:`probe_cases` and :func:`string_cases`; empty when every array is the same bytes."""
    jit = jit or kernels.jit()
    found = []
    for name, (bits, score_partial, with_histogram) in probe_cases().items():
        a = pack_outputs(compiled.pack_blocks, bits, score_partial, with_histogram)
        b = pack_outputs(jit.pack_blocks, bits, score_partial, with_histogram)
        found += [f"{name}: {k}" for k in a if a[k].tobytes() != b[k].tobytes()]
    for name, args in string_cases().items():
        if compiled.skip_strings(*args) != jit.skip_strings(*args):
            found.append(f"strings {name}")
    return found


def probe(extension: Path) -> str:
    """Run in a fresh process: ``extension`` imported, :func:`differences`; JSON."""
    compiled = import_extension(extension)
    without_numba = "numba" not in sys.modules  # what start-up gains: checked before the JIT is loaded
    found = differences(compiled) + ([] if without_numba else ["importing the extension loaded numba"])
    blocks = sum(bits.shape[0] for bits, _, _ in probe_cases().values())
    return json.dumps(
        {"ok": not found, "blocks": blocks, "differences": found, "imported_without_numba": without_numba}
    )


# --- the build --------------------------------------------------------------------------------


def _child(code: str, args: list[str], what: str, env: dict[str, str], logfile: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=TIMEOUT_S
    )
    with open(logfile, "a") as log:
        log.write(f"--- {what}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"kernels {what} failed: {last}; full log: {logfile}")
    return proc.stdout


def build_kernels(force: bool = False, log=print) -> Path:
    """Build (once) this machine's compiled kernels, probe them and install them in their
    cache folder; returns the folder. A second call returns at once."""
    key: KernelKey | None = cache_key()
    if key is None:
        raise BuildError("numba is not installed as a distribution here (no numba-*.dist-info): nothing to build with")
    final = entry_dir(key)
    if not force and find_entry(key).path is not None:
        return final
    cpu = host_cpu()
    target = llvm_cpu(cpu)
    final.parent.mkdir(parents=True, exist_ok=True)
    logs = constants.cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    logfile = logs / f"kernels-{final.name}.log"
    logfile.write_text("")
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "NUMBA_CACHE_DIR": str(work / "numba-cache"),  # callees compiled afresh, as IR the extension links
        constants.KERNELS_ENV: "jit",
    }
    try:
        log(f"compiling the packer's kernels ahead of time for {target} ({cpu.describe()})")
        t0 = time.monotonic()
        staged = work / "install"
        _child(COMPILE, [str(staged), target], "compile", env, logfile)
        build_seconds = round(time.monotonic() - t0, 1)
        extension = extension_path(staged, key)
        report = json.loads(_child(PROBE, [str(extension)], "probe", env, logfile).strip().splitlines()[-1])
        if not report["ok"]:
            raise BuildError(f"{extension}: the compiled kernels differ from numba's JIT ({report['differences'][0]}); "
                             "nothing installed; the JIT kernels stay in use")  # fmt: skip
        info = {
            "what": "the packer's kernels, compiled ahead of time by numba.pycc",
            "key": key.as_dict(),
            "target_cpu": target,
            "cpu": cpu.describe(),
            "file": extension.name,
            "bytes": extension.stat().st_size,
            "sha256": extension_sha256(extension),
            "build_seconds": build_seconds,
            "probe": report,
        }
        install_entry(staged, final, info)
        log(f"built the kernels in {build_seconds:.0f} s -> {final}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if find_entry(key).path is None:
        raise BuildError(f"{final}: the compiled kernels did not land; full log: {logfile}")
    return final


def main(argv: list[str] | None = None) -> int:
    """``python -m gguf_exact.builds.aot_kernels_build [--force]`` (``make setup``): prints the folder."""
    import argparse

    parser = argparse.ArgumentParser(prog="build-kernels", description=build_kernels.__doc__)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    try:
        print(build_kernels(args.force, log=lambda m: print(m, file=sys.stderr)))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
