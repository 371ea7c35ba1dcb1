"""The Hugging Face Hub through huggingface_hub's public API: file metadata
(``get_hf_file_metadata``), listings (``HfApi.model_info``), the cache
(``try_to_load_from_cache``) and downloads (``hf_hub_download``: its cache layout,
locks, xet transfers where the Hub serves them). Every download is checked against
what the Hub's metadata says, and against the pin when there is one; every failure
is one line that says what to do next.

What is our own, and why:

- **Header checks.** huggingface_hub names cache paths after the Hub's answers:
  ``blobs/<ETag>``, ``snapshots/<X-Repo-Commit>``, ``.no_exist/<X-Repo-Commit>/...``,
  and does not check those values (in 2.4.0 an ETag of ``../../x`` names a file
  outside the cache). :func:`guarded` adds a response hook to huggingface_hub's own
  HTTP session that refuses, before huggingface_hub reads them, a commit that is not
  40 hex digits and an ETag that is not a git id or a sha256, on every ``/resolve/``
  answer (also the second HEAD that ``hf_hub_download`` makes itself).
- **Resume across runs, plain HTTP only.** huggingface_hub 2.x downloads into a
  per-process temporary file and deletes it when the transfer fails
  (huggingface_hub PR #4228), so an interrupted multi-GB download starts again from
  zero; within one run it does resume a dropped connection with a Range request.
  For LFS files that the Hub serves over plain HTTP (no xet: mirrors,
  ``HF_HUB_DISABLE_XET=1``, repositories not on xet) :func:`_fetch_lfs_blob` keeps
  the partial transfer at ``blobs/<sha256>.incomplete`` under huggingface_hub's lock
  for that blob, resumes it on the next run, and renames it into the cache only once
  its sha256 is the expected one (huggingface_hub checks only the size of a plain
  HTTP download). ``hf_hub_download`` then finds the blob and links it into the
  snapshot itself. Files served by xet go through ``hf_hub_download`` (hf_xet checks
  content hashes while it transfers).
- **Wrong bytes in the cache.** A file that ``hf_hub_download`` returns (a download,
  or a file another tool left in the cache) whose hash is not the expected one is
  removed, snapshot link and blob, by :func:`evict`, so the next run downloads it
  again instead of finding it "cached".
"""

import contextlib
import hashlib
import os
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import httpx2
from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    get_session,
    hf_hub_download,
    hf_hub_url,
    try_to_load_from_cache,
)
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get, is_xet_available, repo_folder_name  # the test hf_hub_download makes
from huggingface_hub.utils import WeakFileLock, build_hf_headers
from huggingface_hub.utils.tqdm import silent_tqdm
from huggingface_hub.utils.tqdm import tqdm as hf_tqdm

from gguf_exact import __version__
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub.names import (
    COMMIT,
    SHA256,
    check_commit,
    check_relative_path,
    check_repo_id,
    check_sha256,
    relative_path_problem,
)

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
    """What a HEAD on ``/{repo}/resolve/{revision}/{file}`` says about a file (checked)."""

    repo: str
    filename: str
    revision: str
    commit: str  # 40 hex
    etag: str  # the sha256 for LFS files (64 hex), the git blob id for others (40 hex)
    size: int | None
    url: str  # where to GET it (a CDN address when the Hub redirects)
    xet: bool  # the Hub serves it through xet storage

    @property
    def lfs(self) -> bool:
        return len(self.etag) == 64


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
    """A file in the Hub cache, checked against the Hub's metadata and the pin."""

    path: Path  # snapshots/<commit>/<file> (a link to the blob)
    commit: str
    sha256: str
    size: int
    resumed_from: int  # bytes that were already on disk when this run started
    transferred: bool  # False: the bytes were in the cache already


def storage_dir(repo: str, config: HubConfig) -> Path:
    return config.cache_dir / repo_folder_name(repo_id=check_repo_id(repo, "repo"), repo_type="model")


