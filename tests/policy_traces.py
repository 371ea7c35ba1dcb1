"""Synthetic machines and drafters for the draft-length policy's tests: cost curves, acceptance
streams (deterministic, no RNG) and a loop that drives the policy as an engine does, recording
the events so the C++ twin can replay them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gguf_exact.runtime.draft_policy import DraftPolicy, PolicySettings

# seconds per verification pass of r rows
CURVES: dict[str, dict[int, float]] = {
    "cpu": {r: 0.1 * r for r in range(1, 7)},  # k rows cost k passes
    "gpu": {1: 0.010, **{r: 0.011 for r in range(2, 7)}},  # up to 5 rows cost 1.1 passes
    "avx512": {1: 0.117, 2: 0.188, 3: 0.260, 4: 0.202, 5: 0.268},  # repacked Q4_0 kernels: rows in fours
}


@dataclass
class Stream:
    """Whether the drafter is right at one depth, each time it is asked there: a share
    ``rate`` of the answers, spread evenly; from pass ``after`` on, ``then`` instead."""

    rate: float
    then: float | None = None
    after: int = 0
    n: int = field(default=0)

    def right(self, pass_index: int) -> bool:
        rate = self.then if self.then is not None and pass_index >= self.after else self.rate
        i = self.n
        self.n += 1
        return math.floor((i + 1) * rate) > math.floor(i * rate)


def simulate(
    curve: dict[int, float],
    step: float,
    streams: list[Stream],
    passes: int,
    n_max: int = 4,
    limit: int = 99,
    events: list[tuple] | None = None,
    slow: dict[int, float] | None = None,
    switch: float = 0.0,
    results_without_drafts: bool = True,
) -> tuple[list[int], DraftPolicy]:
    """Drive a fresh policy for ``passes`` passes; the k chosen before each. ``events``
    (when given) receives what the policy was told, in order, for a replay; ``slow`` times
    pass i at ``slow[i]`` times its cost (the machine busy for that pass); ``switch`` seconds are
    added to a pass whose row count differs from the pass before (llama.cpp's graph rebuilt);
    ``results_without_drafts=False``: a pass without drafts gets no ``observe_result``, as in
    both engines."""
    streams = [Stream(s.rate, s.then, s.after) for s in streams]  # fresh counters
    policy = DraftPolicy(PolicySettings(n_max=n_max))
    ks, prev = [], 0
    for i in range(passes):
        k = policy.choose(limit)
        accepted = 0
        for j in range(k):
            if not streams[j].right(i):
                break
            accepted += 1
        seconds = curve[k + 1] * (slow or {}).get(i, 1.0) + (switch if prev and k + 1 != prev else 0.0)
        prev = k + 1
        policy.observe_pass(k + 1, seconds)
        policy.observe_steps(k, k * step)
        if k or results_without_drafts:
            policy.observe_result(k, accepted)
        if events is not None:
            events += [("choose", limit, k), ("pass", k + 1, seconds), ("steps", k, k * step)]
            events += [("result", k, accepted)] if k or results_without_drafts else []
        ks.append(k)
    return ks, policy
