"""The ordered-embedding head of a designed drafter: clusters that hold the tokens it proposes.

A drafter with an ordered head (issue 24) scores its ``num_centroids`` centroids on the final
hidden state, keeps the top ``top_k`` clusters and can draft only the tokens they hold. A
designed drafter (the tiny agreeing and hidden-state pairs, ``make-pair``) must then keep the
cluster of every token it proposes among those ``top_k``, or its ordered head drafts something
its full head never would.

Each centroid starts as the sum of its cluster's rows of the tied head. Where those rows are
one-hot (the hidden-state and ``make-pair`` drafters) that is already exact: a token's axis is
carried by its own cluster alone. Where they are dense (the agreeing drafter: random rows), the
other tokens of a cluster add noise of the same size as the signal, and about a quarter of
the tiny agreeing drafter's tokens lose their cluster; :func:`fit_centroids` then moves the
centroids, perceptron-fashion, until every proposed token's cluster is in the top ``top_k``
with a margin that survives bf16 storage and llama.cpp's rounding of the activations.
"""

from __future__ import annotations

import numpy as np

from gguf_exact.core import bf16

MARGIN = 0.05  # of |h| * mean |centroid|: far above bf16's 2^-8 and Q8_0's 1/127 relative error
MAX_EPOCHS = 2000


def cluster_of(ordering: np.ndarray, num_centroids: int) -> np.ndarray:
    """Each token's cluster: cluster c holds ``ordering[c * size : (c + 1) * size]``."""
    ordering = np.asarray(ordering, dtype=np.int64).reshape(-1)
    out = np.empty(ordering.size, dtype=np.int64)
    out[ordering] = np.arange(ordering.size) // (ordering.size // num_centroids)
    return out


def margins(centroids: np.ndarray, hidden: np.ndarray, clusters: np.ndarray, top_k: int) -> np.ndarray:
    """Per row of ``hidden``: how far its own cluster (``clusters``) scores above the best cluster
    that would push it out of the top ``top_k`` (the ``top_k``-th best of the others), in units of
    ``|h| * mean |centroid|``. Positive: the row's token is among the candidates."""
    scores = hidden.astype(np.float64) @ centroids.astype(np.float64).T
    rows = np.arange(len(hidden))
    own = scores[rows, clusters]
    others = scores.copy()
    others[rows, clusters] = -np.inf
    kth = -np.partition(-others, top_k - 1, axis=1)[:, top_k - 1]
    unit = np.linalg.norm(hidden, axis=1) * np.linalg.norm(centroids, axis=1).mean()
    return (own - kth) / np.where(unit > 0, unit, 1.0)


def fit_centroids(centroids: np.ndarray, hidden: np.ndarray, clusters: np.ndarray, top_k: int) -> np.ndarray:
    """``centroids`` moved until every row of ``hidden`` keeps its cluster in the top ``top_k``
    by :data:`MARGIN` (unchanged where it already does): each epoch, every row short of the
    margin pulls its own centroid towards it and pushes the ``top_k``-th other away. Stops with
    ``RuntimeError`` if the rows cannot be separated so (a design error, not a user's)."""
    c = centroids.astype(np.float64).copy()
    h = hidden.astype(np.float64) / np.linalg.norm(hidden, axis=1, keepdims=True)
    step = 0.1 * np.linalg.norm(c, axis=1).mean()
    rows = np.arange(len(h))
    for _ in range(MAX_EPOCHS):
        short = margins(c, h, clusters, top_k) < 2 * MARGIN  # aim past the margin: it holds after rounding
        if not short.any():
            return c
        scores = h[short] @ c.T
        scores[rows[: short.sum()], clusters[short]] = -np.inf
        rival = np.argsort(-scores, axis=1)[:, top_k - 1]
        np.add.at(c, clusters[short], step * h[short])
        np.add.at(c, rival, -step * h[short])
    raise RuntimeError(f"no centroids keep every proposed token's cluster in the top {top_k}")


def consistent_head(
    tensors: dict[str, np.ndarray], num_centroids: int, top_k: int, hidden: np.ndarray | None = None
) -> None:
    """Give a designed drafter (HF tensors, bf16 bits) centroids under which its ordered head
    proposes what its full head does. ``hidden``: per row, the drafter's final hidden state
    when it proposes that row's token (rows for tokens it never proposes are zero); by default
    the tied head's rows, which is what the pass-through drafters' hidden states point along."""
    embed = bf16.to_f32(tensors["model.embed_tokens.weight"])
    ordering = tensors["masked_embedding.token_ordering"]
    centroids = embed[ordering.reshape(num_centroids, -1)].sum(axis=1)
    hidden = embed if hidden is None else hidden
    proposed = np.flatnonzero(np.any(hidden != 0, axis=1))
    clusters = cluster_of(ordering, num_centroids)[proposed]
    if (margins(centroids, hidden[proposed], clusters, top_k) < MARGIN).any():
        centroids = bf16.to_f32(
            bf16.from_f32(fit_centroids(centroids, hidden[proposed], clusters, top_k).astype(np.float32))
        )
        if (margins(centroids, hidden[proposed], clusters, top_k) < MARGIN).any():
            raise RuntimeError("bf16 rounding of the fitted centroids loses a proposed token's cluster")
    tensors["masked_embedding.centroids.weight"] = bf16.from_f32(centroids.astype(np.float32))


__all__ = ["MARGIN", "cluster_of", "consistent_head", "fit_centroids", "margins"]
