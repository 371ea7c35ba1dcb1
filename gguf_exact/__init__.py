"""gguf-exact: lossless Q4_0 GGUF for Gemma 4 QAT models and MTP drafters.

Layers, from the bottom:

- :mod:`.q4_0`, :mod:`.bf16` - data layouts
- :mod:`.grid` - QAT grid detection; :mod:`.scale` - fp16 scale choice;
  :mod:`.exact` - both over a whole matrix (pure numpy, no I/O)
- :mod:`.gemma4_assistant` - the drafter's GGUF keys and tensor names
- :mod:`.checkpoint` (HF folders), :mod:`.vocab` (target tokenizer),
  :mod:`.gguf_file` (safe writes) - I/O
- :mod:`.convert`, :mod:`.verify`, :mod:`.inspect_qat`, :mod:`.compare` - the commands
- :mod:`.recipes`, :mod:`.checksums` (pinned files), :mod:`.hub` (Hub and its cache),
  :mod:`.fetch`, :mod:`.pin`, :mod:`.build` - pinned fetch and reproducible builds
- :mod:`.repack` - a donor GGUF (main model or drafter) re-packed as exact Q4_0, streaming:
  :mod:`.gemma4_names` (HF -> GGUF names), :mod:`.repack_map` (donor tensor -> source),
  :mod:`.row_plan` (one chunk of rows), :mod:`.chunk_stats`, :mod:`.chunk_pool` (forked
  workers), :mod:`.malloc_tuning`, :mod:`.gguf_layout` and
  :mod:`.gguf_stream` (GGUF header by hand, chunked writes), :mod:`.donor`,
  :mod:`.source_rows` (pread, no mmap), :mod:`.repack_verify`, :mod:`.repack_report`;
  :mod:`.tiny_main` writes Google-style donors and QAT checkpoints for tests and benchmarks
"""

__version__ = "0.1.0"

from .compare import compare_files  # noqa: E402
from .convert import convert_drafter  # noqa: E402
from .errors import GgufExactError, OffGridError  # noqa: E402
from .exact import MatrixPlan, plan_matrix  # noqa: E402
from .inspect_qat import inspect_checkpoint  # noqa: E402
from .repack import repack_model  # noqa: E402
from .verify import verify_gguf  # noqa: E402

__all__ = [
    "GgufExactError",
    "MatrixPlan",
    "OffGridError",
    "compare_files",
    "convert_drafter",
    "inspect_checkpoint",
    "plan_matrix",
    "repack_model",
    "verify_gguf",
]
