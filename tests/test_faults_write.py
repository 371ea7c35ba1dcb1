"""Nothing a user owns is ever destroyed (issue 26 §1-3, §5): every command that writes,
through the real CLI, refuses an output that is one of its inputs (same path, a ``..``
spelling, a symlink, a hard link) before any work and leaves every input's sha256 as it
was; OS errors at write time (a full disk, a read-only file system, permission denied,
the folder gone) are one line with nothing left behind, both injected into the real write
call and, as root, on a real 1 MB tmpfs and a read-only mount; a run killed with SIGKILL
at several points leaves nothing or the old file, and the next run removes its temp file."""

import contextlib
import errno
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from helpers import off_grid_checkpoint
from test_hub import EXACT, OUTPUT, config, hub, hub_env, publish, published, write_recipe  # noqa: F401

from gguf_exact.cli import main
from gguf_exact.errors import ArgumentError
from gguf_exact.formats.safe_write import FAULT_ENV, remove_stale_parts
from gguf_exact.tiny.kit import write_tiny_kit


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_sums(*roots: Path) -> dict[str, str]:
    """sha256 of every file under ``roots`` (a root may be a file)."""
    files = [p for r in roots for p in ([r] if r.is_file() else sorted(r.rglob("*"))) if p.is_file()]
    return {str(p): sha256(p) for p in files}


def parts_under(*folders: Path) -> list[Path]:
    return [p for f in folders for p in f.rglob("*.part")]


def one_error(args, env=None, notes: int = 0) -> str:
    """The one ``error:`` line of a command that fails (after ``notes`` lines of notes)."""
    result = CliRunner().invoke(main, [str(a) for a in args], env=env)
    assert result.exit_code == 1, (args, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()[notes:]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kit")
    write_tiny_kit(root)
    return root


# --- §1: an output that is an input ----------------------------------------------------

VARIANTS = ["same", "dotdot", "symlink", "hardlink"]


def spelled(victim: Path, variant: str, scratch: Path) -> Path:
    """An output path that is ``victim`` in the way ``variant`` says."""
    if variant == "same":
        return victim
    if variant == "dotdot":
        return victim.parent / ".." / victim.parent.name / victim.name
    link = scratch / f"{variant}-{victim.name}"
    (link.symlink_to if variant == "symlink" else link.hardlink_to)(victim)
    return link


def commands(kit: Path) -> dict[str, tuple[list, Path]]:
    """name -> (arguments with OUT where the output goes, the input that output is)."""
    convert = ["convert", kit / "drafter-hf", "OUT", "--vocab-from", kit / "target.gguf"]
    repack = ["repack", "--donor", kit / "main-q4_0.gguf", "--source", kit / "main-hf", "OUT"]
    return {
        "convert onto --vocab-from": (convert, kit / "target.gguf"),
        "convert onto the source's weights": (convert, kit / "drafter-hf" / "model.safetensors"),
        "convert onto the source's config": (convert, kit / "drafter-hf" / "config.json"),
        "convert --report onto --vocab-from": (
            ["convert", kit / "drafter-hf", kit / "x.gguf", "--vocab-from", kit / "target.gguf", "--report", "OUT"],
            kit / "target.gguf",
        ),
        "repack onto --donor": (repack, kit / "main-q4_0.gguf"),
        "repack onto the source's weights": (repack, kit / "main-hf" / "model.safetensors"),
        "repack --report onto --donor": (
            [
                "repack",
                "--donor",
                kit / "main-q4_0.gguf",
                "--source",
                kit / "main-hf",
                kit / "y.gguf",
                "--report",
                "OUT",
            ],
            kit / "main-q4_0.gguf",
        ),
    }


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "name",
    [
        "convert onto --vocab-from",
        "convert onto the source's weights",
        "convert onto the source's config",
        "convert --report onto --vocab-from",
        "repack onto --donor",
        "repack onto the source's weights",
        "repack --report onto --donor",
    ],
)
def test_an_output_that_is_an_input_is_refused(kit, tmp_path, name, variant):
    args, victim = commands(kit)[name]
    before = tree_sums(kit)
    out = spelled(victim, variant, tmp_path)
    line = one_error([out if a == "OUT" else a for a in args])
    assert str(out) in line and str(victim) in line and "nothing was written" in line, line
    assert tree_sums(kit) == before  # every input byte for byte
    assert not (kit / "x.gguf").exists() and not (kit / "y.gguf").exists()
    assert parts_under(kit, tmp_path) == []


