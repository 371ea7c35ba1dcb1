"""The compute buffer llama.cpp reserves for a Gemma 4 graph, estimated from its shape
(:func:`compute_estimate`): part of the memory plan (:mod:`.memory_plan`), and of its split
over devices (:mod:`.device_plan`). Pure: shapes and settings in, bytes out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguf_exact.pair.geometry import Geometry

if TYPE_CHECKING:
    from gguf_exact.runtime.memory_plan import Settings


def compute_estimate(geom: Geometry, s: "Settings", mask_cells: list[int], n_outputs: int) -> int:
    """Bytes of the compute buffer of ``geom``'s worst-case graph: ``n_ubatch`` tokens
    against full caches of ``mask_cells`` cells each, ``n_outputs`` rows of logits (an
    estimate, meant to err high).

    llama.cpp's allocator reuses memory as tensors die, so the peak is what one step
    keeps alive: the attention masks (without flash attention one F32 row of cells per
    token and cache; with it, the largest cache's F32 mask and the smallest one's F16
    copy. At full E2B/E4B size llama-server's target and drafter compute buffers each
    grow by ``2 x n_ubatch`` bytes per cell of context, the estimate's by twice that: it
    is 2% over at 4,096 cells and 7% over at 8,192 for E2B, 2.5% under and 3% over for
    E4B, ``scripts/memory_real.py``), the token and Gemma 4's
    per-layer embeddings, four hidden-state rows of ``n_embd``, and the largest of: the
    attention (Q and its output, ``n_head x head_k`` per token each, and without flash
    attention the scores, ``n_head x cells`` per token, once: ggml's allocator runs the
    softmax in the scores' memory; counting them twice made the estimate 1.4-1.8x what
    llama.cpp reserves without flash attention, within 5% now at full E2B size on Vulkan
    and on the structural E2B and 26B-A4B on the CPU), the feed-forward
    activations (gate, up and their product, ``n_ff`` per token), or the logits
    (``n_vocab`` per output row; a drafter's ordered head adds its candidates' rows of the
    tied head, ``n_embd`` each). All F32 but the F16 masks.
    """
    t = s.ubatch(geom)
    f32 = 4
    fa = s.flash_attn != "off"
    masks = f32 * t * max(mask_cells) + 2 * t * min(mask_cells) if fa else f32 * t * sum(mask_cells)
    inputs = f32 * t * (geom.n_embd + geom.n_embd_per_layer * geom.n_layer)
    hidden = f32 * 4 * geom.n_embd * t
    n_head, head = max(geom.n_head), max(geom.head_k_full, geom.head_k_swa)
    attention = f32 * n_head * t * (2 * head + (0 if fa else max(mask_cells)))
    ffn = f32 * 3 * max(geom.n_ff) * t
    logits = f32 * (geom.n_vocab + geom.n_embd * geom.n_head_candidates) * n_outputs
    return masks + inputs + hidden + max(attention, ffn, logits)


__all__ = ["compute_estimate"]
