"""The gemma4-assistant GGUF form: config keys, tensor names, ``rope_freqs``.

Everything llama.cpp's loader (``src/models/gemma4-assistant.cpp`` at 0c1e57098)
needs, as upstream's converter (``conversion/gemma.py``, ``Gemma4AssistantModel``)
writes it, in one table each so that a reader can check them against upstream.
"""

import re
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGUFValueType

from gguf_exact.errors import InputError
from gguf_exact.gemma4.hparams import Field, TextHparams, text_fields
from gguf_exact.gemma4.hparams import rope_freqs as text_rope_freqs

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
# The ordered-embedding head (transformers' Gemma4AssistantMaskedEmbedder), under the names
# llama-arch.cpp gives it (the ordering has no ``.weight``). Kept when the config uses it and
# llama.cpp carries gguf-exact's patch #24; dropped otherwise, as upstream's converter does.
HEAD_TENSORS = {
    "masked_embedding.centroids.weight": "masked_embd_centroids.weight",
    "masked_embedding.token_ordering": "masked_embd_ordering",
}
CENTROIDS, ORDERING = HEAD_TENSORS.values()
ROPE_FREQS = "rope_freqs.weight"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_PREFIX_ALIASES = (("model.language_model.", "model."),)  # Unified checkpoints


def gguf_tensor_name(hf_name: str) -> str:
    """GGUF name for an HF tensor name (the head's too: whether it is kept is the config's call).

    Raises :class:`GgufExactError` for a name with no mapping.
    """
    name = hf_name
    for old, new in _PREFIX_ALIASES:
        if name.startswith(old):
            name = new + name[len(old) :]
    if name in HEAD_TENSORS:
        return HEAD_TENSORS[name]
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    match = _LAYER.match(name)
    if match and match.group(2) in LAYER_TENSORS:
        return f"blk.{int(match.group(1))}.{LAYER_TENSORS[match.group(2)]}.weight"
    raise InputError(f"tensor {hf_name} has no gemma4-assistant mapping")


def tensor_order(gguf_name: str) -> tuple:
    """Stable order for the output: global tensors first, then layer by layer."""
    match = re.match(r"^blk\.(\d+)\.", gguf_name)
    return (1, int(match.group(1)), gguf_name) if match else (0, 0, gguf_name)


# config.json fields read here, with the JSON types they must have.
INT_FIELDS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "global_head_dim", "sliding_window", "vocab_size", "num_kv_shared_layers",
    "max_position_embeddings", "hidden_size_per_layer_input", "backbone_hidden_size",
    "num_centroids", "centroid_intermediate_top_k",
)  # fmt: skip
FLOAT_FIELDS = ("rms_norm_eps", "final_logit_softcapping")


def check_types(config: dict, text: object, source: str) -> None:
    """One line naming the first field of the wrong JSON type (before any arithmetic
    on it would fail with a traceback)."""
    if not isinstance(text, dict):
        raise InputError(f"{source}: text_config is a JSON {type(text).__name__}, not an object")
    for where, label in ((config, ""), (text, "text_config.")):
        for key in INT_FIELDS + FLOAT_FIELDS:
            value = where.get(key)
            ok = isinstance(value, int) or (key in FLOAT_FIELDS and isinstance(value, float))
            if value is not None and (not ok or isinstance(value, bool)):
                kind = "a number" if key in FLOAT_FIELDS else "an integer"
                raise InputError(f"{source}: {label}{key} is {value!r}, expected {kind}")
    for key, json_type in (("layer_types", list), ("rope_parameters", dict)):
        if key in text and not isinstance(text[key], json_type):
            raise InputError(
                f"{source}: text_config.{key} is {text[key]!r}, expected a JSON {'array' if json_type is list else 'object'}"
            )
    if not isinstance(config.get("architectures", []), list):
        raise InputError(f"{source}: architectures is {config['architectures']!r}, expected a JSON array")


@dataclass(frozen=True)
class OrderedHead:
    """The config's ordered-embedding head: ``num_centroids`` clusters of ``vocab / num_centroids``
    tokens each; a step scores the centroids and keeps ``top_k`` clusters' tokens."""

    num_centroids: int
    top_k: int

    @classmethod
    def from_hf(cls, config: dict, vocab_size: int, source: str) -> "OrderedHead | None":
        """None when the config does not use ordered embeddings."""
        if not config.get("use_ordered_embeddings", False):
            return None
        n = config.get("num_centroids")
        k = config.get("centroid_intermediate_top_k", 32)  # transformers' default
        if n is None:
            raise InputError(f"{source}: use_ordered_embeddings is true but num_centroids is missing")
        if n <= 0 or vocab_size % n:
            raise InputError(f"{source}: num_centroids {n} does not divide the vocabulary of {vocab_size} tokens")
        if not 1 <= k <= n:
            raise InputError(f"{source}: centroid_intermediate_top_k {k} is not in 1..{n} (num_centroids)")
        return cls(int(n), int(k))


