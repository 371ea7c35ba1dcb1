"""The Hugging Face Hub, through huggingface_hub's own client: file metadata, repository
listings, and resumable downloads into the Hub cache, with every failure turned into
one line that says what to do next.

Where files go: the standard Hub cache (``HF_HUB_CACHE``, by default
``~/.cache/huggingface/hub``) in its own layout, ``models--ORG--NAME/blobs/<etag>``,
``snapshots/<commit>/<file>`` and ``refs/<revision>``, so ``hf download``, transformers
and ``hf_hub_download(local_files_only=True)`` see the same files, and with
``HF_HUB_OFFLINE=1`` the files are found there without the network.

How resume works: a transfer is written to ``blobs/<etag>.incomplete`` under the
cache's lock for that blob (the lock file huggingface_hub itself uses). A dropped
connection is retried by huggingface_hub's ``http_get`` with an HTTP Range request from
the bytes already written; if the run still fails (or is interrupted), the partial file
stays, and the next run resumes from its size. A finished transfer whose sha256 is not
the expected one is deleted, never renamed into the cache.
"""

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx2
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get, repo_folder_name
from huggingface_hub.utils import WeakFileLock, build_hf_headers
from huggingface_hub.utils.tqdm import silent_tqdm
from huggingface_hub.utils.tqdm import tqdm as hf_tqdm

from gguf_exact import __version__
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub.checksums import COMMIT, SHA256

LARGE_FILE = 8 << 20  # files from this size on get a progress bar (on a terminal)
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubConfig:
    """Where the Hub is, where its cache is, whether to stay offline, which token."""

    endpoint: str
    cache_dir: Path
    offline: bool = False
    token: str | bool | None = None  # None: huggingface_hub's own (HF_TOKEN, `hf auth login`)

    @classmethod
    def from_env(cls) -> "HubConfig":
        """``HF_ENDPOINT``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE``, read now (not at import)."""
        endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        cache = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
        offline = (os.environ.get("HF_HUB_OFFLINE") or "").upper() in _TRUE or constants.is_offline_mode()
        return cls(endpoint.rstrip("/"), Path(cache).expanduser(), offline)


@dataclass(frozen=True)
class RemoteFile:
    """What a HEAD on ``/{repo}/resolve/{revision}/{file}`` says about a file."""

    repo: str
    filename: str
    revision: str
    commit: str
    etag: str  # sha256 for LFS files, the git blob id for others
    size: int | None
    url: str  # where to GET it (a CDN address when the Hub redirects)


@dataclass(frozen=True)
class RepoEntry:
    """One file of a repository listing (model info with ``files_metadata``)."""

    filename: str
    size: int | None
    blob_id: str | None  # git object id
    sha256: str | None  # LFS files only: from the Hub's metadata


@dataclass(frozen=True)
class RepoListing:
    repo: str
    revision: str
    commit: str
    files: dict[str, RepoEntry]


@dataclass(frozen=True)
class Download:
    """A file in the Hub cache, verified."""

    path: Path  # the blob
    commit: str
    sha256: str
    size: int
    resumed_from: int  # bytes that were already on disk when this run started
    transferred: bool  # False: it was in the cache already


def storage_dir(repo: str, config: HubConfig) -> Path:
    return config.cache_dir / repo_folder_name(repo_id=repo, repo_type="model")


def hub_error(
    err: BaseException,
    repo: str,
    revision: str | None = None,
    filename: str | None = None,
    endpoint: str = "https://huggingface.co",
    download: bool = True,
) -> GgufExactError:
    """One line for a failure talking to the Hub, naming what failed and what to do."""
    at = f"{repo}@{revision}" if revision else repo
    thing = f"{at}: {filename}" if filename else at
    status = getattr(getattr(err, "response", None), "status_code", None)
    login = "log in with `hf auth login` or set HF_TOKEN"
    if isinstance(err, GatedRepoError):
        return GgufExactError(
            f"{thing}: gated repository (HTTP {status}); accept its licence at {endpoint}/{repo} with your account, then {login}"
        )
    if isinstance(err, RevisionNotFoundError):
        return GgufExactError(
            f"{thing}: revision {revision} not found (HTTP {status}); check the revision in the recipe and the commit in its checksum file"
        )
    if isinstance(err, RemoteEntryNotFoundError):
        return GgufExactError(
            f"{thing}: no such file at this revision (HTTP {status}); check the recipe's files list and revision"
        )
    if isinstance(err, RepositoryNotFoundError):
        if status == 401:
            return GgufExactError(
                f"{thing}: not authorised (HTTP 401): the repository is private or gated, or does not exist; check the name, and {login}"
            )
        return GgufExactError(f"{thing}: repository not found (HTTP {status}); check the repo name in the recipe")
    if isinstance(err, OfflineModeIsEnabled):
        return GgufExactError(
            f"{thing}: HF_HUB_OFFLINE is set and the file is not in the Hub cache; unset it to download"
        )
    if isinstance(err, HfHubHTTPError) and status == 401:
        return GgufExactError(f"{thing}: the Hub rejected the token (HTTP 401); {login} again")
    if isinstance(err, HfHubHTTPError) and status == 403:
        return GgufExactError(
            f"{thing}: access denied (HTTP 403); check that your token may read this repository, or {login}"
        )
    if isinstance(err, HfHubHTTPError) and status is not None:
        return GgufExactError(f"{thing}: the Hub answered HTTP {status}; try again later")
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    then = (
        "and run again (downloads resume), or set HF_HUB_OFFLINE=1 to use the Hub cache"
        if download
        else "and run again"
    )
    return GgufExactError(
        f"{thing}: network error ({type(err).__name__}{': ' + detail if detail else ''}); check your connection and HF_ENDPOINT {then}"
    )


