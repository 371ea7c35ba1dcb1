"""The paths a command reads and writes, checked before any work is done.

An input that exists but is not what the command reads (a folder given as a GGUF, a
character device such as ``/dev/null``) is named for what it is, not reported missing;
an output path that is a folder, or whose folder does not exist, is refused before a
conversion spends its time (the final rename would fail only at the end).

**No output is ever one of the command's inputs.** Every input checked here
(:func:`check_input_file`, :func:`check_input_folder`: the GGUF reader and the checkpoint
reader go through them) or named with :func:`reads` is recorded for the running command
(:func:`one_command`: the CLI opens one per command, the API functions that write their
own), and :func:`check_output_file`, which every write goes through (the safe writer
calls it again just before it writes), refuses an output that is the same file as any of
them: same device and inode, so a symlink, a hard link or a ``..`` spelling is caught as
well as the same string. A folder input stands for every file in it.
"""

import contextlib
import os
import stat
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

from gguf_exact.errors import ArgumentError, InputError, Param

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


# The inputs of the running command, as (what the command calls it, path); None: no
# command is recording (a bare library call outside any API function that writes).
_READS: ContextVar[list[tuple[str | Param, Path]] | None] = ContextVar("gguf_exact_reads", default=None)
MAX_FOLDER_FILES = 100_000  # a folder input's files compared one by one, up to this many


@contextlib.contextmanager
def one_command() -> Iterator[None]:
    """Record, from here on, what the command reads, so that none of it can be written.
    Nested uses share the outermost record (the CLI's, around an API function's own).
    Also a decorator: ``@one_command()``."""
    if _READS.get() is not None:
        yield
        return
    token = _READS.set([])
    try:
        yield
    finally:
        _READS.reset(token)


def reads(path: str | Path, what: str | Param = "input") -> None:
    """Record ``path`` (a file, or a folder: every file in it) as an input of the running
    command, called ``what`` in messages."""
    record = _READS.get()
    if record is not None:
        record.append((what, Path(path)))


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _files(path: Path) -> Iterator[Path]:
    """``path`` itself, or, for a folder, the files in it (links followed, as the readers do)."""
    if not path.is_dir():
        yield path
        return
    count = 0
    for root, _dirs, names in os.walk(path, followlinks=True):
        for name in names:
            yield Path(root) / name
            count += 1
            if count >= MAX_FOLDER_FILES:
                return


Inputs = dict[str | Param, str | Path | None]  # what the command calls each input -> its path


def check_not_input(path: Path, inputs: Inputs | None = None) -> None:
    """Refuse ``path`` as an output when it is the same file (device and inode) as one of
    ``inputs`` (what each is called -> a file or folder) or of the running command's
    recorded inputs. A path that does not exist yet is no input's."""
    target = _identity(path)
    if target is None:
        return
    named = [(what, Path(p)) for what, p in (inputs or {}).items() if p is not None]
    for what, given in named + list(_READS.get() or ()):
        for f in _files(given):
            if _identity(f) != target:
                continue
            same = "is" if os.path.abspath(f) == os.path.abspath(path) else "is the same file as"
            raise ArgumentError(
                f"{path}: the output {same} the ",
                what,
                f" {f}, which this command reads; nothing was written: name another output path",
            )


def check_input_file(path: Path, where: str, expected: str = "a GGUF file") -> None:
    """One line when ``path`` is not a regular file: what it is instead. The path is
    recorded as an input of the running command (:func:`reads`)."""
    reads(path, "input file" if where == str(path) else where.removesuffix(f" {path}"))
    kind = what_is(path)
    if kind is None:
        return
    if kind.startswith(("no such file", "cannot be read")):
        raise InputError(f"{where}: {kind}")
    raise InputError(f"{where}: is {kind}, not {expected}")


def check_input_folder(path: Path, expected: str = "a Hugging Face model folder") -> None:
    """One line when ``path`` is not a folder: missing, or what it is instead. The folder
    (every file in it) is recorded as an input of the running command (:func:`reads`)."""
    reads(path, "source folder's file")
    if path.is_dir():
        return
    kind = what_is(path)
    if kind is not None and kind.startswith(("no such file", "cannot be read")):
        raise InputError(f"{path}: no such folder (expected {expected})")
    raise InputError(f"{path}: is {kind or 'a regular file'}, not {expected}")


def check_output_file(path: str | Path, what: str = "output", inputs: Inputs | None = None) -> Path:
    """Refuse, before any work, an output path that is a directory (or another
    non-file), whose directory does not exist, or that is one of the command's inputs
    (``inputs``: what each is called -> path, and those recorded: :func:`check_not_input`);
    any other existing regular file is replaced."""
    path = Path(path)
    check_not_input(path, inputs)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{path}: {what} directory {directory} does not exist")
    kind = what_is(path)
    if kind is not None and not kind.startswith("no such file"):
        raise InputError(f"{path}: the {what} path is {kind}; name a file to write")
    return path


def same_file(a: str | Path, b: str | Path) -> bool:
    """``a`` and ``b`` name one file: the same absolute path, or the same device and inode."""
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    ident = _identity(Path(a))
    return ident is not None and ident == _identity(Path(b))


def check_output_files(out_path: str | Path, report_path: str | Path | None, inputs: Inputs) -> Path:
    """A command's output and its optional report, checked as :func:`check_output_file`
    does (neither one of ``inputs``), and not one and the same path."""
    out_path = check_output_file(out_path, inputs=inputs)
    if report_path is not None:
        check_output_file(report_path, "report", inputs=inputs)
        if same_file(report_path, out_path):
            raise ArgumentError(
                Param("report_path"), f" {report_path}: is the output {out_path} itself; name another report path"
            )
    return out_path
