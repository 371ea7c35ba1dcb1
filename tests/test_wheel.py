"""An installed wheel works outside the checkout: it carries the profiles, recipes and
checksums (setup.py copies serve/, convert/ and checksums/ into gguf_exact/_data), and
`pin` writes the user's folder, never the installed package's data; and it serves over an RPC worker
from the cached build it finds by its patches' digest.

The wheel is built from a copy of the source (`pip wheel --no-deps --no-build-isolation`:
offline, with the test venv's setuptools) and installed with `--no-deps` into a fresh venv
whose only other packages are the test venv's, reached through a path file (not its
editable install of gguf-exact). Every command runs there, from a folder outside the checkout.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from hubserver import FakeHub

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "gguf_exact", "serve", "convert", "checksums")
SOURCE_REPO = "google/gemma-4-E4B-it-qat-q4_0-unquantized-assistant"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The venv with the wheel installed; returns its bin folder."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCE:
        item = ROOT / name
        if item.is_dir():
            shutil.copytree(item, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_data"))
        else:
            shutil.copy2(item, src / name)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(src)],
                   check=True, env=env, cwd=root)  # fmt: skip
    wheel = next((root / "dist").glob("gguf_exact-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(py), "install", "-q", "--no-deps", str(wheel)], check=True, env=env)
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "_test_venv_packages.pth").write_text("\n".join(sorted(deps)) + "\n")
    return venv / "bin"


@pytest.fixture
def work(tmp_path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


def gguf_exact(bin_dir: Path, work: Path, *args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GGUF_EXACT_", "HF_", "PYTHON"))}
    full = base | {"XDG_CONFIG_HOME": str(work / "config"), "GGUF_EXACT_RUN_DIR": str(work / "run")} | (env or {})
    return subprocess.run([str(bin_dir / "gguf-exact"), *map(str, args)], cwd=work, env=full,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_wheel_runs_outside_the_checkout(installed, work):
    where = subprocess.run(
        [installed / "python", "-c", "import gguf_exact, gguf_exact.resources as r; "
         "print(gguf_exact.__file__); print(r.in_checkout()); print(r.shipped_dir('serve'))"],
        cwd=work, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    package = Path(where[0]).parent
    assert package.parent.name == "site-packages" and ROOT not in package.parents
    assert where[1:] == ["False", str(package / "_data" / "serve")]
    assert sorted(p.name for p in (package / "_data" / "serve").iterdir()) == sorted(
        p.name for p in (ROOT / "serve").glob("*.toml")
    )

    r = gguf_exact(installed, work, "make-tiny", "tiny")
    assert r.returncode == 0, r.stderr
    # a profile from the installed data (before: "profile 'rtx3050' not found")
    r = gguf_exact(installed, work, "serve", "--model", "tiny/target.gguf", "--no-draft", "--profile", "rtx3050",
                   "--dry-run")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "profile  rtx3050 (" in r.stdout and "build cuda86" in r.stdout
    assert "--n-gpu-layers 99 --flash-attn on --ctx-size 8192" in r.stdout
    # the recipes (before: "known recipes: none")
    r = gguf_exact(installed, work, "recipes")
    assert r.returncode == 0, r.stderr
    names = [ln.split()[0] for ln in r.stdout.splitlines() if not ln.startswith(" ")]
    assert names == ["e2b", "e2b-assistant", "e4b", "e4b-assistant"]
    assert f"  file    {package / '_data' / 'convert' / 'e2b-assistant.toml'}" in r.stdout
    r = gguf_exact(installed, work, "fetch", "nope")
    assert r.returncode == 1 and "known recipes: e2b, e2b-assistant, e4b, e4b-assistant" in r.stderr
    # make-tiny -> convert -> verify
    r = gguf_exact(
        installed, work, "convert", "tiny/drafter-hf", "tiny/drafter.gguf", "--vocab-from", "tiny/target.gguf"
    )
    assert r.returncode == 0, r.stderr
    assert "verified: " in r.stdout and "largest error 1 bf16 ULP" in r.stdout
    digest = r.stdout.split("sha256 ")[1].split()[0]
    assert hashlib.sha256((work / "tiny" / "drafter.gguf").read_bytes()).hexdigest() == digest
    r = gguf_exact(
        installed,
        work,
        "verify",
        "tiny/drafter.gguf",
        "--source",
        "tiny/drafter-hf",
        "--vocab-from",
        "tiny/target.gguf",
        env={"COLUMNS": "400"},  # the verdict whole, on one line
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert digest in r.stdout
    assert r.stdout.splitlines()[-1].startswith("verify: PASS — tiny/drafter.gguf: 51 tensors and 36 keys judged")


def test_pin_writes_the_user_folder_and_fetch_reads_it(installed, work):
    """`fetch e4b-assistant --what source` needs the source pinned (no manifest records its
    sha256); an installed gguf-exact's `pin` writes ~/.config/gguf-exact/checksums/,
    which fetch then reads (a loopback Hub)."""
    package = Path(
        subprocess.run(
            [installed / "python", "-c", "import gguf_exact; print(gguf_exact.__file__)"],
            cwd=work,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()  # fmt: skip
    ).parent
    shipped = package / "_data" / "checksums" / "e4b-assistant.sha256"
    before = shipped.read_bytes()
    files = {"config.json": b'{"model_type": "stand-in"}\n', "model.safetensors": b"stand-in of the E4B assistant"}
    with FakeHub(lifetime=120) as hub:
        commit = hub.commit(SOURCE_REPO, files)
        env = {
            "HF_ENDPOINT": hub.url,
            "HF_HUB_CACHE": str(work / "hf-cache"),
            "HF_HOME": str(work / "hf-home"),
            "HF_HUB_DISABLE_XET": "1",
            "COLUMNS": "400",  # lines whole, for the checks below
        }
        r = gguf_exact(installed, work, "fetch", "e4b-assistant", "--what", "source", env=env)
        assert r.returncode == 1 and "run `gguf-exact pin e4b-assistant --what source`" in r.stderr
        r = gguf_exact(installed, work, "pin", "e4b-assistant", "--what", "source", env=env)
        assert r.returncode == 0, r.stderr
        user = work / "config" / "gguf-exact" / "checksums" / "e4b-assistant.sha256"
        assert f"wrote {user}" in r.stdout and "is not written here" in r.stdout
        assert shipped.read_bytes() == before  # the installed data is never written
        text = user.read_text()
        assert f"# pin {SOURCE_REPO} revision=main commit={commit}" in text
        for name, data in files.items():
            assert (
                f"# size {len(data)}  {SOURCE_REPO}/{name}\n{hashlib.sha256(data).hexdigest()}  {SOURCE_REPO}/{name}"
                in text
            )
        assert before.decode().splitlines()[-1] in text  # the target's pin is kept
        r = gguf_exact(installed, work, "fetch", "e4b-assistant", "--what", "source", "--models-dir", "models", env=env)
        assert r.returncode == 0, r.stderr
        for name, data in files.items():
            assert (work / "models" / SOURCE_REPO / name).read_bytes() == data
        assert f"verified: size and sha256 as pinned in {user}; sha256 and commit {commit[:12]} pinned" in r.stdout
        r = gguf_exact(installed, work, "recipes", env=env)
        lines = r.stdout.splitlines()
        at = lines.index(f"  source  {SOURCE_REPO}")
        assert lines[at + 1] == f"          sha256 and commit {commit[:12]} pinned, 2 files"


@pytest.mark.llama_server
def test_the_wheel_serves_over_an_rpc_worker_as_on_one_machine(installed, work):
    """The installed gguf-exact finds the cached build (its key computed from the patches the
    wheel carries) and runs llama.cpp's rpc-server and `serve --rpc` from it: the tiny pair's
    greedy tokens and drafts over a loopback worker are those of the same pair on one machine."""
    from _llama_server import TEST_SETTINGS, complete, free_port, server_binary

    server_binary()  # built by `make test` first; a missing build fails here, in one line
    assert gguf_exact(installed, work, "make-tiny", "tiny").returncode == 0
    r = gguf_exact(
        installed, work, "convert", "tiny/drafter-hf", "tiny/drafter.gguf", "--vocab-from", "tiny/target.gguf"
    )
    assert r.returncode == 0, r.stderr
    sets = [a for x in TEST_SETTINGS for a in ("--set", x)]
    pair = ["--model", "tiny/target.gguf", "--draft", "tiny/drafter.gguf", "--profile", "cpu", *sets]
    worker, alone, over = free_port(), free_port(), free_port()

    def answer(port: int) -> list[tuple[list[int], int, int]]:
        got = [complete(f"http://127.0.0.1:{port}", p) for p in ("def f(x): return x + 1", "the quick brown fox")]
        return [(g["tokens"], g["timings"]["draft_n"], g["timings"]["draft_n_accepted"]) for g in got]

    r = gguf_exact(installed, work, "serve", *pair, "--port", alone, "--detach")
    assert r.returncode == 0, r.stderr
    try:
        want = answer(alone)
    finally:
        assert gguf_exact(installed, work, "stop", "--port", alone).returncode == 0
    r = gguf_exact(installed, work, "rpc-server", "--profile", "cpu", "--port", worker, "--threads", "1", "--detach")
    assert r.returncode == 0, r.stderr
    try:
        assert f"rpc-server ready at 127.0.0.1:{worker}" in r.stdout
        r = gguf_exact(installed, work, "serve", *pair, "--port", over, "--rpc", f"127.0.0.1:{worker}",
                       "--set", "log-verbosity=4", "--detach")  # fmt: skip
        assert r.returncode == 0, r.stderr
        try:
            assert "--rpc 127.0.0.1:" in r.stdout and "memory plan over devices" in r.stdout
            got = answer(over)
            log = (work / "run" / str(over) / "server.log").read_text()
            assert f"RPC0[127.0.0.1:{worker}] model buffer size" in log  # the worker holds weights
        finally:
            assert gguf_exact(installed, work, "stop", "--port", over).returncode == 0
    finally:
        assert gguf_exact(installed, work, "stop", "--port", worker).returncode == 0
    assert got == want
    assert all(len(tokens) == 16 for tokens, _, _ in want) and sum(acc for _, _, acc in want) > 0
