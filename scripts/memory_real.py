"""The memory plan at real shape against what llama-server logs (`make memory-real`).

For each full-size pair (`gguf-exact make-pair`) and each profile's memory settings
(context size, flash attention, n-max of cpu, rtx3050 and gtx1650ti), starts the CPU
llama-server with `--log-verbosity 4`, reads the buffers it logs (weights, KV cache,
compute) and prints them beside `plan_memory`'s figures with their ratio. A GPU
profile's settings run on the CPU build here: the sizes of the KV cache and compute
buffers do not depend on the device; which weights go to the GPU is not checked.

    .venv/bin/python scripts/memory_real.py /tmp/wt18-pairs/e2b-hidden /tmp/wt18-pairs/e4b-hidden --out build/memory-real.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.logged_buffers import compare, logged_buffers
from gguf_exact.engines.shared.knobs import BY_KEY
from gguf_exact.engines.shared.memory_plan import plan_memory
from gguf_exact.engines.shared.process import free_port
from gguf_exact.engines.shared.profiles import load_profile
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.engines.shared.settings import LOG_FILE, ServeSettings
from gguf_exact.engines.shared.status import stop_server

PROFILES = ("cpu", "rtx3050", "gtx1650ti")
MEMORY_KEYS = ("ctx-size", "flash-attn", "ubatch-size", "batch-size", "parallel")


def cpu_profile_like(name: str, threads: int):
    """The cpu profile with ``name``'s memory settings (and its n-max), logging buffers."""
    config = serving_config(load_profile(name), with_draft=True)
    sets = [f"{key}={config.value(BY_KEY[key].name)}" for key in MEMORY_KEYS if getattr(config.options, BY_KEY[key].name) is not None]
    sets.append(f"spec-draft-n-max={config.n_max}")
    return load_profile("cpu").with_overrides([*sets, f"threads={threads}", "no-warmup=true", "log-verbosity=4"])


def measure(folder: Path, name: str, threads: int) -> dict:
    target, drafter = folder / "target.gguf", folder / "drafter.gguf"
    profile = cpu_profile_like(name, threads)
    plan = plan_memory(target, drafter, serving_config(profile, drafter is not None).memory_inputs())
    with tempfile.TemporaryDirectory(prefix="memory-real-") as run:
        os.environ["GGUF_EXACT_RUN_DIR"] = run
        launch = plan_launch(ServeSettings(target, drafter, profile, port=free_port()))
        start_server(launch, detach=True, timeout=600)
        try:
            log = (launch.run_dir / LOG_FILE).read_text()
        finally:
            stop_server(launch.port)
    models = logged_buffers(log)
    rows = compare(plan, models)
    return {
        "logged": [{"weights": m.weights, "kv": m.kv, "compute": m.compute, "output": m.output} for m in models],
        "pair": folder.name,
        "profile": name,
        "ctx_size": plan.n_ctx,
        "rows": [
            {"what": r.what, "planned_mib": r.planned_mib, "logged_mib": r.logged_mib, "ratio": r.ratio} for r in rows
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", type=Path, help="folders written by gguf-exact make-pair")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = []
    for folder in args.pairs:
        for name in args.profiles.split(","):
            r = measure(folder, name, args.threads)
            results.append(r)
            for row in r["rows"]:
                print(
                    f"{r['pair']:<12} {name:<10} ctx {r['ctx_size']:>6}  {row['what']:<16} plan {row['planned_mib']:>10.2f} MiB"
                    f"  logged {row['logged_mib']:>10.2f} MiB  ratio {row['ratio']:.3f}",
                    flush=True,
                )
    worst = max(abs(row["ratio"] - 1) for r in results for row in r["rows"])
    print(f"largest difference: {worst:.1%}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
