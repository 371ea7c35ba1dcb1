"""The ``gguf-exact`` command line. Each command is a thin layer over one function
of the Python API (named in its help), so scripts and the Makefile can do the same."""

import contextlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

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

# Off a terminal (pipes, CI logs) rich would wrap tables at 80 columns; tensor names need more.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
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


def target_and_draft_options(auto: bool):
    """``--model TARGET.gguf [--draft DRAFTER.gguf|auto] [--no-draft] [--fetch-draft]
    [--models-dir DIR]``, shared by serve, chat, generate and tune. With ``auto`` no
    ``--draft`` means ``--draft auto`` (serve, chat); else the target alone (generate)."""
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
                click.option("--no-draft", is_flag=True, help="The target alone: no drafter, no speculation."),
                click.option(
                    "--fetch-draft",
                    is_flag=True,
                    help="When no drafter is found, fetch the one the recipes in convert/ name for the target's size "
                    "(pinned commit, sha256 checked) into --models-dir. $GGUF_EXACT_RECIPES: another recipes folder.",
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
    target: Path, drafter: str | None, no_draft: bool, fetch_draft: bool, models_dir: Path, auto: bool
) -> tuple[Path | None, str | None]:
    """The drafter the draft options name (:func:`gguf_exact.serving.drafter_lookup.resolve_drafter`),
    and how it was found (None when given as a file)."""
    from gguf_exact.serving.drafter_lookup import resolve_drafter

    found = resolve_drafter(target, drafter, no_draft, models_dir, fetch_draft, default_auto=auto)
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
    "auto (from nvidia-smi's GPU name and memory; cpu without one), rtx3050, gtx1650ti, cpu, a name "
    "in ~/.config/gguf-exact/profiles (read first: where `gguf-exact tune` writes), or a .toml file."
)


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
    table = Table(title=str(src_dir))
    for col in ("tensor", "shape", "dtype", "blocks", "on grid", "bit-exact", "planned"):
        table.add_column(col, justify="right" if col in ("blocks", "on grid", "bit-exact") else "left")
    for t in report.tensors:
        table.add_row(
            t.name,
            "x".join(map(str, t.shape)) or "scalar",
            t.dtype,
            str(t.blocks or "-"),
            pct(t.on_grid_fraction),
            pct(t.exact_fraction),
            t.planned,
        )
    out.print(table)
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
    type=click.Choice(["q8_0", "f16", "bf16"]),
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
@click.option("--json", "as_json", is_flag=True, help="Print per-tensor results as JSON.")
def verify(gguf_path: Path, source: Path, as_json: bool) -> None:
    """Check an existing GGUF against the checkpoint it was made from; exit 1 if it fails.

    Recomputes from the source what every tensor must hold and reads the file beside
    it in row chunks. It fails, naming the tensor and block, when a Q4_0 block holds
    other levels than the source's 4-bit grid, or decodes further from the source
    than the exact packer's scale (+1 bf16 ULP); when a matrix on the grid is stored
    in another type; when a norm differs from the source; or when a tensor is
    missing, extra or of another shape. A `llama-quantize` Q4_0 file of a QAT source
    fails (its `max / -8` steps move values off the grid); files from `convert` and
    `repack` pass. Prints, per tensor, the bit-exact share, the largest error in bf16
    ULPs and the relative RMS error. Drafters (gemma4-assistant) are checked against
    the conversion's jobs (Python: gguf_exact.verify_gguf), main models against the
    re-pack's (Python: gguf_exact.repack.check.verify_model).
    """
    from gguf_exact.drafter.verify import verify_gguf
    from gguf_exact.formats.gguf_file import sha256_file
    from gguf_exact.gemma4.assistant import ARCH as ASSISTANT
    from gguf_exact.repack.check import verify_model
    from gguf_exact.repack.donor import open_donor

    with open_donor(gguf_path) as gguf:
        arch, n = gguf.architecture, len(gguf.tensors)
    with tensor_progress("verify", n, not as_json) as progress:
        if arch == ASSISTANT:
            v = verify_gguf(gguf_path, source, progress=progress)
        else:
            v = verify_model(gguf_path, source, progress=progress)
    digest = sha256_file(gguf_path)
    total = v.total
    if as_json:
        click.echo(
            json.dumps(
                {
                    "path": str(gguf_path),
                    "sha256": digest,
                    "total": total.as_dict(),
                    "tensors": [t.as_dict() for t in v.tensors],
                },
                indent=2,
            )
        )
        return
    table = Table(title=str(gguf_path))
    for col in ("tensor", "type", "values", "bit-exact", "max ULP", "rel. error"):
        table.add_column(col, justify="left" if col in ("tensor", "type") else "right")
    for t in v.tensors + [total]:
        table.add_row(t.name, t.type, f"{t.n_values:,}", pct(t.exact_fraction), str(t.max_ulps), f"{t.rel_error:.3e}")
    out.print(table)
    out.print(f"sha256 {digest}")


