"""Gemma 4 main models made on the spot: a QAT checkpoint and a donor GGUF written
the way Google's own QAT GGUFs are, for re-pack tests and benchmarks.

- The checkpoint: ``Gemma4ForConditionalGeneration`` with the HF names
  (``model.language_model.*``), every weight matrix on the QAT grid
  (:func:`gguf_exact.tiny.synthetic.qat_matrix`, fp32 steps), norms near 1, and one
  vision tensor that a text GGUF does not carry.
- The donor: ``gemma4`` GGUF with layer matrices as Q4_0 with llama.cpp's own step
  (``d = max / -8``, gguf-py's ``quants.quantize``), ``token_embd`` and
  ``per_layer_token_embd`` as Q6_K, ``per_layer_model_proj`` as F16, norms F32,
  ``rope_freqs``, hyperparameters, a chat template and a tokenizer.

Both are written in row chunks (:mod:`gguf_exact.formats.safetensors_stream`, :mod:`gguf_exact.formats.gguf_stream`),
so :data:`E2B` at full size (4.6 billion values) fits in little memory. The
:data:`TINY` and :data:`TINY_MOE` shapes load and run in llama.cpp 0c1e57098.
"""

import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, quants

from gguf_exact.core import bf16, q6_k
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import as_f32
from gguf_exact.formats.gguf_layout import TensorEntry, encode_array_kv, encode_kv
from gguf_exact.formats.gguf_stream import pwrite_all, streaming_gguf
from gguf_exact.formats.safetensors_stream import StreamTensor, write_folder
from gguf_exact.gemma4 import names as gemma4_names
from gguf_exact.gemma4.hparams import TextHparams, rope_freqs, text_fields
from gguf_exact.gemma4.sizes import SIZES, TextShape
from gguf_exact.stream.source_rows import RowSource, locate
from gguf_exact.tiny.models import char_vocabulary, vocabulary
from gguf_exact.tiny.synthetic import qat_matrix, random_matrix

T = GGMLQuantizationType
PREFIX = "model.language_model."
MAT, NORM, SCALAR, ROUTER = "matrix", "norm", "scalar", "router"
CHAT_TEMPLATE = "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"


