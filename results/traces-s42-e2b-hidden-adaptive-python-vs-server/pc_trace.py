import sys, json
sys.path.insert(0, "/work/main/scripts")
from pathlib import Path
from gguf_exact.bench.real import Arm, arms_side_by_side
from bench_real import PROMPTS
import os
W = Path(os.environ.get("PAIR_DIR", "/work/bench/real26/e2b"))
kind = sys.argv[1] if len(sys.argv) > 1 else "hidden"
drafter = W / ("drafter.gguf" if kind == "hidden" else f"{kind}-drafter.gguf")
n_max = int(sys.argv[2]) if len(sys.argv) > 2 else 4
adaptive = (sys.argv[3] == "adaptive") if len(sys.argv) > 3 else True
sets = ["ctx-size=4096", "no-warmup=true"]
out = []
import os as _o
for rep in range(int(sys.argv[4]) if len(sys.argv) > 4 else 2):
    for eng in (["python", "llama-server"] if rep % 2 == 0 else ["llama-server", "python"]):
        _o.environ["LLAMA_SPEC_DRAFT_TRACE"] = f"trace-{rep}-{eng}"
        [r] = arms_side_by_side(W / "target.gguf", drafter, [Arm(eng, n_max, adaptive)], list(PROMPTS[:2]), 64, sets, "cpu", rounds=1)
        row = {"engine": eng, "tps": round(r.generation_tokens_per_second, 2), "tokens_per_pass": None,
               "draft_rounds": r.draft_rounds, "acc": r.accepted_per_position, "policy": r.policy,
               "py_s": r.python_seconds, "tokens": r.tokens}
        print(json.dumps(row), flush=True)