def test_report_onto_the_output_is_refused(kit, tmp_path):
    out = tmp_path / "d.gguf"
    line = one_error(["convert", kit / "drafter-hf", out, "--vocab-from", kit / "target.gguf", "--report", out])
    assert line == f"error: --report {out}: is the output {out} itself; name another report path"
    assert list(tmp_path.iterdir()) == []


def test_a_new_file_beside_the_inputs_is_fine(kit, tmp_path):
    """Only what exists is protected: a new output inside the source folder is written."""
    src = tmp_path / "src"
    shutil.copytree(kit / "drafter-hf", src)
    result = CliRunner().invoke(
        main, ["convert", str(src), str(src / "new.gguf"), "--vocab-from", str(kit / "target.gguf")]
    )
    assert result.exit_code == 0, result.output
    assert (src / "new.gguf").stat().st_size == 150_080  # the tiny drafter with its ordered head


def test_fetch_refuses_a_destination_that_is_its_checksum_file(hub, config, tmp_path, published):  # noqa: F811
    publish(hub, published)
    recipe_path = write_recipe(tmp_path)
    pin = CliRunner().invoke(main, ["pin", str(recipe_path), "--what", "exact"], env=env_for(config))
    assert pin.exit_code == 0, pin.output
    checksum_file = next((tmp_path / "checksums").glob("*.sha256"), None) or next(tmp_path.rglob("tiny.sha256"))
    dest = tmp_path / "models" / EXACT / OUTPUT
    dest.parent.mkdir(parents=True)
    dest.hardlink_to(checksum_file)
    before = sha256(checksum_file)
    line = one_error(
        ["fetch", recipe_path, "--what", "exact", "--models-dir", tmp_path / "models"], env=env_for(config)
    )
    assert str(dest) in line and str(checksum_file) in line and "checksum file" in line, line
    assert sha256(checksum_file) == before and dest.samefile(checksum_file)
    assert not (config.cache_dir / f"models--{EXACT.replace('/', '--')}" / "blobs").exists()  # nothing downloaded


def test_pin_refuses_a_checksum_file_that_is_the_recipe(hub, config, tmp_path, published):  # noqa: F811
    publish(hub, published)
    recipe_path = write_recipe(tmp_path)
    (tmp_path / "checksums").mkdir(exist_ok=True)
    (tmp_path / "checksums" / "tiny.sha256").hardlink_to(recipe_path)
    before = sha256(recipe_path)
    line = one_error(["pin", recipe_path, "--what", "exact"], env=env_for(config))
    assert "recipe" in line and str(recipe_path) in line, line
    assert sha256(recipe_path) == before


def env_for(config) -> dict:  # noqa: F811
    return {"HF_ENDPOINT": config.endpoint, "HF_HOME": str(config.cache_dir.parent / "hf-home"),
            "HF_HUB_CACHE": str(config.cache_dir), "HF_HUB_DISABLE_XET": "1"}  # fmt: skip


def test_tune_never_overwrites_a_profile_it_did_not_write(tmp_path):
    """A user's own ``NAME-tuned.toml`` (not tune's mark) is the profile tune reads: refused."""
    from gguf_exact.bench.tune import TuneResult, write_tuned_profile
    from gguf_exact.engines.shared.profiles import load_profile

    mine = tmp_path / "cpu-tuned.toml"
    mine.write_text('[draft]\n"draft-max" = 2\n')
    before = sha256(mine)
    report = SimpleNamespace(rows=[], meta={"time": "2026-12-01"})
    result = TuneResult(report, best_n_max=3, best_tokens_per_second=1.0, target_tokens_per_second=None)
    with pytest.raises(ArgumentError) as err:
        write_tuned_profile(load_profile(mine), result, "gguf-exact tune", folder=tmp_path)
    assert "profile" in str(err.value) and str(mine) in str(err.value), err.value
    assert sha256(mine) == before


# --- §2: OS errors at write time ---------------------------------------------------------


