"""``publish``: verify a file, write its release folder (the file and its model card), upload it.

The file must pass ``verify`` against its source (with the donor or the target it was
made with): a release never carries a file its own checks reject. The folder is written
through the shared write path (each file beside its place, then renamed), so nothing
half-written is left in it; the upload is one commit (:func:`gguf_exact.hub.upload.upload_folder`).
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.errors import ArgumentError, InputError, Param
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.formats.gguf_reader import open_gguf
from gguf_exact.formats.paths import check_input_folder
from gguf_exact.formats.safe_write import atomic_output, staged_outputs
from gguf_exact.gemma4.names import tensor_kind
from gguf_exact.hub.names import check_repo_id
from gguf_exact.hub.session import HubConfig
from gguf_exact.hub.upload import Uploaded, upload_folder
from gguf_exact.publish.card import CardFacts, KindFigures, model_card
from gguf_exact.quality.report import JSON_KEYS, QualityRow
from gguf_exact.repack.report import KIND_ORDER
from gguf_exact.stream.verify import Verification
from gguf_exact.version import __version__

CARD = "README.md"
SNAPSHOT = re.compile(r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})$")


@dataclass(frozen=True)
class Release:
    folder: Path
    file: Path  # the GGUF in the folder
    card: Path
    sha256: str
    size: int
    uploaded: Uploaded | None  # None: a dry run


def base_model_of(source: Path, given: str | None) -> tuple[str, str | None]:
    """(repo, revision) of the source checkpoint: ``given`` as ``REPO[@REVISION]``, else
    read from a Hub cache snapshot path (``models--OWNER--NAME/snapshots/COMMIT``)."""
    if given:
        repo, _, rev = given.partition("@")
        return check_repo_id(repo, "base_model"), rev or None
    m = SNAPSHOT.search(str(source.resolve()))
    if m:
        return f"{m['owner']}/{m['name']}", m["commit"]
    raise ArgumentError(
        f"{source}: not a Hub cache snapshot, so its repo and revision are unknown; give ",
        Param("base_model", value="OWNER/NAME@REVISION"),
    )


def license_of(source: Path, given: str | None) -> str:
    """``given``, else the ``license:`` of the source's own README.md front matter."""
    if given:
        return given
    readme = source / CARD
    if readme.is_file():
        text = readme.read_text(encoding="utf-8", errors="replace")
        if text.startswith("---\n"):
            m = re.search(r"^license:\s*['\"]?([^'\"\n]+)", text.split("\n---", 1)[0], re.M)
            if m:
                return m.group(1).strip()
    raise ArgumentError(f"{readme}: no license in its front matter; give ", Param("license"))


def exactness_by_kind(path: Path, v: Verification) -> list[KindFigures]:
    """``verify``'s figures summed per kind of tensor (the re-pack report's rows)."""
    with open_gguf(path) as g:
        ndim = {t.name: len(t.ne) for t in g.tensors}
    groups: dict[str, list] = {}
    for t in v.tensors:
        groups.setdefault(tensor_kind(t.name, ndim.get(t.name, 1)), []).append(t)
    rows = []
    for kind in sorted(groups, key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER)):
        checks = groups[kind]
        measured = [c for c in checks if c.measured]
        values = sum(c.n_values for c in checks)
        exact = sum(c.exact for c in measured)
        counted = sum(c.n_values for c in measured)
        types = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in Counter(c.type for c in checks).most_common())
        ulps = max((c.max_ulps for c in measured), default=None)
        rows.append(KindFigures(kind, len(checks), types, values, exact / counted if counted else None, ulps))
    return rows


def _commands(
    writer: str, file: str, sha: str, base: str, rev: str | None, with_name: str, src: str
) -> tuple[list[str], list[str]]:
    download = f"hf download {base}" + (f" --revision {rev}" if rev else "") + f" --local-dir {src}"
    bf16 = " --bf16" if writer.endswith("--bf16") else ""
    if writer.startswith("repack"):
        make = f"gguf-exact repack{bf16} --donor {with_name} --source {src} {file} --expect-sha256 {sha}"
        check = f"gguf-exact verify {file} --source {src} --donor {with_name}"
    else:
        make = f"gguf-exact convert{bf16} {src} {file} --vocab-from {with_name} --expect-sha256 {sha}"
        check = f"gguf-exact verify {file} --source {src} --vocab-from {with_name}"
    return [download, make], [f"echo '{sha}  {file}' | sha256sum -c", check]


