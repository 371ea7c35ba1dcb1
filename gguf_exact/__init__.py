"""gguf-exact: lossless Q4_0 GGUF for Gemma 4 QAT models and MTP drafters.

Subpackages, from the bottom (each imports only from those listed before it;
``tests/test_layers.py`` holds the order):

- :mod:`.core` - pure numpy: data layouts, QAT grid detection, fp16 scale choice, the
  exact matrix packer, the published method as baseline
- :mod:`.formats` - I/O: HF folders and safetensors, target vocabularies, GGUF reads, writes and streams
- :mod:`.gemma4` - GGUF forms of Gemma 4: the drafter's key map, the main models' name table, sizes
- :mod:`.stream` - planned tensors written in row chunks, read back, verified; the one write pipeline
- :mod:`.hub` - recipes, checksums, pinned ``fetch`` and ``pin``
- :mod:`.drafter` - ``inspect``, ``convert``, ``verify`` of drafters;
  :mod:`.repack` - main models re-packed from a donor GGUF
- :mod:`.rebuild` - reproducible ``build``: fetch, convert, compare with the published file;
  :mod:`.tiny` - tiny models and synthetic QAT data for tests, the demo, benchmarks
- :mod:`.builds` - llama-server and the llama-cpp-python bindings, built where they run;
  :mod:`.pair` - a target and its drafter from their headers: geometry, size, the pair check
- :mod:`.engines` - serving: ``engines/shared`` (what both engines use: the settings model,
  the serving configuration and profiles, the memory plan, the draft-length policy, the run
  folder, ``status``/``stop``), the engines (``engines/llama_server.py``: llama.cpp's
  ``llama-server``; ``engines/python``: the in-process engine, :func:`load_with_drafter`,
  ``chat``, ``generate``, its OpenAI server), and ``serve`` / ``launch`` over either
- :mod:`.bench` - benchmarks above both engines: ``bench``, ``tune``, ``make bench-real``

:mod:`.cli` is the ``gguf-exact`` command (a thin layer: one module per group of commands);
:mod:`.verify` verifies and :mod:`.compare` compares any file gguf-exact writes; :mod:`.doctor`
reports on the builds and both engines; :mod:`.demo` is ``make demo``.
"""

from gguf_exact.core import kernels as _kernels
from gguf_exact.errors import (
    ArgumentError,
    BuildError,
    GgufExactError,
    HubError,
    InputError,
    NotExactError,
    OffGridError,
    OutputError,
    PairError,
    ServerError,
)
from gguf_exact.version import __version__ as __version__

ERRORS = (
    ArgumentError, BuildError, HubError, InputError, NotExactError, OffGridError, OutputError, PairError, ServerError,
)  # fmt: skip

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
    "load_with_drafter": "gguf_exact.engines.python.load",
}


def _compiled_kernels():
    """The packer's kernels compiled ahead of time for this machine, or None (numba's JIT):
    looked up when a packer first runs, never by ``serve`` or ``status``."""
    from gguf_exact.builds.aot_kernels import load_cached

    return load_cached()


_kernels.set_provider(_compiled_kernels)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gguf_exact' has no attribute {name!r}")


__all__ = ["GgufExactError", *(e.__name__ for e in ERRORS), *_LAZY]
