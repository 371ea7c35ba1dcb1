"""The Hugging Face Hub through huggingface_hub's public API: file metadata
(``get_hf_file_metadata``), listings (``HfApi.model_info``), the cache
(``try_to_load_from_cache``) and downloads (``hf_hub_download``: its cache layout,
locks, xet transfers where the Hub serves them). Every download is checked against
what the Hub's metadata says, and against the pin when there is one.

Our own code, where the public API cannot do the job: the check of the Hub's answers
before huggingface_hub builds cache paths from them (:mod:`.session`); resuming
plain-HTTP LFS transfers across runs (:mod:`.resume`); and removing wrong bytes from
the cache: a file ``hf_hub_download`` returns (a download, or a file another tool left
in the cache) whose hash is not the expected one is removed, snapshot link and blob,
by :func:`evict`, so the next run downloads it again instead of finding it "cached".
"""

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import OfflineModeIsEnabled
from huggingface_hub.file_download import is_xet_available  # the test hf_hub_download makes
from huggingface_hub.utils import WeakFileLock
from huggingface_hub.utils.tqdm import silent_tqdm

from gguf_exact.errors import HubError
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub.messages import HUB_ERRORS, hub_error
from gguf_exact.hub.names import (
    COMMIT,
    SHA256,
    check_commit,
    check_relative_path,
    check_repo_id,
    check_sha256,
    relative_path_problem,
)
from gguf_exact.hub.resume import fetch_lfs_blob
from gguf_exact.hub.session import HubConfig, ProgressBar, guarded, lock_path, request_headers, storage_dir
from gguf_exact.version import __version__


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


# --- metadata ----------------------------------------------------------------------------


def remote_file(repo: str, filename: str, revision: str, config: HubConfig) -> RemoteFile:
    """HEAD the file at ``revision``: commit, ETag, size, download address, all checked."""
    if config.offline:
        raise hub_error(OfflineModeIsEnabled(), repo, revision, filename, config.endpoint)
    url = hf_hub_url(repo, filename, revision=revision, endpoint=config.endpoint)
    try:
        with guarded():
            meta = get_hf_file_metadata(
                url, token=config.token, headers=request_headers(config), endpoint=config.endpoint
            )
    except HUB_ERRORS as err:
        raise hub_error(err, repo, revision, filename, config.endpoint) from None
    where = f"{repo}@{revision}: {filename}"
    if not meta.commit_hash or not meta.etag:
        raise HubError(
            f"{where}: the answer from {config.endpoint} has no X-Repo-Commit or ETag header; "
            "check HF_ENDPOINT and any proxy between you and the Hub"
        )
    check_commit(meta.commit_hash, f"{where}: X-Repo-Commit")  # also checked by the hook; never trusted blindly
    if not (COMMIT.fullmatch(meta.etag) or SHA256.fullmatch(meta.etag)):
        raise HubError(f"{where}: ETag {meta.etag[:80]!r} is neither a git id nor a sha256; check HF_ENDPOINT")
    if COMMIT.fullmatch(revision) and meta.commit_hash != revision:
        raise HubError(
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
        raise HubError(f"{repo}@{revision}: HF_HUB_OFFLINE is set; reading the Hub's file metadata needs the network")
    api = HfApi(endpoint=config.endpoint, token=config.token, library_name="gguf-exact", library_version=__version__)
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
    except HUB_ERRORS as err:
        raise hub_error(err, repo, revision, None, config.endpoint, download=False) from None
    except (KeyError, TypeError, ValueError) as err:  # huggingface_hub could not parse the answer
        raise HubError(
            f"{repo}@{revision}: the Hub's model info is malformed ({type(err).__name__}: {str(err)[:80]}); check HF_ENDPOINT"
        ) from None
    where = f"{repo}@{revision}: the Hub's listing"
    commit = check_commit(info.sha, where)
    files = {}
    for s in info.siblings or []:
        problem = relative_path_problem(s.rfilename)
        if problem:
            raise HubError(
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
        with WeakFileLock(lock_path(storage, blob.name, config)):
            blob.unlink(missing_ok=True)
    path.unlink(missing_ok=True)


# --- downloads ---------------------------------------------------------------------------


def download(
    repo: str,
    filename: str,
    revision: str,
    config: HubConfig,
    expected_sha256: str | None = None,
    progress: bool = True,
    expected_size: int | None = None,
) -> Download:
    """``filename`` at ``revision`` into the Hub cache, checked.

    Refused before any transfer when the Hub's size is not ``expected_size`` or its
    sha256 is not ``expected_sha256``. After the transfer the file must have that size
    (checked first: no hash of a file of another size), the hash the Hub's metadata gives
    (sha256 for LFS files, git blob id for the others) and ``expected_sha256``; a file
    that does not is removed from the cache (:func:`evict`) and nothing is returned.
    """
    where = f"{repo}/{filename}"
    check_relative_path(filename, f"{repo}@{revision}")
    if expected_sha256 is not None:
        check_sha256(expected_sha256, where)
    remote = remote_file(repo, filename, revision, config)
    if expected_size is not None and remote.size is not None and remote.size != expected_size:
        raise HubError(
            f"{where}: the Hub's file at commit {remote.commit} is {remote.size:,} bytes, the pin says {expected_size:,}; "
            "nothing downloaded: check the revision, or run `gguf-exact pin` if the new file is intended"
        )
    if expected_sha256 and remote.lfs and remote.etag != expected_sha256:
        raise HubError(
            f"{where}: the Hub's file at commit {remote.commit} has sha256 {remote.etag}, the pin says {expected_sha256}; "
            "nothing downloaded: check the revision, or run `gguf-exact pin` if the new file is intended"
        )
    storage = storage_dir(repo, config)
    had_blob = (storage / "blobs" / remote.etag).is_file()
    resumed_from, verified_blob = 0, None
    if remote.lfs and not (remote.xet and is_xet_available()):
        resumed_from, verified_blob = fetch_lfs_blob(remote, storage, config, progress)
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
                    tqdm_class=ProgressBar if progress else silent_tqdm,
                )
            )
    except HUB_ERRORS as err:
        raise hub_error(err, repo, revision, filename, config.endpoint) from None
    if verified_blob is not None and os.path.realpath(path) == os.path.realpath(verified_blob):
        digest = remote.etag  # hashed before it was renamed into the cache, a moment ago
    else:
        digest = _check_cached(path, remote, expected_sha256, config, expected_size, had_blob)
    return Download(path, remote.commit, digest, path.stat().st_size, resumed_from, not had_blob)


