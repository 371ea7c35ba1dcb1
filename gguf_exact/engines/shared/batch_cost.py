"""The draft length chosen when other slots share the target's pass (llama-server's ``--parallel``): the
cost of a pass is the cost of ALL its rows, so a slot drafting k tokens beside others' rows pays
``pass_cost(others_rows + k + 1)`` for the batch's ``others_tokens + E(k)`` tokens, and chooses

    argmax_k (others_tokens + E(k)) / (drafter_seconds(k) + batch_cost(others_rows + k + 1))

for k in 0..min(n_max, limit) (ties: the shorter draft): the batch's expected tokens per second.
``others_rows``: what the other slots add to this pass (a slot that chose already: its k + 1; a
generating slot still to choose: 1); ``others_tokens``: the tokens they are expected to bring (``E(k)``
each, 1 for a slot still to choose); ``others_drafts``: the longest draft they asked the drafter for,
``others_drafted``: all of them (shadows too). The sequences draft together: the call takes as many steps
as the longest draft, and a step decodes and samples a row of each sequence still drafting, so a step of n
sequences costs ``drafter_step * (1 + step_share * (n - 1))`` and the call (:meth:`BatchPolicy.drafter_seconds`)

    drafter_step * (depth * (1 - step_share) + step_share * sequence_steps)

``depth`` the longest draft, ``sequence_steps`` every slot's drafts (this one's and the ``after`` slots' k
each, the others' told). ``step_share`` is seeded at start-up, a step of every slot's sequence at once
beside one sequence's (``step-seed 1 SECONDS SEQUENCES``); each call's seconds and sequence-steps time one
sequence's step (``steps N SECONDS SEQUENCE_STEPS``). Priced at one sequence's step, lavapipe's tiny
drafter (25.6 ms alone, 62-103 ms a step at 4 sequences) had 4 users draft 2 tokens each for their first
passes, priced at 285 ms a pass that took 400. Alone (``others_rows`` 0) the choice is
:class:`~.draft_policy.DraftPolicy`'s, every rule of it (probes, climbs, re-times, rechecks) as before,
so a trace recorded before this (no batch fields) replays unchanged.

The joint choice: the ``after`` generating slots still to choose are expected to choose as this one does
(slots serve alike; each has its own acceptance, and this slot's estimates stand in for theirs), so k
drafts here price a batch of ``others_rows + (after + 1) k + 1`` rows bringing ``others_tokens + (after +
1) E(k) - after`` tokens. Counted at 1 row each instead, every slot saw a draft as the only one in the
batch and the batch's optimum went unseen where a pass's cost per row falls with its rows (E2B on 2 CPU
cores: 16 rows 308 ms, 4 rows 129; an always-right drafter at 4 users drafted 5-16 of 46 tokens a slot,
0.89x fixed n-max 3). The last slot to choose sees the others' actual choices.

``batch_cost(t)``: a pass of ``t`` rows in all, the lowest of its last ``cost_window`` timings in batches
(:class:`BatchCost`), else its start-up timing at the batch's speed now (:meth:`BatchCost.seeded`), else
this slot's own timing of ``t`` rows alone (a pass of t rows either way), else, untimed, what ``t - 1`` rows cost (optimism, as alone: the longer batch is tried once, then
known), else unknown (not considered). A seeded total's first timing above ``FIRST_TIMING_DOUBT`` times its
seeded price is forgotten once (a second in a row stands). A probe prices an untimed batch as the nearest timed total below
it (the same optimism, further: the slots after it draft alike, so the batches a probe reaches grow by
``after + 1`` rows a depth, past what one row fewer can reach). A batch timing older than ``cost_max_age`` batch passes is
forgotten. A pass shared with other slots (``total > rows`` in :meth:`BatchPolicy.observe_pass`) times
the batch curve only: a slot's own curve stays the one-user curve, and its per-depth acceptance is its
own as before. A probe (one draft deeper than the best, were the drafter right there) runs on the
one-user schedule (at once while a seeded slot climbs), so a slot that only ever served beside others
learns its acceptance. So at load,
where a row costs about a row (a CPU), others' rows make drafting dear and the slot drafts less or not
at all; where rows are cheap (a GPU's batch), drafting goes on.

A total prices one graph pass. With a KV cache per slot llama.cpp cuts a batch whose slots bring
unequal rows into several (:func:`equal_split`: a run of slots, as many rows of each as the shortest has
left: 4+1+1+1 rows are passes of 4 and 3), each reading every weight. So ``serve`` gives the 3 or more slots
a drafter serves one shared cache (:attr:`~.serving_config.ServingConfig.kv_unified`; E2B, 4 sampled users,
the adaptive length: 21.48 tokens/s with one cache, 19.42 with a cache per slot), and where the slots keep
a cache each (2 slots, or ``kv-unified = false``) llama-server tells each choice the batch's ``layout``:
each slot's rows in slot order, 0 for a slot not in the batch, -1 for this slot and each slot still to
choose (alike). A layout prices k drafts as the sum of its passes' totals (4 drafts beside another slot's
2 rows: passes of 4 and 3 rows, not one of 7), and a split batch's timing (``passes`` > 1 in
:meth:`BatchPolicy.observe_pass`) prices no total. (Simulated on E2B's curve on a Zen 5 at 2 slots, a
`mixed`-like drafter, 64 passes: priced by totals, 0.85x the better of off and the best fixed length.)

Start-up seeds of every total up to ``slots * (n_max + 1)`` (llama-server's warm-up at ``--parallel``): a
batch's cost is not monotonic in its rows, so a total cannot be guessed from the ones below it. A CPU's
repacked Q4_0 kernels multiply rows in fours and each row left over as a pass of its own (E2B, 4 users:
4 rows 101 ms, 5 131, 7 224; E4B: 9 rows 519, 12 463, 16 414). Priced from the dear totals first reached
(5-7 rows), E2B's 4 users never tried 8 rows or 16, drafted 42-45 tokens a slot where fixed n-max 3
drafted 141, and ran at 0.86x its speed. ``scripts/sim_batch_policy.py`` prints
what the choice gives against speculation off and each fixed length at 1, 2 and 4 slots.

Pure and deterministic, as the policy: the C++ twin (``common/draft-policy.h``, patch 39) makes the same
choices on the same trace (``choose LIMIT OTHERS_ROWS OTHERS_TOKENS OTHERS_DRAFTS[:OTHERS_DRAFTED] AFTER
[LAYOUT...]``, ``pass ROWS SECONDS TOTAL [PASSES]``; a trace without the step's share prices as before).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gguf_exact.engines.shared.draft_policy import TIE_MARGIN, DraftPolicy

# A seeded total's first timing in batches above this many times its seeded price is forgotten once: E2B's
# first passes of 4 users after their prompts took 1.7-2.1x their start-up timings (16 rows 373 ms against
# 179, 12 rows 316 against 175, 5 rows 198 against 102), later ones 1.1-1.2x, and kept, one such timing
# priced drafting out for as long as timings live (128 batch passes). Both twins' constant.
FIRST_TIMING_DOUBT = 1.25


def equal_split(rows: Sequence[int]) -> list[int]:
    """The rows of each pass llama.cpp makes of one batch bringing ``rows[s]`` rows of sequence ``s``
    when each sequence has a cache of its own (``llama_batch_allocr::split_equal`` with ``sequential``,
    as ``llama_kv_cache::init_batch`` calls it with more than one stream): a pass takes a run of
    consecutive sequences, as many rows of each as the shortest of them has left. 4+1+1+1: [4, 3]."""
    left, out = list(rows), []
    while any(left):
        start = next(s for s, n in enumerate(left) if n)
        run = next((s for s in range(start, len(left)) if not left[s]), len(left))
        step = min(left[start:run])
        out.append(step * (run - start))
        left[start:run] = [n - step for n in left[start:run]]
    return out


@dataclass
class BatchCost:
    """A target pass's cost by the total rows in its batch, timed in passes shared with other slots."""

    window: int = 3  # a total costs the lowest of its last this many timings (a spike upward passes)
    max_age: int = 128  # in batch passes: an older timing is forgotten
    samples: dict[int, list[float]] = field(default_factory=dict)  # total rows -> its last timings
    seeds: dict[int, float] = field(default_factory=dict)  # total rows -> its start-up timing (position 0)
    timed_at: dict[int, int] = field(default_factory=dict)  # total rows -> the batch pass count when timed
    passes: int = 0
    doubt_ratio: float = FIRST_TIMING_DOUBT  # 0: keep every first timing
    doubted: set[int] = field(default_factory=set)  # totals whose first timing was forgotten, until timed again

    def timed(self, total: int) -> bool:
        return total in self.samples and self.passes - self.timed_at[total] <= self.max_age

    def observe(self, total: int, seconds: float) -> None:
        self.passes += 1
        if not self.timed(total) and total not in self.doubted and self.doubt_ratio > 0:
            priced = self.seeded(total)
            if priced is not None and seconds > self.doubt_ratio * priced:
                self.doubted.add(total)  # the seeded price stands until a second timing in a row
                return
        self.doubted.discard(total)
        kept = self.samples[total] if self.timed(total) else []
        self.samples[total] = (kept + [seconds])[-max(1, self.window) :]
        self.timed_at[total] = self.passes

    def cost(self, total: int) -> float | None:
        return min(self.samples[total]) if self.timed(total) else None

    def seed(self, total: int, seconds: float) -> None:
        if total >= 1 and seconds > 0:
            self.seeds[total] = seconds

    def seeded(self, total: int) -> float | None:
        """``total``'s start-up timing times what the nearest total timed in batches (below first, then
        above) costs over its own start-up timing: the curve's shape from start-up, its level from the
        batches (other slots' contexts make every row dearer); as seeded where none is. None: not seeded."""
        if total not in self.seeds:
            return None
        top = max(self.seeds)
        near = (t for t in [*range(total - 1, 0, -1), *range(total + 1, top + 1)] if t in self.seeds)
        ref = next((t for t in near if self.timed(t)), 0)
        return self.seeds[total] * (min(self.samples[ref]) / self.seeds[ref] if ref else 1.0)


