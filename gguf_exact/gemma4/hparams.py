"""Gemma 4 text-stack hyperparameters and the GGUF keys llama.cpp reads them from.

The main model (``gemma4``) and the MTP assistant (``gemma4-assistant``) get these
keys from one upstream function, ``Gemma4Model.set_gguf_parameters`` in
``conversion/gemma.py`` at 0c1e57098 (over ``Gemma3Model`` and ``TextModel`` in
``conversion/base.py``), so both are written here by one function,
:func:`text_fields`, in upstream's order and with upstream's value types.

Upstream reads the config as transformers 5.x hands it over (``AutoConfig...to_dict()``),
not the raw ``config.json``; :meth:`TextHparams.from_hf` reads the raw file and applies
the same rules:

- transformers moves ``global_head_dim`` and ``num_global_key_value_heads`` into a
  ``per_layer_config`` entry for each full-attention layer, the KV-head count only when
  ``attention_k_eq_v`` is true (the models with global KV heads, 26B-A4B and 31B, have
  it); upstream then writes ``attention.head_count_kv`` per layer;
- ``use_double_wide_mlp`` doubles the feed-forward width of the KV-shared layers;
  upstream then writes ``feed_forward_length`` per layer;
- the sliding layers' rotary fraction is read from the top level of
  ``rope_parameters``, so a config nested by layer type gives 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGUFValueType

from gguf_exact.errors import InputError
from gguf_exact.formats.gguf_layout import Field

SLIDING, FULL = "sliding_attention", "full_attention"
# The only full-attention rope llama.cpp's Gemma 4 graphs implement: the first
# partial_rotary_factor of each head rotates, through the rope_freqs factors.
FULL_ROPE_TYPE = "proportional"
SLIDING_ROPE_TYPES = (None, "default")  # llama.cpp applies no scaling to the sliding layers


@dataclass(frozen=True)
class TextHparams:
    """What llama.cpp needs of a Gemma 4 text stack, per layer where it varies."""

    n_layer: int
    context_length: int
    n_embd: int
    n_ff: tuple[int, ...]  # per layer
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer
    head_dim_swa: int
    head_dim_full: int
    swa_layers: tuple[bool, ...]  # True = sliding window
    sliding_window: int
    n_kv_shared: int
    n_embd_per_layer: int
    rms_eps: float
    rope_theta: float
    rope_theta_swa: float | None
    partial_rotary_full: float
    partial_rotary_swa: float
    final_logit_softcapping: float | None
    ff_per_layer: bool  # feed_forward_length written as an array (use_double_wide_mlp)
    kv_per_layer: bool  # head_count_kv written as an array (global KV heads)
    n_expert: int | None = None
    n_expert_used: int | None = None
    n_ff_expert: int | None = None

    @classmethod
    def from_hf(cls, text: dict, source: str = "config.json", assistant: bool = False) -> TextHparams:
        """From an HF ``text_config`` (or a flat config); ``assistant`` applies the
        assistant's rule that all its layers read shared KV."""

        def need(key: str):
            if text.get(key) is None:
                raise InputError(f"{source}: missing text_config.{key}")
            return text[key]

        layer_types = tuple(need("layer_types"))
        if any(t not in (SLIDING, FULL) for t in layer_types):
            raise InputError(f"{source}: text_config.layer_types has an unknown entry: {list(layer_types)}")
        n_layer = int(need("num_hidden_layers"))
        if len(layer_types) != n_layer:
            raise InputError(f"{source}: text_config.layer_types has {len(layer_types)} entries for {n_layer} layers")
        rope = need("rope_parameters")
        full_rope = rope.get(FULL, rope)
        sliding_rope = rope.get(SLIDING, {})
        if full_rope.get("rope_type") != FULL_ROPE_TYPE:
            raise InputError(
                f"{source}: text_config.rope_parameters.full_attention.rope_type is {full_rope.get('rope_type')!r}; "
                f"llama.cpp's Gemma 4 implements only {FULL_ROPE_TYPE!r} there (rope_freqs)"
            )
        if sliding_rope.get("rope_type") not in SLIDING_ROPE_TYPES:
            raise InputError(
                f"{source}: text_config.rope_parameters.sliding_attention.rope_type is {sliding_rope.get('rope_type')!r}; "
                "llama.cpp applies no rope scaling to Gemma 4's sliding layers (expected 'default')"
            )
        swa = tuple(t == SLIDING for t in layer_types)
        head_dim_swa = int(need("head_dim"))
        overrides = _full_layer_overrides(text, layer_types, source)
        if "head_dim" not in overrides:
            raise InputError(f"{source}: missing text_config.global_head_dim (the full-attention head size)")
        head_dim_full = int(overrides["head_dim"])
        n_kv = int(need("num_key_value_heads"))
        n_kv_full = overrides.get("num_key_value_heads")
        n_kv_shared = int(text.get("num_kv_shared_layers") or 0)
        if assistant and n_kv_shared == 0:
            n_kv_shared = n_layer  # transformers' Gemma4AssistantConfig: every layer reads shared KV
        n_ff = int(need("intermediate_size"))
        double_wide = bool(text.get("use_double_wide_mlp", False))
        first_shared = n_layer - n_kv_shared
        return cls(
            n_layer=n_layer,
            context_length=int(text.get("max_position_embeddings") or 131072),
            n_embd=int(need("hidden_size")),
            n_ff=tuple(n_ff * 2 if double_wide and il >= first_shared else n_ff for il in range(n_layer)),
            n_head=int(need("num_attention_heads")),
            n_head_kv=tuple(n_kv if s or n_kv_full is None else int(n_kv_full) for s in swa),
            head_dim_swa=head_dim_swa,
            head_dim_full=head_dim_full,
            swa_layers=swa,
            sliding_window=int(need("sliding_window")),
            n_kv_shared=n_kv_shared,
            n_embd_per_layer=int(text.get("hidden_size_per_layer_input") or 0),
            rms_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(full_rope.get("rope_theta", 1_000_000.0)),
            rope_theta_swa=float(sliding_rope["rope_theta"]) if "rope_theta" in sliding_rope else None,
            partial_rotary_full=float(full_rope.get("partial_rotary_factor", 1.0)),
            partial_rotary_swa=float(rope.get("partial_rotary_factor", 1.0)),
            final_logit_softcapping=text.get("final_logit_softcapping"),
            ff_per_layer=double_wide,
            kv_per_layer=n_kv_full is not None,
            n_expert=text.get("num_experts") or text.get("num_local_experts"),
            n_expert_used=text.get("top_k_experts") or text.get("num_experts_per_tok"),
            n_ff_expert=text.get("expert_intermediate_size") or text.get("moe_intermediate_size"),
        )

    def head_dim(self, il: int) -> int:
        return self.head_dim_swa if self.swa_layers[il] else self.head_dim_full

    def n_embd_k_gqa(self, il: int) -> int:
        """Width of layer ``il``'s K (and V) cache rows, as llama.cpp sizes them."""
        return self.n_head_kv[il] * self.head_dim(il)


