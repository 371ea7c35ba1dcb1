"""Pinned fetch, pin and reproducible build, through the real huggingface_hub client
against a loopback Hub (tests/hubserver.py) serving generated files."""

import hashlib
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType, GGUFReader
from gguf_edit import oracle_figures
from hubserver import FakeHub
from huggingface_hub import constants, hf_hub_download
from rich.console import Console

from gguf_exact.cli import console, main
from gguf_exact.core import bf16, q4_0
from gguf_exact.core.published import published_q4_0
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.gemma4.assistant import gguf_tensor_name
from gguf_exact.hub import checksums
from gguf_exact.hub.checksums import Checksums, Entry, RepoPin
from gguf_exact.hub.fetch import fetch_recipe
from gguf_exact.hub.pin import pin_recipe
from gguf_exact.hub.recipes import load_recipe
from gguf_exact.hub.session import HubConfig, storage_dir
from gguf_exact.rebuild.outcome import compare_with_published
from gguf_exact.repack.donor import open_donor
from gguf_exact.tiny.models import TinyDrafter, drafter_config, drafter_tensors, write_checkpoint

SRC, EXACT, TARGET = "google/tiny-assistant", "pub/tiny-exact-gguf", "google/tiny-target-gguf"
OUTPUT = "tiny-exact.gguf"
CHUNK = 10 << 20  # huggingface_hub writes downloads in chunks of this size


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def hub_env(monkeypatch, tmp_path):
    """No token from the developer's machine; the fake Hub does not speak xet."""
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


@pytest.fixture
def hub():
    with FakeHub(lifetime=60) as h:
        yield h


@pytest.fixture
def config(hub, tmp_path) -> HubConfig:
    return HubConfig(hub.url, tmp_path / "cache", token=False)


@pytest.fixture(scope="module")
def published(tiny, tmp_path_factory) -> dict[str, bytes]:
    """The files of the three repos: source checkpoint, target GGUF, and the exact GGUF
    made from them (the 'published' file a build must reproduce)."""
    out = tmp_path_factory.mktemp("published") / OUTPUT
    convert_drafter(tiny / "drafter-bf16", out, tiny / "target.gguf", ordered_head=False)  # as published: no head
    src = tiny / "drafter-bf16"
    return {
        "config.json": (src / "config.json").read_bytes(),
        "model.safetensors": (src / "model.safetensors").read_bytes(),
        "target.gguf": (tiny / "target.gguf").read_bytes(),
        OUTPUT: out.read_bytes(),
    }


def write_recipe(root: Path, exact_revision: str = "main") -> Path:
    (root / "convert").mkdir(parents=True, exist_ok=True)
    path = root / "convert" / "tiny.toml"
    path.write_text(
        f"""name = "tiny"
kind = "drafter"
output = "{OUTPUT}"

[source]
repo = "{SRC}"
revision = "main"
files = ["config.json", "model*.safetensors"]

[exact]
repo = "{EXACT}"
revision = "{exact_revision}"
files = ["{OUTPUT}"]

[target]
repo = "{TARGET}"
revision = "main"
files = ["target.gguf"]
"""
    )
    return path


def publish(hub: FakeHub, files: dict[str, bytes]) -> dict[str, str]:
    return {
        "source": hub.commit(
            SRC,
            {
                "config.json": files["config.json"],
                "model.safetensors": files["model.safetensors"],
                "README.md": b"# tiny\n",
            },
        ),
        "target": hub.commit(TARGET, {"target.gguf": files["target.gguf"]}),
        "exact": hub.commit(EXACT, {OUTPUT: files[OUTPUT]}),
    }


