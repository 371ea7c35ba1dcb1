#!/usr/bin/env python3
"""The draft-length policy in simulation on this project's 2-core E2B curve as llama-server timed
it (1..5 rows: 105, 136, 190, 200, 250 ms; drafter step 3.5 ms) with a 31 ms cost for a pass
whose row count differs from the one before (llama.cpp rebuilding its graph): per drafter kind
(tests/policy_traces.py's even streams), the adaptive length's tokens/s against the target
alone and against the best fixed length, from a fresh policy over 30, 100 and 600 passes (a
benchmark's few requests of 48 tokens are 30-100 passes: what exploring the lengths costs
weighs most there). ``--spikes``: one-off spikes on the same schedule in every arm, both ways
(every 11th pass, from the 6th, at 1.3x its cost: a busy moment; every 17th, from the 9th, at
0.8x). ``--bursts``: another job holding the cores for seconds, in every arm: every 40th pass,
from the 20th, and the two after it at 10x (as on this project's shared machine, issue 23);
printed for the policy as it is and with ``burst_ratio=0`` (every steady timing kept, as before
issue 23's fix). ``--drift``: the whole machine's speed drifting in every arm, every row count alike, a
slow wave between 0.8x and 1.3x over 97 passes (llama-server's 1-row pass at E2B went 44-83 ms in one run on
this shared host, issue 38): the policy prices each row count at the speed now; printed with it priced as
timed too (before). ``--seeded``: the adaptive policy seeded with the curve's own costs before the
first pass (``spec-draft-adaptive-warmup``), printed beside the unseeded one, and seeded without the start-up
exploration of depth 1 (``explore_weight=0``, before issue 38's fix); ``--seed-error F``: every seed of 2 rows or
more at F times the curve's cost (start-up seeds against the same server's passes were 0.7x-1.2x on the AVX2 Zen 3,
session 38). The even streams and the spikes line up with the passes one way only, and a policy's
choices turn on which passes hit which answers, so each figure is the mean of ``--phases``
runs (13), each with the streams and the spike schedule started that many passes on; the
lengths drafted are the first run's. Not a test: it prints.

``--shadow``: the policy with ``shadow`` on (probes and explorations from no drafts drafted, not verified), beside
(seeded where ``--seeded`` is given).

    .venv/bin/python scripts/sim_draft_policy.py [--spikes] [--bursts] [--drift] [--seeded] [--seed-error F] [--shadow]
        [--phases N]
"""

import math
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from policy_traces import Stream  # noqa: E402

from gguf_exact.engines.shared.draft_policy import DraftPolicy, PolicySettings  # noqa: E402

# (name, seconds per pass of 1..5 rows, drafter step): llama-server's /metrics in the 16:15 run,
# and the 19:10 run's (the Python engine's ordered head; 5 rows from the fixed n-max 4 arm)
CURVES = [
    ("E2B 16:15", {1: 0.105, 2: 0.136, 3: 0.19, 4: 0.20, 5: 0.25}, 0.0035),
    ("E2B 19:10", {1: 0.100, 2: 0.170, 3: 0.220, 4: 0.225, 5: 0.250}, 0.0017),
    # llama-server's LLAMA_SPEC_DRAFT_TRACE of 2026-12-02 00:05, between the bursts (tests/policy_traces.BURST_CURVE)
    ("E2B 00:05", {1: 0.118, 2: 0.171, 3: 0.228, 4: 0.211, 5: 0.371}, 0.0029),
    # llama-server's policy at 2 threads, 2026-12-03 06:43 (results/bench-real-38-e2b-sampled-t2-adaptive-again-quiet.json);
    # SWITCH below is 1 thread's: at 2 threads a switch cost about 5 ms (docs/benchmarks.md, issue 38 at 2 threads)
    ("E2B 2 threads", {1: 0.060, 2: 0.109, 3: 0.151, 4: 0.139, 5: 0.200}, 0.00166),
    # llama-server's LLAMA_SPEC_DRAFT_TRACE at 2 threads, 2026-12-03 07:46, the `mixed` arm (medians)
    ("E2B 2 threads, trace", {1: 0.056, 2: 0.107, 3: 0.149, 4: 0.156, 5: 0.195}, 0.002),
    # issue 23's AVX-512 Xeon (tests/policy_traces.CURVES["avx512"]), the ordered head's step
    ("AVX-512", {1: 0.117, 2: 0.188, 3: 0.260, 4: 0.202, 5: 0.268}, 0.0017),
    # a Zen 5 at 2 threads, llama-server's LLAMA_SPEC_DRAFT_TRACE of 2026-12-03 (results/traces-38p-zen5-sampled/)
    ("Zen 5 2 threads", {1: 0.040, 2: 0.070, 3: 0.094, 4: 0.077, 5: 0.104}, 0.0017),
]
SWITCH = 0.031


