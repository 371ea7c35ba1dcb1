#!/usr/bin/env python3
"""Speculative sampling's acceptance per depth, each engine in turn, against the rule's own chances.

Each engine serves the pair at a fixed draft length with `spec-rejection-sampling` on and answers
the shipped prompts at Gemma's sampler (T 1, top-k 64, top-p 0.95), one server at a time, its
`LLAMA_SPEC_DRAFT_TRACE` written; per depth it prints the drafts verified and kept, the mean of
the chances the rule gave them (sum min(p, q) at each context), the z-score between the two
(gguf_exact/bench/acceptance.py) and, given --sum-min, the kept share less the pair's own figure
(`make-pair`'s sum min(p, q) per depth), and the drafts kept by the trace beside the server's
`/metrics` count (both engines trace every pass a request verifies, its last too).

    .venv/bin/python scripts/bench_acceptance.py                 # the tiny sampled pair, seconds
    .venv/bin/python scripts/bench_acceptance.py --target pairs/e2b/sampled/target.gguf \\
        --drafter pairs/e2b/sampled/drafter.gguf --n-predict 512 --sum-min 0.833,0.804,0.801 --out results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from gguf_exact.bench.acceptance import DepthAcceptance, depth_acceptance, read_results
from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.bench.real import running
from gguf_exact.bench.report import machine
from gguf_exact.bench.request import SAMPLERS, fixed_length, rule_overrides
from gguf_exact.engines.python.policy_trace import TRACE_ENV
from gguf_exact.engines.shared.http import get_metrics, post_json
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.paths import check_output_file
from gguf_exact.formats.safe_write import write_text

ACCEPTED_METRIC = "llamacpp:spec_decode_num_accepted_tokens_total"


def measure(engine: str, target: Path, drafter: Path, args: argparse.Namespace, scratch: Path) -> dict:
    """One engine's server at the fixed length, every prompt --rounds times (a seed each), its trace read."""
    trace = scratch / f"trace-{engine}"
    sets = [f"ctx-size={args.ctx}", f"threads={args.threads}", *fixed_length(args.n_max), *rule_overrides("rejection")]
    started = time.perf_counter()
    os.environ[TRACE_ENV] = str(trace)  # the server inherits it, as from a user's `export LLAMA_SPEC_DRAFT_TRACE=...`
    with running(target, drafter, engine, sets) as (launch, _, _):
        seed = args.seed
        for _round in range(args.rounds):
            for prompt in load_prompts().values():
                request = {"prompt": prompt, "max_tokens": args.n_predict, "cache_prompt": False, "seed": seed}
                post_json(launch.url + "/v1/completions", {**request, **SAMPLERS["gemma"]})
                seed += 1
        accepted = int(float(get_metrics(launch.url).get(ACCEPTED_METRIC, 0)))
    results = [r for path in sorted(scratch.glob(f"{trace.name}.*")) for r in read_results(path.read_text(), str(path))]
    depths = depth_acceptance(results)
    seconds = round(time.perf_counter() - started, 1)
    return {
        "engine": engine,
        "seconds": seconds,
        "traced_kept": sum(d.kept for d in depths),
        "accepted": accepted,
        "depths": depths,
    }


def row(label: str, d: DepthAcceptance, figure: float | None) -> str:
    against = "" if figure is None else f" | {d.share - figure:+.3f}"
    return (
        f"| {label} | {d.depth} | {d.verified} | {d.kept} | {d.share:.4f} | {d.mean_chance:.4f} | {d.z:+.2f}{against} |"
    )


def pooled(runs: list[dict]) -> list[DepthAcceptance]:
    """The engines' drafts per depth together (each depth's draws are independent across engines)."""
    fields = ("verified", "kept", "chance_sum", "chance_variance")
    out = []
    for index in range(max(len(run["depths"]) for run in runs)):
        at = [run["depths"][index] for run in runs if index < len(run["depths"])]
        out.append(DepthAcceptance(index + 1, *(sum(getattr(d, f) for d in at) for f in fields)))
    return out


def checked_figures(text: str | None) -> list[float]:
    """--sum-min's figures, each a share in [0, 1]."""
    try:
        figures = [float(f) for f in text.split(",")] if text else []
    except ValueError:
        raise SystemExit(f"error: --sum-min {text!r}: not comma-separated numbers") from None
    if not all(0.0 <= f <= 1.0 for f in figures):
        raise SystemExit(f"error: --sum-min {text!r}: each figure is a share in [0, 1]")
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, help="target GGUF (default: the tiny sampled pair made on the spot)")
    ap.add_argument("--drafter", type=Path)
    ap.add_argument("--engines", default="llama-server,python")
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1, help="the prompts this many times, a new seed each request")
    ap.add_argument("--seed", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--sum-min", help="the pair's sum min(p, q) per depth from make-pair, comma-separated")
    ap.add_argument("--out", type=Path, help="a JSON file of the figures")
    args = ap.parse_args()
    if (args.target is None) != (args.drafter is None):
        raise SystemExit("error: --target and --drafter go together")
    for name, path in (("--target", args.target), ("--drafter", args.drafter)):
        if path is not None and not path.is_file():
            raise SystemExit(f"error: {name} {path}: no such file")
    figures = checked_figures(args.sum_min)
    inputs = {"--target": args.target, "--drafter": args.drafter}
    try:  # refused before minutes of measuring, not after
        if args.out is not None:
            check_output_file(args.out, "--out", inputs)
    except GgufExactError as e:
        sys.exit(f"error: {e}")
    with tempfile.TemporaryDirectory(prefix="bench-acceptance-") as tmp:
        scratch = Path(tmp)
        if args.target is None:
            from gguf_exact.tiny.sampled_pair import write_tiny_pair

            args.target, args.drafter = write_tiny_pair(scratch / "sampled")
        try:
            runs = [measure(engine, args.target, args.drafter, args, scratch) for engine in args.engines.split(",")]
        except GgufExactError as e:
            sys.exit(f"error: {e}")
    header = "| engine | depth | verified | kept | kept share | mean chance | z |" + (
        " kept - pair's |" if figures else ""
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))

    def figure(d: DepthAcceptance) -> float | None:
        return figures[d.depth - 1] if d.depth <= len(figures) else None

    for run in runs:
        for d in run["depths"]:
            print(row(run["engine"], d, figure(d)))
    if len(runs) > 1:
        for d in pooled(runs):
            print(row("both", d, figure(d)))
    for run in runs:
        print(
            f"{run['engine']}: {run['traced_kept']} drafts kept in the trace, {run['accepted']} by /metrics; {run['seconds']} s"
        )
    if args.out:
        out = {
            "machine": machine(),
            "target": str(args.target),
            "drafter": str(args.drafter),
            "n_max": args.n_max,
            "n_predict": args.n_predict,
            "rounds": args.rounds,
            "sum_min": figures,
            "runs": [
                {
                    **run,
                    "depths": [
                        {**vars(d), "share": d.share, "mean_chance": d.mean_chance, "z": d.z} for d in run["depths"]
                    ],
                }
                for run in runs
            ],
        }
        try:  # whole or not at all, and never over the pair it measured
            write_text(args.out, json.dumps(out, indent=1) + "\n", inputs)
        except GgufExactError as e:
            sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
