"""A donor GGUF: the file whose header, metadata and unmapped tensors a re-pack keeps.

Opened with :func:`gguf_exact.formats.gguf_reader.open_gguf` (header parsed by hand from
the file, tensors read with ``pread`` in row chunks, every structural check done once);
here only its architecture is checked: a re-pack knows the tables of ``gemma4`` and
``gemma4-assistant``.
"""

from pathlib import Path

from gguf_exact.errors import InputError
from gguf_exact.formats.gguf_reader import GgufFile, open_gguf
from gguf_exact.gemma4.assistant import ARCH as ASSISTANT_ARCH
from gguf_exact.gemma4.names import ARCH as TARGET_ARCH

SUPPORTED_ARCHS = (TARGET_ARCH, ASSISTANT_ARCH)
Donor = GgufFile


def open_donor(path: str | Path, role: str = "") -> Donor:
    """Open and check a GGUF whose architecture has a name table here."""
    gguf = open_gguf(path, role)
    if gguf.architecture not in SUPPORTED_ARCHS:
        gguf.close()
        raise InputError(
            f"{gguf.path}: general.architecture is {gguf.architecture or 'missing'}; "
            f"expected one of {', '.join(SUPPORTED_ARCHS)}"
        )
    return gguf
