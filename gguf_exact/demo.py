"""``make demo``: the main job end to end on tiny models made on the spot.

Writes a tiny gemma4 target and a tiny QAT drafter checkpoint, inspects the
checkpoint, converts it to exact Q4_0 (verified on write), then loads the drafter
beside the target in llama.cpp and generates with and without it
(:mod:`.demo_generate`). Every step is the same function the CLI command of that
name calls. Its rules are drawn in ASCII: one byte per column, so a log or a tool that
counts bytes never cuts one inside a character.
"""

import importlib.util
from pathlib import Path

from rich.console import Console

from gguf_exact.builds.bindings_build import build_command
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.drafter.inspect_qat import inspect_checkpoint
from gguf_exact.errors import BuildError
from gguf_exact.formats.safe_write import output_folder
from gguf_exact.tiny.models import write_tiny_drafter, write_tiny_target

RULE = "-"


def next_steps(out: Path) -> list[str]:
    """What a user runs after the demo, in order: the venv's ``gguf-exact`` on the PATH, the
    llama-server that ``serve`` starts (built once), then ``serve`` on the demo's target, which finds
    the converted drafter beside it. Each fits 80 columns for ``make demo``'s ``build/demo``."""
    return [
        ". .venv/bin/activate     # gguf-exact on the PATH (else: command not found)",
        "make llama-server        # once, cached: 5-9 min on 2 cores, 38 on a fresh Zen 1",
        f"gguf-exact serve --model {out / 'target.gguf'} --profile cpu",  # finds the drafter beside it
    ]


def run_demo(out_dir: str | Path, console: Console | None = None) -> dict:
    """Run the demo in ``out_dir``; returns the figures it printed."""
    console = console or Console(highlight=False)
    out = Path(out_dir)
    output_folder(out)
    target, source, drafter = out / "target.gguf", out / "drafter-hf", out / "drafter-q4_0-exact.gguf"

    console.rule("1. tiny models", characters=RULE)
    write_tiny_target(target, seed=0)
    write_tiny_drafter(source, seed=0, step_kind="fp32")
    console.print(f"target  {target}  (gemma4, 5 layers, width 128, F32)")
    console.print(f"drafter {source}/  (Gemma4AssistantForCausalLM, bf16 on a QAT grid with fp32 steps)")

    console.rule("2. inspect", characters=RULE)
    report = inspect_checkpoint(source)
    console.print(report.verdict)

    console.rule("3. convert (verified on write)", characters=RULE)
    result = convert_drafter(source, drafter, target)
    r = result.report
    console.print(f"{drafter}: {result.size:,} bytes, sha256 {result.sha256}")
    console.print(
        f"bit-exact {r['exact_values']:,} / {r['values']:,} values ({r['exact_fraction']:.4%}), largest error {r['max_ulps']} bf16 ULP"
    )

    if importlib.util.find_spec("llama_cpp") is None:
        raise BuildError(
            f"demo step 4 runs llama.cpp in-process: the Python bindings are not installed; run `make setup` "
            f"(or `{build_command('cpu')} --install`), then the demo again"
        )
    console.rule("4. llama.cpp: the target alone and with the drafter (draft-mtp, in-process)", characters=RULE)
    from gguf_exact.demo_generate import run_generate_step

    generation = run_generate_step(out, target, drafter, console)
    console.rule("next", characters=RULE)
    for line in next_steps(out):
        console.print(line, markup=False, soft_wrap=True)
    return {
        "exact_fraction": r["exact_fraction"],
        "sha256": result.sha256,
        "generation": generation,
    }
