"""A copy of a full-size Gemma 4 GGUF with random weights of sane size in every tensor (real-scale exactness probes:
make-pair's full-size pairs are almost all zeros, so their matrices' rows agree whatever the kernels do)."""
import shutil, sys
import numpy as np
import gguf
src, dst = sys.argv[1], sys.argv[2]
shutil.copyfile(src, dst)
r = gguf.GGUFReader(dst, "r+")
rng = np.random.default_rng(0)
T = gguf.GGMLQuantizationType
for t in r.tensors:
    d = t.data
    k = int(t.shape[0])
    if t.tensor_type == T.F32:
        if t.name.endswith("rope_freqs.weight"):
            continue
        d[...] = 1.0 if d.ndim == 1 or t.name.endswith("norm.weight") else rng.normal(0, k ** -0.5, d.shape).astype(np.float32)
    elif t.tensor_type == T.F16:
        d[...] = rng.normal(0, k ** -0.5, d.shape).astype(np.float16)
    elif t.tensor_type == T.Q4_0:
        b = d.reshape(-1, 18)
        b[:, 2:] = rng.integers(0, 256, (b.shape[0], 16), dtype=np.uint8)
        b[:, :2] = (rng.uniform(0.5, 1.5, b.shape[0]) / (4.6 * k ** 0.5)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    elif t.tensor_type == T.Q6_K:
        b = d.reshape(-1, 210)
        for r0 in range(0, b.shape[0], 1 << 20):
            c = b[r0:r0 + (1 << 20)]
            c[:, :192] = rng.integers(0, 256, (c.shape[0], 192), dtype=np.uint8)
            c[:, 192:208] = rng.integers(8, 24, (c.shape[0], 16), dtype=np.uint8)
            c[:, 208:] = (rng.uniform(0.5, 1.5, c.shape[0]) / (18 * 16 * k ** 0.5)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    else:
        raise SystemExit(f"{t.name}: {t.tensor_type.name} not handled")
d = None
r.data.flush()
print("wrote", dst)
