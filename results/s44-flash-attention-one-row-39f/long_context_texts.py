"""Greedy texts past 512 cells of context: the target alone against fixed n-max 3, llama-server built
without 39f (OLD) and with it (NEW), on the tiny pairs (scripts/soak_load.py's). Prints, per build and
pair, how many of the prompts' 64-token texts under speculation differ from the target alone's."""
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.bench.real import running
from gguf_exact.bench.request import fixed_length
from gguf_exact.tiny.pairs import write_runner_pairs

OLD, NEW = Path(sys.argv[1]), Path(sys.argv[2])
EXTRA = [s for s in __import__("os").environ.get("EXTRA_SETS", "").split() if s]
KINDS = sys.argv[3].split(",") if len(sys.argv) > 3 else ["mixed"]


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


prompts = load_prompts()
filler = " ".join(prompts.values())
out = {}
ALL = {}
with tempfile.TemporaryDirectory() as scratch:
    pairs = write_runner_pairs(scratch)
    for kind in KINDS:
        target, drafter = pairs[kind]
        for label, binary in (("without 39f", OLD), ("with 39f", NEW)):
            texts = {}
            for arm, dr in (("alone", None), ("n-max 3", drafter)):
                sets = ["threads=2", "threads-batch=2", "ctx-size=2048", "parallel=1", "no-warmup=true", *fixed_length(3 if dr else 0), *EXTRA]
                with running(target, dr, "llama-server", sets, "cpu", server_bin=binary) as (launch, _, _):
                    for name, p in prompts.items():
                        for lead in (0, 1):  # short context, then past 512 cells
                            body = {"prompt": (filler + " " if lead else "") + p, "n_predict": 64, "temperature": 0, "cache_prompt": False}
                            r = post(launch.url.rstrip("/") + "/completion", body)
                            texts[arm, name, lead] = (r["content"], r["tokens_evaluated"])
            ALL.update({(kind, label, *k): v for k, v in texts.items()})
            for lead in (0, 1):
                names = list(prompts)
                differ = [n for n in names if texts["alone", n, lead][0] != texts["n-max 3", n, lead][0]]
                ctx = sorted({texts["alone", n, lead][1] for n in names})
                line = f"{kind} {label}: prompt tokens {ctx[0]}-{ctx[-1]}: {len(differ)} of {len(names)} texts differ from the target alone's {differ}"
                print(line, flush=True)
                out[f"{kind} {label} {'long' if lead else 'short'}"] = {"prompt_tokens": ctx, "differ": differ, "of": len(names)}
json.dump(out, open("/tmp/s44/long-ctx-texts.json", "w"), indent=1)
json.dump({"|".join(map(str, k)): v for k, v in ALL.items()}, open("/tmp/s44/long-ctx-all-texts.json", "w"), indent=1)
