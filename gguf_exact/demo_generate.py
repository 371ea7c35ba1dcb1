"""The demo's generation step: each tiny pair with and without its drafter.

Pairs (:mod:`gguf_exact.tiny.pairs`): the demo's own random target and converted drafter
(acceptance 0), the agreeing pair (acceptance 1), the mixed target beside the
agreeing drafter (acceptance in between) and the hidden-state pair (the drafter
reads only the target's hidden state: acceptance 1 only if it gets the right row).
For each, greedy generation of the shipped ``code`` prompt by the target alone and
with the drafter, in-process (:class:`.Runner` on the engine): acceptance, tokens
per target pass, tokens/s, and whether the two outputs are identical token for token.
"""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from gguf_exact.bench.prompt_set import load_prompts
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.engines.python.runner import Runner
from gguf_exact.tiny.hidden_pair import write_hidden_state_pair
from gguf_exact.tiny.models import write_agreeing_pair
from gguf_exact.tiny.pairs import write_mixed_target

N_PREDICT = 64
N_MAX = 3


def demo_pairs(out: Path, random_target: Path, random_drafter: Path) -> dict[str, tuple[Path, Path]]:
    """The four pairs, the random one being the demo's own converted drafter."""
    a_target, a_hf = write_agreeing_pair(out / "agreeing")
    a_drafter = convert_drafter(a_hf, out / "agreeing" / "drafter-q4_0-exact.gguf", a_target).path
    mixed = write_mixed_target(out / "mixed-target.gguf")
    hidden = write_hidden_state_pair(out / "hidden")
    return {
        "random": (random_target, random_drafter),
        "agreeing": (a_target, a_drafter),
        "mixed": (mixed, a_drafter),
        "hidden": hidden,
    }


def run_generate_step(out: Path, random_target: Path, random_drafter: Path, console: Console) -> dict:
    """Generate with and without each drafter; print a table; return the figures."""
    prompt = load_prompts(["code"])["code"]
    table = Table(
        title=f"greedy generation, {N_PREDICT} tokens, n-max {N_MAX}, prompt gguf_exact/bench/prompts/code.txt",
        box=box.ASCII,  # as the demo's rules: one byte per column
    )
    # headers on two lines: the table fits 80 columns
    for col in ("pair", "alone\ntok/s", "drafted\ntok/s", "accepted", "mean\nlen", "tokens\n/pass", "identical"):
        table.add_column(col, justify="left" if col == "pair" else "right", overflow="fold")  # wrapped, never cut
    figures = {}
    for name, (target, drafter) in demo_pairs(out, random_target, random_drafter).items():
        with Runner(target, drafter, n_ctx=512, n_threads=1) as r:
            alone = r.generate(prompt, N_PREDICT, n_max=0)
            spec = r.generate(prompt, N_PREDICT, n_max=N_MAX)
        same = spec.tokens == alone.tokens
        table.add_row(
            name,
            f"{alone.tokens_per_second:,.0f}",
            f"{spec.tokens_per_second:,.0f}",
            f"{spec.drafts_accepted}/{spec.drafts_generated} ({spec.acceptance_rate:.0%})",
            f"{spec.mean_accepted_length:.2f}",
            f"{spec.tokens_per_target_pass:.2f}",
            "[green]yes[/]" if same else "[red]NO[/]",
        )
        figures[name] = {"identical": same, "target_alone": alone.as_dict(), "with_drafter": spec.as_dict()}
    console.print(table)
    console.print(
        "Identical: the drafted run emits exactly the target's own greedy tokens. tokens/pass is what speculation buys "
        "(each target pass is one llama_decode); on these tiny models a drafter step costs as much as a target step, "
        "so tokens/s only shows the gain with real models."
    )
    return figures


__all__ = ["demo_pairs", "run_generate_step"]
