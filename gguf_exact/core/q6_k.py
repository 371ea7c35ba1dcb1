"""A Q6_K encoder, for writing donors the way Google's GGUFs store embeddings.

gguf-py 0.19 decodes Q6_K but cannot encode it. Layout of a block of 256 values
(210 bytes), as ``gguf.quants.Q6_K.dequantize_blocks`` reads it::

    ql[128]  low 4 bits: value h*128 + s*64 + j in nibble s of ql[h*64 + j]
    qh[64]   high 2 bits: value h*128 + s*32 + j in bits 2s..2s+1 of qh[h*32 + j]
    scales[16] int8, one per 16 values;  d: float16
    value = d * scales[k // 16] * (q - 32), q in 0..63

Scales are chosen simply (extreme value of each 16 at level -32, sub-scales
rounded against the largest), not with llama.cpp's error search: valid Q6_K
that llama.cpp decodes, close to but not byte-identical with ``llama-quantize``.
"""

import numpy as np

QK_K = 256
BLOCK_BYTES = 210


def _signed_extreme(x: np.ndarray, axis: int) -> np.ndarray:
    idx = np.abs(x).argmax(axis=axis)
    return np.take_along_axis(x, np.expand_dims(idx, axis), axis=axis).squeeze(axis)


def quantize(values: np.ndarray) -> np.ndarray:
    """float32 (rows, cols), cols a multiple of 256 -> (rows, cols/256*210) uint8."""
    values = np.asarray(values, dtype=np.float32)
    rows, cols = values.shape
    if cols % QK_K:
        raise ValueError(f"Q6_K needs rows of a multiple of {QK_K} values, got {cols}")
    sub = values.reshape(-1, 16, 16)
    n = sub.shape[0]
    scale = _signed_extreme(sub, 2) / np.float32(-32)  # (n, 16)
    top = _signed_extreme(scale, 1)  # (n,)
    d = np.where(top != 0, top / np.float32(-128), 0).astype(np.float16)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, d32, out=np.zeros_like(scale), where=d32 != 0)), -128, 127).astype(np.int8)
    eff = (d32 * sc.astype(np.float32))[:, :, None]
    q = np.rint(np.divide(sub, eff, out=np.zeros_like(sub), where=eff != 0))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)  # (block, h, s, j): value h*128 + s*32 + j
    low = (q & 0x0F).reshape(n, 2, 2, 64)  # (block, h, s, j): value h*128 + s*64 + j
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
    high = q >> 4
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(n, 2)], axis=1)
    return out.reshape(rows, cols // QK_K * BLOCK_BYTES)
