"""llama-server's greedy texts, the target alone against n-max 3, one request at a time and two at once.

The project's command line for the cpu profile's essentials (2 threads, flash attention auto = on, the
server's default sliding-window cache and checkpoints), --parallel 2, the tiny pairs of scripts/soak_load.py.
Prompts: the four shipped prompts as they are (115-189 tokens) and after all four (about 700 tokens).
One at a time: each prompt alone. Two at once: each short prompt's request, and 0.2 s later a long prompt's
request (the other slot reads its prompt while the first decodes: their rows share batches). Every text is
compared with the target alone's one-at-a-time text of the same prompt.

    python server_texts.py BIN [PAIR,...]
"""
import json, subprocess, sys, tempfile, threading, time, urllib.request
from pathlib import Path
from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.tiny.pairs import write_runner_pairs

BIN = sys.argv[1]
PAIRS = (sys.argv[2] if len(sys.argv) > 2 else "mixed,random").split(",")
prompts = load_prompts()
filler = " ".join(prompts.values())
PROMPTS = {**{f"{n}": p for n, p in prompts.items()}, **{f"{n}+long": filler + " " + p for n, p in prompts.items()}}


def post(port, prompt):
    body = {"prompt": prompt, "n_predict": 64, "temperature": 0, "cache_prompt": False}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())["content"]


def serve(target, draft_args, port):
    cmd = [BIN, "--model", str(target), "--host", "127.0.0.1", "--port", str(port), "--threads", "2", "--threads-batch", "2",
           "--ctx-size", "4096", "--parallel", "2", "--no-warmup", *draft_args]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except Exception:
            time.sleep(0.1)
    p.kill()
    raise SystemExit("llama-server did not start")


with tempfile.TemporaryDirectory() as s:
    pairs = write_runner_pairs(s)
    for pair in PAIRS:
        target, drafter = pairs[pair]
        alone_texts = None
        for arm, draft in (("alone", []), ("n-max 3", ["--model-draft", str(drafter), "--spec-type", "draft-mtp", "--spec-draft-n-max", "3"])):
            p = serve(target, draft, 18100)
            try:
                one = {n: post(18100, pr) for n, pr in PROMPTS.items()}
                two = {}
                for n in prompts:
                    long_name = list(prompts)[(list(prompts).index(n) + 1) % len(prompts)] + "+long"
                    out = {}
                    a = threading.Thread(target=lambda: out.__setitem__(n, post(18100, PROMPTS[n])))
                    a.start(); time.sleep(0.2)
                    out[long_name] = post(18100, PROMPTS[long_name])
                    a.join()
                    two[n, long_name] = out
            finally:
                p.terminate(); p.wait()
            if alone_texts is None:
                alone_texts = one
            d1 = [n for n in PROMPTS if one[n] != alone_texts[n]]
            d2 = [f"{k}" for pair_k, out in two.items() for k in pair_k if out[k] != alone_texts[k]]
            print(f"{pair} {arm}: one at a time {len(d1)} of {len(PROMPTS)} differ {d1}; two at once {len(d2)} of {2 * len(two)} differ {d2}", flush=True)
