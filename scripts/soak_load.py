#!/usr/bin/env python3
"""The soak: 4 clients against llama-server --parallel 4 for --duration seconds, every reply
checked against the target alone's text (greedy): no request lost or changed.

The target alone (no drafter, one slot) first answers each shipped prompt once: the reference.
Then the drafter's server (--n-max N fixed, or the profile's adaptive length with
--n-max adaptive) takes --clients streams of requests until --duration has passed
(gguf_exact/bench/load.py's client_streams). Prints requests, tokens, accepted/drafted per
slot and every changed or lost reply with where it left the target alone's tokens and the
target's top-two gap there; exits 1 on a lost reply or a change that is not a near-tie flip
(or if nothing was drafted); with --exact any change fails: on x86 CPU builds every row of a pass is the
row decoded alone in every file type tested (patches 38m-38o, 39f-39j, 39m-39o), so not even a near-tie may flip.

    .venv/bin/python scripts/soak_load.py --duration 600               # the tiny mixed pair
    .venv/bin/python scripts/soak_load.py --duration 150 --kind hidden --json build/soak.json
    .venv/bin/python scripts/soak_load.py --duration 600 --long   # contexts past 512 cells
    .venv/bin/python scripts/soak_load.py --duration 240 --exact --pair T.gguf,D.gguf --server-bin OLD/llama-server

--long puts all four prompts before each one (about 700 tokens, 1,024 cells a slot): past the 512
cells where flash attention's kernels used to part ways (patches 39f, 39g), with llama-server
checkpointing its sliding-window cache while it reads each prompt.
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

NEAR_TIE = 0.02  # logits between the target's top two: a batch's other summation order can flip it


def departures(
    target: Path, prompts: dict[str, str], alone: dict[str, list[int]], bad: list, n_ctx: int = 512
) -> list[str]:
    """Where each changed reply first left the target alone's tokens, with the target's own
    top-two gap there (the bindings, one row at a time); a reply that left at a near-tie
    (gap < NEAR_TIE) for the runner-up is marked so: the other slots' rows in the same pass
    change the matmul's summation order, not what was accepted. Any other is a real change."""
    import numpy as np
    from llama_cpp import Llama

    model = Llama(str(target), n_ctx=n_ctx, n_threads=2, logits_all=True, verbose=False)
    out = []
    for r in bad:
        if r.error:
            out.append(f"lost: {r.error}")
            continue
        ref = alone[r.prompt]
        i = next((i for i, (a, b) in enumerate(zip(ref, r.tokens)) if a != b), min(len(ref), len(r.tokens)))
        model.reset()
        model.eval(model.tokenize(prompts[r.prompt].encode(), add_bos=True, special=True) + ref[:i])
        logits = np.asarray(model.scores[model.n_tokens - 1], dtype=np.float64)
        top, second = np.argsort(-logits)[:2]
        gap = float(logits[top] - logits[second])
        tie = i < len(r.tokens) and r.tokens[i] == second and gap < NEAR_TIE
        out.append(f"{'near-tie' if tie else 'CHANGED'} at token {i}: {ref[i] if i < len(ref) else None} -> "
                   f"{r.tokens[i] if i < len(r.tokens) else None}, top-2 gap {gap:.4f}")  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of requests (default: 10 minutes)")
    ap.add_argument("--kind", default="mixed", help="tiny pair: mixed (drafts rejected part of the time) or hidden")
    ap.add_argument("--pair", metavar="TARGET,DRAFTER", help="these files instead of a tiny pair")
    ap.add_argument("--clients", type=int, default=4, help="clients, and llama-server's --parallel")
    ap.add_argument(
        "--n-max",
        default="3",
        help="a fixed draft length (0: no drafter, the control), or 'adaptive': the profile's own",
    )
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--long", action="store_true", help="all four prompts before each (about 700 tokens)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--json", type=Path, help="write the figures and every changed reply here")
    ap.add_argument("--exact", action="store_true", help="any changed reply fails, a near-tie flip too (CPU builds)")
    ap.add_argument(
        "--server-bin", type=Path, help="another build's llama-server, for both servers (serve --server-bin)"
    )
    args = ap.parse_args()
    if args.server_bin and not (args.server_bin.is_file() and os.access(args.server_bin, os.X_OK)):
        ap.error(f"--server-bin {args.server_bin}: no such executable")
    adaptive = args.n_max == "adaptive"
    if not adaptive and not args.n_max.isdigit():
        ap.error(f"--n-max {args.n_max}: a whole number or 'adaptive'")
    arm = LoadArm("adaptive" if adaptive else f"n-max {args.n_max}", 4 if adaptive else int(args.n_max), adaptive)
    sets = [f"threads={args.threads}", f"threads-batch={args.threads}", "no-warmup=true"]
    prompts = load_prompts()
    ctx = 512
    if args.long:
        filler = " ".join(prompts.values())
        prompts = {f"{name}+long": f"{filler} {text}" for name, text in prompts.items()}
        ctx = 1024
    with tempfile.TemporaryDirectory(prefix="soak-load-") as scratch:
        if args.pair:
            target, _, drafter = args.pair.partition(",")
            pair = (Path(target), Path(drafter))
        else:
            from gguf_exact.tiny.pairs import write_runner_pairs

            pair = write_runner_pairs(scratch)[args.kind]
        reference_sets = [*sets, "parallel=1", f"ctx-size={ctx}"]
        build = {"server_bin": args.server_bin}  # this checkout's llama-server unless --server-bin names another
        with running(pair[0], None, "llama-server", reference_sets, args.profile, **build) as (ref, _, _):
            alone, _ = client_streams(ref.url, prompts, 1, args.n_predict, requests=len(prompts))
        if [r for r in alone if r.error]:
            print(f"error: the target alone lost a request: {[r.error for r in alone if r.error][0]}")
            return 1
        reference = {r.prompt: r.text for r in alone}
        slot_sets = [*sets, f"parallel={args.clients}", f"ctx-size={ctx * args.clients}", *arm.overrides()]
        print(f"{args.clients} clients, {arm.label}, {args.duration:.0f} s on {pair[0].name} + {pair[1]}", flush=True)
        drafter = pair[1] if arm.n_max else None  # --n-max 0: the control, the same load without a drafter
        with running(pair[0], drafter, "llama-server", slot_sets, args.profile, **build) as (launch, _, _):
            t0 = time.time()
            replies, wall = client_streams(launch.url, prompts, args.clients, args.n_predict, seconds=args.duration)
        bad = changed(replies, reference)
        found = departures(pair[0], prompts, {r.prompt: r.tokens for r in alone}, bad, ctx) if bad else []
    slots = per_slot(replies)
    drafted = sum(d for _, d in slots.values())
    print(
        f"{len(replies)} requests in {wall:.0f} s ({sum(len(r.tokens) for r in replies)} tokens), "
        f"{sum(1 for r in replies if r.error)} lost, {len(bad)} changed or lost; accepted/drafted per slot: "
        + ", ".join(f"{s}: {a}/{d}" for s, (a, d) in slots.items())
    )
    for r, why in zip(bad, found):
        print(f"  client {r.client} request {r.index} ({r.prompt}, slot {r.slot}): {why}")
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
                    "changed": [asdict(r) | {"departure": why} for r, why in zip(bad, found)],
                },
                indent=1,
            )
            + "\n"
        )
    if arm.n_max and not drafted:
        print("error: nothing was drafted: the soak did not exercise speculation")
        return 1
    return 1 if any(args.exact or not why.startswith("near-tie") for why in found) else 0


if __name__ == "__main__":
    sys.exit(main())
