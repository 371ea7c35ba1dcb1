#!/usr/bin/env python3
"""The batch-aware draft length (gguf_exact.engines.shared.batch_cost) in simulation at 1, 2 and 4 slots
(llama-server --parallel), each slot choosing in slot order as llama-server's update loop does: total
generated tokens per second of the adaptive length against speculation off and each fixed length, per
drafter kind, over 64 and 400 passes from start-up (costs seeded, ``spec-draft-adaptive-warmup``: each
slot's 1-5 rows, and at 2 and 4 slots every batch total up to 5 rows a slot, patch 39s; ``--no-batch-seeds``:
the slot's own seeds only, as before 39s).

Curves (seconds per pass of t rows in all): ``e2b-t2``, E2B's target on 2 CPU cores of this machine
(llama-bench -p t -n 0 -t 2, 2026-12-03), the repacked Q4_0 kernels' steps every 4 rows included; ``e2b-zen5``, the same target as llama-server's
warm-up timed it at ``--parallel 4`` on a 2-core Zen 5 (2026-12-04); ``card``,
a pass that grows 30 ms a row over 40 ms; ``rows-are-passes``, t rows cost t passes (no draft can pay).
Each pass costs its curve's time, up to 5% more at random, plus the longest draft's drafter steps. The
drafters are right at each depth with a fixed chance (``KINDS``); the ``sampled`` one is verified by rejection
sampling, so each verified draft also tells the policy its chance of being kept (patch 38e), drawn around its
depth's rate with the spread ``CHANCE_SD`` (``--no-chances``: told 0 or 1 only, as before 38e). Each figure is
the mean of ``--seeds`` runs (12). At 2 and 4 slots each total's first pass costs ``FIRST_PASS`` (1.8) times its
curve's, as E2B's first passes after 4 prompts did (``--no-first-pass``: none); a first timing out of line with
its seed is doubted once (patch 39d; ``--no-doubt``: kept, as before). ``--cache-per-slot``: each slot
keeps a KV cache of its own (llama-server without ``--kv-unified``), so a batch whose slots bring unequal rows
runs as llama.cpp's passes (:func:`~gguf_exact.engines.shared.batch_cost.equal_split`: 4+2 rows are passes of 4 and 2),
each costing its curve's time; each slot is told the batch's layout and a split batch's passes, as
llama-server tells them (patch 39k; ``--by-totals``: told neither, as before 39k: a batch priced by its total
rows, a split batch's timing taken for its total's). ``--step-share S``: a drafter step of n sequences costs
``1 + S (n - 1)`` steps of one, seeded at start-up and told each call's sequence-steps as llama-server tells
them (patch 39v; ``--untold-share``: so dear but priced at one sequence's step, as before 39v). Not a test: it prints.

    .venv/bin/python scripts/sim_batch_policy.py [--seeds N] [--no-batch-seeds] [--no-chances] [--no-first-pass]
        [--no-doubt] [--cache-per-slot [--by-totals]] [--step-share S [--untold-share]] [--slots 1,2,4]
"""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from gguf_exact.engines.shared.batch_cost import BatchPolicy, equal_split  # noqa: E402
from gguf_exact.engines.shared.draft_policy import PolicySettings  # noqa: E402

E2B_T2_MS = {1: 62, 2: 97, 3: 121, 4: 129, 5: 161, 6: 190, 7: 223, 8: 197, 9: 276, 10: 306, 11: 315, 12: 284}
E2B_T2_MS |= {13: 337, 14: 349, 15: 378, 16: 308, 17: 362, 18: 367, 19: 401, 20: 393}
# the same target timed by llama-server's own warm-up at --parallel 4 on a 2-core Zen 5 (patch 39s's
# batch seeds, position 0, 2026-12-04): the tiles of four rows at every total
E2B_ZEN5_MS = {1: 38.0, 2: 67.3, 3: 88.9, 4: 75.1, 5: 97.9, 6: 121.0, 7: 147.6, 8: 127.8, 9: 149.7, 10: 186.2}
E2B_ZEN5_MS |= {11: 191.8, 12: 163.6, 13: 195.1, 14: 221.8, 15: 236.1, 16: 199.2, 17: 223.6, 18: 246.6, 19: 274.3}
E2B_ZEN5_MS |= {20: 244.3}
CURVES = {
    "e2b-t2": {t: ms / 1e3 for t, ms in E2B_T2_MS.items()},
    "e2b-zen5": {t: ms / 1e3 for t, ms in E2B_ZEN5_MS.items()},
    "card": {t: 0.040 + 0.030 * t for t in range(1, 21)},
    "rows-are-passes": {t: 0.1 * t for t in range(1, 21)},
}
STEP = 0.0017  # E2B's drafter step with the ordered head on 2 cores
KINDS = {"hidden": [1.0] * 4, "sampled": [0.835, 0.798, 0.793, 0.79], "real": [0.85, 0.62, 0.62, 0.62]}
KINDS |= {"mixed": [0.45] * 4}


