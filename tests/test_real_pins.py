"""The real files' pins (issue 30): every recipe's checksum file carries the commits, sizes
and sha256 that public manifests record (tests/../shared facts, "Real files"), no recipe
promises a pin it does not have, and fetch checks size before hash against those very
pins, through the real huggingface_hub client and a loopback Hub (tests/hubserver.py)
that serves files under the real names, commits and sizes (sparse files)."""

import hashlib
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hubserver import DiskFile, FakeHub, sparse_file
from huggingface_hub import constants
from rich.console import Console

from gguf_exact.cli import console, main
from gguf_exact.hub import checksums, fetch
from gguf_exact.hub.plan import file_pins
from gguf_exact.hub.recipes import all_recipes, load_recipe

E2B_SRC = "google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant"
E2B_GGUF = "google/gemma-4-E2B-it-qat-q4_0-gguf"
E4B_GGUF = "google/gemma-4-E4B-it-qat-q4_0-gguf"
E2B_MAIN = "google/gemma-4-E2B-it-qat-q4_0-unquantized"
X2 = "xbill9/gemma-4-E2B-it-qat-assistant-q4_0-exact-gguf"
X4 = "xbill9/gemma-4-E4B-it-qat-assistant-q4_0-exact-gguf"
E2B_SRC_AT, E2B_GGUF_AT = "ebc7e1a211354561464cb82ed6d886792138dcb6", "675cff42a74c774d6cb76f76d8eacb49b48c9b93"
E4B_GGUF_AT, E2B_MAIN_AT = "4b4a2c1d584be7264f87aac328a1bc739ce81b6c", "6befbaca7398925921802abd1f277b495b78b738"

# (recipe, part, file) -> (commit, sha256, size) as the facts file's "Real files" and its
# list of published exact drafters record them; None where they record nothing.
REAL = {
    ("e2b", "source", f"{E2B_MAIN}/config.json"): (
        E2B_MAIN_AT, "bbeff1e2fd3fe282536e7ace02309d43e0dbd9b6ac4b6a149b97e3ab6942a878", 4946),
    ("e2b", "source", f"{E2B_MAIN}/model.safetensors"): (
        E2B_MAIN_AT, "33fe0cece08fb527ffefbd1a3a9ce73bd71073727993a283506293e5c6bf0137", 10208852878),
    ("e2b", "source", f"{E2B_MAIN}/tokenizer.json"): (
        E2B_MAIN_AT, "cc8d3a0ce36466ccc1278bf987df5f71db1719b9ca6b4118264f45cb627bfe0f", 32169626),
    ("e2b-assistant", "source", f"{E2B_SRC}/config.json"): (
        E2B_SRC_AT, "5d01e9f3f8e969aa8147201a26e849c05446c7c746fa918101ed0622b201db15", 2356),
    ("e2b-assistant", "source", f"{E2B_SRC}/model.safetensors"): (
        E2B_SRC_AT, "28b11aa1fef73e655107984e0024ed1b149df4b8b36dcb95f27cca603eabc960", 157565344),
    ("e2b-assistant", "exact", f"{X2}/gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf"): (
        None, "060f5a0158f8120d25137866b90e04e21cd0d2d23de1db7a9cc3b7f00e60bd11", None),
    ("e2b-assistant", "target", f"{E2B_GGUF}/gemma-4-E2B_q4_0-it.gguf"): (
        E2B_GGUF_AT, "fa401b55b07ee70a54c6dae3903c783a6e65064312529ea57175cb5f8dec6634", 3349516256),
    ("e4b", "source", "google/gemma-4-E4B-it-qat-q4_0-unquantized/config.json"): (None, None, None),
    ("e4b", "source", "google/gemma-4-E4B-it-qat-q4_0-unquantized/model*.safetensors*"): (None, None, None),
    ("e4b", "source", "google/gemma-4-E4B-it-qat-q4_0-unquantized/tokenizer*"): (None, None, None),
    ("e4b-assistant", "source", "google/gemma-4-E4B-it-qat-q4_0-unquantized-assistant/config.json"): (
        None, None, None),
    ("e4b-assistant", "source", "google/gemma-4-E4B-it-qat-q4_0-unquantized-assistant/model.safetensors"): (
        None, None, 159138208),
    ("e4b-assistant", "exact", f"{X4}/gemma-4-E4B-it-qat-assistant-q4_0-exact.gguf"): (
        None, "dc965cb963e56b86fbc04db8efec83163886085e88514574650a57fa55a2ee24", None),
    ("e4b-assistant", "target", f"{E4B_GGUF}/gemma-4-E4B_q4_0-it.gguf"): (
        E4B_GGUF_AT, "676c35070db6dbe52f93e9c864ee0fba4eddea94b9c875d9cb10daff453fbaee", 5154941280),
}  # fmt: skip
MMPROJ = (f"{E2B_GGUF}/gemma-4-E2B-it-mmproj.gguf", "021059cce659fe7f9170d5599761d7bbaf644b798dab9503aca30dc43e6beb14")


