"""`make demo` end to end: the figures it prints are the real ones."""

import pytest
from rich.console import Console

from gguf_exact.demo import next_steps, run_demo


@pytest.mark.bindings
def test_demo_runs_the_whole_job(tmp_path):
    console = Console(file=(tmp_path / "demo.log").open("w"), width=160)
    figures = run_demo(tmp_path / "demo", console)
    assert 0.995 <= figures["exact_fraction"] < 1.0  # fp32 training steps: not every value fits fp16
    assert (tmp_path / "demo" / "drafter-q4_0-exact.gguf").stat().st_size > 0
    gen = figures["generation"]
    assert set(gen) == {"random", "agreeing", "mixed", "hidden"}
    assert all(g["identical"] for g in gen.values())
    agreeing = gen["agreeing"]["with_drafter"]
    assert agreeing["drafts_accepted"] == agreeing["drafts_generated"] > 0
    assert gen["random"]["with_drafter"]["drafts_accepted"] == 0
    hidden = gen["hidden"]["with_drafter"]
    assert hidden["drafts_accepted"] == hidden["drafts_generated"] > 0
    log = (tmp_path / "demo.log").read_text()
    assert log.rstrip("\n").splitlines()[-3:] == next_steps(tmp_path / "demo")
    assert "QAT 4-bit: all 23 weight matrices are on the Q4_0 grid" in log


def test_demo_ends_with_the_next_commands_the_readme_names(tmp_path):
    """After `make demo`: activate the venv (else `gguf-exact: command not found`), build
    llama-server (which `serve` needs), then serve; README's set-up says the same."""
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    steps = next_steps(Path("build/demo"))
    assert [s.split("  ")[0].strip() for s in steps[:2]] == [". .venv/bin/activate", "make llama-server"]
    assert steps[2] == "gguf-exact serve --model build/demo/target.gguf --profile cpu"
    assert max(map(len, steps)) <= 80
    assert "The demo ends with the next three commands: `. .venv/bin/activate`" in readme
    assert (
        "`make llama-server` (`serve` runs it; 5-9 min on 2 cores, 38 on a fresh Zen 1), `gguf-exact serve ...`"
        in readme
    )
