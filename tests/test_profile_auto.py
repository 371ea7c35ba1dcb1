"""`--profile auto` (gguf_exact.engines.shared.gpus, .profile_choice) from recorded nvidia-smi output and
from a fake nvidia-smi on PATH; `serve --dry-run` for a build that is not there yet."""

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from gguf_exact.builds.llama_build import build_key
from gguf_exact.cli import main
from gguf_exact.engines.shared.gpus import Gpu, parse_gpus, query_gpus
from gguf_exact.engines.shared.profile_choice import choose_profile, resolve_profile
from gguf_exact.engines.shared.profiles import available_profiles, load_profile
from gguf_exact.tiny.full_size import write_full_size_drafter, write_full_size_target
from gguf_exact.tiny.models import write_agreeing_pair

# `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`, as the two cards print it
RTX_3050 = "NVIDIA GeForce RTX 3050, 8192\n"
GTX_1650_TI = "NVIDIA GeForce GTX 1650 Ti, 4096\n"
NO_DEVICE = "No devices were found\n"


def profiles():
    return [load_profile(n) for n in ("cpu", "gtx1650ti", "rtx3050")]


def test_parse_recorded_lines():
    assert parse_gpus(RTX_3050) == [Gpu("NVIDIA GeForce RTX 3050", 8192)]
    assert parse_gpus(GTX_1650_TI) == [Gpu("NVIDIA GeForce GTX 1650 Ti", 4096)]
    assert parse_gpus(NO_DEVICE) == [] and parse_gpus("") == []
    assert parse_gpus("NVIDIA A100-SXM4-80GB, 81920\nNVIDIA GeForce RTX 3050, 8192 MiB\n") == [
        Gpu("NVIDIA A100-SXM4-80GB", 81920),
        Gpu("NVIDIA GeForce RTX 3050", 8192),
    ]
    assert parse_gpus("NVIDIA GeForce RTX 3050, [N/A]\n") == []


def test_choose_from_recorded_lines():
    rtx = choose_profile(parse_gpus(RTX_3050), profiles())
    assert (rtx.name, rtx.gpu) == ("rtx3050", Gpu("NVIDIA GeForce RTX 3050", 8192))
    assert "the profile for 'RTX 3050'" in rtx.reason
    assert choose_profile(parse_gpus(GTX_1650_TI), profiles()).name == "gtx1650ti"
    none = choose_profile(parse_gpus(NO_DEVICE), profiles(), "nvidia-smi lists no GPU")
    assert (none.name, none.gpu, none.reason) == ("cpu", None, "nvidia-smi lists no GPU: CPU only")
    # a card no profile names: the largest profile its memory holds
    other = choose_profile([Gpu("NVIDIA GeForce RTX 4060", 8188)], profiles())
    assert other.name == "rtx3050" and "no profile names this card" in other.reason
    # a 4 GB RTX 3050 Laptop GPU: named, but the rtx3050 profile wants 8 GB; the 4 GB profile instead
    assert choose_profile([Gpu("NVIDIA GeForce RTX 3050 Laptop GPU", 4096)], profiles()).name == "gtx1650ti"
    small = choose_profile([Gpu("NVIDIA GeForce GT 1030", 2048)], profiles())
    assert small.name == "cpu" and "smaller than every GPU profile" in small.reason


def fake_smi(folder: Path, output: str, status: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "--query-gpu=name,memory.total" ] && [ "$2" = "--format=csv,noheader,nounits" ] || exit 9\n'
        f"printf '%s' '{output}'\nexit {status}\n"
    )
    script.chmod(0o755)
    return folder


