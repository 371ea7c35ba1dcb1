"""The ``sampled`` pair: a target that samples like a real model and a drafter that approximates it.

Every other designed pair is effectively deterministic: its target's top token leads by
several logits, so temperature 1 samples what temperature 0 picks. Here the target is a
Markov chain over :data:`N_AXES` cycle tokens whose next-token distribution depends on the
current token's *state* ``k``, one of :data:`SLOPES`' six shapes: from one sure successor
(top probability about 0.97, two tokens above 1%) to a flat spread (about 0.25, a dozen
above 1%), the range of real chat text. What makes it, with the residual-stream axes of
:func:`axes` (the same at every width):

- **target**: cycle token ``j``'s embedding is :data:`EMBD` on axis ``j``; every other token
  ("junk") is :data:`EMBD` on axis ``N_AXES + t % N_AXES`` (state ``t % N_AXES`` as input) and
  ``-EMBD`` on the bias axis. Layer 0's feed-forward unit ``k`` reads both input axes of state
  ``k`` and writes :func:`levels` row ``k`` (integers, so Q4_0 holds them exactly) plus
  :data:`BIAS_LEVEL` on the bias axis; every other block adds nothing. The final norm's weights
  turn that into logits: cycle token ``j`` gets about ``LOGIT_SCALE * level / |row|``, junk about
  :data:`JUNK_LOGIT` (so 262,144 tokens stay out of the way, below top-k 64's tail).
- **drafter**: reads the *token* half of its input (the sampled token, which the target's hidden
  state cannot know) and maps state ``k`` to the same levels, with a tied head and final norm
  that give the target's logits over the cycle tokens (and a constant lift over the junk its
  ordered head lets through). Where it differs, on purpose: in the states of :data:`FIRST_WRONG`
  (flat ones, where it is least sure) its top two successors are swapped; from the second draft
  on, ``post_projection`` hands its state back on the echo axes and ``pre_projection`` adds
  :data:`ECHO` of it to the successor two ahead of the state it had (a stale guess), which
  turns the flat states' close seconds into its top. So, as real assistants, its first draft
  agrees with the target's argmax about 0.85 of the time and deeper ones about 0.6, and where it
  is wrong it is unsure.

What it achieves is measured from the written files (:mod:`gguf_exact.bench.pair_figures`),
not assumed here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import GGUFReader

from gguf_exact.core import bf16
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.formats.safe_write import output_folder
from gguf_exact.tiny.models import (
    TinyDrafter,
    TinyTarget,
    drafter_config,
    drafter_tensors,
    pass_through_layers,
    vocabulary,
    write_checkpoint,
)
from gguf_exact.tiny.models import write_tiny_target as write_random_target
from gguf_exact.tiny.ordered_head import consistent_head

N_AXES = 24
SLOPES = (4.0, 2.5, 1.6, 1.1, 0.7, 0.4)  # levels lost per step away from the top successor, state k % 6
EMBD = 0.05  # token embedding length: small, so the input's own axis barely shows in the output
BIAS_LEVEL = 7  # the bias axis' share of every state's row, in levels: keeps |row| from 10 to 18
LOGIT_SCALE = 10.8  # cycle logits = LOGIT_SCALE * level / |row|: about 1 logit per level when sure
JUNK_LOGIT = -12.0  # at |row| 12: 262,144 junk tokens then weigh under 1% at temperature 1
TIE_BREAK = 0.01  # at most 0.12 logits between tokens of one level (JUNK_LOGIT's scale)
DRAFT_LIFT = 12.0  # the drafter's cycle tokens over the zero-row junk in its candidate clusters
FIRST_WRONG = tuple(k for k in range(N_AXES) if k % 6 == 4)  # the drafter's swapped states
ECHO = 0.3  # deeper drafts: the share of the last state added two successors ahead...
ECHO_STATES = tuple(k for k in range(N_AXES) if k % 6 == 5 or k % 12 == 3)  # ...when it was one of these
DRAFT_SHARPNESS = 1.2  # the drafter's logits over the target's: drafters are overconfident


def axes(n_axes: int = N_AXES) -> dict[str, int]:
    """First axis of each block of the residual stream (target and drafter backbone alike)."""
    return {"cycle": 0, "junk": n_axes, "bias": 2 * n_axes, "echo": 64}


def levels(n_axes: int = N_AXES) -> np.ndarray:
    """[state k, cycle axis j]: the target's logit levels (0..7), top successor ``k + 1`` at 7,
    the next ones falling by ``SLOPES[k % 6]`` a step (at most 6: no tie at the top)."""
    out = np.zeros((n_axes, n_axes), np.int64)
    for k in range(n_axes):
        for o in range(2, n_axes):
            out[k, (k + o) % n_axes] = max(0, min(6, int(np.floor(7.5 - (o - 1) * SLOPES[k % len(SLOPES)]))))
        out[k, (k + 1) % n_axes] = 7
    return out


def drafter_levels(n_axes: int = N_AXES) -> np.ndarray:
    """:func:`levels` one level off on a fixed pattern of the lesser successors, and with the top
    two swapped in the states of :data:`FIRST_WRONG`."""
    out = levels(n_axes)
    state, axis = np.meshgrid(np.arange(n_axes), np.arange(n_axes), indexing="ij")
    lesser = (out > 0) & (out < 7)
    out[lesser] = np.clip(out[lesser] + (state * 7 + axis * 3)[lesser] % 3 - 1, 0, 6)
    for k in FIRST_WRONG:
        a, b = (k + 1) % n_axes, (k + 2) % n_axes
        out[k, [a, b]] = out[k, [b, a]]
    return out


def token_axes(n_vocab: int, cycle: list[int]) -> np.ndarray:
    """Each token's input axis: cycle token ``j`` on ``j``, every other ``t`` on ``N_AXES + t % N_AXES``."""
    axis = N_AXES + np.arange(n_vocab) % N_AXES
    axis[cycle] = np.arange(len(cycle))
    return axis


