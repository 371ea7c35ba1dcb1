#!/usr/bin/env python3
"""The Python engine beside llama-server, both over HTTP, on the tiny pairs: one invocation.

For each tiny pair (``hidden``: acceptance 1, the drafter fed the target's hidden
state; ``mixed``: partial acceptance) this runs ``gguf-exact bench --engines
python,llama-server`` (:func:`gguf_exact.speculative.bench_engines.bench_engines`):
at each n-max a ``serve --engine python`` and a llama-server on the same files,
profile (``cpu``), context, threads and n-max, the shipped prompts through
``/v1/completions`` with the same seed, A B B A per round. Printed per pair: the
table (tokens/s per request and in the generation phase, their ratio, tokens per
target pass, acceptance, the Python engine's time per target pass outside
``llama_decode``, whether the texts are llama-server's), and the ratios at the end.

    .venv/bin/python scripts/bench_engines.py [--pairs hidden,mixed] [--n-max 1,2,3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gguf_exact.errors import GgufExactError
from gguf_exact.speculative.bench_engines import bench_engines
from gguf_exact.speculative.prompt_set import load_prompts
from gguf_exact.tiny.pairs import write_runner_pairs


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
    args = ap.parse_args(argv)
    prompts = load_prompts()
    sets = [f"ctx-size={args.n_ctx}", f"threads={args.threads}", f"threads-batch={args.threads}", "no-warmup=true"]
    t0 = time.time()
    ratios, request_ratios, results = [], [], {}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        pairs = write_runner_pairs(tmp)
        for name in args.pairs.split(","):
            target, drafter = pairs[name]
            report = bench_engines(
                target,
                drafter,
                [int(x) for x in args.n_max.split(",")],
                prompts,
                args.n_predict,
                args.rounds,
                overrides=sets,
                temperature=args.temperature,
                progress=lambda s, name=name: print(f"{name}: {s}", file=sys.stderr, flush=True),
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