@dataclass(frozen=True)
class MainSpec:
    """The shape of a Gemma 4 text model (:meth:`from_shape` takes it from
    :mod:`gguf_exact.gemma4.sizes`)."""

    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 2
    n_head_kv: int = 1
    n_head_kv_full: int | None = None  # full-attention layers' KV heads (26B-A4B, 31B), with k_eq_v
    k_eq_v: bool = False  # full-attention layers have no V projection (V = K)
    head_dim_swa: int = 64
    head_dim_full: int = 128
    partial_rotary_full: float = 0.25
    n_ff: int = 512
    double_wide: bool = False  # KV-shared layers have a 2 x n_ff MLP (E2B)
    n_kv_shared: int = 0
    n_vocab: int = 320
    n_embd_per_layer: int = 64  # 0: no per-layer embeddings
    sliding_every: int = 4  # every 4th layer (counting from 1) is full attention, and the last
    sliding_window: int = 64
    n_expert: int = 0  # 26B-A4B-like MoE when > 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    context_length: int = 4096
    row_scale: float = 1.0  # benchmarks: rows of every matrix scaled (the model no longer runs)

    @classmethod
    def from_shape(cls, shape: TextShape, **overrides) -> "MainSpec":
        """The spec of a :class:`~gguf_exact.gemma4.sizes.TextShape` (``overrides`` win)."""
        s = shape
        spec = cls(
            n_layer=s.num_hidden_layers, n_embd=s.hidden_size, n_head=s.num_attention_heads,
            n_head_kv=s.num_key_value_heads, n_head_kv_full=s.num_global_key_value_heads, k_eq_v=s.attention_k_eq_v,
            head_dim_swa=s.head_dim, head_dim_full=s.global_head_dim, partial_rotary_full=s.partial_rotary_factor,
            n_ff=s.intermediate_size, double_wide=s.use_double_wide_mlp, n_kv_shared=s.num_kv_shared_layers,
            n_vocab=s.vocab_size, n_embd_per_layer=s.hidden_size_per_layer_input, sliding_every=s.full_every,
            sliding_window=s.sliding_window, n_expert=s.num_experts or 0, n_expert_used=s.top_k_experts or 0,
            n_ff_expert=s.moe_intermediate_size or 0, context_length=s.max_position_embeddings,
        )  # fmt: skip
        return replace(spec, **overrides)

    def shape(self) -> TextShape:
        """The same model as a :class:`~gguf_exact.gemma4.sizes.TextShape` (vocabulary rows scaled)."""
        return TextShape(
            num_hidden_layers=self.n_layer, hidden_size=self.n_embd, intermediate_size=self.n_ff,
            num_attention_heads=self.n_head, num_key_value_heads=self.n_head_kv,
            num_global_key_value_heads=self.n_head_kv_full, attention_k_eq_v=self.k_eq_v,
            head_dim=self.head_dim_swa, global_head_dim=self.head_dim_full, sliding_window=self.sliding_window,
            full_every=self.sliding_every, num_kv_shared_layers=self.n_kv_shared,
            hidden_size_per_layer_input=self.n_embd_per_layer, use_double_wide_mlp=self.double_wide,
            num_experts=self.n_expert or None, top_k_experts=self.n_expert_used or None,
            moe_intermediate_size=self.n_ff_expert or None, vocab_size=_rows(self, self.n_vocab),
            max_position_embeddings=self.context_length, partial_rotary_factor=self.partial_rotary_full,
        )  # fmt: skip

    def is_swa(self, il: int) -> bool:
        return il != self.n_layer - 1 and (il + 1) % self.sliding_every != 0

    def has_kv(self, il: int) -> bool:
        """False for the KV-shared layers, which read an earlier layer's cache."""
        return il < self.n_layer - self.n_kv_shared

    def n_ff_layer(self, il: int) -> int:
        return 2 * self.n_ff if self.double_wide and not self.has_kv(il) else self.n_ff

    def n_kv_layer(self, il: int) -> int:
        if self.k_eq_v and self.n_head_kv_full and not self.is_swa(il):
            return self.n_head_kv_full
        return self.n_head_kv

    def has_v(self, il: int) -> bool:
        return self.has_kv(il) and not (self.k_eq_v and not self.is_swa(il))


# E2B in miniature: per-layer embeddings, the last 4 of 8 layers sharing KV (no K/V
# projections) with a double-wide MLP; the per-layer table is 8 x 32 = 256 wide (Q6_K rows).
TINY = MainSpec(n_layer=8, n_embd_per_layer=32, n_kv_shared=4, double_wide=True)
TINY_MOE = MainSpec(n_layer=4, n_embd=256, n_ff=256, n_embd_per_layer=0, n_expert=4, n_expert_used=2, n_ff_expert=128)
# Gemma 4 E2B's text model at full size (gemma4/sizes.py): 35 layers of width 1536 (4 sliding +
# 1 full), 8 heads, one KV head, head dims 256 / 512, MLP 6144 (12288 in the 20 KV-shared
# layers, which have no K/V projections), per-layer embeddings of 256: 4.63 billion matrix values.
E2B = MainSpec.from_shape(SIZES["E2B"].target)


@dataclass(frozen=True)
class ModelTensor:
    hf_name: str
    gguf_name: str
    shape: tuple[int, ...]  # HF row-major
    what: str  # matrix, norm, scalar, router
    donor_type: GGMLQuantizationType
    part: tuple[int, int, int] | None = None  # rows of each expert taken from the HF tensor, see RowSource


def _rows(spec: MainSpec, n: int) -> int:
    return max(1, round(n * spec.row_scale))