def spike(i: int) -> float:
    """Pass i's cost as a share of the curve's (``--spikes``)."""
    return 1.3 if i % 11 == 6 else 0.8 if i % 17 == 9 else 1.0


def burst(i: int) -> float:
    """Pass i's cost as a share of the curve's (``--bursts``)."""
    return 10.0 if i >= 20 and (i - 20) % 40 < 3 else 1.0


def drift(i: int) -> float:
    """Pass i's cost as a share of the curve's (``--drift``): the machine's speed, a slow wave."""
    return 1.05 + 0.25 * math.sin(2 * math.pi * i / 97)


def as_timed(policy: DraftPolicy) -> DraftPolicy:
    """``policy`` pricing each row count as it was timed, whatever the machine's speed since (before issue 38)."""
    policy.now = lambda rows: policy.pass_cost[rows]  # type: ignore[method-assign]
    return policy


def run(
    curve: dict[int, float],
    step: float,
    streams: list[Stream],
    passes: int,
    fixed: int | None,
    spikes: bool,
    phase: int,
    bursts: bool = False,
    settings: PolicySettings | None = None,
    seeded: bool = False,
    drifting: bool = False,
    priced_as_timed: bool = False,
    seed_error: float = 1.0,
) -> tuple[float, list[int]]:
    ss = [Stream(s.rate, n=phase) for s in streams]
    policy, prev, tokens, seconds, ks = DraftPolicy(settings or PolicySettings(n_max=4)), 0, 0.0, 0.0, []
    policy = as_timed(policy) if priced_as_timed else policy
    for rows, cost in curve.items() if seeded else ():
        policy.seed(rows, cost * (seed_error if rows > 1 else 1.0))
    for i in range(passes):
        k = policy.choose(99) if fixed is None else fixed
        shadow = policy.shadow if fixed is None else 0  # drafted, not verified: answered as the next tokens would
        accepted = next((j for j in range(k + shadow) if not ss[j].right(i)), k + shadow)
        rows = k + 1
        speed = drift(i + 7 * phase) if drifting else 1.0
        t = curve[rows] * speed * (spike(i + phase) if spikes else 1.0) * (burst(i) if bursts else 1.0)
        t += SWITCH if prev and rows != prev else 0.0
        prev = rows
        policy.observe_pass(rows, t)
        policy.observe_steps(k + shadow, (k + shadow) * step * speed)
        if shadow:
            policy.observe_shadow(shadow, accepted)
            accepted = 0
        else:
            policy.observe_result(k, accepted)
        tokens, seconds = tokens + 1 + accepted, seconds + t + (k + shadow) * step * speed
        ks.append(k)
    return tokens / seconds, ks


