"""The draft length chosen while speculation runs: before each target pass, the k (0 = the target alone) that maximises
expected tokens per second on this machine, for this text.

For k drafts with per-depth acceptance a_1..a_k (a_j: the chance draft j is right once drafts 1..j-1 were), a pass
yields ``E(k) = 1 + sum_j prod_{i<=j} a_i`` tokens and costs ``T(k) = k * drafter_step + pass_cost(k + 1)``; the
policy picks ``argmax E(k) / T(k)`` for k in 0..min(n_max, limit). Its inputs are measured online:

- ``pass_cost(r)``: the target's decode of r rows, the lowest of its last ``cost_window`` steady timings per row
  count, at the machine's speed now: scaled by what 1 row costs now against what it cost when r rows were timed
  (:meth:`DraftPolicy.now`: a shared host drifts, 44-83 ms for one 1-row pass in one run). Seeded
  (:meth:`DraftPolicy.seed`) by the engine's start-up where ``spec-draft-adaptive-warmup`` is on (the shipped
  profiles) until the first steady pass replaces the seed. Unseeded, a row count not measured yet costs what one row
  fewer does (tried once, then known), and probes go to the best length on trust, so a non-monotonic curve (AVX-512's
  repacked Q4_0 kernels: 4 rows cheaper than 3) is found;
- ``drafter_step``: one drafter decode, a running mean (seeded at start-up, else 0 until measured);
- ``a_j``: :mod:`.acceptance_counts` (decayed, per acceptance class; a shadow at half weight; depth 1 after a miss).

``p_min``: a draft stops at a token whose drafter top probability (over its 10 best logits) is below it.

Stale timings: a row count not timed in ``cost_max_age`` passes costs as timed, at the speed now (patch 39z: costing at
most one row fewer's, every stale count was drafted to time it again, 3-5% of a Zen 4 run where nothing paid; so was
re-timing it where its rate came within ``retime_margin``, 14-18 passes of 350 live); a single row stale is timed
again by one pass of the target alone. Switches: llama.cpp reuses a decode's graph only for a batch of
the same shape, so a pass whose row count differs from the one before also rebuilds the graph (1 thread at E2B: 2
rows after 1 cost 167 ms, after 2 136); its timing is not kept for a row count timed already; a row count timed only
by a switch is provisional and drafted once more to time it steadily, unless the climb goes on (every draft right and
a longer one the best now). The last length stays unless another one's rate is ``switch_margin`` better, so two
lengths of about one rate do not alternate, rebuilding every pass.

Spikes: a row count costs the lowest of its recent steady timings, so one spike upward is ignored once timed twice; a
steady timing above ``burst_ratio`` times its cost is not kept (issue 23). A longer length timed steadily only once,
at least ``probe_interval`` passes ago, whose rate (the next depth on trust) is within ``retime_margin`` of the
best's but below it, is timed again (two passes), at most once every ``probe_interval`` passes. A new timing above
``outlier_ratio`` times the nearest shorter row count's, scaled by rows, is forgotten the first time in a row (issue
41: a busy start seeded 2 rows at 3.55 s against 0.17).

Seeded costs leave nothing for optimism to explore, so a seeded policy *climbs* until a draft is first rejected, or a
pass after one that drafted is priced out (patch 39za: lavapipe's seeds ran 20-35% below the passes after, and an
always-right drafter, never rejected, climbed again after passes without drafts): after each all-right pass, the
length a probe would take (:meth:`probe_length`) where that is longer. While depth 1 was tried fewer than
``explore_weight`` decayed drafts in the request's class (about 7), the policy that would draft nothing *explores*: it
drafts where depth 1 one standard error above its estimate would pay (:meth:`explore_length`; issue 38: one early
rejection priced drafting out for 100 passes at 0.84).

Shadows (``shadow``): from no drafts, a probe or exploration only learns, yet a verified draft pays a pass of more
rows for it (E2B, 2 cores: 2 rows cost 1.75 passes of 1). With shadows it is drafted, not verified
(:attr:`DraftPolicy.shadow`); the engine compares the drafts with the tokens the target goes on to give and tells
:meth:`observe_shadow`: drafter steps only, counted at half a verified draft's weight (rejection sampling: each
depth's sum min(p, q) at the drafted prefix); a probe's shadow schedules the next probe, an exploration's does not.
Simulated, E2B, drafts right 0.45, 400 passes: 0.96x the target alone with probes, 0.99x with shadows. Before any
draft was counted (in the request's acceptance class) every draft is a shadow, the seeded climb's too; so is one right
after a miss where depth 1's count there says it would not pay (:meth:`held_back`); a failed probe's shadow doubles
the interval only while its steps cost over ``SHADOW_BUDGET`` of the passes in between (E2B: never), and any
probe's shadow leaves at least the passes that make its steps that share before the next (patch 39zb: lavapipe's
step, 0.58 of a 1-row pass, was shadowed every 8 passes where a cheap seed made a probe look payable; now about 30).

Recovery: every ``probe_interval`` passes that could carry a probe (a pass of the target alone does not reset the
count: a probe and "priced out" alternate on noise) the policy drafts the longer length with the best rate were the
drafter always right one depth deeper; a probe whose depth on trust is wrong doubles the interval (up to
``probe_interval_max``), a right one halves it. After ``recheck_interval`` passes priced out (no probe could pay)
one draft re-times 2 rows and the drafter step, and doubles that interval; its pass, a switch, is not drafted once
more to time it steadily (patch 39zc: where it still prices drafting out nothing would use that timing, where it
does not the next passes draft and time it; the second pass was half a recheck's cost: 0.6-1.1% of simulated E2B
runs where nothing paid). :attr:`DraftPolicy.reason` says why the last choice.

Deterministic (no RNG, probes on a schedule), plain arithmetic in one order, so llama.cpp's ``--spec-draft-adaptive``
(the C++ twin, ``common/draft-policy.h``) chooses the same k on the same recorded inputs (``test_draft_policy_cpp``);
``scripts/sim_draft_policy.py`` simulates it. Pure: no I/O, no clock; callers time their passes and report them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gguf_exact.engines.shared.acceptance_counts import SHADOW_WEIGHT, AcceptanceCounts
from gguf_exact.engines.shared.policy_settings import PolicySettings
from gguf_exact.engines.shared.policy_snapshot import PolicySnapshot, explain

# Two rates within this relative margin are a tie, and the shorter draft wins: the C++
# build may fuse multiply-adds (-march=native), which moves the last bits of a rate.
TIE_MARGIN = 1e-9
SHADOW_BUDGET = 0.02  # the share of the passes between probes a probe's shadow may take (a failed one: and keep the interval)


@dataclass
class DraftPolicy(AcceptanceCounts):
    """One slot's (or one engine's) policy state; see the module's docstring."""

    pass_cost: dict[int, float] = field(default_factory=dict)  # rows -> seconds
    ref: dict[int, float] = field(default_factory=dict)  # rows -> what 1 row cost when it was timed (0: unknown)
    samples: dict[int, list[float]] = field(default_factory=dict)  # rows -> its last steady timings
    timed_at: dict[int, int] = field(default_factory=dict)  # rows -> the pass count when last timed
    passes: int = 0  # passes timed so far
    provisional: dict[int, bool] = field(default_factory=dict)  # rows -> timed only by a switch pass
    last_rows: int = 0  # the row count of the pass timed last (0: none yet)
    step_cost: float | None = None  # seconds per drafter step
    step_doubted: bool = False  # the last drafter step timing, out of line, was forgotten
    interval: int = 0  # current probe interval (0: the settings' base)
    since_probe: int = 0
    probing: int = 0  # the depth of the probe in flight, 0 when the last choice was no probe
    probe_from: int = 0  # the length the last probe went deeper from: its depth probe_from + 1 taken on trust
    since_retime: int = 0
    retiming: int = 0  # the row count being timed again (its first pass chosen), else 0
    last_k: int = 0
    all_right: bool = False  # the last pass carried drafts and kept every one (its observe_result says)
    climbing: bool = False  # seeded, no draft rejected, none priced out yet: each all-right pass may draft deeper
    doubted: dict[int, bool] = field(default_factory=dict)  # rows -> its last timing out of line was forgotten
    idle: int = 0  # passes in a row chosen at 0 drafts while priced out
    recheck_every: int = 0  # the current recheck interval (0: the settings' base)
    rechecking: int = 0  # the row count of the recheck in flight (its pass and step re-time the costs), else 0
    shadow: int = 0  # drafts the last choice asks drafted and not verified (a shadow), else 0
    shadow_probe: bool = False  # the last shadow asked is a probe (its result schedules the next), not an exploration
    reason: str = ""  # why the last choice (status and /metrics show it)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.interval = self.interval or self.settings.probe_interval
        self.recheck_every = self.recheck_every or self.settings.recheck_interval

    # --- estimates ---

    def timed(self, rows: int) -> bool:
        """Whether ``rows`` rows were timed within the last ``cost_max_age`` passes."""
        return rows in self.pass_cost and self.passes - self.timed_at[rows] <= self.settings.cost_max_age

    def cost(self, rows: int) -> float | None:
        """A verification pass of ``rows`` rows: as timed, at the speed now (:meth:`now`; a stale timing too: only a
        pass that drafts the length times it again); never timed, what one row fewer costs (longer drafts are explored
        one row at a time, each tried once on that optimistic guess and then known), else None (not considered). One
        row stale is unknown (one pass of the target alone times it again: drafting's gain is measured against it)."""
        if rows in self.pass_cost and (rows > 1 or self.timed(rows)):
            return self.now(rows)
        return self.now(rows - 1) if rows > 1 and self.timed(rows - 1) else None

    def now(self, rows: int) -> float:
        """``rows`` rows' timing at the machine's speed now: times what 1 row costs now over what it cost
        when ``rows`` was timed (as timed, where that was not known: see :meth:`timing`)."""
        ref, one = self.ref.get(rows, 0.0), self.pass_cost.get(1, 0.0)
        return self.pass_cost[rows] * one / ref if rows > 1 and ref > 0 and self.timed(1) else self.pass_cost[rows]

    def timing(self, rows: int, seconds: float) -> None:
        """``rows`` rows cost ``seconds``, at the speed 1 row's cost says where it is known then: its window
        full (one slow 1-row pass would make every later row count look cheap) and timed within
        ``probe_interval`` passes (while drafting, 1 row's cost is an old speed, not this timing's)."""
        self.pass_cost[rows] = seconds
        settled = rows > 1 and self.timed(1) and len(self.samples.get(1, ())) >= max(1, self.settings.cost_window)
        settled = settled and self.passes - self.timed_at[1] <= self.settings.probe_interval
        self.ref[rows] = self.pass_cost[1] if settled else 0.0

    def plausible(self) -> float:
        """a_1 ``explore_errors`` standard errors above its estimate (``prior_weight`` counted as drafts), at most 1."""
        a, n = self.acceptance(1), self.tried[0] + self.settings.prior_weight
        return min(1.0, a + self.settings.explore_errors * math.sqrt(a * (1.0 - a) / n))

    def explore_length(self, k: int, top: int) -> int:
        """Where ``k`` is 0 and depth 1 was tried under ``explore_weight`` drafts: the length up to ``top``, its
        cost timed, with the best rate were a_1 :meth:`plausible`, if it beats the target alone; else 0. (Deeper
        depths explored too lost in simulation: 0.83x the best, against 1.00x, right 0.45 at every depth.)"""
        here = self.rate(0)
        if k > 0 or here is None or self.tried[0] >= self.settings.explore_weight:
            return 0
        pick, bar, trust = 0, here * (1.0 + TIE_MARGIN), self.plausible()
        for j in range(1, top + 1):
            r = self.trusting_rate(0, j, trust) if self.timed(j + 1) else None
            if r is not None and r > bar:
                pick, bar = j, r * (1.0 + TIE_MARGIN)
        return pick

    def held_back(self, k: int) -> bool:
        """Whether, right after a miss, ``k`` drafts would not beat the target alone were a_1 :meth:`after_a_miss`:
        misses come in runs (hard stretches of text, the `mixed` pair's wrong third), so a shadow goes first."""
        if not self.missed:
            return False
        r, here = self.trusting_rate(0, k, self.after_a_miss()), self.rate(0)
        return r is not None and here is not None and r <= here * (1.0 + TIE_MARGIN)

    def expected_tokens(self, k: int) -> float:
        e, p = 1.0, 1.0
        for j in range(1, k + 1):
            p = p * self.acceptance(j)
            e = e + p
        return e

    def rate(self, k: int) -> float | None:
        """Expected tokens per second with ``k`` drafts (None while unknown)."""
        c = self.cost(k + 1)
        if c is None:
            return None
        t = k * (self.step_cost or 0.0) + c
        return self.expected_tokens(k) / t if t > 0 else None

    def best(self, limit: int) -> int:
        """The k in 0..min(n_max, limit) with the highest rate (ties: the shorter draft), or the last pass's k while
        no other beats its rate by ``switch_margin``."""
        top = min(self.settings.n_max, limit)
        best_k, best_rate = 0, self.rate(0)
        if best_rate is None:
            return 0  # the first pass alone measures one row
        for k in range(1, top + 1):
            r = self.rate(k)
            if r is not None and r > best_rate * (1.0 + TIE_MARGIN):
                best_k, best_rate = k, r
        stay = self.last_rows - 1
        # the margin guards timed lengths against alternating; an untimed one (a guess) is explored
        if 0 <= stay <= top and stay != best_k and self.timed(best_k + 1):
            kept = self.rate(stay)
            if kept is not None and best_rate <= kept * (1.0 + self.settings.switch_margin):
                return stay
        return best_k

    def trusting_rate(self, k: int, j: int, trust: float = 1.0) -> float | None:
        """The rate of ``j`` > ``k`` drafts were the drafter always right at depth k + 1, the other depths as
        estimated (those up to k are drafted every pass, deeper ones were probed: only the next is on trust)."""
        c, t = self.cost(j + 1), j * (self.step_cost or 0.0)
        return self.trusting_tokens(k, j, trust) / (t + c) if c is not None and t + c > 0 else None

    def trusting_tokens(self, k: int, j: int, trust: float = 1.0) -> float:
        """The expected tokens of a pass of ``j`` > ``k`` drafts, depth k + 1 taken on trust."""
        e, p = self.expected_tokens(k), 1.0
        for i in range(1, j + 1):
            p = p * (trust if i == k + 1 else self.acceptance(i))
            e = e + (p if i > k else 0.0)
        return e

    def probe_length(self, k: int, top: int) -> int:
        """The draft longer than ``k`` (up to ``top``) with the best rate were the drafter always right at depth
        k + 1 (:meth:`trusting_rate`), if it beats ``k``'s (ties: the shorter), or 0. (Where k + 2 rows cost k + 2
        passes none can: no probe is paid; nor for an always-right drafter one short of the bound where the longest
        pass costs more than it brings.) So a cheap row count behind a dear one (AVX-512: 4 rows cheaper than 3) is
        probed, and timed, itself (patch 39z: probing the shortest that could pay, the AVX-512 test found them after
        530 passes once a stale count no longer looked cheap, against 13)."""
        here = self.rate(k)
        if here is None:
            return 0
        pick, bar = 0, here * (1.0 + TIE_MARGIN)
        for j in range(k + 1, top + 1):
            r = self.trusting_rate(k, j)
            if r is not None and r > bar:
                pick, bar = j, r * (1.0 + TIE_MARGIN)
        return pick

    def retime_rows(self, k: int, top: int) -> int:
        """The row count of a length longer than ``k`` (up to ``top``) timed steadily once, ``probe_interval``
        passes ago or more, its :meth:`trusting_rate` within ``retime_margin`` of ``k``'s rate but not above
        (those are the probes'), the highest-rated first; or 0 (one dear timing would stand: a stale one costs as
        timed)."""
        here = self.rate(k)
        if here is None:
            return 0
        pick, pick_rate = 0, 0.0
        for j in range(k + 1, top + 1):
            rows = j + 1
            once = self.timed(rows) and len(self.samples.get(rows, ())) == 1
            if not once or self.passes - self.timed_at[rows] < self.settings.probe_interval:
                continue
            r = self.trusting_rate(k, j)
            if r is None or r * (1.0 + self.settings.retime_margin) < here or r > here * (1.0 + TIE_MARGIN):
                continue
            if pick == 0 or r > pick_rate * (1.0 + TIE_MARGIN):
                pick, pick_rate = rows, r
        return pick

    def choose(self, limit: int) -> int:
        """How many tokens to draft before the next pass, at most ``limit`` (what the context
        and the request's budget leave); one call per pass that could carry a draft."""
        top = min(self.settings.n_max, limit)
        self.probing = self.rechecking = self.shadow = 0
        self.drafted_after_miss = self.missed
        held = self.last_rows - 1
        retimed, self.retiming = self.retiming, 0
        if retimed and retimed == self.last_rows and held <= top:
            self.last_k = held  # the re-time's first pass was a switch: once more, steadily
            self.reason = f"re-timing {held + 1} rows: once more, steadily"
            return held
        k = self.best(limit)
        climbed = False
        # seeded costs: climb while no draft was ever rejected (the prior alone would keep an always-right
        # drafter at the target alone until the first probe); unseeded ones climb anyway (optimism)
        if self.climbing and (self.last_k == 0 or self.all_right) and self.last_k < top:
            deeper = self.probe_length(self.last_k, top)
            climbed, k = deeper > k, max(k, deeper)
        # once more at a length timed only by a switch (a steady timing), unless the climb goes
        # on: every draft of that pass was right and a longer draft is the best now (the length
        # is timed steadily when the policy comes back to it)
        if self.provisional.get(self.last_rows) and 0 <= held <= top and not (self.all_right and k > held):
            self.last_k = held
            self.reason = f"timing {held + 1} rows steadily"
            return held
        base, explored = k, self.explore_length(k, top)
        k = explored or k
        probe = self.probe_length(k, top) if k < top else 0
        if probe:
            self.since_probe += 1
            if self.since_probe >= self.interval:
                self.since_probe, self.probe_from = 0, k
                k = self.probing = probe
        elif k > 0:  # a pass of the target alone keeps the count (a probe and priced out alternate on noise)
            self.since_probe = 0
        # only to learn (from no drafts, nothing counted yet, or held back right after a miss): a shadow
        if self.settings.shadow and k > 0 and (base == 0 or not self.tried[0] or self.held_back(k)):
            self.shadow, self.shadow_probe, k, self.probing = k, self.probing > 0, 0, 0
            self.shadow_after_miss = self.missed
        # at most one re-time every probe_interval passes (none in a probe's pass)
        self.since_retime += 1
        learning = self.probing or self.shadow
        retime = 0 if learning or self.since_retime < self.settings.probe_interval else self.retime_rows(k, top)
        if retime:
            self.since_retime = 0
            k, self.retiming = retime - 1, retime
        # priced out: not even an always-right drafter could pay, so nothing would time the costs again but
        # staleness (a busy pass, 2 rows at 20x, held llama-server at the target alone for minutes): a recheck
        priced_out = k == 0 and top >= 1 and probe == 0 and not self.shadow and self.rate(0) is not None
        if priced_out and self.climbing and self.last_k > 0:  # the climb's draft, timed, priced out: its seeds
            self.climbing = False  # were cheap (patch 39za); the probes' schedule goes on from here
        why = explain(self, k, top, priced_out, climbed, explored > 0 and explored == k)
        if priced_out and self.settings.recheck_interval > 0:
            self.idle += 1
            if self.idle >= self.recheck_every:
                why = f"rechecking: priced out for {self.idle} passes"
                self.idle = 0
                cap = max(self.settings.recheck_interval, self.settings.cost_max_age)
                self.recheck_every = min(2 * self.recheck_every, cap)
                k, self.rechecking = 1, 2
        else:
            self.idle = 0
            if k > 0 and not self.retiming:  # drafting pays again (a re-time does not say so)
                self.recheck_every = self.settings.recheck_interval
        self.reason = why
        self.last_k = k
        return k

    def seed(self, rows: int, seconds: float) -> None:
        """A timing of ``rows`` rows at start-up: it prices the row count until its first steady pass (not re-drafted)."""
        if 1 <= rows <= self.settings.n_max + 1:
            self.climbing = not any(self.tried)
            if self.doubt(rows, seconds):
                return
            self.timing(rows, seconds)
            self.provisional[rows], self.samples[rows] = False, []
            self.timed_at[rows] = self.passes

    def seed_steps(self, steps: int, seconds: float) -> None:
        """``steps`` drafter steps timed at start-up: the step's cost until drafts time it; not doubted (warm, and
        dearer than a 1-row pass where it is so: lavapipe 61-121 ms against 46, where unpriced it was free)."""
        if steps > 0:
            self.step_cost, self.step_doubted = seconds / steps, False

    def doubt(self, rows: int, seconds: float) -> bool:
        """Whether a new timing of ``rows`` rows is out of line and forgotten: above ``outlier_ratio`` times the
        nearest shorter row count's scaled by rows (r rows cost at most about r / s passes of s), the first time
        in a row (then untimed, so explored: timed again; a second stands). Busy start-up seeds (2 rows at 3.55 s
        against 1 at 0.17) otherwise priced drafting out before any pass."""
        ratio = self.settings.outlier_ratio
        if ratio <= 0:
            return False
        shorter = next((r for r in range(rows - 1, 0, -1) if self.timed(r)), 0)
        out = shorter > 0 and seconds > ratio * self.pass_cost[shorter] * rows / shorter
        if out and not self.doubted.get(rows):
            self.doubted[rows] = True
            self.pass_cost.pop(rows, None)
            self.samples.pop(rows, None)
            self.timed_at.pop(rows, None)
            self.provisional[rows] = False
            return True
        self.doubted[rows] = out
        return False

    def observe_pass(self, rows: int, seconds: float) -> None:
        """A generation pass of ``rows`` rows (1 + drafts) took ``seconds`` in the target's decode (row counts the
        policy never asks for, above ``n_max + 1``, are not kept). Call it before the pass's :meth:`observe_result`."""
        self.all_right = self.missed = False  # until observe_result (or a shadow told) says otherwise
        if not 1 <= rows <= self.settings.n_max + 1:
            return
        self.passes += 1
        steady, fresh = rows == self.last_rows, self.timed(rows)
        self.last_rows = rows
        if not fresh or (steady and not self.samples[rows]) or self.rechecking == rows:  # untimed, stale,
            # not yet timed steadily, or re-timed by a recheck
            if self.doubt(rows, seconds):
                return
            self.timing(rows, seconds)
            self.provisional[rows] = not steady and self.rechecking != rows  # a recheck's switch: not timed again
            self.samples[rows] = [seconds] if steady else []
        elif steady:  # the lowest of the recent steady timings: one spike upward is not averaged in
            if self.settings.burst_ratio > 0 and seconds > self.settings.burst_ratio * self.pass_cost[rows]:
                return  # the host busy, not the pass: a burst of such passes would fill the window
            self.samples[rows] = (self.samples[rows] + [seconds])[-max(1, self.settings.cost_window) :]
            self.timing(rows, min(self.samples[rows]))
        else:
            return  # a switch pass of a row count timed steadily: it also rebuilt the graph
        self.timed_at[rows] = self.passes

    def observe_steps(self, steps: int, seconds: float) -> None:  # steps drafter decodes took seconds together
        if steps > 0:
            self.observe_step(seconds / steps)

    def observe_step(self, each: float) -> None:  # one drafter step of one sequence took `each` seconds
        # a step dearer than a whole 1-row target pass is out of line (a cold first call: E2B 48 ms against
        # 1.7 later, 39 for the target's pass), forgotten once; a second in a row stands
        one_row = self.pass_cost.get(1)
        self.step_doubted = one_row is not None and each > one_row and not self.step_doubted
        if self.step_doubted:
            return
        old = self.step_cost
        # a recheck's step replaces the mean: the old one may be what priced drafting out
        self.step_cost = each if old is None or self.rechecking else old + self.settings.cost_weight * (each - old)

    def observe_result(self, drafted: int, accepted: int, chances: Sequence[float] = ()) -> None:
        """The pass verified ``drafted`` drafts and kept the first ``accepted`` of them; ``chances``: the chance the
        rule had of keeping each verified one (rejection sampling's sum min(p, q)), counted in place of the 0 or 1 it
        came to: the same mean, a fraction of the noise (Rao-Blackwell)."""
        self.all_right = drafted > 0 and accepted >= drafted
        self.count(drafted, accepted, chances, after_miss=self.drafted_after_miss)
        if self.probing:
            self.probed(accepted > self.probe_from)  # the depth taken on trust was right
            self.probing = 0

    def observe_shadow(self, drafted: int, accepted: int, chances: Sequence[float] = ()) -> None:
        """A shadow (:attr:`shadow`) of ``drafted`` drafts, the first ``accepted`` matched by the target's next
        tokens (``chances``: as :meth:`observe_result`'s), counted at ``SHADOW_WEIGHT``; a probe's schedules the next
        probe (a failed one only where its steps cost over ``SHADOW_BUDGET``; the next no sooner than its steps are
        ``SHADOW_BUDGET`` of the passes in between), an exploration's does not."""
        self.count(drafted, accepted, chances, SHADOW_WEIGHT, self.shadow_after_miss)
        ok, one, steps = accepted > self.probe_from, self.cost(1) or 0.0, drafted * (self.step_cost or 0.0)
        if self.shadow_probe and (ok or steps > SHADOW_BUDGET * self.interval * one):
            self.probed(ok)
        if self.shadow_probe and one > 0:  # the next no sooner than these steps are SHADOW_BUDGET of the passes (39zb)
            floor = min(math.ceil(steps / (SHADOW_BUDGET * one)), self.settings.probe_interval_max)
            self.interval = max(self.interval, floor)

    def count(
        self, drafted: int, accepted: int, chances: Sequence[float], weight: float = 1.0, after_miss: bool = False
    ) -> None:
        self.climbing = self.climbing and (drafted <= 0 or accepted >= drafted)  # a miss ends the climb
        super().count(drafted, accepted, chances, weight, after_miss)

    def probed(self, ok: bool) -> None:
        s, n = self.settings, self.interval
        self.interval = max(n // 2, s.probe_interval) if ok else min(2 * n, s.probe_interval_max)

    def snapshot(self) -> PolicySnapshot:
        """What ``status`` and ``/metrics`` show."""
        acceptance = tuple(self.acceptance(j) for j in range(1, self.settings.n_max + 1))
        passes = tuple(sorted(self.pass_cost.items()))
        return PolicySnapshot(self.last_k, acceptance, passes, self.step_cost, self.reason)


__all__ = ["SHADOW_BUDGET", "TIE_MARGIN", "DraftPolicy", "PolicySettings"]