def model_tensors(spec: MainSpec = TINY, split_experts: bool = False) -> list[ModelTensor]:
    """Every text-model tensor, in the donor's order, with the donor's type.

    ``split_experts``: the donor stores ``ffn_gate_exps`` and ``ffn_up_exps``
    (halves of HF's fused ``experts.gate_up_proj``) instead of ``ffn_gate_up_exps``.
    """
    s, E, pl = spec, spec.n_embd, spec.n_embd_per_layer
    vocab = _rows(s, s.n_vocab)
    out = [ModelTensor(PREFIX + "embed_tokens.weight", "token_embd.weight", (vocab, E), MAT, T.Q6_K)]
    if pl:
        out += [
            ModelTensor(
                PREFIX + "embed_tokens_per_layer.weight",
                "per_layer_token_embd.weight",
                (vocab, pl * s.n_layer),
                MAT,
                T.Q6_K,
            ),
            ModelTensor(
                PREFIX + "per_layer_model_projection.weight",
                "per_layer_model_proj.weight",
                (_rows(s, pl * s.n_layer), E),
                MAT,
                T.F16,
            ),
            ModelTensor(PREFIX + "per_layer_projection_norm.weight", "per_layer_proj_norm.weight", (pl,), NORM, T.F32),
        ]
    out.append(ModelTensor(PREFIX + "norm.weight", "output_norm.weight", (E,), NORM, T.F32))
    for il in range(s.n_layer):
        hd = s.head_dim_swa if s.is_swa(il) else s.head_dim_full
        ff = s.n_ff_layer(il)
        p, b = f"{PREFIX}layers.{il}.", f"blk.{il}."

        def t(hf, gguf, shape, what, qtype=None, p=p, b=b):
            if what in (MAT, ROUTER):
                shape = (
                    (_rows(s, shape[0]), *shape[1:]) if len(shape) == 2 else (shape[0], _rows(s, shape[1]), shape[2])
                )
            out.append(ModelTensor(p + hf, b + gguf, shape, what, qtype or (T.Q4_0 if what == MAT else T.F32)))

        t("input_layernorm.weight", "attn_norm.weight", (E,), NORM)
        t("self_attn.q_proj.weight", "attn_q.weight", (s.n_head * hd, E), MAT)
        kv_rows = s.n_kv_layer(il) * hd
        if s.has_kv(il):  # KV-shared layers read an earlier layer's cache
            t("self_attn.k_proj.weight", "attn_k.weight", (kv_rows, E), MAT)
        if s.has_v(il):  # with attention_k_eq_v, full layers use K as V
            t("self_attn.v_proj.weight", "attn_v.weight", (kv_rows, E), MAT)
        t("self_attn.o_proj.weight", "attn_output.weight", (E, s.n_head * hd), MAT)
        t("self_attn.q_norm.weight", "attn_q_norm.weight", (hd,), NORM)
        if s.has_kv(il):
            t("self_attn.k_norm.weight", "attn_k_norm.weight", (hd,), NORM)
        t("post_attention_layernorm.weight", "post_attention_norm.weight", (E,), NORM)
        t("pre_feedforward_layernorm.weight", "ffn_norm.weight", (E,), NORM)
        t("mlp.gate_proj.weight", "ffn_gate.weight", (ff, E), MAT)
        t("mlp.up_proj.weight", "ffn_up.weight", (ff, E), MAT)
        t("mlp.down_proj.weight", "ffn_down.weight", (E, ff), MAT)
        t("post_feedforward_layernorm.weight", "post_ffw_norm.weight", (E,), NORM)
        if s.n_expert:
            t("router.proj.weight", "ffn_gate_inp.weight", (s.n_expert, E), ROUTER)
            t("router.scale", "ffn_gate_inp.scale", (E,), NORM)
            t("router.per_expert_scale", "ffn_down_exps.scale", (s.n_expert,), NORM)
            if split_experts:
                for half, name in enumerate(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
                    part = (half * s.n_ff_expert, s.n_ff_expert, 2 * s.n_ff_expert)
                    out.append(
                        ModelTensor(
                            p + "experts.gate_up_proj", b + name, (s.n_expert, s.n_ff_expert, E), MAT, T.Q4_0, part
                        )
                    )
            else:
                t("experts.gate_up_proj", "ffn_gate_up_exps.weight", (s.n_expert, 2 * s.n_ff_expert, E), MAT)
            t("experts.down_proj", "ffn_down_exps.weight", (s.n_expert, E, s.n_ff_expert), MAT)
            t("pre_feedforward_layernorm_2.weight", "pre_ffw_norm_2.weight", (E,), NORM)
            t("post_feedforward_layernorm_1.weight", "post_ffw_norm_1.weight", (E,), NORM)
            t("post_feedforward_layernorm_2.weight", "post_ffw_norm_2.weight", (E,), NORM)
        if pl:
            t("per_layer_input_gate.weight", "inp_gate.weight", (pl, E), MAT)
            t("per_layer_projection.weight", "proj.weight", (E, pl), MAT)
            t("post_per_layer_input_norm.weight", "post_norm.weight", (E,), NORM)
        t("layer_scalar", "layer_output_scale.weight", (1,), SCALAR)
    return out


def hf_config(spec: MainSpec = TINY) -> dict:
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "dtype": "bfloat16",
        "text_config": spec.shape().text_config(),
    }


