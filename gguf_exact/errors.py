"""One exception type for every user-facing failure.

The CLI prints ``error: <message>`` on one line and exits 1, so each message names
the file, tensor or field at fault and, where it helps, what to do next.
"""


class GgufExactError(Exception):
    """A failure the user can act on; ``str(err)`` is a single line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class OffGridError(GgufExactError):
    """A matrix that should be Q4_0 has blocks off the 4-bit grid."""
