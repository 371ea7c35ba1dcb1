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
import platform
import shutil
import sys
import time
from pathlib import Path

from gguf_exact.bench.parity import add_parity_options, parity_line, parity_run
from gguf_exact.bench.pass_costs import card_prediction, drafter_profile, predicted_speedup, target_pass_seconds
from gguf_exact.bench.real import ENGINES, Arm, arms_side_by_side, concurrent_arm
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.full_pair import cycle_ids, write_drafter, write_pair
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
    ordered-embedding head (``convert --full-head``), which scores all 262,144 tokens."""
    folder = work / shape
    target, hidden = folder / "target.gguf", folder / "drafter.gguf"
    if not target.is_file() or not hidden.is_file():
        log(f"{shape}: make-pair")
        cycle = list(write_pair(folder, shape, "hidden").cycle)
    else:
        cycle = cycle_ids(gemma4_vocabulary())
    pairs = {"hidden": (target, hidden)}  # the cost runs' drafter
    for kind in kinds:
        base, full = kind.removesuffix("-full"), kind.endswith("-full")
        path = folder / (f"{base}-full-head-drafter.gguf" if full else f"{base}-drafter.gguf")
        if kind == "hidden":
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
    cost_n_max = [int(x) for x in (args.cost_n_max or args.n_max).split(",")]
    out["costs"] = costs(*pairs["hidden"], pairs["hidden-full"][1], cost_n_max, args.threads, args.gpu_layers)
    arms: list[dict] = []
    engines = args.engines.split(",")
    target = pairs["hidden"][0]
    # the fixed lengths, the policy's own choice up to each bound (spec-draft-adaptive), then
    # the first bound again with each --adaptive-arm's overrides
    lengths = [(n, False, ()) for n in n_max_list] + [(b, True, ()) for b in bounds]
    lengths += [(bounds[0], True, tuple(x.split(","))) for x in args.adaptive_arm]

    def side_by_side(kind: str, group: str | None, drafter: Path | None, together: list[Arm]) -> None:
        """Every arm of ``together`` loaded at once; each arm's dict: its kind ("none": the
        target alone) and ``group``, the kind it was interleaved with (None: not interleaved)."""
        log(f"{shape}: {kind}: {len(together)} servers loaded together: " + "; ".join(a.describe() for a in together))
        results = arms_side_by_side(target, drafter, together, prompts, args.n_predict, sets, args.profile, args.rounds)
        for arm, r in zip(together, results):
            arms.append({"kind": kind if arm.n_max else "none", "group": group} | r.as_dict())
        save_partial(args.out, out | {"arms": arms})

    if args.interleave == "none" or not kinds:  # the target alone once, for every kind
        side_by_side("none", None, None, [Arm(e, 0) for e in engines])
    for kind in kinds:
        drafter = pairs[kind][1]
        if args.interleave == "kind":  # every arm of the kind, its own target alone first
            together = [Arm(e, n, a, s) for n, a, s in [(0, False, ()), *lengths] for e in engines]
            side_by_side(kind, kind, drafter, together)
        else:
            for n, a, s in lengths:
                side_by_side(kind, None, drafter, [Arm(e, n, a, s) for e in engines])
    out["arms"] = arms
    save_partial(args.out, out)
    if args.parallel:
        many = []
        kind, n_max = "hidden", int(args.parallel_n_max)
        # distinct prompts: no client can reuse another's prefix
        clients_prompts = [PROMPTS[i % len(PROMPTS)] for i in range(max(int(p) for p in args.parallel.split(",")))]

        def clients(engine: str, k: str, slots: int, p: int, **label) -> None:
            """``p`` clients at once on ``engine`` with ``slots`` slots, ``k``'s drafter."""
            r = concurrent_arm(
                target, pairs[k][1], engine, n_max, slots, clients_prompts[:p], args.n_predict, sets, args.profile
            )
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


def save_partial(out_dir: Path, result: dict) -> None:
    """What one shape has measured so far (a long run interrupted keeps its figures)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"partial-{result['shape']}.json").write_text(json.dumps(result, indent=1) + "\n")


def steady_tokens_per_pass(arm: dict) -> float:
    """Tokens per target pass after each request's first token, which its prefill pass
    yields: the generation phase that generation tokens/s times (the prefill is not in it)."""
    n = len(arm["texts"])
    passes = arm["target_passes"] - n
    return (arm["tokens"] - n) / passes if passes > 0 else 0.0


def own_sets(arm: dict) -> str:
    """The arm's own overrides (or its label), in parentheses after its n-max; "" for none."""
    own = arm.get("label") or ", ".join(arm.get("sets") or ())
    return f" ({own})" if own else ""


