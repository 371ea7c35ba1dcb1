"""``verify`` for a main model: every tensor of a ``gemma4`` GGUF against its QAT source.

The file is mapped onto the source with the table a re-pack uses (it stands in for the
donor, :func:`gguf_exact.repack.tensor_map.build_map`), and
:func:`gguf_exact.stream.verify.verify_tensors` holds it to those jobs in row chunks, in
bounded memory: a ``repack`` output passes; Google's own QAT GGUF fails on its first
block whose ``max / -8`` step moved values off the trained grid. Tensors with no source
(``rope_freqs``, unknown names) are listed, not compared.
"""

from pathlib import Path
from typing import Callable

from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.repack.donor import open_donor
from gguf_exact.repack.tensor_map import build_map, check_same_model
from gguf_exact.stream.source_rows import locate
from gguf_exact.stream.verify import Verification, verify_tensors


def verify_model(
    path: str | Path, source_dir: str | Path, judge: bool = True, progress: Callable[[str], None] | None = None
) -> Verification:
    """Check (``judge``) or only measure every tensor of the GGUF at ``path`` that has a source."""
    source_dir = Path(source_dir)
    with open_donor(path) as gguf:
        with Checkpoint(source_dir) as ckpt:
            check_same_model(gguf.path, gguf.header.value, gguf.architecture, ckpt.config, ckpt.folder / "config.json")
            locations = locate(ckpt)
        mapping = build_map(gguf.path, gguf.architecture, gguf.tensors, locations, source_dir)
        return verify_tensors(gguf, mapping.jobs, judge, progress)