def _seed(seed: int, name: str, r0: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode()), r0])


def source_fill(t: ModelTensor, seed: int, step_kind: str = "fp32", scale: float = 0.02):
    """Rows [r0, r1) of a tensor's source values (bf16 bits), seeded per chunk; a matrix's
    values on the QAT grid at ``scale`` (:func:`~gguf_exact.tiny.synthetic.qat_matrix`)."""
    cols = t.shape[-1]
    per_row = int(np.prod(t.shape[1:-1], dtype=np.int64)) if len(t.shape) > 2 else 1

    def fill(r0: int, r1: int) -> np.ndarray:
        rng = _seed(seed, t.hf_name, r0)
        n = (r1 - r0) * per_row
        if t.what == MAT:
            values = qat_matrix(rng, n, cols, scale=scale, step_kind=step_kind, zero_fraction=0.01)
            return values.reshape(r1 - r0, *t.shape[1:])
        if t.what == ROUTER:
            return random_matrix(rng, n, cols).reshape(r1 - r0, *t.shape[1:])
        if t.what == SCALAR:
            return bf16.from_f32(np.ones(t.shape, dtype=np.float32))
        shape = (r1 - r0, *t.shape[1:])
        return bf16.from_f32((1.0 + rng.normal(0.0, 0.05, shape)).astype(np.float32))

    return fill


# The token embedding's QAT scale that makes the next-token distribution peaked, as a trained
# model's is: the tied head's logits then spread over several units (before the soft cap)
# instead of a fraction of one, where every token is about as likely as any other.
PEAKED_EMBED_SCALE = 0.3


def write_main_checkpoint(
    folder: str | Path,
    spec: MainSpec = TINY,
    seed: int = 0,
    step_kind: str = "fp32",
    shards: int = 1,
    embed_scale: float | None = None,
) -> Path:
    """A QAT ``Gemma4ForConditionalGeneration`` folder, written in row chunks;
    ``embed_scale``: ``embed_tokens``' QAT scale (default that of every matrix, 0.02;
    :data:`PEAKED_EMBED_SCALE` for a peaked next-token distribution)."""

    def fill(t: ModelTensor):
        if embed_scale is not None and t.gguf_name == "token_embd.weight":
            return source_fill(t, seed, step_kind, scale=embed_scale)
        return source_fill(t, seed, step_kind)

    stream = [StreamTensor(t.hf_name, t.shape, "BF16", fill(t)) for t in model_tensors(spec)]
    vision = "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight"  # not part of the text GGUF
    stream.append(
        StreamTensor(vision, (64, 64), "BF16", lambda r0, r1: random_matrix(_seed(seed, vision, r0), r1 - r0, 64))
    )
    return write_folder(folder, hf_config(spec), sorted(stream, key=lambda t: t.name), shards)


