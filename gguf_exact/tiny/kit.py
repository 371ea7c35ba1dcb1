"""``make-tiny``: the tiny models of every offline workflow, written into one folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gguf_exact.formats.safe_write import output_folder


@dataclass(frozen=True)
class TinyKit:
    """The files :func:`write_tiny_kit` wrote."""

    target: Path  # a tiny gemma4 target GGUF
    drafter_hf: Path  # its QAT drafter checkpoint (convert it with vocab_from=target)
    main_hf: Path  # a QAT main-model checkpoint with E2B's structure
    donor: Path  # that model's GGUF as Google makes its QAT GGUFs: what repack re-packs
    pairs: dict[str, tuple[Path, Path]] = field(default_factory=dict)  # name -> (target, drafter) GGUFs


def write_tiny_kit(out_dir: str | Path, seed: int = 0, step_kind: str = "fp32", pairs: bool = False) -> TinyKit:
    """Write ``target.gguf``, ``drafter-hf/``, ``main-hf/`` and ``main-q4_0.gguf`` into
    ``out_dir`` and, with ``pairs``, the speculation pairs under ``out_dir/pairs/NAME/``
    (:func:`gguf_exact.tiny.pairs.write_runner_pairs`). ``step_kind``: the precision of the
    simulated training step (``fp32`` or ``bf16``)."""
    from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint
    from gguf_exact.tiny.models import write_tiny_drafter, write_tiny_target

    out = Path(out_dir)
    output_folder(out)
    kit = TinyKit(out / "target.gguf", out / "drafter-hf", out / "main-hf", out / "main-q4_0.gguf")
    write_tiny_target(kit.target, seed=seed)
    write_tiny_drafter(kit.drafter_hf, seed=seed, step_kind=step_kind)
    write_main_checkpoint(kit.main_hf, TINY, seed=seed, step_kind=step_kind)
    write_donor(kit.donor, kit.main_hf, TINY)
    if pairs:
        from gguf_exact.tiny.pairs import write_runner_pairs

        kit.pairs.update(write_runner_pairs(out / "pairs", seed=seed))
    return kit


__all__ = ["TinyKit", "write_tiny_kit"]