@pytest.mark.parametrize(
    "fault, words",
    [
        ("ENOSPC", "no space left on the file system of"),
        ("EDQUOT", "no space left on the file system of"),
        ("EROFS", "is on a read-only file system; write the output elsewhere"),
        ("EACCES", "permission denied writing in"),
        ("EIO", "cannot write (Input/output error); nothing was written"),
    ],
)
@pytest.mark.parametrize("command", ["convert", "repack"])
def test_an_os_error_mid_write_is_one_line(kit, tmp_path, monkeypatch, fault, words, command):
    """The fault is raised by the real write call once the file passes 64 KiB, as the
    kernel's error would be: one line, nothing at the output, no temp file."""
    out = tmp_path / "out.gguf"
    old = tmp_path / "old.gguf"
    args = {
        "convert": ["convert", kit / "drafter-hf", out, "--vocab-from", kit / "target.gguf"],
        "repack": ["repack", "--donor", kit / "main-q4_0.gguf", "--source", kit / "main-hf", out],
    }[command]
    monkeypatch.setenv(FAULT_ENV, f"{fault}@65536")
    line = one_error(args)
    assert line.startswith(f"error: {out}: ") and words in line, line
    if fault in ("ENOSPC", "EDQUOT"):
        assert "needed " in line and " free" in line
    assert list(tmp_path.iterdir()) == []
    # an older file at the output is kept as it was
    old.write_bytes(b"the user's older file")
    one_error([old if a == out else a for a in args])
    assert old.read_bytes() == b"the user's older file" and list(tmp_path.iterdir()) == [old]


def test_the_background_writeback_runs_and_its_error_is_one_line(kit, tmp_path, monkeypatch):
    """convert starts writing to disk between tensors (os.fdatasync on a thread of its own,
    same bytes); an I/O error only that sync sees is the write's own error: one line,
    nothing at the output."""
    out = tmp_path / "out.gguf"
    args = ["convert", kit / "drafter-hf", out, "--vocab-from", kit / "target.gguf"]
    # A sync that returns at once: a real one can outlast the whole (tiny, fast) conversion,
    # and a tensor that finds one running starts none, so only then is the count certain.
    synced = []
    monkeypatch.setattr(os, "fdatasync", synced.append)
    assert CliRunner().invoke(main, [str(a) for a in args]).exit_code == 0
    assert len(synced) >= 2  # one per tensor that finds none running
    with_writeback = sha256(out)
    out.unlink()
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
    assert CliRunner().invoke(main, [str(a) for a in args]).exit_code == 0
    assert sha256(out) == with_writeback
    out.unlink()

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", failing)
    line = one_error(args)
    assert line == f"error: {out}: cannot write (Input/output error); nothing was written", line
    assert list(tmp_path.iterdir()) == []


def test_the_output_folder_gone_mid_write(kit, tmp_path):
    """The folder removed while convert writes (by a progress callback between tensors)."""
    from gguf_exact.drafter.convert import convert_drafter
    from gguf_exact.errors import OutputError

    folder = tmp_path / "gone"
    folder.mkdir()
    calls = []

    def remove_folder(name):
        calls.append(name)
        if len(calls) == 3:
            shutil.rmtree(folder)

    with pytest.raises(OutputError) as err:
        convert_drafter(kit / "drafter-hf", folder / "d.gguf", kit / "target.gguf", progress=remove_folder)
    assert str(err.value) == f"{folder / 'd.gguf'}: the output's folder {folder} is gone; create it and run again"
    assert not folder.exists()


