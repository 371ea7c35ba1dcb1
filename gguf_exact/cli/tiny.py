"""Commands that make models on the spot: ``make-tiny``, ``make-pair`` (full size) and ``demo``."""

from __future__ import annotations

import time
from pathlib import Path

import click

from gguf_exact.cli import console
from gguf_exact.cli.app import main
from gguf_exact.cli.console import say


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
    state.
    """
    from gguf_exact.tiny.kit import write_tiny_kit

    kit = write_tiny_kit(out_dir, seed, step_kind, with_pairs)
    say(f"wrote {kit.target}      a tiny gemma4 target")
    say(f"      {kit.drafter_hf}/      its QAT drafter checkpoint: `gguf-exact convert`")
    say(f"      {kit.main_hf}/         a QAT main-model checkpoint")
    say(f"      {kit.donor}   its Google-style Q4_0 GGUF: `gguf-exact repack --donor`")
    for name, (target, drafter) in kit.pairs.items():
        say(f"pair {name:<9} {target}  {drafter}")


@main.command("make-pair")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--shape", required=True, help="e2b or e4b: the real model's structure (tiny: sampled's tiny form).")
@click.option(
    "--kind",
    required=True,
    help="hidden (acceptance 1), mixed (1/2 at n-max 1 and 2), real (as real assistants: "
    "0.85 at the first draft, 0.6-0.65 deeper, unsure where it is wrong; all three deterministic "
    "even at temperature 1) or sampled (a target that samples like a real model and a drafter "
    "that approximates it).",
)
@click.option(
    "--contexts",
    default=200,
    show_default=True,
    type=click.IntRange(min=1),
    help="sampled: tokens the target generates to measure the pair's figures on.",
)
def make_pair(out_dir: Path, shape: str, kind: str, contexts: int) -> None:
    """Write a full-size target + drafter pair: OUT_DIR/target.gguf and OUT_DIR/drafter.gguf.

    Every tensor at the real E2B or E4B shape and type (Q4_0 matrices, Q6_K
    embeddings, 262,144-token vocabulary), almost all weights zero, so llama.cpp
    does all of a real model's work; the target walks a 24-token cycle. For
    benchmarks at the real size without the download.

    The sampled kind then measures, with the two models themselves, what each
    verification rule should accept per draft depth at temperature 1, top-k 64,
    top-p 0.95: greedy agreement (temperature 0), p(top of q) (exact match),
    sum min(p, q) (rejection sampling).
    """
    from gguf_exact.tiny.full_pair import write_pair

    start = time.perf_counter()
    pair = write_pair(out_dir, shape, kind, progress=say)
    for path in (pair.target, pair.drafter):
        say(f"wrote {path}  {path.stat().st_size:,} bytes")
    say(f"cycle: {' '.join(pair.cycle_text)}  ({time.perf_counter() - start:.1f} s)")
    if kind == "sampled":
        from gguf_exact.bench.pair_figures import measure_pair

        start = time.perf_counter()
        figures = measure_pair(pair.target, pair.drafter, contexts=contexts)
        for line in figures.lines():
            say(line)
        say(f"measured in {time.perf_counter() - start:.1f} s")


@main.command()
@click.argument("out_dir", type=click.Path(path_type=Path), default=Path("build/demo"))
def demo(out_dir: Path) -> None:
    """Run the whole job on tiny models made on the spot (what `make demo` runs).

    Makes a tiny target and QAT drafter, inspects and converts the drafter
    (verified), then loads it beside the target in llama.cpp.
    """
    from gguf_exact.demo import run_demo

    run_demo(out_dir, console.out)
