"""The one way gguf-exact writes a file: a temp file beside it, renamed into place.

Nothing half-written ever sits at an output path. :func:`atomic_output` checks the
output first (:func:`~gguf_exact.formats.paths.check_output_file`: not a folder, its
folder there, none of the command's inputs), says before any work when the free space
is clearly too small for the planned size, and gives a temp file beside it named
``.<name>.gguf-exact-<pid>.part``; only when everything that checks it has passed is it
fsynced, given ordinary permissions and renamed into place. A run killed on the way
leaves at most that temp file, with its pid in the name: the next write of the same
output removes it once that process is gone. An OS error while writing (disk full,
read-only file system, permission denied, the folder gone) becomes one line naming the
output, with the temp file removed.

``GGUF_EXACT_WRITE_FAULT=ENOSPC[@BYTES]`` (any errno name) makes the writes
(:func:`~gguf_exact.formats.gguf_stream.pwrite_all`, :func:`write_text`) fail as the
kernel does once a file would grow past ``BYTES`` (default 0): the fault suite's full
disk where no small file system can be mounted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from gguf_exact.errors import GgufExactError, InputError, OutputError
from gguf_exact.formats.paths import Inputs, check_output_file, same_file

FAULT_ENV = "GGUF_EXACT_WRITE_FAULT"
PART = re.compile(r"\.gguf-exact-(\d+)(?:-\d+)?\.part$")


def temp_name(path: Path, n: int = 0) -> Path:
    """The temp file of this process for ``path`` (``n``: the next one when taken)."""
    extra = f"-{n}" if n else ""
    return path.with_name(f".{path.name}.gguf-exact-{os.getpid()}{extra}.part")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_parts(path: Path) -> list[Path]:
    """Remove the temp files earlier runs left for ``path`` (killed before their rename)
    whose process is gone; returns them."""
    removed = []
    prefix = f".{path.name}.gguf-exact-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent if str(path.parent) else "."):
            m = PART.search(entry.name) if entry.name.startswith(prefix) else None
            if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 10_000_000 else f"{n:,} bytes"


def free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def check_free_space(path: Path, size: int | None) -> None:
    """Refuse, before any work, an output of ``size`` bytes where there is clearly less free."""
    directory = path.parent if str(path.parent) else Path(".")
    free = free_bytes(directory)
    if size is not None and free is not None and free < size:
        raise OutputError(
            f"{path}: needs {_mb(size)} but {directory} has {_mb(free)} free; "
            "free some space there or write the output elsewhere"
        )


def write_failure(path: Path, err: OSError, size: int | None = None) -> OutputError:
    """The one line for an OS error met while writing ``path``."""
    directory = path.parent if str(path.parent) else Path(".")
    code = err.errno
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        free = free_bytes(directory)
        needed = f"needed {_mb(size)}, " if size else ""
        have = f"{_mb(free)} free" if free is not None else "free space unknown"
        what = "file too large for" if code == errno.EFBIG else "no space left on"
        return OutputError(
            f"{path}: {what} the file system of {directory} ({needed}{have}); "
            "nothing was written: free some space there or write the output elsewhere"
        )
    if code == errno.EROFS:
        return OutputError(f"{path}: {directory} is on a read-only file system; write the output elsewhere")
    if code in (errno.EACCES, errno.EPERM):
        return OutputError(f"{path}: permission denied writing in {directory}; write the output elsewhere")
    if code in (errno.ENOENT, errno.ENOTDIR) and not directory.is_dir():
        return OutputError(f"{path}: the output's folder {directory} is gone; create it and run again")
    return OutputError(f"{path}: cannot write ({err.strerror or err}); nothing was written")


def _create_temp(path: Path) -> Path:
    for n in range(100):
        tmp = temp_name(path, n)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return tmp
        except FileExistsError:
            continue
    raise OutputError(f"{path}: 100 temp files of this process already beside it; remove {temp_name(path)}*")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path: str | Path, size: int | None = None, inputs: Inputs | None = None) -> Iterator[Path]:
    """Yield a temp path beside ``path``; if the body succeeds, fsync it, give it the
    permissions a new file gets here (0666 less the umask, not the temp file's 0600) and
    rename it into place; otherwise remove it. ``size``: the planned size, held against
    the free space first; ``inputs``: paths the output must not be, besides those the
    command recorded. OS errors on the way become :class:`~gguf_exact.errors.OutputError`."""
    path = check_output_file(path, inputs=inputs)
    remove_stale_parts(path)
    check_free_space(path, size)
    try:
        tmp = _create_temp(path)
    except OSError as err:
        raise write_failure(path, err, size) from None
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        check_output_file(path, inputs=inputs)  # still none of the inputs (a link made meanwhile)
        os.replace(tmp, path)
    except GgufExactError:
        raise
    except OSError as err:
        if err.filename is not None and not any(same_file(err.filename, p) for p in (tmp, path, path.parent)):
            # an input that failed to be read inside the body, not the output
            raise InputError(f"{err.filename}: {err.strerror or err}; nothing was written at {path}") from None
        raise write_failure(path, err, size) from None
    finally:
        tmp.unlink(missing_ok=True)


def output_folder(folder: str | Path) -> Path:
    """Create ``folder`` (and its parents) for outputs; an OS error is one line."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{folder}: is a file, not a folder to write into; name a folder") from None
    except OSError as err:
        raise write_failure(folder, err) from None
    return folder


def write_text(path: str | Path, text: str, inputs: Inputs | None = None) -> Path:
    """``text`` written at ``path`` as every output is (:func:`atomic_output`); returns the path."""
    data = text.encode()
    with atomic_output(path, len(data), inputs) as tmp:
        injected_fault(0, len(data))
        tmp.write_bytes(data)
    return Path(path)


def injected_fault(offset: int, length: int) -> None:
    """Raise the OSError ``GGUF_EXACT_WRITE_FAULT`` asks for when a write of ``length``
    bytes at ``offset`` reaches past its byte limit (nothing when it is unset)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    name, _, limit = spec.partition("@")
    if offset + length > int(limit or 0):
        code = getattr(errno, name.upper())
        raise OSError(code, os.strerror(code))


__all__ = [
    "atomic_output",
    "check_free_space",
    "output_folder",
    "remove_stale_parts",
    "temp_name",
    "write_failure",
    "write_text",
]
