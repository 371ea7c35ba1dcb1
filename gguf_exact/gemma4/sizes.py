"""The Gemma 4 sizes and their MTP assistants: real hyperparameters, as data, with sources.

One table (:data:`SIZES`) for E2B, E4B, 26B-A4B and 31B. Each value is what the
model's Hugging Face ``config.json`` says, under the same names (:meth:`TextShape.text_config`
gives that ``text_config``). None of Google's repositories can be reached from here, so
every entry names where its values come from (:data:`SOURCES`); values that no source
readable offline gives are listed in ``unknown`` and are placeholders chosen to keep
the structure, not facts.

The tiny structural fixtures (:mod:`gguf_exact.tiny.structural`) shrink these widths and
keep everything else; the parity check (``make parity``) runs llama.cpp's own converter
on those fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf_exact.gemma4.hparams import FULL, SLIDING

# Where the values come from. The public copies were found by code search over public
# repositories; several independent ones agree on each number quoted from them.
SOURCES = {
    "llama.cpp": "llama.cpp 0c1e57098 src/models/gemma4.cpp load_arch_hparams: n_layer 30 = 26B-A4B, 35 = E2B, "
    "42 = E4B, 60 = 31B",
    "transformers": "transformers 5.24 models/gemma4/configuration_gemma4.py: Gemma4TextConfig defaults (rope: "
    "sliding default theta 1e4, full proportional 0.25 theta 1e6; 5:1 sliding pattern) and the note "
    "'google/gemma-4-26B-A4B-it: num_global_key_value_heads=2'; gemma4_assistant: hidden_size_per_layer_input 0, "
    "no MoE, no double-wide MLP, every layer KV-shared",
    "facts": "the project's facts file (shared/reference/gemma4-mtp-facts.md): E2B/E4B QAT assistant config.json "
    "(google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant at 65c0ada7)",
    "e2b-assistant-config": "google/gemma-4-E2B-it-assistant config.json at 2d874ef7d29f9a30599a1e4b3c1cbc9595f005df, "
    "printed verbatim in a public session log",
    "public-copies": "public third-party code that copies the google/gemma-4-* config.json values "
    "(model loaders, test fixtures); not checked against Google's files",
    "repo-e2b": "gguf_exact/tiny/main_model.py E2B (the full-size benchmark shape this project already uses)",
}


@dataclass(frozen=True)
class TextShape:
    """A Gemma 4 text stack, in ``config.json`` terms."""

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    global_head_dim: int
    sliding_window: int
    full_every: int  # every full_every-th layer is full attention (and always the last)
    num_global_key_value_heads: int | None = None
    attention_k_eq_v: bool = False
    num_kv_shared_layers: int = 0
    hidden_size_per_layer_input: int = 0
    use_double_wide_mlp: bool = False
    num_experts: int | None = None
    top_k_experts: int | None = None
    moe_intermediate_size: int | None = None
    vocab_size: int = 262144
    max_position_embeddings: int = 131072
    final_logit_softcapping: float | None = 30.0
    partial_rotary_factor: float = 0.25  # full-attention layers (proportional rope)

    def layer_types(self) -> list[str]:
        n = self.num_hidden_layers
        return [FULL if (i + 1) % self.full_every == 0 or i == n - 1 else SLIDING for i in range(n)]

    def text_config(self) -> dict:
        """The ``text_config`` of an HF ``config.json`` with these values."""
        text = {
            "model_type": "gemma4_text",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "num_global_key_value_heads": self.num_global_key_value_heads,
            "attention_k_eq_v": self.attention_k_eq_v,
            "head_dim": self.head_dim,
            "global_head_dim": self.global_head_dim,
            "layer_types": self.layer_types(),
            "sliding_window": self.sliding_window,
            "num_kv_shared_layers": self.num_kv_shared_layers,
            "hidden_size_per_layer_input": self.hidden_size_per_layer_input,
            "vocab_size_per_layer_input": self.vocab_size if self.hidden_size_per_layer_input else 0,
            "use_double_wide_mlp": self.use_double_wide_mlp,
            "enable_moe_block": self.num_experts is not None,
            "num_experts": self.num_experts,
            "top_k_experts": self.top_k_experts,
            "moe_intermediate_size": self.moe_intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "final_logit_softcapping": self.final_logit_softcapping,
            "rms_norm_eps": 1e-6,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "rope_parameters": {
                SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                FULL: {
                    "rope_type": "proportional",
                    "rope_theta": 1000000.0,
                    "partial_rotary_factor": self.partial_rotary_factor,
                },
            },
        }
        return text


@dataclass(frozen=True)
class AssistantShape:
    """An MTP assistant (``Gemma4AssistantForCausalLM``): a text stack whose every
    layer reads its target's KV cache, plus the target's width."""

    text: TextShape
    backbone_hidden_size: int
    num_centroids: int = 2048
    centroid_top_k: int = 32  # the E2B/E4B configs' centroid_intermediate_top_k
    ordered_embeddings: bool = True  # E2B/E4B ship the ordered-embedding head; 26B-A4B and 31B do not

    def config(self, architecture: str = "Gemma4AssistantForCausalLM") -> dict:
        """A full HF ``config.json``."""
        text = self.text.text_config() | {
            "vocab_size_per_layer_input": 0,
            "num_kv_shared_layers": self.text.num_hidden_layers,
        }
        return {
            "architectures": [architecture],
            "model_type": "gemma4_assistant",
            "backbone_hidden_size": self.backbone_hidden_size,
            "num_centroids": self.num_centroids,
            "centroid_intermediate_top_k": self.centroid_top_k,
            "use_ordered_embeddings": self.ordered_embeddings,
            "tie_word_embeddings": True,
            "dtype": "bfloat16",
            "text_config": text,
        }


@dataclass(frozen=True)
class Gemma4Size:
    name: str
    target_repo: str
    assistant_repo: str
    target: TextShape
    assistant: AssistantShape
    sources: tuple[str, ...]  # keys of SOURCES
    unknown: tuple[str, ...] = field(default=())  # values no offline source gives (placeholders)


# The assistants share the target's head sizes, sliding window and per-type KV heads:
# their layers attend to the target's last sliding and last full layer's KV cache.
def _assistant(target: TextShape, hidden: int, ffn: int, heads: int, ordered: bool = True) -> AssistantShape:
    text = TextShape(
        num_hidden_layers=4,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_attention_heads=heads,
        num_key_value_heads=target.num_key_value_heads,
        num_global_key_value_heads=target.num_global_key_value_heads,
        attention_k_eq_v=target.attention_k_eq_v,
        head_dim=target.head_dim,
        global_head_dim=target.global_head_dim,
        sliding_window=target.sliding_window,
        full_every=4,  # sliding x3, full
        num_kv_shared_layers=4,
        vocab_size=target.vocab_size,
        max_position_embeddings=target.max_position_embeddings,
        final_logit_softcapping=None,
    )
    return AssistantShape(text, backbone_hidden_size=target.hidden_size, ordered_embeddings=ordered)


E2B_TEXT = TextShape(
    num_hidden_layers=35, hidden_size=1536, intermediate_size=6144, num_attention_heads=8, num_key_value_heads=1,
    head_dim=256, global_head_dim=512, sliding_window=512, full_every=5, num_kv_shared_layers=20,
    hidden_size_per_layer_input=256, use_double_wide_mlp=True,
)  # fmt: skip
E4B_TEXT = TextShape(
    num_hidden_layers=42, hidden_size=2560, intermediate_size=10240, num_attention_heads=8, num_key_value_heads=2,
    head_dim=256, global_head_dim=512, sliding_window=512, full_every=6, num_kv_shared_layers=18,
    hidden_size_per_layer_input=256,
)  # fmt: skip
A4B_TEXT = TextShape(
    num_hidden_layers=30, hidden_size=2816, intermediate_size=2112, num_attention_heads=16, num_key_value_heads=8,
    num_global_key_value_heads=2, attention_k_eq_v=True, head_dim=256, global_head_dim=512, sliding_window=1024,
    full_every=6, num_experts=128, top_k_experts=8, moe_intermediate_size=704, max_position_embeddings=262144,
)  # fmt: skip
B31_TEXT = TextShape(
    num_hidden_layers=60, hidden_size=5376, intermediate_size=21504, num_attention_heads=32, num_key_value_heads=16,
    num_global_key_value_heads=4, attention_k_eq_v=True, head_dim=256, global_head_dim=512, sliding_window=1024,
    full_every=6, max_position_embeddings=262144,
)  # fmt: skip

SIZES: dict[str, Gemma4Size] = {
    s.name: s
    for s in (
        Gemma4Size(
            "E2B",
            "google/gemma-4-E2B-it",
            "google/gemma-4-E2B-it-assistant",
            E2B_TEXT,
            _assistant(E2B_TEXT, hidden=256, ffn=2048, heads=4),
            ("repo-e2b", "public-copies", "llama.cpp", "e2b-assistant-config", "facts", "transformers"),
            unknown=("target final_logit_softcapping (30.0 as the 26B-A4B and 31B copies say)",),
        ),
        Gemma4Size(
            "E4B",
            "google/gemma-4-E4B-it",
            "google/gemma-4-E4B-it-assistant",
            E4B_TEXT,
            _assistant(E4B_TEXT, hidden=256, ffn=2048, heads=4),
            ("public-copies", "llama.cpp", "facts", "transformers"),
            unknown=("target final_logit_softcapping (30.0 as the 26B-A4B and 31B copies say)",),
        ),
        Gemma4Size(
            "26B-A4B",
            "google/gemma-4-26B-A4B-it",
            "google/gemma-4-26B-A4B-it-assistant",
            A4B_TEXT,
            _assistant(A4B_TEXT, hidden=1024, ffn=8192, heads=16, ordered=False),
            ("public-copies", "llama.cpp", "transformers"),
            unknown=(
                "assistant hidden_size (public copies say 1024 and 256)",
                "assistant intermediate_size",
                "assistant num_attention_heads",
            ),
        ),
        Gemma4Size(
            "31B",
            "google/gemma-4-31B-it",
            "google/gemma-4-31B-it-assistant",
            B31_TEXT,
            _assistant(B31_TEXT, hidden=1024, ffn=8192, heads=32, ordered=False),
            ("public-copies", "llama.cpp", "transformers"),
        ),
    )
}
