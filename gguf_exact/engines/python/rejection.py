"""Speculative sampling in the Python engine (``spec-rejection-sampling``, issue 38).

With the option on, a sampled request whose sampler chain the rule can mirror
(:func:`~gguf_exact.engines.shared.speculative_sampling.why_not_mirrored`) drafts and
verifies as Leviathan et al. do: the drafter *samples* each draft token x from
q = its chain distribution, and the target's row that verifies x keeps it with
probability min(1, p(x)/q(x)), else returns a token from the normalised residual
max(0, p - q). ``Llama.generate`` then sees that token differ from the draft and
truncates as it does on any mismatch. Rows with no draft to verify (the prompt's last,
the bonus row) sample with llama.cpp's sampler as without the option.

A request's ``speculative.rejection_sampling`` (:mod:`.draft_length`) turns it on or off for
that request alone. Greedy requests (temperature 0) never use it: exact match is already exact there and
the text stays byte for byte what it was. A request's ``logit_bias`` is mirrored (:class:`LogitBias`: p
and q both hold it, as llama-server's patch 38 does); other chains the rule cannot mirror (penalties,
grammar, other logits processors, a negative temperature...) keep exact match, said once in the log per
request.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from gguf_exact.engines.python.chain_distribution import ChainDistribution
from gguf_exact.engines.python.llama_adapter import LlamaAdapter
from gguf_exact.engines.python.request import CURRENT_REQUEST
from gguf_exact.engines.shared.acceptance_class import acceptance_class
from gguf_exact.engines.shared.speculative_sampling import Support, verify_row, why_not_mirrored

log = logging.getLogger(__name__)

_GENERATE = inspect.signature(llama_cpp.Llama.generate)


@dataclass(frozen=True)
class LogitBias:
    """A request's ``logit_bias`` as the logits processor ``generate`` is handed (by
    :meth:`.engine.MtpLlama.create_completion`): llama-cpp-python's own is a closure the rule cannot
    read, so it could not add the bias to the drafter's row; this one it can. Stateless, so the
    target's row and the drafter's take it alike."""

    bias: tuple[tuple[int, float], ...]

    @classmethod
    def of(cls, mapping: dict[Any, Any]) -> LogitBias:
        return cls(tuple((int(token), float(value)) for token, value in mapping.items()))

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        # llama-cpp-python's processor (Llama._create_completion), expression for expression: the same float32 sums
        new_scores = np.copy(scores)
        for token, value in self.bias:
            new_scores[token] = value + scores[token]
        return new_scores


def with_readable_bias(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``create_completion``'s arguments with a ``logit_bias`` handed to ``generate`` as a
    :class:`LogitBias` processor (after any others, where llama-cpp-python puts its own)."""
    if not kwargs.get("logit_bias"):
        return kwargs
    processors = [*(kwargs.get("logits_processor") or []), LogitBias.of(kwargs["logit_bias"])]
    return kwargs | {"logits_processor": llama_cpp.LogitsProcessorList(processors), "logit_bias": None}


