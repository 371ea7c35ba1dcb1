"""Progress over tensors: the callback long-running API calls take, and how they report.

A progress callback is called with each tensor's name as work on it starts. One that
also has a ``start(total)`` method is told first how many calls will come (the CLI's
progress bar uses it); a plain function is enough otherwise.
"""

from __future__ import annotations

from typing import Callable, Protocol


class Progress(Protocol):
    def __call__(self, name: str, /) -> None: ...  # positional: any Callable[[str], None] is one


def announce(progress: Callable[[str], None] | None, total: int) -> None:
    """Tell ``progress`` how many tensors are coming, when it wants to know."""
    start = getattr(progress, "start", None)
    if start is not None:
        start(total)


__all__ = ["Progress", "announce"]
