"""Counters since an engine was loaded: :class:`SpecTotals` (``/metrics``, ``chat``'s ``/stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf_exact.engines.shared.generation import Generation


@dataclass
class SpecTotals:
    """Counters since the engine was loaded (``/metrics``, ``chat``'s ``/stats``)."""

    requests: int = 0
    prompt_tokens: int = 0
    tokens: int = 0  # sampled tokens, an end-of-generation token included (as llama-server counts them)
    target_passes: int = 0
    drafts: int = 0  # target passes that carried a draft (llama-server's drafts / verification steps)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    generation_seconds: float = 0.0  # after the first token, as llama-server's predicted time
    target_seconds: float = 0.0
    drafter_seconds: float = 0.0
    wall_seconds: float = 0.0

    def add(self, g: Generation) -> None:
        self.requests += 1
        self.prompt_tokens += g.n_prompt
        self.tokens += g.n_tokens
        self.target_passes += g.target_passes
        self.drafts += g.draft_rounds
        self.draft_tokens += g.drafts_generated
        self.accepted_tokens += g.drafts_accepted
        for a in g.accepted_per_round:
            if len(self.accepted_per_position) < a:
                self.accepted_per_position += [0] * (a - len(self.accepted_per_position))
            for i in range(a):
                self.accepted_per_position[i] += 1
        self.prefill_seconds += g.prefill_seconds
        self.generation_seconds += max(0.0, g.wall_seconds - g.prefill_seconds)
        self.target_seconds += g.target_seconds
        self.drafter_seconds += g.drafter_seconds
        self.wall_seconds += g.wall_seconds

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def tokens_per_target_pass(self) -> float | None:
        return self.tokens / self.target_passes if self.target_passes else None

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens after the first over the time after the first (generation phase)."""
        return (self.tokens - self.requests) / self.generation_seconds if self.generation_seconds > 0 else None

    @property
    def python_seconds(self) -> float:
        """Time inside generate calls but outside llama_decode: the Python side."""
        return max(0.0, self.wall_seconds - self.target_seconds - self.drafter_seconds)

    @property
    def python_us_per_pass(self) -> float | None:
        return 1e6 * self.python_seconds / self.target_passes if self.target_passes else None


__all__ = ["SpecTotals"]