def test_fake_nvidia_smi_on_path(tmp_path, monkeypatch):
    """The real subprocess path: nvidia-smi found on PATH, run with the query, parsed."""
    monkeypatch.setenv("PATH", f"{fake_smi(tmp_path / 'bin', GTX_1650_TI)}{os.pathsep}{os.environ['PATH']}")
    gpus, how = query_gpus()
    assert gpus == [Gpu("NVIDIA GeForce GTX 1650 Ti", 4096)] and how.endswith("nvidia-smi")
    prof, choice = resolve_profile("auto")
    assert prof.name == "gtx1650ti" and prof.build == "cuda75" and choice.gpu == gpus[0]
    monkeypatch.setenv("PATH", f"{fake_smi(tmp_path / 'fails', NO_DEVICE, 6)}{os.pathsep}{os.environ['PATH']}")
    assert query_gpus()[0] == [] and resolve_profile("auto")[0].name == "cpu"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert query_gpus() == ([], "no nvidia-smi on PATH")


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("auto-pair")
    from gguf_exact.drafter.convert import convert_drafter

    target, hf = write_agreeing_pair(root)
    return target, convert_drafter(hf, root / "drafter.gguf", vocab_from=target).path


def test_serve_auto_dry_run_without_the_build(pair, tmp_path, monkeypatch):
    """A fake RTX 3050 picks rtx3050, whose cuda86 build is not in this (empty) cache: the
    dry run still prints the memory plan and the command, and says how to build it; a real
    run stops with one line."""
    target, drafter = pair
    cache = tmp_path / "cache"
    env = {
        "GGUF_EXACT_CACHE": str(cache),
        "GGUF_EXACT_RUN_DIR": str(tmp_path / "run"),
        "PATH": f"{fake_smi(tmp_path / 'bin', RTX_3050)}{os.pathsep}{os.environ['PATH']}",
    }
    r = CliRunner().invoke(main, ["serve", "--model", str(target), "--draft", str(drafter), "--dry-run"], env=env)
    assert r.exit_code == 0, r.output
    assert (
        "profile  rtx3050 (RTX 3050, 8 GB (CUDA sm_86)), build cuda86; --profile auto: NVIDIA GeForce RTX 3050, 8,192 MiB"
        in r.output
    )
    binary = cache / "llama.cpp" / build_key("cuda86") / "bin" / "llama-server"
    assert f"{binary} --model {target.resolve()} --model-draft {drafter.resolve()}" in r.output
    assert "--n-gpu-layers 99" in r.output
    assert "--spec-type draft-mtp --spec-draft-adaptive --spec-draft-adaptive-warmup --spec-draft-shadow --spec-draft-n-max 4" in r.output
    assert "note: llama-server for build 'cuda86'" in r.output and "gguf-exact build-llama --cuda 86" in r.output
    assert "memory plan (GPU" in r.output and "KV cache" in r.output
    real = CliRunner().invoke(main, ["serve", "--model", str(target), "--draft", str(drafter)], env=env)
    assert real.exit_code == 1
    assert real.output.strip().splitlines()[-1].startswith("error: llama-server for build 'cuda86'")


def test_serve_warns_when_the_plan_exceeds_the_card(tmp_path):
    """E4B (real header) at its whole trained context on a GTX 1650 Ti from nvidia-smi: one warning line."""
    t = write_full_size_target(tmp_path / "E4B.gguf", "E4B")
    d = write_full_size_drafter(tmp_path / "E4B-drafter.gguf", "E4B", t)
    env = {
        "GGUF_EXACT_CACHE": str(tmp_path / "cache"),
        "PATH": f"{fake_smi(tmp_path / 'bin', GTX_1650_TI)}{os.pathsep}{os.environ['PATH']}",
    }
    args = ["serve", "--model", str(t), "--draft", str(d), "--dry-run"]
    r = CliRunner().invoke(main, [*args, "--set", "ctx-size=131072"], env=env)
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "the NVIDIA GeForce GTX 1650 Ti (nvidia-smi) has 4,096 MiB" in warnings[0]
    ok = CliRunner().invoke(main, [*args, "--set", "ctx-size=4096"], env=env)
    assert ok.exit_code == 0 and "warning:" not in ok.output, ok.output


def test_auto_is_not_a_profile_file():
    assert "auto" not in available_profiles()
