"""``llama-perplexity`` as a measuring instrument: run it, read its figures.

The base run (``--kl-divergence-base FILE``) stores the reference's log-probabilities
and the tokens it scored; each other run (``--kl-divergence``) scores another file on
those tokens against them and prints llama.cpp's statistics, which :func:`parse_kld`
reads: mean KL divergence, its 99th percentile, the share of positions whose top token
is the reference's, and the ratio of perplexities. The binary is the one the project's
build installs beside llama-server (:func:`gguf_exact.builds.llama_build.find_build`).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.builds.llama_build import build_command, find_build, make_command
from gguf_exact.constants import LLAMA_PERPLEXITY_ENV, llama_perplexity_bin
from gguf_exact.errors import ArgumentError, BuildError, InputError, Param

BINARY = "llama-perplexity"
# llama-perplexity prints statistics only over at least 100 scored positions (the
# second half of each window: ctx - 1 - ctx // 2 per chunk)
MIN_SCORED = 100
BASE_HEADER = 20  # "_logits_", n_ctx, n_vocab, n_chunk; then the tokens, then the log-probabilities
OUTPUT_ATTEMPTS = 5  # a busy machine loses the last lines of about one run in six (measured under load 13 on 2 cores)


@dataclass(frozen=True)
class KldFigures:
    """One file against the reference, as llama-perplexity reports it."""

    mean_kld: float
    p99_kld: float
    same_top: float  # a fraction
    ppl_ratio: float  # PPL(file) / PPL(reference)
    ppl: float
    ppl_base: float


FIGURES = {  # name: (the line llama-perplexity prints, its pattern)
    "ppl": ("Mean PPL(Q)", r"Mean PPL\(Q\)\s*:\s*(\S+)"),
    "ppl_base": ("Mean PPL(base)", r"Mean PPL\(base\)\s*:\s*(\S+)"),
    "ppl_ratio": ("Mean PPL(Q)/PPL(base)", r"Mean PPL\(Q\)/PPL\(base\)\s*:\s*(\S+)"),
    "mean_kld": ("Mean KLD", r"Mean\s+KLD:\s*(\S+)"),
    "p99_kld": ("99.0% KLD", r"99\.0%\s+KLD:\s*(\S+)"),
    "same_top": ("Same top p", r"Same top p:\s*(\S+)"),
}


def parse_kld(text: str, where: str) -> KldFigures:
    """The figures of a ``--kl-divergence`` run's output; an :class:`InputError` naming
    ``where`` and the missing line when one is absent."""
    found: dict[str, float] = {}
    for name, (label, pattern) in FIGURES.items():
        m = re.search(pattern, text)
        try:
            value = float(m.group(1)) if m else None
        except ValueError:
            value = None
        if value is None:
            raise InputError(f"{where}: llama-perplexity printed no number on a {label!r} line; {_tail(text)}")
        found[name] = value
    found["same_top"] /= 100.0  # printed as a percentage
    return KldFigures(**found)


def _tail(text: str, n: int = 3) -> str:
    """What llama-perplexity said went wrong: its error lines (level ``E``), else its last lines."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line.split(" E ", 1)[1] for line in lines if re.match(r"^\S+ E ", line)]
    if errors:
        return "it said: " + " | ".join(errors[:n])
    return "its last lines: " + " | ".join(lines[-n:]) if lines else "it printed nothing"


def perplexity_binary() -> Path:
    """The cached build's ``llama-perplexity`` (``$GGUF_EXACT_LLAMA_PERPLEXITY`` first)."""
    path = llama_perplexity_bin()
    if path is not None:
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BuildError(f"{BINARY} {path} (${LLAMA_PERPLEXITY_ENV}): no such executable")
        return path
    build = find_build("cpu")
    if build is None:
        raise BuildError(f"{BINARY} not found; run `{build_command('cpu')}` (or `{make_command('cpu')}`) first")
    return build.binary(BINARY)


def _run(cmd: list[str], where: str, timeout: float) -> str:
    """Its stdout and stderr, together in order. Into a file, not a pipe: llama.cpp's logger
    thread writes line by line, and lines it has not written when the process exits are lost
    (upstream leaks the logger by design, #22142); a file keeps it ahead of the exit."""
    with tempfile.TemporaryFile() as out:
        try:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise InputError(f"{where}: llama-perplexity did not finish within {timeout:.0f} s") from None
        out.seek(0)
        output = out.read().decode("utf-8", "replace")
    if done.returncode != 0:
        raise InputError(f"{where}: llama-perplexity exited with code {done.returncode}; {_tail(output)}")
    return output


def window_args(ctx: int, chunks: int, threads: int | None) -> list[str]:
    """Context, chunks and threads; one window per batch (``-b ctx``), so memory holds one
    window of logits, whatever the vocabulary."""
    return ["-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks), "-t", str(threads or os.cpu_count() or 1)]


def check_window(ctx: int, chunks: int) -> None:
    scored = (ctx - 1 - ctx // 2) * chunks
    if ctx < 16 or chunks < 1 or scored < MIN_SCORED:
        raise ArgumentError(
            Param("ctx"),
            f" {ctx} x ",
            Param("chunks"),
            f" {chunks} scores {scored} positions; llama-perplexity "
            f"reports KL divergence over {MIN_SCORED} or more (each chunk scores ctx - 1 - ctx/2): raise either",
        )


def run_base(
    binary: Path, reference: Path, text: Path, base: Path, ctx: int, chunks: int, threads: int | None = None,
    timeout: float = 7200.0,
) -> str:  # fmt: skip
    """Score ``text`` with ``reference`` and store its log-probabilities at ``base``."""
    cmd = [str(binary), "-m", str(reference), "-f", str(text), "--kl-divergence-base", str(base)]
    output = _run(cmd + window_args(ctx, chunks, threads), str(reference), timeout)
    # It exits 0 when the text is too short, having written only the file's 12-byte header;
    # a full one holds the scored tokens after 20 bytes (its own output can lose lines, below).
    if not base.is_file() or base.stat().st_size < BASE_HEADER + 4 * ctx * chunks:
        raise InputError(
            f"{text}: llama-perplexity scored no windows with {reference.name} (it needs {2 * ctx:,} tokens or "
            f"more for --ctx {ctx}); {_tail(output)}"
        )
    return output


def run_kld(
    binary: Path, model: Path, base: Path, ctx: int, chunks: int, threads: int | None = None, timeout: float = 7200.0
) -> KldFigures:
    """``model`` against the stored reference ``base`` on the same tokens."""
    cmd = [str(binary), "-m", str(model), "--kl-divergence-base", str(base), "--kl-divergence"]
    for attempt in range(1, OUTPUT_ATTEMPTS + 1):
        output = _run(cmd + window_args(ctx, chunks, threads), str(model), timeout)
        try:
            return parse_kld(output, str(model))
        except InputError:
            # a run whose last lines were lost at exit (see _run) is run again
            if attempt == OUTPUT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")
