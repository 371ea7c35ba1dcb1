#!/usr/bin/env python3
"""The draft-length policy in simulation on this project's 2-core E2B curve as llama-server timed
it (1..5 rows: 105, 136, 190, 200, 250 ms; drafter step 3.5 ms) with a 31 ms cost for a pass
whose row count differs from the one before (llama.cpp rebuilding its graph): per drafter kind
(tests/policy_traces.py's even streams), the adaptive length's tokens/s against the target
alone and against the best fixed length, from a fresh policy over 30, 100 and 600 passes (a
benchmark's few requests of 48 tokens are 30-100 passes: what exploring the lengths costs
weighs most there). Not a test: it prints.

    .venv/bin/python scripts/sim_draft_policy.py
"""

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from policy_traces import Stream  # noqa: E402

from gguf_exact.runtime.draft_policy import DraftPolicy, PolicySettings  # noqa: E402

CURVE = {1: 0.105, 2: 0.136, 3: 0.19, 4: 0.20, 5: 0.25}
SWITCH, STEP = 0.031, 0.0035


def run(streams: list[Stream], passes: int = 600, fixed: int | None = None) -> tuple[float, list[int]]:
    ss = [Stream(s.rate) for s in streams]
    policy, prev, tokens, seconds, ks = DraftPolicy(PolicySettings(n_max=4)), 0, 0.0, 0.0, []
    for i in range(passes):
        k = policy.choose(99) if fixed is None else fixed
        accepted = next((j for j in range(k) if not ss[j].right(i)), k)
        rows = k + 1
        t = CURVE[rows] + (SWITCH if prev and rows != prev else 0.0)
        prev = rows
        policy.observe_pass(rows, t)
        policy.observe_steps(k, k * STEP)
        policy.observe_result(k, accepted)
        tokens, seconds = tokens + 1 + accepted, seconds + t + k * STEP
        ks.append(k)
    return tokens / seconds, ks


def main() -> None:
    kinds = {"mixed": [Stream(0.45)] * 4, "real": [Stream(0.85)] + [Stream(0.62)] * 3, "hidden": [Stream(1.0)] * 4}
    for passes in (30, 100, 600):
        for name, streams in kinds.items():
            alone = run(streams, passes, fixed=0)[0]
            fixed = {k: run(streams, passes, fixed=k)[0] for k in range(1, 5)}
            best = max(fixed, key=fixed.get)
            rate, ks = run(streams, passes)
            print(
                f"{passes:>3} passes, {name:<7} adaptive {rate / alone:.3f}x the target alone; best fixed n-max {best}"
                f" {fixed[best] / alone:.3f}x; adaptive / best {rate / max(fixed[best], alone):.3f};"
                f" lengths {dict(sorted(Counter(ks).items()))}"
            )


if __name__ == "__main__":
    main()
