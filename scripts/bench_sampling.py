#!/usr/bin/env python3
"""The Python engine's speculative-sampling distribution per row against llama.cpp's sampler, one process.

Times, on rows of 262,144 distinct logits shaped like a model's (:func:`gguf_exact.bench.sampling.realistic_row`),
``ChainDistribution.support`` by the sorted head and by the whole row, and llama.cpp's own chain with
its ``dist`` draw (what a sampled token costs the target alone), alternated per round; checks that
the head and the whole row give the same distribution on every row; prints the median ms a row and
the ratios.

    .venv/bin/python scripts/bench_sampling.py [--rows 64] [--rounds 6]
"""

import argparse
from types import SimpleNamespace

import llama_cpp

from gguf_exact.bench.sampling import medians, realistic_row, same_by_head, time_rows
from gguf_exact.engines.python.chain_distribution import sorted_head

CHAINS = {
    "Gemma's (T 1.0, top-k 64, top-p 0.95)": SimpleNamespace(temperature=1.0, top_k=64, top_p=0.95, min_p=0.0, typical_p=1.0),
    "llama-server's default (T 0.8, top-k 40, top-p 0.95, min-p 0.05)": SimpleNamespace(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0
    ),
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    llama_cpp.llama_backend_init()
    rows = [realistic_row(seed) for seed in range(a.rows)]
    for label, chain in CHAINS.items():
        heads = sum(sorted_head(row, chain.top_k) is not None for row in rows)
        same = same_by_head(rows, chain)
        ms = medians(time_rows(rows, chain, a.rounds))
        print(f"{label}: {heads} of {len(rows)} rows have a sorted head; same distribution as the whole row: {same}")
        for name, value in ms.items():
            print(f"  {name:<17} {value:6.3f} ms a row")
        peer = ms["llama.cpp sample"]
        print(f"  head / whole {ms['head'] / ms['whole']:.2f}x, head / llama.cpp sample {ms['head'] / peer:.2f}x")


if __name__ == "__main__":
    main()