def run(args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def leftovers(cache: Path) -> list[str]:
    return [p.name for p in cache.rglob("*") if p.name.endswith(".incomplete")] if cache.exists() else []


# --- pin ---------------------------------------------------------------------------------


def test_pin_records_commits_and_hashes_without_downloading_lfs(hub, config, tmp_path, published):
    commits = publish(hub, published)
    recipe = load_recipe(write_recipe(tmp_path))
    report = pin_recipe(recipe, config=config)
    cs = checksums.read(recipe.checksums)
    assert {r: cs.pins[repo].commit for r, repo in (("source", SRC), ("target", TARGET), ("exact", EXACT))} == commits
    assert cs.pins[SRC].revision == "main"
    for repo, name in ((SRC, "config.json"), (SRC, "model.safetensors"), (TARGET, "target.gguf"), (EXACT, OUTPUT)):
        assert cs.sha256(f"{repo}/{name}") == sha(published[name])
    assert cs.sha256(f"{SRC}/README.md") is None  # not in the recipe
    how = {e.path.rsplit("/", 1)[1]: e.how for p in report.parts for e in p.entries}
    assert how == {
        "config.json": "read and hashed",
        "model.safetensors": "hub metadata",
        "target.gguf": "hub metadata",
        OUTPUT: "hub metadata",
    }
    assert [r.path for r in hub.requests if r.method == "GET" and "/resolve/" in r.path] == [
        f"/{SRC}/resolve/{commits['source']}/config.json"
    ]
    assert report.changed == []


def test_pin_revision_of_one_part_and_changes(hub, config, tmp_path, published):
    commits = publish(hub, published)
    recipe = load_recipe(write_recipe(tmp_path))
    pin_recipe(recipe, config=config)
    newer = hub.commit(EXACT, {OUTPUT: b"GGUF republished"})
    report = pin_recipe(recipe, ["exact"], config=config)
    assert report.parts[0].pin.commit == newer
    assert [(e.previous, e.sha256) for e in report.changed] == [(sha(published[OUTPUT]), sha(b"GGUF republished"))]
    back = pin_recipe(recipe, ["exact"], revision=commits["exact"], config=config)
    cs = checksums.read(recipe.checksums)
    assert back.parts[0].pin == RepoPin(EXACT, commits["exact"], commits["exact"]) == cs.pins[EXACT]
    assert cs.sha256(f"{EXACT}/{OUTPUT}") == sha(published[OUTPUT])
    assert cs.pins[SRC].commit == commits["source"]  # other parts untouched
    with pytest.raises(GgufExactError, match="each part has its own revision"):
        pin_recipe(recipe, None, revision="main", config=config)


# --- fetch -------------------------------------------------------------------------------


def test_fetch_honours_the_pinned_commit_when_main_moved(hub, config, tmp_path, published):
    commits = publish(hub, published)
    recipe = load_recipe(write_recipe(tmp_path))
    pin_recipe(recipe, config=config)
    hub.commit(EXACT, {OUTPUT: b"GGUF something else on main"})
    hub.commit(SRC, {"config.json": b"{}", "model.safetensors": b"other weights"})
    models = tmp_path / "models"
    got = fetch_recipe(recipe, "exact", models, config, progress=False)
    assert [(f.how, f.commit) for f in got] == [("downloaded", commits["exact"])]
    assert (models / EXACT / OUTPUT).read_bytes() == published[OUTPUT]
    src = fetch_recipe(recipe, "source", models, config, progress=False)
    assert [f.path.name for f in src] == ["config.json", "model.safetensors"]
    assert (models / SRC / "model.safetensors").read_bytes() == published["model.safetensors"]
    resolved = [r.path for r in hub.requests if "/resolve/" in r.path]
    assert resolved and all(
        f"/resolve/{commits['exact']}/" in p or f"/resolve/{commits['source']}/" in p for p in resolved
    )
    again = fetch_recipe(recipe, "exact", models, config, progress=False)
    assert again[0].how == "in place"
    # the checksum file checks the fetched files as it is (docs/recipes.md's command)
    check = subprocess.run(
        [sha256sum(), "-c", "--ignore-missing", str(recipe.checksums)], cwd=models, capture_output=True, text=True
    )
    assert check.returncode == 0 and check.stdout.count(": OK") == 3, check.stdout + check.stderr


def write_pins(recipe_path: Path, commit: str | None, sha256: str) -> None:
    """A hand-written checksum file pinning the exact GGUF."""
    target = recipe_path.parent.parent / "checksums" / "tiny.sha256"
    target.parent.mkdir(exist_ok=True)
    checksums.write(
        target, Checksums([], {EXACT: RepoPin(EXACT, "main", commit)}, [Entry(sha256, f"{EXACT}/{OUTPUT}")])
    )


def test_fetch_refuses_a_file_whose_hub_hash_is_not_the_pin(hub, config, tmp_path, published):
    publish(hub, published)
    path = write_recipe(tmp_path)
    wrong = sha(b"what the publisher uploaded")
    write_pins(path, None, wrong)
    dest = tmp_path / "models" / EXACT / OUTPUT
    with pytest.raises(GgufExactError) as err:
        fetch_recipe(load_recipe(path), "exact", tmp_path / "models", config, progress=False)
    msg = str(err.value)
    assert f"{EXACT}/{OUTPUT}" in msg and wrong in msg and sha(published[OUTPUT]) in msg and "nothing downloaded" in msg
    assert not dest.exists() and hub.gets(OUTPUT) == []


def test_fetch_refuses_corrupt_bytes_and_leaves_nothing(hub, config, tmp_path, published):
    publish(hub, published)
    path = write_recipe(tmp_path)
    recipe = load_recipe(path)
    pin_recipe(recipe, ["exact"], config=config)
    bad = bytearray(published[OUTPUT])
    bad[1000] ^= 0xFF
    hub.corrupt(EXACT, OUTPUT, bytes(bad))
    dest = tmp_path / "models" / EXACT / OUTPUT
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"a stale file from before")
    with pytest.raises(GgufExactError) as err:
        fetch_recipe(recipe, "exact", tmp_path / "models", config, progress=False)
    msg = str(err.value)
    assert (
        f"{EXACT}/{OUTPUT}" in msg
        and f"sha256 {sha(bytes(bad))}" in msg
        and f"expected {sha(published[OUTPUT])}" in msg
    )
    # the file that was there is the user's: left as it was, never replaced by unverified bytes
    assert dest.read_bytes() == b"a stale file from before"
    assert sorted(p.name for p in dest.parent.iterdir()) == [OUTPUT]
    assert (
        leftovers(config.cache_dir) == []
        and not (storage_dir(EXACT, config) / "blobs" / sha(published[OUTPUT])).exists()
    )


def big_exact(hub, tmp_path, config, size=CHUNK + (2 << 20)):
    data = np.random.default_rng(3).integers(0, 256, size, dtype=np.uint8).tobytes()
    hub.commit(EXACT, {OUTPUT: data})
    recipe = load_recipe(write_recipe(tmp_path))
    pin_recipe(recipe, ["exact"], config=config)
    return recipe, data


def test_a_cut_transfer_resumes_in_the_same_run(hub, config, tmp_path):
    recipe, data = big_exact(hub, tmp_path, config)
    hub.cut(EXACT, OUTPUT, at=CHUNK + 12345)
    got = fetch_recipe(recipe, "exact", tmp_path / "models", config, progress=False)
    assert got[0].how == "downloaded" and (tmp_path / "models" / EXACT / OUTPUT).read_bytes() == data
    assert [r.headers.get("range") for r in hub.gets(OUTPUT)] == [None, f"bytes={CHUNK}-"]


def test_an_interrupted_download_resumes_on_the_next_run(hub, config, tmp_path):
    recipe, data = big_exact(hub, tmp_path, config)
    hub.cut(EXACT, OUTPUT, at=CHUNK + 12345, then_fail=1)
    dest = tmp_path / "models" / EXACT / OUTPUT
    with pytest.raises(GgufExactError) as err:
        fetch_recipe(recipe, "exact", tmp_path / "models", config, progress=False)
    assert (
        "HTTP 503" in str(err.value) and f"{CHUNK:,} bytes are kept" in str(err.value) and "resumes" in str(err.value)
    )
    assert not dest.exists() and leftovers(config.cache_dir) == [f"{sha(data)}.incomplete"]
    got = fetch_recipe(recipe, "exact", tmp_path / "models", config, progress=False)
    assert got[0].how == "resumed" and dest.read_bytes() == data and leftovers(config.cache_dir) == []
    assert hub.gets(OUTPUT)[-1].headers.get("range") == f"bytes={CHUNK}-"


