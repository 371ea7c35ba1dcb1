"""The ``gguf-exact`` command line. Each command is a thin layer over one function
of the Python API (named in its help), so scripts and the Makefile can do the same."""

import contextlib
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Callable

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from gguf_exact import __version__
from gguf_exact.errors import GgufExactError


def _width() -> int | None:
    """The terminal's width on a terminal; off one (pipes, CI logs) ``$COLUMNS`` when set,
    else 160, so logs keep whole tensor names."""
    if sys.stdout.isatty():
        return None
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return 160


out = Console(highlight=False, width=_width())
err = Console(stderr=True, highlight=False)


class Group(click.Group):
    """Turns :class:`GgufExactError` into one ``error:`` line and exit status 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except GgufExactError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
            ctx.exit(1)


@contextlib.contextmanager
def tensor_progress(label: str, total: int, enabled: bool = True):
    """A progress bar over tensors on stderr (only on a terminal); yields a callback."""
    if not enabled or not err.is_terminal:
        yield lambda name: None
        return
    columns = (
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("", total=total)
        yield lambda name: progress.update(task, advance=1, description=name)


MODELS_DIR_HELP = "Where files are placed, as MODELS_DIR/<repo>/<file> (the paths in checksums/RECIPE.sha256)."


def target_and_draft_options(auto: bool, no_draft: bool = True):
    """``--model TARGET.gguf [--draft DRAFTER.gguf|auto] [--no-draft] [--fetch-draft]
    [--models-dir DIR]``, shared by serve, chat, generate and tune. With ``auto`` no
    ``--draft`` means ``--draft auto`` (serve, chat); else the target alone (generate).
    ``no_draft=False`` leaves ``--no-draft`` out (tune: nothing to tune without a drafter)."""
    default = " (the default)" if auto else ""
    draft_help = (
        "The gemma4-assistant MTP drafter GGUF, or auto" + default + ": the target's size is read from its "
        "header and its exact drafter looked for in --models-dir (where `gguf-exact fetch` puts it) and beside the target."
    )

    def decorate(command):
        for opt in reversed(
            [
                click.option(
                    "--model", "target", required=True, type=click.Path(path_type=Path), help="The gemma4 target GGUF."
                ),
                click.option("--draft", "drafter", metavar="FILE|auto", help=draft_help),
                *(
                    [click.option("--no-draft", is_flag=True, help="The target alone: no drafter, no speculation.")]
                    if no_draft
                    else []
                ),
                click.option(
                    "--fetch-draft",
                    is_flag=True,
                    help="When no drafter is found, fetch the exact one a recipe (`gguf-exact recipes`) names for the "
                    "target's size (pinned commit, sha256 checked) into --models-dir; with --dry-run, only say where.",
                ),
                click.option(
                    "--models-dir",
                    type=click.Path(path_type=Path),
                    default=Path("models"),
                    show_default=True,
                    help=MODELS_DIR_HELP + " Searched for the drafter.",
                ),
            ]
        ):
            command = opt(command)
        return command

    return decorate


def resolve_draft(
    target: Path,
    drafter: str | None,
    no_draft: bool,
    fetch_draft: bool,
    models_dir: Path,
    auto: bool,
    dry_run: bool = False,
) -> tuple[Path | None, str | None]:
    """The drafter the draft options name (:func:`gguf_exact.serving.drafter_lookup.resolve_drafter`),
    and how it was found (None when given as a file). ``dry_run``: nothing is downloaded
    (the path is then None and ``how`` says where it would go)."""
    from gguf_exact.serving.drafter_lookup import resolve_drafter

    found = resolve_drafter(target, drafter, no_draft, models_dir, fetch_draft, default_auto=auto, dry_run=dry_run)
    return found.path, (None if found.how == "--draft" else found.how)


def resolve_profile_option(name: str):
    """``--profile NAME|auto|FILE`` as (Profile, what ``auto`` chose and why, or None)."""
    from gguf_exact.serving.profile_choice import resolve_profile

    return resolve_profile(name)


def profile_line(prof, choice) -> str:
    """``profile  NAME (description), build B`` and, for ``auto``, why that one."""
    from gguf_exact.serving.profiles import PROFILE_DIR

    why = f"; --profile auto: {choice.reason}" if choice is not None else ""
    where = f", from {prof.path}" if prof.path and prof.path.parent.resolve() != PROFILE_DIR.resolve() else ""
    return f"profile  {prof.name} ({prof.description}), build {prof.build}{where}{why}"


PROFILE_HELP = (
    "auto (from nvidia-smi's GPU name and memory; cpu without one), rtx3050, gtx1650ti, gtx1650ti-vulkan, cpu, "
    "a name in ~/.config/gguf-exact/profiles (where `gguf-exact tune` writes, e.g. cpu-tuned), or a .toml file."
)


def results_dir(kind: str) -> Path:
    """``<cache>/<kind>/<date-time>``: where ``bench`` and ``tune`` write without ``--out``
    (not the folder the command happens to run in)."""
    import time

    from gguf_exact.serving.llama_build import cache_root

    return cache_root() / kind / time.strftime("%Y%m%d-%H%M%S")


def common_prefix(names: list[str]) -> str:
    """The longest dotted prefix (``model.language_model.``) that at least 80% of the
    names share, or "" when none is worth taking out."""
    counts: dict[str, int] = {}
    for name in names:
        for i, ch in enumerate(name[:-1]):
            if ch == ".":
                counts[name[: i + 1]] = counts.get(name[: i + 1], 0) + 1
    shared = [p for p, n in counts.items() if n >= max(2, 0.8 * len(names)) and len(p) >= 6]
    return max(shared, key=len, default="")


def fitted_table(
    title: str, columns: list[tuple[str, str]], rows: Callable[[bool], list[list[str]]], wrap: tuple[int, ...] = (0,)
) -> Table:
    """A table under ``columns`` ((header, justify) pairs) that fits the console.

    ``rows(compact)`` gives the cells, the first column a name. As it is when it fits;
    else compact: figures as ``rows(True)`` gives them (fewer digits), no vertical
    rules, the prefix most names share shown once in the title and as "…" in them, and
    the names (and the columns in ``wrap``) wrapped, never cut short."""
    from rich import box

    def build(compact: bool) -> Table:
        cells = rows(compact)
        names = [r[0] for r in cells]
        prefix = common_prefix(names) if compact else ""
        caption = f"{title} (… = {prefix})" if prefix else title
        table = Table(
            title=caption,
            box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
            pad_edge=not compact,
            collapse_padding=compact,
            show_edge=not compact,
        )
        for i, (header, justify) in enumerate(columns):
            table.add_column(header, justify=justify, overflow="fold", no_wrap=i not in wrap)
        for name, row in zip(names, cells):
            table.add_row("…" + name[len(prefix) :] if prefix and name.startswith(prefix) else name, *row[1:])
        return table

    table = build(False)
    if table.__rich_measure__(out, out.options).maximum <= out.width:
        return table
    return build(True)


def human_size(n: int) -> str:
    """``46,080`` -> ``45.0 KiB``; ``2,415,919,104`` -> ``2.25 GiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}" if unit == "GiB" else f"{n / size:,.1f} {unit}"
    return f"{n:,} B"


def pct(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}%}"


@click.group(cls=Group)
@click.version_option(__version__, prog_name="gguf-exact")
def main() -> None:
    """Lossless Q4_0 GGUF for Gemma 4 QAT drafters and models.

    Google trains Gemma 4 and its MTP drafters onto Q4_0's 4-bit grid but ships
    bf16. gguf-exact finds that grid and writes Q4_0 that keeps every trained
    level, with scales chosen so values decode to the source bits.

    \b
    Try it offline on tiny models:
      gguf-exact make-tiny build/tiny
      gguf-exact convert build/tiny/drafter-hf build/tiny/drafter.gguf --vocab-from build/tiny/target.gguf
      gguf-exact repack --donor build/tiny/main-q4_0.gguf --source build/tiny/main-hf build/tiny/main-exact.gguf
    Real models:
      gguf-exact recipes                      what fetch, pin and build know
      gguf-exact fetch e2b-assistant          the published exact E2B drafter
      gguf-exact serve --model gemma-4-E2B_q4_0-it.gguf --fetch-draft
    """