# --- one-line errors ---------------------------------------------------------------------


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
    if isinstance(err, GgufExactError):
        return GgufExactError(f"{thing}: {err}")
    if isinstance(err, LocalEntryNotFoundError) and err.__cause__ is not None:
        err = err.__cause__
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
    if isinstance(err, (OfflineModeIsEnabled, LocalEntryNotFoundError)):
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


_HUB_ERRORS = (
    HfHubHTTPError,
    OfflineModeIsEnabled,
    LocalEntryNotFoundError,
    httpx2.HTTPError,
    httpx2.InvalidURL,
    GgufExactError,
)


# --- the Hub's answers are checked before huggingface_hub uses them ---------------------

_GUARDED: ContextVar[bool] = ContextVar("gguf_exact_hub_guarded", default=False)


def _etag_value(header: str | None) -> str | None:
    """The ETag as huggingface_hub normalises it (``W/"x"`` -> ``x``)."""
    return None if header is None else header.removeprefix("W/").strip('"')


def check_hub_answer(response: httpx2.Response) -> None:
    """httpx response hook: refuse a ``/resolve/`` answer whose commit or ETag would be
    unsafe in a cache path. Active only inside :func:`guarded` (the session is shared
    with any other user of huggingface_hub in this process)."""
    if not _GUARDED.get() or "/resolve/" not in response.request.url.path:
        return
    where = f"{response.request.method} {response.request.url}"
    commit = response.headers.get(constants.HUGGINGFACE_HEADER_X_REPO_COMMIT)
    if commit is not None and not COMMIT.fullmatch(commit):
        raise GgufExactError(
            f"the answer to {where} names commit {commit[:80]!r} (X-Repo-Commit), not a 40-hex commit id; "
            "nothing written: check HF_ENDPOINT and any proxy between you and the Hub"
        )
    if response.status_code >= 400:
        return
    linked = response.headers.get(constants.HUGGINGFACE_HEADER_X_LINKED_ETAG)
    etag = _etag_value(linked if linked is not None else response.headers.get("ETag"))
    if etag is not None and not (COMMIT.fullmatch(etag) or SHA256.fullmatch(etag)):
        raise GgufExactError(
            f"the answer to {where} has ETag {etag[:80]!r}, neither a git id nor a sha256; "
            "nothing written: check HF_ENDPOINT and any proxy between you and the Hub"
        )


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Check the Hub's answers (:func:`check_hub_answer`) during the calls made inside."""
    session = get_session()  # huggingface_hub's shared client, recreated after set_client_factory
    hooks = session.event_hooks
    if check_hub_answer not in hooks["response"]:
        session.event_hooks = {**hooks, "response": [*hooks["response"], check_hub_answer]}
    token = _GUARDED.set(True)
    try:
        yield
    finally:
        _GUARDED.reset(token)


# --- metadata ----------------------------------------------------------------------------


def remote_file(repo: str, filename: str, revision: str, config: HubConfig) -> RemoteFile:
    """HEAD the file at ``revision``: commit, ETag, size, download address, all checked."""
    if config.offline:
        raise hub_error(OfflineModeIsEnabled(), repo, revision, filename, config.endpoint)
    url = hf_hub_url(repo, filename, revision=revision, endpoint=config.endpoint)
    try:
        with guarded():
            meta = get_hf_file_metadata(url, token=config.token, headers=_headers(config), endpoint=config.endpoint)
    except _HUB_ERRORS as err:
        raise hub_error(err, repo, revision, filename, config.endpoint) from None
    where = f"{repo}@{revision}: {filename}"
    if not meta.commit_hash or not meta.etag:
        raise GgufExactError(
            f"{where}: the answer from {config.endpoint} has no X-Repo-Commit or ETag header; "
            "check HF_ENDPOINT and any proxy between you and the Hub"
        )
    check_commit(meta.commit_hash, f"{where}: X-Repo-Commit")  # also checked by the hook; never trusted blindly
    if not (COMMIT.fullmatch(meta.etag) or SHA256.fullmatch(meta.etag)):
        raise GgufExactError(f"{where}: ETag {meta.etag[:80]!r} is neither a git id nor a sha256; check HF_ENDPOINT")
    if COMMIT.fullmatch(revision) and meta.commit_hash != revision:
        raise GgufExactError(
            f"{where}: asked for commit {revision}, the Hub answered for commit {meta.commit_hash}; check HF_ENDPOINT"
        )
    return RemoteFile(
        repo,
        filename,
        revision,
        meta.commit_hash,
        meta.etag,
        meta.size,
        meta.location or url,
        meta.xet_file_data is not None,
    )


