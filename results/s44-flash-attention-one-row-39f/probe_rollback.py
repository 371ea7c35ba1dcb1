"""Speculation's pattern (a pass of 4 rows, the last 2 rolled back) against one-row decodes, past the
sliding-window cache's wrap: swa_full off (llama-server's default) and on (the Python engine's)."""
import tempfile
from pathlib import Path
import numpy as np
import llama_cpp
from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint

root = Path(tempfile.mkdtemp())
write_main_checkpoint(root / "src", TINY, seed=0)
write_donor(root / "donor.gguf", root / "src", TINY)
N = 48
for swa_full in (False, True):
    for n_prompt in (100, 600):
        llm = llama_cpp.Llama(str(root / "donor.gguf"), n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=2,
                              logits_all=True, flash_attn=True, swa_full=swa_full, verbose=False)
        base = llm.tokenize(b"the cat sat on the mat and then the dog ran to the park ")
        prompt = (base * 200)[:n_prompt]
        follow = [base[1 + i % (len(base) - 1)] for i in range(N)]
        ctx, batch = llm._ctx, llm._batch
        n_vocab = llm.n_vocab()

        def decode(tokens, pos):
            batch.set_batch(batch=tokens, n_past=pos, logits_all=True)
            ctx.decode(batch)
            ptr = llama_cpp.llama_get_logits(ctx.ctx)
            return np.ctypeslib.as_array(ptr, shape=(len(tokens), n_vocab)).copy()

        def prefill():
            ctx.kv_cache_seq_rm(-1, 0, -1)
            for i in range(0, len(prompt), 64):
                decode(prompt[i:i + 64], i)

        prefill()
        alone = np.stack([decode([t], n_prompt + i)[0] for i, t in enumerate(follow)])
        prefill()
        rows = {}
        pos = 0
        while pos < N:  # a pass of up to 4 rows keeps 2 (two drafts rejected): rows 0-1 kept, 2-3 rolled back
            chunk = follow[pos:pos + 4]
            out = decode(chunk, n_prompt + pos)
            keep = min(2, len(chunk))
            for j in range(keep):
                rows[pos + j] = out[j]
            ctx.kv_cache_seq_rm(-1, n_prompt + pos + keep, -1)
            pos += keep
        spec = np.stack([rows[i] for i in range(N)])
        differ = [i for i in range(N) if spec[i].tobytes() != alone[i].tobytes()]
        print(f"swa_full={swa_full} prompt={n_prompt}: {len(differ)} of {N} rows differ"
              + (f", from position {n_prompt + differ[0]}, max {np.abs(spec - alone).max():.1e}" if differ else ""), flush=True)
        llm.close()
