"""``publish``: the release folder and its model card, uploaded through the real huggingface_hub
client to the loopback Hub (tests/hubserver.py, upload side), fetched back and verified."""

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hubserver import FakeHub
from huggingface_hub import constants

from gguf_exact.cli import main
from gguf_exact.errors import GgufExactError, HubError, NotExactError
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub.fetch import PinnedFile, fetch_file
from gguf_exact.hub.session import HubConfig
from gguf_exact.publish.release import PublishRequest, publish_release
from gguf_exact.quality.report import QualityRow
from gguf_exact.repack.pipeline import repack_model
from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint
from gguf_exact.verify import verify_file

REPO, BASE = "pub/tiny-exact-gguf", "google/tiny-qat@" + "ab" * 20


@pytest.fixture(autouse=True)
def hub_env(monkeypatch, tmp_path):
    """No token from the developer's machine; the fake Hub does not speak xet."""
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("publish")
    write_main_checkpoint(root / "src", TINY, seed=0)
    write_donor(root / "donor.gguf", root / "src", TINY)
    repack_model(root / "donor.gguf", root / "src", root / "exact.gguf")
    return root


@pytest.fixture
def hub():
    with FakeHub(lifetime=60) as h:
        yield h


def publish(file: Path, repo: str, source: Path, config: HubConfig | None = None, **fields):
    """:func:`publish_release` of the request these fields make."""
    return publish_release(PublishRequest(file, repo, source, **fields), config)


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card[4:].split("\n---\n", 1)[0])


def test_publish_uploads_one_commit_that_fetches_back_and_verifies(model, hub, tmp_path):
    config = HubConfig(hub.url, tmp_path / "cache", token=hub.token)
    rel = publish(
        model / "exact.gguf", REPO, model / "src", donor=model / "donor.gguf", out=tmp_path / "release",
        base_model=BASE, license="apache-2.0", config=config,
    )  # fmt: skip
    sha = sha256_file(model / "exact.gguf")
    assert rel.sha256 == sha and rel.size == (model / "exact.gguf").stat().st_size
    assert sorted(p.name for p in (tmp_path / "release").iterdir()) == ["README.md", "exact.gguf"]
    commit = rel.uploaded.commit
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and hub.repos[REPO].refs["main"] == commit
    assert sorted(hub.repos[REPO].commits[commit]) == [".gitattributes", "README.md", "exact.gguf"]
    # the protocol huggingface_hub spoke: repo, README check, preupload, LFS batch and PUT, one commit
    posts = [(r.method, r.path) for r in hub.requests if r.method in ("POST", "PUT")]
    assert posts[0] == ("POST", "/api/repos/create") and ("POST", "/api/validate-yaml") in posts
    assert ("POST", f"/api/models/{REPO}/preupload/main") in posts
    assert ("POST", f"/{REPO}.git/info/lfs/objects/batch") in posts and ("PUT", f"/lfs-upload/{sha}") in posts
    assert [p for p in posts if "/commit/" in p[1]] == [("POST", f"/api/models/{REPO}/commit/main")]
    # fetched back at that commit: the same bytes, and verify passes
    pinned = PinnedFile(REPO, "exact.gguf", sha, commit, commit)
    got = fetch_file(pinned, tmp_path / "fetched.gguf", HubConfig(hub.url, tmp_path / "cache2", token=False), False)
    assert got.commit == commit and sha256_file(got.path) == sha
    assert verify_file(got.path, model / "src", donor=model / "donor.gguf").ok()


