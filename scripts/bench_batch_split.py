#!/usr/bin/env python3
"""A target pass shared by several slots: a KV cache per slot against one shared cache, one process.

llama-server at ``--parallel N`` gives each slot a cache of its own unless ``--kv-unified``; then
llama.cpp cuts a batch whose slots bring unequal rows into several passes (``equal_split``: each
pass takes as many rows of every slot in a run), each reading every weight. A slot drafting beside
others' single rows pays a pass of its own. This times one ``llama_decode`` of each composition
(rows per slot, every slot first given ``--context`` tokens) both ways with
:func:`gguf_exact.bench.pass_costs.split_pass_seconds`, alternated A B B A per round, and prints
per composition: the passes a cache per slot makes, the fastest time each way, and their ratio.
``serve`` shares one cache wherever there is more than one slot (``ServingConfig.kv_unified``).

    .venv/bin/python scripts/bench_batch_split.py --target /work/pairs/e2b/target.gguf [--slots 4] [--rounds 2]
    .venv/bin/python scripts/bench_batch_split.py --work /tmp/split-pair --shape e2b   # makes a pair there
"""

import argparse
import os
import time
from pathlib import Path

from gguf_exact.bench.pass_costs import split_pass_seconds
from gguf_exact.engines.shared.batch_cost import equal_split
from gguf_exact.tiny.full_pair import SHAPES, write_pair

ARMS = {"a cache per slot": False, "one cache": True}


def compositions(slots: int) -> list[tuple[int, ...]]:
    """Every slot alike (1, 2, 4 rows: a fixed draft length), one slot deeper than the others (a probe,
    or one slot's own choice), staggered, and a slot idle between generating ones."""
    rest = (1,) * (slots - 1)
    shapes = [(k,) * slots for k in (1, 2, 4)] + [(k, *rest) for k in (2, 4)]
    if slots >= 3:
        shapes += [(4, 2, *rest[1:]), (4, 4, *rest[1:]), (1, 0, *rest[1:])]
    return shapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, help="a target GGUF (else --work: a full-size make-pair there)")
    ap.add_argument("--work", type=Path, help="folder for a hidden-state pair (kept: a second run reuses it)")
    ap.add_argument("--shape", default="e2b", choices=sorted(SHAPES))
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--context", type=int, default=200, help="tokens each slot holds before the timed passes")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    if a.target is None:
        if a.work is None:
            ap.error("give --target or --work")
        work = a.work / a.shape
        if not (work / "target.gguf").is_file():
            write_pair(work, a.shape, "hidden", progress=print)
        a.target = work / "target.gguf"
    shapes = compositions(a.slots)
    best: dict[str, dict[tuple[int, ...], float]] = {arm: {} for arm in ARMS}
    for i in range(a.rounds):
        for arm in list(ARMS) if i % 2 == 0 else list(ARMS)[::-1]:
            got = split_pass_seconds(a.target, shapes, a.threads, ARMS[arm], a.context, a.repeats)
            for c, t in got.items():
                best[arm][c] = min(t, best[arm].get(c, t))
            load = " ".join(open("/proc/loadavg").read().split()[:3])
            print(f"{time.strftime('%H:%M:%S')} round {i + 1}, {arm}: done, load {load}", flush=True)
    print(f"\n{a.target}, {a.slots} slots at {a.context} tokens each, {a.threads} threads; fastest ms of one pass")
    print(f"{'rows per slot':<16} {'passes (a cache per slot)':<26} {'a cache per slot':>17} {'one cache':>10} {'ratio':>6}")
    for c in shapes:
        split = "+".join(map(str, equal_split(c)))
        apart, shared = best["a cache per slot"][c], best["one cache"][c]
        print(f"{'+'.join(map(str, c)):<16} {split:<26} {apart * 1e3:17.1f} {shared * 1e3:10.1f} {apart / shared:5.2f}x")


if __name__ == "__main__":
    main()
