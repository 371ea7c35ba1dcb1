"""Issue 40: which threads of a Python engine server compute (CPU ticks per thread after load, warm-up and two requests)."""
import os
import sys

sys.path.insert(0, "/work/main/scripts")
from pathlib import Path

from bench_real import PROMPTS

from gguf_exact.bench.real import running
from gguf_exact.engines.shared.http import get_metrics, openai_generate

W = Path("/work/bench/real26/e2b")  # the E2B `hidden` pair (make-pair)
def threads(pid):
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        st = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
        out.append((name, int(st[11]) + int(st[12])))
    return sorted(out, key=lambda x: -x[1])
with running(W / "target.gguf", W / "drafter.gguf", "python", ["ctx-size=4096", "no-warmup=true", "spec-draft-n-max=4", "spec-draft-adaptive=true"], "cpu", trace_label="x") as (launch, proc, load):
    print("after load", threads(proc.pid)[:8])
    openai_generate(launch.url, PROMPTS[0], 2, 0.0, 1)
    get_metrics(launch.url)
    print("after warm-up", threads(proc.pid)[:8])
    for p in PROMPTS[:2]:
        g = openai_generate(launch.url, p, 64, seed=1)
        print("request", round(g.n_tokens / (g.wall_seconds - g.prefill_seconds), 2), "tok/s", threads(proc.pid)[:8])
        get_metrics(launch.url)