@contextlib.contextmanager
def tmpfs(where: Path, size: str):
    where.mkdir()
    # CI runs as root on a machine that mounts: there a missing mount fails the test, never skips it
    unable = pytest.fail if os.environ.get("CI") else pytest.skip
    if os.geteuid() != 0:
        unable("mounting a tmpfs needs root (CI runs as root)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        unable(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(folder: Path, leave: int) -> None:
    """A filler file that leaves about ``leave`` bytes free on ``folder``'s file system."""
    free = shutil.disk_usage(folder).free
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def test_a_real_full_disk(kit, tmp_path):
    """On a real 1 MB tmpfs: the pre-write check refuses a repack that cannot fit; a
    convert whose off-grid matrix grows the file past the free space (planned as Q4_0,
    written as F32) meets the kernel's own ENOSPC mid-write. One line each, nothing left."""
    src = off_grid_checkpoint(tmp_path / "src")
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        out = mnt / "main.gguf"
        line = one_error(["repack", "--donor", kit / "main-q4_0.gguf", "--source", kit / "main-hf", out])
        m = re.fullmatch(
            f"error: {re.escape(str(out))}: needs ([0-9,]+) bytes but {re.escape(str(mnt))} has ([0-9,]+) bytes free; "
            "free some space there or write the output elsewhere",
            line,
        )
        assert m, line
        needs, free = (int(g.replace(",", "")) for g in m.groups())
        assert free == shutil.disk_usage(mnt).free == 1 << 20 and needs > (kit / "main-q4_0.gguf").stat().st_size * 0.9
        planned = 144_480  # the drafter's size with every matrix Q4_0
        fill(mnt, planned + 12_288)
        out = mnt / "d.gguf"
        line = one_error(["convert", src, out, "--vocab-from", kit / "target.gguf", "--off-grid", "f32"])
        assert line.startswith(f"error: {out}: no space left on the file system of {mnt} (needed 147,136 bytes, ")
        assert sorted(p.name for p in mnt.iterdir()) == ["filler"]


def test_a_real_read_only_file_system(kit, tmp_path):
    with tmpfs(tmp_path / "mnt", "8m") as mnt:
        (mnt / "old.gguf").write_bytes(b"old")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        for out in (mnt / "new.gguf", mnt / "old.gguf"):
            line = one_error(["convert", kit / "drafter-hf", out, "--vocab-from", kit / "target.gguf"])
            assert line == f"error: {out}: {mnt} is on a read-only file system; write the output elsewhere"
        line = one_error(["make-tiny", mnt / "kit"])
        assert line == f"error: {mnt / 'kit'}: {mnt} is on a read-only file system; write the output elsewhere"
        assert sorted(p.name for p in mnt.iterdir()) == ["old.gguf"] and (mnt / "old.gguf").read_bytes() == b"old"


# --- §3: killed mid-write ----------------------------------------------------------------


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """Inputs that take seconds: the E2B drafter at its real shapes (full vocabulary) and its
    target's header, and a main model of 176 MB with its donor."""
    from gguf_exact.tiny.main_model import MainSpec, write_donor, write_main_checkpoint
    from gguf_exact.tiny.peers import e2b_drafter_checkpoint, vocab_target
    from gguf_exact.tiny.vocab import gemma4_vocabulary

    root = tmp_path_factory.mktemp("big")
    vocab_target(root / "target.gguf", gemma4_vocabulary(262_144, 1000), "E2B")
    e2b_drafter_checkpoint(root / "drafter-hf")
    spec = MainSpec(
        n_layer=8, n_embd=768, n_ff=3072, n_embd_per_layer=32, n_kv_shared=4, double_wide=True, n_vocab=4096
    )
    write_main_checkpoint(root / "main-hf", spec)
    write_donor(root / "main-q4_0.gguf", root / "main-hf", spec)
    return root


def gguf_exact(*args) -> list[str]:
    return [sys.executable, "-m", "gguf_exact.cli", *map(str, args)]


def kill_when(proc: subprocess.Popen, ready, limit: float = 120.0) -> bool:
    """SIGKILL ``proc`` once ``ready()`` holds (polled every 10 ms); False if it ended first."""
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        if ready():
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            return True
        time.sleep(0.01)
    assert proc.poll() is not None, "the run neither reached the point nor ended"
    return False


@pytest.mark.parametrize("command", ["convert", "repack"])
def test_a_killed_run_leaves_nothing_or_the_old_file(big, tmp_path, command):
    args = {
        "convert": ["convert", big / "drafter-hf", "OUT", "--vocab-from", big / "target.gguf"],
        "repack": ["repack", "--donor", big / "main-q4_0.gguf", "--source", big / "main-hf", "OUT"],
    }[command]
    reference = tmp_path / "reference.gguf"
    subprocess.run(gguf_exact(*[reference if a == "OUT" else a for a in args]), check=True, capture_output=True)
    size, digest = reference.stat().st_size, sha256(reference)
    inputs = tree_sums(big)
    out = tmp_path / "out" / "model.gguf"
    out.parent.mkdir()

    def part_size() -> int:
        sizes = [-1]
        for p in out.parent.glob(".model.gguf.gguf-exact-*.part"):
            with contextlib.suppress(FileNotFoundError):  # renamed into place meanwhile
                sizes.append(p.stat().st_size)
        return max(sizes)

    points = {
        "at start": lambda: True,
        "temp file made": lambda: part_size() >= 0,
        "a third written": lambda: part_size() >= size // 3,
        "all written (reading back)": lambda: part_size() >= size,
    }
    killed_in = []
    for i, (point, ready) in enumerate(points.items()):
        old = b"" if i % 2 == 0 else f"the user's file before run {i}".encode()
        out.unlink(missing_ok=True)
        if old:
            out.write_bytes(old)
        log = tmp_path / f"run-{i}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(gguf_exact(*[out if a == "OUT" else a for a in args]), stdout=err, stderr=err)
        if kill_when(proc, ready):
            killed_in.append(point)
            # nothing, or the old file: never a partial one
            assert (out.read_bytes() == old) if old else not out.exists(), point
            leftover = [p.name for p in out.parent.iterdir() if p != out]
            assert leftover in ([], [f".model.gguf.gguf-exact-{proc.pid}.part"]), (point, leftover)
        else:  # it finished first: the whole file
            assert proc.returncode == 0, (point, log.read_text())
            assert sha256(out) == digest, (point, log.read_text())
    print(f"{command}: killed {killed_in} of {list(points)}")
    assert len(killed_in) >= 3, killed_in  # most points are reached on any machine
    # the next run removes the dead runs' temp files and writes the whole file
    subprocess.run(gguf_exact(*[out if a == "OUT" else a for a in args]), check=True, capture_output=True)
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]
    assert sha256(out) == digest and out.stat().st_size == size
    assert tree_sums(big) == inputs


