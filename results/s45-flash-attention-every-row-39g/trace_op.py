"""Which op first gives a row of an n-row pass other bits than the row decoded alone (tiny Gemma 4, bindings)."""
import ctypes, sys, tempfile
from pathlib import Path
import numpy as np
import llama_cpp
import llama_cpp.llama_cpp as lc
from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint

N = int(sys.argv[1]) if len(sys.argv) > 1 else 8
FA = (sys.argv[2] if len(sys.argv) > 2 else "1") == "1"

class T(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]

records = []
capture = [False]

@lc.ggml_backend_sched_eval_callback
def cb(t, ask, ud):
    if ask:
        return True
    if not capture[0]:
        return True
    x = T.from_address(t)
    if x.type != 0 or not x.data:
        return True
    ne = [x.ne[i] for i in range(4)]; nb = [x.nb[i] for i in range(4)]
    span = sum((n - 1) * s for n, s in zip(ne, nb)) + 4
    buf = (ctypes.c_char * span).from_address(x.data)
    a = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=np.uint8).view(np.float32) if span % 4 == 0 else np.frombuffer(buf, dtype=np.uint8)[: span - span % 4].view(np.float32),
                                        shape=ne[::-1], strides=nb[::-1]).copy()
    srcs = tuple((T.from_address(x.src[j]).name.decode(), T.from_address(x.src[j]).type, tuple(T.from_address(x.src[j]).ne)) for j in range(2) if x.src[j])
    records.append((x.name.decode(), x.op, tuple(ne), a, srcs))
    return True

orig = lc.llama_context_default_params
def patched():
    p = orig(); p.cb_eval = cb; return p
lc.llama_context_default_params = patched

MODEL = sys.argv[3] if len(sys.argv) > 3 else None
root = Path(tempfile.mkdtemp())
if MODEL is None:
    write_main_checkpoint(root / "src", TINY, seed=0)
    write_donor(root / "donor.gguf", root / "src", TINY)
llm = llama_cpp.Llama(MODEL or str(root / "donor.gguf"), n_ctx=128, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True, flash_attn=FA, verbose=False)
prompt = llm.tokenize(b"the cat sat on the mat")
follow = [prompt[1 + i % (len(prompt) - 1)] for i in range(N)]

def run(batches):
    llm.reset(); llm.eval(prompt)
    out = []
    for b in batches:
        records.clear(); capture[0] = True; llm.eval(b); capture[0] = False
        out.append(list(records))
    return out

singles = run([[t] for t in follow])
(batch,) = run([follow])
print(f"{len(batch)} tensors captured in the {N}-row pass, {len(singles[0])} in a one-row pass")
first = None
for k, (name, op, ne, a, srcs) in enumerate(batch):
    if k >= len(singles[0]) or singles[0][k][0] != name:
        print("graph order differs at", k, name); break
    worst = 0.0
    for i in range(N):
        s_name, _, s_ne, s, _ = singles[i][k]
        diff = [d for d in range(4) if ne[d] != s_ne[d]]
        if len(diff) != 1 or ne[diff[0]] != N or s_ne[diff[0]] != 1:
            worst = None; break
        ax = 3 - diff[0]
        row = np.take(a, [i], axis=ax)
        if row.tobytes() != s.tobytes():
            worst = max(worst, float(np.abs(row - s).max()) if np.isfinite(row).all() else float("inf"))
    if worst is None:
        continue
    if worst > 0:
        srcs = "?"
        print(f"first differing: #{k} {name} op={op} ne={ne} max diff {worst:.3e} srcs {srcs}")
        s0 = singles[0][k][3]; b0 = np.take(a, [0], axis=2)
        cols = np.nonzero((b0 != s0).reshape(-1))[0]
        print("row 0 differing columns:", cols[:20], len(cols))
        first = k
        break
if first is None:
    print("no op's rows differ")
if first is not None:
    for k in range(max(0, first - 6), first + 1):
        name, op, ne, a, srcs = batch[k]
        print(k, name, op, ne, srcs)