def test_offline_serves_from_the_cache_and_says_what_is_missing(hub, config, tmp_path, published):
    commits = publish(hub, published)
    recipe = load_recipe(write_recipe(tmp_path))
    pin_recipe(recipe, config=config)
    models = tmp_path / "models"
    fetch_recipe(recipe, "exact", models, config, progress=False)
    (models / EXACT / OUTPUT).unlink()
    hub.stop()  # no network from here on
    offline = HubConfig("http://127.0.0.1:9", config.cache_dir, offline=True)
    got = fetch_recipe(recipe, "exact", models, offline, progress=False)
    assert got[0].how == "from cache" and (models / EXACT / OUTPUT).read_bytes() == published[OUTPUT]
    # the cache is the Hub's own layout: huggingface_hub finds the file there too
    cached = hf_hub_download(
        EXACT, OUTPUT, revision=commits["exact"], cache_dir=config.cache_dir, local_files_only=True
    )
    assert Path(cached).read_bytes() == published[OUTPUT]
    # pin read config.json through the cache; the weights were never downloaded
    with pytest.raises(GgufExactError, match=rf"{SRC}/model.safetensors: not in the Hub cache .* HF_HUB_OFFLINE"):
        fetch_recipe(recipe, "source", models, offline, progress=False)
    assert (models / SRC / "config.json").is_file() and not (models / SRC / "model.safetensors").exists()
    (models / EXACT / OUTPUT).unlink()
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(config.cache_dir), "HF_ENDPOINT": "http://127.0.0.1:9"}
    result = run(["fetch", recipe.path, "--what", "exact", "--models-dir", models], env)
    assert result.exit_code == 0, result.output
    assert "from cache" in result.stdout and (models / EXACT / OUTPUT).read_bytes() == published[OUTPUT]


# --- one-line errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, expected",
    [
        ("private", "not authorised (HTTP 401)"),
        ("bad-token", "the Hub rejected the token (HTTP 401)"),
        ("missing-repo", "repository not found (HTTP 404)"),
        ("gated", "gated repository (HTTP 401); accept its licence at"),
        ("gated-logged-in", "gated repository (HTTP 403); accept its licence at"),
        ("missing-revision", "revision 0123456789abcdef0123456789abcdef01234567 not found"),
        ("missing-file", "no such file at this revision (HTTP 404)"),
        ("network", "network error (ConnectError"),
    ],
)
def test_hub_failures_are_one_line_with_what_to_do(hub, tmp_path, case, expected):
    data = b"GGUF tiny"
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache")}
    commit = "0123456789abcdef0123456789abcdef01234567"
    if case != "missing-repo":
        real = hub.commit(
            EXACT,
            {OUTPUT if case != "missing-file" else "other.gguf": data},
            private=case in ("private", "bad-token"),
            gated=case.startswith("gated"),
        )
        commit = commit if case == "missing-revision" else real
    if case == "bad-token":
        env["HF_TOKEN"] = "hf_wrong"
    if case == "gated-logged-in":
        env["HF_TOKEN"] = hub.token
    if case == "network":
        env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    path = write_recipe(tmp_path)
    write_pins(path, commit, sha(data))
    line = one_error_line(run(["fetch", path, "--models-dir", tmp_path / "models"], env))
    assert expected in line and f"{EXACT}" in line, line
    if case in ("private", "bad-token", "gated"):
        assert "hf auth login" in line
    assert not (tmp_path / "models" / EXACT / OUTPUT).exists()


def test_private_repo_with_a_token_and_pin_errors(hub, tmp_path):
    data = b"GGUF private"
    hub.commit(EXACT, {OUTPUT: data}, private=True)
    path = write_recipe(tmp_path)
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_TOKEN": hub.token}
    result = run(["pin", path, "--what", "exact"], env)
    assert result.exit_code == 0, result.output
    assert f"[exact] {EXACT} revision main -> commit" in result.stdout and sha(data) in result.stdout
    fetched = run(["fetch", path, "--models-dir", tmp_path / "models"], env)
    assert fetched.exit_code == 0, fetched.output
    line = one_error_line(run(["pin", path, "--what", "source"], env))
    assert f"{SRC}@main: repository not found (HTTP 404)" in line
    line = one_error_line(run(["fetch", path, "--what", "source", "--models-dir", tmp_path / "models"], env))
    assert f"no sha256 pinned for {SRC}/config.json" in line and "gguf-exact pin tiny --what source" in line


# --- fetch of a drafter: converted with its ordered head (issue 24) ---------------------------


def test_fetch_of_a_drafter_converts_it_with_its_ordered_head_by_default(hub, tmp_path, published, tiny):
    """A user who fetches a drafter gets the fast head without asking: the published file has
    none, so fetch gets the checkpoint and the published file (its vocabulary) and converts
    the checkpoint here; --what exact is the published file as it is."""
    publish(hub, published)
    path = write_recipe(tmp_path)
    env = cli_env(hub, tmp_path)
    assert run(["pin", path], env).exit_code == 0
    models = tmp_path / "models"
    dry = run(["fetch", path, "--models-dir", models, "--dry-run"], env)
    assert dry.exit_code == 0, dry.output
    assert f"then: converted here to {models / 'converted' / OUTPUT}" in " ".join(dry.stdout.split())
    assert not models.exists() or not any(models.rglob("*.gguf"))
    result = run(["fetch", path, "--models-dir", models], env)
    assert result.exit_code == 0, result.output
    out = models / "converted" / OUTPUT
    assert "with its ordered-embedding head" in result.stdout and str(out) in "".join(result.stdout.split())
    # the fetched files are the pinned bytes, the converted file what convert makes of the checkpoint
    assert (models / EXACT / OUTPUT).read_bytes() == published[OUTPUT]
    assert (models / SRC / "model.safetensors").read_bytes() == published["model.safetensors"]
    assert hub.gets("target.gguf") == []  # the vocabulary came from the published drafter
    want = convert_drafter(tiny / "drafter-bf16", tmp_path / "want.gguf", tiny / "target.gguf").path
    assert out.read_bytes() == want.read_bytes()
    assert {"masked_embd_centroids.weight", "masked_embd_ordering"} <= {t.name for t in GGUFReader(out).tensors}
    assert "masked_embd_ordering" not in {t.name for t in GGUFReader(models / EXACT / OUTPUT).tensors}
    # and verify holds it to its source, the published file lending the vocabulary
    check = run(["verify", out, "--source", models / SRC, "--vocab-from", models / EXACT / OUTPUT])
    assert check.exit_code == 0 and "verify: PASS" in check.stdout, check.output
    # --what exact: the published file alone, nothing converted
    again = run(["fetch", path, "--what", "exact", "--models-dir", tmp_path / "models2"], env)
    assert again.exit_code == 0 and not (tmp_path / "models2" / "converted").exists()


