"""Helpers several test files share: an off-grid checkpoint, a source tensor's bits, the CLI in a subprocess, one Q4_0 block."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

from gguf_exact.core import bf16, q4_0
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.tiny.models import drafter_config, drafter_tensors, write_checkpoint


def off_grid_checkpoint(folder: Path) -> Path:
    """The tiny drafter with one matrix (layer 2's up projection) off the 4-bit grid."""
    tensors = drafter_tensors(seed=1)
    tensors["model.layers.2.mlp.up_proj.weight"] = bf16.from_f32(
        np.random.default_rng(0).normal(0, 0.02, (128, 64)).astype(np.float32)
    )
    return write_checkpoint(folder, drafter_config(), tensors)


def source_bits(folder: Path, hf_name: str) -> np.ndarray:
    """A checkpoint tensor's values as stored (bf16 bits as uint16)."""
    with Checkpoint(folder) as ckpt:
        return np.array(ckpt.read(hf_name))


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    """``gguf-exact ARGS`` in a subprocess, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "gguf_exact.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def block(levels, d=0.01) -> np.ndarray:
    """One Q4_0 block of 32 ``levels`` with scale ``d``."""
    return q4_0.pack(np.array([levels], dtype=np.int8), np.array([d], dtype=np.float16))


def sdist_files(sdist: Path, wanted: set[str] | list[str], root: Path) -> Path:
    """The files ``wanted`` (relative to vendor/llama.cpp) of the pinned sdist, in a tree at ``root``."""
    wanted = set(wanted)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            rel = member.name.partition("/vendor/llama.cpp/")[2]
            if rel in wanted:
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_bytes(tar.extractfile(member).read())
    return root


def compact_names(text: str, header: str) -> list[str]:
    """The names of a compact table: each starts a line (alone, or before its row's figures)."""
    lines = text.splitlines()
    rule = next(i for i, ln in enumerate(lines) if ln.startswith(header)) + 1
    while not lines[rule].startswith("─"):
        rule += 1
    names = []
    for ln in lines[rule + 1 :]:
        if not ln.strip() or ln.startswith(("(all)", "blocks p/e/m/l", "QAT 4-bit", "not QAT")):
            break
        if not ln.startswith(" "):
            names.append(re.split(r" {2,}", ln)[0])
    return names


def status_lines(text: str, indent: int = 13) -> list[str]:
    """`status` output with its wrapped lines joined: a line that must wrap goes on under its
    value's column (``indent`` spaces), broken at a space."""
    lines: list[str] = []
    for line in text.splitlines():
        if lines and line.startswith(" " * indent) and line[indent : indent + 1] != " ":
            lines[-1] += " " + line[indent:]
        else:
            lines.append(line)
    return lines
