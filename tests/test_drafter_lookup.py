"""Finding the drafter for a target (gguf_exact.engines.drafter_lookup): its size from the
header, the recipes' exact file in models/, any fitting drafter beside it, and
--fetch-draft through the real huggingface_hub client against a loopback Hub."""

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hubserver import FakeHub
from huggingface_hub import constants

from gguf_exact.cli import load_groups, main
from gguf_exact.cli.app import message
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.engines.drafter_lookup import find_drafter, resolve_drafter
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.gguf_reader import open_gguf
from gguf_exact.gemma4.sizes import SIZES
from gguf_exact.hub import checksums
from gguf_exact.hub.checksums import Checksums, Entry, RepoPin
from gguf_exact.hub.session import HubConfig
from gguf_exact.pair.geometry import Geometry, identify_size
from gguf_exact.tiny.full_size import write_full_size_drafter, write_full_size_target
from gguf_exact.tiny.models import write_agreeing_pair
from gguf_exact.tiny.structural import write_structural_pair

REPO, FILE = "pub/e2b-exact-gguf", "e2b-exact.gguf"


def size_of(path: Path):
    with open_gguf(path) as g:
        return identify_size(Geometry.from_gguf(g))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lookup")
    out = {}
    (root / "full").mkdir()
    for size in ("E2B", "E4B"):
        out[size] = write_full_size_target(root / "full" / f"{size}.gguf", size)
        out[size + "-drafter"] = write_full_size_drafter(root / f"{size}-drafter.gguf", size, out[size])
    for size in SIZES:
        p = write_structural_pair(root / "structural" / size, size)
        (root / "drafters" / size).mkdir(parents=True)
        out["s-" + size] = p.target
        out["s-" + size + "-drafter"] = convert_drafter(
            p.drafter_hf, root / "drafters" / size / "drafter.gguf", vocab_from=p.target
        ).path
    target, hf = write_agreeing_pair(root / "tiny")
    out["tiny"] = target
    out["tiny-drafter"] = convert_drafter(hf, root / "tiny" / "drafter.gguf", vocab_from=target).path
    return out


def test_identify_sizes(models):
    for size in ("E2B", "E4B"):
        m = size_of(models[size])
        assert (m.name, m.exact, m.label) == (size, True, f"Gemma 4 {size}")
    for size in SIZES:
        m = size_of(models["s-" + size])
        assert m.name == size and not m.exact
        assert m.differences[0] == f"embedding_length 128, not {SIZES[size].target.hidden_size}"
        assert m.label.startswith(f"Gemma 4 {size} in structure at other widths: embedding_length 128")
    tiny = size_of(models["tiny"])
    assert (tiny.name, tiny.label) == (None, "no Gemma 4 size (5 layers, width 128)")


def write_recipe(folder: Path, sha: str | None, commit: str | None = None) -> Path:
    """A drafter recipe for E2B targets in its own recipes folder, its exact file pinned."""
    (folder / "convert").mkdir(parents=True, exist_ok=True)
    (folder / "convert" / "e2b-test.toml").write_text(
        f"""name = "e2b-test"
kind = "drafter"
size = "E2B"
output = "{FILE}"

[source]
repo = "google/e2b-assistant"
revision = "main"
files = ["config.json"]

[exact]
repo = "{REPO}"
revision = "main"
files = ["{FILE}"]
"""
    )
    if sha is not None:
        cs = Checksums(pins={REPO: RepoPin(REPO, "main", commit)}, entries=[Entry(sha, f"{REPO}/{FILE}")])
        (folder / "checksums").mkdir(exist_ok=True)
        checksums.write(folder / "checksums" / "e2b-test.sha256", cs)
    return folder / "convert"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_recipe_file_in_models_dir(models, tmp_path):
    target, drafter = models["E2B"], models["E2B-drafter"]
    recipes = write_recipe(tmp_path, sha(drafter))
    placed = tmp_path / "models" / REPO / FILE
    placed.parent.mkdir(parents=True)
    os.link(drafter, placed)
    found = find_drafter(target, tmp_path / "models", recipes_dir=recipes)
    assert found.path == placed and found.size.name == "E2B"
    assert found.how == f"recipe e2b-test's exact drafter in {tmp_path / 'models'}/, sha256 as pinned"


def test_fitting_drafter_beside_the_target(models, tmp_path):
    found = find_drafter(models["tiny"], tmp_path / "no-models")
    assert found.path == models["tiny-drafter"] and found.size.name is None
    assert found.how == f"a gemma4-assistant GGUF for this target, found in {models['tiny'].parent}/"
    # every size's structural drafter in one models folder, all 128 wide with the same vocabulary:
    # only the one whose layers read the target's KV rows at their width fits
    for size in SIZES:
        assert find_drafter(models["s-" + size], models["s-E2B-drafter"].parents[1]).path == models[f"s-{size}-drafter"]


