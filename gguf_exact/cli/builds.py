"""Build commands: ``build-llama`` (llama-server and tools), ``build-bindings`` (llama-cpp-python),
``build-kernels`` (the packer's kernels ahead of time), ``doctor``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from gguf_exact.cli import console
from gguf_exact.cli.app import main
from gguf_exact.cli.console import note


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
@click.option(
    "--reprobe",
    is_flag=True,
    help="Build nothing: run the installed build's probe again, on its device, and record it in its build-info.json.",
)
def build_llama(cuda: str | None, vulkan: bool, sdist: Path | None, force: bool, reprobe: bool) -> None:
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
    glslc (scripts/install-vulkan-deps.sh installs Debian's; headers older than the
    backend needs are replaced by Debian 13's, pinned in checksums/vulkan-headers.sha256).
    A GPU build's probe runs on its device (a CPU-type Vulkan device such as lavapipe made
    visible); --reprobe runs it again on an installed build. `gguf-exact doctor` shows what
    each build used.
    """
    from gguf_exact.builds.llama_build import backend_name, build_llama_cpp, reprobe_build, sigterm_as_interrupt

    if reprobe:
        backend = backend_name(cuda, vulkan)
        say_reprobe(f"llama.cpp {backend}", reprobe_build(backend))
        return
    with sigterm_as_interrupt():
        build = build_llama_cpp(cuda, sdist, force=force, log=note, vulkan=vulkan)
    click.echo(build.bin_dir)


def say_reprobe(what: str, result) -> None:
    """A probe run again: where it ran, or one error line."""
    from gguf_exact.doctor import describe_probe

    if not result.ok:
        from gguf_exact.errors import BuildError

        raise BuildError(f"{what}: {describe_probe(result.record())} ({result.tail})")
    click.echo(describe_probe(result.record()))


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
@click.option(
    "--reprobe",
    is_flag=True,
    help="Build nothing: run the cached wheel's probe again, on its device, and record it in its build-info.json.",
)
def build_bindings(
    cuda: str | None, vulkan: bool, sdist: Path | None, force: bool, install: bool, reprobe: bool
) -> None:
    """Build the llama-cpp-python bindings (the Python engine's llama.cpp) as a wheel.

    Built from the same pinned sdist, backend and CPU features as `gguf-exact
    build-llama`, so the in-process engine (generate, chat, serve --engine python)
    runs on the card a GPU profile names, and never traps on a CPU with AMX. A probe
    runs a batched Q4_0 product through the wheel before it is kept in
    ~/.cache/gguf-exact/wheels/<commit>-<backend>-<CPU features>/; a second call
    returns at once. Prints the wheel's path; --install also installs it here,
    replacing any other llama-cpp-python (such as pip's own native build). A GPU wheel's
    probe runs on its device (lavapipe made visible); --reprobe runs it again.
    """
    from gguf_exact.builds.bindings_build import build_bindings as build
    from gguf_exact.builds.bindings_build import install_bindings, reprobe_bindings
    from gguf_exact.builds.llama_build import backend_name, sigterm_as_interrupt

    if reprobe:
        backend = backend_name(cuda, vulkan)
        say_reprobe(f"llama-cpp-python bindings {backend}", reprobe_bindings(backend))
        return

    with sigterm_as_interrupt():
        wheel = build(cuda, vulkan, sdist, force=force, log=note)
        if install:
            install_bindings(wheel, note)
    click.echo(wheel.wheel)


@main.command("build-kernels")
@click.option("--force", is_flag=True, help="Rebuild even if this machine's build is cached.")
def build_kernels(force: bool) -> None:
    """Compile the packer's kernels ahead of time, so convert and verify start without numba.

    The same source numba compiles at run time (gguf_exact/core: the exact packer's
    per-block kernel and the vocabulary walk), compiled once by numba.pycc for this CPU's
    features, probed against numba's JIT (same bytes and counters, or nothing is
    installed), into ~/.cache/gguf-exact/kernels/<key>/ (key: kernel source, numba,
    Python, numpy, CPU features). convert, verify, repack and inspect then load it
    instead of numba, about half a second sooner each here; without it, or when it is stale, they use
    numba's JIT as before. `make setup` runs this; a second call returns at once. Prints
    the folder. GGUF_EXACT_KERNELS=jit passes over it; `gguf-exact doctor` says which is used.
    """
    from gguf_exact.builds.aot_kernels_build import build_kernels as build

    click.echo(build(force, log=note))


@main.command()
@click.option(
    "--rpc",
    metavar="HOST:PORT[,HOST:PORT...]",
    help="Also ask these RPC workers (`gguf-exact rpc-server`) what they hold; workers running here are always asked.",
)
def doctor(rpc: str | None) -> None:
    """Report what this machine has for serving: CPU features, bindings, llama-server, CUDA, GPUs, RPC workers."""
    from gguf_exact.doctor import diagnose

    for f in diagnose((rpc,) if rpc else ()):
        # wrapped to the terminal, continued under the value's column
        first, *rest = console.fit(f"{'ok' if f.ok else '--'}  {f.name:<22} {f.value}", console.out.width, " " * 27)
        mark = "[green]ok[/]" if f.ok else "[yellow]--[/]"
        console.out.print(mark + escape(first[2:]), soft_wrap=True)
        for line in rest:
            console.say(line)
