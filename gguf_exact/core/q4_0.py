"""The Q4_0 block layout, stated once.

A block is 32 consecutive values of a row, stored in 18 bytes::

    d   : float16, little-endian (2 bytes)     the step; may be negative
    qs  : 16 bytes, qs[j] = u[j] | u[j+16] << 4  with u = level + 8 in 0..15

and decodes as ``(u - 8) * d`` in float32, i.e. ``level * d`` with level in -8..7.
A block whose extreme level is +8 is stored with ``-d`` and negated levels.
"""

import numpy as np

BLOCK_SIZE = 32
BLOCK_BYTES = 18
LEVEL_MIN, LEVEL_MAX = -8, 7


def pack(levels: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Pack ``levels`` (n_blocks, 32) int8 in -8..7 and ``d`` (n_blocks,) float16
    into (n_blocks, 18) bytes."""
    n_blocks = levels.shape[0]
    u = (levels.astype(np.int16) + 8).astype(np.uint8)
    out = np.empty((n_blocks, BLOCK_BYTES), dtype=np.uint8)
    out[:, :2] = np.ascontiguousarray(d, dtype="<f2").view(np.uint8).reshape(n_blocks, 2)
    out[:, 2:] = u[:, :16] | (u[:, 16:] << 4)
    return out


def unpack(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack`: (n_blocks, 18) bytes -> (levels int8, d float16)."""
    blocks = blocks.reshape(-1, BLOCK_BYTES)
    d = np.ascontiguousarray(blocks[:, :2]).view("<f2").reshape(-1)
    qs = blocks[:, 2:]
    u = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    return (u.astype(np.int8) - 8), d


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """Decode as llama.cpp does: float32 ``level * float32(d)``, (n_blocks, 32)."""
    levels, d = unpack(blocks)
    return levels.astype(np.float32) * d.astype(np.float32)[:, None]


def row_bytes(n_cols: int) -> int:
    """Bytes of one Q4_0 row of ``n_cols`` values."""
    return n_cols // BLOCK_SIZE * BLOCK_BYTES


def effective_levels(blocks: np.ndarray) -> np.ndarray:
    """Levels (n_blocks, 32) int8 of Q4_0 blocks as they decode: a block whose ``d`` is
    zero holds all zeros, whatever its nibbles."""
    levels, d = unpack(blocks)
    return np.where((d == 0)[:, None], np.int8(0), levels)
