"""Max |logit diff| of n-row passes against one-row decodes for a GGUF given (n from argv)."""
import sys
import numpy as np
import llama_cpp
model = sys.argv[1]; ns = [int(x) for x in sys.argv[2].split(",")]
extra = (sys.argv[3] if len(sys.argv) > 3 else "1") == "1"
llm = llama_cpp.Llama(model, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True, flash_attn=(sys.argv[3] == "1" if len(sys.argv) > 3 else False), verbose=False)
prompt = llm.tokenize(b"The quick brown fox jumps over the lazy dog, and then")
follow = [prompt[1 + i % (len(prompt) - 1)] for i in range(max(ns))]
def rows(batches):
    llm.reset(); llm.eval(prompt)
    for b in batches: llm.eval(b)
    return np.array(llm.scores[len(prompt):llm.n_tokens], dtype=np.float32)
alone = rows([[t] for t in follow])
out = []
for n in ns:
    b = rows([follow[:n]])
    out.append(f"{n}:" + ("=" if b.tobytes() == alone[:n].tobytes() else f"{float(np.abs(b - alone[:n]).max()):.1e}"))
print(" ".join(out))