@pytest.fixture(autouse=True)
def hub_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "GGUF_EXACT_CHECKSUMS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(console, "out", Console(highlight=False, width=80))
    monkeypatch.chdir(tmp_path)


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def fits(text: str, width: int = 80) -> bool:
    return all(len(line) <= width and "\ufffd" not in line for line in text.splitlines())


def test_every_recipe_pins_what_the_manifests_record_and_nothing_more(tmp_path):
    pinned = {}
    for r in all_recipes():
        for f in file_pins(r, tmp_path):
            pinned[(r.name, f.role, f.path)] = (f.commit, f.sha256, f.size)
            # a part `recipes` calls pinned can be fetched: every file has a sha256
            state = fetch.pin_state(r, f.role)
            assert state.startswith("sha256") == all(g.sha256 for g in file_pins(r, tmp_path) if g.role == f.role), (
                r.name,
                f.role,
                state,
            )
    assert pinned == REAL
    cs = checksums.read(load_recipe("e2b-assistant").checksums)
    assert cs.sha256(MMPROJ[0]) == MMPROJ[1] and cs.size(MMPROJ[0]) == 986833664
    # where no commit is known, the pin says so ("commit=unknown"), and so do fetch and serve
    assert cs.pins[X2].commit is None and cs.pins[X2].revision == "main"
    files = fetch.pinned_files(load_recipe("e2b-assistant"), "exact", cs)
    assert files[0].pinned == "sha256 pinned, commit not pinned (from main)"
    r = run("serve", "--help")
    assert "pinned commit" not in r.output and "sha256 pinned, commit not pinned" in " ".join(r.output.split())


def test_recipes_shows_each_file_at_80_columns(tmp_path):
    sparse_file(tmp_path / "models" / E2B_GGUF / "gemma-4-E2B_q4_0-it.gguf", 10)
    r = run("recipes")
    assert r.exit_code == 0, r.output
    assert fits(r.stdout)
    lines = r.stdout.splitlines()
    at = lines.index(f"  target  {E2B_GGUF}", lines.index("e2b-assistant  (drafter for E2B targets) Gemma 4 E2B QAT MTP drafter, exact Q4_0"))  # fmt: skip
    assert lines[at + 1 : at + 4] == [
        "          sha256 and commit 675cff42a74c pinned, 1 file",
        "    gemma-4-E2B_q4_0-it.gguf: 3,349,516,256 bytes, present",
        "      commit 675cff42a74c pinned, sha256 fa401b55b07e pinned",
    ]
    at = lines.index(f"  exact   {X4}")
    assert lines[at + 1 : at + 4] == [
        "          sha256 pinned, commit not pinned (from main), 1 file",
        "    gemma-4-E4B-it-qat-assistant-q4_0-exact.gguf: size not pinned, absent",
        "      commit not pinned (main), sha256 dc965cb963e5 pinned",
    ]
    at = lines.index("  source  google/gemma-4-E4B-it-qat-q4_0-unquantized-assistant")
    assert lines[at + 1 : at + 6] == [
        "          not pinned: `gguf-exact pin e4b-assistant --what source` first",
        "    config.json: size not pinned, absent",
        "      commit not pinned (main), sha256 not pinned",
        "    model.safetensors: 159,138,208 bytes, absent",
        "      commit not pinned (main), sha256 not pinned",
    ]


def real_hub(hub: FakeHub, root: Path, target_size: int = 3349516256) -> None:
    """The E2B repos as the real Hub has them: the real names at the real commits, sparse
    files of the real sizes under the real sha256 (claimed), config.json as other bytes
    of its real size."""
    hub.commit_at(E2B_GGUF, E2B_GGUF_AT, {
        "gemma-4-E2B_q4_0-it.gguf": DiskFile(sparse_file(root / "t.gguf", target_size, b"GGUF"), REAL[("e2b-assistant", "target", f"{E2B_GGUF}/gemma-4-E2B_q4_0-it.gguf")][1]),
    })  # fmt: skip
    config = b'{"model_type": "stand-in"}'.ljust(2356, b" ")
    hub.commit_at(E2B_SRC, E2B_SRC_AT, {
        "config.json": config,
        "model.safetensors": DiskFile(sparse_file(root / "m.safetensors", 157565344, b"\x08\x00")),
    })  # fmt: skip
    hub.commit(X2, {"gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf": b"GGUF stand-in of the exact drafter"})


