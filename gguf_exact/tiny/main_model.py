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
from gguf_exact.formats.gguf_stream import StreamingGGUF, pwrite_all
from gguf_exact.formats.safetensors_stream import StreamTensor, write_folder
from gguf_exact.stream.source_rows import RowSource, locate
from gguf_exact.tiny.models import vocabulary
from gguf_exact.tiny.synthetic import qat_matrix, random_matrix

T = GGMLQuantizationType
PREFIX = "model.language_model."
MAT, NORM, SCALAR, ROUTER = "matrix", "norm", "scalar", "router"
CHAT_TEMPLATE = "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"


@dataclass(frozen=True)
class MainSpec:
    """The shape of a Gemma 4 text model."""

    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 2
    n_head_kv: int = 1
    head_dim_swa: int = 64
    head_dim_full: int = 128
    partial_rotary_full: float = 0.25
    n_ff: int = 512
    n_ff_shared: int | None = None  # feed-forward width of KV-shared layers (double-wide MLP)
    n_kv_shared: int = 0
    n_vocab: int = 320
    n_embd_per_layer: int = 64  # 0: no per-layer embeddings
    sliding_every: int = 4  # every 4th layer (counting from 1) is full attention, and the last
    sliding_window: int = 64
    n_expert: int = 0  # 26B-A4B-like MoE when > 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    row_scale: float = 1.0  # benchmarks: rows of every matrix scaled (the model no longer runs)

    def is_swa(self, il: int) -> bool:
        return il != self.n_layer - 1 and (il + 1) % self.sliding_every != 0

    def n_ff_layer(self, il: int) -> int:
        shared = il >= self.n_layer - self.n_kv_shared
        return self.n_ff_shared if shared and self.n_ff_shared else self.n_ff


# E2B in miniature: per-layer embeddings, the last 4 of 8 layers sharing KV (no K/V
# projections) with a double-wide MLP; the per-layer table is 8 x 32 = 256 wide (Q6_K rows).
TINY = MainSpec(n_layer=8, n_embd_per_layer=32, n_kv_shared=4, n_ff_shared=1024)
TINY_MOE = MainSpec(n_layer=4, n_embd=256, n_ff=256, n_embd_per_layer=0, n_expert=4, n_expert_used=2, n_ff_expert=128)
# Gemma 4 E2B's text model: 35 layers of width 1536 (4 sliding + 1 full), 8 heads, one KV head,
# head dims 256 / 512, MLP 6144 (12288 in the 20 KV-shared layers, which have no K/V
# projections), per-layer embeddings of 256: 4.63 billion matrix values.
E2B = MainSpec(
    n_layer=35, n_embd=1536, n_head=8, n_head_kv=1, head_dim_swa=256, head_dim_full=512, n_ff=6144,
    n_ff_shared=12288, n_kv_shared=20, n_vocab=262144, n_embd_per_layer=256, sliding_every=5, sliding_window=512,
)  # fmt: skip


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
        has_kv = il < s.n_layer - s.n_kv_shared  # KV-shared layers read an earlier layer's cache
        if has_kv:
            t("self_attn.k_proj.weight", "attn_k.weight", (s.n_head_kv * hd, E), MAT)
            t("self_attn.v_proj.weight", "attn_v.weight", (s.n_head_kv * hd, E), MAT)
        t("self_attn.o_proj.weight", "attn_output.weight", (E, s.n_head * hd), MAT)
        t("self_attn.q_norm.weight", "attn_q_norm.weight", (hd,), NORM)
        if has_kv:
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
    s = spec
    text = {
        "model_type": "gemma4_text",
        "hidden_size": s.n_embd,
        "intermediate_size": s.n_ff,
        "num_hidden_layers": s.n_layer,
        "num_attention_heads": s.n_head,
        "num_key_value_heads": s.n_head_kv,
        "head_dim": s.head_dim_swa,
        "global_head_dim": s.head_dim_full,
        "layer_types": ["sliding_attention" if s.is_swa(i) else "full_attention" for i in range(s.n_layer)],
        "sliding_window": s.sliding_window,
        "vocab_size": _rows(s, s.n_vocab),
        "vocab_size_per_layer_input": _rows(s, s.n_vocab),
        "hidden_size_per_layer_input": s.n_embd_per_layer,
        "num_kv_shared_layers": s.n_kv_shared,
        "use_double_wide_mlp": bool(s.n_ff_shared),
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional",
                "rope_theta": 1000000.0,
                "partial_rotary_factor": s.partial_rotary_full,
            },
        },
    }
    if s.n_expert:
        text |= {
            "enable_moe_block": True,
            "num_experts": s.n_expert,
            "top_k_experts": s.n_expert_used,
            "moe_intermediate_size": s.n_ff_expert,
        }
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "dtype": "bfloat16",
        "text_config": text,
    }


def _seed(seed: int, name: str, r0: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode()), r0])


def source_fill(t: ModelTensor, seed: int, step_kind: str = "fp32"):
    """Rows [r0, r1) of a tensor's source values (bf16 bits), seeded per chunk."""
    cols = t.shape[-1]
    per_row = int(np.prod(t.shape[1:-1], dtype=np.int64)) if len(t.shape) > 2 else 1

    def fill(r0: int, r1: int) -> np.ndarray:
        rng = _seed(seed, t.hf_name, r0)
        n = (r1 - r0) * per_row
        if t.what == MAT:
            return qat_matrix(rng, n, cols, step_kind=step_kind, zero_fraction=0.01).reshape(r1 - r0, *t.shape[1:])
        if t.what == ROUTER:
            return random_matrix(rng, n, cols).reshape(r1 - r0, *t.shape[1:])
        if t.what == SCALAR:
            return bf16.from_f32(np.ones(t.shape, dtype=np.float32))
        shape = (r1 - r0, *t.shape[1:])
        return bf16.from_f32((1.0 + rng.normal(0.0, 0.05, shape)).astype(np.float32))

    return fill