def main() -> None:
    spikes, bursts, seeded = ("--spikes" in sys.argv[1:]), ("--bursts" in sys.argv[1:]), ("--seeded" in sys.argv[1:])
    drifting, shadows = "--drift" in sys.argv[1:], "--shadow" in sys.argv[1:]
    shadowing = PolicySettings(n_max=4, shadow=True)
    phases = int(sys.argv[sys.argv.index("--phases") + 1]) if "--phases" in sys.argv else 13
    error = float(sys.argv[sys.argv.index("--seed-error") + 1]) if "--seed-error" in sys.argv else 1.0
    kinds = {"mixed": [Stream(0.45)] * 4, "real": [Stream(0.85)] + [Stream(0.62)] * 3, "hidden": [Stream(1.0)] * 4}
    kinds["mixed-like"] = [Stream(0.45)] + [Stream(0.88)] * 3  # the `mixed` pair's measured shape (issue 38)
    kinds["sampled"] = [Stream(0.84), Stream(0.86), Stream(0.81), Stream(0.80)]  # rejection at Gemma's sampler (Zen 5)
    for title, curve, step in CURVES:
        print(f"{title}: {', '.join(f'{r} rows {c * 1e3:.0f} ms' for r, c in curve.items())}, step {step * 1e3:.1f} ms")
        for passes, (name, streams) in ((p, kind) for p in (30, 76, 100, 600) for kind in kinds.items()):
            runs, kept, seeds, timed, unexplored, shadowed = [], [], [], [], [], []  # per phase: tokens/s
            for phase in range(phases):
                machine = {"spikes": spikes, "phase": phase, "bursts": bursts, "drifting": drifting, "seed_error": error}
                alone = run(curve, step, streams, passes, 0, **machine)[0]
                fixed = {k: run(curve, step, streams, passes, k, **machine)[0] for k in range(1, 5)}
                runs.append((alone, fixed, run(curve, step, streams, passes, None, **machine)))
                every = PolicySettings(n_max=4, burst_ratio=0.0)  # every steady timing kept
                kept.append(run(curve, step, streams, passes, None, settings=every, **machine)[0])
                if shadows:
                    shadowed.append(run(curve, step, streams, passes, None, settings=shadowing, seeded=seeded, **machine)[0])
                if seeded:
                    seeds.append(run(curve, step, streams, passes, None, seeded=True, **machine)[0])
                    bare = PolicySettings(n_max=4, explore_weight=0.0)
                    unexplored.append(run(curve, step, streams, passes, None, settings=bare, seeded=True, **machine)[0])
                if drifting:
                    timed.append(run(curve, step, streams, passes, None, priced_as_timed=True, **machine)[0])
            best = max(range(1, 5), key=lambda k: sum(f[k] / a for a, f, _ in runs))
            mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
            print(
                f"{passes:>3} passes, {name:<7} adaptive {mean([r[0] / a for a, _, r in runs]):.3f}x the target alone;"
                f" best fixed n-max {best} {mean([f[best] / a for a, f, _ in runs]):.3f}x;"
                f" adaptive / best {mean([r[0] / max(max(f.values()), a) for a, f, r in runs]):.3f}"
                f" ({mean([b / max(max(f.values()), a) for (a, f, _), b in zip(runs, kept)]):.3f} keeping every timing"
                + (f", {mean([b / max(max(f.values()), a) for (a, f, _), b in zip(runs, timed)]):.3f} priced as timed" if drifting else "")
                + ");"
                f" lengths {dict(sorted(Counter(runs[0][2][1]).items()))}"
                + (
                    f"; shadows {mean([b / a for (a, _, _), b in zip(runs, shadowed)]):.3f}x the target alone,"
                    f" {mean([b / max(max(f.values()), a) for (a, f, _), b in zip(runs, shadowed)]):.3f} the best"
                    if shadows
                    else ""
                )
                + (
                    f"; seeded {mean([b / a for (a, _, _), b in zip(runs, seeds)]):.3f}x the target alone,"
                    f" {mean([b / max(max(f.values()), a) for (a, f, _), b in zip(runs, seeds)]):.3f} the best"
                    f" ({mean([b / max(max(f.values()), a) for (a, f, _), b in zip(runs, unexplored)]):.3f} unexplored)"
                    if seeded
                    else ""
                )
            )


if __name__ == "__main__":
    main()
