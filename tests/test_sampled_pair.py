"""``make-pair --kind sampled`` (gguf_exact.tiny.sampled_pair) in its tiny form: the figures it prints,
measured from the two models' own logits (gguf_exact.bench.pair_figures), are within the bands the
pair was designed for: a target that samples like a real model and a drafter that approximates it,
as real assistants do (greedy agreement about 0.85 at the first draft, about 0.6 deeper)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.tiny.sampled_pair import FIRST_WRONG, N_AXES, drafter_levels, levels

pytestmark = [pytest.mark.bindings]

ROW = re.compile(r"^\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", re.M)
SPREAD = re.compile(r"top token's probability ([\d.]+) / ([\d.]+) / ([\d.]+) .* tokens above 1%: (\d+) / (\d+) / (\d+)")


def test_levels_have_one_top_and_the_drafter_differs_where_designed():
    target, drafter = levels(), drafter_levels()
    top = target.argmax(axis=1)
    assert list(top) == [(k + 1) % N_AXES for k in range(N_AXES)]
    assert all(np.sort(row)[-2] < 7 for row in target)  # no tie at the top: greedy is well defined
    swapped = [k for k in range(N_AXES) if drafter[k].argmax() != top[k]]
    assert swapped == list(FIRST_WRONG) == [4, 10, 16, 22]


def test_tiny_sampled_pair_prints_figures_in_band(tmp_path):
    r = CliRunner().invoke(main, ["make-pair", str(tmp_path / "p"), "--shape", "tiny", "--kind", "sampled"])
    assert r.exit_code == 0, r.output
    print(r.output)
    rows = {int(m[0]): [float(x) for x in m[1:]] for m in ROW.findall(r.output)}
    assert sorted(rows) == [1, 2, 3]
    for depth, (agree, p_top, tv, summin) in rows.items():
        assert abs(tv + summin - 1.0) <= 0.002  # p and q are distributions
        assert p_top + 0.15 < summin  # rejection sampling keeps what exact match throws away
        if depth == 1:
            assert 0.78 <= agree <= 0.92 and 0.75 <= summin <= 0.9
        else:
            assert 0.5 <= agree <= 0.72 and 0.68 <= summin <= 0.85
            assert agree < rows[1][0] - 0.1 and summin < rows[1][3]  # deeper drafts are worse
    (lo, _, hi, fewest, _, most) = (float(x) for x in SPREAD.search(r.output).groups())
    assert lo <= 0.3 and hi >= 0.9 and fewest <= 2 and most >= 10


def test_make_pair_tiny_is_sampled_only(tmp_path):
    r = CliRunner().invoke(main, ["make-pair", str(tmp_path / "p"), "--shape", "tiny", "--kind", "real"])
    assert (r.exit_code, r.output) == (1, "error: --kind real: the tiny shape is made for the sampled kind only\n")
    assert not (tmp_path / "p").exists()
