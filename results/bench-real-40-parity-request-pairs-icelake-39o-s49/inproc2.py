import sys, time, statistics
from gguf_exact.engines.python.engine import MtpLlama
path = sys.argv[1]
llm = MtpLlama(path, None, n_ctx=1024, flash_attn=True, n_threads=2, n_threads_batch=2, n_batch=512, n_ubatch=512)
prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 3
toks = llm.tokenize(prompt.encode())
llm.create_completion(prompt, max_tokens=2, temperature=0.0, repeat_penalty=1.0)
def completion():
    llm.reset()
    llm.eval(toks)
    s0, r0 = llm.target_seconds, llm.target_rows
    t0 = time.perf_counter()
    out = llm.create_completion(prompt, max_tokens=48, temperature=0.0, repeat_penalty=1.0)
    wall = time.perf_counter() - t0
    return 1e3 * (llm.target_seconds - s0) / (llm.target_rows - r0), 1e3 * wall / 48, llm.target_rows - r0
def raw():
    llm.reset(); llm.eval(toks)
    ts = []
    tok = toks[-1]
    for i in range(48):
        t = time.perf_counter(); llm.decode_batch([tok], llm.n_tokens, False); ts.append(time.perf_counter() - t); llm.n_tokens += 1
    return 1e3 * statistics.mean(ts)
for rep in range(3):
    a = raw(); b = completion(); c = completion(); d = raw()
    print(f"raw {a:.1f}  completion decode {b[0]:.1f} (wall/token {b[1]:.1f}, rows {b[2]})  completion decode {c[0]:.1f} (wall/token {c[1]:.1f})  raw {d:.1f}", flush=True)