_HUB_ERRORS = (HfHubHTTPError, OfflineModeIsEnabled, httpx2.HTTPError, httpx2.InvalidURL)


def remote_file(repo: str, filename: str, revision: str, config: HubConfig) -> RemoteFile:
    """HEAD the file at ``revision``: commit, etag, size, download address."""
    if config.offline:
        raise hub_error(OfflineModeIsEnabled(), repo, revision, filename, config.endpoint)
    url = hf_hub_url(repo, filename, revision=revision, endpoint=config.endpoint)
    try:
        meta = get_hf_file_metadata(url, token=config.token, headers=_headers(config), endpoint=config.endpoint)
    except _HUB_ERRORS as err:
        raise hub_error(err, repo, revision, filename, config.endpoint) from None
    if not meta.commit_hash or not meta.etag:
        raise GgufExactError(
            f"{repo}@{revision}: {filename}: the answer from {config.endpoint} has no X-Repo-Commit or ETag header; "
            "check HF_ENDPOINT and any proxy between you and the Hub"
        )
    return RemoteFile(repo, filename, revision, meta.commit_hash, meta.etag, meta.size, meta.location or url)


def repo_listing(repo: str, revision: str, config: HubConfig) -> RepoListing:
    """The commit ``revision`` resolves to and every file's size, git id and LFS sha256,
    from the Hub's metadata (nothing is downloaded)."""
    if config.offline:
        raise GgufExactError(
            f"{repo}@{revision}: HF_HUB_OFFLINE is set; reading the Hub's file metadata needs the network"
        )
    api = HfApi(endpoint=config.endpoint, token=config.token, library_name="gguf-exact", library_version=__version__)
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
    except _HUB_ERRORS as err:
        raise hub_error(err, repo, revision, None, config.endpoint, download=False) from None
    if not info.sha or not COMMIT.fullmatch(info.sha):
        raise GgufExactError(f"{repo}@{revision}: the Hub's model info has no commit sha; check HF_ENDPOINT")
    files = {
        s.rfilename: RepoEntry(s.rfilename, s.lfs.size if s.lfs else s.size, s.blob_id, s.lfs.sha256 if s.lfs else None)
        for s in info.siblings or []
    }
    return RepoListing(repo, revision, info.sha, files)


def cached_files(
    repo: str,
    filename: str,
    config: HubConfig,
    commit: str | None = None,
    revision: str | None = None,
    sha256: str | None = None,
) -> list[Path]:
    """Files in the Hub cache that may be ``filename`` (no network, not yet verified):
    the snapshot of ``commit``, the snapshot ``refs/<revision>`` points to, the blob
    named ``sha256`` (LFS blobs are named by their sha256)."""
    storage = storage_dir(repo, config)
    commits = [commit] if commit else []
    if revision and not commit:
        ref = storage / "refs" / revision
        if ref.is_file():
            commits.append(ref.read_text().strip())
    found = [storage / "snapshots" / c / filename for c in commits]
    if sha256:
        found.append(storage / "blobs" / sha256)
    return [p for p in found if p.is_file()]


