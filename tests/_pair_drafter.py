"""make-pair's drafters run in numpy on their HF tensors, as llama.cpp's gemma4-assistant graph
runs them (tests/test_pair_walk.py checks the weights with it; tests/test_full_pair.py
predicts p-min's effect from its probabilities, which llama-server's counts then match)."""

from __future__ import annotations

import numpy as np

from gguf_exact.core import bf16
from gguf_exact.gemma4.sizes import SIZES
from gguf_exact.tiny.full_pair import drafter_weights
from gguf_exact.tiny.pair_walk import N_AXES

# the target's h as llama.cpp gives it at a token of axis s (steady state): 37.61 on s,
# -11.02 on s - 1 (layer 0's step takes from the axis it reads)
H_OWN, H_BEFORE = 37.61, -11.02


class Drafter:
    """The gemma4-assistant graph with pass-through layers: pre_projection of [token half
    (zero) | h], RMS norm times the final norm, the ordered head (the top 32 of 2,048
    clusters by centroid score, their tokens scored by the tied head, every other token
    below them), post_projection."""

    def __init__(self, kind: str, cycle: list[int]) -> None:
        _, t = drafter_weights("E2B", kind, cycle)
        self.backbone = SIZES["E2B"].assistant.backbone_hidden_size
        pre = bf16.to_f32(t["pre_projection.weight"])
        assert not pre[:, : self.backbone].any()  # reads h only
        self.pre = pre[:, self.backbone :]
        self.post = bf16.to_f32(t["post_projection.weight"])
        self.norm = bf16.to_f32(t["model.norm.weight"])
        self.embed = bf16.to_f32(t["model.embed_tokens.weight"])
        self.centroids = bf16.to_f32(t["masked_embedding.centroids.weight"])
        self.clusters = t["masked_embedding.token_ordering"].reshape(len(self.centroids), -1)

    def step(self, h: np.ndarray) -> tuple[int, float, np.ndarray]:
        x = self.pre @ h
        normed = x / np.sqrt(np.mean(x * x) + 1e-6) * self.norm
        top_clusters = np.argsort(self.centroids @ normed, kind="stable")[-32:]
        candidates = self.clusters[top_clusters].reshape(-1)
        scores = self.embed[candidates] @ normed
        best = np.sort(scores)[-10:].astype(np.float64)
        p = 1.0 / np.exp(best - best.max()).sum()
        return int(candidates[np.argmax(scores)]), float(p), self.post @ normed

    def chain(self, s: int, n: int) -> list[tuple[int, float]]:
        """(token, top probability) of ``n`` chained drafts after a token on axis ``s``."""
        h = np.zeros(self.backbone, np.float32)
        h[s % N_AXES], h[(s - 1) % N_AXES] = H_OWN, H_BEFORE
        out = []
        for _ in range(n):
            token, p, h = self.step(h)
            out.append((token, p))
        return out

    def confidence(self, n: int = 4):
        """(start axis, depth) -> top probability, for :func:`gguf_exact.tiny.pair_walk.predict_run`."""
        table = {s: [p for _, p in self.chain(s, n)] for s in range(N_AXES)}
        return lambda s, j: table[s % N_AXES][j - 1]
