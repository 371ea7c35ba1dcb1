#!/usr/bin/env python3
"""Two llama-server builds side by side in one run, and the target alone beside them: what a change to
the carried patches (the draft policy, say) gives, measured whole process against whole process.

Each build is started as `serve` starts one (the cpu profile, --set overrides, the same drafter) with
--server-bin; the target alone runs on the --new build. Every arm loaded at once, then --rounds rounds of
the same requests (the shipped prompts, --n-predict tokens, ignore_eos, one seed per prompt and round) in
A B C C B A order, so a slow minute of a shared host falls on every arm alike. Prints and writes (--out,
JSON) per arm the tokens, seconds and tokens/s of generation (llama-server's own timings), the drafts made
and kept, and each drafting arm against the target alone.

    .venv/bin/python scripts/bench_builds.py --target T.gguf --drafter D.gguf \\
        --old ~/.cache/gguf-exact/llama.cpp/<old key>/bin/llama-server --new <new key>/bin/llama-server
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path

from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.bench.real import running
from gguf_exact.bench.report import machine
from gguf_exact.bench.request import SAMPLERS
from gguf_exact.engines.shared.http import post_json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--old", type=Path, required=True, help="the llama-server before the change")
    ap.add_argument("--new", type=Path, required=True, help="the llama-server after it (also runs the target alone)")
    ap.add_argument("--sampler", default="gemma", choices=sorted(SAMPLERS))
    ap.add_argument("--prompts", default="code,prose", help="shipped prompt names, comma-separated")
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE over the profile, every arm (repeatable)")
    ap.add_argument("--out", type=Path, default=None, help="a JSON file for the figures")
    args = ap.parse_args()
    for name in ("target", "drafter", "old", "new"):
        if not getattr(args, name).is_file():
            ap.error(f"--{name} {getattr(args, name)}: no such file")
    sets = [f"threads={args.threads}", f"threads-batch={args.threads}", "ctx-size=1024", *args.set]
    arms = {"alone": (args.new, None), "old": (args.old, args.drafter), "new": (args.new, args.drafter)}
    prompts = list(load_prompts(args.prompts.split(",")).values())
    got: dict[str, list[dict]] = {name: [] for name in arms}
    with ExitStack() as stack:
        urls = {}
        for name, (binary, drafter) in arms.items():
            launch, _, _ = stack.enter_context(
                running(args.target, drafter, "llama-server", sets, args.profile, server_bin=binary)
            )
            post_json(launch.url + "/completion", {"prompt": "Warm-up.", "n_predict": 2, "cache_prompt": False})
            urls[name] = launch.url
        order = list(arms)
        for r in range(args.rounds):
            forward, backward = (order, order[::-1]) if r % 2 == 0 else (order[::-1], order)
            for name in forward + backward:
                for i, prompt in enumerate(prompts):
                    body = {"prompt": prompt, "n_predict": args.n_predict, "ignore_eos": True, "cache_prompt": False}
                    body |= SAMPLERS[args.sampler] | {"seed": 1 + i + 10 * r}
                    got[name].append(post_json(urls[name] + "/completion", body)["timings"])
    figures: dict[str, dict] = {}
    for name, timings in got.items():
        tokens, seconds = sum(t["predicted_n"] for t in timings), sum(t["predicted_ms"] for t in timings) / 1e3
        drafted, kept = sum(t.get("draft_n", 0) for t in timings), sum(t.get("draft_n_accepted", 0) for t in timings)
        figures[name] = {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds}
        figures[name] |= {"drafted": drafted, "accepted": kept}
    for name in ("old", "new"):
        figures[name]["vs_alone"] = figures[name]["tokens_per_second"] / figures["alone"]["tokens_per_second"]
        f = figures[name]
        print(
            f"{name}: {f['tokens_per_second']:.2f} tokens/s, {f['vs_alone']:.3f}x the target alone "
            f"({figures['alone']['tokens_per_second']:.2f}); drafts kept {f['accepted']}/{f['drafted']}"
        )
    if args.out:
        meta = {"args": {k: str(v) for k, v in vars(args).items()}, **machine()}
        args.out.write_text(json.dumps({"meta": meta, "arms": figures}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
