"""Tiny target + drafter pairs for the runner's tests, benchmark and demo.

- ``random``: the random tiny target and the random QAT drafter (converted to
  exact Q4_0). The target repeats one token; the drafter never agrees with it:
  acceptance 0.
- ``agreeing``: :func:`.tiny.write_agreeing_pair`. The target repeats its last
  token and the drafter predicts exactly that: acceptance 1.
- ``mixed``: :func:`write_mixed_target` beside the agreeing drafter. The target's
  output depends on the context (runs of a repeated token broken by changes), so
  the drafter is right part of the time.
- ``hidden``: :func:`.tiny.hidden_pair.write_hidden_state_pair`. The target walks a
  cycle of tokens and the drafter reads only the target's hidden state: acceptance 1
  when it is fed the right row, about 0 otherwise.

The plain random target repeats itself because its input embedding (scale 0.5,
times sqrt(width) as Gemma scales it) dominates the residual stream. Scaling
``token_embd`` down (it is also the tied output matrix) lets the attention and
feed-forward layers steer the output. The agreeing drafter predicts "the same
token again" from the target's token embedding whatever its scale.
"""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFReader

from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.formats.safe_write import output_folder
from gguf_exact.tiny.hidden_pair import write_hidden_state_pair
from gguf_exact.tiny.models import (
    write_agreeing_pair,
    write_tiny_drafter,
    write_tiny_target,
)

MIXED_EMBD_SCALE = 0.1
PAIRS = ("random", "agreeing", "mixed", "hidden")


def write_mixed_target(path: str | Path, seed: int = 0, embd_scale: float = MIXED_EMBD_SCALE) -> Path:
    """:func:`.tiny.write_tiny_target` with ``token_embd`` scaled by ``embd_scale``."""
    path = write_tiny_target(path, seed=seed)
    reader = GGUFReader(path, "r+")
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            t.data[...] *= embd_scale  # written through the memory map
    reader.data.flush()
    del reader
    return Path(path)


def write_runner_pairs(folder: str | Path, seed: int = 0) -> dict[str, tuple[Path, Path]]:
    """Write the pairs of :data:`PAIRS` under ``folder``: ``{name: (target.gguf, drafter.gguf)}``."""
    root = Path(folder)
    output_folder(root / "random")
    target = write_tiny_target(root / "random" / "target.gguf", seed=seed)
    write_tiny_drafter(root / "random" / "drafter-hf", seed=seed)
    drafter = convert_drafter(root / "random" / "drafter-hf", root / "random" / "drafter.gguf", target).path
    a_target, a_hf = write_agreeing_pair(root / "agreeing", seed=seed)
    a_drafter = convert_drafter(a_hf, root / "agreeing" / "drafter.gguf", a_target).path
    output_folder(root / "mixed")
    mixed = write_mixed_target(root / "mixed" / "target.gguf", seed=seed)
    hidden = write_hidden_state_pair(root / "hidden", seed=seed)
    return {
        "random": (target, drafter),
        "agreeing": (a_target, a_drafter),
        "mixed": (mixed, a_drafter),
        "hidden": hidden,
    }


__all__ = ["MIXED_EMBD_SCALE", "PAIRS", "write_mixed_target", "write_runner_pairs"]
