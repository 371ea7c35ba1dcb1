"""Whether two Q4_0 encodings of the same blocks hold the same levels.

One grid can be stored in several ways: with ``d`` and levels ``q``, with ``-d`` and
``-q`` (how a block whose extreme level is +8 is stored), or with levels scaled by a
common factor and ``d`` divided by it (the exact packer keeps levels in lowest terms,
divided by their gcd; the published method takes the first of ``amax / m``,
m = 1..8, that fits). So two blocks hold the **same levels** when their level vectors
(``q = u - 8`` from the nibbles) are proportional: ``a = r * b`` for one nonzero
rational ``r``, sign included. Then their decoded grids are the same up to the block's
step, and only the scale differs. Two all-zero level vectors are the same; an
all-zero one and another are not.

Pure numpy on Q4_0 bytes (layout in :mod:`gguf_exact.core.q4_0`), no I/O.
"""

import numpy as np

from gguf_exact.core import q4_0


def proportional_levels(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n,) bool: row i of the integer level arrays ``a`` and ``b`` (n, 32) is ``r * b[i]``
    for a nonzero rational ``r`` (both all zero counts as proportional).

    Cross-multiplied against the largest-magnitude level of ``b``: ``a * b[p] == b * a[p]``
    everywhere, and ``a`` is all zero exactly when ``b`` is."""
    a = np.asarray(a, dtype=np.int32)
    b = np.asarray(b, dtype=np.int32)
    if a.shape != b.shape:
        raise ValueError(f"level arrays of shapes {a.shape} and {b.shape}")
    pivot = np.abs(b).argmax(axis=1)[:, None]
    a_p = np.take_along_axis(a, pivot, axis=1)
    b_p = np.take_along_axis(b, pivot, axis=1)
    crossed = (a * b_p == b * a_p).all(axis=1)
    return crossed & (a.any(axis=1) == b.any(axis=1))


def same_levels(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n_blocks,) bool: block i of the Q4_0 bytes ``a`` and ``b`` ((n_blocks, 18) each)
    holds the same levels (see the module docstring); the scales ``d`` are not compared,
    except that a block whose ``d`` is zero holds zeros whatever its nibbles."""
    levels_a = q4_0.effective_levels(np.asarray(a, dtype=np.uint8))
    levels_b = q4_0.effective_levels(np.asarray(b, dtype=np.uint8))
    return proportional_levels(levels_a, levels_b)
