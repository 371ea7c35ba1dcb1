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

A command that writes more than one file (a model and its ``--report``, a profile)
opens :func:`staged_outputs` around its work: every write inside leaves its checked,
fsynced temp file beside its destination, and only when all of them are written are
they renamed into place, so a report that cannot be written leaves the model that was
already at the output as it was. :meth:`StagedOutputs.reserve` makes a temp file before
the work, so an output that cannot be written at all stops the command at its start.

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
from contextvars import ContextVar
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


class StagedOutputs:
    """The outputs of one command, each written to a temp file beside it and renamed into
    place together once every one of them is written (:func:`staged_outputs`)."""

    def __init__(self) -> None:
        self._pending: dict[Path, tuple[Path, int | None, Inputs | None]] = {}  # output -> (temp file, size, inputs)
        self._reserved: set[Path] = set()  # temp files made ahead, not written yet

    def reserve(self, path: str | Path, inputs: Inputs | None = None) -> Path:
        """Make ``path``'s temp file now, before the command's work (an output that cannot
        be written stops here, not after hours); a later :func:`atomic_output` of the same
        path inside this stage writes that temp file."""
        path = check_output_file(path, inputs=inputs)
        tmp = self._create(path, None, inputs)
        self._reserved.add(tmp)
        return tmp

    def _create(self, path: Path, size: int | None, inputs: Inputs | None) -> Path:
        if path in self._pending:
            return self._pending[path][0]
        remove_stale_parts(path)
        check_free_space(path, size)
        try:
            tmp = _create_temp(path)
        except OSError as err:
            raise write_failure(path, err, size) from None
        self._pending[path] = (tmp, size, inputs)
        return tmp

    @contextlib.contextmanager
    def output(self, path: str | Path, size: int | None = None, inputs: Inputs | None = None) -> Iterator[Path]:
        """Yield ``path``'s temp file (the reserved one, if any); kept for :meth:`commit`
        when the body succeeds, removed when it fails."""
        path = check_output_file(path, inputs=inputs)
        reserved = path in self._pending and self._pending[path][0] in self._reserved
        if reserved:
            check_free_space(path, size)
        tmp = self._create(path, size, inputs)
        self._reserved.discard(tmp)
        try:
            yield tmp
        except GgufExactError:
            self._drop(path)
            raise
        except OSError as err:
            self._drop(path)
            if err.filename is not None and not any(same_file(err.filename, p) for p in (tmp, path, path.parent)):
                # an input that failed to be read inside the body, not the output
                raise InputError(f"{err.filename}: {err.strerror or err}; nothing was written at {path}") from None
            raise write_failure(path, err, size) from None
        except BaseException:
            self._drop(path)
            raise

    def _drop(self, path: Path) -> None:
        tmp = self._pending.pop(path)[0]
        self._reserved.discard(tmp)
        tmp.unlink(missing_ok=True)

    def commit(self) -> None:
        """Every temp file fsynced, given the permissions a new file gets here (0666 less
        the umask, not the temp file's 0600) and checked again (still none of the inputs: a
        link made meanwhile); only then is each renamed into place, in the order staged."""
        mode = 0o666 & ~_umask()
        for path, (tmp, size, inputs) in self._pending.items():
            if tmp in self._reserved:
                raise OutputError(f"{path}: reserved but never written; nothing was written")  # a bug, said plainly
            try:
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.chmod(tmp, mode)
            except OSError as err:
                raise write_failure(path, err, size) from None
            check_output_file(path, inputs=inputs)
        for path, (tmp, size, _) in list(self._pending.items()):
            try:
                os.replace(tmp, path)
            except OSError as err:
                raise write_failure(path, err, size) from None
            del self._pending[path]

    def discard(self) -> None:
        """Remove every temp file not renamed into place."""
        for tmp, *_ in self._pending.values():
            tmp.unlink(missing_ok=True)
        self._pending.clear()
        self._reserved.clear()


# The running command's stage, when it has opened one: every atomic_output joins it.
_STAGE: ContextVar[StagedOutputs | None] = ContextVar("gguf_exact_stage", default=None)


@contextlib.contextmanager
def staged_outputs() -> Iterator[StagedOutputs]:
    """Within: every :func:`atomic_output` (and :func:`write_text`) writes its temp file
    and leaves it there; when the body ends without an error all of them are renamed into
    place (:meth:`StagedOutputs.commit`), else all are removed, so a command that writes a
    model and its report changes neither when either fails. Nested uses join the
    outermost stage."""
    outer = _STAGE.get()
    if outer is not None:
        yield outer
        return
    stage = StagedOutputs()
    token = _STAGE.set(stage)
    reset = False
    try:
        yield stage
        _STAGE.reset(token)
        reset = True
        stage.commit()
    finally:
        if not reset:
            _STAGE.reset(token)
        stage.discard()


@contextlib.contextmanager
def atomic_output(path: str | Path, size: int | None = None, inputs: Inputs | None = None) -> Iterator[Path]:
    """Yield a temp path beside ``path``; if the body succeeds, fsync it, give it the
    permissions a new file gets here (0666 less the umask, not the temp file's 0600) and
    rename it into place; otherwise remove it. ``size``: the planned size, held against
    the free space first; ``inputs``: paths the output must not be, besides those the
    command recorded. OS errors on the way become :class:`~gguf_exact.errors.OutputError`.
    Inside :func:`staged_outputs` the rename waits for the stage's other outputs."""
    with staged_outputs() as stage, stage.output(path, size, inputs) as tmp:
        yield tmp


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
    "StagedOutputs",
    "atomic_output",
    "check_free_space",
    "output_folder",
    "remove_stale_parts",
    "staged_outputs",
    "temp_name",
    "write_failure",
    "write_text",
]
