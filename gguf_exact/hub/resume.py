"""Downloads that resume across runs, for LFS files the Hub serves over plain HTTP.

Why this is not ``hf_hub_download``'s own transfer: huggingface_hub 2.x downloads into
a per-process temporary file and deletes it when the transfer fails (huggingface_hub
PR #4228, against concurrent writers on file systems whose locks do not hold), so an
interrupted multi-GB download starts again from zero; within one run it does resume a
dropped connection with a Range request, and so does this code (its ``http_get``).
For LFS files served over plain HTTP (mirrors, ``HF_HUB_DISABLE_XET=1``, repositories
not on xet), :func:`fetch_lfs_blob` keeps the partial transfer at
``blobs/<sha256>.incomplete`` under huggingface_hub's lock for that blob, resumes it on
the next run, and renames it into the cache only once its sha256 is the expected one
(huggingface_hub checks only the size of a plain HTTP download, and concurrent writers
cannot get a wrong file past the hash). ``hf_hub_download`` then finds the blob and
links it into the snapshot itself. Files served by xet go through ``hf_hub_download``.
"""

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import httpx2
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import WeakFileLock
from huggingface_hub.utils.tqdm import silent_tqdm

from gguf_exact.errors import GgufExactError, HubError
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub.messages import hub_error
from gguf_exact.hub.names import check_sha256
from gguf_exact.hub.session import HubConfig, ProgressBar, guarded, lock_path, request_headers

if TYPE_CHECKING:
    from gguf_exact.hub.client import RemoteFile


def fetch_lfs_blob(remote: "RemoteFile", storage: Path, config: HubConfig, progress: bool) -> tuple[int, Path | None]:
    """Put the LFS file ``remote`` at ``blobs/<sha256>``, resuming ``<sha256>.incomplete``
    from an earlier run; renamed into the cache only with the right sha256. Returns
    (bytes already on disk at the start, the blob if this call wrote and hashed it;
    None when it was there already, not checked here)."""
    sha = check_sha256(remote.etag, f"{remote.repo}/{remote.filename}")
    blob = storage / "blobs" / sha
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(sha + ".incomplete")
    with WeakFileLock(lock_path(storage, sha, config)):
        if blob.is_file():
            return 0, None
        start = _transfer(remote, partial, config, progress)
        digest = sha256_file(partial)
        if digest != sha:
            partial.unlink(missing_ok=True)
            raise HubError(
                f"{remote.repo}/{remote.filename}: downloaded file has sha256 {digest}, expected {sha}; nothing kept: "
                "run again, and if it repeats, check the pin against the Hub"
            )
        os.replace(partial, blob)
    return start, blob


def _transfer(remote: "RemoteFile", partial: Path, config: HubConfig, progress: bool) -> int:
    """GET ``remote`` into ``partial``, from where an earlier run stopped; returns that
    offset. huggingface_hub's ``http_get`` resumes a dropped connection within the run."""
    start = partial.stat().st_size if partial.exists() else 0
    if remote.size is not None and start > remote.size:
        start = 0
    headers = request_headers(config)
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
                    tqdm_class=ProgressBar if progress else silent_tqdm,
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
        return HubError(
            f"{err}; {partial.stat().st_size:,} bytes are kept in {partial}: the next run resumes from there"
        )
    return err
