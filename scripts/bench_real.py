#!/usr/bin/env python3
"""Speculation at the real models' size: `make bench-real` (one run, JSON and a Markdown table).

For each shape (E2B, E4B) it makes the full-size pair (`gguf-exact make-pair`: the
`hidden` drafter, then the `mixed` and `real` ones beside the same target; `<kind>-full`:
converted with `--full-head`, without its ordered-embedding head) under --work, then:

1. in-process costs (the bindings, --threads): a target pass at 1 and at n-max + 1 rows,
   a drafter step with the ordered head and with the full head and each head's share, the
   speed-up they predict, and (stated as a prediction) what they predict on a card whose
   target pass --card-pass-ms gives;
2. per kind, engine (llama-server, the Python engine; both over HTTP, the same prompts,
   greedy) and arm (the target alone; each fixed n-max of --n-max, the policy off; the
   adaptive draft length up to each bound of --adaptive; each --adaptive-arm, the first
   bound with overrides of its own): tokens/s, acceptance, tokens per target pass, time to
   first token, load time, peak RSS, and whether the text equals the target alone's; each
   adaptive arm against the target alone and the best fixed length of the same group.
   --interleave kind (the default): every arm of a kind, in every engine, loaded at once
   with its own target alone and sent each request in turn (`arms_side_by_side`), so the
   arms a goal compares are measured in the same minutes; --interleave none: one arm at a
   time in every engine, the target alone once for every kind (the runs before issue 23's
   interleaving);
3. many users: llama-server with --parallel P and P concurrent clients (per-request
   acceptance and text against one slot, aggregate tokens/s), and the Python engine
   with the same clients (it queues them);
4. first, --parity: the Python engine vs llama-server on their own default threads (bench/parity.py).

    .venv/bin/python scripts/bench_real.py                      # the full run
    .venv/bin/python scripts/bench_real.py --shapes e2b --n-max 1,3 --n-predict 16 --prompts 1   # a short one
    .venv/bin/python scripts/bench_real.py --shapes e2b --kinds hidden --n-max 3,4 \
        --adaptive-arm spec-draft-p-min=0.5                     # one more adaptive arm beside the others
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from gguf_exact.bench.parity import add_parity_options, parity_run
from gguf_exact.bench.pass_costs import drafter_profile, target_pass_seconds
from gguf_exact.bench.real import ENGINES, Arm, arms_side_by_side, concurrent_arm
from gguf_exact.bench.real_table import adaptive_goals, alone_key, same_arm, table  # noqa: F401  (the tests' names)
from gguf_exact.bench.report import machine
from gguf_exact.bench.request import RULES, SAMPLERS
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.full_pair import cycle_ids, write_drafter, write_pair
from gguf_exact.tiny.pair_walk import KINDS as WALK_KINDS
from gguf_exact.tiny.vocab import gemma4_vocabulary

# Text the made-up vocabulary splits into a few dozen tokens; the target's next token
# depends only on the last one, so each prompt starts the cycle somewhere else.
PROMPTS = (
    "The quick brown fox",
    "def add(a, b):",
    "Once upon a time",
    "SELECT name FROM users",
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_pairs(work: Path, shape: str, kinds: list[str]) -> dict[str, tuple[Path, Path]]:
    """The kinds' drafters beside one target; ``<kind>-full``: the same drafter without its
    ordered-embedding head (``convert --full-head``), which scores all 262,144 tokens. A kind
    that is not one of the cycle target's drafters (:data:`WALK_KINDS`) is a pair of its own,
    as ``make-pair --kind`` writes it (its own target, under ``<shape>/<kind>``; the pair
    writer refuses a kind it does not know)."""
    folder = work / shape
    pairs: dict[str, tuple[Path, Path]] = {}
    for kind in (k for k in kinds if k.removesuffix("-full") not in WALK_KINDS):  # first: a kind refused stops at once
        own = folder / kind
        if not (own / "target.gguf").is_file() or not (own / "drafter.gguf").is_file():
            log(f"{shape}: make-pair --kind {kind}")
            write_pair(own, shape, kind)
        pairs[kind] = (own / "target.gguf", own / "drafter.gguf")
    target, hidden = folder / "target.gguf", folder / "drafter.gguf"
    if not target.is_file() or not hidden.is_file():
        log(f"{shape}: make-pair")
        cycle = list(write_pair(folder, shape, "hidden").cycle)
    else:
        cycle = cycle_ids(gemma4_vocabulary())
    pairs["hidden"] = (target, hidden)  # the cost runs' drafter
    for kind in kinds:
        base, full = kind.removesuffix("-full"), kind.endswith("-full")
        path = folder / (f"{base}-full-head-drafter.gguf" if full else f"{base}-drafter.gguf")
        if kind == "hidden" or base not in WALK_KINDS:
            continue
        if not path.is_file():
            log(f"{shape}: {base} drafter" + (" without its ordered head" if full else ""))
            write_drafter(path, shape.upper(), base, cycle, target, ordered_head=not full)
        pairs[kind] = (target, path)
    return pairs


def costs(target: Path, drafter: Path, full: Path, n_max_list: list[int], threads: int, gpu_layers: int) -> dict:
    rows = sorted({1, *(n + 1 for n in n_max_list)})
    log("target pass times at " + ", ".join(map(str, rows)) + " rows")
    passes = target_pass_seconds(target, rows, threads, gpu_layers=gpu_layers)
    log("drafter step and its head: ordered head, then the full head")
    prof = drafter_profile(target, drafter, threads, gpu_layers=gpu_layers)
    prof_full = drafter_profile(target, full, threads, gpu_layers=gpu_layers)
    return {
        "target_pass_seconds": {str(k): v for k, v in passes.items()},
        "drafter": prof.as_dict(),
        "drafter_full_head": prof_full.as_dict(),
    }


def shape_run(shape: str, args, prompts: list[str]) -> dict:
    kinds = [k for k in args.kinds.split(",") if k]  # --kinds '': the target alone only
    more = [k for k in args.parity_kinds.split(",") if k and args.parity != "off"]
    pairs = make_pairs(args.work, shape, list(dict.fromkeys(kinds + ["hidden-full"] + more)))
    n_max_list = [int(x) for x in args.n_max.split(",") if x]
    bounds = [int(x) for x in args.adaptive.split(",") if x]
    out: dict = {"shape": shape, "files": {k: [str(p) for p in v] for k, v in pairs.items()}}
    if args.parity != "off":
        out["parity"] = parity_run(args, pairs, (bounds or [0])[0], prompts, log)
        save_partial(args.out, out)
        if args.parity == "only":
            return out
    sets = [f"threads={args.threads}", f"threads-batch={args.threads}", f"ctx-size={args.ctx}", "no-warmup=true"]
    sets += args.set
    cost_n_max = [int(x) for x in (args.cost_n_max or args.n_max).split(",") if x]  # none: the 1-row pass only
    out["costs"] = costs(*pairs["hidden"], pairs["hidden-full"][1], cost_n_max, args.threads, args.gpu_layers)
    arms: list[dict] = []
    engines = args.engines.split(",")
    shared = pairs["hidden"][0]  # the cycle target: every kind's but those with a pair of their own
    # the fixed lengths, the policy's own choice up to each bound (spec-draft-adaptive), then
    # the first bound again with each --adaptive-arm's overrides
    lengths = [(n, False, ()) for n in n_max_list] + [(b, True, ()) for b in bounds]
    lengths += [(bounds[0], True, tuple(x.split(","))) for x in args.adaptive_arm]
    samplers, rules = args.samplers.split(","), args.rules.split(",")

    def side_by_side(kind: str, group: str | None, pair: tuple[Path, Path | None], together: list[Arm]) -> None:
        """Every arm of ``together`` loaded at once; each arm's dict: its kind ("none": the
        target alone) and ``group``, the kind it was interleaved with (None: not interleaved)."""
        log(f"{shape}: {kind}: {len(together)} servers loaded together: " + "; ".join(a.describe() for a in together))
        results = arms_side_by_side(*pair, together, prompts, args.n_predict, sets, args.profile, args.rounds)
        for arm, r in zip(together, results):
            arms.append({"kind": kind if arm.n_max else "none", "group": group} | r.as_dict())
        save_partial(args.out, out | {"arms": arms})

    if args.interleave == "none" or not kinds:  # the target alone once, for every kind of the shared target
        side_by_side("none", None, (shared, None), [Arm(e, 0, sampler=m) for m in samplers for e in engines])
    for kind in kinds:
        own = pairs[kind][0] != shared  # a pair of its own: its own target alone, also when not interleaved
        if args.interleave == "kind":  # every arm of the kind, its own target alone first
            side_by_side(kind, kind, pairs[kind], kind_arms(engines, [(0, False, ()), *lengths], samplers, rules))
        else:
            if own:
                side_by_side(kind, kind, (pairs[kind][0], None), kind_arms(engines, [(0, False, ())], samplers, rules))
            for length in lengths:
                side_by_side(kind, kind if own else None, pairs[kind], kind_arms(engines, [length], samplers, rules))
    out["arms"] = arms
    save_partial(args.out, out)
    if args.parallel:
        many = []
        kind, n_max = "hidden", int(args.parallel_n_max)
        # distinct prompts: no client can reuse another's prefix
        clients_prompts = [PROMPTS[i % len(PROMPTS)] for i in range(max(int(p) for p in args.parallel.split(",")))]

        def clients(engine: str, k: str, slots: int, p: int, **label) -> None:
            """``p`` clients at once on ``engine`` with ``slots`` slots, ``k``'s drafter."""
            r = concurrent_arm(*pairs[k], engine, n_max, slots, clients_prompts[:p], args.n_predict, sets, args.profile)
            many.append({"kind": k, **label} | r.as_dict())

        for p in (int(x) for x in args.parallel.split(",")):
            for k in args.parallel_kinds.split(","):
                log(f"{shape}: llama-server --parallel {p}, {p} clients, {k}, n-max {n_max}")
                clients("llama-server", k, p, p)
                log(f"{shape}: llama-server --parallel 1, {p} clients one at a time, {k}")
                clients("llama-server", k, 1, p, serial=True)
                save_partial(args.out, out | {"concurrent": many})
            if "python" in engines:
                log(f"{shape}: python engine, {p} clients, n-max {n_max}")
                clients("python", kind, 1, p)
        out["concurrent"] = many
    return out


