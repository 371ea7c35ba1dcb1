#!/usr/bin/env python3
"""The soak: 4 clients against llama-server --parallel 4 for --duration seconds, every reply
checked against the target alone's text (greedy): no request lost or changed.

The target alone (no drafter, one slot) first answers each shipped prompt once: the reference.
Then the drafter's server (--n-max N fixed, or the profile's adaptive length with
--n-max adaptive) takes --clients streams of requests until --duration has passed
(gguf_exact/bench/load.py's client_streams). Prints requests, tokens, accepted/drafted per
slot and every changed or lost reply; exits 1 if there is one (or if nothing was drafted).

    .venv/bin/python scripts/soak_load.py --duration 600               # the tiny mixed pair
    .venv/bin/python scripts/soak_load.py --duration 150 --kind hidden --json build/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from gguf_exact.bench.load import LoadArm, changed, client_streams, per_slot
from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.bench.real import running


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of requests (default: 10 minutes)")
    ap.add_argument("--kind", default="mixed", help="tiny pair: mixed (drafts rejected part of the time) or hidden")
    ap.add_argument("--pair", metavar="TARGET,DRAFTER", help="these files instead of a tiny pair")
    ap.add_argument("--clients", type=int, default=4, help="clients, and llama-server's --parallel")
    ap.add_argument("--n-max", default="3", help="a fixed draft length, or 'adaptive': the profile's own")
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--json", type=Path, help="write the figures and every changed reply here")
    args = ap.parse_args()
    adaptive = args.n_max == "adaptive"
    if not adaptive and not args.n_max.isdigit():
        ap.error(f"--n-max {args.n_max}: a whole number or 'adaptive'")
    arm = LoadArm("adaptive" if adaptive else f"n-max {args.n_max}", 4 if adaptive else int(args.n_max), adaptive)
    sets = [f"threads={args.threads}", f"threads-batch={args.threads}", "no-warmup=true"]
    prompts = load_prompts()
    with tempfile.TemporaryDirectory(prefix="soak-load-") as scratch:
        if args.pair:
            target, _, drafter = args.pair.partition(",")
            pair = (Path(target), Path(drafter))
        else:
            from gguf_exact.tiny.pairs import write_runner_pairs

            pair = write_runner_pairs(scratch)[args.kind]
        with running(pair[0], None, "llama-server", [*sets, "parallel=1", "ctx-size=512"], args.profile) as (ref, _, _):
            alone, _ = client_streams(ref.url, prompts, 1, args.n_predict, requests=len(prompts))
        if [r for r in alone if r.error]:
            print(f"error: the target alone lost a request: {[r.error for r in alone if r.error][0]}")
            return 1
        reference = {r.prompt: r.text for r in alone}
        slot_sets = [*sets, f"parallel={args.clients}", f"ctx-size={512 * args.clients}", *arm.overrides()]
        print(f"{args.clients} clients, {arm.label}, {args.duration:.0f} s on {pair[0].name} + {pair[1]}", flush=True)
        with running(pair[0], pair[1], "llama-server", slot_sets, args.profile) as (launch, _, _):
            t0 = time.time()
            replies, wall = client_streams(launch.url, prompts, args.clients, args.n_predict, seconds=args.duration)
    bad = changed(replies, reference)
    slots = per_slot(replies)
    drafted = sum(d for _, d in slots.values())
    print(
        f"{len(replies)} requests in {wall:.0f} s ({sum(len(r.tokens) for r in replies)} tokens), "
        f"{sum(1 for r in replies if r.error)} lost, {len(bad)} changed or lost; accepted/drafted per slot: "
        + ", ".join(f"{s}: {a}/{d}" for s, (a, d) in slots.items())
    )
    for r in bad[:10]:
        print(f"  client {r.client} request {r.index} ({r.prompt}, slot {r.slot}): {r.error or repr(r.text[:80])}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "started": t0,
                    "wall_seconds": wall,
                    "requests": len(replies),
                    "per_client": [sum(1 for r in replies if r.client == c) for c in range(args.clients)],
                    "per_slot": {str(k): list(v) for k, v in slots.items()},
                    "changed": [asdict(r) for r in bad],
                },
                indent=1,
            )
            + "\n"
        )
    if not drafted:
        print("error: nothing was drafted: the soak did not exercise speculation")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