BATCH_SEEDS = "--no-batch-seeds" not in sys.argv
CHANCES = "--no-chances" not in sys.argv
# each total's first pass in batches costs this many times its curve's (E2B, 4 users on a Zen 5: the first
# passes after the prompts took 1.7-2.1x their start-up timings; later ones 1.1-1.2x)
FIRST_PASS = 1.0 if "--no-first-pass" in sys.argv else 1.8
DOUBT = "--no-doubt" not in sys.argv
CACHE_PER_SLOT = "--cache-per-slot" in sys.argv
LAYOUT = CACHE_PER_SLOT and "--by-totals" not in sys.argv
STEP_SHARE = float(sys.argv[sys.argv.index("--step-share") + 1]) if "--step-share" in sys.argv else 0.0
TELL_SHARE = "--step-share" in sys.argv and "--untold-share" not in sys.argv
SLOTS = [int(n) for n in sys.argv[sys.argv.index("--slots") + 1].split(",")] if "--slots" in sys.argv else [1, 2, 4]
TOLD = {"sampled"}  # the kinds whose drafts are verified by rejection sampling
CHANCE_SD = 0.2  # the spread of sum min(p, q) over a depth's positions (a Beta around the depth's rate)


def chance(rng: random.Random, rate: float) -> float:
    """A position's sum min(p, q), its mean ``rate``: a Beta of spread CHANCE_SD (less where rate is near 0 or 1)."""
    var = min(CHANCE_SD**2, 0.9 * rate * (1 - rate))
    if var <= 0:
        return rate
    n = rate * (1 - rate) / var - 1
    return rng.betavariate(rate * n, (1 - rate) * n)


def run(
    cost: dict[int, float], rates: list[float], slots: int, passes: int, fixed: int | None, seed: int, told: bool
) -> float:
    """Tokens per second of ``slots`` slots over ``passes`` passes, each drafting ``fixed`` or adaptive;
    ``told``: each verified draft's chance of being kept is told (rejection sampling)."""
    rng, chances = random.Random(seed), random.Random(seed + 1000)
    policies = [BatchPolicy(PolicySettings(n_max=4)) for _ in range(slots)]
    seen: set[int] = set()
    for policy in policies:
        policy.batch.doubt_ratio = policy.batch.doubt_ratio if DOUBT else 0.0
    for policy in policies:
        for rows in range(1, 6):
            policy.seed(rows, cost[rows])
        for total in range(1, 5 * slots + 1) if slots > 1 and BATCH_SEEDS else ():
            policy.seed_batch(total, cost[total])
        for sequences in (1, slots) if TELL_SHARE else ():
            policy.seed_steps(1, STEP * (1.0 + STEP_SHARE * (sequences - 1)), sequences)
    tokens = seconds = 0.0
    for _ in range(passes):
        rows, expected, chosen = 0, 0.0, []
        for s, policy in enumerate(policies):
            after, longest = slots - s - 1, max(chosen, default=0)
            layout = [k + 1 for k in chosen] + [-1] * (after + 1) if LAYOUT else []
            k = (
                fixed
                if fixed is not None
                else policy.choose(99, rows + after, expected + after, longest, after, layout, sum(chosen))
            )
            chosen.append(k)
            rows, expected = rows + k + 1, expected + policy.expected_tokens(k)
        steps = max(chosen)
        first = slots > 1 and rows not in seen
        seen.add(rows)
        split = equal_split([k + 1 for k in chosen]) if CACHE_PER_SLOT else [rows]
        graph = sum(cost[r] for r in split)
        call = STEP * (steps * (1.0 - STEP_SHARE) + STEP_SHARE * sum(chosen))
        t = graph * (1 + 0.05 * rng.random()) * (FIRST_PASS if first else 1.0) + call
        for policy, k in zip(policies, chosen):
            # the chance a position had is drawn first and the draft kept with it: its mean is the depth's rate
            c = [chance(chances, r) if told else r for r in rates[:k]]
            accepted = next((j for j in range(k) if rng.random() >= c[j]), k)
            if k:
                policy.observe_steps(steps, call, sum(chosen) if TELL_SHARE else 0)
            policy.observe_pass(k + 1, t, rows, len(split) if LAYOUT else 1)
            if k:
                policy.observe_result(k, accepted, c[: min(accepted + 1, k)] if told else ())
            tokens += 1 + accepted
        seconds += t
    return tokens / seconds


def mean(
    cost: dict[int, float], rates: list[float], slots: int, passes: int, fixed: int | None, n: int, told: bool
) -> float:
    return sum(run(cost, rates, slots, passes, fixed, seed, told) for seed in range(n)) / n


def main() -> None:
    n = int(sys.argv[sys.argv.index("--seeds") + 1]) if "--seeds" in sys.argv else 12
    shares: list[float] = []
    for name, cost in CURVES.items():
        shown = (1, 4, 8, 16, 20)
        print(f"{name}: " + ", ".join(f"{t} rows {c * 1e3:.0f} ms" for t, c in cost.items() if t in shown))
        for slots in SLOTS:
            for passes in (64, 400):
                for kind, rates in KINDS.items():
                    told = CHANCES and kind in TOLD
                    arm = {k: mean(cost, rates, slots, passes, k, n, told) for k in (0, 1, 2, 3, 4, None)}
                    off, adaptive = arm[0], arm[None]
                    fixed = {k: arm[k] for k in range(1, 5)}
                    best = max(fixed, key=lambda k: fixed[k])
                    shares.append(adaptive / max(off, fixed[best]))
                    print(
                        f"  {slots} slots, {passes:>3} passes, {kind:<7} adaptive {adaptive / off:.3f}x off,"
                        f" {adaptive / max(off, fixed[best]):.3f}x the better of off and the best fixed"
                        f" (n-max {best}: {fixed[best] / off:.3f}x off)"
                    )
    print(f"the better of off and the best fixed: mean share {sum(shares) / len(shares):.4f}, worst {min(shares):.3f}")


if __name__ == "__main__":
    main()