@dataclass
class BatchPolicy(DraftPolicy):
    """A :class:`DraftPolicy` that knows the rows other slots add to its pass; see the module's docstring."""

    batch: BatchCost = field(default_factory=BatchCost)
    others_rows: int = 0  # the other slots' rows in the last choice's batch (status, /metrics)
    batch_rows: int = 0  # the last choice's batch in rows, this slot's included
    step_share: float = 0.0  # each sequence past the first adds this share of one to a drafter step (0: untimed)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.batch.window, self.batch.max_age = self.settings.cost_window, self.settings.cost_max_age

    def timed_total(self, total: int) -> float | None:
        """A pass of ``total`` rows in all as timed: in batches, else seeded for batches, else alone, else None."""
        c = self.batch.cost(total)
        if c is None:
            c = self.batch.seeded(total)
        if c is None and self.timed(total):
            c = self.pass_cost[total]
        return c

    def total_cost(self, total: int, probe: bool = False) -> float | None:
        """A pass of ``total`` rows in all: timed, else what one row fewer costs (for a probe: what the
        nearest timed total below costs), else None."""
        for t in range(total, 0 if probe else max(0, total - 2), -1):
            c = self.timed_total(t)
            if c is not None:
                return c
        return None

    def batch_cost(
        self, k: int, others_rows: int, after: int, layout: Sequence[int], probe: bool = False
    ) -> float | None:
        """The pass, or with a ``layout`` (a cache per slot) the passes, of the batch where this slot and the
        ``after`` slots still to choose draft ``k``: the sum of :meth:`total_cost` of each; where one is unknown
        (no start-up timings: a 1-row pass never timed), the batch's total as one pass, as without a layout
        (None held every choice beside another slot's probe at no drafts: its 2 + 1 rows never priced)."""
        passes = equal_split([k + 1 if r < 0 else r for r in layout]) if layout else []
        costs = [self.total_cost(total, probe) for total in passes]
        if not passes or None in costs:
            return self.total_cost(others_rows + (after + 1) * k + 1, probe)
        return sum(c for c in costs if c is not None)

    def drafter_seconds(self, k: int, others_drafts: int, others_drafted: int, after: int) -> float:
        """The drafter call where this slot and the ``after`` slots still to choose draft ``k`` beside the
        others' drafts (the longest ``others_drafts``, ``others_drafted`` in all: at least the longest)."""
        depth, sequence_steps = max(k, others_drafts), max(others_drafted, others_drafts) + (after + 1) * k
        share = self.step_share
        return (self.step_cost or 0.0) * (depth * (1.0 - share) + share * sequence_steps)

    def batch_rate(
        self,
        k: int,
        others_rows: int,
        others_tokens: float,
        others_drafts: int = 0,
        after: int = 0,
        layout: Sequence[int] = (),
        others_drafted: int = 0,
    ) -> float | None:
        """The batch's expected tokens per second when this slot, and the ``after`` slots still to choose
        (counted in ``others_rows`` and ``others_tokens`` at 1 each), draft ``k`` (None while unknown)."""
        c = self.batch_cost(k, others_rows, after, layout)
        if c is None:
            return None
        t = self.drafter_seconds(k, others_drafts, others_drafted, after) + c
        return (others_tokens + (after + 1) * self.expected_tokens(k) - after) / t if t > 0 else None

    def batch_trusting_rate(
        self,
        k: int,
        j: int,
        others_rows: int,
        others_tokens: float,
        others_drafts: int,
        after: int = 0,
        layout: Sequence[int] = (),
        others_drafted: int = 0,
    ) -> float | None:
        """:meth:`batch_rate` of ``j`` > ``k`` drafts were the drafter always right at depth k + 1 (as
        :meth:`DraftPolicy.trusting_rate` alone), and while the slot climbs at every depth past k: what a
        probe could bring. (A batch's cost is not monotonic in its rows: at 2 users E2B's 6 rows cost 0.12 s
        and 8 rows 0.12, so a climb one depth at a time from 4 rows stopped there, an always-right drafter
        at 1 draft a slot for 62 passes where 3 paid 1.3x.)"""
        c = self.batch_cost(j, others_rows, after, layout, probe=True)
        if c is None:
            return None
        t = self.drafter_seconds(j, others_drafts, others_drafted, after) + c
        e, p = self.expected_tokens(k), 1.0
        for i in range(1, j + 1):
            p = p * (1.0 if i == k + 1 or (self.climbing and i > k) else self.acceptance(i))
            e = e + (p if i > k else 0.0)
        return (others_tokens + (after + 1) * e - after) / t if t > 0 else None

    def choose(
        self,
        limit: int,
        others_rows: int = 0,
        others_tokens: float = 0.0,
        others_drafts: int = 0,
        after: int = 0,
        layout: Sequence[int] = (),
        others_drafted: int = 0,
    ) -> int:
        """As :meth:`DraftPolicy.choose` alone; beside ``others_rows`` rows of other slots bringing
        ``others_tokens`` tokens, their longest draft ``others_drafts`` (all: ``others_drafted``), ``after`` of them slots still to
        choose (1 row and 1 token each in those counts, expected to choose alike), the k that maximises
        the batch's :meth:`batch_rate`."""
        self.others_rows = max(0, others_rows)
        after = min(max(0, after), self.others_rows)
        if self.others_rows == 0:
            k = super().choose(limit)
            self.batch_rows = k + 1
            return k
        top = min(self.settings.n_max, limit)
        self.probing = self.rechecking = self.retiming = self.shadow = 0  # the one-user rules' passes are not this one
        self.drafted_after_miss = self.missed
        k, best = 0, self.batch_rate(0, self.others_rows, others_tokens, others_drafts, after, layout, others_drafted)
        if best is None:
            self.reason = f"timing a batch of {self.others_rows + 1} rows"
        else:
            for j in range(1, top + 1):
                r = self.batch_rate(j, self.others_rows, others_tokens, others_drafts, after, layout, others_drafted)
                if r is not None and r > best * (1.0 + TIE_MARGIN):
                    k, best = j, r
            # a probe every `interval` passes, as alone: a slot that never drafted would keep the prior's
            # acceptance, and priced by it, never draft beside others; seeded costs and no draft rejected
            # yet (the climb alone): at once
            probe = next(
                (
                    j
                    for j in range(k + 1, top + 1)
                    if self.pays(k, j, best, others_tokens, (others_drafts, others_drafted), after, layout)
                ),
                0,
            )
            self.since_probe = self.since_probe + 1 if probe else 0
            climb = self.climbing and (self.last_k == 0 or self.all_right)
            if probe and (climb or self.since_probe >= self.interval):
                self.since_probe, self.probe_from = 0, probe - 1  # judged by all its drafts, as before
                if self.settings.shadow and k == 0 and not climb:  # only to learn: a shadow, beside others too
                    self.shadow, self.shadow_probe, self.shadow_after_miss = probe, True, self.missed
                else:
                    k = self.probing = probe
            if self.settings.shadow and k > 0 and not self.tried[0]:  # nothing counted yet: a shadow, as alone
                self.shadow, self.shadow_probe, k, self.probing = k, self.probing > 0 and not climb, 0, 0
                self.shadow_after_miss = self.missed
            what = "probing" if self.probing else "batch of"
            self.reason = f"{what} {self.others_rows + (after + 1) * k + 1} rows: {k} drafts"
            self.reason += f", a shadow of {self.shadow}" if self.shadow else ""
        self.last_k, self.batch_rows = k, self.others_rows + k + 1
        return k

    def pays(
        self, k: int, j: int, best: float, tokens: float, drafts: tuple[int, int], after: int, layout: Sequence[int]
    ) -> bool:  # tokens, drafts: the others' expected tokens, their longest draft and all their drafts
        r = self.batch_trusting_rate(k, j, self.others_rows, tokens, drafts[0], after, layout, drafts[1])
        return r is not None and r > best * (1.0 + TIE_MARGIN)

    def seed_steps(self, steps: int, seconds: float, sequences: int = 1) -> None:
        """``steps`` drafter steps of ``sequences`` drafting together timed at start-up: of one, the step's cost
        (:meth:`DraftPolicy.seed_steps`); of several, after one's, :attr:`step_share` (0 to 1)."""
        if sequences <= 1:
            super().seed_steps(steps, seconds)
        elif steps > 0 and self.step_cost:
            share = (seconds / steps / self.step_cost - 1.0) / (sequences - 1)
            self.step_share = min(1.0, max(0.0, share))

    def observe_steps(self, steps: int, seconds: float, sequence_steps: int = 0) -> None:
        """A drafter call of ``steps`` steps carrying ``sequence_steps`` sequence-steps in all (0: one sequence)
        took ``seconds``: one sequence's step by :attr:`step_share`."""
        if steps > 0:
            share = self.step_share
            self.observe_step(seconds / (steps * (1.0 - share) + share * max(sequence_steps, steps)))

    def seed_batch(self, total: int, seconds: float) -> None:
        """A pass of ``total`` rows timed at start-up for batches of slots (see the module's docstring)."""
        self.batch.seed(total, seconds)

    def observe_pass(self, rows: int, seconds: float, total: int = 0, passes: int = 1) -> None:
        """This slot's ``rows`` rows were in a batch of ``total`` rows (0: its own alone) that took ``seconds``,
        in ``passes`` graph passes (llama.cpp split it: a cache per slot; it prices no total then)."""
        if total <= rows:
            super().observe_pass(rows, seconds)
            return
        self.all_right = self.missed = False  # until observe_result (or a shadow told) says otherwise
        if passes <= 1:
            self.batch.observe(total, seconds)


__all__ = ["BatchCost", "BatchPolicy"]