@main.command()
@click.argument("src_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def inspect(src_dir: Path, as_json: bool) -> None:
    """Show, per tensor, whether a checkpoint sits on the Q4_0 grid.

    SRC_DIR is a Hugging Face folder (config.json and safetensors): a drafter, a main
    model, or any bf16 checkpoint, read in row chunks. For each tensor:
    blocks of 32, the share on the grid, the share of values that can decode
    bit-exactly as Q4_0, and the GGUF type convert would use. The last line says
    whether the checkpoint is QAT 4-bit. (Python: gguf_exact.inspect_checkpoint)
    """
    from gguf_exact.drafter.inspect_qat import inspect_checkpoint
    from gguf_exact.formats.checkpoint import Checkpoint

    with Checkpoint(src_dir) as ckpt:
        n = len(ckpt.tensors)
    with tensor_progress("inspect", n, not as_json) as progress:
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

    out.print(fitted_table(str(src_dir), columns, rows))
    out.print(("[green]" if report.is_qat else "[yellow]") + report.verdict)


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
def convert(
    src_dir: Path,
    out_gguf: Path,
    vocab_from: Path,
    report_path: Path | None,
    expect_sha256: str | None,
    off_grid: str | None,
) -> None:
    """Convert a Gemma 4 MTP drafter to an exact Q4_0 GGUF.

    SRC_DIR holds a Gemma4AssistantForCausalLM (or Gemma4UnifiedAssistantForCausalLM)
    checkpoint. Every matrix on the grid becomes Q4_0 with its trained levels; norms
    stay F32; masked_embedding.* is dropped as upstream does. The file is written
    beside OUT_GGUF, read back and verified, then renamed into place; on any
    failure nothing is left at OUT_GGUF. (Python: gguf_exact.convert_drafter)
    """
    from gguf_exact.drafter.convert import convert_drafter
    from gguf_exact.formats.checkpoint import Checkpoint

    with Checkpoint(src_dir) as ckpt:
        n = len(ckpt.tensors)
    with tensor_progress("convert", n) as progress:
        result = convert_drafter(src_dir, out_gguf, vocab_from, off_grid, expect_sha256, report_path, progress)
    r = result.report
    types = {}
    for t in result.tensors:
        types[t.out_type] = types.get(t.out_type, 0) + 1
    out.print(
        f"wrote {result.path} ({result.size:,} bytes; " + ", ".join(f"{k} x{v}" for k, v in sorted(types.items())) + ")"
    )
    out.print(
        f"verified: {r['exact_values']:,} of {r['values']:,} values bit-exact ({r['exact_fraction']:.4%}), largest error {r['max_ulps']} bf16 ULP, relative error {r['rel_error']:.3e}"
    )
    if r["off_grid_tensors"]:
        out.print(f"[yellow]off grid, stored as {off_grid}:[/] " + ", ".join(r["off_grid_tensors"]))
    out.print(f"sha256 {result.sha256}" + ("  (matches --expect-sha256)" if expect_sha256 else ""))


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
    The last line is the verdict: `verify: PASS`, `FAIL` or `INCOMPLETE`. Drafters
    (Python: gguf_exact.verify_gguf), main models (gguf_exact.repack.check.verify_model).
    """
    from gguf_exact.drafter.verify import verify_gguf
    from gguf_exact.formats.checkpoint import read_config
    from gguf_exact.formats.gguf_file import sha256_file
    from gguf_exact.formats.gguf_reader import open_gguf
    from gguf_exact.formats.paths import check_input_folder
    from gguf_exact.gemma4.assistant import SUPPORTED_ARCHITECTURES as DRAFTERS
    from gguf_exact.repack.check import verify_model

    try:
        with open_gguf(gguf_path) as gguf:
            n = len(gguf.tensors)
        check_input_folder(source)
        archs = read_config(source / "config.json").get("architectures")
        drafter = donor is None and isinstance(archs, list) and any(a in DRAFTERS for a in archs)
        with tensor_progress("verify", n, not as_json) as progress:
            if drafter:
                v = verify_gguf(gguf_path, source, progress=progress, vocab_from=vocab_from, off_grid=off_grid)
            else:
                if vocab_from is not None:
                    raise GgufExactError(
                        f"--vocab-from {vocab_from}: a re-packed file carries its donor's tokenizer; give --donor instead"
                    )
                v = verify_model(gguf_path, source, donor=donor, off_grid=off_grid, progress=progress)
    except GgufExactError as e:
        if as_json:
            click.echo(json.dumps({"ok": False, "path": str(gguf_path), "error": str(e)}, indent=2))
        raise
    digest = sha256_file(gguf_path)
    if as_json:
        click.echo(json.dumps({"sha256": digest} | v.as_dict(allow_unchecked), indent=2))
    else:
        table = Table(title=str(gguf_path))
        for col in (
            "tensor",
            "type",
            "judged",
            "values",
            "bit-exact",
            "max ULP",
            "rel. error",
            "blocks as planned/equal/more/less",
        ):
            table.add_column(col, justify="left" if col in ("tensor", "type", "judged") else "right")
        for t in v.tensors + [v.total]:
            b = t.blocks
            blocks = f"{b.as_planned:,}/{b.equally_exact:,}/{b.more_exact:,}/{b.less_exact:,}" if b else "-"
            figures = (pct(t.exact_fraction), str(t.max_ulps), f"{t.rel_error:.3e}") if t.measured else ("-",) * 3
            status = "" if t.name == "(all)" else t.status
            table.add_row(t.name, t.type, status, f"{t.n_values:,}", *figures, blocks)
        out.print(table)
        for line in v.failures:
            out.print(f"FAIL        {line}", markup=False, soft_wrap=True)
        for line in v.unchecked:
            out.print(f"not judged  {line}", markup=False, soft_wrap=True)
        out.print(f"sha256 {digest}", markup=False)
        out.print(v.verdict(allow_unchecked), markup=False, soft_wrap=True)
    problem = v.error_line(allow_unchecked)
    if problem:
        raise GgufExactError(problem)


@main.command()
@click.option(
    "--source", "source", required=True, type=click.Path(path_type=Path), help="The HF folder the files were made from."
)
@click.argument("gguf_paths", nargs=-1, required=True, type=click.Path(path_type=Path))
def compare(source: Path, gguf_paths: tuple[Path, ...]) -> None:
    """Put GGUF files made from one checkpoint side by side: size, type mix, error.

    Drafters (e.g. the exact Q4_0 file beside a Q8_0 or bf16 one made by llama.cpp's
    converter) or main models (e.g. Google's QAT GGUF beside its `repack`), each
    measured against SOURCE, not judged. (Python: gguf_exact.compare_files)
    """
    from gguf_exact.drafter.compare import compare_files

    found = compare_files(source, list(gguf_paths))
    columns = [("file", "left"), ("bytes", "right"), ("types", "left"), ("bit-exact", "right")]
    columns += [("rel. error", "right"), ("max ULP", "right")]

    def rows(compact: bool) -> list[list[str]]:
        return [
            [r.path, f"{r.bytes:,}", ", ".join(f"{k} x{v}" for k, v in sorted(r.type_mix.items()))]
            + [pct(r.exact_fraction, 2 if compact else 4), f"{r.rel_error:.3e}", str(r.max_ulps)]
            for r in found
        ]

    out.print(fitted_table(f"against {source}", columns, rows, wrap=(0, 2)))


@main.command("make-tiny")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--step",
    "step_kind",
    type=click.Choice(["fp32", "bf16"]),
    default="fp32",
    show_default=True,
    help="Precision of the simulated training step.",
)
@click.option(
    "--pairs",
    "with_pairs",
    is_flag=True,
    help="Also write the speculation pairs (random, agreeing, mixed, hidden) as OUT_DIR/pairs/NAME/{target,drafter}.gguf.",
)
def make_tiny(out_dir: Path, seed: int, step_kind: str, with_pairs: bool) -> None:
    """Write tiny models to try every command offline, in a second.

    \b
    OUT_DIR/target.gguf      a tiny gemma4 target GGUF
    OUT_DIR/drafter-hf/      a tiny QAT drafter checkpoint for it (convert it
                             with --vocab-from OUT_DIR/target.gguf)
    OUT_DIR/main-hf/         a tiny QAT main-model checkpoint (E2B's structure)
    OUT_DIR/main-q4_0.gguf   its GGUF as Google's QAT GGUFs are made: the donor
                             that `repack --donor ... --source OUT_DIR/main-hf`
                             re-packs as exact Q4_0

    --pairs adds the target + drafter GGUF pairs the tests and benchmarks
    speculate with, e.g. `hidden`, whose drafter reads only the target's hidden
    state. (Python: gguf_exact.tiny.models, gguf_exact.tiny.main_model.write_main_checkpoint
    and write_donor, gguf_exact.tiny.pairs.write_runner_pairs)
    """
    from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint
    from gguf_exact.tiny.models import write_tiny_drafter, write_tiny_target

    out_dir.mkdir(parents=True, exist_ok=True)
    write_tiny_target(out_dir / "target.gguf", seed=seed)
    write_tiny_drafter(out_dir / "drafter-hf", seed=seed, step_kind=step_kind)
    write_main_checkpoint(out_dir / "main-hf", TINY, seed=seed, step_kind=step_kind)
    write_donor(out_dir / "main-q4_0.gguf", out_dir / "main-hf", TINY)

    def say(line: str) -> None:
        out.print(line, markup=False, soft_wrap=True)

    say(f"wrote {out_dir / 'target.gguf'}      a tiny gemma4 target")
    say(f"      {out_dir / 'drafter-hf'}/      its QAT drafter checkpoint: `gguf-exact convert`")
    say(f"      {out_dir / 'main-hf'}/         a QAT main-model checkpoint")
    say(f"      {out_dir / 'main-q4_0.gguf'}   its Google-style Q4_0 GGUF: `gguf-exact repack --donor`")
    if with_pairs:
        from gguf_exact.tiny.pairs import write_runner_pairs

        for name, (target, drafter) in write_runner_pairs(out_dir / "pairs", seed=seed).items():
            say(f"pair {name:<9} {target}  {drafter}")


@main.command("make-pair")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--shape", required=True, help="e2b or e4b: the real model's structure (gemma4/sizes.py).")
@click.option("--kind", required=True, help="hidden (acceptance about 100%) or mixed (about 50% at n-max 1 and 2).")
def make_pair(out_dir: Path, shape: str, kind: str) -> None:
    """Write a full-size target + drafter pair: OUT_DIR/target.gguf and OUT_DIR/drafter.gguf.

    Every tensor at the real E2B or E4B shape and type (Q4_0 matrices, Q6_K
    embeddings, 262,144-token vocabulary), almost all weights zero, so llama.cpp
    does all of a real model's work; the target walks a 12-token cycle and the
    drafter reads only its hidden state. For benchmarks at the real size without
    the download. (Python: gguf_exact.tiny.full_pair.write_pair)
    """
    from gguf_exact.tiny.full_pair import KINDS, SHAPES, write_pair

    if shape.lower() not in SHAPES:
        raise GgufExactError(f"--shape {shape}: expected one of {', '.join(SHAPES)}")
    if kind not in KINDS:
        raise GgufExactError(f"--kind {kind}: expected one of {', '.join(KINDS)}")
    if out_dir.exists() and not out_dir.is_dir():
        raise GgufExactError(f"{out_dir}: exists and is not a folder")
    start = time.perf_counter()
    pair = write_pair(out_dir, shape.lower(), kind, progress=lambda m: out.print(m, markup=False))
    for path in (pair.target, pair.drafter):
        out.print(f"wrote {path}  {path.stat().st_size:,} bytes", markup=False, soft_wrap=True)
    out.print(f"cycle: {' '.join(pair.cycle_text)}  ({time.perf_counter() - start:.1f} s)", markup=False)


@main.command()
@click.argument("out_dir", type=click.Path(path_type=Path), default=Path("build/demo"))
def demo(out_dir: Path) -> None:
    """Run the whole job on tiny models made on the spot (what `make demo` runs).

    Makes a tiny target and QAT drafter, inspects and converts the drafter
    (verified), then loads it beside the target in llama.cpp. (Python:
    gguf_exact.demo.run_demo)
    """
    from gguf_exact.demo import run_demo

    run_demo(out_dir, out)


@main.command("build-llama")
@click.option(
    "--cuda",
    "cuda",
    metavar="ARCH",
    help="Build for CUDA with this architecture: 75 (GTX 1650 Ti) or 86 (RTX 3050). Default: CPU.",
)
@click.option(
    "--vulkan",
    is_flag=True,
    help="Build for Vulkan (any vendor's GPU; on a GTX 16xx the fallback when MTP crashes under CUDA).",
)
@click.option(
    "--sdist",
    type=click.Path(path_type=Path),
    help="A local copy of the pinned llama-cpp-python sdist (its sha256 is still checked).",
)
@click.option("--force", is_flag=True, help="Rebuild even if the build is cached.")
def build_llama(cuda: str | None, vulkan: bool, sdist: Path | None, force: bool) -> None:
    """Build llama-server, llama-bench, llama-perplexity and llama-quantize.

    From the llama-cpp-python sdist pinned in checksums/ (fetched with pip, sha256
    checked), so the server runs the same llama.cpp commit as the Python bindings
    (`gguf-exact build-bindings`), with the same options. The CPU code uses the
    features this CPU advertises, named one by one and never AMX (set
    GGUF_EXACT_CPU_FEATURES=avx2,fma,... to choose others). A probe then runs a batched
    Q4_0 product through the new binaries; a build that fails it is not installed.
    Installs into ~/.cache/gguf-exact/llama.cpp/<commit>-<backend>-<CPU features>/bin
    (backend cpu, cuda75, cuda86 or vulkan) and prints that folder; a second call
    returns at once.

    --cuda needs nvcc on PATH (no GPU needed to build); cuBLAS comes from the toolkit,
    else from NVIDIA's pinned nvidia-cublas wheel. --vulkan needs the Vulkan headers and
    glslc (Debian: apt-get install libvulkan-dev glslc spirv-headers). `gguf-exact doctor`
    shows what each build used.
    """
    from gguf_exact.serving.llama_build import build_llama_cpp, sigterm_as_interrupt

    with sigterm_as_interrupt():
        build = build_llama_cpp(
            cuda, sdist, force=force, log=lambda m: err.print(m, soft_wrap=True, markup=False), vulkan=vulkan
        )
    click.echo(build.bin_dir)


@main.command("build-bindings")
@click.option(
    "--cuda", "cuda", metavar="ARCH", help="Bindings for CUDA with this architecture: 75 or 86. Default: CPU."
)
@click.option("--vulkan", is_flag=True, help="Bindings for Vulkan.")
@click.option(
    "--sdist",
    type=click.Path(path_type=Path),
    help="A local copy of the pinned llama-cpp-python sdist (its sha256 is still checked).",
)
@click.option("--force", is_flag=True, help="Rebuild even if the wheel is cached.")
@click.option("--install", is_flag=True, help="Install the wheel into this Python environment.")
def build_bindings(cuda: str | None, vulkan: bool, sdist: Path | None, force: bool, install: bool) -> None:
    """Build the llama-cpp-python bindings (the Python engine's llama.cpp) as a wheel.

    Built from the same pinned sdist, backend and CPU features as `gguf-exact
    build-llama`, so the in-process engine (generate, chat, serve --engine python)
    runs on the card a GPU profile names, and never traps on a CPU with AMX. A probe
    runs a batched Q4_0 product through the wheel before it is kept in
    ~/.cache/gguf-exact/wheels/<commit>-<backend>-<CPU features>/; a second call
    returns at once. Prints the wheel's path; --install also installs it here,
    replacing any other llama-cpp-python (such as pip's own native build).
    """
    from gguf_exact.serving.bindings_build import build_bindings as build
    from gguf_exact.serving.bindings_build import install_bindings
    from gguf_exact.serving.llama_build import sigterm_as_interrupt

    def log(m: str) -> None:
        err.print(m, soft_wrap=True, markup=False)

    with sigterm_as_interrupt():
        wheel = build(cuda, vulkan, sdist, force=force, log=log)
        if install:
            install_bindings(wheel, log)
    click.echo(wheel.wheel)


@main.command()
def doctor() -> None:
    """Report what this machine has for serving: CPU features, bindings, llama-server, CUDA, GPUs."""
    from gguf_exact.serving.doctor import diagnose

    for f in diagnose():
        out.print(
            f"{'[green]ok[/]' if f.ok else '[yellow]--[/]'}  {escape(f'{f.name:<22}')} {escape(f.value)}",
            soft_wrap=True,
        )


@main.command()
@target_and_draft_options(auto=True)
@click.option("--profile", default="auto", show_default=True, help=PROFILE_HELP)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a profile value, e.g. --set ctx-size=4096 --set spec-draft-n-max=1.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to listen on. Anything but this machine's own (127.0.0.1, ::1, localhost), "
    "such as 0.0.0.0 for a laptop on the same network, needs --api-key (or --insecure).",
)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option(
    "--api-key",
    envvar="GGUF_EXACT_API_KEY",
    metavar="KEY",
    help="Clients must send this key (OpenAI clients: api_key=KEY; curl: -H 'Authorization: Bearer KEY'); "
    "without it every request but /health gets HTTP 401. Both engines. Prefer the environment variable "
    "$GGUF_EXACT_API_KEY: the key is passed to the server in its environment and never written to "
    "the run folder or its logs.",
)
@click.option(
    "--insecure", is_flag=True, help="Serve a --host other machines can reach without an API key: anyone may use it."
)
@click.option(
    "--server-bin", type=click.Path(path_type=Path), help="A llama-server to run instead of the cached build."
)
@click.option("--detach", is_flag=True, help="Run in the background (pid file and log in the run directory).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check the files, print the memory plan and the command (even before the build exists); start nothing, "
    "download nothing (with --fetch-draft it says where the drafter would go).",
)
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for /health.")
@click.option(
    "--no-probe", is_flag=True, help="Skip the short request that confirms draft-mtp is drafting after launch."
)
@click.option(
    "--engine",
    type=click.Choice(["llama-server", "python"]),
    default="llama-server",
    show_default=True,
    help="llama-server (llama.cpp's draft-mtp), or python: llama-cpp-python's OpenAI-compatible server with the MTP drafter (same profile, same /metrics names).",
)
@click.option(
    "--logprobs", is_flag=True, help="--engine python: keep every row's logits so requests may ask for logprobs."
)
@click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[-- LLAMA_SERVER_ARGS...]")
def serve(
    target: Path,
    drafter: str | None,
    no_draft: bool,
    fetch_draft: bool,
    models_dir: Path,
    profile: str,
    overrides: tuple[str, ...],
    host: str,
    port: int,
    api_key: str | None,
    insecure: bool,
    server_bin: Path | None,
    detach: bool,
    dry_run: bool,
    timeout: float,
    no_probe: bool,
    engine: str,
    logprobs: bool,
    extra: tuple[str, ...],
) -> None:
    """Serve a Gemma 4 target with its MTP drafter (draft-mtp) over HTTP.

    \b
    Without --draft the drafter is found: the target's size is read from its
    header, then the recipes' exact drafter is looked for in --models-dir (as
    `gguf-exact fetch` places it) and any fitting gemma4-assistant GGUF there or
    beside the target; --fetch-draft fetches it, pinned and hash-checked. None
    found: one line says how to get one (or --no-draft serves the target alone).
    --profile auto (the default) reads nvidia-smi's GPU name and memory.

    Checks the pair (gemma4 target, gemma4-assistant drafter of the target's width,
    same vocabulary, sha256 against checksums/ for listed files), prints the weight
    bytes, the memory plan (weights, KV cache at the profile's context, drafter,
    compute buffers; a warning when it exceeds the card) and the exact server
    command, starts it on 127.0.0.1 (llama-server with --metrics; another --host
    needs --api-key or --insecure), waits for /health, sends one short probe request and says whether draft-mtp is drafting
    (or that llama.cpp left speculation off), then stays in the foreground (Ctrl-C
    stops it) unless --detach. --engine python serves /v1/chat/completions,
    /v1/completions, /v1/models, /health and /metrics from llama-cpp-python
    instead, with the same profile. (Python: gguf_exact.serving.server.plan_launch,
    start_server; drafter_lookup.resolve_drafter; memory_plan.plan_memory;
    profile_choice.resolve_profile; the python engine: gguf_exact.serving.openai_server)
    """
    from gguf_exact.serving.memory_plan import plan_memory
    from gguf_exact.serving.server import is_loopback, plan_launch, serve_foreground, server_status, start_server

    prof, choice = resolve_profile_option(profile)
    found_drafter, how = resolve_draft(target, drafter, no_draft, fetch_draft, models_dir, auto=True, dry_run=dry_run)
    launch = plan_launch(
        target,
        found_drafter,
        prof,
        overrides,
        host,
        port,
        server_bin,
        extra,
        check_port=not dry_run,
        engine=engine,
        logprobs=logprobs,
        require_build=not dry_run,
        api_key=api_key,
        insecure=insecure,
    )
    pair = launch.pair

    def say(line: str) -> None:
        out.print(line, soft_wrap=True, markup=False)

    for role, m in (("target", pair.target), ("drafter", pair.drafter)):
        if m is not None:
            listed = ", sha256 matches checksums/" if m.sha256 else ""
            say(
                f"{role:<8} {m.path}  {m.architecture}, {m.weight_bytes:,} bytes of weights in {m.n_tensors} tensors{listed}"
            )
    if how:
        say(f"{'':<8} drafter: {how}")
    if pair.drafter is not None:
        say(f"{'total':<8} {pair.target.weight_bytes + pair.drafter.weight_bytes:,} bytes of weights")
    say(profile_line(launch.profile, choice))
    plan = plan_memory(pair.target.path, pair.drafter.path if pair.drafter else None, launch.profile, engine)
    engine_note = "python engine: one sequence, the whole SWA cache; " if engine == "python" else ""
    say(
        f"memory plan ({'GPU' if plan.gpu else 'CPU'}, {engine_note}estimated from the GGUF headers as llama.cpp sizes them):"
    )
    for line in plan.lines():
        say(line)
    warning = plan.warning(*_card_memory(launch.profile, choice))
    if warning:
        err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    say(launch.command_line)
    if launch.note:
        say(f"note: {launch.note}")
    if dry_run and found_drafter is None and how and "would be fetched" in how:
        say(
            "note: the plan and command above are the target's alone until the drafter is there; run without --dry-run to fetch it"
        )
    if launch.api_key:
        say("api key  required from clients (given to the server in its environment, not shown above)")
    elif not is_loopback(host):
        err.print(
            f"[yellow]warning:[/] --insecure: anyone who can reach {escape(host)} may use this server", soft_wrap=True
        )
    if dry_run:
        return
    proc, seconds = start_server(launch, detach, timeout)
    say(
        f"{launch.label} ready at {launch.url} in {seconds:.1f} s (pid {proc.pid}); log {launch.run_dir / 'server.log'}"
    )
    if pair.drafter is not None and not no_probe:
        try:
            verdict = server_status(
                launch.port, launch.run_dir.parent, probe_request=True, api_key=launch.api_key
            ).speculation
        except GgufExactError as e:  # the server is up: say so, and keep serving
            verdict = None
            err.print(f"[yellow]warning:[/] draft-mtp not checked: {escape(str(e))}", soft_wrap=True)
        if verdict is not None:
            if verdict.state == "off":
                err.print(f"[yellow]warning:[/] draft-mtp {escape(verdict.line)}", soft_wrap=True)
            else:
                say(f"draft-mtp {verdict.line}")
    if detach:
        key = " (with GGUF_EXACT_API_KEY set)" if launch.api_key else ""
        say(f"detached; `gguf-exact status --port {port}`{key} reports on it, `gguf-exact stop --port {port}` ends it")
        return
    sys.exit(serve_foreground(launch, proc))


def _card_memory(profile, choice) -> tuple[int | None, str]:
    """The GPU memory the plan must fit: nvidia-smi's first GPU, else the profile's ``memory_mib``."""
    gpu = choice.gpu if choice is not None else None
    if gpu is None and profile.build != "cpu":
        from gguf_exact.serving.gpus import query_gpus

        gpus, _ = query_gpus()
        gpu = gpus[0] if gpus else None
    if gpu is not None:
        return gpu.memory_mib, f"the {gpu.name} (nvidia-smi)"
    return profile.memory_mib, f"profile {profile.name}'s card"


@main.command()
@click.option("--port", type=int, help="The server's port (default: the last one started).")
@click.option("--last", default=5, show_default=True, help="How many per-request acceptance lines to show.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--probe", is_flag=True, help="Send one short request first, to see whether it drafts.")
@click.option(
    "--api-key",
    envvar="GGUF_EXACT_API_KEY",
    metavar="KEY",
    help="The key of a server started with --api-key (default: $GGUF_EXACT_API_KEY); without it only health is read.",
)
def status(port: int | None, last: int, as_json: bool, probe: bool, api_key: str | None) -> None:
    """Health, models, speculation and draft acceptance of a served model.

    Draft counters come from /metrics (drafts, draft tokens, accepted tokens, the
    accepted share); the last requests' `draft acceptance` lines from the server
    log. The draft-mtp line says whether the server is really drafting: active
    (draft tokens since start, or in the --probe request), OFF (a drafter was
    given but llama-server is not speculating, and why: no --spec-type draft-mtp,
    or what llama.cpp logged), or not yet confirmed. Exits 1 when the server is
    down. (Python: gguf_exact.serving.server.server_status, speculation.judge)
    """
    from gguf_exact.serving.server import server_status

    st = server_status(port, last=last, probe_request=probe, api_key=api_key)
    if as_json:
        click.echo(json.dumps(st.as_dict(), indent=2, default=str))
    else:
        s = st.state
        state = "up" if st.up else ("down: process not running (exited or killed)" if not st.running else st.health)
        out.print(f"server       {s['url']}  pid {st.pid or s['pid']}  {state}", markup=False)
        out.print(f"engine       {s.get('engine', 'llama-server')}", markup=False)
        out.print(f"health       {st.health}", markup=False)
        out.print(f"target       {s['target']}", markup=False)
        out.print(f"drafter      {s.get('drafter') or '-'}", markup=False)
        if st.needs_key:
            out.print(
                "api key      the server wants its API key: set GGUF_EXACT_API_KEY or pass --api-key", markup=False
            )
        elif st.running:
            out.print(f"models       {', '.join(st.models) or '-'}", markup=False)
            spec = "-" if st.speculative is None else ("on" if st.speculative else "off")
            out.print(f"speculation  {spec}", markup=False)
            if st.speculation is not None:
                out.print(f"draft-mtp    {st.speculation.line}", markup=False, soft_wrap=True)
            c = st.counters
            if c is not None:
                rate = "-" if c.rate is None else f"{c.rate:.2%}"
                out.print(
                    f"drafts       {c.drafts:,} drafts, {c.draft_tokens:,} draft tokens, {c.accepted_tokens:,} accepted ({rate})",
                    markup=False,
                )
                if c.position_rates:
                    per = ", ".join(f"{i + 1}: {r:.0%}" for i, r in enumerate(c.position_rates))
                    out.print(f"by position  {per} of drafts had that draft token accepted", markup=False)
            else:
                out.print("drafts       - (no draft counters in /metrics)", markup=False)
        for a in st.recent:
            out.print(
                f"request      acceptance {a.rate:.5f}: {a.accepted} accepted / {a.generated} drafted, mean len {a.mean_len:.2f}",
                markup=False,
            )
        out.print(f"log          {st.run_dir / 'server.log'}", markup=False)
    if not st.up:
        sys.exit(1)


@main.command()
@click.option("--port", type=int, help="The server's port (default: the last one started).")
def stop(port: int | None) -> None:
    """Stop a server started by `gguf-exact serve` (by its pid file).

    (Python: gguf_exact.serving.server.stop_server)
    """
    from gguf_exact.serving.server import stop_server

    out.print(stop_server(port), markup=False)


@main.command()
@target_and_draft_options(auto=True, no_draft=False)
@click.option("--profile", default="auto", show_default=True, help="The profile to start from: " + PROFILE_HELP)
@click.option(
    "--as",
    "save_as",
    metavar="NAME",
    help="The name to save the tuned profile under (default: PROFILE-tuned, e.g. cpu-tuned). "
    "Naming a profile shipped with gguf-exact (cpu, rtx3050, ...) replaces it for every later serve.",
)
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a profile value while measuring."
)
@click.option(
    "--n-max", "n_max_list", default="1,2,3,4", show_default=True, help="Comma-separated n-max values to try."
)
@click.option("--prompts", "prompt_list", help="Comma-separated names from the shipped prompt set (default: all).")
@click.option("--n-predict", default=64, show_default=True, help="Tokens per prompt and run.")
@click.option("--rounds", default=1, show_default=True, help="Rounds; each visits the arms forward then backward.")
@click.option(
    "--server-bin", type=click.Path(path_type=Path), help="A llama-server to run instead of the cached build."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Where bench.json and bench.md of the measurement go (default: a new folder "
    "~/.cache/gguf-exact/tune/DATE-TIME, named at the end).",
)
@click.option("--no-write", is_flag=True, help="Measure and print; write no profile.")
def tune(
    target: Path,
    drafter: str | None,
    fetch_draft: bool,
    models_dir: Path,
    profile: str,
    save_as: str | None,
    overrides: tuple[str, ...],
    n_max_list: str,
    prompt_list: str | None,
    n_predict: int,
    rounds: int,
    server_bin: Path | None,
    out_dir: Path | None,
    no_write: bool,
) -> None:
    """Measure tokens/s at each n-max on this machine; keep the best in a profile of its own.

    Starts llama-server with the profile once per arm (the target alone, then
    n-max 1, 2, 3, 4; one server at a time, arms forward then backward), runs the
    shipped prompts against each and prints the table. Its servers' run folders
    are temporary: `status` never shows them. The best n-max goes into a copy
    of the profile named PROFILE-tuned (cpu-tuned, rtx3050-tuned; --as NAME for
    another) in the user's profile folder ($GGUF_EXACT_PROFILES, else
    ~/.config/gguf-exact/profiles), the measurement in a comment at its top:
    serve with `--profile cpu-tuned`. The profiles shipped with gguf-exact (and
    what --profile auto picks) stay as they are unless --as names one. Delete
    the copy to go back. (Python: gguf_exact.serving.tune.tune_n_max,
    write_tuned_profile)
    """
    from gguf_exact.serving.tune import shadows_builtin, tune_n_max, tuned_name, write_tuned_profile
    from gguf_exact.speculative.prompt_set import load_prompts

    prof, choice = resolve_profile_option(profile)
    name = tuned_name(prof, save_as)  # a bad --as stops here, before any measuring
    drafter, how = resolve_draft(target, drafter, False, fetch_draft, models_dir, auto=True)
    if how:
        err.print(f"drafter {drafter} ({how})", markup=False, soft_wrap=True)
    err.print(profile_line(prof, choice), markup=False, soft_wrap=True)
    try:
        n_values = [int(x) for x in n_max_list.split(",") if x.strip()]
    except ValueError:
        raise GgufExactError(f"--n-max {n_max_list}: expected comma-separated integers, e.g. 1,2,3,4") from None
    prompts = load_prompts([p.strip() for p in prompt_list.split(",")] if prompt_list else None)
    progress = (lambda s: err.print(s, markup=False)) if err.is_terminal else (lambda s: None)
    result = tune_n_max(
        target, drafter, prof, n_values, prompts, n_predict, rounds, overrides, server_bin, progress=progress
    )
    paths = result.report.write(out_dir or results_dir("tune"), plot=False)
    out.print(result.report.markdown(), markup=False, soft_wrap=True)
    base = result.target_tokens_per_second
    vs = f"; the target alone {base:.1f} tokens/s" if base else ""
    out.print(
        f"best: n-max {result.best_n_max} at {result.best_tokens_per_second:.1f} tokens/s (median run){vs}",
        markup=False,
        soft_wrap=True,
    )
    if base and result.best_tokens_per_second < base:
        out.print("drafting is slower than the target alone on this machine (noisy if it is busy)", markup=False)
    out.print("wrote " + ", ".join(str(p) for p in paths.values()), markup=False, soft_wrap=True)
    if no_write:
        return
    args = ["--model", str(target), "--draft", str(drafter), "--profile", profile, "--n-max", n_max_list]
    args += ["--n-predict", str(n_predict), "--rounds", str(rounds)] + (
        ["--prompts", prompt_list] if prompt_list else []
    )
    args += ["--as", save_as] if save_as else []
    command = shlex.join(["gguf-exact", "tune", *args, *(a for o in overrides for a in ("--set", o))])
    dest = write_tuned_profile(prof, result, command, name=name)
    out.print(
        f"wrote {dest}: spec-draft-n-max = {result.best_n_max}; serve with `--profile {name}`",
        markup=False,
        soft_wrap=True,
    )
    if shadows_builtin(name):
        out.print(
            f"note: it replaces the {name} profile shipped with gguf-exact for every later serve, chat and "
            f"--profile auto; delete {dest} to go back",
            markup=False,
            soft_wrap=True,
        )


# --- Recipes: pinned fetch, pin, reproducible build (gguf_exact.hub.fetch / .pin / .build) ---


@main.command("recipes")
def recipes_command() -> None:
    """List the recipes `fetch`, `pin` and `build` know, and what is pinned.

    Per recipe: what it makes, its parts (exact: the published GGUF; source: the
    checkpoint; target: the GGUF whose vocabulary a drafter copies), each with its
    repository and whether `fetch RECIPE --what PART` can run or `pin` must come
    first. Recipes are read from $GGUF_EXACT_RECIPES, ~/.config/gguf-exact/recipes,
    then the ones shipped with gguf-exact. (Python: gguf_exact.hub.recipes.all_recipes)
    """
    from gguf_exact.hub.fetch import pin_state
    from gguf_exact.hub.recipes import ROLES, all_recipes

    found = all_recipes()
    if not found:
        raise GgufExactError("no recipes found; write one as convert/<name>.toml (README, 'Recipes')")
    for r in found:
        what = f"drafter for {r.size} targets" if r.kind == "drafter" and r.size else r.kind
        out.print(f"{r.name}  ({what}) {r.description}", markup=False, soft_wrap=True)
        for role in ROLES:
            if role in r.parts:
                out.print(f"  {role:<7} {r.parts[role].repo}", markup=False, soft_wrap=True)
                out.print(f"  {'':<7} {pin_state(r, role)}", markup=False, soft_wrap=True)
        out.print(f"  file    {r.path}", markup=False, soft_wrap=True)


@main.command()
@click.argument("recipe")
@click.option(
    "--models-dir", type=click.Path(path_type=Path), default=Path("models"), show_default=True, help=MODELS_DIR_HELP
)
@click.option(
    "--what",
    type=click.Choice(["exact", "source", "target"]),
    default="exact",
    show_default=True,
    help="The published exact GGUF, the source checkpoint, or the target GGUF (vocabulary).",
)
def fetch(recipe: str, models_dir: Path, what: str) -> None:
    """Download the files a recipe pins, each checked against its sha256.

    RECIPE is a name from `gguf-exact recipes` (e.g. e2b-assistant) or a path to a
    .toml file. --what exact (the default) gets the published exact GGUF, source the
    checkpoint, target the GGUF whose vocabulary a drafter copies; a part whose files
    are not pinned yet needs `gguf-exact pin RECIPE --what PART` first. The
    files come from the commit pinned in checksums/RECIPE.sha256, through
    huggingface_hub and its cache (HF_HUB_CACHE). A file whose sha256 differs is
    refused and nothing is left at its final path; an interrupted download resumes on
    the next run; HF_HUB_OFFLINE=1 uses the cache only. Private or gated repos need
    `hf auth login` or HF_TOKEN. (Python: gguf_exact.hub.fetch.fetch_recipe)
    """
    from gguf_exact.hub.fetch import fetch_recipe
    from gguf_exact.hub.recipes import load_recipe

    r = load_recipe(recipe)
    for f in fetch_recipe(r, what, models_dir):
        commit = f", commit {f.commit}" if f.commit else ""
        out.print(f"{f.path}  {f.how} ({f.size:,} bytes{commit})", markup=False, soft_wrap=True)
    out.print(f"verified: sha256 as pinned in {r.checksums}", markup=False, soft_wrap=True)


@main.command()
@click.argument("recipe")
@click.option(
    "--models-dir", type=click.Path(path_type=Path), default=Path("models"), show_default=True, help=MODELS_DIR_HELP
)
@click.option(
    "--out-dir",
    type=click.Path(path_type=Path),
    default=Path("build/drafters"),
    show_default=True,
    help="Where the rebuilt GGUF is written.",
)
@click.option(
    "--vocab-from",
    type=click.Path(path_type=Path),
    help="Target GGUF whose tokenizer.* keys are copied, instead of the recipe's [target] file.",
)
def build(recipe: str, models_dir: Path, out_dir: Path, vocab_from: Path | None) -> None:
    """Rebuild a recipe's exact drafter from its pinned source; compare it with the published file.

    Fetches the [source] checkpoint (and the [target] GGUF unless --vocab-from is
    given) at the pinned commit, verified; converts and verifies as `convert` does;
    then compares the output with the [exact] file. Four outcomes: "reproduced" (same
    sha256); "same levels" (every Q4_0 block holds the published file's levels, only
    scales differ, and every published block is as exact as the plan by verify's block
    rule); "same levels, less exact" (as above, but some published blocks are less
    exact: counted per tensor); or "differs" (the first differing tensor and block,
    exit 1). Both files' bit-exact share against the source is printed. A file made by
    another scale rule, such as the published method, comes out "same levels, less exact".
    (Python: gguf_exact.hub.build.build_recipe)
    """
    from gguf_exact.hub.build import build_recipe
    from gguf_exact.hub.outcome import LESS_EXACT, REPRODUCED, SAME_LEVELS
    from gguf_exact.hub.recipes import load_recipe

    r = load_recipe(recipe)
    res = build_recipe(r, models_dir, out_dir, vocab_from)
    s = res.convert.report

    def say(line: str) -> None:
        out.print(line, markup=False, soft_wrap=True)

    say(f"source  {models_dir / r.part('source').repo} ({len(res.sources)} files, verified)")
    say(f"vocab   {res.vocab_from}")
    say(f"wrote   {res.output} ({res.convert.size:,} bytes; {s['exact_values']:,} of {s['values']:,} values bit-exact)")
    o = res.outcome
    if o is None:
        say(f"sha256 {res.sha256}; the recipe pins no published exact file to compare with")
        return
    if o.kind == REPRODUCED:
        say(f"reproduced: sha256 {res.sha256} is the published {res.published}")
        return
    say(f"built      {res.sha256}  {res.output}")
    say(f"published  {res.published_sha256}  {res.published}")
    if o.metadata_keys:
        say(f"metadata   {len(o.metadata_keys)} keys differ: {', '.join(o.metadata_keys[:6])}")
    if o.kind in (SAME_LEVELS, LESS_EXACT):
        for t in o.scales:
            less = f", {t.less_exact:,} less exact" if t.less_exact else ""
            say(f"  {t.name}: {t.as_exact:,} of {t.blocks:,} published blocks as exact as the plan{less}")
        say(
            f"{o.kind}: every Q4_0 block holds the published file's levels; "
            f"{o.other_scale_blocks:,} of {o.q4_0_blocks:,} blocks are stored with another scale"
            + (
                f", {o.less_exact_blocks:,} of them less exact than the plan"
                if o.kind == LESS_EXACT
                else ", none less exact than the plan"
            )
        )
        for who, e in (("built", o.built_exact), ("published", o.published_exact)):
            say(
                f"bit-exact against the source, {who + ':':<10} {e.exact_fraction:.4%} ({e.exact:,} of {e.n_values:,} values)"
            )
        return
    raise GgufExactError(
        f"{res.output}: not reproduced: differs from the published {res.published}: {o.difference}; "
        "compare them with `gguf-exact compare --source SRC A.gguf B.gguf`"
    )


@main.command()
@click.argument("recipe")
@click.option(
    "--revision",
    help="Pin this branch, tag or commit instead of the recipe's revision (one part: name it with --what).",
)
@click.option(
    "--what",
    type=click.Choice(["all", "source", "exact", "target"]),
    default="all",
    show_default=True,
    help="Which part of the recipe to pin.",
)
def pin(recipe: str, revision: str | None, what: str) -> None:
    """Resolve a recipe's revisions to commits and record each file's sha256.

    Reads the Hub's file metadata (model info with files_metadata): LFS files are not
    downloaded; small git files such as config.json are read, checked against their
    git id and size, and hashed. Names, commits and hashes in the Hub's answer are
    checked before use. Rewrites checksums/RECIPE.sha256 in a checkout of
    gguf-exact (commit it); an installed gguf-exact keeps its own files and writes
    ~/.config/gguf-exact/checksums/RECIPE.sha256 ($GGUF_EXACT_CHECKSUMS) instead,
    which fetch, build and serve then read first. Shows any sha256 that changed.
    (Python: gguf_exact.hub.pin.pin_recipe)
    """
    from gguf_exact.hub.checksums import CHECKSUMS_DIR, user_checksums_dir
    from gguf_exact.hub.pin import pin_recipe
    from gguf_exact.hub.recipes import load_recipe

    r = load_recipe(recipe)
    report = pin_recipe(r, None if what == "all" else [what], revision)
    user_copy = report.checksums.parent == user_checksums_dir()
    for p in report.parts:
        out.print(
            f"[{p.role}] {p.pin.repo} revision {p.pin.revision} -> commit {p.pin.commit}", markup=False, soft_wrap=True
        )
        for e in p.entries:
            changed = f"  CHANGED, was {e.previous}" if e.previous not in (None, e.sha256) else ""
            out.print(f"  {e.sha256}  {e.path}  ({e.how}){changed}", markup=False, soft_wrap=True)
    out.print(f"wrote {report.checksums}", markup=False, soft_wrap=True)
    if user_copy:
        out.print(
            f"(gguf-exact's own {CHECKSUMS_DIR / report.checksums.name} is not written here: "
            "fetch, build and serve read this copy first; delete it to go back)",
            markup=False,
            soft_wrap=True,
        )


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
def repack(
    donor: Path,
    source: Path,
    out_gguf: Path,
    off_grid: str | None,
    expect_sha256: str | None,
    report_path: Path | None,
    donor_stats: str,
    workers: int | None,
) -> None:
    """Re-pack a Gemma 4 GGUF as exact Q4_0 from its QAT checkpoint.

    Keeps the donor's header and metadata (tokenizer, chat template,
    hyperparameters) byte for byte except general.file_type; rewrites every tensor
    that maps to an on-grid source matrix as exact Q4_0 (layer matrices,
    token_embd, per_layer_token_embd, per_layer_model_proj, expert banks) and
    copies every other tensor. Streams in chunks of rows: memory stays bounded
    whatever the model size. The file is written beside OUT_GGUF, read back and
    checked, then renamed into place; on any failure nothing is left at OUT_GGUF.
    (Python: gguf_exact.repack.pipeline.repack_model)
    """
    from gguf_exact.repack.donor import open_donor
    from gguf_exact.repack.pipeline import repack_model

    with open_donor(donor) as d:
        n = len(d.tensors)
    with tensor_progress("repack", n) as progress:
        result = repack_model(
            donor, source, out_gguf, off_grid, expect_sha256, report_path, workers, donor_stats, progress
        )
    r = result.report
    columns = [("kind", "left"), ("n", "right"), ("type", "left"), ("size (of donor)", "right")]
    columns += [("bit-exact", "right")]

    def rows(compact: bool) -> list[list[str]]:
        def types(mix: str) -> str:
            return "+".join(t.split(" x")[0] for t in mix.split(", "))

        return [
            [
                k["kind"],
                str(k["tensors"]),
                f"{types(k['donor_types'])} → {types(k['output_types'])}",
                f"{human_size(k['output_bytes'])} ({k['output_bytes'] / max(1, k['donor_bytes']):.0%})",
                f"{pct(k['donor_exact_fraction'], 2)} → {pct(k['exact_fraction'], 2)}",
            ]
            for k in r["kinds"]
        ]

    title = f"{donor.name} → {out_gguf.name}, per kind of tensor (donor → output)"
    out.print(fitted_table(title, columns, rows, wrap=(0, 2)))
    rep, don = r["repacked"], r["donor_on_repacked"]
    sizes = f"{result.size:,} bytes; donor {result.donor_size:,}, {result.size / result.donor_size:.1%}"
    out.print(
        f"wrote {result.path} ({sizes}); {r['repacked_tensors']} tensors re-packed as exact Q4_0, {r['copied_tensors']} copied",
        soft_wrap=True,
        markup=False,
    )
    if rep:
        line = f"re-packed values bit-exact: {rep['exact_values']:,} of {rep['values']:,} ({rep['exact_fraction']:.4%}), largest error {rep['max_ulps']} bf16 ULP"
        if don:
            line += f"; the donor's: {don['exact_fraction']:.4%} (sampled over {don['values']:,} values)"
        out.print(line, soft_wrap=True, markup=False)
    for t in r["off_grid"]:
        out.print(f"off grid: {t['name']}: {t['note']}", soft_wrap=True, markup=False)
    if result.source_only:
        out.print(
            f"source tensors the donor lacks ({len(result.source_only)}, not written): {', '.join(result.source_only[:8])}"
            + (" ..." if len(result.source_only) > 8 else ""),
            soft_wrap=True,
            markup=False,
        )
    if result.unmapped:
        out.print(
            f"donor tensors with no known source ({len(result.unmapped)}, copied): {', '.join(result.unmapped[:8])}",
            soft_wrap=True,
            markup=False,
        )
    s = result.seconds
    out.print(
        f"{s['total']:.1f} s (write {s['write']:.1f} s, read-back {s['verify']:.1f} s); sha256 {result.sha256}"
        + ("  (matches --expect-sha256)" if expect_sha256 else ""),
        soft_wrap=True,
        markup=False,
    )


def sampling_options(command):
    """--temperature --top-k --top-p --min-p --repeat-penalty --seed (llama-cpp-python's sampler),
    defaulting to llama-server's values except the temperature (greedy here)."""
    from gguf_exact.serving.sampling_defaults import SERVER_SAMPLING as d

    for opt in reversed(
        [
            click.option(
                "--temperature",
                default=0.0,
                show_default=True,
                help=f"0 is greedy; above 0 samples (both servers default to {d['temperature']}).",
            ),
            click.option("--top-k", default=d["top_k"], show_default=True),
            click.option("--top-p", default=d["top_p"], show_default=True),
            click.option("--min-p", default=d["min_p"], show_default=True),
            click.option("--repeat-penalty", default=d["repeat_penalty"], show_default=True, help="1.0 is off."),
            click.option("--seed", type=int, help="Sampler seed: the same seed gives the same text, drafter or not."),
        ]
    ):
        command = opt(command)
    return command


def _sampling(temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float, seed: int | None):
    from gguf_exact.speculative.runner import Sampling

    return Sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed)


@main.command()
@target_and_draft_options(auto=False)
@click.option("--prompt", help="The prompt text (BOS is added).")
@click.option(
    "--prompt-file", type=click.Path(path_type=Path), help="Read the prompt from this file (one final newline dropped)."
)
@click.option(
    "--n-max", default=2, show_default=True, help="Most draft tokens per target pass; 0 runs the target alone."
)
@click.option(
    "--n-predict",
    default=128,
    show_default=True,
    help="Most tokens to generate (fewer when an end-of-generation token comes).",
)
@sampling_options
@click.option(
    "--stop",
    "stops",
    multiple=True,
    help=r"Stop before this text (repeatable). \n, \t, \r and \\ are read as newline, tab, return and "
    r"backslash: --stop '\n\n' stops at the first blank line.",
)
@click.option("--chat", is_flag=True, help="Send the prompt as one user message through the GGUF's chat template.")
@click.option("--n-ctx", default=4096, show_default=True, help="Context size: prompt plus generated tokens.")
@click.option("--threads", default=2, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print token ids, text and counters as JSON.")
def generate(
    target: Path,
    drafter: str | None,
    no_draft: bool,
    fetch_draft: bool,
    models_dir: Path,
    prompt: str | None,
    prompt_file: Path | None,
    n_max: int,
    n_predict: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    repeat_penalty: float,
    seed: int | None,
    stops: tuple[str, ...],
    chat: bool,
    n_ctx: int,
    threads: int,
    as_json: bool,
) -> None:
    """Generate in-process, with the MTP drafter when --draft is given (--draft auto finds it as serve does).

    The drafter proposes up to --n-max tokens from the target's hidden state, the
    target checks them in one pass with the request's sampler, the agreeing prefix
    and the target's own next token are kept: with the same --seed the text is the
    target's own, drafter or not (greedy at --temperature 0). Prints the text, and
    counters on stderr (--json: everything on stdout). (Python:
    gguf_exact.speculative.runner.Runner.complete, on gguf_exact.load_with_drafter's engine)
    """
    from gguf_exact.speculative.runner import Runner

    if (prompt is None) == (prompt_file is None):
        raise GgufExactError("give exactly one of --prompt TEXT and --prompt-file FILE")
    if prompt_file is not None:
        if not prompt_file.is_file():
            raise GgufExactError(f"--prompt-file {prompt_file}: no such file")
        prompt = prompt_file.read_text(encoding="utf-8").removesuffix("\n")
    sampling = _sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    stops = tuple(unescape(s) for s in stops)
    drafter, how = resolve_draft(target, drafter, no_draft, fetch_draft, models_dir, auto=False)
    if how and drafter is not None:
        err.print(f"drafter {drafter} ({how})", markup=False, soft_wrap=True)
    with Runner(target, drafter, n_ctx=n_ctx, n_threads=threads) as r:
        g = r.complete(prompt, n_predict, n_max if drafter else 0, sampling, stops, chat)  # type: ignore[arg-type]
    if as_json:
        click.echo(
            json.dumps({"model": str(target), "draft": str(drafter) if drafter else None} | g.as_dict(), indent=2)
        )
        return
    click.echo(g.text)
    err.print(generation_line(g), markup=False, soft_wrap=True)


def unescape(text: str) -> str:
    """``\\n``, ``\\t``, ``\\r`` and ``\\\\`` typed on a command line as the characters they
    name (a shell passes ``"\\n"`` as a backslash and an n); any other backslash is kept."""
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m.group(1)], text)


def generation_line(g) -> str:
    acc = (
        ""
        if g.acceptance_rate is None
        else f"; drafts {g.drafts_accepted}/{g.drafts_generated} accepted ({g.acceptance_rate:.1%}), mean length {g.mean_accepted_length:.2f}"
    )
    return f"{g.n_tokens} tokens, {g.target_passes} target passes ({g.tokens_per_target_pass:.2f} tokens/pass){acc}; {g.tokens_per_second:.1f} tokens/s"


@main.command()
@target_and_draft_options(auto=True)
@click.option(
    "--profile", help="Context, GPU layers, n-max as for serve: " + PROFILE_HELP + " Default: 4096 tokens, n-max 2."
)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a profile value.")
@click.option("--n-max", type=int, help="Most draft tokens per target pass (default: the profile's, else 2).")
@sampling_options
@click.option("--max-tokens", default=512, show_default=True, help="Most tokens per reply.")
@click.option("--system", help="A system message to start the conversation with.")
def chat(
    target: Path,
    drafter: str | None,
    no_draft: bool,
    fetch_draft: bool,
    models_dir: Path,
    profile: str | None,
    overrides: tuple[str, ...],
    n_max: int | None,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    repeat_penalty: float,
    seed: int | None,
    max_tokens: int,
    system: str | None,
) -> None:
    """Chat in the terminal, in-process, with the MTP drafter; text streams as it is accepted.

    Without --draft the drafter is found as for serve (--fetch-draft, --models-dir,
    --no-draft for the target alone).

    Each line you type is a user message; the reply uses the GGUF's chat template
    and the sampler options. /stats shows acceptance, tokens per target pass and
    tokens/s so far; /reset starts over; /exit (or Ctrl-D) ends and prints the
    same figures. (Python: gguf_exact.speculative.chat.chat_session on
    gguf_exact.load_with_drafter)
    """
    from gguf_exact.speculative.chat import chat_session, stats_line
    from gguf_exact.speculative.engine import load_with_drafter

    drafter, how = resolve_draft(target, drafter, no_draft, fetch_draft, models_dir, auto=True)
    if how and drafter is not None:
        err.print(f"drafter {drafter} ({how})", markup=False, soft_wrap=True)
    prof = None
    if profile:
        prof, choice = resolve_profile_option(profile)
        err.print(profile_line(prof, choice), markup=False, soft_wrap=True)
    llm = load_with_drafter(target, drafter, n_max, prof, overrides)
    sampling = _sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    err.print(
        f"{target.name}{' + ' + drafter.name if drafter else ''}: n-max {llm.n_max}, context {llm.n_ctx()} tokens. "
        "/stats, /reset, /exit",
        markup=False,
        soft_wrap=True,
    )
    try:
        chat_session(
            llm,
            lines=iter(sys.stdin.readline, ""),
            write=lambda text: (click.echo(text, nl=False), sys.stdout.flush()),
            note=lambda text: err.print(text, markup=False, soft_wrap=True),
            sampling=sampling,
            max_tokens=max_tokens,
            system=system,
        )
    finally:
        err.print(stats_line(llm.totals), markup=False, soft_wrap=True)
        llm.close()


@main.command()
@click.option("--model", "target", type=click.Path(path_type=Path), help="The gemma4 target GGUF (in-process runs).")
@click.option(
    "--draft",
    "drafter",
    metavar="FILE|auto",
    help="Its MTP drafter GGUF, or auto: found as serve finds it (in models/).",
)
@click.option(
    "--n-max",
    "n_max_list",
    default="1,2,3,4",
    show_default=True,
    help="Comma-separated n-max values to compare with the target alone.",
)
@click.option(
    "--server",
    "servers",
    multiple=True,
    metavar="[LABEL=]URL",
    help="Bench running llama-servers instead: target=URL for the target alone, N=URL for one started with --spec-draft-n-max N. Repeat per server.",
)
@click.option("--prompts", "prompt_list", help="Comma-separated names from the shipped prompt set (default: all).")
@click.option("--n-predict", default=64, show_default=True, help="Tokens per prompt and run.")
@click.option(
    "--rounds", default=2, show_default=True, help="Rounds; each runs the arms forward then backward (A B B A)."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Where bench.json, bench.md and bench.png go (default: a new folder "
    "~/.cache/gguf-exact/bench/DATE-TIME, named at the end).",
)
@click.option("--n-ctx", default=4096, show_default=True)
@click.option("--threads", default=2, show_default=True)
@click.option("--no-plot", is_flag=True, help="Skip the PNG.")
@click.option(
    "--engines",
    help="python,llama-server: start a server per engine at each n-max and compare them over HTTP (/v1/completions).",
)
@click.option("--profile", default="cpu", show_default=True, help="--engines: the serving profile for both servers.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="--engines: profile overrides.")
@click.option("--temperature", default=0.0, show_default=True, help="--engines: sampling temperature (0: greedy).")
@click.option("--seed", default=1, show_default=True, help="--engines: the sampler seed sent with every request.")
def bench(
    target: Path | None,
    drafter: str | None,
    n_max_list: str,
    servers: tuple[str, ...],
    prompt_list: str | None,
    n_predict: int,
    rounds: int,
    out_dir: Path | None,
    n_ctx: int,
    threads: int,
    no_plot: bool,
    engines: str | None,
    profile: str,
    overrides: tuple[str, ...],
    temperature: float,
    seed: int,
) -> None:
    """The target alone against the drafter at each n-max, over the shipped prompts.

    In-process (--model, --draft), against running llama-servers (--server,
    reading each answer's timings), or --engines python,llama-server: both
    engines' servers started here at each n-max on the same pair, prompts and
    seed, over HTTP, A B B A (tokens/s and their ratio, tokens per target pass,
    acceptance, the Python engine's time per pass). Writes JSON and a Markdown
    table (and, in-process or --server, a PNG of tokens/s and tokens per target
    pass against n-max). (Python: gguf_exact.speculative.bench.bench_runner,
    bench_servers; gguf_exact.speculative.bench_engines.bench_engines)
    """
    from gguf_exact.speculative.bench import (
        bench_runner,
        bench_servers,
        parse_server_arm,
    )
    from gguf_exact.speculative.prompt_set import load_prompts

    prompts = load_prompts([p.strip() for p in prompt_list.split(",")] if prompt_list else None)
    progress = (lambda s: err.print(s, markup=False)) if err.is_terminal else (lambda s: None)
    if drafter is not None and target is not None:
        drafter = resolve_draft(target, drafter, False, False, Path("models"), auto=False)[0]
    if engines:
        from gguf_exact.speculative.bench_engines import bench_engines

        if target is None or drafter is None or servers:
            raise GgufExactError(
                "bench --engines: give --model and --draft (the servers are started here), no --server"
            )
        try:
            n_values = [int(x) for x in n_max_list.split(",") if x.strip()]
        except ValueError:
            raise GgufExactError(f"--n-max {n_max_list}: expected comma-separated integers, e.g. 1,2,3") from None
        sets = [f"ctx-size={n_ctx}", f"threads={threads}", f"threads-batch={threads}", *overrides]
        report = bench_engines(
            target,
            drafter,
            n_values,
            prompts,
            n_predict,
            rounds,
            [e.strip() for e in engines.split(",") if e.strip()],
            profile,
            sets,
            temperature,
            seed,
            progress,
        )
        paths = report.write(out_dir or results_dir("bench"))
        out.print(report.markdown(), markup=False, soft_wrap=True)
        out.print("wrote " + ", ".join(str(p) for p in paths.values()), markup=False, soft_wrap=True)
        return
    if servers:
        if target or drafter:
            raise GgufExactError("bench: give either --server URLs or --model/--draft, not both")
        report = bench_servers([parse_server_arm(s) for s in servers], prompts, n_predict, rounds, progress)
    else:
        if target is None:
            raise GgufExactError("bench: give --model (and --draft), or --server URLs")
        try:
            n_values = [int(x) for x in n_max_list.split(",") if x.strip()]
        except ValueError:
            raise GgufExactError(f"--n-max {n_max_list}: expected comma-separated integers, e.g. 1,2,3") from None
        report = bench_runner(
            target, drafter, n_values, prompts, n_predict, rounds, progress, n_ctx=n_ctx, n_threads=threads
        )
    paths = report.write(out_dir or results_dir("bench"), plot=not no_plot)
    out.print(report.markdown(), markup=False, soft_wrap=True)
    out.print("wrote " + ", ".join(str(p) for p in paths.values()), markup=False, soft_wrap=True)


def run() -> None:
    """The ``gguf-exact`` executable: :func:`main`, then an exit without the interpreter's
    teardown. Unloading numba and llvmlite takes about 0.2 s after every command, a sixth
    of a whole drafter conversion (measured: ``convert`` ends at 0.97 s, its process at
    1.2 s). By then every output file has been written, fsynced and renamed, pools and
    servers are shut down, and stdout and stderr are flushed here: the teardown has
    nothing left to do. ``python -m gguf_exact`` and ``main()`` itself exit normally."""
    try:
        main()
        code: int | str | None = 0
    except SystemExit as e:
        code = e.code
    if isinstance(code, str):  # as the interpreter does with SystemExit("message")
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    sys.exit(main())