def write_main_checkpoint(
    folder: str | Path, spec: MainSpec = TINY, seed: int = 0, step_kind: str = "fp32", shards: int = 1
) -> Path:
    """A QAT ``Gemma4ForConditionalGeneration`` folder, written in row chunks."""
    stream = [StreamTensor(t.hf_name, t.shape, "BF16", source_fill(t, seed, step_kind)) for t in model_tensors(spec)]
    vision = "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight"  # not part of the text GGUF
    stream.append(
        StreamTensor(vision, (64, 64), "BF16", lambda r0, r1: random_matrix(_seed(seed, vision, r0), r1 - r0, 64))
    )
    return write_folder(folder, hf_config(spec), sorted(stream, key=lambda t: t.name), shards)


def donor_kv(spec: MainSpec = TINY, file_type: int = 2) -> list[bytes]:
    """The donor's key/value pairs, raw, as Google's GGUFs carry them."""
    s, a = spec, "gemma4"
    u32, f32, string = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING
    pattern = [s.is_swa(i) for i in range(s.n_layer)]
    kv = [
        encode_kv("general.architecture", string, a),
        encode_kv("general.name", string, "gemma-4-tiny-it-qat"),
        encode_kv("general.file_type", u32, file_type),
        encode_kv("general.quantization_version", u32, 2),
        encode_kv(f"{a}.block_count", u32, s.n_layer),
        encode_kv(f"{a}.context_length", u32, 4096),
        encode_kv(f"{a}.embedding_length", u32, s.n_embd),
    ]
    if s.n_ff_shared:
        kv.append(
            encode_array_kv(
                f"{a}.feed_forward_length", GGUFValueType.UINT32, [s.n_ff_layer(i) for i in range(s.n_layer)]
            )
        )
    else:
        kv.append(encode_kv(f"{a}.feed_forward_length", u32, s.n_ff))
    kv += [
        encode_kv(f"{a}.attention.head_count", u32, s.n_head),
        encode_kv(f"{a}.attention.head_count_kv", u32, s.n_head_kv),
        encode_kv(f"{a}.rope.freq_base", f32, 1_000_000.0),
        encode_kv(f"{a}.rope.freq_base_swa", f32, 10_000.0),
        encode_kv(f"{a}.attention.layer_norm_rms_epsilon", f32, 1e-6),
        encode_kv(f"{a}.attention.sliding_window", u32, s.sliding_window),
        encode_kv(f"{a}.attention.shared_kv_layers", u32, s.n_kv_shared),
        encode_kv(f"{a}.embedding_length_per_layer_input", u32, s.n_embd_per_layer),
        encode_array_kv(f"{a}.attention.sliding_window_pattern", GGUFValueType.BOOL, pattern),
        encode_kv(f"{a}.attention.key_length", u32, s.head_dim_full),
        encode_kv(f"{a}.attention.value_length", u32, s.head_dim_full),
        encode_kv(f"{a}.attention.key_length_swa", u32, s.head_dim_swa),
        encode_kv(f"{a}.attention.value_length_swa", u32, s.head_dim_swa),
        encode_kv(f"{a}.rope.dimension_count", u32, s.head_dim_full),
        encode_kv(f"{a}.rope.dimension_count_swa", u32, s.head_dim_swa),
        encode_kv(f"{a}.final_logit_softcapping", f32, 30.0),
    ]
    if s.n_expert:
        kv += [
            encode_kv(f"{a}.expert_count", u32, s.n_expert),
            encode_kv(f"{a}.expert_used_count", u32, s.n_expert_used),
            encode_kv(f"{a}.expert_feed_forward_length", u32, s.n_ff_expert),
        ]
    tokens, scores, types = vocabulary(_rows(s, s.n_vocab))
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


def _rope_freqs(spec: MainSpec) -> np.ndarray:
    n_rot = int(spec.head_dim_full * spec.partial_rotary_full / 2)
    return np.array([1.0] * n_rot + [1e30] * (spec.head_dim_full // 2 - n_rot), dtype=np.float32)


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
) -> Path:
    """A Google-style ``gemma4`` GGUF made from the checkpoint at ``source``.

    ``types`` overrides the donor type of GGUF names (tests: an F32 reference, ...).
    """
    path = Path(path)
    tensors = [
        replace(t, donor_type=(types or {}).get(t.gguf_name, t.donor_type)) for t in model_tensors(spec, split_experts)
    ]
    with Checkpoint(source) as ckpt:
        locations = locate(ckpt)
    rope = _rope_freqs(spec)
    entries = [TensorEntry(t.gguf_name, tuple(reversed(t.shape)), t.donor_type) for t in tensors]
    entries.insert(1, TensorEntry("rope_freqs.weight", (rope.size,), T.F32))
    writer = StreamingGGUF(path, 3, donor_kv(spec), entries, 32)
    try:
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
        writer.finish(donor_kv(spec))
    finally:
        writer.close()
    return path
