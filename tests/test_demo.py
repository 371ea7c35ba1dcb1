"""`make demo` end to end: the figures it prints are the real ones."""

import pytest
from rich.console import Console

from gguf_exact.demo import run_demo


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
    assert "QAT 4-bit: all 23 weight matrices are on the Q4_0 grid" in log
