import sys, tempfile, os
from pathlib import Path
import numpy as np
import llama_cpp
from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint
root = Path(tempfile.mkdtemp())
write_main_checkpoint(root / "src", TINY, seed=0)
write_donor(root / "donor.gguf", root / "src", TINY)
print("split", os.environ.get("PROTO_FA_SPLIT"))
for fa in (True, False):
    for n_prompt in (100, 400, 600, 900):
        llm = llama_cpp.Llama(str(root / "donor.gguf"), n_ctx=2048, n_batch=1024, n_ubatch=1024, n_threads=2,
                              logits_all=True, flash_attn=fa, verbose=False)
        base = llm.tokenize(b"the cat sat on the mat and then the dog ran to the park ")
        prompt = (base * 200)[:n_prompt]
        follow = [base[1 + i % (len(base) - 1)] for i in range(8)]
        def rows(batches):
            llm.reset(); llm.eval(prompt)
            for b in batches: llm.eval(b)
            return np.array(llm.scores[len(prompt):llm.n_tokens], dtype=np.float32)
        alone = rows([[t] for t in follow])
        again = rows([[t] for t in follow])
        res = [f"|logit|max {np.abs(alone).max():.2f} top2gap {np.sort(alone[0])[-1]-np.sort(alone[0])[-2]:.4f} again {'=' if again.tobytes()==alone.tobytes() else 'DIFF'}"]
        for n in (2, 3, 4, 5, 8):
            b = rows([follow[:n]])
            res.append(f"{n}:{'=' if b.tobytes()==alone[:n].tobytes() else '%.1e' % float(np.abs(b-alone[:n]).max())}")
        print(f"fa={fa} prompt={n_prompt}: " + " ".join(res), flush=True)
        llm.close()