def test_model_card_holds_the_evidence(model, tmp_path):
    rows = [
        QualityRow("exact.gguf", 0.0077, 0.05, 0.71, 1.01, 3380352),
        QualityRow("donor.gguf", 0.068, 0.4, 0.27, 1.2, 3516800),
    ]
    rel = publish(
        model / "exact.gguf", REPO, model / "src", donor=model / "donor.gguf", out=tmp_path / "r", quality=rows,
        base_model=BASE, license="apache-2.0", quantized_by="someone", dry_run=True,
    )  # fmt: skip
    assert rel.uploaded is None
    card = rel.card.read_text()
    meta = front_matter(card)
    assert meta["license"] == "apache-2.0" and meta["base_model"] == "google/tiny-qat"
    assert meta["quantized_by"] == "someone" and meta["library_name"] == "gguf" and "gguf" in meta["tags"]
    sha = sha256_file(model / "exact.gguf")
    assert f"| `exact.gguf` | {rel.size:,} | `{sha}` |" in card
    assert f"`google/tiny-qat@{'ab' * 20}`" in card
    assert f"sha256 `{sha256_file(model / 'donor.gguf')}`" in card
    assert "| layer matrices | 64 | Q4_0 x64 | 5,668,864 |" in card  # TINY: 64 layer matrices
    assert "| donor.gguf | 0.068000 | 0.400000 | 27.00% | 1.2000 | 3,516,800 |" in card
    assert f"gguf-exact repack --donor donor.gguf --source tiny-qat exact.gguf --expect-sha256 {sha}" in card
    assert "gguf-exact verify exact.gguf --source tiny-qat --donor donor.gguf" in card
    assert "verify: PASS" in card


def test_bf16_reference_card_reproduces_with_bf16(model, tmp_path):
    repack_model(model / "donor.gguf", model / "src", tmp_path / "ref.gguf", bf16_reference=True)
    rel = publish(
        tmp_path / "ref.gguf", REPO, model / "src", donor=model / "donor.gguf", out=tmp_path / "r",
        base_model=BASE, license="apache-2.0", dry_run=True,
    )  # fmt: skip
    card = rel.card.read_text()
    assert "gguf-exact repack --bf16 --donor donor.gguf" in card and "| layer matrices | 64 | BF16 x64 |" in card


def test_a_file_that_fails_verify_is_not_published(model, hub, tmp_path):
    config = HubConfig(hub.url, tmp_path / "cache", token=hub.token)
    with pytest.raises(NotExactError):  # the donor is no exact re-pack of itself
        publish(
            model / "donor.gguf", REPO, model / "src", donor=model / "donor.gguf", out=tmp_path / "r",
            base_model=BASE, license="apache-2.0", config=config,
        )  # fmt: skip
    assert not (tmp_path / "r").exists() and hub.requests == []


def test_a_wrong_token_is_one_hub_error(model, hub, tmp_path):
    config = HubConfig(hub.url, tmp_path / "cache", token="hf_wrong")
    with pytest.raises(HubError, match="HTTP 401"):
        publish(
            model / "exact.gguf", REPO, model / "src", donor=model / "donor.gguf", out=tmp_path / "r",
            base_model=BASE, license="apache-2.0", config=config,
        )  # fmt: skip
    assert REPO not in hub.repos


def test_cli_publish(model, hub, tmp_path):
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": hub.token, "HF_HUB_DISABLE_XET": "1"}
    args = ["publish", str(model / "exact.gguf"), "--repo", REPO, "--source", str(model / "src")]
    args += ["--donor", str(model / "donor.gguf"), "--out", str(tmp_path / "r"), "--base-model", BASE]
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        missing = CliRunner().invoke(main, args)
        assert missing.exit_code == 1 and "--license" in missing.output  # the tiny source has no README.md
        res = CliRunner().invoke(main, [*args, "--license", "apache-2.0"])
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert res.exit_code == 0, res.output
    commit = hub.repos[REPO].refs["main"]
    assert f"uploaded to {REPO} at commit {commit}" in res.output
    assert hashlib.sha256(hub.repos[REPO].commits[commit]["exact.gguf"]).hexdigest() == sha256_file(
        model / "exact.gguf"
    )
    assert json.loads(json.dumps(front_matter(hub.repos[REPO].commits[commit]["README.md"].decode())))["base_model"]


def test_a_card_that_cannot_be_written_leaves_the_release_folder_without_the_model(model, tmp_path):
    """The model and its card are renamed into place together: a card that cannot be placed
    (here a folder in its way) leaves neither, and no temp file."""
    folder = tmp_path / "r"
    (folder / "README.md").mkdir(parents=True)
    with pytest.raises(GgufExactError, match="README.md"):
        publish(
            model / "exact.gguf", REPO, model / "src", donor=model / "donor.gguf", out=folder,
            base_model=BASE, license="apache-2.0", dry_run=True,
        )  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["README.md"] and (folder / "README.md").is_dir()
