"""The paths a command reads and writes, checked before any work is done.

An input that exists but is not what the command reads (a folder given as a GGUF, a
character device such as ``/dev/null``) is named for what it is, not reported missing;
an output path that is a folder, or whose folder does not exist, is refused before a
conversion spends its time (the final rename would fail only at the end).
"""

import os
import stat
from pathlib import Path

from gguf_exact.errors import InputError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
)


def what_is(path: Path) -> str | None:
    """``None`` for a regular file (links followed); else what the path is, in words:
    "no such file", "a directory", "a character device", ..."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except NotADirectoryError:
        return "no such file (a part of the path is not a directory)"
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def check_input_file(path: Path, where: str, expected: str = "a GGUF file") -> None:
    """One line when ``path`` is not a regular file: what it is instead."""
    kind = what_is(path)
    if kind is None:
        return
    if kind.startswith(("no such file", "cannot be read")):
        raise InputError(f"{where}: {kind}")
    raise InputError(f"{where}: is {kind}, not {expected}")


def check_input_folder(path: Path, expected: str = "a Hugging Face model folder") -> None:
    """One line when ``path`` is not a folder: missing, or what it is instead."""
    if path.is_dir():
        return
    kind = what_is(path)
    if kind is not None and kind.startswith(("no such file", "cannot be read")):
        raise InputError(f"{path}: no such folder (expected {expected})")
    raise InputError(f"{path}: is {kind or 'a regular file'}, not {expected}")


def check_output_file(path: str | Path, what: str = "output") -> Path:
    """Refuse, before any work, an output path that is a directory (or another
    non-file) or whose directory does not exist; an existing regular file is replaced."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{path}: {what} directory {directory} does not exist")
    kind = what_is(path)
    if kind is not None and not kind.startswith("no such file"):
        raise InputError(f"{path}: the {what} path is {kind}; name a file to write")
    return path
