"""Outputs promised untouched stay untouched (issue 42 §4): a command that writes a model and
a report renames neither into place until both are written, so a report that cannot be
written leaves the user's older model byte for byte; ``stop`` signals (SIGTERM, SIGHUP)
clean up the temp files as Ctrl-C does."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_faults_write import big, gguf_exact, kit, one_error, sha256  # noqa: F401
from test_hub import EXACT, OUTPUT, config, hub, hub_env, publish, published, sha, write_recipe  # noqa: F401

from gguf_exact.errors import GgufExactError, OutputError
from gguf_exact.formats.safe_write import atomic_output, staged_outputs, write_text
from gguf_exact.hub.client import download
from gguf_exact.hub.fetch import fetch_recipe
from gguf_exact.hub.pin import pin_recipe
from gguf_exact.hub.recipes import load_recipe
from gguf_exact.hub.session import storage_dir

# A folder no one can create files in, root included (sysfs refuses new files).
UNWRITABLE = Path("/sys")


def unwritable_report(name: str) -> Path:
    path = UNWRITABLE / name
    try:
        os.close(os.open(UNWRITABLE / f".{name}.probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        return path
    os.unlink(UNWRITABLE / f".{name}.probe")
    pytest.fail(f"{UNWRITABLE} takes new files here: the test needs a folder that does not")


def command_args(kit: Path, command: str, out: Path) -> list:  # noqa: F811
    return {
        "convert": ["convert", kit / "drafter-hf", out, "--vocab-from", kit / "target.gguf"],
        "repack": ["repack", "--donor", kit / "main-q4_0.gguf", "--source", kit / "main-hf", out],
    }[command]


@pytest.mark.parametrize("command", ["convert", "repack"])
def test_an_unwritable_report_leaves_the_older_output_as_it_was(kit, tmp_path, command):  # noqa: F811
    out = tmp_path / "OUT.gguf"
    out.write_bytes(b"the user's older model")
    before = sha256(out)
    report = unwritable_report(f"{command}-report.json")
    line = one_error([*command_args(kit, command, out), "--report", report])
    assert sha256(out) == before
    assert line == f"error: {report}: permission denied writing in {UNWRITABLE}; write the output elsewhere"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["OUT.gguf"]


@pytest.mark.parametrize("command", ["convert", "repack"])
def test_a_report_that_fails_after_the_model_is_written_changes_nothing(kit, tmp_path, command):  # noqa: F811
    """The report's folder removed while the model is written (by a progress callback): the
    report fails after the model was read back, and the older model stays."""
    from gguf_exact.drafter.convert import convert_drafter
    from gguf_exact.repack.pipeline import repack_model

    out = tmp_path / "OUT.gguf"
    out.write_bytes(b"the user's older model")
    before = sha256(out)
    folder = tmp_path / "reports"
    folder.mkdir()
    report = folder / "r.json"
    calls = []

    def remove_folder(*_):
        calls.append(1)
        if len(calls) == 2:
            shutil.rmtree(folder)

    with pytest.raises(GgufExactError) as err:
        if command == "convert":
            convert_drafter(kit / "drafter-hf", out, kit / "target.gguf", report_path=report, progress=remove_folder)
        else:
            repack_model(kit / "main-q4_0.gguf", kit / "main-hf", out, report_path=report, progress=remove_folder)
    assert str(err.value) == f"{report}: output directory {folder} does not exist"
    assert sha256(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["OUT.gguf"]


def test_a_stage_renames_all_or_nothing(tmp_path):
    first, second = tmp_path / "a.gguf", tmp_path / "b.json"
    first.write_bytes(b"old a")
    with pytest.raises(OutputError), staged_outputs():
        with atomic_output(first) as tmp:
            tmp.write_bytes(b"new a")
        assert first.read_bytes() == b"old a"  # written, not yet renamed
        with atomic_output(second) as tmp:
            raise OSError(28, os.strerror(28))
    assert first.read_bytes() == b"old a" and sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf"]
    with staged_outputs() as stage:
        reserved = stage.reserve(second)
        with atomic_output(first) as tmp:
            tmp.write_bytes(b"new a")
        write_text(second, "report\n")
        assert reserved.read_text() == "report\n" and first.read_bytes() == b"old a"
    assert first.read_bytes() == b"new a" and second.read_text() == "report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.json"]


def signal_when(proc: subprocess.Popen, signum: int, ready, limit: float = 120.0) -> None:
    """Send ``signum`` to ``proc`` once ``ready()`` holds (polled every 10 ms)."""
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        if ready():
            proc.send_signal(signum)
            return
        time.sleep(0.01)
    pytest.fail(f"the run ended (status {proc.returncode}) before the point to signal it was reached")


@pytest.mark.parametrize(
    "command, signum", [("convert", signal.SIGTERM), ("repack", signal.SIGTERM), ("convert", signal.SIGHUP)]
)
def test_a_stop_signal_mid_write_cleans_up_as_ctrl_c_does(big, tmp_path, command, signum):  # noqa: F811
    """The real command in its own process, signalled once its temp file holds a MiB: it
    exits with 128 + the signal's number and one line, its temp files (model and report)
    removed at once, the user's older model byte for byte."""
    out = tmp_path / "model.gguf"
    out.write_bytes(b"the user's older model")
    before = sha256(out)
    args = command_args(big, command, out) + ["--report", tmp_path / "report.json"]

    def written() -> bool:
        return any(p.stat().st_size >= 1 << 20 for p in tmp_path.glob(".model.gguf.gguf-exact-*.part"))

    proc = subprocess.Popen(gguf_exact(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    signal_when(proc, signum, written)
    _, err = proc.communicate(timeout=60)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == (
        f"error: stopped by {name}; no partial file was left at any output: run the command again to finish"
    )
    assert sha256(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


# --- a fetched file is the user's own copy, not the Hub cache's blob -------------------------


def fetched_once(hub, config, tmp_path, published):  # noqa: F811  (the fixtures, passed on)
    """The exact part of a recipe published to the loopback Hub, pinned and fetched: (recipe, models
    folder, the placed file, its pinned sha256, the Hub cache's blob of it)."""
    publish(hub, published)
    recipe = load_recipe(write_recipe(tmp_path))
    pin_recipe(recipe, ["exact"], config=config)
    models = tmp_path / "models"
    fetch_recipe(recipe, "exact", models, config, progress=False)
    pinned = sha(published[OUTPUT])
    return recipe, models, models / EXACT / OUTPUT, pinned, storage_dir(EXACT, config) / "blobs" / pinned


def test_an_edited_fetched_file_leaves_the_cache_intact(hub, config, tmp_path, published):  # noqa: F811
    """fetch places a reflink or a copy, never a hard link: editing the placed file changes
    nothing in the Hub cache, and the next fetch names the edited file and puts the pinned one
    back from the cache, downloading nothing."""
    recipe, models, dest, pinned, blob = fetched_once(hub, config, tmp_path, published)
    assert dest.stat().st_nlink == 1 and not dest.samefile(blob) and sha256(dest) == pinned
    dest.write_bytes(b"edited!!\n")  # in place: the same inode, 9 bytes
    assert sha256(blob) == pinned
    downloads = len(hub.gets(OUTPUT))
    again = fetch_recipe(recipe, "exact", models, config, progress=False)
    size = len(published[OUTPUT])
    assert again[0].how == (
        f"from cache ({dest} was not the pinned file (9 bytes, the pin says {size:,}): edited? "
        "replaced by the pinned file)"
    )
    assert sha256(dest) == pinned and sha256(blob) == pinned and len(hub.gets(OUTPUT)) == downloads


def test_a_cache_blob_changed_here_is_named_and_downloaded_again(hub, config, tmp_path, published):  # noqa: F811
    """A placed file that is a hard link to the blob (as fetch made them before), edited: the
    blob changed with it. The next fetch says the cache's copy was changed here (not that the
    download is wrong), removes it and downloads the pinned file again."""
    recipe, models, dest, pinned, blob = fetched_once(hub, config, tmp_path, published)
    dest.unlink()
    dest.hardlink_to(blob)
    dest.write_bytes(b"edited!!\n")
    downloads = len(hub.gets(OUTPUT))
    again = fetch_recipe(recipe, "exact", models, config, progress=False)
    size = len(published[OUTPUT])
    assert again[0].how == (
        f"downloaded ({dest} was not the pinned file (9 bytes, the pin says {size:,}): edited? replaced by "
        f"the pinned file; the Hub cache's copy {blob} had 9 bytes, the pin says {size:,}: changed on this machine "
        "after it was verified (edited through a hard link? a disk error?); removed from the cache)"
    )
    assert sha256(dest) == pinned and sha256(blob) == pinned and not dest.samefile(blob)
    assert len(hub.gets(OUTPUT)) == downloads + 1


def test_download_names_a_blob_changed_here(hub, config, tmp_path, published):  # noqa: F811
    """``download`` of a file whose blob is already in the cache, but changed there: the cache's
    copy is named as changed here, not the download as wrong."""
    publish(hub, published)
    got = download(EXACT, OUTPUT, "main", config, progress=False)
    blob = Path(os.path.realpath(got.path))
    blob.write_bytes(b"edited!!\n")
    with pytest.raises(GgufExactError) as err:
        download(EXACT, OUTPUT, "main", config, progress=False)
    assert str(err.value) == (
        f"{EXACT}/{OUTPUT}: the Hub cache's copy {blob} is 9 bytes, the Hub's metadata says "
        f"{len(published[OUTPUT]):,}: changed on this machine after it was verified (edited through a hard link? "
        "a disk error?); removed from the cache: run again"
    )
    assert not blob.exists()
    assert sha256(download(EXACT, OUTPUT, "main", config, progress=False).path) == sha(published[OUTPUT])


def test_tune_keeps_the_earlier_report_when_its_profile_cannot_be_written(tmp_path, monkeypatch):
    """tune writes its measurement and the tuned profile together: a profile folder that cannot
    be made (the user's config folder under one that takes no files) leaves the report of an
    earlier tune as it was. The measurement itself is stood in for: the writes are real."""
    from gguf_exact.bench import tune
    from gguf_exact.bench.run import BenchReport
    from gguf_exact.engines.shared.profiles import load_profile

    monkeypatch.setenv("XDG_CONFIG_HOME", str(UNWRITABLE / "gguf-exact-config"))
    out = tmp_path / "o"
    out.mkdir()
    for name in ("bench.json", "bench.md"):
        (out / name).write_text("the earlier tune's report\n")
    result = tune.TuneResult(BenchReport({"time": "2026-12-01"}, [], []), 3, 1.0, None)
    monkeypatch.setattr(tune, "tune_n_max", lambda request, prompts, progress, step: result)
    profile = load_profile(Path(__file__).parents[1] / "serve" / "cpu.toml")
    request = tune.TuneRequest(tmp_path / "t.gguf", tmp_path / "d.gguf", profile, "cpu")
    with pytest.raises(OutputError) as err:
        tune.tune_profile(request, out)
    assert str(err.value).startswith(f"{UNWRITABLE / 'gguf-exact-config'}"), err.value
    assert [(out / n).read_text() for n in ("bench.json", "bench.md")] == ["the earlier tune's report\n"] * 2
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.md"]