def _scales(n_embd: int) -> tuple[float, float]:
    """Final-norm weights (cycle axes, bias axis) that give :data:`LOGIT_SCALE` and :data:`JUNK_LOGIT`:
    the normed state is ``sqrt(n_embd) * row / |row|``, read by rows of length :data:`EMBD`."""
    root = float(np.sqrt(n_embd))
    return LOGIT_SCALE / (EMBD * root), -JUNK_LOGIT * 12.0 / (EMBD * root * BIAS_LEVEL)


# --- the target: its few non-zero values, as dense leading blocks ------------------------


def target_embd(rows: np.ndarray, cycle: list[int], n_vocab: int, cols: int) -> np.ndarray:
    """``token_embd`` rows ``rows`` (first ``cols`` columns)."""
    ax, bias = token_axes(n_vocab, cycle), axes()["bias"]
    out = np.zeros((len(rows), cols), np.float32)
    out[np.arange(len(rows)), ax[rows]] = EMBD
    # a token's own small share of the bias axis: no two logits tie (a real model's never do, and
    # a top-k or top-p cut between equal logits is where samplers may keep different tokens)
    out[:, bias] = np.where(ax[rows] >= N_AXES, -EMBD, 0.0) + TIE_BREAK * EMBD * ((rows * 37) % 101 + 1) / 101
    return out


def target_ffn() -> tuple[np.ndarray, np.ndarray]:
    """(gate = up [N_AXES, 64]: unit k reads both input axes of state k; down [bias + 1, 32]:
    column k writes state k's levels and the bias)."""
    k = np.arange(N_AXES)
    select = np.zeros((N_AXES, 64), np.float32)
    select[k, k] = select[k, N_AXES + k] = 1.0
    down = np.zeros((axes()["bias"] + 1, 32), np.float32)
    down[:N_AXES, :N_AXES] = levels().T
    down[axes()["bias"], :N_AXES] = BIAS_LEVEL
    return select, down


def target_output_norm(n_embd: int) -> np.ndarray:
    cycle, bias = _scales(n_embd)
    out = np.ones(n_embd, np.float32)
    out[:N_AXES] = cycle
    out[axes()["bias"]] = bias
    return out


# --- the drafter ----------------------------------------------------------------------------