def test_dry_run_against_the_real_pins(tmp_path):
    with FakeHub(lifetime=60) as hub:
        real_hub(hub, tmp_path / "served")
        env = {"HF_ENDPOINT": hub.url}
        r = run("fetch", "e2b-assistant", "--what", "target", "--dry-run", env=env)
        assert r.exit_code == 0, r.output
        assert fits(r.stdout)
        assert r.stdout.splitlines() == [
            "fetch e2b-assistant --what target, dry run: nothing is downloaded",
            f"{E2B_GGUF}/gemma-4-E2B_q4_0-it.gguf",
            "  pinned  sha256 and commit 675cff42a74c pinned, 3,349,516,256 bytes",
            f"  to      models/{E2B_GGUF}/gemma-4-E2B_q4_0-it.gguf",
            "  state   would download 3,349,516,256 bytes (3.12 GiB) from commit",
            f"          {E2B_GGUF_AT}",
            "dry run: 0 of 1 files in place or cached, 1 to download (3,349,516,256 bytes)",
        ]
        assert not hub.gets("gemma-4-E2B_q4_0-it.gguf")  # a HEAD, no download
        # the published drafter: sha256 pinned, commit not pinned; the Hub's main is another file
        r = run("fetch", "e2b-assistant", "--what", "exact", "--dry-run", env=env)
        assert r.exit_code == 1
        assert fits(r.stdout)
        assert "  pinned  sha256 pinned, commit not pinned (from main), size not pinned" in r.stdout
        words = " ".join(r.stdout.split())
        assert f"state would stop: the Hub's file at commit {hub.repos[X2].refs['main']} has sha256" in words
        assert "the pin says 060f5a0158f8120d25137866b90e04e21cd0d2d23de1db7a9cc3b7f00e60bd11" in words
        assert r.stderr.strip() == "error: fetch e2b-assistant --what exact would stop at 1 of 1 files (above)"
        assert not (tmp_path / "models").exists()  # a dry run writes nothing


def test_size_is_checked_before_the_hash(tmp_path, monkeypatch):
    hashed = []
    real_sha256_file = fetch.sha256_file
    monkeypatch.setattr(fetch, "sha256_file", lambda p: hashed.append(Path(p).name) or real_sha256_file(p))
    dest = tmp_path / "models" / E2B_GGUF / "gemma-4-E2B_q4_0-it.gguf"
    sparse_file(dest, 4096)  # a file of another size where the target goes: kept, unhashed
    with FakeHub(lifetime=60) as hub:
        real_hub(hub, tmp_path / "served", target_size=3349516256 - 1)  # the Hub's file is one byte short
        r = run("fetch", "e2b-assistant", "--what", "target", env={"HF_ENDPOINT": hub.url})
        assert r.exit_code == 1
        assert r.stderr.strip().splitlines() == [
            f"error: {E2B_GGUF}/gemma-4-E2B_q4_0-it.gguf: the Hub's file at commit {E2B_GGUF_AT} is "
            "3,349,516,255 bytes, the pin says 3,349,516,256; nothing downloaded: check the revision, or run "
            "`gguf-exact pin` if the new file is intended"
        ]
        assert not hub.gets("gemma-4-E2B_q4_0-it.gguf") and hashed == []  # refused on its size alone
        assert dest.stat().st_size == 4096  # the user's file stays until a verified one replaces it


def test_the_real_hash_refuses_other_bytes_of_the_right_size(tmp_path):
    with FakeHub(lifetime=60) as hub:
        real_hub(hub, tmp_path / "served")
        r = run("fetch", "e2b-assistant", "--what", "source", env={"HF_ENDPOINT": hub.url})
        assert r.exit_code == 1
        served = hashlib.sha256(b'{"model_type": "stand-in"}'.ljust(2356, b" ")).hexdigest()
        assert r.stderr.strip().splitlines() == [
            f"error: {E2B_SRC}/config.json: the Hub's file at commit {E2B_SRC_AT} has sha256 {served}, the pin says "
            "5d01e9f3f8e969aa8147201a26e849c05446c7c746fa918101ed0622b201db15; nothing placed: check the revision, "
            "or run `gguf-exact pin` if the new file is intended"
        ]
        assert not (tmp_path / "models" / E2B_SRC / "config.json").exists()