def test_no_drafter_is_one_line_that_says_what_to_do(models, tmp_path):
    lonely = tmp_path / "alone" / "E4B.gguf"
    lonely.parent.mkdir()
    os.link(models["E4B"], lonely)  # a hard link: a copy would write the sparse file's 3 GB of zeros
    with pytest.raises(GgufExactError) as e:
        find_drafter(lonely, tmp_path / "models")
    assert message(e.value, load_groups()["serve"]) == (
        f"no MTP drafter for {lonely} (Gemma 4 E4B) in {tmp_path / 'models'}/ or beside it; fetch it with "
        "--fetch-draft (recipe e4b-assistant, pinned and hash-checked) or `gguf-exact fetch e4b-assistant`, "
        "pass --draft FILE, or serve the target alone with --no-draft"
    )
    assert str(e.value).endswith("fetch it with fetch=True (recipe e4b-assistant, pinned and hash-checked) or "
        "`gguf-exact fetch e4b-assistant`, pass draft FILE, or serve the target alone with no_draft=True")  # fmt: skip
    tiny = tmp_path / "alone" / "tiny.gguf"
    shutil.copy(models["tiny"], tiny)
    with pytest.raises(GgufExactError, match=r"\(no Gemma 4 size \(5 layers, width 128\)\).*no recipe can fetch"):
        find_drafter(tiny, tmp_path / "models", fetch=True)
    assert resolve_drafter(tiny, None, no_draft=True).path is None
    assert resolve_drafter(tiny, None, default_auto=False).path is None
    with pytest.raises(GgufExactError, match="not both"):
        resolve_drafter(tiny, "x.gguf", no_draft=True)


# --- --fetch-draft against a loopback Hub --------------------------------------------------


@pytest.fixture
def hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with FakeHub(lifetime=60) as h:
        yield h


def test_fetch_draft_pinned_and_checked(models, hub, tmp_path):
    """The structural E2B target is E2B in structure: the E2B recipe's exact file (here that
    target's own drafter) comes from the pinned commit, hash-checked, into models/<repo>/."""
    target, drafter = models["s-E2B"], models["s-E2B-drafter"]
    data = drafter.read_bytes()
    commit = hub.commit(REPO, {FILE: data})
    hub.commit(REPO, {FILE: b"GGUF moved on"})  # main moved: the pinned commit still serves the file
    recipes = write_recipe(tmp_path, hashlib.sha256(data).hexdigest(), commit)
    config = HubConfig(hub.url, tmp_path / "hf-cache", token=False)
    lonely = tmp_path / "target" / "E2B-structural.gguf"
    lonely.parent.mkdir()
    shutil.copy(target, lonely)
    models_dir = tmp_path / "models"
    with pytest.raises(GgufExactError, match="fetch it with fetch=True"):
        find_drafter(lonely, models_dir, recipes_dir=recipes, config=config)
    got = find_drafter(lonely, models_dir, fetch=True, recipes_dir=recipes, config=config, progress=False)
    assert got.path == models_dir / REPO / FILE and got.path.read_bytes() == data
    assert got.how == f"recipe e2b-test: downloaded, size and sha256 checked; sha256 and commit {commit[:12]} pinned"
    assert [r.path for r in hub.requests if "/resolve/" in r.path][-1] == f"/{REPO}/resolve/{commit}/{FILE}"
    again = find_drafter(lonely, models_dir, fetch=True, recipes_dir=recipes, config=config)
    assert again.how.startswith("recipe e2b-test's exact drafter in") and again.path == got.path


def test_fetch_draft_converts_the_checkpoint_with_its_ordered_head(models, hub, tmp_path):
    """Where the recipe pins the checkpoint too, --fetch-draft does what `gguf-exact fetch` does:
    the checkpoint converted here with its ordered head (the published file, without one, lends
    its vocabulary), found there the next time before the published file."""
    target, published = models["s-E2B"], models["s-E2B-drafter"]
    hf = target.parent / "drafter-hf"
    headless = convert_drafter(hf, tmp_path / "headless.gguf", target, ordered_head=False).path
    source = {f: (hf / f).read_bytes() for f in ("config.json", "model.safetensors")}
    src_commit = hub.commit("google/e2b-assistant", source)
    commit = hub.commit(REPO, {FILE: headless.read_bytes()})
    recipes = write_recipe(tmp_path, sha(headless), commit)
    (recipes / "e2b-test.toml").write_text(
        (recipes / "e2b-test.toml").read_text().replace('files = ["config.json"]', 'files = ["config.json", "model.safetensors"]')
    )
    pins = checksums.read(tmp_path / "checksums" / "e2b-test.sha256")
    pins.pins["google/e2b-assistant"] = RepoPin("google/e2b-assistant", "main", src_commit)
    pins.entries += [Entry(hashlib.sha256(d).hexdigest(), f"google/e2b-assistant/{f}") for f, d in source.items()]
    checksums.write(tmp_path / "checksums" / "e2b-test.sha256", pins)
    config = HubConfig(hub.url, tmp_path / "hf-cache", token=False)
    models_dir = tmp_path / "models"
    dry = find_drafter(target, models_dir, fetch=True, recipes_dir=recipes, config=config, dry_run=True)
    assert dry.would_fetch == models_dir / "converted" / FILE and not models_dir.exists()
    got = find_drafter(target, models_dir, fetch=True, recipes_dir=recipes, config=config, progress=False)
    assert got.path == models_dir / "converted" / FILE and got.how.endswith("with its ordered-embedding head")
    assert got.path.read_bytes() == published.read_bytes()  # what convert makes of the checkpoint, head and all
    with open_gguf(got.path) as g:
        assert "masked_embd_ordering" in {t.name for t in g.tensors}
    assert (models_dir / REPO / FILE).read_bytes() == headless.read_bytes()  # the published file, as pinned
    again = find_drafter(target, models_dir, recipes_dir=recipes, config=config)
    assert again.path == got.path and "converted with its ordered-embedding head" in again.how


