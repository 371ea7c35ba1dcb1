"""Full-size E2B and E4B target + drafter pairs with weights, made on the spot (``make-pair``).

Every tensor has its real shape and type (:data:`gguf_exact.gemma4.sizes.SIZES`): the
target as ``repack`` writes a Google QAT GGUF (Q4_0 layer matrices, Q6_K
``token_embd`` and ``per_layer_token_embd``, F16 ``per_layer_model_proj``, F32 norms,
``rope_freqs``), the drafter through ``gguf-exact convert`` itself (exact Q4_0 matrices,
its 262,144-row tied head included), both with a Gemma-4-size vocabulary (262,144
tokens, 500,000 merges, :func:`gguf_exact.tiny.vocab.gemma4_vocabulary`). Almost every
weight is zero, which costs llama.cpp exactly what real weights cost: no kernel looks
at values, so every matrix is really multiplied.

The few non-zero weights make the full-size version of the tiny hidden-state pair
(:mod:`.hidden_pair`); what they do, worked out, is :mod:`.pair_walk`:

- **target**: every token's embedding points along one of :data:`N_AXES` axes (the
  :data:`N_AXES` cycle tokens at twice the length of the rest), layer 0's feed-forward
  block maps axis ``k`` to axis ``k + 1`` (mod :data:`N_AXES`), every other block adds
  nothing (zero output projections; a zero vector RMS-normed stays zero), and the tied
  head reads the axis back as the cycle token. Its greedy text walks the cycle, and
  its next token is a function of its final hidden state (top logit ahead by about 7
  after soft-capping: no near-ties, so batched verification cannot flip it).
- **drafter**: its ``pre_projection`` is zero on the token half: it reads only the
  target's hidden state ``h`` (axis of the token at the draft position) and maps axis
  ``k`` to its own axis ``k + 1``; its layers pass their input through; its tied head
  reads its axis ``j`` as cycle token ``j``, and ``post_projection`` hands back
  ``h`` of the same form, so chained drafts keep walking the cycle.
- ``hidden``: the head names every axis's cycle token: acceptance 1.
  ``mixed``: for the last third of every 12 axes it names a token the target never picks,
  so a draft chain is right while it walks the first two thirds. An accepted draft
  moves two axes per target pass and a rejected one one, so in the steady state
  acceptance is 1/2 at n-max 1 and 2, 1/3 at n-max 3, 7/20 at n-max 4 (falling with
  depth, as real drafters' does), and tokens per pass 3/2, 2, 2, 12/5.
- ``real``: like the real assistants, its first draft and its deeper ones differ.
  ``post_projection`` hands back its axis on a second set of :data:`N_AXES` axes of
  ``h`` (the echo), which ``pre_projection`` maps to a second block of drafter axes with
  a head of its own: the first draft reads the target's ``h`` and is wrong on the axes
  of :data:`.pair_walk.REAL_FIRST_WRONG` (7 of 24), a deeper one reads the echo and is
  wrong on :data:`.pair_walk.REAL_DEEP_WRONG` (10 of 24). Where it is wrong its final
  norm's weight on that axis is small, so its top probability (llama.cpp's p-min reads
  the softmax of the 10 best logits) is 0.84 at the first draft and 0.43 deeper, against
  1.0 where it is right. Steady state (every start, :func:`.pair_walk.steady_state`):
  per-depth acceptance 11/13 (0.85) at n-max 1; 17/21, 10/17 (0.81, 0.59) at 2; 5/6, 3/5,
  2/3 at 3; 7/8, 4/7, 3/4, 2/3 at 4; overall acceptance 11/13, 9/14, 5/9, 1/2 and tokens per
  pass 24/13, 16/7, 8/3, 3. With p-min 0.5 its unsure drafts are not made (acceptance
  11/13, 27/32, 10/11, 16/17, the same tokens per pass); with 0.9 no wrong one is
  (acceptance 1). The wrong tokens sit one per cluster of the ordered head, none beside a
  cycle token (``h`` carries a negative part on the axis before its own, which would cancel
  an unsure axis in a shared centroid).
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from gguf_exact.core import bf16, q4_0, q6_k
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.errors import ArgumentError, Param
from gguf_exact.formats.gguf_layout import TensorEntry, encode_kv
from gguf_exact.formats.gguf_stream import pwrite_all, streaming_gguf
from gguf_exact.formats.safe_write import output_folder
from gguf_exact.gemma4.hparams import TextHparams, rope_freqs
from gguf_exact.gemma4.sizes import SIZES
from gguf_exact.tiny import sampled_pair
from gguf_exact.tiny.main_model import NORM, SCALAR, MainSpec, donor_kv, hf_config, model_tensors
from gguf_exact.tiny.models import (
    TinyDrafter,
    TinyTarget,
    drafter_config,
    drafter_tensors,
    pass_through_layers,
    vocabulary,
    write_checkpoint,
)
from gguf_exact.tiny.ordered_head import consistent_head
from gguf_exact.tiny.pair_walk import KINDS as WALK_KINDS
from gguf_exact.tiny.pair_walk import N_AXES, norm_weight, right
from gguf_exact.tiny.vocab import Vocabulary, gemma4_vocabulary, vocabulary_pairs

T = GGMLQuantizationType
SHAPES = {"e2b": "E2B", "e4b": "E4B"}
CYCLE_EMBD, OTHER_EMBD = 0.5, 0.25  # embedding lengths: the cycle token wins its axis
CHUNK_BYTES = 32 << 20
KINDS = (*WALK_KINDS, "sampled")  # sampled: gguf_exact.tiny.sampled_pair, a Markov chain that samples


@dataclass(frozen=True)
class FullPair:
    shape: str  # E2B, E4B or tiny
    kind: str  # one of KINDS
    target: Path
    drafter: Path
    cycle: tuple[int, ...]  # token ids the target walks, axis 0 first
    cycle_text: tuple[str, ...]  # their pieces


def cycle_ids(vocab: Vocabulary) -> list[int]:
    """The :data:`N_AXES` cycle tokens: the first word pieces (``▁`` and 3+ plain letters)."""
    out = [i for i, t in enumerate(vocab.tokens) if t.startswith("▁") and len(t) >= 4 and t[1:].isascii()]
    return out[:N_AXES]


def token_axes(n_vocab: int, cycle: list[int]) -> np.ndarray:
    """Each token's axis: cycle token ``j`` on axis ``j``, every other token ``t`` on ``t % N_AXES``."""
    axis = np.arange(n_vocab) % N_AXES
    axis[cycle] = np.arange(len(cycle))
    return axis


