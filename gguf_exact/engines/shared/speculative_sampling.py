"""Speculative sampling's verification rule, and the distribution llama.cpp's sampler chain draws from.

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): the drafter samples each
draft token x from its distribution q; the target keeps it with probability
min(1, p(x)/q(x)) and, at the first rejection, draws the token from the normalised
residual max(0, p - q); when every draft is kept it draws one more token from its next
row. Whatever q is, the tokens follow the target's p exactly, and a position's expected
acceptance is sum_x min(p(x), q(x)) (:func:`acceptance_rate`), where exact match (keep a
draft only if the target samples that very token) gets p(x).

p and q are what the request's sampler chain draws from, not plain softmaxes:
:func:`chain_probabilities` mirrors llama.cpp's chain at the pinned commit 0c1e57098
(``common_sampler_init`` in ``common/sampling.cpp``, the samplers in
``src/llama-sampler.cpp``) for temperature, top-k, top-p and min-p;
:func:`why_not_mirrored` names what else in a request changes p (penalties, grammar,
logit bias...), where an engine must keep exact match. Pure numpy, no I/O, for figures and
synthetic proofs (:mod:`gguf_exact.bench.pair_figures`). Both engines compute p and q with
llama.cpp's own chain instead, whose sort decides which of several equal logits a cut keeps
(the mirror ranks them by token id): the Python engine through llama-cpp-python's samplers
(:mod:`gguf_exact.engines.python.chain_distribution`), llama-server in patch 38
(``common_sampler_probs``, ``common_sampler_why_not_mirrored``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# The samplers llama.cpp runs besides the four mirrored, each at the value that makes it a
# no-op there (a settings object without the field counts as that value). Any other value
# changes p in a way the drafter's q cannot follow, so such a request keeps exact match.
NO_OP_VALUES: dict[str, object] = {
    "repeat_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "typical_p": 1.0,
    "mirostat": 0,
    "mirostat_mode": 0,
    "dynatemp_range": 0.0,
    "xtc_probability": 0.0,
    "dry_multiplier": 0.0,
    "top_n_sigma": -1.0,
    "grammar": None,
    "logit_bias": None,
}


class ChainSettings(Protocol):
    """The fields the mirrored chain reads (the Python engine's ``runner.Sampling`` has them):
    ``temperature`` 0 is greedy, ``top_k`` <= 0, ``top_p`` >= 1 and ``min_p`` <= 0 are off."""

    @property
    def temperature(self) -> float: ...

    @property
    def top_k(self) -> int: ...

    @property
    def top_p(self) -> float: ...

    @property
    def min_p(self) -> float: ...


def why_not_mirrored(sampler: object) -> str | None:
    """Why :func:`chain_probabilities` cannot stand for this sampler's chain (None: it can).

    Reads ``temperature``, ``top_k``, ``top_p``, ``min_p`` and any of :data:`NO_OP_VALUES`'
    fields that ``sampler`` has; the answer is one line, for a request's log line."""
    for name in ("temperature", "top_p", "min_p"):
        value = getattr(sampler, name, None)
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            return f"{name} {value!r} is not a finite number"
    if not isinstance(getattr(sampler, "top_k", None), numbers.Integral):
        return f"top_k {getattr(sampler, 'top_k', None)!r} is not an integer"
    temperature = float(getattr(sampler, "temperature", 0.0))  # checked a finite number above
    if temperature < 0:
        # llama-server samples greedily there, llama-cpp-python untruncated at temperature 1
        return "a negative temperature means different chains in the two engines"
    for name, no_op in NO_OP_VALUES.items():
        value = getattr(sampler, name, no_op)
        if value != no_op and not (no_op is None and not value):
            return f"{name} {value!r} changes the target's distribution in a way the drafter cannot mirror"
    return None


def chain_probabilities(logits: np.ndarray, sampler: ChainSettings, *, min_keep: int = 0) -> np.ndarray:
    """The distribution (float64, over the whole vocabulary, 0 outside the candidates) that
    llama.cpp's default chain samples one row of ``logits`` from.

    The order and semantics are llama.cpp's at 0c1e57098: top-k, then top-p, then min-p on
    the temperature-1 probabilities, then the temperature on the survivors' logits, then
    the softmax the ``dist`` sampler draws from. In detail:

    - top-k keeps the k highest logits; k <= 0 (or above the vocabulary) keeps all;
    - top-p (skipped at p >= 1) keeps the shortest head whose cumulative probability
      reaches p, the token that crosses p included (``cum >= p``), and at least
      ``min_keep``; the sums are float32 in llama.cpp's order, so a cut on a boundary
      falls as it does there;
    - min-p (skipped at p <= 0) keeps the tokens whose logit is at least the highest
      logit + log(min_p), i.e. probability >= min_p x the top one's *before* the
      temperature, and at least ``min_keep``;
    - temperature <= 0 is greedy: one-hot on the highest logit;
    - ``min_keep`` 0 (llama-server's default) and 1 (llama-cpp-python's) cut alike.

    Equal logits are ranked by token id, lower first. llama.cpp's partial sort leaves
    their order open, so a truncation that cuts between equal logits is the one place the
    mirror may keep a different token than llama.cpp (real logits almost never tie there).
    Logit bias, suppressed tokens included, is the caller's: -inf logits get probability 0.
    """
    row = np.asarray(logits, dtype=np.float32)
    if row.ndim != 1 or row.size == 0 or np.isnan(row).any() or not (row > -np.inf).any():
        raise ValueError(f"logits: one row with a finite value and no NaN expected, got shape {row.shape}")
    # The candidates are always a head of this order: every step keeps a head of it.
    order = np.argsort(-row, kind="stable")
    n = row.size
    is_sorted = False  # llama.cpp sums probabilities in token order until a step sorts

    if sampler.temperature <= 0:
        out = np.zeros(row.size)
        out[order[0]] = 1.0
        return out

    if sampler.top_k > 0:
        n = min(sampler.top_k, n)
        is_sorted = True

    if sampler.top_p < 1.0:
        exps = np.exp(row[order[:n]] - row[order[0]])  # float32, highest first
        # llama_sampler_softmax_impl sums with a float32 running sum in the array's order,
        # which is still token order when top-k did not sort it
        in_array_order = exps if is_sorted else np.exp(row - row[order[0]])
        total = np.cumsum(in_array_order, dtype=np.float32)[-1]
        cum = np.cumsum(exps / total, dtype=np.float32)
        reached = np.nonzero((cum >= np.float32(sampler.top_p)) & (np.arange(1, n + 1) >= min_keep))[0]
        if reached.size:
            n = int(reached[0]) + 1

    if sampler.min_p > 0.0:
        threshold = row[order[0]] + np.log(np.float32(sampler.min_p))
        passing = int(np.count_nonzero(row[order[:n]] >= threshold))
        n = min(n, max(passing, min_keep, 1))

    kept = order[:n]
    scaled = row[kept] / np.float32(sampler.temperature)
    # llama_sampler_dist_apply: float32 exponentials, a double sum
    exps64 = np.exp(scaled - scaled.max()).astype(np.float64)
    out = np.zeros(row.size)
    out[kept] = exps64 / exps64.sum()
    return out


def acceptance_rate(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """sum_x min(p(x), q(x)) over the last axis: the probability that speculative sampling
    keeps a draft drawn from q at a position where the target's distribution is p."""
    return np.minimum(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)).sum(axis=-1)


def speculative_step(
    p_rows: np.ndarray, q_rows: np.ndarray, draft: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Verify one pass's drafts: (how many are kept, the token that follows them).

    ``draft`` holds the k drafted tokens, each sampled from its row of ``q_rows`` (k rows,
    the drafter's chain distributions, 0 outside its candidates); ``p_rows`` holds the
    target's k + 1 chain distributions, row i given the drafts before i. Leading axes are
    a batch: ``draft`` (..., k), ``q_rows`` (..., k, V), ``p_rows`` (..., k + 1, V); the
    answers are shaped (...), 0-d for one sequence.

    Draft i is kept with probability min(1, p_i(x)/q_i(x)); the first one rejected is
    replaced by a token from max(0, p_i - q_i), normalised; when all k are kept, the next
    token comes from p_k. One uniform per row from ``rng`` (k + 1 per pass, used or not),
    as llama.cpp's ``dist`` draws one per sampled row: row i keeps its draft when
    u_i - F_i(x), taken mod 1, is below min(1, p_i(x)/q_i(x)) (F_i: p_i's cumulative sum
    before x, in token order), and a rejected row reuses the rest of u_i to pick from the
    residual, cumulated from x + 1 round to x. Each event has the probability the rule
    says; the placement is what makes a one-hot q (a greedy drafter) give, for the same
    uniforms, exactly the tokens that exact match gives by sampling p_i at u_i.
    """
    p = np.asarray(p_rows, dtype=np.float64)
    q = np.asarray(q_rows, dtype=np.float64)
    x = np.asarray(draft, dtype=np.intp)
    k = x.shape[-1] if x.ndim else -1
    if k < 0 or p.shape != x.shape[:-1] + (k + 1, p.shape[-1]) or q.shape != x.shape + (p.shape[-1],):
        raise ValueError(
            f"speculative_step: draft (..., k), q_rows (..., k, V) and p_rows (..., k + 1, V) expected, "
            f"got {x.shape}, {q.shape} and {p.shape}"
        )
    if x.size and (x.min() < 0 or x.max() >= p.shape[-1]):
        raise ValueError(f"draft: token ids must be below the vocabulary size {p.shape[-1]}")
    u = rng.random(x.shape[:-1] + (k + 1,))
    px = np.take_along_axis(p[..., :k, :], x[..., None], axis=-1)[..., 0]
    qx = np.take_along_axis(q, x[..., None], axis=-1)[..., 0]
    if (qx <= 0).any():
        raise ValueError("draft: a drafted token has probability 0 under its q row (not sampled from q)")
    keep = np.minimum(1.0, px / qx)
    before = np.cumsum(p[..., :k, :], axis=-1) - p[..., :k, :]
    start = np.take_along_axis(before, x[..., None], axis=-1)[..., 0]
    w = np.mod(u[..., :k] - start, 1.0)
    kept = w < keep
    # the first row not kept; k when all are (a never-kept column stands for the bonus row)
    n = np.argmin(np.concatenate([kept, np.zeros(kept.shape[:-1] + (1,), bool)], axis=-1), axis=-1)

    # Padded so that row k is the bonus: q 0 (the residual is p_k itself), the uniform u_k
    # whole (keep 0) and p_k cumulated from token 0.
    q_pad = np.concatenate([q, np.zeros(q.shape[:-2] + (1, q.shape[-1]))], axis=-2)
    w_pad = np.concatenate([w, u[..., k:]], axis=-1)
    keep_pad = np.concatenate([keep, np.zeros(keep.shape[:-1] + (1,))], axis=-1)
    first = np.concatenate([x + 1, np.zeros(x.shape[:-1] + (1,), np.intp)], axis=-1)

    def at_n(a: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, n[..., None], axis=-1)[..., 0]

    residual = np.maximum(
        np.take_along_axis(p, n[..., None, None], axis=-2)[..., 0, :]
        - np.take_along_axis(q_pad, n[..., None, None], axis=-2)[..., 0, :],
        0.0,
    )
    v = (at_n(w_pad) - at_n(keep_pad)) / (1.0 - at_n(keep_pad))  # uniform on [0, 1) given the rejection
    vocab = p.shape[-1]
    ids = (at_n(first)[..., None] + np.arange(vocab)) % vocab
    mass = np.take_along_axis(residual, ids, axis=-1)
    cum = np.cumsum(mass, axis=-1)
    pick = np.count_nonzero(cum <= (v * cum[..., -1])[..., None], axis=-1)
    last_with_mass = vocab - 1 - np.argmax(mass[..., ::-1] > 0, axis=-1)  # where rounding runs past the end
    pick = np.minimum(pick, last_with_mass)
    return n, np.take_along_axis(ids, pick[..., None], axis=-1)[..., 0]


def draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    """A token drawn from ``weights`` (non-negative, not all 0), normalised."""
    ids = np.flatnonzero(weights)
    return draw_among(ids, weights[ids], rng)


def draw_among(ids: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> int:
    """A token of ``ids`` (ascending) drawn by its ``weights`` (positive), normalised: one uniform,
    cumulated in token order (so a dense row and its nonzero entries give the same token)."""
    cum = np.cumsum(weights)
    return int(ids[min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), ids.size - 1)])


@dataclass(frozen=True)
class Support:
    """A distribution over the vocabulary held as its nonzero entries: ``ids`` ascending and their
    ``weights`` (float64, positive). A sampler chain's survivors are at most top-k of 262,144 tokens;
    as a dense row, every draw and residual cost the whole vocabulary (0.74 ms a draw, 2.9 ms a
    rejected row in the Python engine, issue 38). The same float64 values in the same token order as
    the dense row, so a seed draws the same tokens either way."""

    ids: np.ndarray
    weights: np.ndarray

    @classmethod
    def of(cls, ids: np.ndarray, weights: np.ndarray) -> Support:
        """From entries in any order (a sampler's survivors); the zero ones are dropped."""
        order = np.argsort(ids, kind="stable")
        ids, weights = np.asarray(ids)[order], np.asarray(weights, dtype=np.float64)[order]
        keep = weights > 0
        return cls(ids[keep], weights[keep])

    def at(self, tokens: int | np.ndarray) -> np.ndarray:
        """The weights of ``tokens`` (0 outside the support; a support is never empty)."""
        i = np.minimum(np.searchsorted(self.ids, tokens), self.ids.size - 1)
        return np.where(self.ids[i] == tokens, self.weights[i], 0.0)

    def dense(self, vocab: int) -> np.ndarray:
        out = np.zeros(vocab)
        out[self.ids] = self.weights
        return out

    def residual(self, q: Support) -> Support:
        """max(0, self - q), unnormalised (:func:`draw_among` normalises)."""
        ids = np.union1d(self.ids, q.ids)
        rest = np.maximum(self.at(ids) - q.at(ids), 0.0)
        keep = rest > 0
        return Support(ids[keep], rest[keep])

    def draw(self, rng: np.random.Generator) -> int:
        return draw_among(self.ids, self.weights, rng)

    def overlap(self, q: Support) -> float:
        """sum_x min(self(x), q(x)): :func:`acceptance_rate` of two supports."""
        return float(np.minimum(self.at(q.ids), q.weights).sum())


def verify_row(p: Support, q: Support, token: int, rng: np.random.Generator) -> tuple[int, float]:
    """One row of the rule, for an engine that verifies row by row: the draft ``token`` (drawn
    from ``q``) with probability min(1, p/q), else a token from max(0, p - q), normalised; and
    the chance the row had of keeping a draft from ``q``, sum min(p, q) (the draft-length policy
    counts it in place of the 0 or 1 this row came to: the same mean, less noise)."""
    chance = p.overlap(q)
    if rng.random() < min(1.0, float(p.at(token)) / float(q.at(token))):
        return token, chance
    return p.residual(q).draw(rng), chance  # not empty: p(x) < q(x), so p > q somewhere else


__all__ = [
    "NO_OP_VALUES",
    "ChainSettings",
    "Support",
    "acceptance_rate",
    "chain_probabilities",
    "draw",
    "draw_among",
    "speculative_step",
    "verify_row",
    "why_not_mirrored",
]
