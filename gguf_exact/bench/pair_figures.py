"""What a target + drafter pair gives speculation when sampling, measured from the two models' own logits.

The target generates ``contexts`` tokens at the sampler :data:`GEMMA` (Google's setting for
Gemma 4: temperature 1, top-k 64, top-p 0.95); before each token it emits, the drafter drafts
``depth`` tokens from there twice, through the Python engine's contexts on the real files:

- **greedy** (each draft its argmax, as exact match drafts): per depth, the *greedy agreement*
  (argmax q = argmax p: what temperature 0 accepts) and *p(top of q)* (the target's
  probability of the draft: what exact match accepts when the target samples);
- **sampled** (each draft drawn from q, as speculative sampling drafts): per depth, the total
  variation distance between p and q and sum_x min(p(x), q(x)), the acceptance of
  ``spec-rejection-sampling``.

p and q are the distributions the sampler chain draws from
(:func:`~gguf_exact.engines.shared.speculative_sampling.chain_probabilities`), p the target's at
the draft's position given the context and the drafts before it. A depth's figure is the
acceptance of a draft there *given that every draft before it was kept*: each context counts
with the probability that the rule kept the drafts before (greedy agreement: 0 or 1; exact
match: the product of p(draft); speculative sampling: of min(1, p/q)), the way llama-server's
per-depth counts are taken. The target's spread is reported at temperature 1, untruncated.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llama_cpp import llama_cpp_ext

from gguf_exact.engines.python.engine import MtpLlama
from gguf_exact.engines.shared.speculative_sampling import chain_probabilities, draw


@dataclass(frozen=True)
class Sampler:
    temperature: float
    top_k: int
    top_p: float
    min_p: float = 0.0


GEMMA = Sampler(1.0, 64, 0.95)  # Google's recommended sampling for Gemma 4
UNTRUNCATED = Sampler(1.0, 0, 1.0)
PROMPT = b"hello"


@dataclass(frozen=True)
class DepthFigures:
    depth: int
    greedy_agreement: float  # argmax q = argmax p, given the greedy drafts before agreed
    p_top_q: float  # the target's probability of the drafter's top token (exact match's acceptance)
    total_variation: float  # between p and q, at drafts sampled from q
    sum_min: float  # sum_x min(p, q): speculative sampling's acceptance


@dataclass(frozen=True)
class PairFigures:
    contexts: int
    depths: tuple[DepthFigures, ...]
    top_probability: tuple[float, float, float]  # the target's, at temperature 1: 5th, 50th, 95th percentile
    above_one_percent: tuple[int, int, int]  # tokens above 1% there: fewest, median, most

    def lines(self) -> list[str]:
        lo, mid, hi = self.top_probability
        few, med, most = self.above_one_percent
        out = [
            f"target at temperature 1, {self.contexts} sampled tokens: top token's probability "
            f"{lo:.2f} / {mid:.2f} / {hi:.2f} (5th / 50th / 95th percentile), tokens above 1%: {few} / {med} / {most} "
            "(fewest / median / most)",
            "at temperature 1, top-k 64, top-p 0.95, given the drafts before kept:",
            "depth  greedy agreement  p(top of q)  total variation  sum min(p, q)",
        ]
        out += [
            f"{d.depth:>5}  {d.greedy_agreement:>16.3f}  {d.p_top_q:>11.3f}  {d.total_variation:>15.3f}  {d.sum_min:>13.3f}"
            for d in self.depths
        ]
        return out


def _weighted(values: list[list[float]], weights: list[list[float]], depth: int) -> list[float]:
    v, w = np.array(values), np.array(weights)  # [context, depth]
    before = np.cumprod(np.concatenate([np.ones((len(w), 1)), w[:, : depth - 1]], axis=1), axis=1)
    return list((before * v).sum(axis=0) / np.maximum(before.sum(axis=0), 1e-300))


def measure_pair(
    target: str | Path, drafter: str | Path, *, depth: int = 3, contexts: int = 300, seed: int = 0, n_threads: int = 1
) -> PairFigures:
    """Measure the pair's figures (module docstring) over ``contexts`` tokens the target samples."""
    rng = np.random.default_rng(seed)
    llm = MtpLlama(target, drafter, n_max=depth, n_ctx=contexts + depth + 64, n_threads=n_threads)
    try:
        assert llm.drafter is not None
        n_embd = llm.drafter.n_embd
        prompt = llm.tokenize(PROMPT)
        llm.decode_batch(prompt, 0, logits_all=False)
        logits = llm.batch_logits(1).copy()
        h = _hidden(llm, 0, n_embd)
        greedy: tuple[list[list[float]], ...] = ([], [], [], [])  # agreement, agreed, p(top q), p(draft)
        sampled: tuple[list[list[float]], ...] = ([], [], [])  # sum min, tv, min(1, p/q) of the draft
        tops, above = [], []
        pos = len(prompt)
        for _ in range(contexts):
            t1 = _softmax(logits)
            tops.append(float(t1.max()))
            above.append(int((t1 > 0.01).sum()))
            x = draw(_gemma(logits), rng)
            # speculative sampling's drafts: each drawn from q
            q_rows, drafts = _draft(llm, x, pos, depth, h, rng)
            p_rows = _verify(llm, pos, [x, *drafts[:-1]])[0]
            summin = np.minimum(p_rows, q_rows).sum(axis=1)
            sampled[0].append(list(summin))
            sampled[1].append(list(0.5 * np.abs(p_rows - q_rows).sum(axis=1)))
            d = np.arange(depth)
            sampled[2].append(list(np.minimum(1.0, p_rows[d, drafts] / q_rows[d, drafts])))
            # exact match's drafts: each the argmax; this pass also moves the context on by x
            q_rows, drafts = _draft(llm, x, pos, depth, h, None)
            p_rows, logits, h = _verify(llm, pos, [x, *drafts[:-1]])
            agree = (p_rows.argmax(axis=1) == q_rows.argmax(axis=1)).astype(float)
            greedy[0].append(list(agree))
            greedy[1].append(list(agree))
            greedy[2].append(list(p_rows[d, drafts]))
            greedy[3].append(list(p_rows[d, drafts]))
            pos += 1
        agreement = _weighted(greedy[0], greedy[1], depth)
        p_top = _weighted(greedy[2], greedy[3], depth)
        summin = _weighted(sampled[0], sampled[2], depth)
        tv = _weighted(sampled[1], sampled[2], depth)
    finally:
        llm.close()
    depths = tuple(DepthFigures(i + 1, agreement[i], p_top[i], tv[i], summin[i]) for i in range(depth))
    q5, q50, q95 = np.percentile(tops, [5, 50, 95])
    return PairFigures(contexts, depths, (q5, q50, q95), (min(above), int(np.median(above)), max(above)))