def test_real_sizes_and_commits_with_a_test_pin_of_the_served_bytes(tmp_path):
    """The hash path to the end: the project's checksum file with only the sha256 swapped
    for the served stand-ins' (a checksum folder of the test's own), real sizes and commits."""
    with FakeHub(lifetime=90) as hub:
        real_hub(hub, tmp_path / "served")
        text = load_recipe("e2b-assistant").checksums.read_text()
        files = hub.repos[E2B_SRC].commits[E2B_SRC_AT]
        for name, real in (("config.json", REAL[("e2b-assistant", "source", f"{E2B_SRC}/config.json")][1]),
                           ("model.safetensors", REAL[("e2b-assistant", "source", f"{E2B_SRC}/model.safetensors")][1])):  # fmt: skip
            data = files[name]
            text = text.replace(real, data.sha256() if isinstance(data, DiskFile) else hashlib.sha256(data).hexdigest())
        (tmp_path / "pins").mkdir()
        (tmp_path / "pins" / "e2b-assistant.sha256").write_text(text)
        env = {"HF_ENDPOINT": hub.url, "GGUF_EXACT_CHECKSUMS": str(tmp_path / "pins")}
        r = run("fetch", "e2b-assistant", "--what", "source", env=env)
        assert r.exit_code == 0, r.output
        assert fits(r.stdout)
        assert r.stdout.splitlines()[:4] == [
            f"models/{E2B_SRC}/config.json",
            f"  downloaded, 2,356 bytes, commit {E2B_SRC_AT}",
            f"models/{E2B_SRC}/model.safetensors",
            f"  downloaded, 157,565,344 bytes, commit {E2B_SRC_AT}",
        ]
        placed = tmp_path / "models" / E2B_SRC / "model.safetensors"
        assert placed.stat().st_size == 157565344
        r = run("fetch", "e2b-assistant", "--what", "source", "--dry-run", env=env)
        assert r.exit_code == 0, r.output
        assert r.stdout.count("  state   in place, verified (size, then sha256)") == 2
        assert r.stdout.splitlines()[-1] == "dry run: 2 of 2 files in place or cached, 0 to download (0 bytes)"
        shutil.rmtree(tmp_path / "models")
        r = run("fetch", "e2b-assistant", "--what", "source", env=env | {"HF_HUB_OFFLINE": "1"})
        assert r.exit_code == 0, r.output  # from the Hub cache, checked again
        assert r.stdout.count("  from cache, ") == 2


def test_serve_refuses_a_listed_target_of_another_size_unhashed(tiny, tmp_path, monkeypatch):
    """serve's pair check reads the same pins: Google's E2B GGUF by name is held to its
    pinned size before anything hashes 3.3 GB."""
    from gguf_exact.errors import GgufExactError
    from gguf_exact.pair import checks

    hashed = []
    monkeypatch.setattr(checks, "sha256_file", lambda p: hashed.append(p) or "0" * 64)
    target = tmp_path / "gemma-4-E2B_q4_0-it.gguf"
    shutil.copy(tiny / "target.gguf", target)
    with pytest.raises(GgufExactError) as err:
        checks.check_pair(target)
    size = target.stat().st_size
    assert str(err.value) == (
        f"target {target}: {size:,} bytes, 3,349,516,256 listed in checksums/ for gemma-4-E2B_q4_0-it.gguf; "
        "the file is cut short, damaged or not the published one, download it again"
    )
    assert hashed == []


def test_every_pinned_part_resolves_on_a_hub_that_has_the_real_files(tmp_path):
    """A Hub holding every pinned file under its real name and size, at its pinned commit
    (or main where none is), with the sha256 the real Hub reports: `fetch --dry-run` of
    every part `recipes` calls pinned finds each file, of the pinned size, from that commit."""
    served = []
    with FakeHub(lifetime=60) as hub:
        for r in all_recipes():
            cs = checksums.read(r.checksums)
            for repo, pin in cs.pins.items():
                files = {}
                for e in cs.repo_entries(repo):
                    name = e.path[len(repo) + 1 :]
                    size = cs.size(e.path) or (1 << 20)
                    files[name] = DiskFile(sparse_file(tmp_path / "served" / e.path, size), e.sha256)
                if pin.commit:
                    hub.commit_at(repo, pin.commit, files)
                else:
                    hub.commit(repo, files)
        for r in all_recipes():
            for role in r.parts:
                if not fetch.pin_state(r, role).startswith("sha256"):
                    continue
                res = run("fetch", r.name, "--what", role, "--dry-run", env={"HF_ENDPOINT": hub.url})
                assert res.exit_code == 0, (r.name, role, res.output)
                words = " ".join(res.stdout.split())
                for f in file_pins(r, tmp_path / "models"):
                    if f.role == role:
                        commit = f.commit or hub.repos[f.path.rsplit("/", 1)[0]].refs["main"]
                        size = f.size or (1 << 20)
                        assert f"would download {size:,} bytes" in words and f"from commit {commit}" in words
                        served.append(f.path)
    assert len(served) == 9  # e2b: 3; e2b-assistant: 2 + 1 + 1; e4b-assistant: 1 + 1
