"""`inspect` on main models and MoE banks (drafters: see test_cli.py), read in row chunks."""

import json

import numpy as np
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.drafter.inspect_qat import inspect_checkpoint
from gguf_exact.tiny.main_model import TINY, TINY_MOE, model_tensors, write_main_checkpoint


def by_name(report):
    return {t.name: t for t in report.tensors}


def test_main_model_roles_and_verdict(tmp_path):
    src = write_main_checkpoint(tmp_path / "e2b-like", TINY, seed=3, step_kind="bf16")
    report = inspect_checkpoint(src)
    t = by_name(report)
    assert report.is_qat, report.verdict
    per_layer = t["model.language_model.embed_tokens_per_layer.weight"]
    assert per_layer.planned == "Q4_0" and per_layer.exact_fraction == 1.0  # bf16 steps: all exact
    assert per_layer.blocks == 320 * 8 * 32 // 32
    assert t["model.language_model.norm.weight"].planned == "F32"
    assert t["model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight"].planned == "dropped"
    qat = [m for m in model_tensors(TINY) if m.what == "matrix"]
    assert {m.hf_name for m in qat} == {n for n, s in t.items() if s.planned == "Q4_0"}
    assert f"all {len(qat)} weight matrices are on the Q4_0 grid; 100.0000%" in report.verdict


def test_moe_expert_banks_are_planned_row_by_row(tmp_path):
    src = write_main_checkpoint(tmp_path / "moe", TINY_MOE, seed=4)
    report = inspect_checkpoint(src)
    banks = [s for s in report.tensors if len(s.shape) == 3]
    assert banks and report.is_qat
    for bank in banks:
        assert bank.blocks == int(np.prod(bank.shape)) // 32 and bank.planned == "Q4_0"
        assert sum(bank.level_histogram) == bank.blocks * 32
        assert 0.995 <= bank.exact_fraction < 1.0  # fp32 steps


def test_unknown_architecture_looks_at_every_matrix(tmp_path):
    src = write_main_checkpoint(tmp_path / "other", TINY_MOE, seed=5)
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["SomethingElseForCausalLM"]
    (src / "config.json").write_text(json.dumps(cfg))
    result = CliRunner().invoke(main, ["inspect", str(src), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    vision = next(t for t in report["tensors"] if "vision_tower" in t["name"])
    assert vision["planned"] == "off grid" and vision["on_grid_fraction"] == 0.0
    # without the main-model table, the 4 routers (left in full precision) count too
    off = sorted(t["name"] for t in report["tensors"] if t["planned"] == "off grid")
    assert len(off) == 5 and sum("router" in n for n in off) == 4
    assert report["is_qat"] is False and report["verdict"].startswith("not QAT 4-bit: 5 of ")
