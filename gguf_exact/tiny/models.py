"""Tiny Gemma 4 models made on the spot: a ``gemma4`` target GGUF and a QAT
``Gemma4AssistantForCausalLM`` checkpoint that llama.cpp 0c1e57098 runs together.

Shapes follow the pair known to load in llama.cpp (see the facts file): a 5-layer
target (4 sliding + 1 full, width 128, 2 heads, 1 KV head, head dims 64 sliding /
128 full with partial rotary 0.25), and a 4-layer drafter (width 64, backbone 128)
that reads the target's last two layers' KV. The vocabulary is llama-style: 3
specials, 256 byte tokens and filler pieces, 320 tokens.
"""

import json
from dataclasses import dataclass, replace
from pathlib import Path

import ml_dtypes  # noqa: F401  (bfloat16 dtype for safetensors)
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType, quants
from safetensors.numpy import save_file

from gguf_exact.core import bf16
from gguf_exact.formats.safe_write import atomic_output, output_folder, write_text
from gguf_exact.gemma4.hparams import SLIDING
from gguf_exact.gemma4.names import ARCH as TARGET_ARCH
from gguf_exact.gemma4.sizes import AssistantShape, TextShape
from gguf_exact.tiny.ordered_head import consistent_head
from gguf_exact.tiny.synthetic import norm_vector, qat_matrix, random_matrix

# Gemma-style turns (as Gemma's own template lays them out, without its system-prompt and tool
# handling), so chat through llama-cpp-python's Jinja formatter is exercised on the tiny targets.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

FILLER = ["▁", "▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁it", "▁on", "th", "he", "in", "er", "an"]
FILLER += [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
FILLER += ["▁def", "▁return", "▁x", "(", ")", ":", ",", ".", "=", "+", "▁print", "▁if", "▁for", "▁1", "▁0"]


FILE_TYPES = {GGMLQuantizationType.F32: 0, GGMLQuantizationType.Q4_0: 2}
"""The tiny target's matrix types, with llama.cpp's ``general.file_type`` (ALL_F32, MOSTLY_Q4_0)."""


@dataclass(frozen=True)
class TinyTarget:
    n_layer: int = 5
    n_embd: int = 128
    n_head: int = 2
    n_head_kv: int = 1
    head_dim_swa: int = 64
    head_dim_full: int = 128
    partial_rotary_full: float = 0.25
    n_ff: int = 256
    n_vocab: int = 320
    sliding_window: int = 64
    context_length: int = 4096


def vocabulary(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    filler = FILLER + [f"▁w{i}" for i in range(max(0, n_vocab))]
    tokens += filler[: n_vocab - len(tokens)]
    types += [TokenType.NORMAL] * (n_vocab - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)]
    return tokens, scores, [int(t) for t in types]


# Single code points from plane 1 up (no surrogates, no noncharacters U+xFFFE/U+xFFFF):
# every token of char_vocabulary is one character, so no two tokens concatenate to a third.
FIRST_CHAR = 0x10000


def char_vocabulary(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """:func:`vocabulary`'s specials and byte tokens, then one token per character (``▁``
    first): llama.cpp's SPM tokenizer merges no pair of them, so any text of these
    characters is one token per character and a detokenized token sequence tokenizes
    back to itself (what a benchmark that generates its text from the model needs)."""
    tokens, _, types = vocabulary(259)
    chars = ["▁"]
    cp = FIRST_CHAR
    while len(tokens) + len(chars) < n_vocab:
        if cp & 0xFFFE != 0xFFFE:
            chars.append(chr(cp))
        cp += 1
    tokens += chars
    types += [int(TokenType.NORMAL)] * len(chars)
    return tokens, [0.0] * len(tokens), types


def write_hf_tokenizer(folder: str | Path, n_vocab: int) -> Path:
    """The same vocabulary as an HF fast tokenizer in ``folder``: ``tokenizer.json``
    (BPE with byte fallback and a ``Sequence`` decoder, the form llama.cpp's converter
    reads with ``LlamaHfVocab``) and ``tokenizer_config.json``. The tokenizer format is
    plain JSON, written here so that the base install needs no ``tokenizers``."""
    folder = Path(folder)
    tokens, _, _ = vocabulary(n_vocab)
    specials = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
        for i in range(3)
    ]
    tokenizer: dict[str, object] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [],
        },
    }
    write_text(folder / "tokenizer.json", json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
    }
    write_text(folder / "tokenizer_config.json", json.dumps(config, indent=1) + "\n")
    return folder / "tokenizer.json"