def arm_n_max(arm: dict) -> str:
    """The n-max cell: the fixed length, or ``<=B adaptive`` for the policy's bound, then the
    arm's own overrides (``<=4 adaptive (spec-draft-p-min=0.5)``)."""
    return (f"<={arm['n_max']} adaptive" if arm.get("adaptive") else str(arm["n_max"])) + own_sets(arm)


def arm_kind(arm: dict) -> str:
    """The kind cell: the drafter's kind; the target alone of an interleaved group names the
    group (``none (hidden)``)."""
    return f"{arm['kind']} ({arm['group']})" if not arm["n_max"] and arm.get("group") else arm["kind"]


def alone_key(arm: dict) -> tuple[str | None, str]:
    """Which target alone an arm is compared with: its group's (None: the run's only one), in
    its engine."""
    return arm.get("group"), arm["engine"]


def arm_key(arm: dict) -> tuple:
    return arm["kind"], arm.get("group"), arm["n_max"], bool(arm.get("adaptive")), tuple(arm.get("sets") or ())


def same_arm(a: dict, b: dict) -> bool:
    """The same arm in another engine: kind, group, length and overrides."""
    return arm_key(a) == arm_key(b)


def adaptive_goals(arms: list[dict], alone: dict[tuple[str | None, str], dict]) -> list[str]:
    """Per engine and kind, each adaptive arm against the target alone and the best fixed
    length of its group (of the same run where not interleaved; generation tokens/s), as the
    goals read them (issue 23: >= 0.98x the target alone on mixed, >= 0.97x the best fixed
    length on hidden and real). ``alone``: the targets alone by :func:`alone_key`."""
    out = []
    for a in (x for x in arms if x.get("adaptive")):
        fixed = [
            b
            for b in arms
            if alone_key(b) == alone_key(a) and b["kind"] == a["kind"] and b["n_max"] and not b.get("adaptive")
        ]
        base = alone.get(alone_key(a))
        tps = a["generation_tokens_per_second"]
        parts = [f"{tps / base['generation_tokens_per_second']:.2f}x the target alone"] if base else []
        if fixed:
            best = max(fixed, key=lambda b: b["generation_tokens_per_second"])
            parts.append(
                f"{tps / best['generation_tokens_per_second']:.2f}x the best fixed length (n-max {best['n_max']})"
            )
        out.append(f"- {a['engine']}, {a['kind']}, adaptive up to n-max {a['n_max']}{own_sets(a)}: " + ", ".join(parts))
    return out


def engine_costs(arms: list[dict]) -> list[str]:
    """Where each engine's time went: the Python engine's own work outside llama.cpp per token,
    and the pass and drafter-step costs each engine's policy measured in its adaptive arms."""
    out = []
    own = [
        f"{arm_kind(a)} n-max {arm_n_max(a)}: {1e3 * a['python_seconds'] / a['tokens']:.2f} ms"
        f" ({100 * a['python_seconds'] / a['wall_seconds']:.1f}%)"
        for a in arms
        if a.get("python_seconds") is not None and a["tokens"] and a["wall_seconds"]
    ]
    if own:
        out += [
            "",
            "Python engine's own time outside llama_decode, per token (share of the request): " + ", ".join(own),
        ]
    for a in arms:
        pol = a.get("policy")
        if pol:
            rows = ", ".join(f"{r} row{'s' if r > 1 else ''} {1e3 * v:.0f} ms" for r, v in pol["pass_seconds"])
            step = "" if pol["step_seconds"] is None else f"; drafter step {1e3 * pol['step_seconds']:.2f} ms"
            out.append(
                f"- {a['engine']}, {a['kind']}, adaptive up to {a['n_max']}{own_sets(a)}, as its policy timed: {rows}{step}"
            )
    return out