@main.command()
@click.option(
    "--source", "source", required=True, type=click.Path(path_type=Path), help="The HF folder the files were made from."
)
@click.argument("gguf_paths", nargs=-1, required=True, type=click.Path(path_type=Path))
def compare(source: Path, gguf_paths: tuple[Path, ...]) -> None:
    """Put drafter GGUFs side by side: size, type mix, error against the source.

    For example the exact Q4_0 file beside a Q8_0 or bf16 one made by llama.cpp's
    converter. (Python: gguf_exact.compare_files)
    """
    from gguf_exact.drafter.compare import compare_files

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
    """Write a tiny gemma4 target GGUF and a tiny QAT drafter checkpoint.

    OUT_DIR/target.gguf and OUT_DIR/drafter-hf/ are a pair that llama.cpp runs
    together: the demo's inputs, and a quick way to try every command offline.
    --pairs adds the target + drafter GGUF pairs the tests and benchmarks
    speculate with, e.g. `hidden`, whose drafter reads only the target's hidden
    state. (Python: gguf_exact.tiny.models, gguf_exact.tiny.pairs.write_runner_pairs)
    """
    from gguf_exact.tiny.models import write_tiny_drafter, write_tiny_target

    out_dir.mkdir(parents=True, exist_ok=True)
    write_tiny_target(out_dir / "target.gguf", seed=seed)
    write_tiny_drafter(out_dir / "drafter-hf", seed=seed, step_kind=step_kind)
    out.print(f"wrote {out_dir / 'target.gguf'} and {out_dir / 'drafter-hf'}/")
    if with_pairs:
        from gguf_exact.tiny.pairs import write_runner_pairs

        for name, (target, drafter) in write_runner_pairs(out_dir / "pairs", seed=seed).items():
            out.print(f"pair {name:<9} {target}  {drafter}", markup=False, soft_wrap=True)


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
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option(
    "--server-bin", type=click.Path(path_type=Path), help="A llama-server to run instead of the cached build."
)
@click.option("--detach", is_flag=True, help="Run in the background (pid file and log in the run directory).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check the files, print the memory plan and the command (even before the build exists); start nothing.",
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
    command, starts it on 127.0.0.1 (llama-server with --metrics), waits for
    /health, sends one short probe request and says whether draft-mtp is drafting
    (or that llama.cpp left speculation off), then stays in the foreground (Ctrl-C
    stops it) unless --detach. --engine python serves /v1/chat/completions,
    /v1/completions, /v1/models, /health and /metrics from llama-cpp-python
    instead, with the same profile. (Python: gguf_exact.serving.server.plan_launch,
    start_server; drafter_lookup.resolve_drafter; memory_plan.plan_memory;
    profile_choice.resolve_profile; the python engine: gguf_exact.serving.openai_server)
    """
    from gguf_exact.serving.memory_plan import plan_memory
    from gguf_exact.serving.server import plan_launch, serve_foreground, server_status, start_server

    prof, choice = resolve_profile_option(profile)
    found_drafter, how = resolve_draft(target, drafter, no_draft, fetch_draft, models_dir, auto=True)
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
    plan = plan_memory(pair.target.path, pair.drafter.path if pair.drafter else None, launch.profile)
    say(f"memory plan ({'GPU' if plan.gpu else 'CPU'}, estimated from the GGUF headers as llama.cpp sizes them):")
    for line in plan.lines():
        say(line)
    warning = plan.warning(*_card_memory(launch.profile, choice))
    if warning:
        err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    say(launch.command_line)
    if launch.note:
        say(f"note: {launch.note}")
    if dry_run:
        return
    proc, seconds = start_server(launch, detach, timeout)
    say(
        f"{launch.label} ready at {launch.url} in {seconds:.1f} s (pid {proc.pid}); log {launch.run_dir / 'server.log'}"
    )
    if pair.drafter is not None and not no_probe:
        try:
            verdict = server_status(launch.port, launch.run_dir.parent, probe_request=True).speculation
        except GgufExactError as e:  # the server is up: say so, and keep serving
            verdict = None
            err.print(f"[yellow]warning:[/] draft-mtp not checked: {escape(str(e))}", soft_wrap=True)
        if verdict is not None:
            if verdict.state == "off":
                err.print(f"[yellow]warning:[/] draft-mtp {escape(verdict.line)}", soft_wrap=True)
            else:
                say(f"draft-mtp {verdict.line}")
    if detach:
        say(f"detached; `gguf-exact status --port {port}` reports on it, `gguf-exact stop --port {port}` ends it")
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
def status(port: int | None, last: int, as_json: bool, probe: bool) -> None:
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

    st = server_status(port, last=last, probe_request=probe)
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
        if st.running:
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
@target_and_draft_options(auto=True)
@click.option("--profile", default="auto", show_default=True, help=PROFILE_HELP)
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
    default=Path("build/tune"),
    show_default=True,
    help="Where bench.json and bench.md of the measurement go.",
)
@click.option("--no-write", is_flag=True, help="Measure and print; write no profile.")
def tune(
    target: Path,
    drafter: str | None,
    no_draft: bool,
    fetch_draft: bool,
    models_dir: Path,
    profile: str,
    overrides: tuple[str, ...],
    n_max_list: str,
    prompt_list: str | None,
    n_predict: int,
    rounds: int,
    server_bin: Path | None,
    out_dir: Path,
    no_write: bool,
) -> None:
    """Measure tokens/s at each n-max on this machine; keep the best in a local profile.

    Starts llama-server with the profile once per arm (the target alone, then
    n-max 1, 2, 3, 4; one server at a time, arms forward then backward), runs the
    shipped prompts against each and prints the table. The best n-max goes into a
    copy of the profile in the user's profile folder ($GGUF_EXACT_PROFILES, else
    ~/.config/gguf-exact/profiles/NAME.toml, the measurement in a comment at its
    top); `--profile NAME` (and auto) read that copy before the project's
    serve/NAME.toml, which is never written. Delete the copy to go back.
    (Python: gguf_exact.serving.tune.tune_n_max, write_tuned_profile)
    """
    from gguf_exact.serving.tune import tune_n_max, write_tuned_profile
    from gguf_exact.speculative.prompt_set import load_prompts

    if no_draft:
        raise GgufExactError("tune measures the drafter's n-max: --no-draft leaves nothing to tune")
    prof, choice = resolve_profile_option(profile)
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
    paths = result.report.write(out_dir, plot=False)
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
    command = shlex.join(["gguf-exact", "tune", *args, *(a for o in overrides for a in ("--set", o))])
    dest = write_tuned_profile(prof, result, command)
    out.print(
        f"wrote {dest}: spec-draft-n-max = {result.best_n_max}; `--profile {prof.name}` now reads it",
        markup=False,
        soft_wrap=True,
    )


# --- Recipes: pinned fetch, pin, reproducible build (gguf_exact.hub.fetch / .pin / .build) ---


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

    RECIPE is a name in convert/ (e.g. e2b-assistant) or a path to a .toml file. The
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
    then compares the output with the [exact] file. Three outcomes: "reproduced" (same
    sha256); "same levels" (every Q4_0 block holds the published file's levels, only
    scales differ: both files' bit-exact share against the source is printed); or
    "differs" (the first differing tensor and block, exit 1). A file made by another
    scale rule, such as the published method, comes out "same levels".
    (Python: gguf_exact.hub.build.build_recipe)
    """
    from gguf_exact.hub.build import build_recipe
    from gguf_exact.hub.outcome import REPRODUCED, SAME_LEVELS
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
    if o.kind == SAME_LEVELS:
        say(
            f"same levels: every Q4_0 block holds the published file's levels; "
            f"{o.other_scale_blocks:,} of {o.q4_0_blocks:,} blocks are stored with another scale"
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
    checked before use. Rewrites
    checksums/RECIPE.sha256 and shows any sha256 that changed. (Python:
    gguf_exact.hub.pin.pin_recipe)
    """
    from gguf_exact.hub.pin import pin_recipe
    from gguf_exact.hub.recipes import load_recipe

    r = load_recipe(recipe)
    report = pin_recipe(r, None if what == "all" else [what], revision)
    for p in report.parts:
        out.print(
            f"[{p.role}] {p.pin.repo} revision {p.pin.revision} -> commit {p.pin.commit}", markup=False, soft_wrap=True
        )
        for e in p.entries:
            changed = f"  CHANGED, was {e.previous}" if e.previous not in (None, e.sha256) else ""
            out.print(f"  {e.sha256}  {e.path}  ({e.how}){changed}", markup=False, soft_wrap=True)
    out.print(f"wrote {report.checksums}", markup=False, soft_wrap=True)


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
    type=click.Choice(["keep", "q8_0", "f16", "bf16"]),
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
    table = Table(title=f"{donor.name} -> {out_gguf.name}")
    for col in (
        "kind",
        "tensors",
        "donor type",
        "donor bytes",
        "output type",
        "output bytes",
        "donor bit-exact",
        "bit-exact",
        "donor rel. err",
        "rel. err",
    ):
        table.add_column(col, justify="left" if col in ("kind", "donor type", "output type") else "right")
    for k in r["kinds"]:
        err_ = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
        table.add_row(
            k["kind"], str(k["tensors"]), k["donor_types"], f"{k['donor_bytes']:,}", k["output_types"], f"{k['output_bytes']:,}",
            pct(k["donor_exact_fraction"]), pct(k["exact_fraction"]), err_(k["donor_rel_error"]), err_(k["rel_error"]),
        )  # fmt: skip
    out.print(table)
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
    """--temperature --top-k --top-p --min-p --repeat-penalty --seed (llama-cpp-python's sampler)."""
    for opt in reversed(
        [
            click.option("--temperature", default=0.0, show_default=True, help="0 is greedy; above 0 samples."),
            click.option("--top-k", default=40, show_default=True),
            click.option("--top-p", default=0.95, show_default=True),
            click.option("--min-p", default=0.05, show_default=True),
            click.option("--repeat-penalty", default=1.0, show_default=True, help="1.0 is off."),
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
    "--n-max", default=3, show_default=True, help="Most draft tokens per target pass; 0 runs the target alone."
)
@click.option(
    "--n-predict",
    default=128,
    show_default=True,
    help="Most tokens to generate (fewer when an end-of-generation token comes).",
)
@sampling_options
@click.option("--stop", "stops", multiple=True, help="Stop before this text (repeatable).")
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
    default=Path("build/bench"),
    show_default=True,
    help="Where bench.json, bench.md and bench.png go.",
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
    out_dir: Path,
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
        paths = report.write(out_dir)
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
    paths = report.write(out_dir, plot=not no_plot)
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