def write_tiny_target(
    path: str | Path,
    seed: int = 0,
    spec: TinyTarget = TinyTarget(),
    with_tokenizer: bool = True,
    matrix_type: GGMLQuantizationType = GGMLQuantizationType.F32,
) -> Path:
    """A random-weight ``gemma4`` GGUF at ``path``: F32 throughout, or its 2-D matrices in
    ``matrix_type`` (``Q4_0``: what reaches ggml's quantized matmul kernels)."""
    rng = np.random.default_rng(seed)
    path = Path(path)
    s = spec
    a = TARGET_ARCH
    w = GGUFWriter(path, a)
    pattern = [i < s.n_layer - 1 for i in range(s.n_layer)]  # all sliding but the last
    w.add_uint32(f"{a}.block_count", s.n_layer)
    w.add_uint32(f"{a}.context_length", s.context_length)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_uint32(f"{a}.feed_forward_length", s.n_ff)
    w.add_uint32(f"{a}.attention.head_count", s.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_float32(f"{a}.rope.freq_base", 1_000_000.0)
    w.add_float32(f"{a}.rope.freq_base_swa", 10_000.0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.attention.sliding_window", s.sliding_window)
    w.add_uint32(f"{a}.attention.shared_kv_layers", 0)
    w.add_uint32(f"{a}.embedding_length_per_layer_input", 0)
    w.add_array(f"{a}.attention.sliding_window_pattern", pattern)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim_full)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim_full)
    w.add_uint32(f"{a}.attention.key_length_swa", s.head_dim_swa)
    w.add_uint32(f"{a}.attention.value_length_swa", s.head_dim_swa)
    w.add_uint32(f"{a}.rope.dimension_count", s.head_dim_full)
    w.add_uint32(f"{a}.rope.dimension_count_swa", s.head_dim_swa)
    w.add_uint32("general.file_type", FILE_TYPES[matrix_type])
    if with_tokenizer:
        tokens, scores, types = vocabulary(s.n_vocab)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_chat_template(CHAT_TEMPLATE)

    def t(name, *shape, scale=0.05):
        values = rng.normal(0, scale, shape).astype(np.float32)
        if matrix_type == GGMLQuantizationType.F32:
            w.add_tensor(name, values)
        else:
            w.add_tensor(name, quants.quantize(values, matrix_type), raw_dtype=matrix_type)

    def norm(name, n):
        w.add_tensor(name, (1.0 + rng.normal(0, 0.05, n)).astype(np.float32))

    t("token_embd.weight", s.n_vocab, s.n_embd, scale=0.5)
    norm("output_norm.weight", s.n_embd)
    n_rot = int(s.head_dim_full * s.partial_rotary_full / 2)
    freqs = np.array([1.0] * n_rot + [1e30] * (s.head_dim_full // 2 - n_rot), dtype=np.float32)
    w.add_tensor("rope_freqs.weight", freqs)
    for il in range(s.n_layer):
        hd = s.head_dim_swa if pattern[il] else s.head_dim_full
        b = f"blk.{il}"
        norm(f"{b}.attn_norm.weight", s.n_embd)
        t(f"{b}.attn_q.weight", s.n_head * hd, s.n_embd)
        t(f"{b}.attn_k.weight", s.n_head_kv * hd, s.n_embd)
        t(f"{b}.attn_v.weight", s.n_head_kv * hd, s.n_embd)
        t(f"{b}.attn_output.weight", s.n_embd, s.n_head * hd)
        norm(f"{b}.attn_q_norm.weight", hd)
        norm(f"{b}.attn_k_norm.weight", hd)
        norm(f"{b}.post_attention_norm.weight", s.n_embd)
        w.add_tensor(f"{b}.layer_output_scale.weight", np.array([1.0], dtype=np.float32))
        norm(f"{b}.ffn_norm.weight", s.n_embd)
        t(f"{b}.ffn_gate.weight", s.n_ff, s.n_embd)
        t(f"{b}.ffn_up.weight", s.n_ff, s.n_embd)
        t(f"{b}.ffn_down.weight", s.n_embd, s.n_ff)
        norm(f"{b}.post_ffw_norm.weight", s.n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@dataclass(frozen=True)
class TinyDrafter:
    hidden_size: int = 64
    backbone_hidden_size: int = 128  # = the tiny target's width
    intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 2
    num_key_value_heads: int = 1  # the target's sliding layers'
    head_dim: int = 64  # = the target's sliding head dim
    global_head_dim: int = 128  # = the target's full head dim
    vocab_size: int = 320
    num_centroids: int = 32
    centroid_top_k: int = 4  # 4 clusters of 10 tokens: 40 candidates of 320, so the ordered head matters
    ordered_embeddings: bool = True
    architecture: str = "Gemma4AssistantForCausalLM"
    num_global_key_value_heads: int | None = None  # the target's full layers' (with attention_k_eq_v)
    attention_k_eq_v: bool = False
    sliding_window: int = 64
    max_position_embeddings: int = 4096

    @classmethod
    def from_shape(cls, shape: AssistantShape, **overrides) -> "TinyDrafter":
        t = shape.text
        spec = cls(
            hidden_size=t.hidden_size, backbone_hidden_size=shape.backbone_hidden_size,
            intermediate_size=t.intermediate_size, num_hidden_layers=t.num_hidden_layers,
            num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
            head_dim=t.head_dim, global_head_dim=t.global_head_dim, vocab_size=t.vocab_size,
            num_centroids=shape.num_centroids, centroid_top_k=shape.centroid_top_k,
            ordered_embeddings=shape.ordered_embeddings,
            num_global_key_value_heads=t.num_global_key_value_heads,
            attention_k_eq_v=t.attention_k_eq_v, sliding_window=t.sliding_window,
            max_position_embeddings=t.max_position_embeddings,
        )  # fmt: skip
        return replace(spec, **overrides)

    def shape(self) -> AssistantShape:
        """The assistant in :mod:`gguf_exact.gemma4.sizes` terms: sliding layers, then one full."""
        text = TextShape(
            num_hidden_layers=self.num_hidden_layers, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, num_global_key_value_heads=self.num_global_key_value_heads,
            attention_k_eq_v=self.attention_k_eq_v, head_dim=self.head_dim, global_head_dim=self.global_head_dim,
            sliding_window=self.sliding_window, full_every=self.num_hidden_layers,
            num_kv_shared_layers=self.num_hidden_layers, vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings, final_logit_softcapping=None,
        )  # fmt: skip
        return AssistantShape(
            text, self.backbone_hidden_size, self.num_centroids, self.centroid_top_k, self.ordered_embeddings
        )


def drafter_config(spec: TinyDrafter = TinyDrafter()) -> dict:
    return spec.shape().config(spec.architecture)


def drafter_tensors(
    spec: TinyDrafter = TinyDrafter(), seed: int = 0, step_kind: str = "fp32", zero_fraction: float = 0.02
) -> dict[str, np.ndarray]:
    """HF-named tensors of a tiny QAT drafter: bf16 bits (uint16) plus I64 ordering."""
    rng = np.random.default_rng(seed)
    s = spec

    def qat(rows, cols):
        return qat_matrix(rng, rows, cols, step_kind=step_kind, zero_fraction=zero_fraction)

    t: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": qat(s.vocab_size, s.hidden_size),
        "model.norm.weight": norm_vector(rng, s.hidden_size),
        "pre_projection.weight": qat(s.hidden_size, 2 * s.backbone_hidden_size),
        "post_projection.weight": qat(s.backbone_hidden_size, s.hidden_size),
        "masked_embedding.centroids.weight": random_matrix(rng, s.num_centroids, s.hidden_size),
        "masked_embedding.token_ordering": rng.permutation(s.vocab_size).astype(np.int64),
    }
    for il, kind in enumerate(s.shape().text.layer_types()):
        hd = s.head_dim if kind == SLIDING else s.global_head_dim
        p = f"model.layers.{il}."
        t[p + "input_layernorm.weight"] = norm_vector(rng, s.hidden_size)
        t[p + "self_attn.q_proj.weight"] = qat(s.num_attention_heads * hd, s.hidden_size)
        t[p + "self_attn.q_norm.weight"] = norm_vector(rng, hd)
        t[p + "self_attn.o_proj.weight"] = qat(s.hidden_size, s.num_attention_heads * hd)
        t[p + "post_attention_layernorm.weight"] = norm_vector(rng, s.hidden_size)
        t[p + "pre_feedforward_layernorm.weight"] = norm_vector(rng, s.hidden_size)
        t[p + "mlp.gate_proj.weight"] = qat(s.intermediate_size, s.hidden_size)
        t[p + "mlp.up_proj.weight"] = qat(s.intermediate_size, s.hidden_size)
        t[p + "mlp.down_proj.weight"] = qat(s.hidden_size, s.intermediate_size)
        t[p + "post_feedforward_layernorm.weight"] = norm_vector(rng, s.hidden_size)
        t[p + "layer_scalar"] = bf16.from_f32(np.array([0.5 + 0.1 * il], dtype=np.float32))
    return t


def write_checkpoint(folder: str | Path, config: dict, tensors: dict[str, np.ndarray], shards: int = 1) -> Path:
    """Write an HF folder: config.json and safetensors (uint16 arrays stored as BF16),
    sharded with an index file when ``shards`` > 1."""
    folder = Path(folder)
    output_folder(folder)
    write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")
    as_st = {k: (v.view(ml_dtypes.bfloat16) if v.dtype == np.uint16 else v) for k, v in tensors.items()}
    if shards <= 1:
        with atomic_output(folder / "model.safetensors") as tmp:
            save_file(as_st, str(tmp), metadata={"format": "pt"})
        return folder
    names = sorted(as_st)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        with atomic_output(folder / file) as tmp:
            save_file({k: as_st[k] for k in part}, str(tmp), metadata={"format": "pt"})
        weight_map |= {k: file for k in part}
    write_text(
        folder / "model.safetensors.index.json", json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2)
    )
    return folder


def write_tiny_drafter(
    folder: str | Path, seed: int = 0, step_kind: str = "fp32", shards: int = 1, spec: TinyDrafter = TinyDrafter()
) -> Path:
    """A tiny QAT assistant checkpoint in the real HF layout."""
    return write_checkpoint(folder, drafter_config(spec), drafter_tensors(spec, seed, step_kind), shards)


def snap_to_grid(values: np.ndarray) -> np.ndarray:
    """bf16 bits of ``values`` moved onto the QAT 4-bit grid: per block of 32 along a
    row, step = amax / 8 signed so the extreme value is level -8 (as Q4_0 does; a
    plain amax / 8 can give both -8 and +8, 17 levels), levels rint(x / step)
    clipped to -8..7, value bf16(level * step)."""
    x = np.asarray(values, dtype=np.float32)
    blocks = x.reshape(-1, 32)
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    step = extreme / -8
    levels = np.clip(np.rint(np.divide(blocks, step, out=np.zeros_like(blocks), where=step != 0)), -8, 7)
    return bf16.from_f32((levels * step).astype(np.float32)).reshape(x.shape)


def pass_through_layers(tensors: dict[str, np.ndarray], n_layers: int) -> None:
    """Make a drafter's layers pass their input through: zero attention and MLP outputs,
    every norm and ``layer_scalar`` 1.0, so what it predicts is set by its projections and
    tied embedding alone (the tiny agreeing and hidden-state pairs)."""
    one = bf16.from_f32(np.ones(1, dtype=np.float32))[0]
    for il in range(n_layers):
        pfx = f"model.layers.{il}."
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            tensors[pfx + name] = np.zeros_like(tensors[pfx + name])
        for name in (
            "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
            "post_feedforward_layernorm", "self_attn.q_norm",
        ):  # fmt: skip
            tensors[pfx + name + ".weight"] = np.full_like(tensors[pfx + name + ".weight"], one)
        tensors[pfx + "layer_scalar"] = np.full_like(tensors[pfx + "layer_scalar"], one)


def write_agreeing_pair(folder: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """A tiny target and a drafter that agrees with it: (target.gguf, drafter HF folder).

    The target's greedy output repeats the last token: its ``attn_output`` and
    ``ffn_down`` weights are zero, so the final hidden state is the RMS-normed
    (scaled) input embedding, and with tied output and random rows of width 128 the
    token's dot product with itself dominates the 320 logits.

    The drafter predicts its input token: ``pre_projection`` = [P | 0] (P a random
    64x128 grid matrix on the target-embedding half, zero on the hidden-state half),
    zero ``o_proj`` and ``down_proj``, norms and ``layer_scalar`` 1.0, and a tied
    embedding whose row j is P times the target's row j, snapped onto the grid.
    Both then say "the same token again", so every draft is accepted.
    """
    from gguf import GGUFReader

    folder = Path(folder)
    output_folder(folder)
    target = write_tiny_target(folder / "target.gguf", seed=seed)
    reader = GGUFReader(target, "r+")
    embd = None
    for t in reader.tensors:
        if t.name.endswith((".attn_output.weight", ".ffn_down.weight")):
            t.data[...] = 0  # written through the memory map
        elif t.name == "token_embd.weight":
            embd = np.array(t.data, dtype=np.float32)  # (n_vocab, n_embd)
    reader.data.flush()
    del reader
    assert embd is not None

    spec = TinyDrafter()
    rng = np.random.default_rng(seed + 1000)
    p = bf16.to_f32(qat_matrix(rng, spec.hidden_size, spec.backbone_hidden_size, scale=0.1))
    pre = np.zeros((spec.hidden_size, 2 * spec.backbone_hidden_size), dtype=np.uint16)
    pre[:, : spec.backbone_hidden_size] = bf16.from_f32(p)
    ones = bf16.from_f32(np.ones(spec.hidden_size, dtype=np.float32))
    tensors = drafter_tensors(spec, seed=seed)
    tensors["pre_projection.weight"] = pre
    tensors["model.embed_tokens.weight"] = snap_to_grid(embd @ p.T)  # row j = P e_j
    tensors["model.norm.weight"] = ones
    pass_through_layers(tensors, spec.num_hidden_layers)
    # its hidden state for token j points along P e_j (the pass-through layers, then the norm)
    consistent_head(tensors, spec.num_centroids, spec.centroid_top_k, hidden=embd @ p.T)
    drafter = write_checkpoint(folder / "drafter-hf", drafter_config(spec), tensors)
    return target, drafter
