"""The CPU features a llama.cpp build compiles in: read from ``/proc/cpuinfo``, never AMX.

Why not ``GGML_NATIVE`` (``-march=native``, llama.cpp's default): at the pinned commit a
native build on a CPU that advertises AMX compiles ggml's AMX matmul in, and that code
requests the tile-data permission on the main thread only while worker threads run the
tile instructions, so every batched Q4_0 product dies with "Illegal instruction"
(upstream PR #26954, open). Instead each build names the features it uses, the way ggml's
own ``GGML_NATIVE=OFF`` options do: every x86-64 feature ggml has a kernel for that this
CPU advertises, AMX excluded. llama-server and the Python bindings get the same list, and
the list is part of every build's cache key, so a build made on another machine is never
picked up where it would trap.

``GGUF_EXACT_CPU_FEATURES`` (comma list of the names in :data:`X86_FEATURES`, or ``native``)
overrides the detection: to build for an older CPU than this one, or to step down when a
build's probe fails.

Pure functions on the cpuinfo text, apart from :func:`host_cpu`.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

from gguf_exact import constants
from gguf_exact.errors import BuildError

OVERRIDE_ENV = constants.CPU_FEATURES_ENV

X86_FEATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (feature, as ggml's CMake option GGML_<FEATURE>; the /proc/cpuinfo flags it needs)
    ("sse42", ("sse4_2",)),
    ("avx", ("avx",)),
    ("f16c", ("f16c",)),
    ("fma", ("fma",)),
    ("bmi2", ("bmi2",)),
    ("avx2", ("avx2",)),
    ("avx_vnni", ("avx_vnni",)),
    # ggml's GGML_AVX512 compiles with -mavx512f/cd/vl/dq/bw together
    ("avx512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("avx512_vbmi", ("avx512vbmi",)),
    ("avx512_vnni", ("avx512_vnni",)),
    ("avx512_bf16", ("avx512_bf16",)),
)
"""Every x86-64 feature ggml has a ``GGML_NATIVE=OFF`` option for, AMX aside."""

NEVER = ("amx_tile", "amx_int8", "amx_bf16")
"""Set OFF in every build, whatever the CPU advertises (see the module docstring)."""

_NEEDS_AVX512 = {"avx512_vbmi", "avx512_vnni", "avx512_bf16"}


@dataclass(frozen=True)
class CpuTarget:
    """What one build compiles for: ``features`` (x86-64), or ``native`` elsewhere."""

    arch: str
    features: tuple[str, ...]
    native: bool = False
    advertised_amx: tuple[str, ...] = ()
    source: str = "/proc/cpuinfo"

    @property
    def tag(self) -> str:
        """The cache key's CPU part: ``avx.avx2.bmi2.f16c.fma.sse42``, or ``native-<arch>-<hash>``."""
        if self.native:
            digest = hashlib.sha256(" ".join(self.features).encode()).hexdigest()[:8]
            return f"native-{self.arch}-{digest}"
        return ".".join(sorted(self.features)) or "baseline"

    def cmake_args(self) -> list[str]:
        """ggml's CMake options for exactly these features (every other one OFF)."""
        if self.native:
            return []  # ggml's default (GGML_NATIVE=ON): no AMX outside x86-64
        args = ["-DGGML_NATIVE=OFF"]
        args += [f"-DGGML_{name.upper()}={'ON' if name in self.features else 'OFF'}" for name, _ in X86_FEATURES]
        args += [f"-DGGML_{name.upper()}=OFF" for name in NEVER]
        return args

    def describe(self) -> str:
        if self.native:
            return f"native ({self.arch})"
        amx = f"; AMX advertised ({', '.join(self.advertised_amx)}) but not used" if self.advertised_amx else ""
        return f"{' '.join(sorted(self.features)) or 'x86-64 baseline'} (from {self.source}){amx}"


def cpuinfo_flags(cpuinfo: str) -> set[str]:
    """The ``flags`` (x86) or ``Features`` (arm) of the first processor in ``/proc/cpuinfo``."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def x86_features(flags: set[str]) -> tuple[str, ...]:
    """The features of :data:`X86_FEATURES` whose cpuinfo flags are all in ``flags``."""
    found = [name for name, needs in X86_FEATURES if all(f in flags for f in needs)]
    if "avx512" not in found:
        found = [f for f in found if f not in _NEEDS_AVX512]
    return tuple(found)


def parse_override(text: str, arch: str) -> CpuTarget:
    """``GGUF_EXACT_CPU_FEATURES``: ``native`` or a comma list of feature names."""
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if words == ["native"]:
        return CpuTarget(arch, (), native=True, source=OVERRIDE_ENV)
    known = [name for name, _ in X86_FEATURES]
    unknown = [w for w in words if w not in known]
    if unknown:
        raise BuildError(
            f"{OVERRIDE_ENV}={text!r}: unknown feature {unknown[0]!r}; use 'native' or a comma list of {', '.join(known)}"
        )
    if any(w in _NEEDS_AVX512 for w in words) and "avx512" not in words:
        raise BuildError(f"{OVERRIDE_ENV}={text!r}: avx512_vbmi, avx512_vnni and avx512_bf16 need avx512")
    return CpuTarget(arch, tuple(n for n in known if n in words), source=OVERRIDE_ENV)


def cpu_target(cpuinfo: str, arch: str, override: str | None = None) -> CpuTarget:
    """The build's CPU target for a machine whose ``/proc/cpuinfo`` reads ``cpuinfo``."""
    if override:
        return parse_override(override, arch)
    flags = cpuinfo_flags(cpuinfo)
    if arch not in ("x86_64", "amd64", "AMD64"):
        return CpuTarget(arch, tuple(sorted(flags)), native=True)
    return CpuTarget("x86_64", x86_features(flags), advertised_amx=tuple(f for f in NEVER if f in flags))


def host_cpu() -> CpuTarget:
    """This machine's :func:`cpu_target` (``GGUF_EXACT_CPU_FEATURES`` wins)."""
    path = Path("/proc/cpuinfo")
    text = path.read_text(errors="replace") if path.is_file() else ""
    return cpu_target(text, platform.machine(), constants.cpu_features())
