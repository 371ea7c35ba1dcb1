"""gguf-exact: lossless Q4_0 GGUF for Gemma 4 QAT models and MTP drafters.

Subpackages, from the bottom:

- :mod:`.core` - pure numpy: data layouts, QAT grid detection, fp16 scale choice, the
  exact matrix packer, the published method as baseline
- :mod:`.gemma4` - GGUF forms of Gemma 4: the drafter's key map, the main models' name table
- :mod:`.formats` - I/O: HF folders and safetensors, target vocabularies, GGUF writes and streams
- :mod:`.drafter` - ``inspect``, ``convert``, ``verify``, ``compare``
- :mod:`.repack` - main models re-packed from a donor GGUF, streamed in row chunks
- :mod:`.hub` - recipes, checksums, pinned ``fetch`` and ``pin``
- :mod:`.rebuild` - reproducible ``build``: fetch, convert, compare with the published file
- :mod:`.serving` - llama-server build, profiles, ``serve`` / ``status`` / ``stop``
- :mod:`.speculative` - in-process draft-mtp on llama-cpp-python: :func:`load_with_drafter`,
  ``chat``, ``generate``, ``bench``
- :mod:`.tiny` - tiny models and synthetic QAT data for tests, the demo, benchmarks

:mod:`.cli` is the ``gguf-exact`` command (a thin layer: one module per group of commands);
:mod:`.verify` verifies any file gguf-exact writes; :mod:`.demo` is ``make demo``.
"""

__version__ = "0.1.0"

from gguf_exact.errors import (  # noqa: E402
    ArgumentError,
    BuildError,
    GgufExactError,
    HubError,
    InputError,
    NotExactError,
    OffGridError,
    PairError,
    ServerError,
)

ERRORS = (ArgumentError, BuildError, HubError, InputError, NotExactError, OffGridError, PairError, ServerError)

# The public API, imported on first use: `gguf-exact serve` or `status` should not pay for
# numba's start-up (a quarter of a second) that only the packers need, and load_with_drafter
# needs llama_cpp (the `llama` extra).
_LAZY = {
    "MatrixPlan": "gguf_exact.core.exact",
    "plan_matrix": "gguf_exact.core.exact",
    "compare_files": "gguf_exact.compare",
    "convert_drafter": "gguf_exact.drafter.convert",
    "inspect_checkpoint": "gguf_exact.drafter.inspect_qat",
    "verify_gguf": "gguf_exact.drafter.verify",
    "verify_file": "gguf_exact.verify",
    "repack_model": "gguf_exact.repack.pipeline",
    "load_with_drafter": "gguf_exact.speculative.engine",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gguf_exact' has no attribute {name!r}")


__all__ = ["GgufExactError", *(e.__name__ for e in ERRORS), *_LAZY]
