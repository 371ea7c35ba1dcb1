"""Tiny pairs with the structure of each real Gemma 4 size, for tests and ``make parity``.

:func:`tiny_shapes` takes a size from :data:`gguf_exact.gemma4.sizes.SIZES` and shrinks
only its widths: hidden and feed-forward sizes, the vocabulary (the 320-token tiny
one), the per-layer embedding width, the expert count (top-k kept) and the expert
width, and the head sizes by ``head_dim_divisor`` (1:2 sliding/full kept; llama.cpp's
CPU kernels take any head size, so 1 gives the real 256/512 for a GPU run at a cost).
Everything else stays as the real model has it: layer count, sliding/full pattern,
query heads, KV heads per layer type, K-equals-V full layers, KV sharing of the last
layers, double-wide MLP, partial rotary, rope thetas, sliding window.

:func:`write_structural_pair` writes, for one size, the target as a QAT checkpoint
and a Google-style donor GGUF (:mod:`.main_model`), and the assistant as a QAT
checkpoint (:mod:`.models`) with the same vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from gguf import GGMLQuantizationType

from gguf_exact.gemma4.sizes import SIZES, AssistantShape, Gemma4Size, TextShape
from gguf_exact.tiny.main_model import MainSpec, write_donor, write_main_checkpoint
from gguf_exact.tiny.models import TinyDrafter, TinyTarget, write_tiny_drafter

HIDDEN = 128  # the target's width; the drafter is half as wide (llama.cpp wants them different)
FFN = 128
VOCAB = TinyTarget().n_vocab
PER_LAYER = 32
EXPERTS = 16
EXPERT_FFN = 32
CONTEXT = 4096
HEAD_DIM_DIVISOR = 8  # 256 / 512 -> 32 / 64


def tiny_shapes(size: Gemma4Size, head_dim_divisor: int = HEAD_DIM_DIVISOR) -> tuple[TextShape, AssistantShape]:
    """(target, assistant) of ``size`` with every width shrunk and the structure kept."""
    t, a = size.target, size.assistant.text

    def heads(shape: TextShape) -> dict:
        return {
            "head_dim": shape.head_dim // head_dim_divisor,
            "global_head_dim": shape.global_head_dim // head_dim_divisor,
        }

    target = replace(
        t,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        vocab_size=VOCAB,
        max_position_embeddings=CONTEXT,
        hidden_size_per_layer_input=PER_LAYER if t.hidden_size_per_layer_input else 0,
        num_experts=EXPERTS if t.num_experts else None,
        moe_intermediate_size=EXPERT_FFN if t.num_experts else None,
        **heads(t),
    )
    assistant_text = replace(
        a, hidden_size=HIDDEN // 2, intermediate_size=FFN, vocab_size=VOCAB, max_position_embeddings=CONTEXT, **heads(a)
    )
    # the size's ordered head or none, at 32 clusters of 10 tokens, the top 4 scored
    assistant = AssistantShape(
        assistant_text,
        backbone_hidden_size=HIDDEN,
        num_centroids=32,
        centroid_top_k=4,
        ordered_embeddings=size.assistant.ordered_embeddings,
    )
    return target, assistant


@dataclass(frozen=True)
class StructuralPair:
    size: str
    target: Path  # gemma4 GGUF
    target_hf: Path  # its QAT checkpoint
    drafter_hf: Path  # the assistant's QAT checkpoint (convert it with gguf-exact convert)
    target_shape: TextShape
    assistant_shape: AssistantShape


def write_structural_pair(
    folder: str | Path, size: str, seed: int = 0, head_dim_divisor: int = HEAD_DIM_DIVISOR
) -> StructuralPair:
    """Write the tiny target (checkpoint and GGUF) and assistant checkpoint of ``size``
    (a key of :data:`~gguf_exact.gemma4.sizes.SIZES`) under ``folder``."""
    folder = Path(folder)
    target_shape, assistant_shape = tiny_shapes(SIZES[size], head_dim_divisor)
    spec = MainSpec.from_shape(target_shape)
    target_hf = write_main_checkpoint(folder / "target-hf", spec, seed=seed)
    # F16 for the embeddings: their tiny rows are not a multiple of Q6_K's 256
    f16 = {"token_embd.weight": GGMLQuantizationType.F16, "per_layer_token_embd.weight": GGMLQuantizationType.F16}
    target = write_donor(folder / "target.gguf", target_hf, spec, types=f16)
    drafter_hf = write_tiny_drafter(folder / "drafter-hf", seed=seed, spec=TinyDrafter.from_shape(assistant_shape))
    return StructuralPair(size, target, target_hf, drafter_hf, target_shape, assistant_shape)


__all__ = ["StructuralPair", "tiny_shapes", "write_structural_pair"]
