"""The published exact repack (``gguf_exact.py`` of the E2B/E4B exact drafters),
re-implemented as the baseline our scale choice is measured against.

Per block: amax; tolerance amax * 2**-7; for m = 1..8 try step amax/m with levels
clip(rint(x/step), -8, 7); the first m whose residuals are all within tolerance wins;
refine by least squares, round to fp16, recompute levels. Blocks where no m fits
(for example those whose extreme level is +8) get no step; the original stops there.
"""

import numpy as np

from gguf_exact.core import bf16, q4_0


def published_q4_0(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Q4_0 bytes (n_blocks, 18), fitted mask (n_blocks,)) for bf16 ``bits``."""
    x = bf16.to_f32(bits.reshape(-1, q4_0.BLOCK_SIZE)).astype(np.float32)
    n = x.shape[0]
    amax = np.abs(x).max(axis=1)
    tol = amax * np.float32(2.0**-7)
    step = np.zeros(n, dtype=np.float32)
    fitted = amax == 0
    for m in range(1, 9):
        todo = ~fitted
        s = amax[todo] / np.float32(m)
        q = np.clip(np.rint(x[todo] / s[:, None]), -8, 7)
        ok = (np.abs(x[todo] - q * s[:, None]) <= tol[todo, None]).all(axis=1)
        idx = np.flatnonzero(todo)[ok]
        qq = q[ok]
        step[idx] = (qq * x[idx]).sum(axis=1) / np.maximum((qq * qq).sum(axis=1), 1)
        fitted[idx] = True
    d = step.astype(np.float16)
    d32 = d.astype(np.float32)
    levels = np.clip(np.rint(np.divide(x, d32[:, None], out=np.zeros_like(x), where=d32[:, None] != 0)), -8, 7)
    return q4_0.pack(levels.astype(np.int8), d), fitted
