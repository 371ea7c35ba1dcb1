"""Gemma 4 main models (``gemma4``): Hugging Face tensor names -> GGUF names.

One table, as upstream's converter writes them (``conversion/gemma.py``
``Gemma4Model`` with ``gguf-py/gguf/tensor_mapping.py`` at 0c1e57098), for every
size: dense E2B/E4B (per-layer embeddings), 12B/31B, and the 26B-A4B MoE.

Each entry also says what a re-pack does with the tensor (its *role*):

- ``qat``: a weight matrix trained onto the 4-bit grid; re-packed as exact Q4_0,
  and an off-grid block is an error unless ``--off-grid`` says otherwise;
- ``probe``: Q4_0 when the source happens to be on the grid, else kept as the
  donor has it (the MoE router, which QAT may leave in full precision);
- ``copy``: norms and scales, kept byte for byte.

Expert banks keep their 3-D form ((E, R, C) in HF = ne (C, R, E) in GGUF) and are
planned as E*R rows of C values. A donor that splits the fused ``gate_up_proj``
into ``ffn_gate_exps`` and ``ffn_up_exps`` takes each half of every expert.
"""

import re
from dataclasses import dataclass

ARCH = "gemma4"
# as upstream registers Gemma4Model / Gemma4UnifiedModel (the 12B is a "unified" model: same
# text-model names, its vision and audio embedders under embed_vision / embed_audio)
SUPPORTED_ARCHITECTURES = (
    "Gemma4ForConditionalGeneration",
    "Gemma4ForCausalLM",
    "Gemma4UnifiedForConditionalGeneration",
)
# Text-model tensors sit under one of these; vision and audio towers are elsewhere.
TEXT_PREFIXES = ("model.language_model.", "model.")
NOT_TEXT = ("vision_tower.", "audio_tower.", "embed_vision.", "embed_audio.", "multi_modal_projector.")

QAT, PROBE, COPY = "qat", "probe", "copy"

# name after the text prefix -> (GGUF name, role)
GLOBAL_TENSORS = {
    "embed_tokens.weight": ("token_embd.weight", QAT),
    "embed_tokens_per_layer.weight": ("per_layer_token_embd.weight", QAT),
    "per_layer_model_projection.weight": ("per_layer_model_proj.weight", QAT),
    "per_layer_projection_norm.weight": ("per_layer_proj_norm.weight", COPY),
    "norm.weight": ("output_norm.weight", COPY),
}
UNTIED_OUTPUT = ("lm_head.weight", "output.weight")  # top level, when not tied

# ``layers.N.<part>`` -> (``blk.N.<name>``, role)
LAYER_TENSORS = {
    "input_layernorm.weight": ("attn_norm.weight", COPY),
    "self_attn.q_proj.weight": ("attn_q.weight", QAT),
    "self_attn.k_proj.weight": ("attn_k.weight", QAT),
    "self_attn.v_proj.weight": ("attn_v.weight", QAT),
    "self_attn.o_proj.weight": ("attn_output.weight", QAT),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", COPY),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", COPY),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", COPY),
    "pre_feedforward_layernorm.weight": ("ffn_norm.weight", COPY),
    "mlp.gate_proj.weight": ("ffn_gate.weight", QAT),
    "mlp.up_proj.weight": ("ffn_up.weight", QAT),
    "mlp.down_proj.weight": ("ffn_down.weight", QAT),
    "post_feedforward_layernorm.weight": ("post_ffw_norm.weight", COPY),
    "per_layer_input_gate.weight": ("inp_gate.weight", QAT),
    "per_layer_projection.weight": ("proj.weight", QAT),
    "post_per_layer_input_norm.weight": ("post_norm.weight", COPY),
    "layer_scalar": ("layer_output_scale.weight", COPY),
    # 26B-A4B: router, expert banks and the second FFN branch's norms
    "router.proj.weight": ("ffn_gate_inp.weight", PROBE),
    "router.scale": ("ffn_gate_inp.scale", COPY),
    "router.per_expert_scale": ("ffn_down_exps.scale", COPY),
    "experts.gate_up_proj": ("ffn_gate_up_exps.weight", QAT),
    "experts.down_proj": ("ffn_down_exps.weight", QAT),
    "pre_feedforward_layernorm_2.weight": ("pre_ffw_norm_2.weight", COPY),
    "post_feedforward_layernorm_1.weight": ("post_ffw_norm_1.weight", COPY),
    "post_feedforward_layernorm_2.weight": ("post_ffw_norm_2.weight", COPY),
}
# GGUF names a donor may use for one half of the fused ``experts.gate_up_proj``.
SPLIT_EXPERTS = {
    "ffn_gate_exps.weight": ("ffn_gate_up_exps.weight", 0),
    "ffn_up_exps.weight": ("ffn_gate_up_exps.weight", 1),
}
GENERATED = ("rope_freqs.weight",)  # computed from the config, no source tensor
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Mapping:
    gguf_name: str
    role: str


def text_name(hf_name: str) -> str | None:
    """The name below the text-model prefix; None for vision/audio tensors."""
    if hf_name == UNTIED_OUTPUT[0]:
        return hf_name
    for prefix in TEXT_PREFIXES:
        if hf_name.startswith(prefix):
            rest = hf_name[len(prefix) :]
            return None if rest.startswith(NOT_TEXT) else rest
    return None


def gguf_tensor_name(hf_name: str) -> Mapping | None:
    """GGUF name and role for an HF tensor; None for tensors outside the text model
    or without a GGUF counterpart."""
    name = text_name(hf_name)
    if name is None:
        return None
    if name == UNTIED_OUTPUT[0]:
        return Mapping(UNTIED_OUTPUT[1], QAT)
    if name in GLOBAL_TENSORS:
        return Mapping(*GLOBAL_TENSORS[name])
    match = _LAYER.match(name)
    if match and match.group(2) in LAYER_TENSORS:
        gguf, role = LAYER_TENSORS[match.group(2)]
        return Mapping(f"blk.{int(match.group(1))}.{gguf}", role)
    return None


def split_expert_source(gguf_name: str) -> tuple[str, int] | None:
    """For ``blk.N.ffn_gate_exps.weight`` / ``ffn_up_exps``: (the fused GGUF name it
    comes from, which half: 0 gate, 1 up); None otherwise."""
    match = re.match(r"^blk\.(\d+)\.(.+)$", gguf_name)
    if match and match.group(2) in SPLIT_EXPERTS:
        fused, half = SPLIT_EXPERTS[match.group(2)]
        return f"blk.{match.group(1)}.{fused}", half
    return None


def tensor_kind(gguf_name: str, ndim: int) -> str:
    """The row of the re-pack report a tensor belongs to."""
    if gguf_name in (
        "token_embd.weight",
        "per_layer_token_embd.weight",
        "per_layer_model_proj.weight",
        "output.weight",
    ):
        return gguf_name.removesuffix(".weight")
    if "_exps." in gguf_name and gguf_name.endswith(".weight"):
        return "expert banks"
    if gguf_name.startswith("blk.") and ndim >= 2 and gguf_name.endswith(".weight"):
        return "router" if ".ffn_gate_inp." in gguf_name else "layer matrices"
    if gguf_name.startswith("nextn."):
        return "drafter projections"
    return "norms, scales, other"
