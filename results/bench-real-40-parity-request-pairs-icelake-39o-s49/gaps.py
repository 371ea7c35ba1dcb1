"""One server alone (E2B target alone): requests after a short gap (0.5 s) or a long one (12 s, past anyio's
10 s idle-worker timeout), in the order S L L S ...: tokens/s, the server's thread count before each request."""
import os, sys, time, statistics
from pathlib import Path
from gguf_exact.bench.real import running
from gguf_exact.engines.shared.http import openai_generate
TICK = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK
target = Path(sys.argv[1]); engine = sys.argv[2]; n = int(sys.argv[3])
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
pattern = ["S", "L", "L", "S"] * (n // 4)
out = {"S": [], "L": []}
with running(target, None, engine, ["ctx-size=1024", "no-warmup=true"], "cpu") as (launch, proc, load):
    openai_generate(launch.url, PROMPT, 2, 0.0, 1)
    for gap in pattern:
        time.sleep(0.5 if gap == "S" else 12)
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        c0 = cpu(proc.pid)
        g = openai_generate(launch.url, PROMPT, 64, 0.0, 1)
        c1 = cpu(proc.pid)
        gen = g.wall_seconds - g.prefill_seconds
        rate = len(g.tokens) / gen
        out[gap].append(rate)
        print(f"{engine} gap {gap} threads {threads:3d} {rate:6.2f} tok/s prefill {g.prefill_seconds:5.2f}s cpu/wall {(c1-c0)/g.wall_seconds:4.2f}", flush=True)
for k, v in out.items():
    print(engine, k, "median %.2f mean %.2f min %.2f" % (statistics.median(v), statistics.mean(v), min(v)))
