#!/usr/bin/env python3
"""The drafter's step with its ordered-embedding head against the full 262,144-row head, one process.

Writes a full-size ``make-pair`` pair (``--shape e2b|e4b``, kind ``hidden``) and beside its
drafter the same drafter converted as ``convert --full-head`` (the full head only), then
times both with :func:`gguf_exact.bench.pass_costs.drafter_profile` (the bindings, ``--threads``
threads, ``--steps`` steps each), alternated A B B A per round so drift on the machine
falls on both. Printed per profile: the step (median of its steps), the head's time and
share, the graph's node count, the load average; then the fastest step of each and their
ratio (issue 24's goal: the ordered head's step at <= 0.4x of the full head's 4.3-4.9 ms).

    .venv/bin/python scripts/bench_head.py --work /tmp/head-pair [--shape e2b] [--rounds 4] [--steps 20]
"""

import argparse
import time
from pathlib import Path

from gguf_exact.bench.pass_costs import drafter_profile
from gguf_exact.tiny.full_pair import SHAPES, cycle_ids, write_drafter, write_pair
from gguf_exact.tiny.vocab import gemma4_vocabulary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="folder for the pair (kept: a second run reuses it)")
    ap.add_argument("--shape", default="e2b", choices=sorted(SHAPES))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    work = a.work / a.shape
    if not (work / "drafter.gguf").is_file():
        write_pair(work, a.shape, "hidden", progress=print)
    full = work / "drafter-full-head.gguf"
    if not full.is_file():
        write_drafter(
            full, SHAPES[a.shape], "hidden", cycle_ids(gemma4_vocabulary()), work / "target.gguf", ordered_head=False
        )
    heads = {"ordered": work / "drafter.gguf", "full": full}
    found: dict[str, list] = {"ordered": [], "full": []}
    for i in range(a.rounds):
        for name in ("ordered", "full") if i % 2 == 0 else ("full", "ordered"):
            p = drafter_profile(work / "target.gguf", heads[name], a.threads, steps=a.steps)
            found[name].append(p)
            load = " ".join(open("/proc/loadavg").read().split()[:3])
            print(
                f"{time.strftime('%H:%M:%S')} {name:<7} step {p.step_seconds * 1e3:6.2f} ms, head "
                f"{p.head_seconds * 1e3:6.2f} ms of {p.profiled_step_seconds * 1e3:6.2f} ms profiled, "
                f"{p.nodes} nodes, load {load}",
                flush=True,
            )
    fastest = {name: min(ps, key=lambda p: p.step_seconds) for name, ps in found.items()}
    for name, p in fastest.items():
        print(f"{name:<7} fastest step {p.step_seconds * 1e3:.2f} ms (head share {p.head_share:.2f})")
        # where the head's time goes (node by node, so each carries the callback's own cost)
        for node, t in zip(p.head_nodes, p.head_node_seconds):
            print(f"          {node:<28} {t * 1e3:6.3f} ms")
    print(f"ordered / full: {fastest['ordered'].step_seconds / fastest['full'].step_seconds:.2f}x")


if __name__ == "__main__":
    main()
