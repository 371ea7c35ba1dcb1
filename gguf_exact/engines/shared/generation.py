"""One generation and its counters, as every engine reports them.

:class:`Generation` is what :class:`.runner.Runner` returns, what the engine
(:mod:`.engine`) records for each call of its generate loop, and what the HTTP
clients (:mod:`gguf_exact.engines.shared.http`) rebuild from a server's answer, so that
``generate``, ``bench`` and the servers print the same figures.

A target pass is one call of the target's ``eval`` (one ``llama_decode`` of a
verification batch; a prompt decoded in chunks counts once). The prompt's pass
yields the first token; every later pass yields its accepted drafts plus one token
of the target's own, so ``len(tokens) == target_passes + drafts_accepted``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Generation:
    """One generation and its counters.

    ``tokens`` are the sampled token ids, ending with the end-of-generation token
    when one was produced (``stopped``).
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
    server_python_seconds: float | None = None  # over HTTP, the Python engine's time outside llama_decode

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
            "overhead_per_step_us": self.overhead_per_step_us,
        }


__all__ = ["Generation"]
