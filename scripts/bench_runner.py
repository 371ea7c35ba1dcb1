#!/usr/bin/env python3
"""The in-process runner against llama-server, same tiny models and settings, one invocation.

For each tiny pair (``agreeing``: acceptance 1; ``mixed``: partial acceptance) and
each n-max (0 = the target alone), the shipped prompts run in-process
(:class:`gguf_exact.engines.python.runner.Runner`) and against a llama-server started on the
same files with the same context, threads, batch and n-max, in A B B A order
(runner, server, server, runner) per round. Printed per row: tokens/s of both
(generation phase: llama-server's ``timings.predicted_per_second`` and the same
measure in-process), the ratio runner / server, tokens per target pass,
acceptance, whether the token ids agree with the server's, and the runner's
Python-side time per speculative step (wall time outside ``llama_decode``,
median over runs).

llama-server comes from ``gguf_exact.builds.llama_build`` (``gguf-exact build-llama``);
without it, or with ``--no-server``, only the runner's figures are printed.

    .venv/bin/python scripts/bench_runner.py [--n-predict 128] [--threads 1] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.builds.llama_build import find_build
from gguf_exact.engines.launch import plan_launch, start_server
from gguf_exact.engines.python.runner import Runner
from gguf_exact.engines.shared.http import server_generate
from gguf_exact.engines.shared.process import free_port
from gguf_exact.engines.shared.settings import ServeSettings
from gguf_exact.engines.shared.status import stop_server
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.pairs import write_runner_pairs


def summarize(gens: list) -> dict:
    tokens = sum(g.n_tokens for g in gens)
    secs = sum(g.wall_seconds - g.prefill_seconds for g in gens)
    passes = sum(g.target_passes for g in gens)
    gen = sum(g.drafts_generated for g in gens)
    acc = sum(g.drafts_accepted for g in gens)
    return {
        "runs": len(gens),
        "tokens": tokens,
        "tokens_per_second": tokens / secs if secs > 0 else 0.0,
        "tokens_per_target_pass": tokens / passes if passes else 0.0,
        "acceptance_rate": acc / gen if gen else None,
    }


def run_runner(runner: Runner, prompts: dict[str, str], n_predict: int, n_max: int) -> list:
    return [(name, runner.generate(text, n_predict, n_max)) for name, text in prompts.items()]


def run_server(url: str, prompts: dict[str, str], n_predict: int) -> list:
    return [(name, server_generate(url, text, n_predict)) for name, text in prompts.items()]


def bench_pair(name, target, drafter, n_max_list, prompts, args, server_bin) -> list[dict]:
    rows = []
    settings = [
        f"ctx-size={args.n_ctx}",
        f"threads={args.threads}",
        f"threads-batch={args.threads}",
        f"spec-draft-threads={args.threads}",
        f"batch-size={args.n_batch}",
        f"ubatch-size={args.n_batch}",
        "no-warmup=true",
    ]
    alone_ids: dict[str, list[int]] = {}
    with Runner(target, drafter, n_ctx=args.n_ctx, n_threads=args.threads, n_batch=args.n_batch) as runner:
        for n_max in n_max_list:
            ours, theirs = [], []
            launch = None
            if server_bin is not None:
                overrides = settings + ([f"spec-draft-n-max={n_max}"] if n_max > 0 else [])
                launch = plan_launch(
                    ServeSettings(
                        target,
                        drafter if n_max > 0 else None,
                        "cpu",
                        overrides,
                        port=free_port(),
                        server_bin=server_bin,
                    )
                )
                start_server(launch, detach=True, timeout=120)
            try:
                runner.generate(next(iter(prompts.values())), 8, n_max)  # warm-up
                if launch:
                    server_generate(launch.url, next(iter(prompts.values())), 8)
                for _ in range(args.rounds):  # A B B A
                    ours += run_runner(runner, prompts, args.n_predict, n_max)
                    if launch:
                        theirs += run_server(launch.url, prompts, args.n_predict)
                        theirs += run_server(launch.url, prompts, args.n_predict)
                    ours += run_runner(runner, prompts, args.n_predict, n_max)
            finally:
                if launch:
                    stop_server(launch.port)
            overhead = [g.overhead_per_step_us for _, g in ours if g.target_passes > 1]
            row = {
                "pair": name,
                "n_max": n_max,
                "runner": summarize([g for _, g in ours]),
                "python_overhead_us_per_step_median": statistics.median(overhead) if overhead else None,
                "python_overhead_us_per_step_min": min(overhead) if overhead else None,
            }
            if n_max == 0:
                alone_ids = {pname: g.tokens for pname, g in ours}
            elif alone_ids:
                row["same_tokens_as_target_alone"] = all(g.tokens == alone_ids[pname] for pname, g in ours)
            if theirs:
                row["server"] = summarize([g for _, g in theirs])
                row["ratio_runner_over_server"] = (
                    row["runner"]["tokens_per_second"] / row["server"]["tokens_per_second"]
                )
                server_ids = {pname: g.tokens for pname, g in theirs}
                row["same_tokens_as_server"] = all(g.tokens == server_ids[pname] for pname, g in ours)
            rows.append(row)
            print(line(row), flush=True)
    return rows


def line(row: dict) -> str:
    r, s = row["runner"], row.get("server")
    acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
    text = f"{row['pair']:9} n_max={row['n_max']}  runner {r['tokens_per_second']:8.1f} tok/s  {r['tokens_per_target_pass']:.2f} tok/pass  acc {acc}"
    oh = row["python_overhead_us_per_step_median"]
    text += f"  python {oh:5.1f} us/step" if oh is not None else ""
    if s:
        sacc = "-" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.3f}"
        text += (
            f"  | server {s['tokens_per_second']:8.1f} tok/s  {s['tokens_per_target_pass']:.2f} tok/pass  acc {sacc}"
        )
        text += f"  | ratio {row['ratio_runner_over_server']:.2f}  same ids as server {'yes' if row['same_tokens_as_server'] else 'NO'}"
    if "same_tokens_as_target_alone" in row:
        text += f", as target alone {'yes' if row['same_tokens_as_target_alone'] else 'NO (near-tie, see docs/python-engine.md)'}"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="agreeing,mixed")
    ap.add_argument("--n-max", default="0,1,2,3")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("build/bench-runner"))
    args = ap.parse_args(argv)
    prompts = load_prompts()
    build = None if args.no_server else find_build("cpu")
    server_bin = build.binary("llama-server") if build else None
    if server_bin is None and not args.no_server:
        print("llama-server is not built (gguf-exact build-llama): runner figures only", file=sys.stderr)
    t0 = time.time()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        pairs = write_runner_pairs(tmp)
        for name in args.pairs.split(","):
            target, drafter = pairs[name]
            rows += bench_pair(
                name, target, drafter, [int(x) for x in args.n_max.split(",")], prompts, args, server_bin
            )
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()} | {
        "server": str(server_bin) if server_bin else None,
        "seconds": time.time() - t0,
    }
    (args.out / "bench_runner.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    ratios = [r["ratio_runner_over_server"] for r in rows if "ratio_runner_over_server" in r]
    if ratios:
        print(
            f"runner / llama-server tokens/s: median ratio {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}) over {len(ratios)} settings"
        )
    oh = [r["python_overhead_us_per_step_median"] for r in rows if r["python_overhead_us_per_step_median"] is not None]
    if oh:
        print(
            f"runner Python overhead per speculative step: median {statistics.median(oh):.1f} us (per-setting medians {min(oh):.1f}-{max(oh):.1f} us)"
        )
    print(f"wrote {args.out / 'bench_runner.json'} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except GgufExactError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
