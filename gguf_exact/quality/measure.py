"""``quality`` for main models: files against their bf16 reference, through llama-perplexity.

The reference is what ``repack --bf16`` writes for the donor and source (the donor's
header and tensor order over the source's own bytes), so every file compared was made
with the same metadata and differs only in how weights are stored. It is built once
into the cache (``<cache>/quality/``, keyed by the donor's and the source's names, sizes
and times) or given as ``reference``; llama-perplexity then runs once on it for the base
log-probabilities and once per file.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from gguf_exact.builds.llama_build import cache_root
from gguf_exact.errors import ArgumentError, InputError, Param
from gguf_exact.formats.paths import check_input_folder
from gguf_exact.progress import Progress, announce
from gguf_exact.quality.perplexity import check_window, perplexity_binary, run_base, run_kld
from gguf_exact.quality.report import QualityReport, QualityRow
from gguf_exact.quality.request import QualityRequest
from gguf_exact.version import __version__

DRAFTER_NOTE = (
    "a drafter does not run alone in llama-perplexity (it reads its target's hidden state); "
    "measure drafters by acceptance with "
)


def _stamp(path: Path) -> list:
    st = path.stat()
    return [path.name, st.st_size, st.st_mtime_ns]


def reference_key(donor: Path, source: Path) -> str:
    """A name for the reference of ``donor`` and ``source``: changes when either does."""
    files = sorted(p for p in source.iterdir() if p.is_file())
    parts = [__version__, str(donor.resolve()), _stamp(donor), str(source.resolve())] + [_stamp(p) for p in files]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def work_dir(work: str | Path | None) -> Path:
    """Where references are cached and base log-probabilities written: ``work``, else
    ``<cache>/quality`` (2 GB of log-probabilities at E2B's vocabulary, 16 x 512)."""
    folder = Path(work) if work is not None else cache_root() / "quality"
    if not folder.parent.is_dir():
        raise InputError(f"{folder}: its parent folder does not exist")
    folder.mkdir(exist_ok=True)
    return folder


def reference_for(donor: Path, source: Path, work: Path) -> Path:
    """The bf16 reference of ``donor`` and ``source`` (``repack --bf16``) cached in ``work``,
    built the first time; the write path reads it back before it is placed, as every output."""
    from gguf_exact.repack.pipeline import repack_model

    path = work / f"{donor.stem}-bf16-reference-{reference_key(donor, source)}.gguf"
    if not path.is_file():
        repack_model(donor, source, path, bf16_reference=True)
    return path


def measure_quality(request: QualityRequest, progress: Progress | None = None) -> QualityReport:
    """Each of ``request.files`` against the bf16 reference of ``source`` (built from
    ``donor`` into ``work``, :func:`work_dir`, or the ``reference`` given) on ``chunks``
    windows of ``ctx`` tokens of ``text``: mean and 99th-percentile KL divergence, same top
    token, PPL ratio, size. The drafters' fields of the request are not read here."""
    r = request
    files, donor, vocab_from, reference, chunks, ctx, threads = (
        r.files, r.donor, r.vocab_from, r.reference, r.chunks, r.ctx, r.threads,
    )  # fmt: skip
    if r.source is None or r.text is None:
        raise ArgumentError("main models are measured with both ", Param("source"), " and ", Param("text"))
    source, text = Path(r.source), Path(r.text)
    if vocab_from is not None:
        raise ArgumentError(
            Param("vocab_from"), f" {vocab_from}: {DRAFTER_NOTE}", Param("target"), " and ", Param("prompts")
        )
    if donor is None and reference is None:
        raise ArgumentError(
            "give ", Param("donor"), " (the GGUF the reference takes its header from) or ", Param("reference")
        )
    if not files:
        raise ArgumentError("no files to measure: name one or more GGUF files")
    check_window(ctx, chunks)
    check_input_folder(source)
    if not text.is_file():
        raise InputError(f"{text}: no such text file")
    paths = [Path(f) for f in files]
    for p in paths:
        if not p.is_file():
            raise InputError(f"{p}: no such GGUF file")
    binary = perplexity_binary()
    announce(progress, len(paths) + 2)
    if progress:
        progress("bf16 reference")
    scratch = work_dir(r.work)
    if reference is not None:
        ref = Path(reference)
    else:
        assert donor is not None  # one of the two, checked above
        ref = reference_for(Path(donor), source, scratch)
    if not ref.is_file():
        raise InputError(f"{ref}: no such reference GGUF")
    report = QualityReport(ref, text, ctx, chunks)
    with tempfile.TemporaryDirectory(prefix=".base-", dir=scratch) as tmp:
        base = Path(tmp) / "reference.kld"
        if progress:
            progress(f"base logits: {ref.name}")
        run_base(binary, ref, text, base, ctx, chunks, threads)
        for p in paths:
            if progress:
                progress(p.name)
            f = run_kld(binary, p, base, ctx, chunks, threads)
            report.ppl_reference = f.ppl_base
            report.rows.append(QualityRow(str(p), f.mean_kld, f.p99_kld, f.same_top, f.ppl_ratio, p.stat().st_size))
    return report