def donor_kv(spec: MainSpec = TINY, file_type: int = 2, char_tokens: bool = False) -> list[bytes]:
    """The donor's key/value pairs, raw, as Google's GGUFs carry them; ``char_tokens``:
    one character per token (:func:`~gguf_exact.tiny.models.char_vocabulary`)."""
    s, a = spec, gemma4_names.ARCH
    u32, f32, string = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING
    kv = [
        encode_kv("general.architecture", string, a),
        encode_kv("general.name", string, "gemma-4-tiny-it-qat"),
        encode_kv("general.file_type", u32, file_type),
        encode_kv("general.quantization_version", u32, 2),
    ]
    # the hyperparameters exactly as llama.cpp's converter writes them (per-layer arrays included)
    for f in text_fields(a, TextHparams.from_hf(hf_config(s)["text_config"])):
        kv.append(
            encode_array_kv(f.key, f.sub_type, f.value)
            if f.sub_type is not None
            else encode_kv(f.key, f.vtype, f.value)
        )
    tokens, scores, types = (char_vocabulary if char_tokens else vocabulary)(_rows(s, s.n_vocab))
    kv += [
        encode_kv("tokenizer.ggml.model", string, "llama"),
        encode_array_kv("tokenizer.ggml.tokens", string, tokens),
        encode_array_kv("tokenizer.ggml.scores", f32, scores),
        encode_array_kv("tokenizer.ggml.token_type", GGUFValueType.INT32, types),
        encode_kv("tokenizer.ggml.unknown_token_id", u32, 0),
        encode_kv("tokenizer.ggml.bos_token_id", u32, 1),
        encode_kv("tokenizer.ggml.eos_token_id", u32, 2),
        encode_kv("tokenizer.ggml.add_bos_token", GGUFValueType.BOOL, True),
        encode_kv("tokenizer.ggml.add_eos_token", GGUFValueType.BOOL, False),
        encode_kv("tokenizer.chat_template", string, CHAT_TEMPLATE),
    ]
    return kv


def donor_bytes(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """float32 rows in the donor's type, as Google's pipeline stores them."""
    if qtype == T.Q6_K:
        return q6_k.quantize(values)
    if qtype in (T.Q4_0, T.Q8_0):
        return quants.quantize(values, qtype)  # d = max / -8 for Q4_0
    if qtype == T.F16:
        return values.astype(np.float16).view(np.uint8)
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint8)


def write_donor(
    path: str | Path,
    source: str | Path,
    spec: MainSpec = TINY,
    types: dict[str, GGMLQuantizationType] | None = None,
    split_experts: bool = False,
    chunk_values: int = 1 << 20,
    char_tokens: bool = False,
) -> Path:
    """A Google-style ``gemma4`` GGUF made from the checkpoint at ``source``.

    ``types`` overrides the donor type of GGUF names (tests: an F32 reference, ...);
    ``char_tokens``: its vocabulary one character per token (:func:`donor_kv`).
    """
    path = Path(path)
    tensors = [
        replace(t, donor_type=(types or {}).get(t.gguf_name, t.donor_type)) for t in model_tensors(spec, split_experts)
    ]
    with Checkpoint(source) as ckpt:
        locations = locate(ckpt)
    rope = rope_freqs(TextHparams.from_hf(hf_config(spec)["text_config"]))
    entries = [TensorEntry(t.gguf_name, tuple(reversed(t.shape)), t.donor_type) for t in tensors]
    entries.insert(1, TensorEntry("rope_freqs.weight", (rope.size,), T.F32))
    kv = donor_kv(spec, char_tokens=char_tokens)
    with streaming_gguf(path, 3, kv, entries, 32) as writer:
        for entry in entries:
            offset = writer.place(entry)
            if entry.name == "rope_freqs.weight":
                pwrite_all(writer.fd, rope.view(np.uint8), offset)
                continue
            t = next(x for x in tensors if x.gguf_name == entry.name)
            src = RowSource(locations[t.hf_name], t.part)
            rows, cols = src.shape
            step = max(1, chunk_values // cols)
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                raw = donor_bytes(as_f32(src.read(r0, r1)), entry.type)
                pwrite_all(writer.fd, raw, offset + r0 * raw.shape[1])
        writer.finish(kv)
    return path
