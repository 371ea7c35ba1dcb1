"""llama-server launched directly (the project's command line for the cpu profile, plus EXTRA args), the tiny
mixed pair, the four prompts after all four: greedy texts of the target alone against n-max 3."""
import json, os, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path
from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.tiny.pairs import write_runner_pairs

BIN = sys.argv[1]
EXTRA = sys.argv[2:]
prompts = load_prompts()
filler = " ".join(prompts.values())

def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())

with tempfile.TemporaryDirectory() as s:
    t, d = write_runner_pairs(s)["mixed"]
    texts = {}
    for arm, draft in (("alone", []), ("n-max 3", ["--model-draft", str(d), "--spec-type", "draft-mtp", "--spec-draft-n-max", "3"])):
        port = 18000 + len(texts)
        cmd = [BIN, "--model", str(t), "--host", "127.0.0.1", "--port", str(port), "--threads", "2", "--threads-batch", "2",
               "--ctx-size", "2048", "--parallel", "1", "--no-warmup", "--log-file", f"/tmp/s44/direct-{arm.replace(' ', '')}.log", *draft, *EXTRA]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); break
                except Exception:
                    time.sleep(0.1)
            for name, pr in prompts.items():
                r = post(f"http://127.0.0.1:{port}/completion", {"prompt": filler + " " + pr, "n_predict": 64, "temperature": 0, "cache_prompt": False})
                texts[arm, name] = r["content"]
        finally:
            p.terminate(); p.wait()
    differ = [n for n in prompts if texts["alone", n] != texts["n-max 3", n]]
    print(" ".join(EXTRA) or "(as served)", f": {len(differ)} of {len(prompts)} differ {differ}", flush=True)