def test_fetch_of_a_drafter_whose_checkpoint_is_not_pinned_gets_the_published_file(hub, tmp_path, published):
    publish(hub, published)
    path = write_recipe(tmp_path)
    env = cli_env(hub, tmp_path)
    assert run(["pin", path, "--what", "exact"], env).exit_code == 0
    result = run(["fetch", path, "--models-dir", tmp_path / "models"], env)
    assert result.exit_code == 0, result.output
    assert "without the ordered-embedding head" in result.stderr and "gguf-exact pin tiny --what source" in result.stderr
    assert (tmp_path / "models" / EXACT / OUTPUT).read_bytes() == published[OUTPUT]
    assert not (tmp_path / "models" / "converted").exists()


# --- build -------------------------------------------------------------------------------


def test_build_reproduces_the_pinned_output(hub, tmp_path, published):
    publish(hub, published)
    path = write_recipe(tmp_path)
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache")}
    assert run(["pin", path], env).exit_code == 0
    args = ["build", path, "--models-dir", tmp_path / "models", "--out-dir", tmp_path / "out"]
    result = run(args, env)
    assert result.exit_code == 0, result.output
    assert f"reproduced: sha256 {sha(published[OUTPUT])} is the published {EXACT}/{OUTPUT}" in result.stdout
    commit = checksums.read(tmp_path / "checksums" / "tiny.sha256").pins[SRC].commit
    assert "files, size and sha256 verified; sha256 and commit " + commit[:12] + " pinned)" in " ".join(
        result.stdout.split()
    )
    assert (tmp_path / "out" / OUTPUT).read_bytes() == published[OUTPUT]
    assert (tmp_path / "models" / TARGET / "target.gguf").is_file()
    assert hub.gets(OUTPUT) == []  # equal sha256: the published file is not needed
    with pytest.MonkeyPatch.context() as mp:  # the same build on an 80-column terminal: every line fits
        mp.setattr(console, "out", Console(highlight=False, width=80))
        narrow = run(args, env)
    assert narrow.exit_code == 0 and max(map(len, narrow.stdout.splitlines())) <= 80, narrow.stdout
    assert "".join(narrow.stdout.split()) == "".join(result.stdout.split())  # the same words, wrapped


def sha256sum() -> str:
    """GNU coreutils' sha256sum, which docs/recipes.md tells users to check files with: a machine
    without it fails these checks rather than skipping them."""
    found = shutil.which("sha256sum")
    if found is None:
        pytest.fail("sha256sum (GNU coreutils) is not on PATH; docs/recipes.md's checksum command needs it")
    return found


def exact_count(q4_0_bytes: np.ndarray, bits: np.ndarray) -> int:
    """Values whose decoded bf16 bits are the source's (+0 and -0 alike), computed here
    independently of core/error_stats."""
    got = bf16.from_f32(q4_0.dequantize(q4_0_bytes.reshape(-1, q4_0.BLOCK_BYTES)).ravel())
    want = bits.ravel()
    return int(np.count_nonzero((got == want) | (((got | want) & 0x7FFF) == 0)))


@pytest.fixture(scope="module")
def other_scales(tiny, tmp_path_factory) -> dict:
    """A source, our exact build of it, and the 'published' file made from the same source
    by the published method (core/published.py: its own scales, same levels), written
    over our file's Q4_0 tensor data. The source has no +8-extreme blocks: the
    published method cannot store those (the original script stops on them)."""
    root = tmp_path_factory.mktemp("other-scales")
    tensors = drafter_tensors(TinyDrafter(), seed=1, step_kind="fp32")
    for name, bits in tensors.items():
        if bits.dtype == np.uint16 and bits.ndim == 2 and not name.startswith("masked_embedding"):  # QAT matrices
            _, fitted = published_q4_0(bits)
            bits.reshape(-1, 32)[~fitted] ^= np.uint16(0x8000)  # +8 extreme -> -8: negate those blocks
    source = write_checkpoint(root / "source", drafter_config(), tensors)
    ours = convert_drafter(source, root / "ours.gguf", tiny / "target.gguf", ordered_head=False)  # as build makes it
    theirs = root / "published.gguf"
    shutil.copyfile(ours.path, theirs)
    expected = {"blocks": 0, "other_scale": 0, "exact": ours.report["exact_values"], "values": ours.report["values"]}
    with Checkpoint(source) as ckpt, open_donor(ours.path) as built, open(theirs, "r+b") as f:
        names = {gguf_tensor_name(hf): hf for hf in ckpt.tensors}
        for t in built.tensors:
            if t.type != GGMLQuantizationType.Q4_0:
                continue
            bits = ckpt.read(names[t.name])
            data, fitted = published_q4_0(bits)
            assert fitted.all(), t.name
            mine = built.read_rows(t, 0, t.rows).reshape(-1, q4_0.BLOCK_BYTES)
            expected["blocks"] += len(mine)
            expected["other_scale"] += int(np.count_nonzero((mine != data).any(axis=1)))
            expected.setdefault("published_exact", expected["exact"])
            expected["published_exact"] += exact_count(data, bits) - exact_count(mine, bits)
            # verify's block rule, by the oracle: fewer exact values, or a value further off, than our block
            theirs_exact, theirs_worst = oracle_figures(data, bits)
            ours_exact, ours_worst = oracle_figures(mine, bits)
            less = int(np.count_nonzero((theirs_exact < ours_exact) | (theirs_worst > ours_worst)))
            expected.setdefault("tensors", []).append((t.name, len(mine), less))
            f.seek(built.header.data_start + t.offset)
            f.write(data.tobytes())
    assert 0 < expected["other_scale"] < expected["blocks"] and expected["published_exact"] < expected["exact"]
    return {
        "config.json": (source / "config.json").read_bytes(),
        "model.safetensors": (source / "model.safetensors").read_bytes(),
        "target.gguf": (tiny / "target.gguf").read_bytes(),
        OUTPUT: theirs.read_bytes(),
        "ours": ours.path.read_bytes(),
        "expected": expected,
    }


