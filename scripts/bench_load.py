#!/usr/bin/env python3
"""Many users at once: `make bench-load` (JSON, a Markdown table, a plot).

llama-server with --parallel P (1, 2, 4) and P concurrent clients, each a stream of
--requests requests over the shipped prompts (code, prose, repetitive, structured), for
speculation off, fixed n-max 1 and 3 and the profile's own adaptive length (the cpu
profile's, as shipped; every arm of a slot count loaded at once and measured in turn, --rounds
times), greedy and at Gemma's sampling (T 1, top-k 64, top-p 0.95): total
generated tokens/s, per-request latency (median, p90), acceptance per slot, and per pair
kind the number of users at which the drafter stops paying (gguf_exact/bench/load.py).

Pairs: --pair KIND=TARGET.gguf,DRAFTER.gguf (repeatable; files are only read), or the tiny
pairs made on the spot (--shape tiny, the default: hidden and mixed), or full-size ones
made under --work (--shape e2b|e4b --kinds hidden,mixed,real; `gguf-exact make-pair`).

    .venv/bin/python scripts/bench_load.py                       # tiny pairs, a minute
    .venv/bin/python scripts/bench_load.py --rounds 2 --n-predict 24 \
        --pair hidden=pairs/e2b/target.gguf,pairs/e2b/drafter.gguf --out results/bench-load-e2b
    .venv/bin/python scripts/bench_load.py --profile gtx1650ti-vulkan --vulkan-devices 0   # on lavapipe
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from gguf_exact.bench.load import ARMS, SAMPLERS, LoadRequest, LoadResult, load_arm, measure_load, table
from gguf_exact.bench.plot import plot_load
from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.bench.report import machine
from gguf_exact.errors import ArgumentError, GgufExactError


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pairs_from(args: argparse.Namespace, scratch: Path) -> dict[str, tuple[Path, Path]]:
    """``{kind: (target, drafter)}``: --pair's files, else the pairs of --shape."""
    if args.pair:
        out = {}
        for item in args.pair:
            kind, _, files = item.partition("=")
            target, _, drafter = files.partition(",")
            for f in (target, drafter):
                if not Path(f).is_file():
                    raise SystemExit(f"error: --pair {kind}: {f or '(none)'}: no such file")
            out[kind] = (Path(target), Path(drafter))
        return out
    kinds = args.kinds.split(",")
    if args.shape == "tiny":
        from gguf_exact.tiny.pairs import write_runner_pairs

        made = write_runner_pairs(scratch)
        return {k: made[k] for k in kinds}
    from gguf_exact.tiny.full_pair import cycle_ids, write_drafter, write_pair
    from gguf_exact.tiny.vocab import gemma4_vocabulary

    folder = args.work / args.shape
    target = folder / "target.gguf"
    if not target.is_file():
        log(f"{args.shape}: make-pair (hidden)")
        write_pair(folder, args.shape, "hidden")
    out = {}
    for kind in kinds:
        drafter = folder / ("drafter.gguf" if kind == "hidden" else f"{kind}-drafter.gguf")
        if not drafter.is_file():
            log(f"{args.shape}: {kind} drafter")
            write_drafter(drafter, args.shape.upper(), kind, cycle_ids(gemma4_vocabulary()), target)
        out[kind] = (target, drafter)
    return out


def keep(out: Path, results: list[dict], files: list[str], group: list[LoadResult]) -> None:
    """Add a slot count's results to ``results`` and write them all to ``out/partial.json``
    (a long run interrupted keeps what it finished)."""
    results.extend(r.as_dict() | {"files": files} for r in group)
    (out / "partial.json").write_text(json.dumps(results, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", action="append", default=[], metavar="KIND=TARGET,DRAFTER")
    ap.add_argument("--shape", default="tiny", choices=("tiny", "e2b", "e4b"))
    ap.add_argument("--kinds", default="hidden,mixed")
    ap.add_argument("--work", type=Path, default=Path("build/real-pairs"), help="where full-size pairs are made")
    ap.add_argument("--parallel", default="1,2,4", help="slot counts, each with as many clients")
    ap.add_argument(
        "--arms",
        default=",".join(a.label for a in ARMS),
        help="of: " + ", ".join(a.label for a in ARMS) + "; ARM@KEY=VALUE: that arm with an override, a peer "
        "measured side by side (adaptive@kv-unified=false: a cache per slot)",
    )
    ap.add_argument("--samplers", default=",".join(SAMPLERS))
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--requests", type=int, default=1, help="requests per client and round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds: every arm in turn, each its requests per client")
    ap.add_argument("--ctx-per-slot", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument(
        "--vulkan-devices", default=None, help="a Vulkan profile's devices, as serve's (0: Mesa's lavapipe, on the CPU)"
    )
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE over the profile (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("build/bench-load"))
    args = ap.parse_args()
    try:
        arms = {a: load_arm(a) for a in args.arms.split(",")}
    except ArgumentError as e:
        ap.error(str(e))
    bad = [s for s in args.samplers.split(",") if s not in SAMPLERS]
    if bad:
        ap.error(f"unknown sampler: {', '.join(bad)}")
    sets = (f"threads={args.threads}", f"threads-batch={args.threads}", "no-warmup=true", *args.set)
    t0 = time.time()
    load_before = os.getloadavg()
    results: list[dict] = []
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as scratch:
        for kind, (target, drafter) in pairs_from(args, Path(scratch)).items():
            req = LoadRequest(
                kind,
                target,
                drafter,
                load_prompts(),
                parallels=tuple(int(p) for p in args.parallel.split(",")),
                arms=tuple(arms[a] for a in args.arms.split(",")),
                samplers=tuple(args.samplers.split(",")),
                n_predict=args.n_predict,
                requests=args.requests,
                rounds=args.rounds,
                ctx_per_slot=args.ctx_per_slot,
                sets=sets,
                profile=args.profile,
                vulkan_devices=args.vulkan_devices,
            )
            measure_load(req, log, partial(keep, args.out, results, [str(target), str(drafter)]))
    meta = {
        "args": {k: str(v) for k, v in vars(args).items()},
        **machine(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "seconds": time.time() - t0,
    }
    (args.out / "bench-load.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (args.out / "partial.json").unlink()
    md = table(results)
    (args.out / "bench-load.md").write_text(md)
    print(md, flush=True)
    try:
        log(f"plot: {plot_load(results, args.out / 'bench-load.png')}")
    except GgufExactError as e:  # matplotlib is optional (the bench extra): the table stands alone
        log(f"no plot: {e}")
    la, lb = meta["load_average_before"], meta["load_average_after"]
    print(f"load average before {la[0]:.2f}, after {lb[0]:.2f}; {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
