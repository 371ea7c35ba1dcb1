"""Acceptance per depth against the rule's own chances (gguf_exact/bench/acceptance.py,
scripts/bench_acceptance.py): a trace's result lines read exactly, malformed ones refused with
their file and line, the z-score telling a rule that keeps drafts at their chances from one that
does not, and the script end to end on the tiny sampled pair in both engines."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguf_exact.bench.acceptance import DepthAcceptance, TraceError, Verified, depth_acceptance, read_results

# Lines as llama-server wrote them (E2B `sampled` pair, n-max 3, Gemma's sampler): the policy's own
# lines between, an exact-match result (no chances), and a pass whose three drafts were all kept
TRACE = """settings 3 0.5 1 0.95 0.2 8 64 128 0.02 3 0.25 2 2 32 6 1 1
# decode 4 182630
pass 4 0.18262999999999999 4
result 3 1 0.8450094647705555 0.73381725326180458
steps 3 0.0092440000000000005 3
result 3 3
result 3 3 0.69958509132266045 0.61714967712759972 1
result 3 0 0.25
result 1 1 0.5
"""


def test_a_traces_result_lines_are_read_exactly():
    assert read_results(TRACE, "t") == [
        Verified(3, 1, (0.8450094647705555, 0.73381725326180458)),
        Verified(3, 3, (0.69958509132266045, 0.61714967712759972, 1.0)),
        Verified(3, 0, (0.25,)),
        Verified(1, 1, (0.5,)),
    ]


def test_per_depth_counts_sums_and_variances():
    d1, d2, d3 = depth_acceptance(read_results(TRACE, "t"))
    assert (d1.depth, d1.verified, d1.kept) == (1, 4, 3)  # kept at depth 1 in 3 of the 4 passes
    assert d1.chance_sum == 0.8450094647705555 + 0.69958509132266045 + 0.25 + 0.5
    assert (d2.verified, d2.kept) == (2, 1)  # the first pass's second draft was its first rejected
    assert d2.chance_sum == 0.73381725326180458 + 0.61714967712759972
    assert (d3.verified, d3.kept, d3.chance_sum, d3.chance_variance) == (1, 1, 1.0, 0.0)
    assert d3.z == 0.0  # every chance certain: nothing to deviate
    c = (0.8450094647705555, 0.69958509132266045, 0.25, 0.5)
    assert d1.chance_variance == pytest.approx(sum(x * (1 - x) for x in c), abs=1e-15)
    assert d1.z == pytest.approx((3 - sum(c)) / math.sqrt(sum(x * (1 - x) for x in c)), abs=1e-12)
    assert (d1.share, d2.share) == (0.75, 0.5)
    assert depth_acceptance([]) == ()


@pytest.mark.parametrize(
    "line, says",
    [
        ("result 3 1 0.8", "1 chances for 3 drafted and 1 kept (expected 2"),  # the first rejected's chance missing
        ("result 3 3 0.8 0.7", "2 chances for 3 drafted and 3 kept (expected 3"),
        ("result 2 1 0.8 0.7 0.6", "3 chances for 2 drafted and 1 kept (expected 2"),
        ("result 3 1 0.8 1.5", "each in [0, 1]"),
        ("result 3 1 -0.1 0.5", "each in [0, 1]"),
        ("result 3 4 0.8 0.7 0.6", "4 kept"),  # more kept than drafted
        ("result 3 1 0.8 x", "not a result line"),
        ("result 3 one 0.8", "not a result line"),
    ],
)
def test_a_malformed_result_line_is_refused_with_its_file_and_line(line, says):
    with pytest.raises(TraceError, match=r"^trace\.0:3: ") as err:
        read_results(f"settings 3\npass 4 0.1 4\n{line}\n", "trace.0")
    assert says in str(err.value)


def simulated(chances: np.ndarray, keep: np.ndarray) -> list[Verified]:
    """Passes of 3 drafts: depth j verified while those before were kept, kept where ``keep`` says."""
    out = []
    for row_chances, row_keep in zip(chances, keep):
        kept = int(np.argmin(row_keep)) if not row_keep.all() else 3
        out.append(Verified(3, kept, tuple(float(c) for c in row_chances[: min(kept + 1, 3)])))
    return out


def test_the_z_score_passes_a_rule_keeping_drafts_at_their_chances_and_fails_wrong_ones():
    rng = np.random.default_rng(38)
    chances = rng.beta(4, 1, size=(4000, 3))  # spread like the E2B pair's: mean 0.8
    uniform = rng.random(size=(4000, 3))
    right = depth_acceptance(simulated(chances, uniform < chances))
    assert [d.verified for d in right] == [4000, right[1].verified, right[2].verified]
    assert all(d.verified > 2000 for d in right)
    assert all(abs(d.z) < 4 for d in right), [d.z for d in right]
    # exact match's chance, p(x) of the draft alone, stands in for sum min(p, q) at about 0.6 of it;
    # a rule drawing the residual from p keeps drafts a little more often: both drift far outside
    for wrong in (0.75 * chances, np.minimum(1.0, chances + 0.05)):
        told = depth_acceptance(simulated(chances, uniform < wrong))
        assert all(abs(d.z) > 4 for d in told), [d.z for d in told]


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_acceptance.py"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--out", "{target}"], "error: {target}: the output is the --target {target}, which this command reads"),
        (["--out", "{drafter}"], "error: {drafter}: the output is the --drafter {drafter}, which this command reads"),
        (
            ["--out", "{link}"],
            "error: {link}: the output is the same file as the --target {target}, which this command reads",
        ),
        (["--sum-min", "0.8,x"], "error: --sum-min '0.8,x': not comma-separated numbers"),
        (["--sum-min", "0.8,1.2"], "error: --sum-min '0.8,1.2': each figure is a share in [0, 1]"),
        (["--drafter", "{missing}"], "error: --drafter {missing}: no such file"),
    ],
)
def test_bad_arguments_are_one_line_before_any_server_and_the_pair_is_untouched(tmp_path, args, says):
    target, drafter = tmp_path / "target.gguf", tmp_path / "drafter.gguf"
    target.write_bytes(b"GGUF target bytes")
    drafter.write_bytes(b"GGUF drafter bytes")
    (tmp_path / "link.json").symlink_to(target)  # another name for the target
    names = {"target": target, "drafter": drafter, "missing": tmp_path / "missing.gguf", "link": tmp_path / "link.json"}
    given = ["--target", str(target), "--drafter", str(drafter)] + [a.format(**names) for a in args]
    run = subprocess.run([sys.executable, str(SCRIPT), *given], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].startswith(says.format(**names)), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and run.stdout == ""
    assert (target.read_bytes(), drafter.read_bytes()) == (b"GGUF target bytes", b"GGUF drafter bytes")


@pytest.mark.llama_server
def test_the_script_on_the_tiny_sampled_pair_in_both_engines(tmp_path):
    script = SCRIPT
    out = tmp_path / "acceptance.json"
    args = ["--n-predict", "48", "--ctx", "512", "--sum-min", "0.83,0.79,0.785", "--out", str(out)]
    run = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(out.read_text())
    by_engine = {r["engine"]: r for r in figures["runs"]}
    assert list(by_engine) == ["llama-server", "python"]
    for r in by_engine.values():  # each engine's policy is told every pass, each request's last too
        assert r["traced_kept"] == r["accepted"] > 0, r["engine"]
    for r in figures["runs"]:
        depths = [
            DepthAcceptance(*(d[f] for f in ("depth", "verified", "kept", "chance_sum", "chance_variance")))
            for d in r["depths"]
        ]
        assert [d.depth for d in depths] == [1, 2, 3]
        assert depths[0].verified >= depths[1].verified >= depths[2].verified > 0
        assert all(abs(d.z) < 4 for d in depths), [d.z for d in depths]
    lines = run.stdout.splitlines()
    assert lines[0] == "| engine | depth | verified | kept | kept share | mean chance | z | kept - pair's |"
    assert sum(line.startswith("| both | ") for line in lines) == 3