def repo_listing(repo: str, revision: str, config: HubConfig) -> RepoListing:
    """The commit ``revision`` resolves to and every file's size, git id and LFS sha256,
    from the Hub's metadata (nothing is downloaded). Every value is checked: a name
    that is not a safe relative path, a commit, git id or sha256 of another form stop
    here, before anything is written."""
    if config.offline:
        raise GgufExactError(
            f"{repo}@{revision}: HF_HUB_OFFLINE is set; reading the Hub's file metadata needs the network"
        )
    api = HfApi(endpoint=config.endpoint, token=config.token, library_name="gguf-exact", library_version=__version__)
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
    except _HUB_ERRORS as err:
        raise hub_error(err, repo, revision, None, config.endpoint, download=False) from None
    except (KeyError, TypeError, ValueError) as err:  # huggingface_hub could not parse the answer
        raise GgufExactError(
            f"{repo}@{revision}: the Hub's model info is malformed ({type(err).__name__}: {str(err)[:80]}); check HF_ENDPOINT"
        ) from None
    where = f"{repo}@{revision}: the Hub's listing"
    commit = check_commit(info.sha, where)
    files = {}
    for s in info.siblings or []:
        problem = relative_path_problem(s.rfilename)
        if problem:
            raise GgufExactError(
                f"{where} at {commit} names a file {str(s.rfilename)[:120]!r} with {problem}; nothing written: "
                "check HF_ENDPOINT and any proxy between you and the Hub"
            )
        at = f"{where}: {s.rfilename}"
        blob_id = check_commit(s.blob_id, f"{at}: git id") if s.blob_id is not None else None
        sha256 = check_sha256(s.lfs.sha256, f"{at}: LFS") if s.lfs else None
        files[s.rfilename] = RepoEntry(s.rfilename, s.lfs.size if s.lfs else s.size, blob_id, sha256)
    return RepoListing(repo, revision, commit, files)


# --- the cache ---------------------------------------------------------------------------


def cached_file(repo: str, filename: str, revision: str, config: HubConfig) -> Path | None:
    """``snapshots/<commit>/<filename>`` in the Hub cache for ``revision`` (a commit, or a
    branch the cache has a ref for), or None; no network, not yet verified."""
    check_relative_path(filename, f"{repo}@{revision}")
    found = try_to_load_from_cache(check_repo_id(repo, "repo"), filename, cache_dir=config.cache_dir, revision=revision)
    return Path(found) if isinstance(found, str) else None


def cached_sha256(path: Path, repo: str, config: HubConfig) -> str | None:
    """The sha256 of a cached file, or None after removing it (:func:`evict`) when its
    bytes are not those its blob is named after (the sha256 for LFS files, the git id
    for others): a corrupt blob does not stay in the cache as if good. A cache without
    symlinks keeps no blob name to check against; then the sha256 is returned as it is."""
    name = Path(os.path.realpath(path)).name
    if SHA256.fullmatch(name):
        digest = sha256_file(path)
        good = digest == name
    elif COMMIT.fullmatch(name):
        digest, git_id = _sha256_and_git_id(path)
        good = git_id == name
    else:
        return sha256_file(path)
    if not good:
        evict(path, repo, config)
        return None
    return digest