def flip_a_level(gguf: bytes, tensor: str, block: int, scratch: Path) -> bytes:
    """The file with one nonzero level of ``block`` of ``tensor`` changed (levels no longer
    proportional to the original's)."""
    (scratch / "flip.gguf").write_bytes(gguf)
    with open_donor(scratch / "flip.gguf") as d:
        t = d.tensor(tensor)
        at = d.header.data_start + t.offset + block * q4_0.BLOCK_BYTES
    data = bytearray(gguf)
    levels, scale = q4_0.unpack(np.frombuffer(bytes(data[at : at + q4_0.BLOCK_BYTES]), np.uint8))
    levels = levels[0].copy()
    assert np.count_nonzero(levels) > 1
    j = int(np.flatnonzero(levels)[0])
    levels[j] = levels[j] + 1 if levels[j] < 7 else levels[j] - 1
    data[at : at + q4_0.BLOCK_BYTES] = q4_0.pack(levels[None], scale).tobytes()
    return bytes(data)


@pytest.fixture
def wide(monkeypatch):
    """Lines whole, as a terminal wider than them shows them (a narrower one gets them wrapped)."""
    monkeypatch.setattr(console, "out", Console(highlight=False, width=2000))


def test_build_tells_same_levels_from_differs(hub, tmp_path, other_scales, wide):
    files, expected = other_scales, other_scales["expected"]
    publish(hub, files)
    path = write_recipe(tmp_path)
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache")}
    assert run(["pin", path], env).exit_code == 0
    args = ["build", path, "--models-dir", tmp_path / "models", "--out-dir", tmp_path / "out"]
    result = run(args, env)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert (tmp_path / "out" / OUTPUT).read_bytes() == files["ours"]
    assert f"built      {sha(files['ours'])}" in out and f"published  {sha(files[OUTPUT])}  {EXACT}/{OUTPUT}" in out
    less = sum(n for _, _, n in expected["tensors"])
    assert 0 < less < expected["other_scale"]  # the published method's scales: some as exact, some less
    assert (
        f"same levels, less exact: every Q4_0 block holds the published file's levels; "
        f"{expected['other_scale']:,} of {expected['blocks']:,} blocks are stored with another scale, "
        f"{less:,} of them less exact than the plan"
    ) in out.splitlines()
    for name, blocks, n in expected["tensors"]:  # per tensor, as exact as the plan or not
        line = f"  {name}: {blocks - n:,} of {blocks:,} published blocks as exact as the plan"
        assert (line + (f", {n:,} less exact" if n else "")) in out.splitlines(), line
    n = expected["values"]
    built = f"{expected['exact'] / n:.4%} ({expected['exact']:,} of {n:,} values)"
    theirs = f"{expected['published_exact'] / n:.4%} ({expected['published_exact']:,} of {n:,} values)"
    assert f"bit-exact against the source, built:     {built}" in out, out
    assert f"bit-exact against the source, published: {theirs}" in out, out
    assert "metadata" not in out, out  # the same keys: only tensor data differs

    # one level changed in block 5 of blk.0.ffn_up.weight: differs, named
    broken = flip_a_level(files[OUTPUT], "blk.0.ffn_up.weight", 5, tmp_path)
    hub.commit(EXACT, {OUTPUT: broken})
    repin = run(["pin", path, "--what", "exact"], env)
    assert repin.exit_code == 0 and f"CHANGED, was {sha(files[OUTPUT])}" in repin.stdout
    result = run(args, env)
    line = one_error_line(result)
    per_row = TinyDrafter().hidden_size // 32
    assert "not reproduced: differs from the published" in line, line
    assert f"tensor blk.0.ffn_up.weight, Q4_0 block 5 (row {5 // per_row}, columns {5 % per_row * 32}.." in line
    assert f"built      {sha(files['ours'])}" in result.stdout and f"published  {sha(broken)}" in result.stdout
    assert (tmp_path / "out" / OUTPUT).is_file()  # kept for inspection


