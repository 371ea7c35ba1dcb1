import tempfile
from pathlib import Path
import numpy as np, llama_cpp
from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint
root = Path(tempfile.mkdtemp()); write_main_checkpoint(root / "src", TINY, seed=0); write_donor(root / "d.gguf", root / "src", TINY)
llm = llama_cpp.Llama(str(root / "d.gguf"), n_ctx=1024, n_batch=1024, n_ubatch=1024, n_threads=2, logits_all=True, flash_attn=True, verbose=False)
LONG = 600
text = llm.tokenize(b"the cat sat on the mat and then the dog ran to the park ")
prompt = (text * (LONG // len(text) + 1))[:LONG]
follow = [text[1 + i % (len(text) - 1)] for i in range(100)]
def rows(batches):
    llm.reset(); llm.eval(prompt)
    for b in batches: llm.eval(b)
    return np.array(llm.scores[LONG:llm.n_tokens], dtype=np.float32)
alone = rows([[t] for t in follow])
out = []
for n in (2, 3, 4, 7, 8, 16, 34, 64, 100):
    b = rows([follow[:n]]); out.append(f"{n}:" + ("=" if b.tobytes() == alone[:n].tobytes() else f"{float(np.abs(b-alone[:n]).max()):.1e}"))
for pieces in ([LONG - 4 - 64, 64, 4], [LONG - 4, 4]):
    llm.reset(); s = 0
    for size in pieces: llm.eval(prompt[s:s + size]); s += size
    for t in follow[:16]: llm.eval([t])
    a = np.array(llm.scores[LONG:llm.n_tokens], dtype=np.float32)
    out.append(f"pieces{len(pieces)}:" + ("=" if a.tobytes() == alone[:16].tobytes() else f"{float(np.abs(a-alone[:16]).max()):.1e}"))
print(" ".join(out))
