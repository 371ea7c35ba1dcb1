"""Both servers loaded (E2B target alone), requests alternated with the order rotated: per request the
serving engine's tokens/s and CPU seconds, and the CPU seconds the idle server spent meanwhile."""
import os, sys, statistics
from contextlib import ExitStack
from pathlib import Path
from gguf_exact.bench.real import running
from gguf_exact.engines.shared.http import openai_generate
TICK = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK
target = Path(sys.argv[1]); rounds = int(sys.argv[2])
PROMPTS = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
           "Explain how a refrigerator works, step by step, for a curious ten-year-old."]
engines = ["python", "llama-server"]
with ExitStack() as st:
    srv = {}
    for e in engines:
        launch, proc, load = st.enter_context(running(target, None, e, ["ctx-size=1024", "no-warmup=true"], "cpu"))
        openai_generate(launch.url, PROMPTS[0], 2, 0.0, 1)
        srv[e] = (launch.url, proc.pid)
    rates = {e: [] for e in engines}
    for r in range(rounds):
        for i, p in enumerate(PROMPTS):
            order = engines if (r * 2 + i) % 2 == 0 else engines[::-1]
            for e in order:
                other = [x for x in engines if x != e][0]
                c0 = {x: cpu(srv[x][1]) for x in engines}
                g = openai_generate(srv[e][0], p, 64, 0.0, 1)
                c1 = {x: cpu(srv[x][1]) for x in engines}
                rate = len(g.tokens) / (g.wall_seconds - g.prefill_seconds)
                rates[e].append(rate)
                print(f"{e:13s} {rate:6.2f} tok/s  wall {g.wall_seconds:5.2f}s  own cpu {c1[e]-c0[e]:6.2f}s  idle {other} cpu {c1[other]-c0[other]:5.2f}s", flush=True)
    pairs = [a / b for a, b in zip(rates["python"], rates["llama-server"])]
    print("python/llama-server per pair:", " ".join(f"{x:.3f}" for x in pairs), "geo mean %.3f" % statistics.geometric_mean(pairs))
