"""llama-server before/after a patch (OLD_BIN, NEW_BIN), one binary at a time (A B B A), arms side by side within a call."""
import sys, json, os
sys.path.insert(0, "/work/main/scripts")
from pathlib import Path
from gguf_exact.bench.real import Arm, arms_side_by_side
from bench_real import PROMPTS
W = Path(os.environ.get("PAIR_DIR", "/work/bench/real26/e2b/sampled"))
drafter = W / os.environ.get("DRAFTER", "drafter.gguf")
bins = {"old": os.environ["OLD_BIN"], "new": os.environ["NEW_BIN"]}
sampler = os.environ.get("SAMPLER", "gemma")
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
n_predict = int(os.environ.get("N_PREDICT", "64"))
arms = [Arm("llama-server", 0, sampler=sampler, label="alone"),
        Arm("llama-server", 4, True, sampler=sampler, rule="rejection", label="adaptive-rejection"),
        Arm("llama-server", 4, True, sampler=sampler, rule="exact", label="adaptive-exact")]
if os.environ.get("FIXED3"):
    arms.append(Arm("llama-server", 3, False, sampler=sampler, rule="rejection", label="fixed3-rejection"))
sets = ["ctx-size=4096", "no-warmup=true"]
for rep in range(reps):
    for which in (["old", "new"] if rep % 2 == 0 else ["new", "old"]):
        os.environ["GGUF_EXACT_LLAMA_SERVER"] = bins[which]
        res = arms_side_by_side(W / "target.gguf", drafter, arms, list(PROMPTS[:2]), n_predict, sets, "cpu", rounds=1)
        for a, r in zip(arms, res):
            print(json.dumps({"rep": rep, "bin": which, "arm": a.label, "tps": round(r.generation_tokens_per_second, 3),
                              "acc": r.accepted_per_position, "tpp": round(r.tokens_per_target_pass, 3), "rounds": r.draft_rounds, "tokens": r.tokens,
                              "policy": r.policy}), flush=True)