def evict(path: Path, repo: str, config: HubConfig) -> None:
    """Remove a cached file whose bytes are wrong: its snapshot link and the blob it
    points to (under huggingface_hub's lock for that blob), so that the next
    ``hf_hub_download`` downloads it again. Other snapshots linking the same blob are
    left dangling, which huggingface_hub treats as not cached."""
    storage = storage_dir(repo, config)
    blob = Path(os.path.realpath(path))
    if blob.parent == Path(os.path.realpath(storage / "blobs")):
        with WeakFileLock(_lock_path(storage, blob.name, config)):
            blob.unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def _lock_path(storage: Path, blob_name: str, config: HubConfig) -> Path:
    """The lock file huggingface_hub takes for a blob: ``.locks/<repo folder>/<etag>.lock``."""
    lock = config.cache_dir / ".locks" / storage.name / f"{blob_name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    return lock


# --- downloads ---------------------------------------------------------------------------


def download(
    repo: str,
    filename: str,
    revision: str,
    config: HubConfig,
    expected_sha256: str | None = None,
    progress: bool = True,
) -> Download:
    """``filename`` at ``revision`` into the Hub cache, checked.

    Refused before any transfer when the Hub's sha256 is not ``expected_sha256``. After
    the transfer the file must have the hash the Hub's metadata gives (sha256 for LFS
    files, git blob id for the others) and ``expected_sha256``; a file that does not is
    removed from the cache (:func:`evict`) and nothing is returned.
    """
    where = f"{repo}/{filename}"
    check_relative_path(filename, f"{repo}@{revision}")
    if expected_sha256 is not None:
        check_sha256(expected_sha256, where)
    remote = remote_file(repo, filename, revision, config)
    if expected_sha256 and remote.lfs and remote.etag != expected_sha256:
        raise GgufExactError(
            f"{where}: the Hub's file at commit {remote.commit} has sha256 {remote.etag}, the pin says {expected_sha256}; "
            "nothing downloaded: check the revision, or run `gguf-exact pin` if the new file is intended"
        )
    storage = storage_dir(repo, config)
    had_blob = (storage / "blobs" / remote.etag).is_file()
    resumed_from, verified_blob = 0, None
    if remote.lfs and not (remote.xet and is_xet_available()):
        resumed_from, verified_blob = _fetch_lfs_blob(remote, storage, config, progress)
    try:
        with guarded():
            path = Path(
                hf_hub_download(
                    repo,
                    filename,
                    revision=revision,  # a branch or tag: huggingface_hub records refs/<revision> for offline runs
                    cache_dir=config.cache_dir,
                    endpoint=config.endpoint,
                    token=config.token,
                    library_name="gguf-exact",
                    library_version=__version__,
                    tqdm_class=_ProgressBar if progress else silent_tqdm,
                )
            )
    except _HUB_ERRORS as err:
        raise hub_error(err, repo, revision, filename, config.endpoint) from None
    if verified_blob is not None and os.path.realpath(path) == os.path.realpath(verified_blob):
        digest = remote.etag  # hashed before it was renamed into the cache, a moment ago
    else:
        digest = _check_cached(path, remote, expected_sha256, config)
    return Download(path, remote.commit, digest, path.stat().st_size, resumed_from, not had_blob)


def _check_cached(path: Path, remote: RemoteFile, expected_sha256: str | None, config: HubConfig) -> str:
    """The sha256 of ``path`` once it matches the Hub's metadata and the pin. Bytes that
    do not match the Hub's metadata are removed from the cache (:func:`evict`); bytes
    that do but differ from the pin stay: they are the Hub's file, the pin is wrong."""
    where = f"{remote.repo}/{remote.filename}"
    if remote.lfs:
        digest = sha256_file(path)
        problem = None if digest == remote.etag else f"sha256 {digest}, expected {remote.etag} (the Hub's metadata)"
    else:
        digest, git_id = _sha256_and_git_id(path)
        problem = None if git_id == remote.etag else f"git id {git_id}, expected {remote.etag} (the Hub's metadata)"
    if problem:
        evict(path, remote.repo, config)
        raise GgufExactError(
            f"{where}: downloaded file has {problem}; removed from the Hub cache, nothing kept: "
            "run again, and if it repeats, check HF_ENDPOINT and any proxy between you and the Hub"
        )
    if expected_sha256 and digest != expected_sha256:
        raise GgufExactError(
            f"{where}: the Hub's file at commit {remote.commit} has sha256 {digest}, the pin says {expected_sha256}; "
            "nothing placed: check the revision, or run `gguf-exact pin` if the new file is intended"
        )
    return digest


