"""Which acceptance a request's drafts can expect: its *acceptance class*, the verification
rule crossed with a coarse class of its sampler (issue 38 item 4).

The draft-length policy (:mod:`.draft_policy`) prices a draft by its per-depth acceptance
a_j, and what a request achieves depends on how its drafts are verified. Greedy exact match
keeps a draft when it is the target's top token; sampled exact match when the target *samples*
it (probability p(x), far less at temperature 1); rejection sampling with probability
min(1, p(x)/q(x)), sum_x min(p, q) on average. One set of counts for all three made a policy that
had served greedy requests draft at a loss for the sampled ones that followed (and the reverse:
draft too little for greedy ones after sampled ones). So the policy keeps its counts per class and
the engine names the request's class when the request starts:

- ``greedy``: temperature <= 0. Exact match whatever the rule (rejection sampling with a
  one-hot q is exact match, and both engines keep exact match for greedy requests).
- ``sampled-exact``: temperature > 0, drafts verified by exact match (the rule off, or the
  request's chain one it cannot mirror: grammar, penalties, logit bias).
- ``sampled-rejection``: temperature > 0, drafts verified by rejection sampling.

Temperatures are not bucketed further: each class learns from nothing (the prior, the policy
then probes and measures within about 20 drafts), so finer classes would each pay that again,
while within a class the decayed counts follow a change of temperature as they follow a change
of text. A class never seen starts from the prior; its counts are kept while other classes
serve (they decay only with drafts of their own class). Costs (pass timings, the drafter step)
do not depend on the class: one machine, one set.
"""

from __future__ import annotations

GREEDY, SAMPLED_EXACT, SAMPLED_REJECTION = "greedy", "sampled-exact", "sampled-rejection"
ACCEPTANCE_CLASSES = (GREEDY, SAMPLED_EXACT, SAMPLED_REJECTION)  # llama-server's common_draft_class, in order


def acceptance_class(temperature: float, rejection: bool) -> str:
    """A request's class: sampled when its temperature > 0, verified by rejection sampling when
    ``rejection`` (the rule is on and applies to this request's chain)."""
    if not temperature > 0:
        return GREEDY
    return SAMPLED_REJECTION if rejection else SAMPLED_EXACT


__all__ = ["ACCEPTANCE_CLASSES", "GREEDY", "SAMPLED_EXACT", "SAMPLED_REJECTION", "acceptance_class"]
