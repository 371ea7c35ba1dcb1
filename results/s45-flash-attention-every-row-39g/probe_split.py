"""Rows of any batch size, and prompts read in any split, against one-row decodes (tiny Gemma 4, flash attention)."""
import os, tempfile
from pathlib import Path
import numpy as np
import llama_cpp
from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint
root = Path(tempfile.mkdtemp())
write_main_checkpoint(root / "src", TINY, seed=0)
write_donor(root / "donor.gguf", root / "src", TINY)
print("tiled", os.environ.get("PROTO_FA_TILED"), "rowsonly", os.environ.get("PROTO_FA_ROWSONLY"))
def cmp(a, b):
    return "=" if a.tobytes() == b.tobytes() else "%.1e" % float(np.abs(a - b).max())
for n_prompt in (100, 600, 900):
    llm = llama_cpp.Llama(str(root / "donor.gguf"), n_ctx=2048, n_batch=1024, n_ubatch=1024, n_threads=2,
                          logits_all=True, flash_attn=True, verbose=False)
    base = llm.tokenize(b"the cat sat on the mat and then the dog ran to the park ")
    prompt = (base * 200)[:n_prompt]
    follow = [base[1 + i % (len(base) - 1)] for i in range(100)]
    def rows(prompt_split, batches):
        llm.reset()
        at = 0
        for n in prompt_split:
            llm.eval(prompt[at:at + n]); at += n
        assert at == len(prompt)
        for b in batches: llm.eval(b)
        return np.array(llm.scores[len(prompt) - 1:llm.n_tokens], dtype=np.float32)
    whole = [len(prompt)]
    alone = rows(whole, [[t] for t in follow])
    res = []
    for n in (2, 4, 8, 16, 63, 64, 100):
        b = rows(whole, [follow[:n]])
        res.append(f"{n}:{cmp(b, alone[:n + 1])}")
    for split in ([len(prompt) - 4 - 64, 64, 4], [len(prompt) - 4, 4], [len(prompt) - 30, 30]):
        b = rows(split, [[t] for t in follow[:16]])
        res.append(f"split{split[1:]}:{cmp(b, alone[:17])}")
    print(f"prompt={n_prompt}: " + " ".join(res), flush=True)
    llm.close()