def _softmax(logits: np.ndarray) -> np.ndarray:
    return chain_probabilities(logits, UNTRUNCATED)


def _gemma(logits: np.ndarray) -> np.ndarray:
    """:data:`GEMMA`'s chain distribution of one row; its top-k cut taken first on the row's top-k
    alone (the chain does the same after sorting: 64 candidates, not 262,144 sorted)."""
    head = np.argpartition(-logits, GEMMA.top_k - 1)[: GEMMA.top_k]
    out = np.zeros(logits.size)
    out[head] = chain_probabilities(logits[head], GEMMA)
    return out


def _hidden(llm: MtpLlama, row: int, n_embd: int) -> ctypes.Array:
    """A copy of the target's hidden state of ``row`` of its last decode (the drafter's input)."""
    ptr = llama_cpp_ext.llama_get_embeddings_nextn_ith(llm.ctx, row)
    out = (ctypes.c_float * n_embd)()
    ctypes.memmove(out, ptr, n_embd * ctypes.sizeof(ctypes.c_float))
    return out


def _draft(
    llm: MtpLlama, token: int, pos: int, depth: int, h: ctypes.Array, rng: np.random.Generator | None
) -> tuple[np.ndarray, list[int]]:
    """(q rows, drafts) of a draft after ``token`` at ``pos``: sampled from q, or greedy (``rng`` None)."""
    rows: list[np.ndarray] = []

    def pick(row: np.ndarray) -> int:
        rows.append(_gemma(row))
        return int(row.argmax()) if rng is None else draw(rows[-1], rng)

    llm.drop_cache_from(pos)  # the drafter attends to the target's cache: the context before pos only
    assert llm.drafter is not None
    drafts = llm.drafter.draft(token, pos, depth, h, pick=pick)
    return np.array(rows), drafts


def _verify(llm: MtpLlama, pos: int, tokens: list[int]) -> tuple[np.ndarray, np.ndarray, ctypes.Array]:
    """The target's chain distributions after each of ``tokens`` decoded at ``pos``; and the first
    row's logits and hidden state (the context moved on by ``tokens[0]``)."""
    llm.drop_cache_from(pos)
    llm.decode_batch(tokens, pos, logits_all=True)
    logits = llm.batch_logits(len(tokens)).reshape(len(tokens), -1)
    p_rows = np.array([_gemma(row) for row in logits])
    assert llm.drafter is not None
    return p_rows, logits[0].copy(), _hidden(llm, 0, llm.drafter.n_embd)


__all__ = ["GEMMA", "DepthFigures", "PairFigures", "Sampler", "measure_pair"]
