"""The adaptive draft policy's state as both engines publish it: :class:`PolicySnapshot`, its
Prometheus text (:func:`snapshot_metrics`, llama-server's ``--spec-draft-adaptive`` names) and
back (:func:`parse_snapshot`, for ``status`` and the benchmarks), and why the latest length (:func:`explain`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the policy imports this module
    from gguf_exact.engines.shared.draft_policy import DraftPolicy

# /metrics names (after llama-server's "llamacpp:"), the same from both engines: the draft
# length chosen last, acceptance{depth}, pass_seconds{rows} and the drafter step's seconds
METRIC_DRAFT_N, METRIC_ACCEPTANCE = "spec_draft_n", "spec_draft_acceptance"
METRIC_PASS_SECONDS, METRIC_STEP_SECONDS = "spec_draft_pass_seconds", "spec_draft_step_seconds"
METRIC_REASON = "spec_draft_reason"  # {reason="why the latest length"} 1
# the batch the latest length was chosen in, all slots' rows; each slot's latest length{slot} (--parallel)
METRIC_BATCH_ROWS, METRIC_SLOT_DRAFT_N = "spec_batch_rows", "spec_slot_draft_n"


@dataclass(frozen=True)
class PolicySnapshot:
    """The policy's current choice and estimates."""

    draft_n: int  # drafts chosen for the latest pass
    acceptance: tuple[float, ...]  # a_1..a_n_max
    pass_seconds: tuple[tuple[int, float], ...]  # (rows, seconds) measured
    step_seconds: float | None
    reason: str = ""  # why the latest length (priced out, probing, acceptance too low ...)
    batch_rows: int = 0  # the latest pass's batch in rows, every slot's (0: not said)
    slot_draft_n: tuple[tuple[int, int], ...] = ()  # (slot, its latest draft length), llama-server's slots


def snapshot_metrics(snap: PolicySnapshot, prefix: str = "llamacpp:") -> str:
    """Prometheus text of a snapshot, as llama-server's ``--spec-draft-adaptive`` writes it."""
    n, a, p, s = (prefix + m for m in (METRIC_DRAFT_N, METRIC_ACCEPTANCE, METRIC_PASS_SECONDS, METRIC_STEP_SECONDS))
    out = [f"# HELP {n} Speculative: drafts chosen for the latest pass\n# TYPE {n} gauge\n{n} {snap.draft_n}\n"]
    out.append(
        f"# HELP {a} Speculative: estimated acceptance at each draft depth, given the ones before\n# TYPE {a} gauge\n"
    )
    out += [f'{a}{{depth="{j}"}} {v:g}\n' for j, v in enumerate(snap.acceptance, 1)]
    out.append(f"# HELP {p} Speculative: measured cost of a verification pass of this many rows\n# TYPE {p} gauge\n")
    out += [f'{p}{{rows="{r}"}} {v:g}\n' for r, v in snap.pass_seconds]
    if snap.step_seconds is not None:
        out.append(
            f"# HELP {s} Speculative: measured cost of one drafter step\n# TYPE {s} gauge\n{s} {snap.step_seconds:g}\n"
        )
    if snap.batch_rows:
        b = prefix + METRIC_BATCH_ROWS
        out.append(f"# HELP {b} Speculative: rows of the batch the latest draft length was chosen in\n")
        out.append(f"# TYPE {b} gauge\n{b} {snap.batch_rows}\n")
    if snap.slot_draft_n:
        d = prefix + METRIC_SLOT_DRAFT_N
        out.append(f"# HELP {d} Speculative: each slot's latest draft length\n# TYPE {d} gauge\n")
        out += [f'{d}{{slot="{i}"}} {n}\n' for i, n in snap.slot_draft_n]
    if snap.reason:
        why = prefix + METRIC_REASON
        out.append(f"# HELP {why} Speculative: why the latest draft length\n# TYPE {why} gauge\n")
        out.append(f'{why}{{reason="{snap.reason}"}} 1\n')
    return "".join(out)


def parse_snapshot(metrics: dict[str, float], prefix: str = "llamacpp:") -> PolicySnapshot | None:
    """The snapshot back from parsed ``/metrics`` (``{name: value}`` and ``name{labels}``), or
    None when the server did not choose a length adaptively."""
    if prefix + METRIC_DRAFT_N not in metrics:
        return None
    acceptance: list[float] = []
    rows: list[tuple[int, float]] = []
    slots: list[tuple[int, int]] = []
    while (key := f'{prefix}{METRIC_ACCEPTANCE}{{depth="{len(acceptance) + 1}"}}') in metrics:
        acceptance.append(metrics[key])
    for name, value in metrics.items():
        head, _, rest = name.partition('{rows="')
        if head == prefix + METRIC_PASS_SECONDS and rest:
            rows.append((int(rest.rstrip('"}')), value))
        head, _, rest = name.partition('{slot="')
        if head == prefix + METRIC_SLOT_DRAFT_N and rest:
            slots.append((int(rest.rstrip('"}')), int(value)))
    head = f'{prefix}{METRIC_REASON}{{reason="'
    reason = next((name[len(head) : -2] for name in metrics if name.startswith(head)), "")
    return PolicySnapshot(
        reason=reason,
        draft_n=int(metrics[prefix + METRIC_DRAFT_N]),
        acceptance=tuple(acceptance),
        pass_seconds=tuple(sorted(rows)),
        step_seconds=metrics.get(prefix + METRIC_STEP_SECONDS),
        batch_rows=int(metrics.get(prefix + METRIC_BATCH_ROWS, 0)),
        slot_draft_n=tuple(sorted(slots)),
    )


def explain(policy: DraftPolicy, k: int, top: int, priced_out: bool, climbed: bool, explored: bool = False) -> str:
    """Why ``policy`` chose ``k``: the short line ``status`` and ``/metrics`` show."""
    if policy.shadow:
        return f"shadow: {policy.shadow} drafts, not verified"
    if policy.probing:
        return f"probing {k} drafts"
    if policy.retiming:
        return f"re-timing {policy.retiming} rows"
    if climbed:
        return f"climbing: {k} drafts, none rejected yet"
    if explored:
        return f"exploring: {k} drafts, depth 1 not known yet"
    if k > 0:
        return f"best rate: {k} drafts"
    if top <= 0:
        return "no room for drafts"
    if policy.rate(0) is None:
        return "timing 1 row"
    if priced_out:
        one, two = policy.cost(1), policy.cost(2)
        step = f", a drafter step {policy.step_cost:.3g} s" if policy.step_cost is not None else ""
        return f"priced out: 2 rows cost {two:.3g} s vs {one:.3g} s{step}"
    return f"acceptance too low: {policy.acceptance(1):.2f} at depth 1"


__all__ = [
    "METRIC_ACCEPTANCE",
    "METRIC_BATCH_ROWS",
    "METRIC_DRAFT_N",
    "METRIC_PASS_SECONDS",
    "METRIC_REASON",
    "METRIC_SLOT_DRAFT_N",
    "METRIC_STEP_SECONDS",
    "PolicySnapshot",
    "explain",
    "parse_snapshot",
    "snapshot_metrics",
]
