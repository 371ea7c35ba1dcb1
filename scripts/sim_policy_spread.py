#!/usr/bin/env python3
"""The adaptive length's spread over chance: each draft right at random with its depth's chance (a seeded RNG per
run), where ``scripts/sim_draft_policy.py``'s streams are even; per drafter kind, ``--runs`` runs (300) of
``--passes`` passes (190: bench-real's two prompts of 96 tokens), each pass's cost drawn within 8% of the card's.
Prints the adaptive length's tokens/s against the target alone's (mean, 10th, 50th and 90th percentile, worst) and
each fixed length's mean. The card is E2B at 2 threads on a Zen 5 as llama-server's start-up timed it for the
`real` pair (2026-12-05), seeded as there, drafter step 0.95 ms, shadows on (the shipped profiles); every kind's
first draft is right 1 time in 1,000 (the `real` pair's first, at Gemma's sampler). Not a test: it prints.

    .venv/bin/python scripts/sim_policy_spread.py [--runs N] [--passes N] [--card e2b-zen4 --step S]
        [--seeds lavapipe-1-user-start-up --step-seed S] [--shadow-weight W] [--no-held-back] [--cost-max-age N]
        [--live-shadows]

``--live-shadows`` tells each shadow as both engines do (at the pass whose token shows its first miss; dropped where
a verified draft comes first; none drafted while one is in flight), else in the pass that drafted it (the docs'
figures before session 35).

``--card`` takes another of ``tests/policy_traces.CURVES`` (its own drafter step with ``--step``, in seconds);
``--seeds`` seeds the costs with another card, or with ``lavapipe-1-user-start-up`` (``LAVAPIPE_1_USER_SEEDS``: the
lavapipe one-user card as its start-up timed it, 20-35% cheap), and ``--step-seed`` the drafter step (else both as the
card's own).

The `mixed` and `real` walks draw only where the walk starts and the costs' noise: their drafts are right where the
full-size pair's construction says (``tests/policy_traces.simulate``'s ``walk``).
"""

import argparse
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from policy_traces import CURVES, LAVAPIPE_1_USER_SEEDS, Stream, simulate  # noqa: E402

from gguf_exact.engines.shared import draft_policy  # noqa: E402
from gguf_exact.engines.shared.draft_policy import DraftPolicy, PolicySettings  # noqa: E402
from gguf_exact.tiny.pair_walk import N_AXES  # noqa: E402

CARD = CURVES["e2b-zen5"]
STEP, FIRST = 0.00095, 0.00095
SEEDS, STEP_SEED = CARD, STEP  # what start-up timed: the card's own unless --seeds / --step-seed
START_UP = CURVES | {"lavapipe-1-user-start-up": LAVAPIPE_1_USER_SEEDS}
SETTINGS: dict[str, int] = {}  # what-ifs on the shipped PolicySettings
LIVE = False  # --live-shadows
KINDS = {  # right per depth (each given the ones before were right)
    "mixed": (0.45, 0.45, 0.45, 0.45),
    "real": (0.82, 0.58, 0.66, 0.6),
    "sampled": (0.85, 0.7, 0.7, 0.7),
    "always-right": (1.0, 1.0, 1.0, 1.0),
}


@dataclass
class RandomStream(Stream):
    """A :class:`Stream` right at random with its rate (``then`` from pass ``after`` on), from ``rng``."""

    rng: random.Random = field(default_factory=random.Random)

    def right(self, pass_index: int) -> bool:
        return self.rng.random() < self.rate_at(pass_index)


def one_run(rates: tuple[float, ...], seed: int, passes: int, fixed: int | None = None) -> float:
    """Tokens/s against the target alone: the adaptive length's, or ``fixed`` drafts every pass."""
    rng = random.Random(seed)
    streams = [RandomStream(FIRST if d == 0 else r, r, 1, rng=rng) for d, r in enumerate(rates)]
    noise = {i: 1.0 + rng.uniform(-0.08, 0.08) for i in range(passes)}
    if fixed is not None:
        tokens = seconds = 0.0
        for i in range(passes):
            kept = next((j for j in range(fixed) if not streams[j].right(i)), fixed)
            tokens, seconds = tokens + 1 + kept, seconds + CARD[fixed + 1] * noise[i] + fixed * STEP
        return tokens / seconds * CARD[1]
    events: list[tuple] = []
    ks, _ = simulate(CARD, STEP, streams, passes, events=events, slow=noise, seeds=SEEDS, step_seed=STEP_SEED,
                     settings=PolicySettings(shadow=True, **SETTINGS), results_without_drafts=False,
                     live_shadows=LIVE)  # fmt: skip
    seconds = sum(e[2] for e in events if e[0] in ("pass", "steps"))
    return (len(ks) + sum(e[2] for e in events if e[0] == "result")) / seconds * CARD[1]


