"""Greedy speculative decoding: draft, verify in one target pass, accept, roll back.

Pure Python over two small interfaces, so the algorithm is tested without
llama.cpp (``tests/test_speculative.py``) and run on it by :mod:`.runner`.

One step, with ``last`` the newest output token (not yet in the target's KV
cache) at position ``pos``:

1. the drafter proposes ``d1..dk`` greedily from ``last`` and the target's hidden
   state of the position before it;
2. the target decodes ``[last, d1..dk]`` at ``pos..pos+k`` in one pass and
   returns its greedy next token ``g0..gk`` for every row;
3. the agreeing prefix ``d1..da`` (``di == g(i-1)``) is accepted, and ``ga`` (the
   target's own next token) follows it, so a pass yields ``a + 1`` tokens;
4. the target's KV cache keeps ``pos..pos+a`` and drops the rejected rest; the
   hidden state of row ``a`` feeds the next draft.

Every emitted token is the target's own greedy choice given the tokens before
it, so the output equals the target's greedy output (up to floating-point
differences between batched and single-token passes; see the README). The
prefill counts as a target pass that yields the first token, so
``len(tokens) == target_passes + drafts_accepted`` always holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection, Protocol, Sequence


class Verifier(Protocol):
    """The target model, as the loop sees it."""

    def prefill(self, prompt: Sequence[int]) -> int:
        """Clear the KV cache, decode ``prompt`` at ``0..``; return the greedy next token."""
        ...

    def verify(self, tokens: Sequence[int], pos: int) -> list[int]:
        """Decode ``tokens`` at ``pos..`` in one pass; the greedy next token per row."""
        ...

    def keep(self, n_keep: int, row: int) -> None:
        """Drop KV cells at positions ``>= n_keep``; row ``row`` of the last
        :meth:`verify` (or the prefill's last row, ``row = -1``) is the hidden
        state the next draft starts from."""
        ...


class Drafter(Protocol):
    """The MTP drafter, as the loop sees it."""

    def draft(self, token: int, pos: int, n: int) -> list[int]:
        """Up to ``n`` greedy draft tokens following ``token`` at ``pos``."""
        ...


@dataclass
class Generation:
    """One greedy generation and its counters.

    ``tokens`` ends with the stop token when one was produced. A target pass is
    one ``llama_decode`` of the target (the prefill counts as the first).
    """

    tokens: list[int]
    n_prompt: int
    n_max: int
    target_passes: int = 0
    drafts_generated: int = 0
    drafts_accepted: int = 0
    draft_rounds: int = 0  # verification passes that carried at least one draft
    stopped: bool = False  # a stop (end-of-generation) token ended the output
    wall_seconds: float = 0.0  # the whole call, prefill included
    prefill_seconds: float = 0.0  # prompt decode up to the first token
    target_seconds: float = 0.0  # inside target decodes (C side), prefill included
    drafter_seconds: float = 0.0  # inside drafter decodes (C side)
    text: str = ""
    accepted_per_round: list[int] = field(default_factory=list)
    margins: list[float] | None = None  # top-2 logit gap behind each token, when recorded

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / generated draft tokens (None without drafts)."""
        return self.drafts_accepted / self.drafts_generated if self.drafts_generated else None

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per drafting pass, llama-server's ``mean len``: 1 + accepted / rounds."""
        return 1.0 + self.drafts_accepted / self.draft_rounds if self.draft_rounds else 1.0

    @property
    def tokens_per_target_pass(self) -> float:
        return self.n_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over the time after the prefill (as llama-server's
        ``timings.predicted_per_second``)."""
        t = self.wall_seconds - self.prefill_seconds
        return self.n_tokens / t if t > 0 else 0.0

    @property
    def overhead_seconds(self) -> float:
        """Wall time outside the C decode calls: Python bookkeeping, argmax, copies."""
        return max(0.0, self.wall_seconds - self.target_seconds - self.drafter_seconds)

    @property
    def overhead_per_step_us(self) -> float:
        """Python-side time per target pass after the prefill, in microseconds."""
        steps = self.target_passes - 1
        return 1e6 * self.overhead_seconds / steps if steps > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "tokens": list(self.tokens),
            "text": self.text,
            "n_prompt": self.n_prompt,
            "n_tokens": self.n_tokens,
            "n_max": self.n_max,
            "target_passes": self.target_passes,
            "drafts_generated": self.drafts_generated,
            "drafts_accepted": self.drafts_accepted,
            "draft_rounds": self.draft_rounds,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "tokens_per_target_pass": self.tokens_per_target_pass,
            "stopped": self.stopped,
            "wall_seconds": self.wall_seconds,
            "prefill_seconds": self.prefill_seconds,
            "tokens_per_second": self.tokens_per_second,
            "python_overhead_per_step_us": self.overhead_per_step_us,
        }


def agreeing_prefix(drafts: Sequence[int], greedy: Sequence[int]) -> int:
    """How many leading drafts equal the target's greedy token of the row before."""
    a = 0
    for d, g in zip(drafts, greedy):
        if d != g:
            break
        a += 1
    return a


def speculate(
    target: Verifier,
    drafter: Drafter | None,
    prompt: Sequence[int],
    n_predict: int,
    n_max: int,
    stop: Collection[int] = (),
) -> Generation:
    """Greedy generation of up to ``n_predict`` tokens, drafting up to ``n_max``
    per pass (``drafter=None`` or ``n_max=0``: the target alone, one token per
    pass). Stops after the first token in ``stop``."""
    n_max = max(0, n_max) if drafter is not None else 0
    gen = Generation(tokens=[], n_prompt=len(prompt), n_max=n_max)
    if n_predict <= 0:
        return gen
    t_start = time.perf_counter()
    out = gen.tokens
    out.append(target.prefill(prompt))
    gen.target_passes = 1
    gen.prefill_seconds = time.perf_counter() - t_start
    pos = len(prompt)  # position of out[-1], which is not in the KV cache yet
    if out[-1] in stop:
        gen.stopped = True
    while not gen.stopped and len(out) < n_predict:
        k = min(n_max, n_predict - len(out) - 1)  # a pass yields at most k + 1 tokens
        drafts = drafter.draft(out[-1], pos, k) if k > 0 else []  # type: ignore[union-attr]
        greedy = target.verify([out[-1], *drafts], pos)
        gen.target_passes += 1
        a = agreeing_prefix(drafts, greedy)
        new = greedy[: a + 1]
        for j, tok in enumerate(new):
            if tok in stop:
                new = new[: j + 1]
                gen.stopped = True
                break
        if drafts:
            gen.draft_rounds += 1
            gen.drafts_generated += len(drafts)
            gen.drafts_accepted += len(new) - 1
            gen.accepted_per_round.append(len(new) - 1)
        # KV holds out[-1] and the accepted drafts; the newest token is not decoded yet.
        target.keep(pos + len(new), len(new) - 1)
        out.extend(new)
        pos += len(new)
    gen.wall_seconds = time.perf_counter() - t_start
    return gen


__all__ = ["Drafter", "Generation", "Verifier", "agreeing_prefix", "speculate"]
