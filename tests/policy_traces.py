"""Synthetic machines and drafters for the draft-length policy's tests: cost curves, acceptance
streams (deterministic, no RNG) and a loop that drives the policy as an engine does, recording
the events so the C++ twin can replay them."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from gguf_exact.bench.acceptance import read_results
from gguf_exact.engines.shared.acceptance_class import GREEDY, SAMPLED_EXACT
from gguf_exact.engines.shared.batch_cost import BatchPolicy, equal_split
from gguf_exact.engines.shared.draft_policy import DraftPolicy, PolicySettings
from gguf_exact.tiny.pair_walk import right as walk_right

# seconds per verification pass of r rows
CURVES: dict[str, dict[int, float]] = {
    "cpu": {r: 0.1 * r for r in range(1, 7)},  # k rows cost k passes
    "gpu": {1: 0.010, **{r: 0.011 for r in range(2, 7)}},  # up to 5 rows cost 1.1 passes
    "avx512": {1: 0.117, 2: 0.188, 3: 0.260, 4: 0.202, 5: 0.268},  # repacked Q4_0 kernels: rows in fours
    # E2B on this project's 2 CPU cores as the 2026-12-01 19:10 run timed it (5 rows: the fixed
    # n-max 4 arm's passes); with E2B_SWITCH for a pass of another row count than the one before
    "e2b": {1: 0.100, 2: 0.170, 3: 0.220, 4: 0.225, 5: 0.250},
    # the tiny pair on lavapipe as llama-server's start-up timed it (results/traces-s24-lavapipe-tiny-hidden-4-users)
    "lavapipe": {1: 0.0457, 2: 0.0689, 3: 0.1019, 4: 0.1108, 5: 0.1318},
    # E2B at 2 threads on a Zen 5 as llama-server's start-up timed it (2026-12-05, the `real` pair): 4 rows 2.2 passes
    "e2b-zen5": {1: 0.0348, 2: 0.0700, 3: 0.0904, 4: 0.0776, 5: 0.1037},
    # E2B at 2 threads on a Zen 4 (2026-12-05): the lowest steady passes of six traced `mixed` runs
    # (results/traces-s29-e2b-mixed-gemma-rejection-39x-39y-ab): 4 rows 2.8 passes, little pays
    "e2b-zen4": {1: 0.0410, 2: 0.0790, 3: 0.1100, 4: 0.1190, 5: 0.1570},
    # the same Zen 4 as llama-server's start-up timed it (2026-12-05, the `mixed` pair): 4 rows 2.5 passes
    "e2b-zen4-live": {1: 0.050, 2: 0.090, 3: 0.127, 4: 0.123, 5: 0.154},
    # the tiny `hidden` pair on lavapipe, one user, on the Zen 4 (2026-12-05): the median passes after start-up,
    # 20-35% dearer than its start-up timings (LAVAPIPE_1_USER_SEEDS); nothing pays
    "lavapipe-1-user": {1: 0.0706, 2: 0.1133, 3: 0.1765, 4: 0.2139, 5: 0.2525},
}
LAVAPIPE_1_USER_SEEDS = {1: 0.0529, 2: 0.0834, 3: 0.1161, 4: 0.1526, 5: 0.2209}
LAVAPIPE_1_USER_STEP, LAVAPIPE_1_USER_STEP_SEED = 0.041, 0.034  # the drafter step: median after, at start-up
LAVAPIPE_STEP = 0.090  # its drafter step: 61-121 ms in that run, the target's 1-row pass 46
E2B_SWITCH, E2B_STEP = 0.031, 0.0017  # llama.cpp's graph rebuilt; the drafter step with its ordered head

# One dear steady timing (issue 23's 19:10 run): pass 6, an always-right drafter's first steady
# pass of 5 rows after the climb 0, 0, 1, 2, 3, 4, at 1.38x (llama-server timed 344 ms against
# about 250), so 3 drafts look better than 4, the bound
ONE_DEAR_TIMING = {6: 1.38}


@dataclass
class Stream:
    """Whether the drafter is right at one depth, each time it is asked there: a share
    ``rate`` of the answers, spread evenly; from pass ``after`` on, ``then`` instead."""

    rate: float
    then: float | None = None
    after: int = 0
    n: int = field(default=0)

    def rate_at(self, pass_index: int) -> float:
        return self.then if self.then is not None and pass_index >= self.after else self.rate

    def right(self, pass_index: int) -> bool:
        rate = self.rate_at(pass_index)
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
    settings: PolicySettings | None = None,
    seeds: dict[int, float] | None = None,
    slow_steps: dict[int, float] | None = None,
    requests: dict[int, tuple[str, list[Stream]]] | None = None,
    tell_class: bool = True,
    step_seed: float | None = None,
    walk: tuple[str, int] | None = None,
    live_shadows: bool = False,
) -> tuple[list[int], DraftPolicy]:
    """Drive a fresh policy for ``passes`` passes; the k chosen before each. ``seeds``: pass
    costs by rows timed before the first pass (an engine's start-up), given first. ``events``
    (when given) receives what the policy was told, in order, for a replay; ``slow`` times
    pass i at ``slow[i]`` times its cost (the machine busy for that pass); ``switch`` seconds are
    added to a pass whose row count differs from the pass before (llama.cpp's graph rebuilt);
    ``results_without_drafts=False``: a pass without drafts gets no ``observe_result``, as in
    both engines; ``settings`` (``n_max`` ignored) for the defaults; ``slow_steps``: pass i's
    drafter steps at ``slow_steps[i]`` times their cost. ``requests``: from pass i on, requests of
    acceptance class c whose drafts follow these streams (the engine names the class to the policy
    when a request starts; ``tell_class=False``: it does not, as before issue 38 item 4). ``step_seed``: a
    drafter step timed at start-up, given after the seeds. ``walk``: (kind, axis): the drafts are right where a
    full-size pair of that kind says (:mod:`gguf_exact.tiny.pair_walk`), from that axis on, in place of the streams;
    a pass moves the walk on by the tokens it gives (a shadow's: one), so drafting spends longer where drafts fail.
    ``live_shadows``: a shadow is told as both engines tell it, at the pass whose token shows its first miss (or
    matches its last draft), dropped where a verified draft comes first, and none drafted while one is in flight;
    else at once, in the pass that drafted it."""
    streams = [replace(s, n=0) for s in streams]  # fresh counters (a subclass kept)
    policy = DraftPolicy(replace(settings or PolicySettings(), n_max=n_max))
    for rows, seconds in (seeds or {}).items():
        policy.seed(rows, seconds)
        if events is not None:
            events.append(("seed", rows, seconds))
    if step_seed is not None:
        policy.seed_steps(1, step_seed)
        if events is not None:
            events.append(("step-seed", 1, step_seed))
    ks, prev, axis = [], 0, walk[1] if walk else 0
    pending: tuple[int, int, int] | None = None  # live_shadows: the shadow in flight (drafts, matched, pass told)
    for i in range(passes):
        if i in (requests or {}):
            name, streams = requests[i][0], [replace(s, n=0) for s in requests[i][1]]
            if tell_class:
                policy.set_class(name)
                if events is not None:
                    events.append(("class", name))
        k = policy.choose(limit)
        shadow = policy.shadow  # drafts not verified: the streams answer them as the target's next tokens would
        if live_shadows and (k or pending):
            pending = None if k else pending  # a verified draft drops the one in flight; none drafted beside one
            shadow = 0
        accepted = 0
        for j in range(k + shadow):
            if not (walk_right(walk[0], axis + j + 1, j + 1) if walk else streams[j].right(i)):
                break
            accepted += 1
        axis += 1 + (accepted if k else 0)
        seconds = curve[k + 1] * (slow or {}).get(i, 1.0) + (switch if prev and k + 1 != prev else 0.0)
        prev = k + 1
        policy.observe_pass(k + 1, seconds)
        step_seconds = (k + shadow) * step * (slow_steps or {}).get(i, 1.0)
        policy.observe_steps(k + shadow, step_seconds)
        told = [(shadow, accepted)] if shadow else []
        if live_shadows and shadow:  # told at the pass whose token shows its first miss or matches its last draft
            pending, told = (shadow, accepted, i + min(accepted, shadow - 1)), []
        if live_shadows and pending and pending[2] == i:
            told, pending = [pending[:2]], None
        if k or (results_without_drafts and not shadow):
            policy.observe_result(k, accepted)
        for drafts, matched in told:
            policy.observe_shadow(drafts, matched)
        if events is not None:
            events += [("choose", limit, k), ("pass", k + 1, seconds), ("steps", k + shadow, step_seconds)]
            events += [("result", k, accepted)] if k or (results_without_drafts and not shadow) else []
            events += [("shadow", drafts, matched) for drafts, matched in told]
        ks.append(k)
    return ks, policy


def one_dear_timing(
    passes: int = 200, events: list[tuple] | None = None, settings: PolicySettings | None = None
) -> tuple[list[int], DraftPolicy]:
    """The ONE_DEAR_TIMING run on the E2B curve: an always-right drafter, bound 4."""
    return simulate(
        CURVES["e2b"],
        step=E2B_STEP,
        streams=[Stream(1.0)] * 4,
        passes=passes,
        events=events,
        slow=ONE_DEAR_TIMING,
        switch=E2B_SWITCH,
        settings=settings,
    )


# A burst (issue 23, E2B on this project's 2 shared cores, 2026-12-02 00:05): another job held the
# cores for seconds, and 3 passes in a row cost 10-40x; E2B's costs as llama-server timed them
# between bursts (4 rows cheaper than 3), a real-like drafter, the burst while it drafts 3
BURST_CURVE = {1: 0.118, 2: 0.171, 3: 0.228, 4: 0.211, 5: 0.371}
BURST = {i: 10.0 for i in range(50, 53)}


def burst(events: list[tuple] | None = None, settings: PolicySettings | None = None, slow: dict | None = BURST):
    """The BURST run: 120 passes, bound 4, drafter step 2.9 ms."""
    streams = [Stream(0.85)] + [Stream(0.62)] * 3
    return simulate(BURST_CURVE, 0.0029, streams, 120, events=events, slow=slow, settings=settings)


# A busy start (issue 41 §6): llama-server started while the machine was busy timed 2 rows at
# 3.55 s against 0.17 s for 1 at start-up and stayed at the target alone (7 minutes for 5 requests the
# Python engine answered in 2 min 44 s). The start-up seeds as it logged them for 1 and 2 rows, the
# longer ones as busy as 1; then E2B's passes (E2B_SWITCH) and a real-like drafter
BUSY_SEEDS = {1: 0.17, 2: 3.55, 3: 0.34, 4: 0.36, 5: 0.40}
REAL_LIKE = (Stream(0.85), Stream(0.62), Stream(0.62), Stream(0.62))


def busy_seeds(events: list[tuple] | None = None, settings: PolicySettings | None = None, passes: int = 120):
    """The BUSY_SEEDS run: bound 4, E2B's curve and step."""
    return simulate(
        CURVES["e2b"], E2B_STEP, list(REAL_LIKE), passes, events=events, switch=E2B_SWITCH, settings=settings,
        seeds=BUSY_SEEDS,
    )  # fmt: skip


# The same start's drafter step (185 ms, the host busy): the first passes that draft time their steps
# at 100x, after which not even an always-right drafter could pay at those prices (priced out), and
# nothing but a recheck times the step again
BUSY_STEPS = {i: 100.0 for i in range(0, 8)}


def busy_steps(events: list[tuple] | None = None, settings: PolicySettings | None = None, passes: int = 200):
    """The BUSY_STEPS run: bound 4, E2B's curve (unseeded), its drafter step 100x for the first 8 passes."""
    return simulate(
        CURVES["e2b"], E2B_STEP, list(REAL_LIKE), passes, events=events, switch=E2B_SWITCH, settings=settings,
        slow_steps=BUSY_STEPS,
    )  # fmt: skip


def lavapipe_mixed_walk(events: list[tuple] | None = None, settings: PolicySettings | None = None, passes: int = 370):
    """The `mixed` pair's walk from axis 6 on the lavapipe one-user card, seeded as it was (20-35% cheap), its drafter
    step 0.58 of a 1-row pass, each pass within 8% of its cost (``random.Random(1)``): the seeded 2 rows, never
    verified, make a probe of depth 1 from the target alone look payable; its shadow is right 2 times in 3."""
    rng = random.Random(1)
    noise = {i: 1.0 + rng.uniform(-0.08, 0.08) for i in range(passes)}
    return simulate(CURVES["lavapipe-1-user"], LAVAPIPE_1_USER_STEP, [], passes, events=events, slow=noise,
                    seeds=LAVAPIPE_1_USER_SEEDS, step_seed=LAVAPIPE_1_USER_STEP_SEED,
                    settings=settings or PolicySettings(shadow=True), results_without_drafts=False,
                    walk=("mixed", 6))  # fmt: skip


def read_trace(path) -> list[tuple[PolicySettings, list[tuple], list[int]]]:
    """An ``LLAMA_SPEC_DRAFT_TRACE`` file (llama-server's, patch 23, or the Python engine's,
    ``engines/python/policy_trace.py``): per policy in it (a settings line each: a server started
    again, a new bound), the settings, the events as :func:`simulate` records them, and the k
    that policy chose before each pass."""
    sections: list[tuple[PolicySettings, list[tuple], list[int]]] = []
    names = ("n_max", "prior", "prior_weight", "decay", "cost_weight", "probe_interval", "probe_interval_max")
    names += ("cost_max_age", "switch_margin", "cost_window", "retime_margin", "burst_ratio", "outlier_ratio")
    names += ("recheck_interval", "explore_weight", "explore_errors", "shadow")
    for line in open(path):
        w = line.split()
        if not w:
            continue
        if w[0] == "settings":
            settings = PolicySettings(**{n: (float if "." in v or "e" in v else int)(v) for n, v in zip(names, w[1:])})
            settings = replace(settings, shadow=bool(settings.shadow))
            sections.append((settings, [], []))
            events, chosen = sections[-1][1], sections[-1][2]
        elif w[0] == "#":
            if w[1] == "k":
                chosen.append(int(w[2]))
        elif w[0] == "choose":  # the batch's other rows and tokens where written (issue 39), their longest draft
            # and all of them (patch 39v: LONGEST:ALL), the slots after, the layout where the slots keep a cache each
            batch: tuple = ()
            if len(w) > 2:
                longest, _, drafted = w[4].partition(":")
                after = int(w[5]) if len(w) > 5 else 0
                batch = (int(w[2]), float(w[3]), int(longest), after, int(drafted or 0), *(int(a) for a in w[6:]))
            events.append(("choose", int(w[1]), None, *batch))
        elif w[0] in ("pass", "steps", "seed", "step-seed", "batch-seed"):  # a pass's total rows, graph passes
            events.append((w[0], int(w[1]), float(w[2]), *(int(a) for a in w[3:])))
        elif w[0] in ("result", "shadow"):  # each draft's chance of being kept where written (rejection sampling)
            events.append((w[0], int(w[1]), int(w[2]), *(float(c) for c in w[3:])))
        elif w[0] == "class":
            events.append(("class", w[1]))
        else:
            raise ValueError(f"{path}: unknown trace line {line!r}")
    assert sections, f"{path}: no settings line"
    return sections


def replay_python(settings: PolicySettings, events: list[tuple]) -> list[int]:
    """The k the Python twin chooses on recorded events (``choose`` events' own k ignored)."""
    policy, ks = BatchPolicy(settings), []
    for e in events:
        # ("choose", limit, k[, others_rows, others_tokens, others_drafts, after, others_drafted, layout...])
        if e[0] == "choose":
            ks.append(policy.choose(e[1], *e[3:7], layout=tuple(e[8:]), others_drafted=e[7] if len(e) > 7 else 0))
        elif e[0] == "pass":
            policy.observe_pass(e[1], e[2], *e[3:])
        elif e[0] == "steps":
            policy.observe_steps(e[1], e[2], *e[3:])
        elif e[0] == "seed":
            policy.seed(e[1], e[2])
        elif e[0] == "step-seed":
            policy.seed_steps(e[1], e[2], *e[3:])
        elif e[0] == "batch-seed":
            policy.seed_batch(e[1], e[2])
        elif e[0] == "class":
            policy.set_class(e[1])
        elif e[0] == "result":
            policy.observe_result(e[1], e[2], e[3:])
        elif e[0] == "shadow":
            policy.observe_shadow(e[1], e[2], e[3:])
        else:
            raise ValueError(f"no policy call for event {e!r}")
    return ks


# Greedy requests, then sampled ones (issue 38 item 4): on E2B's curve the drafter real-like at greedy
# exact match and right at 0.3 at every depth when the target samples its tokens (exact match keeps
# a draft only with the target's probability of it), three of each in turn, 40 passes each
SAMPLED_LOW = (Stream(0.3),) * 4
CLASS_SWITCHES = {
    i * 40: (GREEDY, list(REAL_LIKE)) if i % 2 == 0 else (SAMPLED_EXACT, list(SAMPLED_LOW)) for i in range(6)
}


def class_switches(events: list[tuple] | None = None, tell_class: bool = True, settings: PolicySettings | None = None):
    """The CLASS_SWITCHES run: bound 4, E2B's curve, step and switch, unseeded; ``tell_class=False``:
    the policy is not told the requests' classes (one set of counts, as before)."""
    return simulate(
        CURVES["e2b"], E2B_STEP, list(REAL_LIKE), 240, events=events, switch=E2B_SWITCH, settings=settings,
        requests=CLASS_SWITCHES, tell_class=tell_class,
    )  # fmt: skip


def pass_yields(events: list[tuple]) -> list[tuple[int, float]]:
    """(tokens, seconds) of each pass of a recorded run: the accepted drafts and the target's token,
    in the target's pass and the drafter steps before it."""
    out: list[tuple[int, float]] = []
    seconds = 0.0
    for e in events:
        if e[0] == "pass":
            seconds = e[2]
        elif e[0] == "steps":
            seconds += e[2]
        elif e[0] == "result":
            out.append((e[2] + 1, seconds))
    return out


# A CPU's repacked Q4_0 kernels in a batch of slots (issue 39): rows multiplied in fours and each row left
# over as a pass of its own (E2B at 4 users, llama-server's trace of 2026-12-03: 4 rows 101 ms, 5 131,
# 6 174, 7 224). TILED_SEEDS: as start-up times them (one sequence at position 0), every total up to 4
# slots * 5 rows; TILED_LOAD: the batches of 4 users' contexts, each total at 1.25x its seed.
TILED_SEEDS = {
    t: {1: 0.048, 2: 0.085, 3: 0.099}[t] if t < 4 else 0.070 + 0.040 * (t % 4) + 0.020 * (t // 4 - 1)
    for t in range(1, 21)
}
TILED_LOAD = {t: 1.25 * c for t, c in TILED_SEEDS.items()}


def batch_speed(cost: dict[int, float], step: float, events: list[list[tuple]], ks: list[list[int]], totals: list[int]):
    """Tokens per second of a :func:`batched` run whose slots all generated in every pass: the tokens
    each pass brought (1 a slot, and the drafts it kept) over the passes' costs and the drafter's steps."""
    kept = sum(e[2] for slot in events for e in slot if e[0] == "result")
    steps = sum(max(slot[i] for slot in ks) for i in range(len(totals))) * step
    return (len(ks) * len(totals) + kept) / (sum(cost[t] for t in totals) + steps)


# The tiny pair on lavapipe at --parallel 4 as llama-server's start-up timed it (results/traces-s26-lavapipe-
# tiny-hidden-4-users): every batch total, a drafter step of one sequence, and the step of 4 sequences that
# trace's calls took (62-103 ms; 70.8 the mean of its 6 calls)
LAVAPIPE_4 = {1: 0.0408, 2: 0.0912, 3: 0.0949, 4: 0.1038, 5: 0.1368, 6: 0.1448, 7: 0.1718, 8: 0.1998, 9: 0.1877}
LAVAPIPE_4 |= {10: 0.1962, 11: 0.2289, 12: 0.2328, 13: 0.3453, 14: 0.2812, 15: 0.3108, 16: 0.3923, 17: 0.4264}
LAVAPIPE_4 |= {18: 0.4774, 19: 0.3991, 20: 0.4074}
LAVAPIPE_4_STEP, LAVAPIPE_4_STEP_ALL = 0.0256, 0.0708


# A machine whose pass grows little up to 5 rows in all and then a row costs 20 ms (a card whose compute
# the batch fills): alone, 4 drafts pay; beside 3 other slots' rows, drafts push the batch past 5 rows
SATURATING = {t: 0.010 + 0.001 * t if t <= 5 else 0.015 + 0.020 * (t - 5) for t in range(1, 26)}


def batched(
    cost: dict[int, float],
    step: float,
    streams: list[list[Stream]],
    phases: list[tuple[int, int]],
    n_max: int = 4,
    limit: int = 99,
    seeds: dict[int, float] | None = None,
    batch_seeds: dict[int, float] | None = None,
    chances: bool = False,
    first_pass: float = 1.0,
    doubt_ratio: float | None = None,
    cache_per_slot: bool = False,
    tell_layout: bool = True,
    shadow: bool = False,
    step_share: float | None = None,
    tell_share: bool = True,
) -> tuple[list[list[int]], list[list[tuple]], list[BatchPolicy], list[int]]:
    """Drive one :class:`BatchPolicy` per slot as llama-server's update loop does at ``--parallel``: each
    ``(passes, n)`` phase has slots 0..n-1 generating; before a pass each slot chooses in slot order
    knowing the rows and expected tokens of the slots before it (their drafts + 1, the longest draft) and
    1 row, 1 token for each one after it (and how many: ``after``, expected to choose alike); the pass costs ``cost`` of its total rows, each slot told the whole pass's
    seconds and total (alone: the one-user calls); the drafter call as many steps as the longest draft.
    ``seeds``: every slot's costs timed at start-up, given first; ``batch_seeds``: the totals timed at
    start-up for batches, given next; ``chances``: each verified draft's chance of being kept is told too
    (rejection sampling's sum min(p, q)), its depth's rate; ``first_pass``: each total's first pass costs this
    many times its ``cost`` (E2B's first passes after 4 prompts: 1.7-2.1x); ``doubt_ratio``: the policies'
    :attr:`BatchCost.doubt_ratio` (0: every first timing kept); ``cache_per_slot``: the slots keep a KV
    cache each, so a batch of unequal rows is llama.cpp's passes (:func:`equal_split`), each costing ``cost``
    of its rows, and each slot is told the batch's layout (``tell_layout``) and the passes, as llama-server
    tells them; ``shadow``: the policies' setting (a shadow's drafts are answered by the streams as the next
    tokens would, after the pass, and drafted in the same call); ``step_share``: a drafter step of n sequences
    costs ``step * (1 + step_share * (n - 1))``, timed at start-up (one sequence, then every slot's) and told
    each call's sequence-steps, as llama-server (patch 39v) does (None: every step ``step``, untold;
    ``tell_share=False``: so dear, but untold, as before 39v). Returns
    each slot's k per pass it generated in and its events, the policies and each pass's rows."""
    streams = [[replace(s, n=0) for s in slot] for slot in streams]
    policies = [BatchPolicy(PolicySettings(n_max=n_max, shadow=shadow)) for _ in streams]
    for policy in policies if doubt_ratio is not None else ():
        policy.batch.doubt_ratio = doubt_ratio
    ks: list[list[int]] = [[] for _ in streams]
    events: list[list[tuple]] = [[] for _ in streams]
    for policy, slot_events in zip(policies, events):
        for rows, seconds in (seeds or {}).items():
            policy.seed(rows, seconds)
            slot_events.append(("seed", rows, seconds))
        for total, seconds in (batch_seeds or {}).items():
            policy.seed_batch(total, seconds)
            slot_events.append(("batch-seed", total, seconds))
        for sequences in (1, len(streams)) if step_share is not None and tell_share else ():
            seconds = step * (1.0 + step_share * (sequences - 1))
            policy.seed_steps(1, seconds, sequences)
            slot_events.append(("step-seed", 1, seconds, *((sequences,) if sequences > 1 else ())))
    totals, i = [], 0
    for passes, n in phases:
        with_layout = cache_per_slot and tell_layout and n > 1
        for _ in range(passes):
            rows, tokens, chosen, shadows = 0, 0.0, [], []
            for s in range(n):
                after, longest = n - s - 1, max((k + d for k, d in zip(chosen, shadows)), default=0)  # the call's steps
                drafted = sum(k + d for k, d in zip(chosen, shadows))
                layout = [k + 1 for k in chosen] + [-1] * (after + 1) if with_layout else []
                k = policies[s].choose(limit, rows + after, tokens + after, longest, after, layout, drafted)
                events[s].append(("choose", limit, k, rows + after, tokens + after, longest, after, drafted, *layout))
                ks[s].append(k)
                chosen.append(k)
                shadows.append(policies[s].shadow)
                rows, tokens = rows + k + 1, tokens + policies[s].expected_tokens(k)
            steps = max(k + d for k, d in zip(chosen, shadows))
            share = step_share or 0.0
            sequence_steps = sum(k + d for k, d in zip(chosen, shadows))
            call = step * (steps * (1.0 - share) + share * sequence_steps)
            told_steps = (sequence_steps,) if step_share is not None and tell_share else ()
            split = equal_split([k + 1 for k in chosen]) if cache_per_slot else [rows]
            seconds = sum(cost[t] for t in split) * (first_pass if rows not in totals else 1.0)
            totals.append(rows)
            for s, k in enumerate(chosen):
                accepted, drafted = 0, k + shadows[s]
                while accepted < drafted and streams[s][accepted].right(i):
                    accepted += 1
                if drafted:  # the slots that drafted: the call took as many steps as the longest draft
                    policies[s].observe_steps(steps, call, *told_steps)
                    events[s].append(("steps", steps, call, *told_steps))
                passes = (len(split),) if len(split) > 1 else ()
                policies[s].observe_pass(k + 1, seconds, rows, *passes)
                events[s].append(("pass", k + 1, seconds, rows, *passes))
                if drafted:
                    told = tuple(streams[s][j].rate for j in range(min(accepted + 1, drafted))) if chances else ()
                    what = "result" if k else "shadow"
                    (policies[s].observe_result if k else policies[s].observe_shadow)(drafted, accepted, told)
                    events[s].append((what, drafted, accepted, *told))
            i += 1
    return ks, events, policies, totals


# E2B at 2 threads as llama-server's policy trace timed it (2026-12-03 07:46, the `mixed` arm: medians),
# a 5 ms switch; a drafter right at 0.45 at depth 1 and 0.88 deeper (the `mixed` pair's measured shape):
# nothing pays at these costs. DRIFT: the whole machine from pass 150 on at this share of its speed
# (the same trace's 1-row pass went 44-83 ms), as a slow minute or a fast one on a shared host.
E2B_T2, E2B_T2_STEP, E2B_T2_SWITCH = {1: 0.056, 2: 0.107, 3: 0.149, 4: 0.156, 5: 0.195}, 0.002, 0.005
MIXED_LIKE = (Stream(0.45), Stream(0.88), Stream(0.88), Stream(0.88))


def drift(factor: float | None, events: list[tuple] | None = None, passes: int = 400):
    """The DRIFT run on E2B_T2 (``factor`` None: the machine steady)."""
    slow = {i: factor for i in range(150, passes)} if factor else None
    return simulate(E2B_T2, E2B_T2_STEP, list(MIXED_LIKE), passes, events=events, slow=slow, switch=E2B_T2_SWITCH)


def told_chances(path: Path) -> tuple[int, list[float]]:
    """The drafts kept and the chances told in a trace file's result lines that carry chances (rejection
    sampling, patch 38e), read and checked (one per verified draft, each in [0, 1]) by the benchmark's own
    reader, :func:`gguf_exact.bench.acceptance.read_results`."""
    results = read_results(Path(path).read_text(), str(path))
    return sum(min(r.kept, len(r.chances)) for r in results), [c for r in results for c in r.chances]


def within_four_sigma(kept: int, chances: list[float]) -> bool:
    """Whether ``kept`` drafts of those the chances were told for is within 4 standard deviations of
    the chances' sum: each verified draft is kept with its chance, so a wrong chance (the exact-match
    p(x) alone, a sum of max(p, q)...) is far outside."""
    mean, var = sum(chances), sum(c * (1 - c) for c in chances)
    return abs(kept - mean) < 4 * math.sqrt(var) if var > 0 else kept == round(mean)
