"""The ``repack`` command: a main model's GGUF re-packed as exact Q4_0 from its QAT checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from gguf_exact.cli import console
from gguf_exact.cli.app import main
from gguf_exact.cli.console import fitted_table, human_size, pct, say, tensor_progress


@main.command()
@click.option(
    "--donor",
    "donor",
    required=True,
    type=click.Path(path_type=Path),
    help="The GGUF to re-pack (e.g. Google's QAT GGUF); its metadata and layout are kept.",
)
@click.option(
    "--source",
    "source",
    required=True,
    type=click.Path(path_type=Path),
    help="The unquantized QAT checkpoint (HF folder) of the same model.",
)
@click.argument("out_gguf", type=click.Path(path_type=Path))
@click.option(
    "--off-grid",
    type=click.Choice(["keep", "q8_0", "f16", "bf16", "f32"]),
    help="For QAT matrices with blocks off the grid: keep the donor's tensor, or store the source in this type (default: stop).",
)
@click.option("--expect-sha256", help="Fail, leaving no output, unless the file has this sha256.")
@click.option("--report", "report_path", type=click.Path(path_type=Path), help="Write a per-tensor JSON report here.")
@click.option(
    "--donor-stats",
    type=click.Choice(["sample", "all"]),
    default="sample",
    show_default=True,
    help="Measure the donor against the source on every 32nd chunk of re-packed tensors, or on all.",
)
@click.option("--workers", type=int, help="Worker threads (default: 2, or fewer CPUs).")
@click.option(
    "--bf16",
    "bf16_reference",
    is_flag=True,
    help="Write the bf16 reference: the donor's header and tensors, every matrix the source's own bytes.",
)
def repack(
    donor: Path,
    source: Path,
    out_gguf: Path,
    off_grid: str | None,
    expect_sha256: str | None,
    report_path: Path | None,
    donor_stats: str,
    workers: int | None,
    bf16_reference: bool,
) -> None:
    """Re-pack a Gemma 4 GGUF as exact Q4_0 from its QAT checkpoint.

    Keeps the donor's header and metadata (tokenizer, chat template,
    hyperparameters) byte for byte except general.file_type; rewrites every tensor
    that maps to an on-grid source matrix as exact Q4_0 (layer matrices,
    token_embd, per_layer_token_embd, per_layer_model_proj, expert banks) and
    copies every other tensor. Streams in chunks of rows: memory stays bounded
    whatever the model size. The file is written beside OUT_GGUF, read back and
    checked, then renamed into place; on any failure nothing is left at OUT_GGUF.
    With --bf16 it writes the bf16 reference instead (what `quality` measures
    against): the same header and tensor order, every matrix with a source holding
    the source's bf16 bits, every other tensor the donor's.
    """
    from gguf_exact.repack.pipeline import repack_model

    with tensor_progress("repack") as progress:
        result = repack_model(
            donor, source, out_gguf, off_grid, expect_sha256, report_path, workers, donor_stats, progress,
            bf16_reference=bf16_reference,
        )  # fmt: skip
    columns = [("kind", "left"), ("n", "right"), ("type", "left"), ("size (of donor)", "right")]
    columns += [("bit-exact", "right")]

    def rows(compact: bool) -> list[list[str]]:
        def types(mix: str) -> str:
            return "+".join(t.split(" x")[0] for t in mix.split(", "))

        return [
            [
                k.kind,
                str(k.tensors),
                f"{types(k.donor_types)} → {types(k.output_types)}",
                f"{human_size(k.output_bytes)} ({k.output_bytes / max(1, k.donor_bytes):.0%})",
                f"{pct(k.donor_exact_fraction, 2)} → {pct(k.exact_fraction, 2)}",
            ]
            for k in result.kinds
        ]

    title = f"{donor.name} → {out_gguf.name}, per kind of tensor (donor → output)"
    console.out.print(fitted_table(title, columns, rows, wrap=(0, 2)))
    sizes = f"{result.size:,} bytes; donor {result.donor_size:,}, {result.size / result.donor_size:.1%}"
    done = (
        f"{result.source_tensors} tensors hold the source's bytes"
        if bf16_reference
        else f"{result.repacked_tensors} tensors re-packed as exact Q4_0"
    )
    say(f"wrote {result.path} ({sizes}); {done}, {result.copied_tensors} copied")
    ours, theirs = result.repacked_stats, result.donor_stats
    if ours:
        line = f"re-packed values bit-exact: {ours.exact:,} of {ours.n_values:,} ({ours.exact_fraction:.4%}), largest error {ours.max_ulps} bf16 ULP"
        if theirs:
            line += f"; the donor's: {theirs.exact_fraction:.4%} (sampled over {theirs.n_values:,} values)"
        say(line)
    for name, what in result.off_grid:
        say(f"off grid: {name}: {what}")
    if result.source_only:
        say(
            f"source tensors the donor lacks ({len(result.source_only)}, not written): {', '.join(result.source_only[:8])}"
            + (" ..." if len(result.source_only) > 8 else "")
        )
    if result.unmapped:
        say(f"donor tensors with no known source ({len(result.unmapped)}, copied): {', '.join(result.unmapped[:8])}")
    s = result.seconds
    say(
        f"{s['total']:.1f} s (write {s['write']:.1f} s, read-back {s['verify']:.1f} s); sha256 {result.sha256}"
        + ("  (matches --expect-sha256)" if expect_sha256 else "")
    )
