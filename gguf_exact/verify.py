"""Verify any file gguf-exact writes: a drafter as ``convert`` writes it, a main model as ``repack`` does.

:func:`verify_file` reads the file's header once, tells which writer's plan applies
(the source's ``config.json`` names a drafter, and no donor is given: ``convert``'s;
else ``repack``'s), holds the file to it (:func:`gguf_exact.drafter.verify.verify_gguf`,
:func:`gguf_exact.repack.check.verify_model`) and hashes it.
"""

from __future__ import annotations

from pathlib import Path

from gguf_exact.errors import ArgumentError, Param
from gguf_exact.formats.checkpoint import read_config
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.formats.gguf_reader import open_gguf
from gguf_exact.formats.paths import check_input_folder
from gguf_exact.progress import Progress
from gguf_exact.stream.verify import Verification


def is_drafter_source(source: str | Path) -> bool:
    """True when the checkpoint's ``config.json`` names a Gemma 4 assistant (drafter) architecture."""
    from gguf_exact.gemma4.assistant import SUPPORTED_ARCHITECTURES

    archs = read_config(Path(source) / "config.json").get("architectures")
    return isinstance(archs, list) and any(a in SUPPORTED_ARCHITECTURES for a in archs)


def verify_file(
    path: str | Path,
    source: str | Path,
    vocab_from: str | Path | None = None,
    donor: str | Path | None = None,
    off_grid: str | None = None,
    progress: Progress | None = None,
) -> Verification:
    """Hold the GGUF at ``path`` to what gguf-exact writes for ``source``, header to last
    block, and hash it (:attr:`Verification.sha256`). A drafter's ``vocab_from`` is the
    target whose tokenizer it carries; a re-pack's ``donor`` the GGUF it was re-packed
    from. Never raises for a file that does not pass: see :meth:`Verification.ok`."""
    from gguf_exact.drafter.verify import verify_gguf
    from gguf_exact.repack.check import verify_model

    source = Path(source)
    with open_gguf(path) as gguf:
        check_input_folder(source)
        if donor is None and is_drafter_source(source):
            v = verify_gguf(gguf, source, progress=progress, vocab_from=vocab_from, off_grid=off_grid)
        elif vocab_from is not None:
            raise ArgumentError(
                Param("vocab_from"),
                f" {vocab_from}: a re-packed file carries its donor's tokenizer; give ",
                Param("donor"),
                " instead",
            )
        else:
            v = verify_model(gguf, source, donor=donor, off_grid=off_grid, progress=progress)
    v.sha256 = sha256_file(path)
    return v


__all__ = ["is_drafter_source", "verify_file"]