def _full_layer_overrides(text: dict, layer_types: tuple[str, ...], source: str) -> dict:
    """``head_dim`` and ``num_key_value_heads`` of the full-attention layers, as
    transformers 5.x derives them and upstream's converter reads them back (the first
    full layer's entry of ``per_layer_config`` stands for all)."""
    per_layer = text.get("per_layer_config")
    if per_layer:
        for idx, layer in sorted(per_layer.items(), key=lambda kv: int(kv[0])):
            if int(idx) < len(layer_types) and layer_types[int(idx)] == FULL:
                return {k: layer[k] for k in ("head_dim", "num_key_value_heads") if k in layer}
        raise InputError(f"{source}: text_config.per_layer_config has no full-attention layer")
    out = {}
    if text.get("global_head_dim") is not None:
        out["head_dim"] = text["global_head_dim"]
    # transformers applies the global KV-head count only with attention_k_eq_v
    if text.get("num_global_key_value_heads") is not None and text.get("attention_k_eq_v", False):
        out["num_key_value_heads"] = text["num_global_key_value_heads"]
    return out


def text_fields(arch: str, hp: TextHparams) -> list[Field]:
    """Every ``<arch>.*`` key upstream writes for a Gemma 4 text stack, in its order."""
    u32, f32, arr = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.ARRAY
    i32 = GGUFValueType.INT32  # gguf-py writes Python int lists as INT32 arrays
    a = arch
    ff = Field(f"{a}.feed_forward_length", list(hp.n_ff), arr, i32) if hp.ff_per_layer else None
    kv = Field(f"{a}.attention.head_count_kv", list(hp.n_head_kv), arr, i32) if hp.kv_per_layer else None
    fields = [
        Field(f"{a}.block_count", hp.n_layer, u32),
        Field(f"{a}.context_length", hp.context_length, u32),
        Field(f"{a}.embedding_length", hp.n_embd, u32),
        ff or Field(f"{a}.feed_forward_length", hp.n_ff[0], u32),
        Field(f"{a}.attention.head_count", hp.n_head, u32),
        kv or Field(f"{a}.attention.head_count_kv", hp.n_head_kv[0], u32),
        Field(f"{a}.rope.freq_base", hp.rope_theta, f32),
    ]
    if hp.rope_theta_swa is not None:
        fields.append(Field(f"{a}.rope.freq_base_swa", hp.rope_theta_swa, f32))
    fields.append(Field(f"{a}.attention.layer_norm_rms_epsilon", hp.rms_eps, f32))
    if hp.n_expert is not None:
        fields.append(Field(f"{a}.expert_count", int(hp.n_expert), u32))
    if hp.n_expert_used is not None:
        fields.append(Field(f"{a}.expert_used_count", int(hp.n_expert_used), u32))
    fields += [
        Field(f"{a}.attention.key_length", hp.head_dim_full, u32),
        Field(f"{a}.attention.value_length", hp.head_dim_full, u32),
    ]
    if hp.final_logit_softcapping:
        fields.append(Field(f"{a}.final_logit_softcapping", float(hp.final_logit_softcapping), f32))
    fields += [
        Field(f"{a}.attention.sliding_window", hp.sliding_window, u32),
        Field(f"{a}.attention.shared_kv_layers", hp.n_kv_shared, u32),
        Field(f"{a}.embedding_length_per_layer_input", hp.n_embd_per_layer, u32),
        Field(f"{a}.attention.sliding_window_pattern", list(hp.swa_layers), arr, GGUFValueType.BOOL),
        Field(f"{a}.attention.key_length_swa", hp.head_dim_swa, u32),
        Field(f"{a}.attention.value_length_swa", hp.head_dim_swa, u32),
    ]
    if hp.n_ff_expert is not None:
        fields.append(Field(f"{a}.expert_feed_forward_length", int(hp.n_ff_expert), u32))
    fields += [
        Field(f"{a}.rope.dimension_count", hp.head_dim_full, u32),  # proportional: the factors do the rest
        Field(f"{a}.rope.dimension_count_swa", int(hp.head_dim_swa * hp.partial_rotary_swa), u32),
    ]
    return fields


def rope_freqs(hp: TextHparams) -> np.ndarray:
    """Per-dimension frequency factors of the full-attention layers' proportional rope:
    1.0 on the rotated half-dims, 1e30 (no rotation) on the rest."""
    n_rot = int(hp.head_dim_full * hp.partial_rotary_full / 2)
    n_unrot = int(hp.head_dim_full / 2) - n_rot
    return np.array([1.0] * n_rot + [1e30] * n_unrot, dtype=np.float32)
