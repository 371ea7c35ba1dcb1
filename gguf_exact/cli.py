"""The ``gguf-exact`` command line. Each command is a thin layer over one function
of the Python API (named in its help), so scripts and the Makefile can do the same."""

import contextlib
import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__
from .errors import GgufExactError

# Off a terminal (pipes, CI logs) rich would wrap tables at 80 columns; tensor names need more.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False)


class Group(click.Group):
    """Turns :class:`GgufExactError` into one ``error:`` line and exit status 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except GgufExactError as e:
            err.print(f"[bold red]error:[/] {e}", soft_wrap=True)
            ctx.exit(1)


@contextlib.contextmanager
def tensor_progress(label: str, total: int, enabled: bool = True):
    """A progress bar over tensors on stderr (only on a terminal); yields a callback."""
    if not enabled or not err.is_terminal:
        yield lambda name: None
        return
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("", total=total)
        yield lambda name: progress.update(task, advance=1, description=name)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.4%}"


@click.group(cls=Group)
@click.version_option(__version__, prog_name="gguf-exact")
def main() -> None:
    """Lossless Q4_0 GGUF for Gemma 4 QAT drafters and models.

    Google trains Gemma 4 and its MTP drafters onto Q4_0's 4-bit grid but ships
    bf16. gguf-exact finds that grid and writes Q4_0 that keeps every trained
    level, with scales chosen so values decode to the source bits.

    \b
    Typical use:
      gguf-exact inspect ./gemma-4-E2B-it-qat-q4_0-unquantized-assistant
      gguf-exact convert ./assistant drafter.gguf --vocab-from gemma-4-E2B-it.gguf
      gguf-exact compare --source ./assistant drafter.gguf drafter-q8_0.gguf
    """


@main.command()
@click.argument("src_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def inspect(src_dir: Path, as_json: bool) -> None:
    """Show, per tensor, whether a checkpoint sits on the Q4_0 grid.

    SRC_DIR is a Hugging Face folder (config.json and safetensors). For each tensor:
    blocks of 32, the share on the grid, the share of values that can decode
    bit-exactly as Q4_0, and the GGUF type convert would use. The last line says
    whether the checkpoint is QAT 4-bit. (Python: gguf_exact.inspect_checkpoint)
    """
    from .checkpoint import Checkpoint
    from .inspect_qat import inspect_checkpoint

    with Checkpoint(src_dir) as ckpt:
        n = len(ckpt.tensors)
    with tensor_progress("inspect", n, not as_json) as progress:
        report = inspect_checkpoint(src_dir, progress)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    table = Table(title=str(src_dir))
    for col in ("tensor", "shape", "dtype", "blocks", "on grid", "bit-exact", "planned"):
        table.add_column(col, justify="right" if col in ("blocks", "on grid", "bit-exact") else "left")
    for t in report.tensors:
        table.add_row(t.name, "x".join(map(str, t.shape)) or "scalar", t.dtype, str(t.blocks or "-"), pct(t.on_grid_fraction), pct(t.exact_fraction), t.planned)
    out.print(table)
    out.print(("[green]" if report.is_qat else "[yellow]") + report.verdict)


@main.command()
@click.argument("src_dir", type=click.Path(path_type=Path))
@click.argument("out_gguf", type=click.Path(path_type=Path))
@click.option("--vocab-from", "vocab_from", required=True, type=click.Path(path_type=Path), help="The target model's GGUF; its tokenizer.* keys are copied.")
@click.option("--report", "report_path", type=click.Path(path_type=Path), help="Write a per-tensor JSON report here.")
@click.option("--expect-sha256", help="Fail, leaving no output, unless the file has this sha256.")
@click.option("--off-grid", type=click.Choice(["q8_0", "f16", "bf16"]), help="Store matrices that are off the grid in this type instead of stopping.")
def convert(src_dir: Path, out_gguf: Path, vocab_from: Path, report_path: Path | None, expect_sha256: str | None, off_grid: str | None) -> None:
    """Convert a Gemma 4 MTP drafter to an exact Q4_0 GGUF.

    SRC_DIR holds a Gemma4AssistantForCausalLM (or Gemma4UnifiedAssistantForCausalLM)
    checkpoint. Every matrix on the grid becomes Q4_0 with its trained levels; norms
    stay F32; masked_embedding.* is dropped as upstream does. The file is written
    beside OUT_GGUF, read back and verified, then renamed into place; on any
    failure nothing is left at OUT_GGUF. (Python: gguf_exact.convert_drafter)
    """
    from .checkpoint import Checkpoint
    from .convert import convert_drafter

    with Checkpoint(src_dir) as ckpt:
        n = len(ckpt.tensors)
    with tensor_progress("convert", n) as progress:
        result = convert_drafter(src_dir, out_gguf, vocab_from, off_grid, expect_sha256, report_path, progress)
    r = result.report
    types = {}
    for p in result.plans:
        types[p.type.name] = types.get(p.type.name, 0) + 1
    out.print(f"wrote {result.path} ({result.size:,} bytes; " + ", ".join(f"{k} x{v}" for k, v in sorted(types.items())) + ")")
    out.print(f"verified: {r['exact_values']:,} of {r['values']:,} values bit-exact ({r['exact_fraction']:.4%}), largest error {r['max_ulps']} bf16 ULP, relative error {r['rel_error']:.3e}")
    if r["off_grid_tensors"]:
        out.print(f"[yellow]off grid, stored as {off_grid}:[/] " + ", ".join(r["off_grid_tensors"]))
    out.print(f"sha256 {result.sha256}" + ("  (matches --expect-sha256)" if expect_sha256 else ""))


@main.command()
@click.argument("gguf_path", type=click.Path(path_type=Path))
@click.option("--source", "source", required=True, type=click.Path(path_type=Path), help="The HF folder the file was made from.")
@click.option("--json", "as_json", is_flag=True, help="Print per-tensor results as JSON.")
def verify(gguf_path: Path, source: Path, as_json: bool) -> None:
    """Re-run the post-write verification on an existing drafter GGUF.

    Decodes every tensor and compares it with the source: bit-exact share, largest
    error in bf16 ULPs, relative RMS error. (Python: gguf_exact.verify_gguf)
    """
    from .checkpoint import Checkpoint
    from .gguf_file import sha256_file
    from .verify import verify_gguf

    with Checkpoint(source) as ckpt:
        v = verify_gguf(gguf_path, ckpt)
    digest = sha256_file(gguf_path)
    total = v.total
    if as_json:
        click.echo(json.dumps({"path": str(gguf_path), "sha256": digest, "total": total.as_dict(), "tensors": [t.as_dict() for t in v.tensors]}, indent=2))
        return
    table = Table(title=str(gguf_path))
    for col in ("tensor", "type", "values", "bit-exact", "max ULP", "rel. error"):
        table.add_column(col, justify="left" if col in ("tensor", "type") else "right")
    for t in v.tensors + [total]:
        table.add_row(t.name, t.type, f"{t.n_values:,}", pct(t.exact_fraction), str(t.max_ulps), f"{t.rel_error:.3e}")
    out.print(table)
    out.print(f"sha256 {digest}")


@main.command()
@click.option("--source", "source", required=True, type=click.Path(path_type=Path), help="The HF folder the files were made from.")
@click.argument("gguf_paths", nargs=-1, required=True, type=click.Path(path_type=Path))
def compare(source: Path, gguf_paths: tuple[Path, ...]) -> None:
    """Put drafter GGUFs side by side: size, type mix, error against the source.

    For example the exact Q4_0 file beside a Q8_0 or bf16 one made by llama.cpp's
    converter. (Python: gguf_exact.compare_files)
    """
    from .compare import compare_files

    rows = compare_files(source, list(gguf_paths))
    table = Table()
    for col in ("file", "bytes", "types", "bit-exact", "rel. error", "max ULP"):
        table.add_column(col, justify="left" if col in ("file", "types") else "right")
    for r in rows:
        mix = ", ".join(f"{k} x{v}" for k, v in sorted(r.type_mix.items()))
        table.add_row(r.path, f"{r.bytes:,}", mix, pct(r.exact_fraction), f"{r.rel_error:.3e}", str(r.max_ulps))
    out.print(table)


@main.command("make-tiny")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--seed", default=0, show_default=True)
@click.option("--step", "step_kind", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True, help="Precision of the simulated training step.")
def make_tiny(out_dir: Path, seed: int, step_kind: str) -> None:
    """Write a tiny gemma4 target GGUF and a tiny QAT drafter checkpoint.

    OUT_DIR/target.gguf and OUT_DIR/drafter-hf/ are a pair that llama.cpp runs
    together: the demo's inputs, and a quick way to try every command offline.
    (Python: gguf_exact.tiny)
    """
    from .tiny import write_tiny_drafter, write_tiny_target

    out_dir.mkdir(parents=True, exist_ok=True)
    write_tiny_target(out_dir / "target.gguf", seed=seed)
    write_tiny_drafter(out_dir / "drafter-hf", seed=seed, step_kind=step_kind)
    out.print(f"wrote {out_dir / 'target.gguf'} and {out_dir / 'drafter-hf'}/")


@main.command()
@click.argument("out_dir", type=click.Path(path_type=Path), default=Path("build/demo"))
def demo(out_dir: Path) -> None:
    """Run the whole job on tiny models made on the spot (what `make demo` runs).

    Makes a tiny target and QAT drafter, inspects and converts the drafter
    (verified), then loads it beside the target in llama.cpp. (Python:
    gguf_exact.demo.run_demo)
    """
    from .demo import run_demo

    run_demo(out_dir, out)


if __name__ == "__main__":
    sys.exit(main())
