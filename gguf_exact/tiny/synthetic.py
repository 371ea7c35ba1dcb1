"""Synthetic QAT weights: bf16 matrices on the Q4_0 grid, as QAT checkpoints are.

Pure numpy, seeded. Used by the tests, the demo and the benchmarks, so that all three
measure the same kind of data. Each block of 32 gets its own step ``s`` and levels
from a rounded normal in -8..7; ``value = bf16(level * s)`` with ``s`` either fp32
(as real QAT checkpoints appear to be) or already bf16 (then fp16 can match exactly).
"""

import numpy as np

from gguf_exact.core import bf16
from gguf_exact.core.q4_0 import BLOCK_SIZE


def qat_matrix(
    rng: np.random.Generator,
    rows: int,
    cols: int,
    scale: float = 0.02,
    step_kind: str = "fp32",
    plus8_fraction: float = 0.05,
    zero_fraction: float = 0.0,
) -> np.ndarray:
    """A (rows, cols) bf16-bits matrix whose every block is on the grid.

    ``plus8_fraction`` of blocks have +8 as their extreme (they need a negative
    Q4_0 scale); ``zero_fraction`` of blocks are all zero.
    """
    n = rows * cols // BLOCK_SIZE
    step = (scale / 8) * np.exp(rng.normal(0.0, 0.5, n))
    step = step.astype(np.float32)
    if step_kind == "bf16":
        step = bf16.to_f32(bf16.from_f32(step))
    elif step_kind != "fp32":
        raise ValueError(f"step_kind must be fp32 or bf16, not {step_kind!r}")
    levels = np.clip(np.rint(rng.normal(0.0, 3.0, (n, BLOCK_SIZE))), -7, 7)
    # Most QAT blocks reach an extreme level; put -8 in half of them ...
    where = rng.integers(0, BLOCK_SIZE, n)
    minus8 = rng.random(n) < 0.5
    levels[minus8, where[minus8]] = -8
    # ... and +8 (with no -8) in a few.
    plus8 = ~minus8 & (rng.random(n) < plus8_fraction / 0.5)
    levels[plus8, where[plus8]] = 8
    levels[rng.random(n) < zero_fraction] = 0
    values = levels.astype(np.float32) * step[:, None]
    return bf16.from_f32(values).reshape(rows, cols)


def random_matrix(rng: np.random.Generator, rows: int, cols: int, scale: float = 0.02) -> np.ndarray:
    """A (rows, cols) bf16-bits matrix off the grid (plain normal weights)."""
    return bf16.from_f32((rng.normal(0.0, scale, (rows, cols))).astype(np.float32))


def norm_vector(rng: np.random.Generator, n: int) -> np.ndarray:
    """bf16 bits of a norm weight near 1."""
    return bf16.from_f32((1.0 + rng.normal(0.0, 0.05, n)).astype(np.float32))