def walk_run(kind: str, seed: int, passes: int) -> float:
    """Tokens/s against the target alone on ``kind``'s full-size pair (:mod:`gguf_exact.tiny.pair_walk`) from a random
    axis: a kept draft moves the walk on, so passes that draft spend longer where drafts fail than the target alone's
    walk, which a shadow rides (the `mixed` pair: right on 8 axes of every 12)."""
    rng = random.Random(seed)
    start, noise = rng.randrange(N_AXES), {i: 1.0 + rng.uniform(-0.08, 0.08) for i in range(passes)}
    events: list[tuple] = []
    ks, _ = simulate(CARD, STEP, [], passes, events=events, slow=noise, seeds=SEEDS, step_seed=STEP_SEED,
                     settings=PolicySettings(shadow=True, **SETTINGS), results_without_drafts=False, walk=(kind, start),
                     live_shadows=LIVE)  # fmt: skip
    seconds = sum(e[2] for e in events if e[0] in ("pass", "steps"))
    return (len(ks) + sum(e[2] for e in events if e[0] == "result")) / seconds * CARD[1]


def main() -> None:
    global CARD, STEP, SEEDS, STEP_SEED, LIVE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--passes", type=int, default=190)
    ap.add_argument("--card", choices=sorted(CURVES), default="e2b-zen5", help="a tests/policy_traces.CURVES card")
    ap.add_argument("--step", type=float, default=STEP, help="the drafter step, seconds")
    ap.add_argument("--seeds", choices=sorted(START_UP), help="the costs start-up timed (default: the card's)")
    ap.add_argument("--step-seed", type=float, help="the drafter step start-up timed, seconds (default: --step)")
    # what-ifs, for the docs' before and after: a shadow's weight (the shipped SHADOW_WEIGHT otherwise; 1 before
    # patch 39y), no shadow first right after a miss (DraftPolicy.held_back, 39y), another cost_max_age
    ap.add_argument("--shadow-weight", type=float)
    ap.add_argument("--no-held-back", action="store_true")
    ap.add_argument("--cost-max-age", type=int)
    ap.add_argument("--live-shadows", action="store_true", help="shadows told as the engines tell them")
    args = ap.parse_args()
    card, runs, passes, CARD, STEP = args.card, args.runs, args.passes, CURVES[args.card], args.step
    SEEDS, STEP_SEED = START_UP[args.seeds] if args.seeds else CARD, STEP if args.step_seed is None else args.step_seed
    if args.shadow_weight is not None:
        draft_policy.SHADOW_WEIGHT = args.shadow_weight
    if args.cost_max_age is not None:
        SETTINGS["cost_max_age"] = args.cost_max_age
    LIVE = args.live_shadows
    if args.no_held_back:
        DraftPolicy.held_back = lambda self, k: False  # type: ignore[method-assign]
    seeded = f", seeded as {args.seeds}, step {STEP_SEED * 1e3:.2f} ms" if args.seeds or args.step_seed is not None else ""
    print(f"{runs} runs of {passes} passes; x the target alone ({card} card, step {STEP * 1e3:.2f} ms{seeded}, shadows on)")
    for kind, rates in KINDS.items():
        xs = sorted(one_run(rates, seed, passes) for seed in range(runs))
        p10, p50, p90 = (xs[round(q * (len(xs) - 1))] for q in (0.1, 0.5, 0.9))
        fixed = [statistics.mean(one_run(rates, seed, passes, n) for seed in range(runs)) for n in range(1, 5)]
        print(f"{kind:>12}: adaptive mean {statistics.mean(xs):.3f}, p10 {p10:.3f}, p50 {p50:.3f}, "
              f"p90 {p90:.3f}, worst {xs[0]:.3f}; fixed n-max 1-4 " + " ".join(f"{f:.3f}" for f in fixed))  # fmt: skip
    for kind in ("mixed", "real"):
        xs = sorted(walk_run(kind, seed, passes) for seed in range(runs))
        print(f"{kind + ' walk':>12}: adaptive mean {statistics.mean(xs):.3f}, p10 {xs[len(xs) // 10]:.3f}, "
              f"p50 {xs[len(xs) // 2]:.3f}, worst {xs[0]:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
