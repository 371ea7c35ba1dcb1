"""A tiny pair whose drafter sees only the target's hidden state: the sharp test of the plumbing.

The random, agreeing and mixed pairs cannot tell whether the drafter is fed the
hidden state of the right batch row: the agreeing drafter reads only the token.
Here it is the other way round:

- The target walks a fixed cycle of :data:`CYCLE` tokens (`` the a of and ... x``,
  then again): its next token is a function of its hidden state. Every token's
  embedding points along one axis (a one-hot residual; cycle tokens at twice the
  length of the others on the same axis), layer 0's feed-forward block maps axis
  ``k`` to axis ``next(k)`` (gate and up select ``k``, down writes
  ``u_next(k) - u_k``), every other block adds nothing (``attn_output`` and
  ``ffn_down`` zero), and the tied output matrix reads the axis back as the cycle
  token. The top logit leads the next by about 2.7 (no near-ties).
- The drafter's ``pre_projection`` is zero on its token half: it sees only ``h``,
  the target's hidden state of the row before the draft position, which points
  along the axis of the token *at* that position. It predicts the token after
  next from it (``pre_projection`` maps axis ``k`` to drafter axis ``next(k)``, its
  tied output reads that as the cycle token), and ``post_projection`` hands back a
  hidden state of the same form, so chained drafts keep walking the cycle.

Fed the right row, every draft is accepted; fed a neighbouring row, every draft is
one step off and none is.
"""

from __future__ import annotations

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
    write_tiny_target,
)
from gguf_exact.tiny.ordered_head import consistent_head

CYCLE = ("▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁it", "▁on", "▁def", "▁return", "▁x")
CYCLE_EMBD, OTHER_EMBD = 0.5, 0.25  # embedding lengths: the cycle token wins its axis


def cycle_ids(n_vocab: int = TinyTarget().n_vocab) -> list[int]:
    """Token ids of :data:`CYCLE`, in order."""
    tokens = vocabulary(n_vocab)[0]
    return [tokens.index(t) for t in CYCLE]


def next_in_cycle(token: int, n_vocab: int = TinyTarget().n_vocab) -> int:
    """The target's next token after ``token``: the cycle token after its axis."""
    ids = cycle_ids(n_vocab)
    axis = ids.index(token) if token in ids else token % len(ids)
    return ids[(axis + 1) % len(ids)]


def _axes(n_vocab: int) -> tuple[list[int], np.ndarray]:
    ids = cycle_ids(n_vocab)
    axis = np.array([t % len(ids) for t in range(n_vocab)])
    axis[ids] = np.arange(len(ids))
    return ids, axis


def write_hidden_target(path: str | Path, seed: int = 0) -> Path:
    """The cycle-walking target (:func:`.tiny.models.write_tiny_target` re-weighted)."""
    spec = TinyTarget()
    path = write_tiny_target(path, seed=seed, spec=spec)
    ids, axis = _axes(spec.n_vocab)
    k = len(ids)
    embd = np.zeros((spec.n_vocab, spec.n_embd), dtype=np.float32)
    embd[np.arange(spec.n_vocab), axis] = OTHER_EMBD
    embd[ids, np.arange(k)] = CYCLE_EMBD
    select = np.zeros((spec.n_ff, spec.n_embd), dtype=np.float32)
    select[np.arange(k), np.arange(k)] = 1.0  # gate and up: row k reads axis k
    step = np.zeros((spec.n_embd, spec.n_ff), dtype=np.float32)
    step[(np.arange(k) + 1) % k, np.arange(k)] = 1.0  # down: column k writes u_next(k) - u_k
    step[np.arange(k), np.arange(k)] = -1.0
    reader = GGUFReader(path, "r+")
    for t in reader.tensors:
        name = t.name
        if name == "token_embd.weight":
            t.data[...] = embd
        elif name.endswith((".attn_output.weight", ".ffn_down.weight")):
            t.data[...] = step if name == "blk.0.ffn_down.weight" else 0.0
        elif name in ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"):
            t.data[...] = select
        elif name.endswith("norm.weight"):
            t.data[...] = 1.0
    reader.data.flush()
    del reader
    return Path(path)


def hidden_drafter_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """HF tensors of the drafter that reads only the hidden half of its input."""
    spec = TinyDrafter()
    ids, _ = _axes(spec.vocab_size)
    k, width, backbone = len(ids), spec.hidden_size, spec.backbone_hidden_size
    one = bf16.from_f32(np.ones(1, dtype=np.float32))[0]
    pre = np.zeros((width, 2 * backbone), dtype=np.uint16)  # [token half | hidden half]
    pre[(np.arange(k) + 1) % k, backbone + np.arange(k)] = one  # hidden axis k -> drafter axis next(k)
    post = np.zeros((backbone, width), dtype=np.uint16)
    post[np.arange(k), np.arange(k)] = one  # drafter axis k -> hidden axis k
    embed = np.zeros((spec.vocab_size, width), dtype=np.uint16)
    embed[ids, np.arange(k)] = one  # tied output: drafter axis k is cycle token k
    t = drafter_tensors(spec, seed=seed)
    t["pre_projection.weight"] = pre
    t["post_projection.weight"] = post
    t["model.embed_tokens.weight"] = embed
    t["model.norm.weight"] = np.full_like(t["model.norm.weight"], one)
    pass_through_layers(t, spec.num_hidden_layers)
    consistent_head(t, spec.num_centroids, spec.centroid_top_k)
    return t


def write_hidden_state_pair(folder: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Write the pair under ``folder``: (target.gguf, drafter.gguf, converted to exact Q4_0)."""
    folder = Path(folder)
    output_folder(folder)
    target = write_hidden_target(folder / "target.gguf", seed=seed)
    hf = write_checkpoint(folder / "drafter-hf", drafter_config(TinyDrafter()), hidden_drafter_tensors(seed))
    drafter = convert_drafter(hf, folder / "drafter.gguf", target).path
    return target, drafter


__all__ = [
    "CYCLE",
    "cycle_ids",
    "hidden_drafter_tensors",
    "next_in_cycle",
    "write_hidden_state_pair",
    "write_hidden_target",
]