def _write_folder(folder: Path, file: Path, card: str) -> tuple[Path, Path]:
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder}: the release folder path is not a folder")
    if not folder.parent.is_dir():
        raise InputError(f"{folder}: its parent folder {folder.parent} does not exist")
    if folder.is_dir():
        others = sorted(p.name for p in folder.iterdir() if p.name not in (file.name, CARD))
        if others:
            raise InputError(f"{folder}: holds other files ({', '.join(others[:4])}); name an empty or new folder")
    folder.mkdir(exist_ok=True)
    placed = folder / file.name
    with staged_outputs():  # the model and its card renamed into place together, or neither
        if not (placed.exists() and placed.resolve() == file.resolve()):
            with atomic_output(placed) as tmp:
                shutil.copyfile(file, tmp)
        with atomic_output(folder / CARD) as tmp:
            tmp.write_text(card, encoding="utf-8")
    return placed, folder / CARD


@dataclass(frozen=True)
class PublishRequest:
    """A release of ``file`` to ``repo``: verified against ``source`` with ``donor`` (a
    re-pack) or ``vocab_from`` (a drafter), written to the folder ``out`` (default: the
    repo's name), uploaded unless ``dry_run``. ``quality``: ``quality --json``'s output (a
    path) or its rows, for the card's quality table; ``base_model`` (``REPO[@REVISION]``),
    ``license`` and ``quantized_by`` for the card (defaults: :func:`base_model_of`,
    :func:`license_of`, the repo's owner)."""

    file: str | Path
    repo: str
    source: str | Path
    donor: str | Path | None = None
    vocab_from: str | Path | None = None
    out: str | Path | None = None
    quality: str | Path | tuple[QualityRow, ...] | None = None
    base_model: str | None = None
    license: str | None = None
    quantized_by: str | None = None
    dry_run: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.quality, list):
            object.__setattr__(self, "quality", tuple(self.quality))


def publish_release(request: PublishRequest, config: HubConfig | None = None) -> Release:
    """Verify the request's file against its source, write the release folder with the
    file and its model card, and upload it to the repo in one commit (through ``config``,
    default :meth:`HubConfig.from_env`) unless it is a dry run."""
    from gguf_exact.verify import verify_file

    r = request
    donor, vocab_from, quality = r.donor, r.vocab_from, r.quality

    file, source = Path(r.file), Path(r.source)
    repo = check_repo_id(r.repo, "repo")
    if not file.is_file():
        raise InputError(f"{file}: no such GGUF file")
    check_input_folder(source)
    if (donor is None) == (vocab_from is None):
        raise ArgumentError(
            "give ", Param("donor"), " (a re-pack) or ", Param("vocab_from"), " (a drafter), one of them"
        )
    rows = list(quality) if isinstance(quality, tuple) else _read_quality(Path(quality)) if quality is not None else []
    base, rev = base_model_of(source, r.base_model)
    lic = license_of(source, r.license)
    v = verify_file(file, source, vocab_from, donor)
    problem = v.error()
    if problem:
        raise problem
    sha256 = v.sha256
    assert sha256 is not None  # verify_file hashes the file it verified
    given = donor if donor is not None else vocab_from
    assert given is not None  # one of the two, checked above
    with_path = Path(given)
    role = "donor (header and metadata)" if donor else "target (vocabulary)"
    src = base.split("/", 1)[1]
    reproduce, check = _commands(v.writer, file.name, sha256, base, rev, with_path.name, src)
    use = (
        [f"llama-server -m {file.name}"]
        if v.writer.startswith("repack")
        else [f"llama-server -m {with_path.name} -md {file.name} --spec-type draft-mtp --spec-draft-n-max 2"]
    )
    facts = CardFacts(
        repo, file.name, file.stat().st_size, sha256, v.writer, lic, base, rev, r.quantized_by or repo.split("/")[0],
        [(role, with_path.name, with_path.stat().st_size, sha256_file(with_path))], exactness_by_kind(file, v),
        v.verdict().replace(str(file), file.name).replace(f"against {source}", f"against {src}"), reproduce, check, use, f"gguf-exact {__version__}", rows,
        "Measured with `gguf-exact quality`: llama-perplexity `--kl-divergence` against the bf16 reference "
        "(`--bf16`: the same header over the source's own bytes)",
    )  # fmt: skip
    folder = Path(r.out) if r.out is not None else Path(repo.split("/", 1)[1])
    placed, card = _write_folder(folder, file, model_card(facts))
    uploaded = None
    if not r.dry_run:
        uploaded = upload_folder(
            folder, repo, f"Upload {file.name} ({v.writer}, gguf-exact {__version__})", config or HubConfig.from_env()
        )
    return Release(folder, placed, card, sha256, facts.size, uploaded)


def _read_quality(path: Path) -> list[QualityRow]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [QualityRow(**{k: f[k] for k in JSON_KEYS}) for f in data["files"]]
    except FileNotFoundError:
        raise InputError(f"{path}: no such quality file (write it with `gguf-exact quality ... --json`)") from None
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not the JSON `gguf-exact quality --json` prints ({type(e).__name__}: {e})") from None
