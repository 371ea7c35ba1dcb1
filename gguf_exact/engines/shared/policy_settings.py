"""The draft-length policy's knobs (:mod:`.draft_policy` says what each one does to a choice); llama.cpp's
twin, ``common/draft-policy.h``, has the same defaults (``tests/test_draft_policy_cpp.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicySettings:
    """The policy's knobs (profile keys ``spec-draft-n-max``, ``spec-draft-p-min``)."""

    n_max: int = 4  # most drafts per pass
    p_min: float = 0.0  # a draft stops below this drafter confidence (llama.cpp's --spec-draft-p-min)
    prior: float = 0.5  # acceptance assumed at a depth before any draft was tried there
    prior_weight: float = 1.0  # in drafts: how soon measurements outweigh the prior
    decay: float = 0.95  # per draft tried at a depth: about 1 / (1 - decay) = 20 drafts remembered
    cost_weight: float = 0.2  # weight of a new drafter step timing in its running mean
    cost_window: int = 3  # a row count costs the lowest of its last this many steady timings
    retime_margin: float = 0.25  # a longer length timed steadily once is timed again within this of the best rate
    probe_interval: int = 8  # passes between probes one depth deeper than the best
    probe_interval_max: int = 64  # failed probes double the interval up to this
    cost_max_age: int = 128  # in passes: a row count's timing older than this is forgotten
    switch_margin: float = 0.02  # another length must beat the last one's rate by this to switch to it
    burst_ratio: float = 2.0  # a steady timing above this many times its row count's cost is not kept (0: all are)
    outlier_ratio: float = 2.0  # a new timing above this many times a shorter pass's, scaled by rows, is doubted
    recheck_interval: int = 32  # passes at 0 drafts, priced out, before one draft re-times the costs (0: never)
    explore_weight: float = 6.0  # decayed drafts at depth 1 (about 7) before its estimate alone prices drafting
    explore_errors: float = 1.0  # till then, it may be this many standard errors above its estimate
    shadow: bool = False  # from no drafts, a probe or exploration drafts unverified (spec-draft-shadow)


__all__ = ["PolicySettings"]