def kind_arms(engines: list[str], lengths: list[tuple], samplers: list[str], rules: list[str]) -> list[Arm]:
    """Per sampler, each length (``(n_max, adaptive, sets)``; n-max 0: the target alone) in
    every engine; a sampled drafting arm once per rule, a greedy one once (exact match: at
    temperature 0 rejection sampling keeps exactly the drafts exact match keeps)."""
    return [
        Arm(e, n, a, s, sampler=m, rule=r)
        for m in samplers
        for n, a, s in lengths
        for r in (rules if n and SAMPLERS[m].get("temperature", 0.0) > 0 else ["exact"])
        for e in engines
    ]


def save_partial(out_dir: Path, result: dict) -> None:
    """What one shape has measured so far (a long run interrupted keeps its figures)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"partial-{result['shape']}.json").write_text(json.dumps(result, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="e2b,e4b")
    ap.add_argument(
        "--kinds",
        default="hidden,mixed,real,hidden-full,mixed-full",
        help="drafters (hidden, mixed, real); <kind>-full: without the ordered head",
    )
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--samplers", default="greedy", help=f"request samplers: {', '.join(SAMPLERS)} (Gemma's own)")
    ap.add_argument(
        "--rules",
        default="exact",
        help="verification rules of the sampled drafting arms: exact (match), rejection (speculative sampling, "
        "spec-rejection-sampling=true); greedy arms are exact match",
    )
    ap.add_argument("--n-max", default="1,2,3,4", help="fixed draft lengths (the policy off)")
    ap.add_argument("--adaptive", default="4", help="n-max bounds of the adaptive draft length's arms ('' for none)")
    ap.add_argument(
        "--adaptive-arm",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE...]",
        help="one more adaptive arm at the first --adaptive bound, with these overrides over --set for it "
        "alone (e.g. spec-draft-p-min=0.5); repeatable",
    )
    ap.add_argument(
        "--interleave",
        choices=("kind", "none"),
        default="kind",
        help="kind: every arm of a kind (its own target alone, each n-max, each adaptive arm) in every engine "
        "loaded at once and sent each request in turn; none: one arm at a time in every engine, the target "
        "alone once for every kind",
    )
    add_parity_options(ap)
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=2, help="how many of the prompts per arm")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the same requests per arm (medians)")
    ap.add_argument(
        "--cost-n-max", default="", help="n-max values whose verification rows are timed (default: --n-max)"
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--parallel", default="2,4", help="llama-server slot counts for the many-users runs ('' skips)")
    ap.add_argument("--parallel-n-max", default="2")
    ap.add_argument("--parallel-kinds", default="hidden,mixed")
    ap.add_argument("--profile", default="cpu", help="serving profile (name or TOML path), e.g. a GPU card's")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE over the profile (repeatable)")
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers offloaded in the in-process cost runs")
    ap.add_argument(
        "--card-pass-ms",
        action="append",
        default=["e2b=12.24"],
        help="SHAPE=MS: a card's target pass at 1 row, for the cost model's prediction on it (default: E2B "
        "exact Q4_0 on a GTX 1650 Ti, 81.7 tokens/s as published); repeatable",
    )
    ap.add_argument("--work", type=Path, default=Path("build/real-pairs"))
    ap.add_argument("--out", type=Path, default=Path("build/bench-real"))
    ap.add_argument("--keep", action="store_true", help="keep the pairs under --work (several GB)")
    args = ap.parse_args()
    if args.adaptive_arm and not [x for x in args.adaptive.split(",") if x]:
        ap.error("--adaptive-arm needs an --adaptive bound (the first is its n-max)")
    for option, given, known in (("--samplers", args.samplers, SAMPLERS), ("--rules", args.rules, RULES)):
        if bad := [x for x in given.split(",") if x not in known]:
            ap.error(f"{option}: {', '.join(bad)}: expected some of {', '.join(known)}")
    prompts = list(PROMPTS[: args.prompts])
    t0 = time.time()
    results = []
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    card_pass = {k: float(v) / 1e3 for k, v in (x.split("=", 1) for x in args.card_pass_ms)}
    for shape in args.shapes.split(","):
        try:
            r = shape_run(shape, args, prompts)
        except GgufExactError as e:  # the memory guard: too many servers side by side
            log(f"error: {e}")
            return 2
        if shape in card_pass:
            r["card_pass_seconds"] = card_pass[shape]
        results.append(r)
        print(table(r), flush=True)
        if not args.keep:
            shutil.rmtree(args.work / shape, ignore_errors=True)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:3]
    meta = {
        "args": {k: str(v) for k, v in vars(args).items()},
        **machine(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "seconds": time.time() - t0,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench-real.json").write_text(json.dumps({"meta": meta, "shapes": results}, indent=1) + "\n")
    (args.out / "bench-real.md").write_text("\n".join(table(r) for r in results))
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
