"""The per-block kernels ``convert``, ``verify`` and ``repack`` call, from one of two builds of one source.

The source is numba-decorated Python: :func:`gguf_exact.core.exact_kernel.pack_blocks` (with
:mod:`.grid` and :mod:`.scale`, which it calls) and
:func:`gguf_exact.core.string_walk.skip_strings`. It is compiled either

- by numba's JIT in each process (its on-disk cache hit): loading numba and the cached code
  takes about 0.9 s here, as long as llama-quantize's whole run; or
- ahead of time into an extension module cached per machine
  (:mod:`gguf_exact.builds.aot_kernels`, ``make setup``), whose import does not load numba.

This module is the seam between them, and it does no I/O: :func:`active` returns the set in
use, asking the provider a higher layer registered (:func:`set_provider`; the package does it
in ``gguf_exact/__init__.py``) for the compiled module, and importing the JIT kernels when it
has none. Both builds take the same arrays (:data:`EXPORTS`, the signatures the ahead-of-time
build compiles) and fill the same counters (``N_OFF_GRID`` ...).
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Callable

import numpy as np

# Layout of the per-chunk counters that pack_blocks fills (int64).
N_OFF_GRID, N_EXACT, MAX_ULPS, N_NON_FINITE, FIRST_NON_FINITE, FIRST_BAD_SCALE = range(6)
N_COUNTERS = 6

# The exported kernels and their types (numba's signature strings), in calling order:
# pack_blocks(bits, out, counters, sq, histogram, off_blocks, off_residual, score_partial,
# with_histogram, gcd_by_level_set); skip_strings(buf, pos, count) -> end or -1.
EXPORTS = {
    "pack_blocks": "void(u2[:, ::1], u1[:, ::1], i8[::1], f8[::1], i8[::1], i8[::1], f4[::1], b1, b1, i1[::1])",
    "skip_strings": "i8(u1[::1], i8, i8)",
}
# The modules whose text is the kernels' source (the ahead-of-time build's cache key hashes them).
SOURCE_MODULES = ("kernels", "exact_kernel", "grid", "scale", "string_walk")


def _gcd_by_level_set() -> np.ndarray:
    """Table: bit set of the levels present (bit k + 8 for level k) -> their gcd. int8: 128 KiB,
    looked up once per block at a scattered index (as int32, 512 KiB, it missed the cache often
    enough to be a tenth of the grid fit's time)."""
    sets = np.arange(1 << 17, dtype=np.int32)
    gcd = np.ones(sets.size, dtype=np.int8)
    for divisor in (2, 3, 4, 5, 6, 7, 8):  # ascending, so the largest that fits wins
        not_multiples = sum(1 << (k + 8) for k in range(-8, 9) if k % divisor)
        gcd[(sets & not_multiples) == 0] = divisor
    gcd[sets == 1 << 8] = 1  # only zeros
    return gcd


# pack_blocks' last argument: levels in lowest terms (see grid.fit_block).
GCD_BY_LEVEL_SET = _gcd_by_level_set()

Provider = Callable[[], "ModuleType | None"]
_provider: Provider | None = None
_active: SimpleNamespace | None = None


def set_provider(provider: Provider | None) -> None:
    """Register what finds the compiled kernels (None: JIT only); the next :func:`active`
    asks it. Called before any kernel runs; tests call it to switch builds."""
    global _provider, _active
    _provider, _active = provider, None


def active() -> SimpleNamespace:
    """The kernels in use: ``pack_blocks``, ``skip_strings`` and ``kind`` (``aot`` or ``jit``),
    chosen on the first call in a process."""
    global _active
    if _active is None:
        compiled = _provider() if _provider is not None else None
        _active = aot(compiled) if compiled is not None else jit()
    return _active


def jit() -> SimpleNamespace:
    """The numba JIT build (imports numba; its cache beside the modules is hit)."""
    from gguf_exact.core.exact_kernel import pack_blocks
    from gguf_exact.core.string_walk import skip_strings

    return SimpleNamespace(kind="jit", pack_blocks=pack_blocks, skip_strings=skip_strings)


def aot(module: ModuleType) -> SimpleNamespace:
    """The ahead-of-time build, from its imported extension ``module``."""
    return SimpleNamespace(kind="aot", **{name: getattr(module, name) for name in EXPORTS})


def loaded() -> SimpleNamespace | None:
    """The kernels in use if a packer has chosen them in this process, else None (without
    loading anything: ``serve`` reads headers without them)."""
    return _active