def drafter_weights(spec: TinyDrafter, cycle: list[int]) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json, HF tensors as bf16 bits) of the ``sampled`` assistant for a target of
    width ``spec.backbone_hidden_size`` whose cycle tokens are ``cycle``."""
    small = drafter_tensors(replace(spec, vocab_size=N_AXES))  # every layer tensor at its real shape
    width, backbone, n = spec.hidden_size, spec.backbone_hidden_size, N_AXES
    k, lift_axis, echo = np.arange(n), 32, axes()["echo"]
    root_w = float(np.sqrt(width))
    pre = np.zeros((width, 2 * backbone), np.float32)  # [token half | hidden half]
    pre[:n, :n] = pre[:n, n : 2 * n] = drafter_levels().T  # token axis of state k -> its levels
    pre[lift_axis, : 2 * n] = BIAS_LEVEL
    # the echo: what post_projection handed back of the last state, two successors on, scaled to
    # the token half (whose state row is EMBD * sqrt(backbone) long per level)
    states = np.array(ECHO_STATES)
    pre[(states + 2) % n, backbone + echo + states] = ECHO * EMBD * np.sqrt(backbone) * 12.0 / LOGIT_SCALE
    post = np.zeros((backbone, width), np.float32)
    post[echo + k, k] = 1.0
    embed = np.zeros((spec.vocab_size, width), np.uint16)  # bf16 bits: 262,144 rows at full size
    embed[cycle, k] = embed[cycle, lift_axis] = bf16.from_f32(np.ones(1, np.float32))[0]
    norm = np.ones(width, np.float32)
    norm[:n] = DRAFT_SHARPNESS * LOGIT_SCALE / root_w
    norm[lift_axis] = DRAFT_LIFT * 12.0 / (root_w * BIAS_LEVEL)
    ordering = np.concatenate([cycle, np.setdiff1d(np.arange(spec.vocab_size), cycle)]).astype(np.int64)
    small |= {
        "pre_projection.weight": bf16.from_f32(pre),
        "post_projection.weight": bf16.from_f32(post),
        "model.embed_tokens.weight": embed,
        "model.norm.weight": bf16.from_f32(norm),
        "masked_embedding.token_ordering": ordering,  # the cycle tokens' clusters first
    }
    pass_through_layers(small, spec.num_hidden_layers)
    consistent_head(small, spec.num_centroids, spec.centroid_top_k)
    return drafter_config(spec), small


# --- the tiny form --------------------------------------------------------------------------


def tiny_cycle(n_vocab: int = TinyTarget().n_vocab) -> list[int]:
    """The tiny vocabulary's word pieces (``▁the``...), then its letters: :data:`N_AXES` tokens."""
    tokens = vocabulary(n_vocab)[0]
    words = [i for i, t in enumerate(tokens) if t.startswith("▁") and len(t) > 1]
    return (words + [i for i, t in enumerate(tokens) if len(t) == 1 and t.isalpha()])[:N_AXES]


def write_sampled_target(path: str | Path, seed: int = 0) -> Path:
    """The tiny target (F32) with the ``sampled`` weights."""
    spec = TinyTarget()
    path = write_random_target(path, seed=seed, spec=spec)
    cycle = tiny_cycle(spec.n_vocab)
    select, down = target_ffn()
    values = {
        "token_embd.weight": target_embd(np.arange(spec.n_vocab), cycle, spec.n_vocab, spec.n_embd),
        "blk.0.ffn_gate.weight": _pad(select, (spec.n_ff, spec.n_embd)),
        "blk.0.ffn_up.weight": _pad(select, (spec.n_ff, spec.n_embd)),
        "blk.0.ffn_down.weight": _pad(down, (spec.n_embd, spec.n_ff)),
        "output_norm.weight": target_output_norm(spec.n_embd),
    }
    reader = GGUFReader(path, "r+")
    for t in reader.tensors:
        if t.name in values:
            t.data[...] = values[t.name]
        elif t.name.endswith((".attn_output.weight", ".ffn_down.weight")):
            t.data[...] = 0.0
        elif t.name.endswith("norm.weight"):
            t.data[...] = 1.0
    reader.data.flush()
    del reader
    return Path(path)


def _pad(values: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    out = np.zeros(shape, np.float32)
    out[: values.shape[0], : values.shape[1]] = values
    return out


def write_tiny_pair(folder: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Write the tiny ``sampled`` pair under ``folder``: (target.gguf, drafter.gguf, exact Q4_0)."""
    folder = Path(folder)
    output_folder(folder)
    target = write_sampled_target(folder / "target.gguf", seed=seed)
    config, tensors = drafter_weights(TinyDrafter(), tiny_cycle())
    hf = write_checkpoint(folder / "drafter-hf", config, tensors)
    drafter = convert_drafter(hf, folder / "drafter.gguf", target).path
    return target, drafter