def download(
    repo: str,
    filename: str,
    revision: str,
    config: HubConfig,
    expected_sha256: str | None = None,
    progress: bool = True,
) -> Download:
    """Download ``filename`` at ``revision`` into the Hub cache, resuming a partial
    transfer; when ``expected_sha256`` is given, a file with another sha256 is refused
    (before the transfer when the Hub's ETag already says so) and nothing is kept."""
    remote = remote_file(repo, filename, revision, config)
    where = f"{repo}/{filename}"
    if expected_sha256 and SHA256.fullmatch(remote.etag) and remote.etag != expected_sha256:
        raise GgufExactError(
            f"{where}: the Hub's file at commit {remote.commit} has sha256 {remote.etag}, the pin says {expected_sha256}; "
            "nothing downloaded: check the revision, or run `gguf-exact pin` if the new file is intended"
        )
    storage = storage_dir(repo, config)
    blob = storage / "blobs" / remote.etag
    partial = blob.with_name(blob.name + ".incomplete")
    lock = config.cache_dir / ".locks" / storage.name / f"{remote.etag}.lock"
    for d in (blob.parent, lock.parent):
        d.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        resumed_from, transferred = 0, False
        if blob.is_file() and (expected_sha256 is None or sha256_file(blob) == expected_sha256):
            digest = expected_sha256 or sha256_file(blob)
        else:
            resumed_from = _transfer(remote, partial, config, progress)
            transferred = True
            digest = sha256_file(partial)
            wanted = expected_sha256 or (remote.etag if SHA256.fullmatch(remote.etag) else None)
            if wanted and digest != wanted:
                partial.unlink(missing_ok=True)
                raise GgufExactError(
                    f"{where}: downloaded file has sha256 {digest}, expected {wanted}; nothing kept: "
                    "run again, and if it repeats, check the pin against the Hub"
                )
            os.replace(partial, blob)
        _link_snapshot(storage, remote.commit, filename, blob)
        if revision != remote.commit:
            ref = storage / "refs" / revision
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(remote.commit)
    return Download(blob, remote.commit, digest, blob.stat().st_size, resumed_from, transferred)


def read_small_file(repo: str, filename: str, commit: str, config: HubConfig, blob_id: str | None = None) -> bytes:
    """A small (non-LFS) file's bytes at ``commit``, through the cache; checked against
    its git object id when given."""
    got = download(repo, filename, commit, config, progress=False)
    data = got.path.read_bytes()
    if blob_id and git_blob_id(data) != blob_id:
        raise GgufExactError(
            f"{repo}@{commit}: {filename}: content does not match its git id {blob_id}; clear it from the Hub cache and run again"
        )
    return data


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub reports for non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _headers(config: HubConfig) -> dict[str, str]:
    return build_hf_headers(token=config.token, library_name="gguf-exact", library_version=__version__)


def _transfer(remote: RemoteFile, partial: Path, config: HubConfig, progress: bool) -> int:
    """GET ``remote`` into ``partial``, from where an earlier run stopped; returns that offset."""
    start = partial.stat().st_size if partial.exists() else 0
    if remote.size is not None and start > remote.size:
        start = 0
    headers = _headers(config)
    if urlparse(remote.url).netloc != urlparse(config.endpoint).netloc:
        headers.pop("authorization", None)  # a signed CDN address: the token stays with the Hub
    try:
        with open(partial, "r+b" if partial.exists() else "wb") as f:
            f.truncate(start)
            f.seek(start)
            http_get(
                remote.url,
                f,
                resume_size=start,
                headers=headers,
                expected_size=remote.size,
                displayed_filename=remote.filename,
                tqdm_class=_ProgressBar if progress else silent_tqdm,
            )
    except HfHubHTTPError as err:
        if getattr(err.response, "status_code", None) == 416:  # the partial file is not a prefix of this file
            partial.unlink(missing_ok=True)
        raise _kept(hub_error(err, remote.repo, remote.revision, remote.filename, config.endpoint), partial) from None
    except (httpx2.HTTPError, OSError) as err:
        raise _kept(hub_error(err, remote.repo, remote.revision, remote.filename, config.endpoint), partial) from None
    return start


def _kept(err: GgufExactError, partial: Path) -> GgufExactError:
    if partial.exists() and partial.stat().st_size:
        return GgufExactError(
            f"{err}; {partial.stat().st_size:,} bytes are kept in {partial}: the next run resumes from there"
        )
    return err


def _link_snapshot(storage: Path, commit: str, filename: str, blob: Path) -> None:
    """``snapshots/<commit>/<filename>`` -> the blob (relative symlink, or a copy)."""
    pointer = storage / "snapshots" / commit / filename
    if pointer.is_file():
        return
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.unlink(missing_ok=True)  # a dangling link
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:
        shutil.copyfile(blob, pointer)


class _ProgressBar(hf_tqdm):
    """huggingface_hub's bar (on a terminal only), for large files only."""

    def __init__(self, *args, **kwargs):
        if (kwargs.get("total") or 0) < LARGE_FILE:
            kwargs["disable"] = True
        super().__init__(*args, **kwargs)
