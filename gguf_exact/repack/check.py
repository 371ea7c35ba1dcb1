"""``verify`` for a re-packed model: every tensor of a GGUF against its QAT source.

The file is mapped onto the source with the same table a re-pack uses (it stands in
for the donor), then read in row chunks, decoded and compared
(:func:`gguf_exact.core.error_stats.compare_chunk`): bit-exact share, largest error in
bf16 ULPs and relative error per tensor, in bounded memory. Tensors with no source
(``rope_freqs``, unknown names) are not compared.
"""

from pathlib import Path
from typing import Callable

from gguf_exact.core.error_stats import compare_chunk
from gguf_exact.drafter.verify import TensorCheck, Verification
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.repack.donor import decode_rows, open_donor
from gguf_exact.repack.source_rows import locate
from gguf_exact.repack.tensor_map import build_map, check_same_model

CHUNK_VALUES = 1 << 20


def verify_model(
    path: str | Path, source_dir: str | Path, progress: Callable[[str], None] | None = None
) -> Verification:
    """Compare every tensor of the GGUF at ``path`` that has a source with it."""
    source_dir = Path(source_dir)
    checks = []
    with open_donor(path) as gguf:
        with Checkpoint(source_dir) as ckpt:
            check_same_model(gguf.path, gguf.header.value, gguf.architecture, ckpt.config, ckpt.folder / "config.json")
            locations = locate(ckpt)
        mapping = build_map(gguf.path, gguf.architecture, gguf.tensors, locations, source_dir)
        for job in mapping.jobs:
            if job.source is None:
                continue
            if progress:
                progress(job.entry.name)
            e = job.entry
            check = TensorCheck(name=e.name, source=job.hf_name or "", type=e.type.name)
            step = max(1, CHUNK_VALUES // max(1, e.cols))
            for r0 in range(0, e.rows, step):
                r1 = min(e.rows, r0 + step)
                decoded = decode_rows(gguf.read_rows(e, r0, r1), e.type, e.cols)
                check.add(compare_chunk(decoded, job.source.read(r0, r1)))
            checks.append(check)
    return Verification(Path(path), checks)
