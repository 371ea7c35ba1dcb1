"""Keep glibc from returning each chunk's temporaries to the kernel.

Planning a chunk of 2**18 values allocates a few dozen numpy temporaries of about
1 MB. glibc serves blocks that large with a fresh ``mmap`` (and ``munmap`` on free)
unless told otherwise, so every chunk pays hundreds of page faults: a third of the
re-pack's time on a small VM. Raising the mmap threshold (to 32 MiB, the most
glibc allows) and the trim threshold keeps those blocks in the heap for reuse;
resident memory stays bounded by the largest working set plus the trim threshold.
A no-op where the C library is not glibc.
"""

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
_done = False


def keep_heap_blocks() -> bool:
    """Apply once per process; True when glibc accepted the settings."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        # The process's own symbols, where glibc's mallopt is: ctypes.util.find_library("c")
        # runs ldconfig in a child process (and imports subprocess), a hundredth of a second
        # of every `convert`'s start-up.
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