@dataclass(frozen=True)
class SamplerView:
    """A request's sampler as ``Llama.generate`` was given it, with the names the rule reads."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    typical_p: float
    repeat_penalty: float
    frequency_penalty: float
    presence_penalty: float
    mirostat_mode: int
    grammar: Any


def sampler_view(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[SamplerView, Any]:
    """The sampler of a ``generate(tokens, *args, **kwargs)`` call, and its logits processors."""
    bound = _GENERATE.bind(None, None, *args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    view = SamplerView(
        temperature=a["temp"], top_k=a["top_k"], top_p=a["top_p"], min_p=a["min_p"], typical_p=a["typical_p"],
        repeat_penalty=a["repeat_penalty"], frequency_penalty=a["frequency_penalty"],
        presence_penalty=a["presence_penalty"], mirostat_mode=a["mirostat_mode"], grammar=a["grammar"],
    )  # fmt: skip
    return view, a["logits_processor"]


def call_class(args: tuple[Any, ...], kwargs: dict[str, Any], rule: RejectionSampling | None) -> str:
    """The acceptance class of a ``generate`` call (the draft-length policy's counts for it): its
    temperature and whether ``rule`` verifies its drafts (:mod:`~gguf_exact.engines.shared.acceptance_class`)."""
    return acceptance_class(sampler_view(args, kwargs)[0].temperature, rule is not None)


def greedy_alone(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``generate`` call's chain is llama.cpp's greedy sampler with nothing that changes the
    row before it: temperature 0 (llama-cpp-python then adds ``greedy``, whatever its mirostat), no
    grammar, no logits processors (a ``logit_bias`` is one) and the penalties at their neutral values
    (llama.cpp's penalties sampler then returns at once)."""
    view, processors = sampler_view(args, kwargs)
    neutral = view.repeat_penalty == 1.0 and view.frequency_penalty == 0.0 and view.presence_penalty == 0.0
    return view.temperature == 0.0 and view.grammar is None and not processors and neutral


class RejectionSampling:
    """One ``generate`` call's rule: the request's sampler, a seeded generator, and the
    q of each draft token not yet verified, by the position it was drafted for."""

    def __init__(self, sampler: SamplerView, seed: int, biases: tuple[LogitBias, ...] = ()) -> None:
        self.sampler = sampler
        self.biases = biases  # the request's logit_bias, applied to both rows before the chain
        # p and q by llama.cpp's own chain, which samples the rows the rule does not verify
        self.chain = ChainDistribution(sampler)
        # the request's seed, as llama.cpp's dist sampler takes it (its default: a random one)
        self.rng = np.random.default_rng(None if seed == llama_cpp.LLAMA_DEFAULT_SEED else seed)
        self.pending: dict[int, tuple[int, Support]] = {}
        self.chances: list[float] = []  # sum min(p, q) of each draft the last draft's pass verified, in order
        self._next = 0

    @classmethod
    def for_call(
        cls, args: tuple[Any, ...], kwargs: dict[str, Any], seed: int, default: bool
    ) -> RejectionSampling | None:
        """The rule for a ``generate`` call, or None where drafts stay on exact match (logged where
        asked for): the request's ``speculative.rejection_sampling`` asks, else ``default`` (the server's)."""
        request = CURRENT_REQUEST.get()
        asked = request.speculation.rejection_sampling if request is not None else None
        if not (default if asked is None else asked):
            return None
        view, processors = sampler_view(args, kwargs)
        if view.temperature == 0:
            log.info("spec-rejection-sampling: a greedy request keeps exact match (lossless there)")
            return None
        reason = why_not_mirrored(view)
        biases = tuple(processors or ())
        if reason is None and not all(isinstance(p, LogitBias) for p in biases):
            reason = "logits processors change the target's distribution in a way the drafter cannot mirror"
        if reason is not None:
            log.info("spec-rejection-sampling: this request keeps exact match: %s", reason)
            return None
        return cls(view, seed, biases)

    def start_draft(self, pos: int) -> None:
        """A draft after the token at ``pos`` begins: its tokens go to ``pos + 1``, ``pos + 2``..."""
        self.pending.clear()
        self.chances = []
        self._next = pos + 1

    def draw_draft(self, logits: np.ndarray) -> int:
        """The next draft token, sampled from the drafter's chain distribution q of ``logits``."""
        q = self.chain.support(self.biased(logits))
        token = q.draw(self.rng)
        self.pending[self._next] = (token, q)
        self._next += 1
        return token

    def draw_shadow(self, logits: np.ndarray) -> tuple[int, Support]:
        """A shadow's draft token (drafted, not verified: :mod:`.draft_model`) and its q, drawn as
        :meth:`draw_draft` draws but kept apart from the drafts pending verification."""
        q = self.chain.support(self.biased(logits))
        return q.draw(self.rng), q

    def chance(self, logits: np.ndarray, q: Support) -> float:
        """sum min(p, q): the chance the target's row ``logits`` had of keeping a draft drawn from ``q``."""
        return self.chain.support(self.biased(logits)).overlap(q)

    def token_at(self, llm: LlamaAdapter, idx: int | None) -> int | None:
        """The target's token at row ``idx`` of ``llm``'s last decode when that row verifies a
        pending draft (the draft, or one from the residual); None: the row samples as usual."""
        if idx is None or idx + 1 >= llm.n_tokens:
            return None
        draft = self.pending.pop(idx + 1, None)
        if draft is None or draft[0] != llm.input_ids[idx + 1]:
            return None
        return self.verify(llm.row_logits(idx), *draft)

    def verify(self, logits: np.ndarray, token: int, q: Support) -> int:
        """The target's token for a row whose ``logits`` verify the draft ``token`` drawn from
        ``q``: the draft with probability min(1, p/q), else one from max(0, p - q). The row's chance
        of keeping a draft goes to :attr:`chances` for the draft-length policy."""
        kept, chance = verify_row(self.chain.support(self.biased(logits)), q, token, self.rng)
        self.chances.append(chance)
        return kept

    def biased(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` as the request's chain sees them: its logit_bias added, as llama-cpp-python adds it."""
        for bias in self.biases:
            logits = bias(np.empty(0, dtype=np.intc), np.asarray(logits, dtype=np.float32))
        return logits


__all__ = ["RejectionSampling", "SamplerView", "call_class", "greedy_alone", "sampler_view"]