def next_token(token: int, cycle: list[int]) -> int:
    """The target's greedy token after ``token``."""
    axis = cycle.index(token) if token in cycle else token % N_AXES
    return cycle[(axis + 1) % N_AXES]


# --- the target ---------------------------------------------------------------------------


def _zero_row(qtype: T, cols: int) -> np.ndarray:
    """One row of zeros as stored in ``qtype`` (level 0 for Q4_0, as the packers write it)."""
    if qtype == T.Q4_0:
        return q4_0.pack(np.zeros((cols // 32, 32), np.int8), np.zeros(cols // 32, np.float16)).reshape(-1)
    if qtype == T.Q6_K:
        return q6_k.quantize(np.zeros((1, cols), np.float32)).reshape(-1)
    return np.zeros(cols * (2 if qtype == T.F16 else 4), np.uint8)


def _pack_levels(values: np.ndarray) -> np.ndarray:
    """Rows of small integers (-8..7) as exact Q4_0 with step 1 (0 for an all-zero block)."""
    blocks = values.reshape(-1, 32)
    assert np.all(blocks == np.rint(blocks)) and blocks.min() >= -8 and blocks.max() <= 7
    d = np.where(np.any(blocks != 0, axis=1), 1.0, 0.0).astype(np.float16)
    return q4_0.pack(blocks.astype(np.int8), d).reshape(values.shape[0], -1)


RowHead = Callable[[int, int], np.ndarray]  # rows [r0, r1) of a tensor's first block columns (float32)


def _target_heads(spec: MainSpec, cycle: list[int]) -> dict[str, tuple[int, RowHead]]:
    """The non-zero tensors: {name: (rows that carry values, rows -> their first block's values)}."""
    k = np.arange(N_AXES)
    axes = token_axes(spec.n_vocab, cycle)
    is_cycle = np.zeros(spec.n_vocab, bool)
    is_cycle[cycle] = True

    def embd(r0: int, r1: int) -> np.ndarray:  # Q6_K: first 256 columns
        out = np.zeros((r1 - r0, 256), np.float32)
        out[np.arange(r1 - r0), axes[r0:r1]] = np.where(is_cycle[r0:r1], CYCLE_EMBD, OTHER_EMBD)
        return out

    def select(r0: int, r1: int) -> np.ndarray:  # gate and up: row k reads axis k
        out = np.zeros((N_AXES, 32), np.float32)
        out[k, k] = 1.0
        return out[r0:r1]

    def step(r0: int, r1: int) -> np.ndarray:  # down: output k + 1 gains, output k loses what row k read
        out = np.zeros((N_AXES, 32), np.float32)
        out[(k + 1) % N_AXES, k] = 1.0
        out[k, k] = -1.0
        return out[r0:r1]

    return {
        "token_embd.weight": (spec.n_vocab, embd),
        "blk.0.ffn_gate.weight": (N_AXES, select),
        "blk.0.ffn_up.weight": (N_AXES, select),
        "blk.0.ffn_down.weight": (N_AXES, step),
    }


def target_kv(spec: MainSpec, vocab: Vocabulary, name: str) -> list[bytes]:
    """The donor's keys (llama.cpp's converter's hyperparameters) with ``vocab`` as tokenizer."""

    def key(raw: bytes) -> bytes:
        (n,) = struct.unpack_from("<Q", raw)
        return raw[8 : 8 + n]

    kv = [raw for raw in donor_kv(spec) if not key(raw).startswith(b"tokenizer.")]
    named = [raw for raw in kv if key(raw) != b"general.name"]
    return [named[0], encode_kv("general.name", GGUFValueType.STRING, name), *named[1:], *vocabulary_pairs(vocab)]


def _sampled_heads(spec: MainSpec, cycle: list[int]) -> dict[str, tuple[int, RowHead]]:
    """:mod:`.sampled_pair`'s target weights as :func:`_target_heads` gives the cycle's."""
    select, down = sampled_pair.target_ffn()

    def embd(r0: int, r1: int) -> np.ndarray:
        return sampled_pair.target_embd(np.arange(r0, r1), cycle, spec.n_vocab, 256)

    return {
        "token_embd.weight": (spec.n_vocab, embd),
        "blk.0.ffn_gate.weight": (len(select), lambda r0, r1: select[r0:r1]),
        "blk.0.ffn_up.weight": (len(select), lambda r0, r1: select[r0:r1]),
        "blk.0.ffn_down.weight": (len(down), lambda r0, r1: down[r0:r1]),
    }


def write_target(path: str | Path, size: str, vocab: Vocabulary, cycle: list[int], kind: str = "hidden") -> Path:
    """``size``'s target with the cycle-walking weights (``kind`` sampled: :mod:`.sampled_pair`'s),
    every tensor at its real shape and type."""
    path = Path(path)
    spec = MainSpec.from_shape(SIZES[size].target)
    tensors = model_tensors(spec)
    entries = [TensorEntry(t.gguf_name, tuple(reversed(t.shape)), t.donor_type) for t in tensors]
    rope = rope_freqs(TextHparams.from_hf(hf_config(spec)["text_config"]))
    entries.insert(1, TensorEntry("rope_freqs.weight", (rope.size,), T.F32))
    what = {t.gguf_name: t.what for t in tensors}
    sampled = kind == "sampled"
    heads = _sampled_heads(spec, cycle) if sampled else _target_heads(spec, cycle)
    kv = target_kv(spec, vocab, f"gemma-4-{size}-made-pair")
    with streaming_gguf(path, 3, kv, entries, 32) as writer:
        for entry in entries:
            offset = writer.place(entry)
            if entry.name == "rope_freqs.weight":
                pwrite_all(writer.fd, rope.view(np.uint8), offset)
            elif sampled and entry.name == "output_norm.weight":  # its logit scales
                pwrite_all(writer.fd, sampled_pair.target_output_norm(entry.n_values).view(np.uint8), offset)
            elif what[entry.name] in (NORM, SCALAR):  # every norm and layer scalar 1.0
                pwrite_all(writer.fd, np.ones(entry.n_values, np.float32).view(np.uint8), offset)
            else:
                _write_matrix(writer.fd, offset, entry, heads.get(entry.name))
        writer.finish(kv)
    return path


def _write_matrix(fd: int, offset: int, entry: TensorEntry, head: tuple[int, RowHead] | None) -> None:
    rows, cols = entry.rows, entry.cols
    zero = _zero_row(entry.type, cols)
    step = max(1, CHUNK_BYTES // zero.size)
    chunk = np.tile(zero, (min(step, rows), 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        if head is not None and r0 < head[0]:
            values = head[1](r0, min(r1, head[0]))
            block = q6_k.quantize(values) if entry.type == T.Q6_K else _pack_levels(values)
            buf = chunk[: r1 - r0].copy()
            buf[: block.shape[0], : block.shape[1]] = block
            pwrite_all(fd, buf, offset + r0 * zero.size)
        else:
            pwrite_all(fd, chunk[: r1 - r0], offset + r0 * zero.size)


# --- the drafter --------------------------------------------------------------------------


def drafter_weights(size: str, kind: str, cycle: list[int]) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json, HF tensors as bf16 bits) of the assistant that reads only ``h``.

    One block of :data:`N_AXES` drafter axes per kind of input: ``hidden`` and ``mixed`` read
    the target's ``h`` and their own output alike; ``real`` has a second block for what its
    ``post_projection`` hands back (on the echo axes of ``h``), with a head of its own."""
    spec = TinyDrafter.from_shape(SIZES[size].assistant)
    if kind == "sampled":
        return sampled_pair.drafter_weights(spec, cycle)
    small = drafter_tensors(replace(spec, vocab_size=N_AXES))  # every layer tensor at its real shape
    width, backbone, k = spec.hidden_size, spec.backbone_hidden_size, np.arange(N_AXES)
    one = bf16.from_f32(np.ones(1, np.float32))[0]
    pre = np.zeros((width, 2 * backbone), np.uint16)  # [token half | hidden half]
    post = np.zeros((backbone, width), np.uint16)
    embed = np.zeros((spec.vocab_size, width), np.uint16)  # the tied head: 262,144 rows
    norm = np.full(width, one, np.uint16)
    echo = N_AXES if kind == "real" else 0  # where post_projection hands a drafter axis back in h
    # (depth, first drafter axis, first axis of h read): the first draft reads the target's h
    blocks = [(1, 0, 0)] + ([(2, N_AXES, echo)] if echo else [])
    # tokens the target never picks, one per cluster of the ordered head and none beside a
    # cycle token: a cluster's centroid sums its tokens' rows, and h also carries a negative
    # part on the axis before its own, which would cancel a low-weight (unsure) axis
    cluster = spec.vocab_size // spec.num_centroids
    never = (cluster * c for c in range(spec.num_centroids // 2, spec.num_centroids) if cluster * c not in cycle)
    for depth, axes, reads in blocks:
        pre[axes + (k + 1) % N_AXES, backbone + reads + k] = one  # h axis k -> drafter axis k + 1
        post[echo + k, axes + k] = one  # drafter axis k -> h axis k (real: its echo)
        for a in range(N_AXES):
            embed[cycle[a] if right(kind, a, depth) else next(never), axes + a] = one
            norm[axes + a] = bf16.from_f32(np.array([norm_weight(kind, a, depth)], np.float32))[0]
    small |= {
        "pre_projection.weight": pre,
        "post_projection.weight": post,
        "model.embed_tokens.weight": embed,
        "model.norm.weight": norm,
        "masked_embedding.token_ordering": np.arange(spec.vocab_size, dtype=np.int64),
    }
    pass_through_layers(small, spec.num_hidden_layers)
    consistent_head(small, spec.num_centroids, spec.centroid_top_k)  # the clusters hold the tokens the drafter proposes
    return drafter_config(spec), small


def write_drafter(
    path: str | Path, size: str, kind: str, cycle: list[int], target: str | Path, ordered_head: bool = True
) -> Path:
    """The assistant of :func:`drafter_weights`, converted by ``gguf-exact convert`` against ``target``
    (``ordered_head=False``: as ``convert --full-head``, the 262,144-row head only)."""
    path = Path(path)
    scratch = Path(tempfile.mkdtemp(prefix="drafter-hf-", dir=path.parent))
    try:
        config, tensors = drafter_weights(size, kind, cycle)
        write_checkpoint(scratch, config, tensors)
        return convert_drafter(scratch, path, target, ordered_head=ordered_head).path
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_pair(folder: str | Path, shape: str, kind: str, progress: Callable[[str], None] | None = None) -> FullPair:
    """Write ``folder/target.gguf`` and ``folder/drafter.gguf`` (``shape`` e2b or e4b)."""
    say = progress or (lambda _m: None)
    if shape.lower() not in (*SHAPES, "tiny"):
        raise ArgumentError(Param("shape"), f" {shape}: expected one of {', '.join(SHAPES)}, tiny")
    if kind not in KINDS:
        raise ArgumentError(Param("kind"), f" {kind}: expected one of {', '.join(KINDS)}")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ArgumentError(f"{folder}: exists and is not a folder")
    if shape.lower() == "tiny":
        return _tiny_pair(folder, kind)
    size = SHAPES[shape.lower()]
    output_folder(folder)
    vocab = gemma4_vocabulary()
    cycle = cycle_ids(vocab)
    say(f"target: {size}, {len(vocab.tokens):,} tokens, {len(vocab.merges):,} merges")
    target = write_target(folder / "target.gguf", size, vocab, cycle, kind)
    say(f"drafter: the {size} assistant, kind {kind}, through gguf-exact convert")
    drafter = write_drafter(folder / "drafter.gguf", size, kind, cycle, target)
    return FullPair(size, kind, target, drafter, tuple(cycle), tuple(vocab.tokens[i] for i in cycle))


def _tiny_pair(folder: Path, kind: str) -> FullPair:
    """The tiny form (F32 target of 320 tokens): the sampled kind's only; the others have theirs
    among the tiny kit's pairs."""
    if kind != "sampled":
        raise ArgumentError(Param("kind"), f" {kind}: the tiny shape is made for the sampled kind only")
    target, drafter = sampled_pair.write_tiny_pair(folder)
    cycle = sampled_pair.tiny_cycle()
    tokens = vocabulary(TinyTarget().n_vocab)[0]
    return FullPair("tiny", kind, target, drafter, tuple(cycle), tuple(tokens[i] for i in cycle))


__all__ = [
    "KINDS",
    "N_AXES",
    "SHAPES",
    "FullPair",
    "cycle_ids",
    "drafter_weights",
    "next_token",
    "token_axes",
    "write_drafter",
    "write_pair",
    "write_target",
]