def test_fetch_draft_refuses_bytes_that_differ(models, hub, tmp_path):
    data = models["s-E2B-drafter"].read_bytes()
    commit = hub.commit(REPO, {FILE: data})
    recipes = write_recipe(tmp_path, hashlib.sha256(data).hexdigest(), commit)
    hub.corrupt(REPO, FILE, data[:-1] + b"\x01")
    config = HubConfig(hub.url, tmp_path / "hf-cache", token=False)
    with pytest.raises(GgufExactError, match="sha256"):
        find_drafter(models["s-E2B"], tmp_path / "models", fetch=True, recipes_dir=recipes, config=config)
    assert not (tmp_path / "models" / REPO / FILE).exists()


@pytest.mark.bindings
def test_serve_and_chat_cli(models, hub, tmp_path):
    """serve --fetch-draft --dry-run through the CLI, and what serve and chat say without a drafter."""
    target, drafter = models["s-E2B"], models["s-E2B-drafter"]
    data = drafter.read_bytes()
    commit = hub.commit(REPO, {FILE: data})
    recipes = write_recipe(tmp_path, hashlib.sha256(data).hexdigest(), commit)
    lonely = tmp_path / "target" / "E2B-structural.gguf"
    lonely.parent.mkdir()
    shutil.copy(target, lonely)
    env = {
        "GGUF_EXACT_RECIPES": str(recipes),
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "GGUF_EXACT_RUN_DIR": str(tmp_path / "run"),
    }
    base = ["serve", "--model", str(lonely), "--profile", "cpu", "--models-dir", str(tmp_path / "models"), "--dry-run"]
    r = CliRunner().invoke(main, base, env=env)
    assert r.exit_code == 1
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("error: no MTP drafter for") and "--fetch-draft" in line and "--no-draft" in line
    r = CliRunner().invoke(main, [*base, "--fetch-draft"], env=env)  # a dry run downloads nothing
    assert r.exit_code == 0, r.output
    placed = tmp_path / "models" / REPO / FILE
    assert f"drafter: recipe e2b-test: would be fetched to {placed} (pinned, sha256 checked)" in r.output
    assert "--model-draft" not in r.output and "run without --dry-run to fetch it" in r.output
    assert not placed.exists() and not (tmp_path / "hf-cache").exists() and hub.gets(FILE) == []
    config = HubConfig(hub.url, tmp_path / "hf-cache", token=False)
    found = find_drafter(lonely, tmp_path / "models", fetch=True, recipes_dir=recipes, config=config, progress=False)
    assert found.path == placed
    assert found.how == f"recipe e2b-test: downloaded, size and sha256 checked; sha256 and commit {commit[:12]} pinned"
    r = CliRunner().invoke(main, [*base, "--fetch-draft"], env=env)  # now it is there: found, not fetched
    assert r.exit_code == 0, r.output
    assert f"drafter  {placed}  gemma4-assistant" in r.output
    assert f"--model-draft {placed.resolve()}" in r.output
    alone = CliRunner().invoke(main, [*base, "--no-draft"], env=env)
    assert alone.exit_code == 0 and "--model-draft" not in alone.output
    assert "drafter: --no-draft: the target alone" in alone.output
    # chat: the same lookup, then the in-process engine (the tiny pair, drafter beside the target)
    chat = CliRunner().invoke(
        main, ["chat", "--model", str(models["tiny"]), "--set", "ctx-size=512", "--max-tokens", "8"], input="/exit\n"
    )
    assert chat.exit_code == 0, chat.output
    assert f"drafter {models['tiny-drafter']} (a gemma4-assistant GGUF for this target" in chat.output
    assert "target.gguf + drafter.gguf: context 512 tokens; draft adaptive, up to n-max 4" in chat.output


def test_check_pair_refuses_a_drafter_reading_other_kv_widths(models):
    """Width and vocabulary agree (128, 320 tokens) but E4B's assistant has two KV heads: its
    layers would view E2B's one-head cache rows at twice their width."""
    from gguf_exact.pair.checks import check_pair

    with pytest.raises(GgufExactError) as e:
        check_pair(models["s-E2B"], models["s-E4B-drafter"])
    assert str(e.value) == (
        f"drafter {models['s-E4B-drafter']}: layer 0 (sliding) reads the target's layer 33 KV cache, whose K rows "
        f"are 32 wide, with K rows 64 wide (head_count_kv x key/value length) ({models['s-E2B']}); use the assistant "
        "made for this target size"
    )
    assert check_pair(models["s-E4B"], models["s-E4B-drafter"]).drafter is not None
