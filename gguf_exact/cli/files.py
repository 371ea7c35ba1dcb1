"""Commands on checkpoints and the files made from them: ``inspect``, ``convert``, ``verify``, ``compare``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gguf_exact.cli import console
from gguf_exact.cli.app import flags, main, message
from gguf_exact.cli.console import fitted_table, pct, say_fitted, tensor_progress, type_mix
from gguf_exact.errors import ArgumentError, GgufExactError, Param


@main.command()
@click.argument("src_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def inspect(src_dir: Path, as_json: bool) -> None:
    """Show, per tensor, whether a checkpoint sits on the Q4_0 grid.

    SRC_DIR is a Hugging Face folder (config.json and safetensors): a drafter, a main
    model, or any bf16 checkpoint, read in row chunks. For each tensor:
    blocks of 32, the share on the grid, the share of values that can decode
    bit-exactly as Q4_0, and the GGUF type convert would use. The last line says
    whether the checkpoint is QAT 4-bit.
    """
    from gguf_exact.drafter.inspect_qat import inspect_checkpoint

    with tensor_progress("inspect", not as_json) as progress:
        report = inspect_checkpoint(src_dir, progress)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    columns = [("tensor", "left"), ("shape", "left"), ("dtype", "left"), ("blocks", "right")]
    columns += [("on grid", "right"), ("bit-exact", "right"), ("planned", "left")]

    def rows(compact: bool) -> list[list[str]]:
        d = 2 if compact else 4
        return [
            [t.name, "x".join(map(str, t.shape)) or "scalar", t.dtype, str(t.blocks or "-")]
            + [pct(t.on_grid_fraction, d), pct(t.exact_fraction, d), t.planned]
            for t in report.tensors
        ]

    console.out.print(fitted_table(str(src_dir), columns, rows))
    console.out.print(("[green]" if report.is_qat else "[yellow]") + report.verdict)


@main.command()
@click.argument("src_dir", type=click.Path(path_type=Path))
@click.argument("out_gguf", type=click.Path(path_type=Path))
@click.option(
    "--vocab-from",
    "vocab_from",
    required=True,
    type=click.Path(path_type=Path),
    help="The target model's GGUF; its tokenizer.* keys are copied.",
)
@click.option("--report", "report_path", type=click.Path(path_type=Path), help="Write a per-tensor JSON report here.")
@click.option("--expect-sha256", help="Fail, leaving no output, unless the file has this sha256.")
@click.option(
    "--off-grid",
    type=click.Choice(["q8_0", "f16", "bf16", "f32"]),
    help="Store matrices that are off the grid in this type instead of stopping.",
)
@click.option(
    "--bf16",
    "bf16_reference",
    is_flag=True,
    help="Write the bf16 reference: the same header and tensors, every matrix the source's own bytes.",
)
@click.option(
    "--llama-q8-0",
    "llama_q8_0",
    is_flag=True,
    help="Write llama.cpp's Q8_0 peer (convert_hf_to_gguf.py --outtype q8_0's matrices, gguf-py's Q8_0) "
    "under the bf16 reference's header and tensors.",
)
@click.option(
    "--full-head",
    is_flag=True,
    help="Drop the ordered-embedding head (masked_embedding.*) as upstream's converter does: for a llama.cpp "
    "without gguf-exact's patch, which refuses those tensors; drafting then scores all 262,144 tokens.",
)
def convert(
    src_dir: Path,
    out_gguf: Path,
    vocab_from: Path,
    report_path: Path | None,
    expect_sha256: str | None,
    off_grid: str | None,
    bf16_reference: bool,
    llama_q8_0: bool,
    full_head: bool,
) -> None:
    """Convert a Gemma 4 MTP drafter to an exact Q4_0 GGUF.

    SRC_DIR holds a Gemma4AssistantForCausalLM (or Gemma4UnifiedAssistantForCausalLM)
    checkpoint. Every matrix on the grid becomes Q4_0 with its trained levels; norms
    stay F32. The ordered-embedding head (E2B/E4B: masked_embedding.*) is kept when
    the config uses it: centroids as exact Q4_0 (or their own float type when off the
    grid), the token ordering as I32. The file is written
    beside OUT_GGUF, read back and verified, then renamed into place; on any
    failure nothing is left at OUT_GGUF. With --bf16 it writes the bf16 reference
    instead (what `quality` measures against): the exact file's keys and tensor order,
    every matrix the source's bf16 bits. With --llama-q8-0, that header and plan with every
    matrix as llama.cpp's own converter stores it at --outtype q8_0 (norms F32): the peer
    an exact drafter's acceptance and size are compared with.
    """
    from gguf_exact.drafter.convert import convert_drafter, convert_llama_q8_0

    if llama_q8_0 and (bf16_reference or off_grid):
        what = Param("bf16_reference") if bf16_reference else Param("off_grid")
        raise ArgumentError(what, " does not apply with ", Param("llama_q8_0"), ": every matrix is Q8_0")
    with tensor_progress("convert") as progress:
        if llama_q8_0:
            result = convert_llama_q8_0(
                src_dir, out_gguf, vocab_from, expect_sha256, report_path, progress, ordered_head=not full_head
            )
        else:
            result = convert_drafter(
                src_dir, out_gguf, vocab_from, off_grid, expect_sha256, report_path, progress,
                bf16_reference=bf16_reference, ordered_head=not full_head,
            )  # fmt: skip
    t = result.total
    console.out.print(f"wrote {result.path} ({result.size:,} bytes; {type_mix(result.type_counts)})")
    console.out.print(
        f"verified: {t.exact:,} of {t.n_values:,} values bit-exact ({t.exact_fraction:.4%}), largest error {t.max_ulps} bf16 ULP, relative error {t.rel_error:.3e}"
    )
    if result.off_grid_tensors:
        stored = {t.name: t.out_type.lower() for t in result.tensors}
        console.out.print("[yellow]off grid, stored as:[/] " + ", ".join(f"{n} ({stored[n]})" for n in result.off_grid_tensors))
    console.out.print(f"sha256 {result.sha256}" + ("  (matches --expect-sha256)" if expect_sha256 else ""))


@main.command()
@click.argument("gguf_path", type=click.Path(path_type=Path))
@click.option(
    "--source", "source", required=True, type=click.Path(path_type=Path), help="The HF folder the file was made from."
)
@click.option(
    "--vocab-from",
    "vocab_from",
    type=click.Path(path_type=Path),
    help="Drafters: the target GGUF given to convert; its tokenizer.* keys are compared as bytes.",
)
@click.option(
    "--donor",
    type=click.Path(path_type=Path),
    help="Re-packed files: the donor GGUF given to repack; its keys and copied tensors are compared as bytes.",
)
@click.option(
    "--off-grid",
    type=click.Choice(["keep", "q8_0", "f16", "bf16", "f32"]),
    help="The --off-grid choice the file was made with (default: the type the file records for an off-grid matrix).",
)
@click.option(
    "--allow-unchecked",
    is_flag=True,
    help="Pass although some keys or tensors could not be judged (named in the output), e.g. without --vocab-from.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict and per-tensor results as JSON on stdout.")
def verify(
    gguf_path: Path,
    source: Path,
    vocab_from: Path | None,
    donor: Path | None,
    off_grid: str | None,
    allow_unchecked: bool,
    as_json: bool,
) -> None:
    """Prove a GGUF is what convert or repack writes for its source, header to last block; exit 1 if not.

    Recomputes the plan from the source (every key, every tensor, every Q4_0 block)
    and reads the file beside it in row chunks. A Q4_0 block passes only if it decodes
    at least as many values bit-exactly as the plan's block (+0 and -0 equal) and no
    value further from the source than the plan's worst: another scale that is as exact
    passes and is counted. Every tensor must have the planned type and shape (norms
    F32 holding the source's bits; an off-grid matrix the bytes --off-grid defines),
    none may be missing or extra, and the keys must be the ones the writer writes.
    What cannot be judged (a drafter's tokenizer without --vocab-from, a re-pack's
    donor keys without --donor) is named, and fails unless --allow-unchecked is given.
    The output ends with the verdict: `verify: PASS`, `FAIL` or `INCOMPLETE` (one line on
    a terminal wide enough; wrapped to a narrower one, like every line).
    """
    from gguf_exact.verify import verify_file

    try:
        with tensor_progress("verify", not as_json) as progress:
            v = verify_file(gguf_path, source, vocab_from, donor, off_grid, progress)
    except GgufExactError as e:
        if as_json:
            click.echo(json.dumps({"ok": False, "path": str(gguf_path), "error": message(e)}, indent=2))
        raise
    if as_json:
        click.echo(json.dumps({"sha256": v.sha256} | v.as_dict(allow_unchecked, flags()), indent=2))
    else:
        columns = [("tensor", "left"), ("type", "left"), ("judged", "left"), ("values", "right")]
        columns += [("bit-exact", "right"), ("max ULP", "right"), ("rel. error", "right")]
        columns += [("blocks: as planned / equal / more / less exact", "right")]

        def rows(compact: bool) -> list[list[str]]:
            out = []
            for t in v.tensors + [v.total]:
                b = t.blocks
                blocks = f"{b.as_planned:,}/{b.equally_exact:,}/{b.more_exact:,}/{b.less_exact:,}" if b else "-"
                figures = (
                    (
                        pct(t.exact_fraction, 2 if compact else 4),
                        str(t.max_ulps),
                        f"{t.rel_error:.{1 if compact else 3}e}",
                    )
                    if t.measured
                    else ("-",) * 3
                )
                status = "" if t.name == "(all)" else t.status
                out.append([t.name, t.type, status, f"{t.n_values:,}", *figures, blocks])
            return out

        short = ["tensor", "type", "judged", "values", "exact", "ULP", "rel.err", "blocks p/e/m/l"]
        table = fitted_table(str(gguf_path), columns, rows, wrap=(0, 7), compact_headers=short)
        console.out.print(table)
        if isinstance(table, console.CompactTable):
            say_fitted("blocks p/e/m/l: as planned / equally exact / more exact / less exact than the plan's")
        for line in v.failures:
            say_fitted(f"FAIL        {message(line)}", " " * 12)
        for line in v.unchecked:
            say_fitted(f"not judged  {message(line)}", " " * 12)
        say_fitted(f"sha256 {v.sha256}")
        say_fitted(v.verdict(allow_unchecked, flags()))
    problem = v.error(allow_unchecked)
    if problem:
        raise problem


@main.command()
@click.option(
    "--source", "source", required=True, type=click.Path(path_type=Path), help="The HF folder the files were made from."
)
@click.argument("gguf_paths", nargs=-1, required=True, type=click.Path(path_type=Path))
def compare(source: Path, gguf_paths: tuple[Path, ...]) -> None:
    """Put GGUF files made from one checkpoint side by side: size, type mix, error.

    Drafters (e.g. the exact Q4_0 file beside a Q8_0 or bf16 one made by llama.cpp's
    converter) or main models (e.g. Google's QAT GGUF beside its `repack`), each
    measured against SOURCE, not judged.
    """
    from gguf_exact.compare import compare_files

    found = compare_files(source, list(gguf_paths))
    columns = [("file", "left"), ("bytes", "right"), ("types", "left"), ("bit-exact", "right")]
    columns += [("rel. error", "right"), ("max ULP", "right")]

    def rows(compact: bool) -> list[list[str]]:
        return [
            [r.path, f"{r.bytes:,}", type_mix(r.type_mix)]
            + [pct(r.exact_fraction, 2 if compact else 4), f"{r.rel_error:.3e}", str(r.max_ulps)]
            for r in found
        ]

    console.out.print(fitted_table(f"against {source}", columns, rows, wrap=(0, 2)))
