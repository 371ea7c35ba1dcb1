"""llama-server before and after a patch, whole process, at E2B past 512 cells: one long prompt, then 64 tokens greedy.

Each build's llama-server (the project's CPU build, 2 threads, flash attention auto = on, the default window
cache), the target alone and the `mixed` drafter at n-max 3, builds alternated A B B A; each server answers the
same prompt (all four shipped prompts, twice: about 1,200 tokens) after a short warm-up request (cache_prompt off).
Prints llama-server's own timings.

    python server_speed.py OLD_BIN NEW_BIN E2B_DIR [gemma]

With `gemma`: Gemma's sampler (temperature 1.0, top-k 64, top-p 0.95, seed 1) and the drafter verified by rejection
sampling (`--spec-rejection-sampling`); texts then compared build against build only (a seed gives the target's
distribution, not the target alone's text).
"""
import json, subprocess, sys, time, urllib.request
from pathlib import Path
from gguf_exact.bench.prompt_set import load_prompts

OLD, NEW, E2B = sys.argv[1], sys.argv[2], Path(sys.argv[3])
GEMMA = len(sys.argv) > 4 and sys.argv[4] == "gemma"
SAMPLER = {"temperature": 1.0, "top_k": 64, "top_p": 0.95, "seed": 1} if GEMMA else {"temperature": 0}
prompt = " ".join([" ".join(load_prompts().values())] * 2)


def post(port, text=None, n_predict=64):
    body = {"prompt": text or prompt, "n_predict": n_predict, "cache_prompt": False, **SAMPLER}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1200) as r:
        return json.loads(r.read())


def run(binary, draft):
    cmd = [binary, "--model", str(E2B / "target.gguf"), "--host", "127.0.0.1", "--port", "18200", "--threads", "2",
           "--threads-batch", "2", "--ctx-size", "4096", "--parallel", "1", "--no-warmup", *draft]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen("http://127.0.0.1:18200/health", timeout=1); break
            except Exception:
                time.sleep(0.2)
        post(18200, "Hello", 4)
        r = post(18200)
    finally:
        p.terminate(); p.wait()
    t = r["timings"]
    return t["prompt_n"], t["prompt_per_second"], t["predicted_per_second"], r["content"]


arms = {"alone": [], "n-max 3": ["--model-draft", str(E2B / "mixed-drafter.gguf"), "--spec-type", "draft-mtp", "--spec-draft-n-max", "3",
                                *(["--spec-rejection-sampling"] if GEMMA else [])]}
texts = {}
for arm, draft in arms.items():
    for name in ("old", "new", "new", "old"):
        n, pp, tg, text = run(OLD if name == "old" else NEW, draft)
        texts.setdefault((arm, name), set()).add(text)
        print(f"{arm:8s} {name}: prompt {n} tokens {pp:6.2f} tok/s, generation {tg:6.2f} tok/s", flush=True)
alone_new = texts["alone", "new"]
print("texts: each build's the same in both runs:", all(len(v) == 1 for v in texts.values()),
      "| n-max 3 equals the target alone, old build:", texts["n-max 3", "old"] == texts["alone", "old"],
      "new build:", texts["n-max 3", "new"] == alone_new)