def _sha256_and_git_id(path: Path) -> tuple[str, str]:
    sha, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
            git.update(chunk)
    return sha.hexdigest(), git.hexdigest()


def _fetch_lfs_blob(remote: RemoteFile, storage: Path, config: HubConfig, progress: bool) -> tuple[int, Path | None]:
    """Put the LFS file ``remote`` at ``blobs/<sha256>``, resuming ``<sha256>.incomplete``
    from an earlier run; renamed into the cache only with the right sha256. Returns
    (bytes already on disk at the start, the blob if this call wrote and hashed it;
    None when it was there already, not checked here). See the module docstring for
    why this is not ``hf_hub_download``'s own transfer."""
    sha = check_sha256(remote.etag, f"{remote.repo}/{remote.filename}")
    blob = storage / "blobs" / sha
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(sha + ".incomplete")
    with WeakFileLock(_lock_path(storage, sha, config)):
        if blob.is_file():
            return 0, None
        start = _transfer(remote, partial, config, progress)
        digest = sha256_file(partial)
        if digest != sha:
            partial.unlink(missing_ok=True)
            raise GgufExactError(
                f"{remote.repo}/{remote.filename}: downloaded file has sha256 {digest}, expected {sha}; nothing kept: "
                "run again, and if it repeats, check the pin against the Hub"
            )
        os.replace(partial, blob)
    return start, blob


def read_small_file(repo: str, filename: str, commit: str, config: HubConfig, blob_id: str | None = None) -> bytes:
    """A small (non-LFS) file's bytes at ``commit``, through the cache; its git id must
    be the one the Hub's HEAD gave and, when given, ``blob_id`` (the listing's)."""
    got = download(repo, filename, commit, config, progress=False)
    data = got.path.read_bytes()
    if blob_id and git_blob_id(data) != blob_id:
        evict(got.path, repo, config)
        raise GgufExactError(
            f"{repo}@{commit}: {filename}: content does not match its git id {blob_id} in the Hub's listing; "
            "removed from the Hub cache: run again, and if it repeats, check HF_ENDPOINT"
        )
    return data


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub reports for non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _headers(config: HubConfig) -> dict[str, str]:
    return build_hf_headers(token=config.token, library_name="gguf-exact", library_version=__version__)


def _transfer(remote: RemoteFile, partial: Path, config: HubConfig, progress: bool) -> int:
    """GET ``remote`` into ``partial``, from where an earlier run stopped; returns that
    offset. huggingface_hub's ``http_get`` resumes a dropped connection within the run."""
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
            with guarded():
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
    except (httpx2.HTTPError, OSError, GgufExactError) as err:
        raise _kept(hub_error(err, remote.repo, remote.revision, remote.filename, config.endpoint), partial) from None
    return start


def _kept(err: GgufExactError, partial: Path) -> GgufExactError:
    if partial.exists() and partial.stat().st_size:
        return GgufExactError(
            f"{err}; {partial.stat().st_size:,} bytes are kept in {partial}: the next run resumes from there"
        )
    return err


class _ProgressBar(hf_tqdm):
    """huggingface_hub's bar (on a terminal only), for large files only."""

    def __init__(self, *args, **kwargs):
        if (kwargs.get("total") or 0) < LARGE_FILE:
            kwargs["disable"] = True
        super().__init__(*args, **kwargs)
