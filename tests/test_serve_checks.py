"""`gguf-exact serve` refuses bad input with one clear line, before any server starts.

A fake llama-server (a script that leaves a marker file) shows that nothing was run.
"""

import socket
from pathlib import Path

import pytest
from _llama_server import free_port
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.pair.checks import check_pair, listed_checksums, sha256_file
from gguf_exact.tiny.models import (
    TinyDrafter,
    TinyTarget,
    write_tiny_drafter,
    write_tiny_target,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve-checks")
    target = write_tiny_target(root / "target.gguf", seed=0)
    write_tiny_drafter(root / "drafter-hf", seed=0)
    convert_drafter(root / "drafter-hf", root / "drafter.gguf", vocab_from=target)
    # a drafter whose backbone is 256 wide, for a 256-wide target, beside the 128-wide one
    wide_target = write_tiny_target(root / "target256.gguf", seed=0, spec=TinyTarget(n_embd=256))
    write_tiny_drafter(root / "wide-hf", seed=0, spec=TinyDrafter(backbone_hidden_size=256))
    convert_drafter(root / "wide-hf", root / "drafter-wide.gguf", vocab_from=wide_target)
    # a target with another vocabulary
    write_tiny_target(root / "target-v400.gguf", seed=0, spec=TinyTarget(n_vocab=400))
    (root / "notes.gguf").write_text("not a model\n")
    return {
        "target": target,
        "drafter": root / "drafter.gguf",
        "wide": root / "drafter-wide.gguf",
        "target400": root / "target-v400.gguf",
        "text": root / "notes.gguf",
        "root": root,
    }


@pytest.fixture
def fake_server(tmp_path) -> Path:
    marker = tmp_path / "server-ran"
    script = tmp_path / "llama-server"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    script.chmod(0o755)
    return script


def serve(*args: str, fake: Path | None = None, env: dict | None = None):
    extra = ["--server-bin", str(fake)] if fake else []
    return CliRunner().invoke(main, ["serve", *args, *extra], env=env)


def assert_refused(result, *words: str, fake: Path | None = None, after_plan: bool = False) -> str:
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    if after_plan:  # the checks passed and the plan was printed; the error is the last line
        line = line.splitlines()[-1]
    assert line.startswith("error:") and "\n" not in line, line
    for w in words:
        assert w in line, line
    if fake is not None:
        assert not (fake.parent / "server-ran").exists()
    return line


def test_dry_run_prints_command_and_weight_bytes(models, fake_server):
    r = serve(
        "--model",
        str(models["target"]),
        "--draft",
        str(models["drafter"]),
        "--dry-run",
        "--set",
        "spec-draft-n-max=1",
        fake=fake_server,
    )
    assert r.exit_code == 0, r.output
    assert "gemma4-assistant" in r.output and "bytes of weights" in r.output
    assert "--host 127.0.0.1 --port 8080 --metrics" in r.output
    assert (
        "--spec-type draft-mtp --spec-draft-adaptive --spec-draft-adaptive-warmup --spec-draft-shadow --spec-rejection-sampling --spec-draft-n-max 1"
        in r.output
    )  # adaptive, bounded by 1, costs timed at start-up
    assert not (fake_server.parent / "server-ran").exists()


def test_gemma4_file_as_drafter(models, fake_server):
    r = serve("--model", str(models["target"]), "--draft", str(models["target"]), fake=fake_server)
    assert_refused(r, "drafter", "'gemma4'", "expected 'gemma4-assistant'", fake=fake_server)


def test_drafter_as_target(models, fake_server):
    r = serve("--model", str(models["drafter"]), fake=fake_server)
    assert_refused(r, "target", "pass it as --draft", fake=fake_server)


def test_backbone_width_differs(models, fake_server):
    r = serve("--model", str(models["target"]), "--draft", str(models["wide"]), fake=fake_server)
    assert_refused(r, "embedding_length_out is 256", "embedding_length is 128", fake=fake_server)


def test_vocabulary_differs(models, fake_server):
    r = serve("--model", str(models["target400"]), "--draft", str(models["drafter"]), fake=fake_server)
    assert_refused(r, "vocabulary differs", "--vocab-from", fake=fake_server)


def test_not_gguf(models, fake_server):
    r = serve("--model", str(models["text"]), fake=fake_server)
    assert_refused(r, "not a GGUF file", fake=fake_server)


def test_sha256_mismatch_for_listed_file(models):
    listed = {models["drafter"].name: "0" * 64}
    with pytest.raises(Exception, match=r"sha256 [0-9a-f]{64} differs from 0{64} listed in checksums/"):
        check_pair(models["target"], models["drafter"], listed)
    ok = check_pair(models["target"], models["drafter"], {models["drafter"].name: sha256_file(models["drafter"])})
    assert ok.drafter.sha256 == sha256_file(models["drafter"]) and ok.target.sha256 is None


def test_sha256_mismatch_in_checksums_dir(models, fake_server, tmp_path, monkeypatch):
    # the lookup reads every *.sha256 in checksums/ (sha256sum format)
    sums = tmp_path / "checksums"
    sums.mkdir()
    (sums / "models.sha256").write_text(f"{'1' * 64}  {models['drafter'].name}\n")
    assert listed_checksums(sums) == {models["drafter"].name: "1" * 64}
    monkeypatch.setattr("gguf_exact.pair.checks.CHECKSUM_DIR", sums)
    r = serve("--model", str(models["target"]), "--draft", str(models["drafter"]), fake=fake_server)
    assert_refused(r, "sha256", "listed in checksums/", "download it again", fake=fake_server)


def test_no_mmap_refused(models, fake_server):
    r = serve("--model", str(models["target"]), "--dry-run", "--", "--no-mmap", fake=fake_server)
    assert_refused(r, "per_layer_token_embd", fake=fake_server)
    r = serve("--model", str(models["target"]), "--dry-run", "--set", "load-mode=none", fake=fake_server)
    assert_refused(r, "mmap off", fake=fake_server)


def test_busy_port(models, fake_server, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = serve(
            "--model",
            str(models["target"]),
            "--draft",
            str(models["drafter"]),
            "--port",
            str(port),
            fake=fake_server,
            env={"GGUF_EXACT_RUN_DIR": str(tmp_path / "run")},
        )
    assert_refused(r, f"port {port} on 127.0.0.1 is in use", "--port", fake=fake_server)


def test_missing_server_binary(models, tmp_path):
    r = serve(
        "--model",
        str(models["target"]),
        "--draft",
        str(models["drafter"]),
        env={"GGUF_EXACT_CACHE": str(tmp_path / "empty-cache"), "GGUF_EXACT_LLAMA_SERVER": ""},
    )
    assert_refused(r, "llama-server for build 'cpu'", "gguf-exact build-llama")
    r = serve(
        "--model",
        str(models["target"]),
        "--profile",
        "rtx3050",
        env={"GGUF_EXACT_CACHE": str(tmp_path / "empty-cache")},
    )
    assert_refused(r, "build-llama --cuda 86")
    r = serve("--model", str(models["target"]), "--server-bin", str(tmp_path / "nowhere" / "llama-server"))
    assert_refused(r, "no such executable")


def test_server_that_dies_while_starting(models, fake_server, tmp_path):
    r = serve(
        "--model",
        str(models["target"]),
        "--port",
        str(free_port()),
        "--detach",
        fake=fake_server,
        env={"GGUF_EXACT_RUN_DIR": str(tmp_path / "run")},
    )
    line = assert_refused(r, "llama-server exited with code 1 while starting", after_plan=True)
    assert "log:" in line


def test_published_drafter_name_with_other_bytes(models, fake_server, tmp_path):
    # checksums/e2b-assistant.sha256 lists the published exact E2B drafter by name
    fake = tmp_path / "gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf"
    fake.write_bytes(models["drafter"].read_bytes())
    assert fake.name in listed_checksums()
    r = serve("--model", str(models["target"]), "--draft", str(fake), fake=fake_server)
    assert_refused(
        r, "060f5a0158f8120d25137866b90e04e21cd0d2d23de1db7a9cc3b7f00e60bd11", "not the published one", fake=fake_server
    )


def test_profile_not_found_names_tune_folder_and_nearest(models, fake_server, tmp_path):
    mine = tmp_path / "my-profiles"
    mine.mkdir()
    (mine / "cpu-tuned.toml").write_text((Path(__file__).parents[1] / "serve" / "cpu.toml").read_text())
    env = {"GGUF_EXACT_PROFILES": str(mine), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    r = serve("--model", str(models["target"]), "--profile", "rtx3005", fake=fake_server, env=env)
    line = assert_refused(r, fake=fake_server)
    shipped = Path(__file__).parents[1] / "serve"
    assert line == (
        "error: profile 'rtx3005' not found (did you mean rtx3050?); "
        f"profiles in {mine} (where tune writes): cpu-tuned; "
        f"in {shipped} (shipped): cpu, gtx1650ti, gtx1650ti-vulkan, rtx3050; or pass a .toml file"
    )
    # without $GGUF_EXACT_PROFILES tune writes to the user profile folder, listed even when empty
    r = serve(
        "--model",
        str(models["target"]),
        "--profile",
        "zzz",
        fake=fake_server,
        env={"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "GGUF_EXACT_PROFILES": ""},
    )
    line = assert_refused(r, fake=fake_server)
    assert line.startswith(
        f"error: profile 'zzz' not found; profiles in {tmp_path / 'xdg' / 'gguf-exact' / 'profiles'} (where tune writes): none yet; "
    )
    assert "did you mean" not in line
