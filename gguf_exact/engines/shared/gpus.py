"""The NVIDIA GPUs of this machine, as ``nvidia-smi`` reports them.

``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`` prints one
line per GPU, ``NVIDIA GeForce RTX 3050, 8192`` (memory in MiB). :func:`parse_gpus`
reads that text (pure); :func:`query_gpus` runs the command and gives an empty list
when there is no ``nvidia-smi``, it fails (no driver, no device), or it prints nothing.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

QUERY = ["--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int

    def __str__(self) -> str:
        return f"{self.name}, {self.memory_mib:,} MiB"


def parse_gpus(text: str) -> list[Gpu]:
    """One :class:`Gpu` per ``name, memory`` line; lines that are not (errors such as
    ``No devices were found``, ``[N/A]`` memory) are skipped."""
    gpus = []
    for line in text.splitlines():
        name, sep, memory = line.rpartition(",")
        memory = memory.strip().removesuffix("MiB").strip()
        if not sep or not name.strip() or not memory.isdigit():
            continue
        gpus.append(Gpu(name.strip(), int(memory)))
    return gpus


def query_gpus(timeout: float = 20.0) -> tuple[list[Gpu], str]:
    """(GPUs, how it went): the GPUs ``nvidia-smi`` on PATH lists, and one phrase saying
    where they came from or why there are none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "no nvidia-smi on PATH"
    try:
        proc = subprocess.run([smi, *QUERY], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"{smi} did not answer ({e})"
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()[:1] or [f"exit status {proc.returncode}"]
        return [], f"{smi}: {why[0]}"
    gpus = parse_gpus(proc.stdout)
    return gpus, (f"{smi}" if gpus else f"{smi} lists no GPU")


__all__ = ["Gpu", "parse_gpus", "query_gpus"]
