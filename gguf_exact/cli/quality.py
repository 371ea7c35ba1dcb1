"""The ``quality`` command: files measured in the model's terms (KL divergence, acceptance)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gguf_exact.cli import console
from gguf_exact.cli.app import main
from gguf_exact.cli.console import fitted_table, say, tensor_progress

PATH = click.Path(path_type=Path)


@main.command()
@click.argument("gguf_paths", nargs=-1, type=PATH)
@click.option("--source", type=PATH, help="The QAT checkpoint (HF folder) the files were made from.")
@click.option("--donor", type=PATH, help="Main models: the donor GGUF; the bf16 reference takes its header.")
@click.option("--vocab-from", "vocab_from", type=PATH, help="Drafters: refused here; use --target and --prompts.")
@click.option("--reference", type=PATH, help="Main models: a bf16 reference already written (repack --bf16).")
@click.option("--text", type=PATH, help="Main models: the text to score (e.g. wikitext-2's test split).")
@click.option("--chunks", type=int, default=16, show_default=True, help="Windows of --ctx tokens scored.")
@click.option("--ctx", type=int, default=512, show_default=True, help="Tokens per window.")
@click.option("--threads", type=int, help="llama-perplexity threads (default: every CPU).")
@click.option("--target", type=PATH, help="Drafters: the target GGUF every drafter speculates for.")
@click.option("--prompts", type=PATH, help="Drafters: one prompt per non-empty line.")
@click.option("--n-predict", "n_predict", type=int, default=64, show_default=True, help="Drafters: tokens per prompt.")
@click.option(
    "--work",
    type=PATH,
    help="Where references are cached and log-probabilities written (default: the cache's quality/).",
)
@click.option("--plot", "plot_path", type=PATH, help="Also draw the figures as a PNG here (needs matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
def quality(
    gguf_paths: tuple[Path, ...],
    source: Path | None,
    donor: Path | None,
    vocab_from: Path | None,
    reference: Path | None,
    text: Path | None,
    chunks: int,
    ctx: int,
    threads: int | None,
    target: Path | None,
    prompts: Path | None,
    n_predict: int,
    work: Path | None,
    plot_path: Path | None,
    as_json: bool,
) -> None:
    """Measure GGUF files in the model's terms, against their bf16 reference.

    Main models (--source SRC_DIR --donor DONOR.gguf --text FILE A.gguf B.gguf ...):
    builds (once, cached) the bf16 reference with the donor's header over the
    source's own bytes (repack --bf16), runs llama-perplexity on it for the base
    log-probabilities, then once per file with --kl-divergence, and prints per file:
    mean KL divergence, its 99th percentile, same top token, PPL ratio to the
    reference, size.

    Drafters (--target T.gguf --prompts FILE [--source SRC_DIR] D1.gguf D2.gguf ...):
    each drafter's draft acceptance against the same target on the same prompts
    (llama-server, greedy); with --source the bf16 drafter made from it comes first
    and is the reference.
    """
    from gguf_exact.quality.forms import run_quality
    from gguf_exact.quality.report import plot_quality
    from gguf_exact.quality.request import QualityRequest

    request = QualityRequest(
        gguf_paths, source=source, donor=donor, vocab_from=vocab_from, reference=reference, text=text,
        chunks=chunks, ctx=ctx, threads=threads, target=target, prompts=prompts, n_predict=n_predict, work=work,
    )  # fmt: skip
    with tensor_progress("quality", not as_json) as progress:
        report = run_quality(request, progress)
    if plot_path is not None:
        plot_quality(report, plot_path)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    head, cells = report.table()
    columns = [(h, "left" if i == 0 else "right") for i, h in enumerate(head)]
    console.out.print(fitted_table(report.note(), columns, lambda compact: cells))
    if plot_path is not None:
        say(f"plot: {plot_path}")
