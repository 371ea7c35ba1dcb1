"""gguf-exact: lossless Q4_0 GGUF for Gemma 4 QAT models and MTP drafters.

Subpackages, from the bottom:

- :mod:`.core` - pure numpy: data layouts, QAT grid detection, fp16 scale choice, the
  exact matrix packer, the published method as baseline
- :mod:`.gemma4` - GGUF forms of Gemma 4: the drafter's key map, the main models' name table
- :mod:`.formats` - I/O: HF folders and safetensors, target vocabularies, GGUF writes and streams
- :mod:`.drafter` - ``inspect``, ``convert``, ``verify``, ``compare``
- :mod:`.repack` - main models re-packed from a donor GGUF, streamed in row chunks
- :mod:`.hub` - recipes, checksums, pinned ``fetch``, ``pin``, reproducible ``build``
- :mod:`.serving` - llama-server build, profiles, ``serve`` / ``status`` / ``stop``
- :mod:`.speculative` - in-process draft-mtp on llama-cpp-python: :func:`load_with_drafter`,
  ``chat``, ``generate``, ``bench``
- :mod:`.tiny` - tiny models and synthetic QAT data for tests, the demo, benchmarks

:mod:`.cli` is the ``gguf-exact`` command; :mod:`.demo` is ``make demo``.
"""

__version__ = "0.1.0"

from gguf_exact.core.exact import MatrixPlan, plan_matrix  # noqa: E402
from gguf_exact.drafter.compare import compare_files  # noqa: E402
from gguf_exact.drafter.convert import convert_drafter  # noqa: E402
from gguf_exact.drafter.inspect_qat import inspect_checkpoint  # noqa: E402
from gguf_exact.drafter.verify import verify_gguf  # noqa: E402
from gguf_exact.errors import GgufExactError, OffGridError  # noqa: E402
from gguf_exact.repack.pipeline import repack_model  # noqa: E402


def __getattr__(name: str):
    # load_with_drafter imports llama_cpp (the `llama` extra); only when asked for.
    if name == "load_with_drafter":
        from gguf_exact.speculative.engine import load_with_drafter

        return load_with_drafter
    raise AttributeError(f"module 'gguf_exact' has no attribute {name!r}")


__all__ = [
    "GgufExactError",
    "MatrixPlan",
    "OffGridError",
    "compare_files",
    "convert_drafter",
    "inspect_checkpoint",
    "load_with_drafter",
    "plan_matrix",
    "repack_model",
    "verify_gguf",
]
