"""Steps of seconds to minutes name themselves on a terminal (issue 41): `serve --detach`
while llama-server loads and while the probe request runs, `tune` per arm and round. Off a
terminal (as here) the spinner draws nothing: the labels are checked by standing in for
:func:`gguf_exact.cli.console.status`, the servers by fakes; no timing is asserted."""

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from gguf_exact.cli import console, main
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.tiny.models import write_tiny_drafter, write_tiny_target


@pytest.fixture
def steps(monkeypatch) -> list[str]:
    """The labels the CLI's spinners are opened with or renamed to, in order."""
    seen: list[str] = []

    @contextlib.contextmanager
    def recording_status(label: str):
        seen.append(label)
        yield seen.append

    monkeypatch.setattr(console, "status", recording_status)
    return seen


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    target = write_tiny_target(tmp_path / "target.gguf", seed=0)
    write_tiny_drafter(tmp_path / "drafter-hf", seed=0)
    return target, convert_drafter(tmp_path / "drafter-hf", tmp_path / "drafter.gguf", vocab_from=target).path


@pytest.fixture
def fake_start(monkeypatch, tmp_path):
    """llama-server started and probed without running: a process that is already there."""
    from gguf_exact.engines import launch
    from gguf_exact.engines.shared import status

    process = SimpleNamespace(pid=4242)
    monkeypatch.setattr(launch, "start_server", lambda launch, detach, timeout: (process, 1.5))
    monkeypatch.setattr(status, "server_status", lambda *a, **k: SimpleNamespace(speculation=None))
    monkeypatch.setattr(launch, "serve_foreground", lambda launch, proc: 0)
    monkeypatch.setenv("GGUF_EXACT_RUN_DIR", str(tmp_path / "run"))
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\nexit 1\n")
    script.chmod(0o755)
    return script


def serve(pair, server_bin, *more):
    target, drafter = pair
    args = ["serve", "--model", target, "--draft", drafter, "--profile", "cpu", "--port", "47391"]
    return CliRunner().invoke(main, [str(a) for a in [*args, "--server-bin", server_bin, *more]])


def test_serve_detached_names_the_load_and_the_probe(pair, fake_start, steps):
    r = serve(pair, fake_start, "--detach")
    assert r.exit_code == 0, r.output
    assert steps == [
        "starting llama-server",
        "llama-server: loading target.gguf, waiting for /health (up to 600 s)",
        "llama-server: probe request, is draft-mtp drafting?",
    ]
    assert "llama-server ready at http://127.0.0.1:47391 in 1.5 s (pid 4242)" in r.stdout


def test_serve_in_the_foreground_leaves_the_terminal_to_the_server_log(pair, fake_start, steps):
    r = serve(pair, fake_start, "--no-probe")
    assert r.exit_code == 0, r.output
    assert steps == []  # llama-server's own log lines share the terminal: no spinner over them


def test_serve_off_a_terminal_prints_no_step(pair, fake_start):
    r = serve(pair, fake_start, "--detach")
    assert r.exit_code == 0, r.output
    assert "loading" not in r.output and "probe request" not in r.output


class MeasuredEnough(Exception):
    pass


def test_tune_names_the_round_the_visit_and_the_arm(monkeypatch, tmp_path):
    from gguf_exact.bench import tune
    from gguf_exact.engines import launch
    from gguf_exact.engines.shared import status
    from gguf_exact.engines.shared.profiles import load_profile

    visits = []

    def bench_servers(arms, prompts, n_predict, rounds):
        visits.append(arms[0].label)
        if len(visits) == 2:
            raise MeasuredEnough
        return SimpleNamespace(runs=[])

    monkeypatch.setattr(launch, "plan_launch", lambda settings: SimpleNamespace(url="http://x", port=settings.port))
    monkeypatch.setattr(launch, "start_server", lambda *a, **k: None)
    monkeypatch.setattr(status, "stop_server", lambda *a, **k: None)
    monkeypatch.setattr(tune, "bench_servers", bench_servers)
    profile = load_profile(Path(__file__).parents[1] / "serve" / "cpu.toml")
    request = tune.TuneRequest(tmp_path / "t.gguf", tmp_path / "d.gguf", profile, "cpu", n_values=(1, 2), bounds=())
    seen: list[str] = []
    with pytest.raises(MeasuredEnough):
        tune.tune_n_max(request, {"code": "def f():", "chat": "Hello"}, step=seen.append)
    assert seen == [
        "round 1/1, visit 1 of 6: target, starting llama-server",
        "round 1/1, visit 1 of 6: target, measuring 2 prompts of 64 tokens",
        "round 1/1, visit 2 of 6: n_max=1, starting llama-server",
        "round 1/1, visit 2 of 6: n_max=1, measuring 2 prompts of 64 tokens",
    ]
