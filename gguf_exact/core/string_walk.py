"""Walking a GGUF array of strings compiled: where the array ends, without reading it.

Each string is a u64 length and that many bytes, so finding the end of a Gemma 4
vocabulary (262,144 tokens and 500,000 merges) is 760,000 dependent steps: 0.15 s as a
Python loop, a few milliseconds compiled. :mod:`gguf_exact.formats.gguf_layout` uses this
only when a command that packs has loaded the kernels anyway (:func:`.kernels.loaded`:
``convert``, ``repack``, ``verify``); for ``serve`` and ``status`` the Python loop is cheaper
than loading them. Part of the kernels' source (:mod:`.kernels`): JIT or compiled ahead of
time, it is called as ``kernels.active().skip_strings``.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def skip_strings(buf, pos, count):
    """The offset just past ``count`` strings stored from ``pos`` in ``buf`` (uint8);
    -1 when they run past its end."""
    end = buf.size
    for _ in range(count):
        if pos + 8 > end:
            return -1
        length = np.uint64(0)
        for k in range(7, -1, -1):
            length = (length << np.uint64(8)) | np.uint64(buf[pos + k])
        if length > np.uint64(end - pos - 8):
            return -1
        pos += 8 + np.int64(length)
    return pos
