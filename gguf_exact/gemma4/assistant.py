"""The gemma4-assistant GGUF form: config keys, tensor names, ``rope_freqs``.

Everything llama.cpp's loader (``src/models/gemma4-assistant.cpp`` at 0c1e57098)
needs, as upstream's converter (``conversion/gemma.py``, ``Gemma4AssistantModel``)
writes it, in one table each so that a reader can check them against upstream.
"""

import re
from dataclasses import dataclass

import numpy as np
from gguf import GGUFValueType

from gguf_exact.errors import GgufExactError
from gguf_exact.formats.gguf_layout import Field  # noqa: F401  (the key/value type the tables are written in)

ARCH = "gemma4-assistant"  # hyphen: the underscore form does not load
SUPPORTED_ARCHITECTURES = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")

# HF name -> GGUF name, for tensors outside the layers.
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",  # also the tied output
    "model.norm.weight": "output_norm.weight",
    "pre_projection.weight": "nextn.pre_projection.weight",
    "post_projection.weight": "nextn.post_projection.weight",
}
# HF ``model.layers.N.<part>`` -> GGUF ``blk.N.<name>.weight``.
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.o_proj.weight": "attn_output",
    "post_attention_layernorm.weight": "post_attention_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
    "post_feedforward_layernorm.weight": "post_ffw_norm",
    "layer_scalar": "layer_output_scale",
}
# Dropped as upstream drops them: llama.cpp's drafter graph does not use them.
DROPPED_PREFIXES = ("masked_embedding.",)
ROPE_FREQS = "rope_freqs.weight"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_PREFIX_ALIASES = (("model.language_model.", "model."),)  # Unified checkpoints


def gguf_tensor_name(hf_name: str) -> str | None:
    """GGUF name for an HF tensor name; None for tensors that are dropped.

    Raises :class:`GgufExactError` for a name with no mapping.
    """
    name = hf_name
    for old, new in _PREFIX_ALIASES:
        if name.startswith(old):
            name = new + name[len(old) :]
    if name.startswith(DROPPED_PREFIXES):
        return None
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    match = _LAYER.match(name)
    if match and match.group(2) in LAYER_TENSORS:
        return f"blk.{int(match.group(1))}.{LAYER_TENSORS[match.group(2)]}.weight"
    raise GgufExactError(f"tensor {hf_name} has no gemma4-assistant mapping")


def tensor_order(gguf_name: str) -> tuple:
    """Stable order for the output: global tensors first, then layer by layer."""
    match = re.match(r"^blk\.(\d+)\.", gguf_name)
    return (1, int(match.group(1)), gguf_name) if match else (0, 0, gguf_name)


# config.json fields read here, with the JSON types they must have.
INT_FIELDS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "global_head_dim", "sliding_window", "vocab_size", "num_kv_shared_layers",
    "max_position_embeddings", "hidden_size_per_layer_input", "backbone_hidden_size",
)  # fmt: skip
FLOAT_FIELDS = ("rms_norm_eps", "final_logit_softcapping")


def check_types(config: dict, text: object, source: str) -> None:
    """One line naming the first field of the wrong JSON type (before any arithmetic
    on it would fail with a traceback)."""
    if not isinstance(text, dict):
        raise GgufExactError(f"{source}: text_config is a JSON {type(text).__name__}, not an object")
    for where, label in ((config, ""), (text, "text_config.")):
        for key in INT_FIELDS + FLOAT_FIELDS:
            value = where.get(key)
            ok = isinstance(value, int) or (key in FLOAT_FIELDS and isinstance(value, float))
            if value is not None and (not ok or isinstance(value, bool)):
                kind = "a number" if key in FLOAT_FIELDS else "an integer"
                raise GgufExactError(f"{source}: {label}{key} is {value!r}, expected {kind}")
    for key, kind in (("layer_types", list), ("rope_parameters", dict)):
        if key in text and not isinstance(text[key], kind):
            raise GgufExactError(
                f"{source}: text_config.{key} is {text[key]!r}, expected a JSON {'array' if kind is list else 'object'}"
            )
    if not isinstance(config.get("architectures", []), list):
        raise GgufExactError(f"{source}: architectures is {config['architectures']!r}, expected a JSON array")