def _check_cached(
    path: Path,
    remote: RemoteFile,
    expected_sha256: str | None,
    config: HubConfig,
    expected_size: int | None = None,
    cached_before: bool = False,
) -> str:
    """The sha256 of ``path`` once it matches the Hub's metadata and the pin. Bytes that
    do not match the Hub's metadata are removed from the cache (:func:`evict`); bytes
    that do but differ from the pin stay: they are the Hub's file, the pin is wrong.
    Sizes are compared before anything is hashed. ``cached_before``: the blob was in the
    cache before this run, so wrong bytes were changed on this machine, not downloaded."""
    where = f"{remote.repo}/{remote.filename}"
    size = path.stat().st_size
    if remote.size is not None and size != remote.size:
        blob = os.path.realpath(path)
        evict(path, remote.repo, config)
        if cached_before:
            raise HubError(
                f"{where}: the Hub cache's copy {blob} is {size:,} bytes, the Hub's metadata says {remote.size:,}: "
                "changed on this machine after it was verified (edited through a hard link? a disk error?); "
                "removed from the cache: run again"
            )
        raise HubError(
            f"{where}: downloaded file is {size:,} bytes, the Hub's metadata says {remote.size:,}; removed from the "
            "Hub cache, nothing kept: run again, and if it repeats, check HF_ENDPOINT and any proxy"
        )
    if expected_size is not None and size != expected_size:
        raise HubError(
            f"{where}: the Hub's file at commit {remote.commit} is {size:,} bytes, the pin says {expected_size:,}; "
            "nothing placed: check the revision, or run `gguf-exact pin` if the new file is intended"
        )
    if remote.lfs:
        digest = sha256_file(path)
        problem = None if digest == remote.etag else f"sha256 {digest}, expected {remote.etag} (the Hub's metadata)"
    else:
        digest, git_id = _sha256_and_git_id(path)
        problem = None if git_id == remote.etag else f"git id {git_id}, expected {remote.etag} (the Hub's metadata)"
    if problem:
        blob = os.path.realpath(path)
        evict(path, remote.repo, config)
        if cached_before:
            raise HubError(
                f"{where}: the Hub cache's copy {blob} has {problem}: changed on this machine after it was verified "
                "(edited through a hard link? a disk error?); removed from the cache: run again"
            )
        raise HubError(
            f"{where}: downloaded file has {problem}; removed from the Hub cache, nothing kept: "
            "run again, and if it repeats, check HF_ENDPOINT and any proxy between you and the Hub"
        )
    if expected_sha256 and digest != expected_sha256:
        raise HubError(
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


def read_small_file(repo: str, filename: str, commit: str, config: HubConfig, blob_id: str | None = None) -> bytes:
    """A small (non-LFS) file's bytes at ``commit``, through the cache; its git id must
    be the one the Hub's HEAD gave and, when given, ``blob_id`` (the listing's)."""
    got = download(repo, filename, commit, config, progress=False)
    data = got.path.read_bytes()
    if blob_id and git_blob_id(data) != blob_id:
        evict(got.path, repo, config)
        raise HubError(
            f"{repo}@{commit}: {filename}: content does not match its git id {blob_id} in the Hub's listing; "
            "removed from the Hub cache: run again, and if it repeats, check HF_ENDPOINT"
        )
    return data


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub reports for non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