def table(result: dict) -> str:
    """The README's table for one shape (with --parity, its lines last)."""
    parity = [parity_line(m) for m in result.get("parity", {}).get("modes", [])]
    if "costs" not in result:  # --parity only
        return "\n".join(parity) + "\n"
    c = result["costs"]
    passes = {int(k): v for k, v in c["target_pass_seconds"].items()}
    steps = {"ordered": c["drafter"]["step_seconds"]}
    heads = [
        f"drafter step {1e3 * steps['ordered']:.2f} ms with its ordered head ({100 * c['drafter']['head_share']:.0f}% of it)"
    ]
    if "drafter_full_head" in c:  # runs before issue 24 timed one head
        full = c["drafter_full_head"]
        steps["full"] = full["step_seconds"]
        heads.append(
            f"{1e3 * steps['full']:.2f} ms with the full head ({100 * full['head_share']:.0f}% of it): "
            f"{steps['ordered'] / steps['full']:.2f}x"
        )
    card = result.get("card_pass_seconds")
    alone = {alone_key(a): a for a in result["arms"] if a["n_max"] == 0}
    lines = [
        f"**{result['shape'].upper()}**: target pass {1e3 * passes[1]:.0f} ms at 1 row, "
        + ", ".join(f"{1e3 * v:.0f} ms at {k}" for k, v in passes.items() if k > 1)
        + "; "
        + ", ".join(heads),
        "",
        "| kind | n-max | engine | tokens/s | generation tokens/s | speed-up | predicted | acceptance | tokens/pass "
        "| TTFT s | load s | peak RSS MiB | same text |" + (" card, predicted |" if card else ""),
        "|" + "---|" * (14 if card else 13),
    ]
    for a in result["arms"]:
        base = alone.get(alone_key(a))
        speed = a["generation_tokens_per_second"] / base["generation_tokens_per_second"] if base else None
        draft = steps["full" if a["kind"].endswith("-full") else "ordered"]
        tpp = steady_tokens_per_pass(a)
        fixed = a["n_max"] and not a.get("adaptive")  # the cost model predicts fixed lengths only
        pred = predicted_speedup(tpp, passes[1], passes[a["n_max"] + 1], draft, a["n_max"]) if fixed else None
        on_card = card_prediction(tpp, card, passes[1], draft, a["n_max"]) if card and fixed else None
        same = all(t == b for t, b in zip(a["texts"], base["texts"] if base else []))
        acc = "-" if a["acceptance"] is None else f"{a['acceptance']:.3f}"
        lines.append(
            f"| {arm_kind(a)} | {arm_n_max(a)} | {a['engine']} | {a['tokens_per_second']:.2f} | "
            f"{a['generation_tokens_per_second']:.2f} | {speed:.2f}x | {'-' if pred is None else f'{pred:.2f}x'} | "
            f"{acc} | {a['tokens_per_pass']:.2f} | {a['ttft_seconds']:.2f} | {a['load_seconds']:.1f} | "
            f"{a['peak_rss_mib']:,.0f} | {'yes' if same else '**no**'} |"
            + ("" if not card else f" {'-' if on_card is None else f'{on_card:.2f}x'} |")
        )
    ratios = []
    for a in result["arms"]:
        if a["engine"] == "python":
            other = next((b for b in result["arms"] if b["engine"] == "llama-server" and same_arm(a, b)), None)
            if other and other["generation_tokens_per_second"]:
                ratio = a["generation_tokens_per_second"] / other["generation_tokens_per_second"]
                ratios.append((arm_kind(a), arm_n_max(a), ratio))
    if ratios:
        lines.append("")
        lines.append(
            "Python engine / llama-server, generation tokens/s: "
            + ", ".join(f"{k} n-max {n}: {r:.2f}x" for k, n, r in ratios)
        )
    lines += engine_costs(result["arms"])
    goals = adaptive_goals(result["arms"], alone)
    if goals:
        lines += ["", *goals]
    serial = {(m.get("kind", "hidden"), m["clients"]): m for m in result.get("concurrent", []) if m.get("serial")}
    for m in result.get("concurrent", []):
        ref = serial.get((m.get("kind", "hidden"), m["clients"])) if m["parallel"] > 1 else None
        same = (
            ""
            if ref is None
            else "; token ids equal to one slot's: "
            + (
                "yes"
                if [r.get("tokens") for r in m["per_request"]] == [r.get("tokens") for r in ref["per_request"]]
                else "**no**"
            )
        )
        acc = [f"{r['draft_n_accepted']}/{r['draft_n']}" for r in m["per_request"] if "draft_n" in r]
        lines.append(
            f"- {m['engine']} --parallel {m['parallel']}, {m['clients']} clients{' (serial)' if m.get('serial') else ''}, "
            f"{m.get('kind', 'hidden')} n-max {m['n_max']}: {m['aggregate_tokens_per_second']:.2f} tokens/s aggregate"
            + (f", per-request accepted/drafted {', '.join(acc)}" if acc else "")
            + same
        )
    return "\n".join(lines + ([""] + parity if parity else [])) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="e2b,e4b")
    ap.add_argument(
        "--kinds",
        default="hidden,mixed,real,hidden-full,mixed-full",
        help="drafters (hidden, mixed, real); <kind>-full: without the ordered head",
    )
    ap.add_argument("--engines", default=",".join(ENGINES))
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
        "machine": platform.platform(),
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