def test_stale_temp_files_of_live_processes_are_kept(tmp_path):
    out = tmp_path / "m.gguf"
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = tmp_path / f".m.gguf.gguf-exact-{os.getpid()}.part"
    alive = tmp_path / f".m.gguf.gguf-exact-{os.getppid()}.part"
    stale = tmp_path / f".m.gguf.gguf-exact-{dead.pid}.part"
    other = tmp_path / f".other.gguf.gguf-exact-{dead.pid}.part"
    for p in (mine, alive, stale, other):
        p.write_bytes(b"x")
    assert remove_stale_parts(out) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (mine, alive, other))


def test_the_fault_hook_is_the_kernels_errno():
    from gguf_exact.formats.safe_write import injected_fault

    os.environ[FAULT_ENV] = "ENOSPC@100"
    try:
        injected_fault(0, 100)
        with pytest.raises(OSError) as err:
            injected_fault(50, 51)
        assert err.value.errno == errno.ENOSPC and err.value.strerror == os.strerror(errno.ENOSPC)
    finally:
        del os.environ[FAULT_ENV]
    injected_fault(0, 1 << 40)


def test_bench_refuses_a_report_that_is_its_model_before_measuring(kit, tmp_path):
    pairs = tmp_path / "pairs"
    target = kit / "target.gguf"
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench.md").hardlink_to(target)
    before = sha256(target)
    drafter = tmp_path / "drafter.gguf"
    assert (
        CliRunner()
        .invoke(main, ["convert", str(kit / "drafter-hf"), str(drafter), "--vocab-from", str(target)])
        .exit_code
        == 0
    )
    start = time.monotonic()
    line = one_error(["bench", "--model", target, "--draft", drafter, "--out", out])
    assert str(out / "bench.md") in line and str(target) in line, line
    assert time.monotonic() - start < 5 and sha256(target) == before and not pairs.exists()


def test_tune_refuses_the_users_own_profile_before_measuring(kit, tmp_path, monkeypatch):
    from gguf_exact.engines.shared.profiles import user_profile_dir

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    mine = user_profile_dir() / "cpu-tuned.toml"
    mine.parent.mkdir(parents=True)
    mine.write_text((Path(__file__).parents[1] / "serve" / "cpu.toml").read_text())
    before = sha256(mine)
    target = kit / "target.gguf"
    args = ["tune", "--model", target, "--draft", target, "--profile", "cpu-tuned", "--out", tmp_path / "o"]
    line = one_error(args, notes=1)  # the profile it read, then the error
    assert str(mine) in line and "profile" in line, line
    assert sha256(mine) == before and not (tmp_path / "o").exists()


def test_build_refuses_before_downloading(hub, config, tmp_path, published):  # noqa: F811
    """An out-dir whose output is --vocab-from, or where the published file it is compared
    with is fetched: refused before a byte is downloaded."""
    publish(hub, published)
    path = write_recipe(tmp_path)
    env = env_for(config)
    for role in ("source", "exact"):
        assert CliRunner().invoke(main, ["pin", str(path), "--what", role], env=env).exit_code == 0
    out = tmp_path / "out"
    out.mkdir()
    vocab = out / OUTPUT
    vocab.write_bytes(published["target.gguf"])
    models = tmp_path / "models"
    line = one_error(["build", path, "--models-dir", models, "--out-dir", out, "--vocab-from", vocab], env=env)
    assert line.startswith(f"error: {vocab}: the output is the --vocab-from {vocab}, which this command reads;"), line
    assert sha256(vocab) == hashlib.sha256(published["target.gguf"]).hexdigest()
    line = one_error(["build", path, "--models-dir", models, "--out-dir", models / EXACT], env=env)
    assert line == (
        f"error: --out-dir {models / EXACT}: the build would be written at {models / EXACT / OUTPUT}, where the "
        "published file it is compared with is fetched; build into another folder"
    )
    assert hub.gets("model.safetensors") == [] and hub.gets(OUTPUT) == [] and not models.exists()
