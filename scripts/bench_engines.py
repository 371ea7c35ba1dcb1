#!/usr/bin/env python3
"""The Python engine beside llama-server, both over HTTP, on the tiny pairs: one invocation.

For each tiny pair (``hidden``: acceptance 1, the drafter fed the target's hidden
state; ``mixed``: partial acceptance) this runs ``gguf-exact bench --engines
python,llama-server`` (:func:`gguf_exact.bench.engines.bench_engines`):
at each n-max a ``serve --engine python`` and a llama-server on the same files,
profile (``cpu``), context, threads and n-max, the shipped prompts through
``/v1/completions`` with the same seed, A B B A per round. Printed per pair: the
table (tokens/s per request and in the generation phase, their ratio, tokens per
target pass, acceptance, the Python engine's time per target pass outside
``llama_decode``, whether the texts are llama-server's), and the ratios at the end.

    .venv/bin/python scripts/bench_engines.py [--pairs hidden,mixed] [--n-max 1,2,3] [--rounds 3]

``--profile`` instead times the Python engine in-process, per target pass: inside the
target's and the drafter's ``llama_decode``, and the Python around them (``eval``,
the drafter step, the draft hook, sampling, and the rest: llama-cpp-python's generate
loop and ``create_completion``'s per-token work), with timers around those functions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gguf_exact.bench.engines import bench_engines
from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.bench.request import BenchRequest
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.pairs import write_runner_pairs


def profile(target: Path, drafter: Path, n_max_list: list[int], prompts: dict[str, str], args) -> None:
    """Per target pass, where the Python engine's time goes (``create_completion``, greedy)."""
    import functools

    from gguf_exact.engines.python import drafter as drafter_module
    from gguf_exact.engines.python.engine import MtpDraftModel, MtpLlama, SpecTotals

    spent: dict[str, float] = {}

    def timed(cls, name: str, key: str) -> None:
        f = getattr(cls, name)

        @functools.wraps(f)
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - t

        setattr(cls, name, wrapper)

    timed(drafter_module.LlamaDrafter, "draft", "draft")
    timed(MtpLlama, "eval", "eval")
    timed(MtpLlama, "sample", "sample")
    timed(MtpDraftModel, "__call__", "hook")
    print(
        "| n-max | tokens/pass | target decode | drafter decode | eval (Python) | drafter step (Python) | draft hook | sampling | generate loop + create_completion | Python total |"
    )
    print("|" + "---|" * 10)
    for n_max in n_max_list:
        llm = MtpLlama(
            target, drafter, n_max=n_max, n_ctx=args.n_ctx, n_threads=args.threads, n_threads_batch=args.threads
        )
        for text in prompts.values():  # warm-up
            llm.create_completion(text, max_tokens=8, temperature=0)
        llm.totals = SpecTotals()
        spent.clear()
        for _ in range(args.rounds):
            for text in prompts.values():
                llm.create_completion(text, max_tokens=args.n_predict, temperature=0, repeat_penalty=1.0)
        t = llm.totals

        def us(seconds: float, passes: int = t.target_passes) -> str:
            return f"{1e6 * seconds / passes:.0f} µs"

        parts = {
            "eval": spent["eval"] - t.target_seconds,
            "draft": spent.get("draft", 0.0) - t.drafter_seconds,
            "hook": spent.get("hook", 0.0) - spent.get("draft", 0.0),
            "sample": spent["sample"],
        }
        parts["rest"] = t.wall_seconds - spent["eval"] - spent.get("hook", 0.0) - spent["sample"]
        print(
            f"| {n_max} | {t.tokens / t.target_passes:.2f} | {us(t.target_seconds)} | {us(t.drafter_seconds)} | {us(parts['eval'])} | "
            f"{us(parts['draft'])} | {us(parts['hook'])} | {us(parts['sample'])} | {us(parts['rest'])} | {us(sum(parts.values()))} |",
            flush=True,
        )
        llm.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="hidden,mixed")
    ap.add_argument("--n-max", default="1,2,3")
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=Path("build/bench-engines"))
    ap.add_argument("--profile", action="store_true", help="In-process: where the Python engine's time goes per pass.")
    args = ap.parse_args(argv)
    prompts = load_prompts()
    if args.profile:
        with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
            pairs = write_runner_pairs(tmp)
            for name in args.pairs.split(","):
                print(
                    f"\n{name} pair, per target pass (create_completion, {args.n_predict} tokens, greedy, {args.threads} thread)\n"
                )
                profile(*pairs[name], [0] + [int(x) for x in args.n_max.split(",")], prompts, args)
        return 0
    sets = [f"ctx-size={args.n_ctx}", f"threads={args.threads}", f"threads-batch={args.threads}", "no-warmup=true"]
    t0 = time.time()
    ratios, request_ratios, results = [], [], {}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        pairs = write_runner_pairs(tmp)
        for name in args.pairs.split(","):
            target, drafter = pairs[name]
            request = BenchRequest(
                target,
                drafter,
                n_values=tuple(int(x) for x in args.n_max.split(",")),
                n_predict=args.n_predict,
                rounds=args.rounds,
                overrides=tuple(sets),
                temperature=args.temperature,
            )
            report = bench_engines(
                request, prompts, progress=lambda s, name=name: print(f"{name}: {s}", file=sys.stderr, flush=True)
            )
            print(f"\n{name} pair\n\n{report.markdown()}", flush=True)
            report.write(args.out / name)
            results[name] = report.as_dict()
            for r in report.rows:
                if r.engine == "python":
                    ratios.append(report.ratio(r.n_max, "generation_tokens_per_second"))
                    request_ratios.append(report.ratio(r.n_max))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_engines.json").write_text(
        json.dumps({"args": vars(args) | {"out": str(args.out)}, "pairs": results}, indent=2) + "\n"
    )
    print(
        f"python / llama-server tokens/s, generation phase: median {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f}); whole requests: median {statistics.median(request_ratios):.2f} "
        f"({min(request_ratios):.2f}-{max(request_ratios):.2f}) over {len(ratios)} settings ({time.time() - t0:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except GgufExactError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
