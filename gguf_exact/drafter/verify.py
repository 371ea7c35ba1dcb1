"""``verify`` for a drafter: every tensor of a gemma4-assistant GGUF against the
checkpoint it was made from.

The checkpoint gives the jobs a conversion would carry out
(:func:`gguf_exact.drafter.convert.drafter_jobs`), and
:func:`gguf_exact.stream.verify.verify_tensors` holds the file to them: exact Q4_0
levels and scales where the source is on the grid, norms equal to the source, the
config's ``rope_freqs``, no tensor missing or extra. ``compare`` uses the same reading
with ``judge=False``, to measure files made any other way.
"""

from pathlib import Path
from typing import Callable

from gguf_exact.drafter.convert import drafter_jobs
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_reader import open_gguf
from gguf_exact.gemma4.assistant import AssistantConfig
from gguf_exact.stream.verify import TensorCheck, Verification, verify_tensors

__all__ = ["TensorCheck", "Verification", "verify_gguf"]


def verify_gguf(
    path: str | Path, source_dir: str | Path, judge: bool = True, progress: Callable[[str], None] | None = None
) -> Verification:
    """Check (``judge``) or only measure the drafter GGUF at ``path`` against ``source_dir``."""
    with Checkpoint(source_dir) as ckpt:
        cfg = AssistantConfig.from_hf(ckpt.config, str(ckpt.folder / "config.json"))
        jobs = drafter_jobs(ckpt, cfg)
    with open_gguf(path) as gguf:
        return verify_tensors(gguf, jobs, judge, progress)
