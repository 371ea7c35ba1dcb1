"""`gguf-exact tune` (gguf_exact.bench.tune): n-max measured on real llama-servers, the best
written to a user copy of the profile under a name of its own (cpu-tuned), which
`--profile cpu-tuned` then reads; the shipped `cpu` stays as it is."""

import hashlib
import json
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from _llama_server import server_binary
from click.testing import CliRunner

from gguf_exact.bench.tune import TUNED_MARK, kept_line, set_n_max, write_tuned_profile
from gguf_exact.bench.tune_pick import Setting, pick_adaptive, pick_setting
from gguf_exact.cli import main
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.engines.shared.profiles import PROFILE_DIR, load_profile
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.models import write_agreeing_pair

PROFILE = """# a profile
description = "test"

[server]
ctx-size = 512  # small

[draft]
spec-type = "draft-mtp"
spec-draft-n-max = 2          # as on the RTX 3050
n-gpu-layers-draft = "all"
"""


def test_set_n_max_keeps_everything_else():
    out = set_n_max(PROFILE, 3, "measured")
    assert out == PROFILE.replace(
        "spec-draft-n-max = 2          # as on the RTX 3050", "spec-draft-n-max = 3  # measured"
    )
    no_key = PROFILE.replace("spec-draft-n-max = 2          # as on the RTX 3050\n", "")
    assert set_n_max(no_key, 1).splitlines()[6:8] == ["[draft]", "spec-draft-n-max = 1"]
    no_table = PROFILE[: PROFILE.index("[draft]")]
    assert set_n_max(no_table, 4).endswith("\n[draft]\nspec-draft-n-max = 4\n")
    pinned = set_n_max(out, False, "fixed", "spec-draft-adaptive")
    assert (
        "spec-draft-adaptive = false  # fixed" in pinned.splitlines() and "spec-draft-n-max = 3  # measured" in pinned
    )
    # a key of the same name in another table is not touched
    other = '[server]\nspec-draft-n-max = 9\n\n[draft]\nspec-type = "draft-mtp"\n'
    assert (
        set_n_max(other, 1)
        == '[server]\nspec-draft-n-max = 9\n\n[draft]\nspec-draft-n-max = 1\nspec-type = "draft-mtp"\n'
    )


def test_never_writes_the_project_profiles(tmp_path):
    with pytest.raises(GgufExactError, match="never the project's serve/"):
        write_tuned_profile(load_profile("cpu"), None, "x", PROFILE_DIR)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    target, hf = write_agreeing_pair(root)
    return target, convert_drafter(hf, root / "drafter.gguf", vocab_from=target).path


