"""The compute buffers llama.cpp reserves for a Gemma 4 graph, estimated from its shape: the
device's (:func:`compute_estimate`) and, beside a GPU, the CPU's in host memory
(:func:`host_compute_estimate`). Part of the memory plan (:mod:`.memory_plan`), and of its
split over devices (:mod:`.device_plan`). Pure: shapes and settings in, bytes out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguf_exact.pair.geometry import Geometry

if TYPE_CHECKING:
    from gguf_exact.engines.shared.memory_plan import MemoryInputs


def compute_estimate(geom: Geometry, s: "MemoryInputs", mask_cells: list[int], n_outputs: int) -> int:
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


def host_compute_estimate(
    geom: Geometry,
    s: "MemoryInputs",
    mask_cells: list[int],
    n_outputs: int,
    *,
    backbone: int | None = None,
    head_in_ram: bool = False,
    head_row_bytes: int = 0,
) -> int:
    """Bytes of the CPU's compute buffer beside a GPU's, which llama.cpp logs as
    ``Vulkan_Host`` (``CUDA_Host``) ``compute buffer size``: host memory, beside the device's.

    ggml's scheduler (``ggml_backend_sched_backend_id_from_cur`` in ``ggml-backend.cpp`` at
    0c1e57098: "graph input" goes to the last backend, the CPU) computes every graph input
    on the CPU and copies it to the device, and runs there each op whose weight stays in
    host memory; the CPU backend allocates in the GPU's pinned host buffer type. For the
    worst-case graph of ``n_ubatch`` tokens (measured with ``GGML_SCHED_DEBUG=2``):

    - the attention masks, one row of cells per token and cache (F32; F16 with flash
      attention, ``build_attn_inp_kq_mask`` in ``llama-graph.cpp``), and the I32 positions,
      token ids and output ids;
    - a target, which writes its cache: per cache the I64 row indices of K and of V (one
      per token, or one per value when V is stored transposed, without flash attention);
      and the rows of its input tensors, ``token_embd`` and ``per_layer_token_embd``
      (host memory: :mod:`.weight_placement`), one F32 row per token each;
    - a drafter (``backbone``: the target's width): the target's hidden rows it is given
      and its tokens' rows of the target's embeddings, ``backbone`` F32 values per token each;
    - with the head in RAM (``head_in_ram``: a device that refuses it, as lavapipe does at a
      262,144-token vocabulary), its matmul: the normed rows copied from the device and the
      logits, F32, per output row (the soft-cap runs in the logits' memory); an ordered head
      there gathers its candidates' rows of the tied head instead (``head_row_bytes`` each,
      with their I32 ids), and scores them on the device.

    Within 4% of what llama-server logs on lavapipe at full E2B size and on the tiny pairs.
    """
    t = s.ubatch(geom)
    masks = (2 if s.flash_attn != "off" else 4) * t * sum(mask_cells)
    ids = 4 * (2 * t + n_outputs)
    if backbone is None:
        v_max = max(geom.v_width(il) for il in range(geom.n_layer))
        idxs = 8 * t * len(mask_cells) * (1 + (v_max if s.v_transposed else 1))
        rows = 4 * t * (geom.n_embd + geom.n_embd_per_layer * geom.n_layer)
    else:
        idxs, rows = 0, 4 * t * 2 * backbone
    head = 0
    if head_in_ram:
        if geom.n_head_candidates:
            head = n_outputs * geom.n_head_candidates * (head_row_bytes + 4)
        else:
            head = 4 * n_outputs * (geom.n_vocab + geom.n_embd)
    return masks + ids + idxs + rows + head


__all__ = ["compute_estimate", "host_compute_estimate"]
