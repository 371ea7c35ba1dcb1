"""Max |logit diff| of an n-row pass against one-row decodes, n = 2..34, tiny model (optionally requantized)."""
import sys, tempfile
from pathlib import Path
import numpy as np
import llama_cpp
from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint

ftype = int(sys.argv[1]) if len(sys.argv) > 1 else -1
root = Path(tempfile.mkdtemp())
write_main_checkpoint(root / "src", TINY, seed=0)
write_donor(root / "donor.gguf", root / "src", TINY)
model = root / "donor.gguf"
if ftype >= 0:
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype; p.allow_requantize = True; p.nthread = 2
    out = root / f"q{ftype}.gguf"
    assert llama_cpp.llama_model_quantize(str(model).encode(), str(out).encode(), p) == 0
    model = out
llm = llama_cpp.Llama(str(model), n_ctx=128, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True, verbose=False)
prompt = llm.tokenize(b"the cat sat on the mat")
follow = [prompt[1 + i % (len(prompt) - 1)] for i in range(34)]
def rows(batches):
    llm.reset(); llm.eval(prompt)
    for b in batches: llm.eval(b)
    return np.array(llm.scores[len(prompt):llm.n_tokens], dtype=np.float32)
alone = rows([[t] for t in follow])
res = []
for n in range(2, 35):
    b = rows([follow[:n]])
    res.append((n, "=" if b.tobytes() == alone[:n].tobytes() else f"{float(np.abs(b - alone[:n]).max()):.1e}"))
print(" ".join(f"{n}:{r}" for n, r in res))