def test_compare_with_published_names_other_differences(other_scales, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_bytes(other_scales["config.json"])
    (source / "model.safetensors").write_bytes(other_scales["model.safetensors"])
    ours = tmp_path / "ours.gguf"
    ours.write_bytes(other_scales["ours"])
    assert compare_with_published(ours, ours, source).kind == "reproduced"

    def variant(name: str, change) -> Path:
        data = bytearray(other_scales["ours"])
        with open_donor(ours) as d:
            change(d, data)
        (tmp_path / name).write_bytes(bytes(data))
        return tmp_path / name

    def flip_norm_bit(d, data):  # the low byte of value 3 of an F32 norm
        data[d.header.data_start + d.tensor("blk.0.attn_norm.weight").offset + 4 * 3] ^= 1

    got = compare_with_published(ours, variant("norm.gguf", flip_norm_bit), source)
    assert (got.kind, got.difference) == (
        "differs",
        "tensor blk.0.attn_norm.weight (F32): row 0 differs (byte 12 of the row)",
    )
    assert got.built_exact is None and got.published_exact is None

    def rename(d, data):
        i = data.index(b"blk.0.attn_norm.weight")
        data[i : i + 3] = b"BLK"

    got = compare_with_published(ours, variant("renamed.gguf", rename), source)
    assert (got.kind, got.difference) == ("differs", "tensor blk.0.attn_norm.weight is in the built file only")

    def other_context_length(d, data):  # a metadata value only: the tensors are the same
        raw = d.header.fields["gemma4-assistant.context_length"].raw
        i = data.index(raw) + len(raw) - 4
        data[i : i + 4] = (8192).to_bytes(4, "little")

    got = compare_with_published(ours, variant("meta.gguf", other_context_length), source)
    assert (got.kind, got.metadata_keys, got.other_scale_blocks, got.less_exact_blocks) == (
        "same levels",
        ["gemma4-assistant.context_length"],
        0,
        0,
    )
    assert [(t.name, t.blocks, t.as_exact) for t in got.scales] == [
        (name, blocks, blocks) for name, blocks, _ in other_scales["expected"]["tensors"]
    ]
    assert got.q4_0_blocks == other_scales["expected"]["blocks"]
    assert got.built_exact.exact == got.published_exact.exact == other_scales["expected"]["exact"]


def test_build_with_vocab_from_skips_the_target(hub, tmp_path, published, tiny):
    publish(hub, published)
    path = write_recipe(tmp_path)
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache")}
    assert run(["pin", path, "--what", "source"], env).exit_code == 0
    assert run(["pin", path, "--what", "exact"], env).exit_code == 0
    result = run(
        [
            "build",
            path,
            "--models-dir",
            tmp_path / "models",
            "--out-dir",
            tmp_path / "out",
            "--vocab-from",
            tiny / "target.gguf",
        ],
        env,
    )
    assert result.exit_code == 0, result.output
    assert "reproduced" in result.stdout and hub.gets("target.gguf") == []


# --- the checked-in recipes and checksum files -------------------------------------------


def test_checked_in_recipes_and_checksums(tmp_path):
    from gguf_exact.hub.recipes import RECIPES_DIR, recipe_names

    assert {"e2b-assistant", "e4b-assistant", "e2b", "e4b"} <= set(recipe_names())
    facts = {
        "gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf": "060f5a0158f8120d25137866b90e04e21cd0d2d23de1db7a9cc3b7f00e60bd11",
        "gemma-4-E4B-it-qat-assistant-q4_0-exact.gguf": "dc965cb963e56b86fbc04db8efec83163886085e88514574650a57fa55a2ee24",
    }
    for name in ("e2b-assistant", "e4b-assistant"):
        recipe = load_recipe(name)
        cs = checksums.read(recipe.checksums)
        exact = recipe.part("exact")
        assert cs.sha256(f"{exact.repo}/{recipe.output}") == facts[recipe.output]
        assert recipe.part("source").repo.startswith("google/gemma-4-") and recipe.part("target").repo.startswith(
            "google/"
        )
    assert (
        checksums.read(load_recipe("e2b-assistant").checksums)
        .pins["google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant"]
        .commit
        == "ebc7e1a211354561464cb82ed6d886792138dcb6"
    )
    assert load_recipe("e2b").kind == "model" and (RECIPES_DIR / "e4b.toml").is_file()
    sdist = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert checksums.expected_sha256("llama_cpp_python-0.3.36.tar.gz") == sdist
    assert checksums.llama_cpp_python_sdist() == ("0.3.36", sdist, "llama_cpp_python-0.3.36.tar.gz")
    assert (
        checksums.expected_sha256(
            f"xbill9/gemma-4-E4B-it-qat-assistant-q4_0-exact-gguf/{'gemma-4-E4B-it-qat-assistant-q4_0-exact.gguf'}"
        )
        == facts["gemma-4-E4B-it-qat-assistant-q4_0-exact.gguf"]
    )
    with pytest.raises(GgufExactError, match="no sha256 pinned for it"):
        checksums.expected_sha256("nothing.gguf")
    for file in sorted(checksums.CHECKSUMS_DIR.glob("*.sha256")):  # as `pin` would write them
        assert checksums.render(checksums.read(file)) == file.read_text(), file
    for file in sorted(
        checksums.CHECKSUMS_DIR.glob("*.sha256")
    ):  # every line is one sha256sum reads (files absent here)
        check = subprocess.run([sha256sum(), "-c", "--warn", str(file)], cwd=tmp_path, capture_output=True, text=True)
        assert "improperly formatted" not in check.stderr and "no properly formatted" not in check.stderr, check.stderr
        assert check.stderr.count("No such file or directory") == len(checksums.read(file).entries), check.stderr


def test_checksum_text_round_trip_and_errors():
    text = (
        "# header\n"
        "# pin org/a revision=main commit=" + "a" * 40 + "\n" + "b" * 64 + "  org/a/x.gguf\n"
        "# pin org/b revision=v1 commit=unknown\n" + "c" * 64 + " *org/b/y.bin\n" + "d" * 64 + "  loose.tar.gz\n"
    )
    cs = checksums.parse(text)
    assert cs.header == ["# header"] and cs.pins["org/b"].commit is None and cs.sha256("org/b/y.bin") == "c" * 64
    assert checksums.parse(checksums.render(cs)) == cs
    moved = cs.with_repo(RepoPin("org/a", "main", "e" * 40), [Entry("f" * 64, "org/a/z.gguf")])
    assert (
        moved.sha256("org/a/x.gguf") is None
        and moved.sha256("org/a/z.gguf") == "f" * 64
        and moved.sha256("loose.tar.gz") == "d" * 64
    )
    with pytest.raises(GgufExactError, match=r"where:2: not a sha256sum line"):
        checksums.parse("# ok\nnot a line\n", "where")
    with pytest.raises(GgufExactError, match="is not a 40-hex commit"):
        checksums.parse("# pin org/a revision=main commit=abc\n")


@pytest.mark.parametrize(
    "change, message",
    [
        (('repo = "pub/tiny-exact-gguf"', 'repo = "not a repo"'), "is not a Hub repo id"),
        (('files = ["target.gguf"]', "files = []"), "files must be a non-empty list"),
        (('files = ["target.gguf"]', 'files = ["a.gguf", "b.gguf"]'), "the target section names the one GGUF"),
        (('kind = "drafter"', 'kind = "lora"'), "kind = 'lora'"),
        (('output = "tiny-exact.gguf"', 'output = "x/y.bin"'), "output must be a file name ending in .gguf"),
        (("[source]", "[source"), "not valid TOML"),
    ],
)
def test_recipe_errors_name_the_field(tmp_path, change, message):
    path = write_recipe(tmp_path)
    path.write_text(path.read_text().replace(*change))
    with pytest.raises(GgufExactError) as err:
        load_recipe(path)
    assert str(path) in str(err.value) and message in str(err.value)
    line = one_error_line(run(["fetch", path]))
    assert message in line
    line = one_error_line(run(["fetch", "no-such-recipe"]))
    assert "no-such-recipe" in line and "known recipes: e2b, e2b-assistant" in line


# --- hostile answers and names: refused before anything reaches a path -------------------


def outside(root: Path) -> set[str]:
    """Every path under ``root`` except the Hub cache and the models folder."""
    return {
        str(p.relative_to(root)) for p in root.rglob("*") if p.relative_to(root).parts[0] not in ("cache", "models")
    }


def cli_env(hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache")}


ESCAPE = "../../../escaped"  # from cache/models--pub--tiny-exact-gguf/blobs: tmp_path/escaped


@pytest.mark.parametrize(
    "filename, headers, after, expected",
    [
        (OUTPUT, {"X-Linked-Etag": f'"{ESCAPE}"'}, 0, f"has ETag '{ESCAPE}', neither a git id nor a sha256"),
        (OUTPUT, {"X-Repo-Commit": "not-a-commit"}, 0, "names commit 'not-a-commit' (X-Repo-Commit), not a 40-hex"),
        (OUTPUT, {"X-Repo-Commit": ESCAPE}, 0, f"names commit '{ESCAPE}' (X-Repo-Commit)"),
        # the second HEAD, made by hf_hub_download itself after ours told the truth
        ("config.json", {"ETag": f'"{ESCAPE}"'}, 1, f"has ETag '{ESCAPE}', neither a git id nor a sha256"),
        ("config.json", {"X-Repo-Commit": "0" * 39 + "g"}, 1, "not a 40-hex commit id"),
    ],
)
def test_fetch_refuses_unsafe_hub_headers(hub, tmp_path, published, filename, headers, after, expected):
    publish(hub, published)
    path = write_recipe(tmp_path)
    env = cli_env(hub, tmp_path)
    assert run(["pin", path], env).exit_code == 0
    repo = EXACT if filename == OUTPUT else SRC
    if filename == "config.json":  # not in the cache yet: pin read it through the cache
        shutil.rmtree(tmp_path / "cache")
    before = outside(tmp_path)
    hub.lie(repo, filename, headers, after=after)
    what = "exact" if repo == EXACT else "source"
    line = one_error_line(run(["fetch", path, "--what", what, "--models-dir", tmp_path / "models"], env))
    assert expected in line and f"{repo}@" in line and "nothing written" in line, line
    assert outside(tmp_path) == before and not (tmp_path / "escaped").exists()
    assert not (tmp_path / "models" / repo / filename).exists()
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.parent.name in ("blobs", "snapshots")]
    assert not [p for p in (tmp_path / "cache").rglob(filename)], cached
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.parent.name == "snapshots" and len(p.name) != 40]