@dataclass(frozen=True)
class AssistantConfig:
    """The parts of an HF assistant config.json that the GGUF needs. ``head``: the ordered
    embedding head the GGUF carries (None: the full 262,144-row head only)."""

    architecture: str
    backbone_hidden_size: int
    vocab_size: int
    text: TextHparams
    head: OrderedHead | None = None

    def full_head(self) -> "AssistantConfig":
        """The same drafter written without its ordered head (as upstream's converter writes it)."""
        return replace(self, head=None)

    @property
    def candidates(self) -> int:
        """Tokens the head scores per step: ``top_k`` clusters of ``vocab / num_centroids``, or all."""
        return self.vocab_size // self.head.num_centroids * self.head.top_k if self.head else self.vocab_size

    @property
    def num_hidden_layers(self) -> int:
        return self.text.n_layer

    @property
    def hidden_size(self) -> int:
        return self.text.n_embd

    @classmethod
    def from_hf(cls, config: dict, source: str = "config.json") -> "AssistantConfig":
        archs = config.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise InputError(
                f"{source}: architectures {archs} is not supported; expected one of {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        text_config = config.get("text_config", config)
        check_types(config, text_config, source)
        text = TextHparams.from_hf(text_config, source, assistant=True)
        backbone = config.get("backbone_hidden_size", text_config.get("backbone_hidden_size"))
        if backbone is None:
            raise InputError(f"{source}: missing backbone_hidden_size")
        if int(backbone) == text.n_embd:
            # llama.cpp tells the drafter's input width from embedding_length_out != embedding_length
            raise InputError(
                f"{source}: backbone_hidden_size {backbone} equals text_config.hidden_size; "
                "llama.cpp's gemma4-assistant loader refuses a drafter as wide as its target"
            )
        if text_config.get("vocab_size") is None:
            raise InputError(f"{source}: missing text_config.vocab_size")
        vocab = int(text_config["vocab_size"])
        return cls(arch, int(backbone), vocab, text, OrderedHead.from_hf(config, vocab, source))


def metadata(cfg: AssistantConfig) -> list[Field]:
    """Every ``gemma4-assistant.*`` key, in upstream's order (tokenizer keys aside):
    the Gemma 4 text-stack keys (:func:`.hparams.text_fields`), then the drafter's two, then
    the ordered head's two when it is kept (read by patch #24, as the config names them)."""
    u32 = GGUFValueType.UINT32
    head = []
    if cfg.head is not None:
        head = [
            Field(f"{ARCH}.num_centroids", cfg.head.num_centroids, u32),
            Field(f"{ARCH}.centroid_intermediate_top_k", cfg.head.top_k, u32),
        ]
    return text_fields(ARCH, cfg.text) + [
        Field(f"{ARCH}.embedding_length_out", cfg.backbone_hidden_size, u32),
        Field(f"{ARCH}.nextn_predict_layers", cfg.num_hidden_layers, u32),
    ] + head


def rope_freqs(cfg: AssistantConfig) -> np.ndarray:
    """The full-attention layers' ``rope_freqs`` (:func:`.hparams.rope_freqs`)."""
    return text_rope_freqs(cfg.text)


def expected_shape(gguf_name: str, cfg: AssistantConfig) -> tuple[int, ...] | None:
    """HF (row-major) shape llama.cpp's loader (``gemma4-assistant.cpp``
    ``load_arch_tensors``) accepts for a mapped tensor: per layer, the head size of
    its attention type and its own feed-forward width."""
    t = cfg.text
    n, e = t.n_embd, cfg.backbone_hidden_size
    fixed = {
        "token_embd.weight": (cfg.vocab_size, n),
        ORDERING: (cfg.vocab_size,),
        "output_norm.weight": (n,),
        "nextn.pre_projection.weight": (n, 2 * e),
        "nextn.post_projection.weight": (e, n),
    }
    if cfg.head is not None:
        fixed[CENTROIDS] = (cfg.head.num_centroids, n)
    if gguf_name in fixed:
        return fixed[gguf_name]
    match = re.match(r"^blk\.(\d+)\.(\w+)\.weight$", gguf_name)
    if not match:
        return None
    il, part = int(match.group(1)), match.group(2)
    if il >= t.n_layer:
        return None
    hd, ff = t.head_dim(il), t.n_ff[il]
    return {
        "attn_norm": (n,),
        "attn_q": (t.n_head * hd, n),
        "attn_q_norm": (hd,),
        "attn_output": (n, t.n_head * hd),
        "post_attention_norm": (n,),
        "ffn_norm": (n,),
        "ffn_gate": (ff, n),
        "ffn_up": (ff, n),
        "ffn_down": (n, ff),
        "post_ffw_norm": (n,),
        "layer_output_scale": (1,),
    }.get(part)