@pytest.mark.llama_server
def test_tune_searches_fixed_and_adaptive_settings_and_serve_uses_the_kept_one(pair, tmp_path, monkeypatch):
    server_binary()
    target, drafter = pair
    user = tmp_path / "profiles"
    run = tmp_path / "run"
    env = {"GGUF_EXACT_PROFILES": str(user), "GGUF_EXACT_RUN_DIR": str(run)}
    shipped = hashlib.sha256((PROFILE_DIR / "cpu.toml").read_bytes()).hexdigest()
    out = tmp_path / "tune"
    args = ["tune", "--model", str(target), "--draft", str(drafter), "--profile", "cpu", "--prompts", "code"]
    args += ["--n-predict", "16", "--set", "ctx-size=512", "--set", "threads=2", "--out", str(out)]
    # the tiny pair's requests take milliseconds, their ratios spread far beyond what tune ranks
    # with (test_tune_refuses_noise): this test is of what tune writes
    args += ["--max-spread", "1000000"]
    temp_roots = set(Path(tempfile.gettempdir()).glob("gguf-exact-tune-*"))
    r = CliRunner().invoke(main, [*args, "--bounds", "4", "--p-min", "0,0.9"], env=env)
    assert r.exit_code == 0, r.output
    report = json.loads((out / "bench.json").read_text())
    arms = {s["label"]: s for s in report["summary"]}
    adaptive = ["adaptive n_max=4 p_min=0", "adaptive n_max=4 p_min=0.9"]
    assert list(arms) == ["target", "n_max=1", "n_max=2", "n_max=3", "n_max=4", *adaptive]
    assert report["meta"]["settings"][adaptive[1]] == [
        "spec-draft-adaptive=true", "spec-draft-n-max=4", "spec-draft-p-min=0.9",
    ]  # fmt: skip
    # one fresh server per visit, forward then backward: 2 visits x 2 passes (bench's A B B A) per arm
    assert {s["runs"] for s in arms.values()} == {4}
    drafting = [s for s in report["summary"] if s["n_max"]]
    assert all(s["same_as_target"] for s in drafting)  # lossless, whatever length the policy chose
    assert all(arms[f"n_max={n}"]["acceptance_rate"] == 1.0 for n in (1, 2, 3, 4))
    # what tune kept, recomputed from its report: the best fixed length within the noise, the
    # adaptive default unless another setting beats it, adaptive unless fixed is faster beyond the noise
    rows = [SimpleNamespace(**s) for s in report["summary"]]
    runs = [SimpleNamespace(**x) for x in report["runs"]]
    pick = pick_setting(rows, runs)
    default = Setting(4, True, 0.0)
    settings = {s.label: s for s in (Setting(4, True, 0.0), Setting(4, True, 0.9))}
    chosen = pick_adaptive(rows, runs, settings, default, Setting(pick.n_max))
    assert pick.fastest_n_max == max(drafting[:4], key=lambda s: s["tokens_per_second_median"])["n_max"]
    flat = " ".join(r.output.split())  # the lines are wrapped to the console's width
    assert f"best fixed length: n-max {pick.n_max} at {pick.tokens_per_second:.1f} tokens/s (median run)" in flat
    assert (
        f"adaptive default (adaptive, n-max bound 4, p-min 0): {chosen.default_tokens_per_second:.1f} tokens/s, "
        f"{chosen.default_vs_fixed:.2f}x the best fixed length" in flat
    )
    assert f"spread: +-{pick.spread:.1%} (half the range of the tokens/s ratios" in flat
    assert all(" ".join(line.split()) in flat for line in pick.notes + chosen.notes)
    # fourteen servers started and stopped, and no run folder left: not in the user's run root, not in /tmp
    assert not run.exists() or list(run.iterdir()) == []
    assert set(Path(tempfile.gettempdir()).glob("gguf-exact-tune-*")) == temp_roots
    written = user / "cpu-tuned.toml"
    kept = chosen.kept
    assert f"wrote {written}: {kept_line(kept)}; serve with `--profile cpu-tuned`" in flat
    assert sorted(p.name for p in user.iterdir()) == ["cpu-tuned.toml"]  # never cpu.toml: no shadowing
    tuned = load_profile(written)
    assert tuned.name == "cpu-tuned" and tuned.draft_table["spec-draft-n-max"] == kept.n_max
    assert tuned.draft_table["spec-draft-adaptive"] is kept.adaptive
    assert tuned.draft_table.get("spec-draft-p-min", 0.0) == kept.p_min
    text = written.read_text()
    assert text.startswith(f"{TUNED_MARK} on ") and "--profile cpu --n-max 1,2,3,4 --bounds 4 --p-min 0,0.9" in text
    assert hashlib.sha256((PROFILE_DIR / "cpu.toml").read_bytes()).hexdigest() == shipped
    monkeypatch.setenv("GGUF_EXACT_PROFILES", str(user))
    assert load_profile("cpu").path == PROFILE_DIR / "cpu.toml"  # --profile cpu (and auto on a CPU) unchanged
    assert load_profile("cpu-tuned").path == written
    dry = CliRunner().invoke(
        main, ["serve", "--model", str(target), "--draft", str(drafter), "--profile", "cpu-tuned", "--dry-run"], env=env
    )
    assert dry.exit_code == 0, dry.output
    assert f"--spec-draft-n-max {kept.n_max}" in dry.output and f"from {written}" in dry.output
    # the whole flag: --spec-draft-adaptive-warmup is on the line whether adaptive was kept or not
    assert bool(re.search(r"--spec-draft-adaptive(\s|$)", dry.output)) is kept.adaptive
    # tuning again measures without writing (--no-write); --as names the copy, and naming a shipped
    # profile says what it does; --bounds '' measures fixed lengths only
    again = CliRunner().invoke(main, [*args, "--n-max", "1,2", "--bounds", "", "--no-write"], env=env)
    assert again.exit_code == 0 and "wrote " + str(written) not in again.output
    assert "adaptive default" not in again.output
    named = CliRunner().invoke(main, [*args, "--n-max", "1", "--bounds", "", "--as", "cpu"], env=env)
    assert named.exit_code == 0, named.output
    assert (
        f"wrote {user / 'cpu.toml'}: spec-draft-n-max = 1, spec-draft-adaptive = false; serve with `--profile cpu`"
        in " ".join(named.output.split())
    )
    assert "note: it replaces the cpu profile shipped with gguf-exact for every later serve" in named.output
    assert load_profile("cpu").path == user / "cpu.toml"
    bad = CliRunner().invoke(main, [*args, "--as", "../cpu"], env=env)
    assert bad.exit_code == 1 and bad.stderr.startswith("error: --as '../cpu': a profile name is letters")
    bad = CliRunner().invoke(main, [*args, "--p-min", "0,2"], env=env)
    assert bad.exit_code == 1 and bad.stderr.endswith("\nerror: --p-min 0,2: give p-min values from 0 to 1\n")


@pytest.mark.llama_server
def test_tune_refuses_noise_and_writes_no_profile(pair, tmp_path):
    """On the tiny pair a request takes milliseconds: the same request's tokens/s ratio between
    two arms spread +-37% to +-15,018% (issue 41: `520.20x the best fixed length`, a profile
    written). Over --max-spread, tune prints the table, writes its report, no profile, and
    says so in one line."""
    server_binary()
    target, drafter = pair
    user, out = tmp_path / "profiles", tmp_path / "tune"
    env = {"GGUF_EXACT_PROFILES": str(user), "GGUF_EXACT_RUN_DIR": str(tmp_path / "run")}
    args = ["tune", "--model", target, "--draft", drafter, "--profile", "cpu", "--prompts", "code,prose"]
    args += ["--n-max", "1", "--bounds", "", "--n-predict", "16", "--set", "ctx-size=512", "--out", out]
    args += ["--max-spread", "0.01"]  # the tiny pair's spread varies, +-37% to +-15,018% measured: over 1% always
    r = CliRunner().invoke(main, [str(a) for a in args], env=env)
    assert r.exit_code == 1, r.output
    report = json.loads((out / "bench.json").read_text())
    rows = [SimpleNamespace(**s) for s in report["summary"]]
    spread = pick_setting(rows, [SimpleNamespace(**x) for x in report["runs"]]).spread
    assert spread > 0.01
    assert r.stderr.strip().splitlines()[1:] == [  # after the profile line
        "error: the measurements are too noisy to rank the settings: the same request's tokens/s ratio between two "
        f"arms spread +-{spread:.0%}, over the +-1% tune trusts (--max-spread), so no profile was written; run tune "
        "again on an idle machine, with more --rounds and --n-predict"
    ]
    assert "| n_max=1 |" in r.stdout and "best fixed length" not in r.stdout and "x the best" not in r.stdout
    assert not user.exists()