def test_fetch_refuses_a_missing_file_whose_404_names_an_unsafe_commit(hub, tmp_path):
    """huggingface_hub would record the miss at .no_exist/<X-Repo-Commit>/<file>."""
    real = hub.commit(EXACT, {"other.gguf": b"GGUF other"})
    path = write_recipe(tmp_path)
    write_pins(path, real, sha(b"GGUF tiny"))
    hub.lie(EXACT, OUTPUT, {"X-Repo-Commit": ESCAPE})
    before = outside(tmp_path)
    line = one_error_line(run(["fetch", path, "--models-dir", tmp_path / "models"], cli_env(hub, tmp_path)))
    assert f"names commit '{ESCAPE}'" in line, line
    assert outside(tmp_path) == before and not list((tmp_path / "cache").rglob(".no_exist"))


@pytest.mark.parametrize(
    "lie, expected",
    [
        (
            {"siblings": [{"rfilename": "../../../escaped.gguf", "size": 4}]},
            "'../../../escaped.gguf' with an empty, '.' or '..' part",
        ),
        ({"siblings": [{"rfilename": "/abs.gguf", "size": 4}]}, "'/abs.gguf' with an absolute path"),
        ({"siblings": [{"rfilename": "..\\\\x.gguf", "size": 4}]}, "with a backslash"),
        ({"siblings": [{"rfilename": "x.gguf\n0000  y", "size": 4}]}, "with a control character"),
        ({"sha": "zz" + "0" * 38}, "commit 'zz00000000"),
        (
            {"siblings": [{"rfilename": "y.gguf", "size": 4, "lfs": {"sha256": "../x", "size": 4, "pointerSize": 1}}]},
            "sha256 '../x' is not 64",
        ),
        ({"siblings": [{"rfilename": "y.gguf", "lfs": {"size": 4}}]}, "the Hub's model info is malformed (KeyError"),
    ],
)
def test_pin_refuses_unsafe_names_in_the_hub_listing(hub, tmp_path, published, lie, expected):
    publish(hub, published)
    path = write_recipe(tmp_path)
    path.write_text(path.read_text().replace(f'files = ["{OUTPUT}"]', 'files = ["*.gguf"]'))
    hub.lie_in_listing(EXACT, **lie)
    before = outside(tmp_path)
    line = one_error_line(run(["pin", path, "--what", "exact"], cli_env(hub, tmp_path)))
    assert expected in line and EXACT in line, line
    assert outside(tmp_path) == before  # no checksum file written either
    assert not (tmp_path / "checksums").exists()


@pytest.mark.parametrize(
    "files, expected",
    [
        ('["../../../escaped.gguf"]', "has an empty, '.' or '..' part"),
        ('["/etc/passwd"]', "has an absolute path"),
        ('["sub\\\\..\\\\x.gguf"]', "has a backslash"),
        ('["C:x.gguf"]', "has an absolute path"),
        ('["a//b.gguf"]', "has an empty, '.' or '..' part"),
    ],
)
def test_recipe_file_names_must_stay_inside_the_repo(hub, tmp_path, files, expected):
    path = write_recipe(tmp_path)
    path.write_text(path.read_text().replace(f'files = ["{OUTPUT}"]', f"files = {files}"))
    before = outside(tmp_path)
    for args in (["fetch", path, "--models-dir", tmp_path / "models"], ["pin", path]):
        line = one_error_line(run(args, cli_env(hub, tmp_path)))
        assert str(path) in line and "exact section: file" in line and expected in line, line
    assert outside(tmp_path) == before and hub.requests == []


@pytest.mark.parametrize(
    "change, expected",
    [
        (('repo = "pub/tiny-exact-gguf"', 'repo = "pub/.."'), "is not a Hub repo id"),
        (('repo = "pub/tiny-exact-gguf"', 'repo = "../x"'), "is not a Hub repo id"),
        (('revision = "main"\nfiles = ["tiny', 'revision = "../../x"\nfiles = ["tiny'), "revision '../../x' has"),
        (('name = "tiny"', 'name = "../../x"'), "name = '../../x' must be"),
        (('name = "tiny"', 'name = "tiny"\nchecksums = "/etc/x.sha256"'), "checksums = '/etc/x.sha256' must be"),
        (('output = "tiny-exact.gguf"', 'output = "..\\\\x.gguf"'), "output must be a file name"),
    ],
)
def test_recipe_values_that_reach_paths_are_checked(tmp_path, change, expected):
    path = write_recipe(tmp_path)
    assert change[0] in path.read_text()
    path.write_text(path.read_text().replace(*change, 1))
    before = outside(tmp_path)
    line = one_error_line(run(["fetch", path, "--models-dir", tmp_path / "models"]))
    assert str(path) in line and expected in line, line
    assert outside(tmp_path) == before