@dataclass(frozen=True)
class AssistantConfig:
    """The parts of an HF assistant config.json that the GGUF needs."""

    architecture: str
    backbone_hidden_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    global_head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_theta_swa: float | None
    partial_rotary_factor_full: float
    partial_rotary_factor_swa: float
    num_kv_shared_layers: int
    context_length: int
    hidden_size_per_layer_input: int
    final_logit_softcapping: float | None

    @classmethod
    def from_hf(cls, config: dict, source: str = "config.json") -> "AssistantConfig":
        archs = config.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise GgufExactError(
                f"{source}: architectures {archs} is not supported; expected one of {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        text = config.get("text_config", config)
        check_types(config, text, source)

        def need(key: str, where: dict = text, label: str = "text_config."):
            if key not in where or where[key] is None:
                raise GgufExactError(f"{source}: missing {label if where is text else ''}{key}")
            return where[key]

        layer_types = tuple(need("layer_types"))
        if any(t not in ("sliding_attention", "full_attention") for t in layer_types):
            raise GgufExactError(f"{source}: text_config.layer_types has an unknown entry: {list(layer_types)}")
        n_layers = int(need("num_hidden_layers"))
        if len(layer_types) != n_layers:
            raise GgufExactError(
                f"{source}: text_config.layer_types has {len(layer_types)} entries for {n_layers} layers"
            )
        rope = need("rope_parameters")
        full = rope.get("full_attention", rope)
        sliding = rope.get("sliding_attention", {})
        backbone = config.get("backbone_hidden_size", text.get("backbone_hidden_size"))
        if backbone is None:
            raise GgufExactError(f"{source}: missing backbone_hidden_size")
        head_dim = int(need("head_dim"))
        return cls(
            architecture=arch,
            backbone_hidden_size=int(backbone),
            hidden_size=int(need("hidden_size")),
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=n_layers,
            num_attention_heads=int(need("num_attention_heads")),
            num_key_value_heads=int(need("num_key_value_heads")),
            head_dim=head_dim,
            global_head_dim=int(text.get("global_head_dim") or head_dim),
            layer_types=layer_types,
            sliding_window=int(need("sliding_window")),
            vocab_size=int(need("vocab_size")),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(full.get("rope_theta", 1_000_000.0)),
            rope_theta_swa=float(sliding["rope_theta"]) if "rope_theta" in sliding else None,
            partial_rotary_factor_full=float(full.get("partial_rotary_factor", 1.0)),
            # upstream reads the top level of rope_parameters here, so nested configs give 1.0
            partial_rotary_factor_swa=float(rope.get("partial_rotary_factor", 1.0)),
            num_kv_shared_layers=int(text.get("num_kv_shared_layers", 0)),
            context_length=int(text.get("max_position_embeddings", 131072)),
            hidden_size_per_layer_input=int(text.get("hidden_size_per_layer_input") or 0),
            final_logit_softcapping=text.get("final_logit_softcapping"),
        )


def metadata(cfg: AssistantConfig) -> list[Field]:
    """Every ``gemma4-assistant.*`` key, in upstream's order (tokenizer keys aside)."""
    u32, f32, b = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL
    a = ARCH
    fields = [
        Field(f"{a}.block_count", cfg.num_hidden_layers, u32),
        Field(f"{a}.context_length", cfg.context_length, u32),
        Field(f"{a}.embedding_length", cfg.hidden_size, u32),
        Field(f"{a}.feed_forward_length", cfg.intermediate_size, u32),
        Field(f"{a}.attention.head_count", cfg.num_attention_heads, u32),
        Field(f"{a}.attention.head_count_kv", cfg.num_key_value_heads, u32),
        Field(f"{a}.rope.freq_base", cfg.rope_theta, f32),
    ]
    if cfg.rope_theta_swa is not None:
        fields.append(Field(f"{a}.rope.freq_base_swa", cfg.rope_theta_swa, f32))
    fields += [
        Field(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps, f32),
        Field(f"{a}.attention.sliding_window", cfg.sliding_window, u32),
        Field(f"{a}.attention.shared_kv_layers", cfg.num_kv_shared_layers, u32),
        Field(f"{a}.embedding_length_per_layer_input", cfg.hidden_size_per_layer_input, u32),
        Field(
            f"{a}.attention.sliding_window_pattern",
            [t == "sliding_attention" for t in cfg.layer_types],
            GGUFValueType.ARRAY,
            b,
        ),
        Field(f"{a}.attention.key_length", cfg.global_head_dim, u32),
        Field(f"{a}.attention.value_length", cfg.global_head_dim, u32),
        Field(f"{a}.attention.key_length_swa", cfg.head_dim, u32),
        Field(f"{a}.attention.value_length_swa", cfg.head_dim, u32),
        Field(f"{a}.rope.dimension_count", cfg.global_head_dim, u32),
        Field(f"{a}.rope.dimension_count_swa", int(cfg.head_dim * cfg.partial_rotary_factor_swa), u32),
        Field(f"{a}.embedding_length_out", cfg.backbone_hidden_size, u32),
        Field(f"{a}.nextn_predict_layers", cfg.num_hidden_layers, u32),
    ]
    if cfg.final_logit_softcapping:
        fields.append(Field(f"{a}.final_logit_softcapping", float(cfg.final_logit_softcapping), f32))
    return fields


def rope_freqs(cfg: AssistantConfig) -> np.ndarray:
    """Per-dimension frequency factors for the full-attention layers' proportional
    rope: 1.0 on the rotated half-dims, 1e30 (no rotation) on the rest."""
    n_rot = int(cfg.global_head_dim * cfg.partial_rotary_factor_full / 2)
    n_unrot = int(cfg.global_head_dim / 2) - n_rot
    return np.array([1.0] * n_rot + [1e30] * n_unrot, dtype=np.float32)


def expected_shape(gguf_name: str, cfg: AssistantConfig) -> tuple[int, ...] | None:
    """HF (row-major) shape llama.cpp will accept for a mapped tensor, where fixed."""
    n, e, ff = cfg.hidden_size, cfg.backbone_hidden_size, cfg.intermediate_size
    fixed = {
        "token_embd.weight": (cfg.vocab_size, n),
        "output_norm.weight": (n,),
        "nextn.pre_projection.weight": (n, 2 * e),
        "nextn.post_projection.weight": (e, n),
    }
    if gguf_name in fixed:
        return fixed[gguf_name]
    match = re.match(r"^blk\.(\d+)\.(\w+)\.weight$", gguf_name)
    if not match:
        return None
    il, part = int(match.group(1)), match.group(2)
    hd = cfg.head_dim if cfg.layer_types[il] == "sliding_attention" else cfg.global_head_dim
    return {
        "attn_norm": (n,),
        "attn_q": (cfg.num_attention_heads * hd, n),
        "attn_q_norm": (hd,),
        "attn_output": (n, cfg.num_attention_heads * hd),
        "post_attention_norm": (n,),
        "ffn_norm": (n,),
        "ffn_gate": (ff, n),
        "ffn_up": (ff, n),
        "ffn_down": (n, ff),
        "post_ffw_norm": (n,),
        "layer_output_scale": (1,),
    }.get(part)