def test_a_checksum_file_naming_a_path_outside_the_repo_is_refused(hub, tmp_path, published):
    commits = publish(hub, published)
    path = write_recipe(tmp_path)
    target = tmp_path / "checksums" / "tiny.sha256"
    target.parent.mkdir()
    target.write_text(
        f"# pin {EXACT} revision=main commit={commits['exact']}\n"
        f"{sha(published[OUTPUT])}  {EXACT}/{OUTPUT}\n"
        f"{sha(b'x')}  {EXACT}/../../../escaped.gguf\n"
    )
    path.write_text(path.read_text().replace(f'files = ["{OUTPUT}"]', 'files = ["*.gguf"]'))
    before = outside(tmp_path)
    line = one_error_line(run(["fetch", path, "--models-dir", tmp_path / "models"], cli_env(hub, tmp_path)))
    assert f"{target}: {EXACT}/../../../escaped.gguf" in line and "'..' part" in line, line
    assert outside(tmp_path) == before and not (tmp_path / "models").exists() and hub.requests == []


# --- wrong bytes do not stay in the Hub cache ----------------------------------------------


def snapshot_entries(cache: Path, name: str) -> list[Path]:
    return [p for p in cache.rglob(name) if p.parent.parent.name == "snapshots"]


def test_a_corrupt_blob_in_the_cache_is_removed_and_downloaded_again(hub, config, tmp_path, published):
    publish(hub, published)
    recipe = load_recipe(write_recipe(tmp_path))
    pin_recipe(recipe, ["exact"], config=config)
    models = tmp_path / "models"
    fetch_recipe(recipe, "exact", models, config, progress=False)
    (models / EXACT / OUTPUT).unlink()
    blob = storage_dir(EXACT, config) / "blobs" / sha(published[OUTPUT])
    bad = bytearray(blob.read_bytes())
    bad[100] ^= 1
    blob.write_bytes(bytes(bad))  # a disk error, or another tool
    gets = len(hub.gets(OUTPUT))
    got = fetch_recipe(recipe, "exact", models, config, progress=False)
    changed = (
        f"the Hub cache's copy {blob} had bytes that are not those it is named after: changed on this machine "
        "after it was verified (edited through a hard link? a disk error?); removed from the cache"
    )
    assert got[0].how == f"downloaded ({changed})" and len(hub.gets(OUTPUT)) == gets + 1
    assert blob.read_bytes() == published[OUTPUT] == (models / EXACT / OUTPUT).read_bytes()
    # offline, the same corruption: removed, and the error says so and that it is not in the cache
    (models / EXACT / OUTPUT).unlink()
    blob.write_bytes(bytes(bad))
    offline = HubConfig("http://127.0.0.1:9", config.cache_dir, offline=True)
    with pytest.raises(GgufExactError) as err:
        fetch_recipe(recipe, "exact", models, offline, progress=False)
    assert str(err.value) == (
        f"{EXACT}/{OUTPUT}: {changed}; so it is not in the Hub cache ({config.cache_dir}) and HF_HUB_OFFLINE is set; "
        "run the same command without HF_HUB_OFFLINE=1 to download it"
    )
    assert not blob.exists() and snapshot_entries(config.cache_dir, OUTPUT) == []


def test_wrong_bytes_from_hf_hub_download_are_evicted(hub, config, tmp_path, published):
    """config.json is small and kept in git: hf_hub_download transfers it; its git id is
    checked, and a mismatch removes the blob and the snapshot link."""
    commits = publish(hub, published)
    recipe = load_recipe(write_recipe(tmp_path))
    pin_recipe(recipe, ["source"], config=config)
    shutil.rmtree(config.cache_dir)
    hub.corrupt(SRC, "config.json", b'{"evil": 1}' + published["config.json"][11:])
    models = tmp_path / "models"
    with pytest.raises(GgufExactError) as err:
        fetch_recipe(recipe, "source", models, config, progress=False)
    from hubserver import git_blob_id

    msg = str(err.value)
    assert f"{SRC}/config.json: downloaded file has git id" in msg and git_blob_id(published["config.json"]) in msg
    assert "removed from the Hub cache" in msg
    storage = storage_dir(SRC, config)
    assert not (storage / "snapshots" / commits["source"] / "config.json").exists()
    assert not (storage / "blobs" / git_blob_id(published["config.json"])).exists()
    assert not (models / SRC / "config.json").exists() and leftovers(config.cache_dir) == []
    hub.corrupt(SRC, "config.json", None)
    got = fetch_recipe(recipe, "source", models, config, progress=False)
    assert [f.how for f in got] == ["downloaded", "downloaded"]
    assert (models / SRC / "config.json").read_bytes() == published["config.json"]


def test_pin_checks_what_it_reads(hub, tmp_path, published):
    commits = publish(hub, published)
    path = write_recipe(tmp_path)
    env = cli_env(hub, tmp_path)
    hub.corrupt(SRC, "config.json", b"{}" + published["config.json"][2:])
    line = one_error_line(run(["pin", path, "--what", "source"], env))
    assert f"{SRC}/config.json: downloaded file has git id" in line and "removed from the Hub cache" in line, line
    assert not (tmp_path / "checksums").exists()
    assert not snapshot_entries(tmp_path / "cache", "config.json")
    # the listing's git id and the HEAD's agree with each other but not with the bytes' size
    hub.corrupt(SRC, "config.json", None)
    hub.lie_in_listing(SRC, siblings=[])
    result = run(["pin", path, "--what", "source"], env)
    assert result.exit_code == 0, result.output
    assert f"{sha(published['config.json'])}  {SRC}/config.json  (read and hashed)" in result.stdout
    assert checksums.read(tmp_path / "checksums" / "tiny.sha256").pins[SRC].commit == commits["source"]


def test_pin_refuses_unsafe_headers_and_revisions(hub, tmp_path, published):
    publish(hub, published)
    path = write_recipe(tmp_path)
    env = cli_env(hub, tmp_path)
    hub.lie(SRC, "config.json", {"X-Repo-Commit": ESCAPE}, after=1)  # hf_hub_download's own HEAD
    before = outside(tmp_path)
    line = one_error_line(run(["pin", path, "--what", "source"], env))
    assert f"{SRC}@" in line and f"names commit '{ESCAPE}' (X-Repo-Commit)" in line, line
    assert outside(tmp_path) == before and not snapshot_entries(tmp_path / "cache", "config.json")
    line = one_error_line(run(["pin", path, "--what", "exact", "--revision", "../../x"], env))
    assert "--revision: revision '../../x' has an empty, '.' or '..' part" in line, line
    assert outside(tmp_path) == before
