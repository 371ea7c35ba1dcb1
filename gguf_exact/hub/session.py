"""How gguf-exact talks to the Hub through huggingface_hub: where the Hub and its cache
are (:class:`HubConfig`), the request headers and progress bars, and the check of the
Hub's answers that every download runs under (:func:`guarded`).

Why the check: huggingface_hub names cache paths after the Hub's answers,
``blobs/<ETag>``, ``snapshots/<X-Repo-Commit>``, ``.no_exist/<X-Repo-Commit>/...``,
and does not check those values (in 2.4.0 an ETag of ``../../x`` names a file outside
the cache). :func:`check_hub_answer`, a response hook on huggingface_hub's own HTTP
session, refuses a commit that is not 40 hex digits and an ETag that is neither a git
id nor a sha256 on every ``/resolve/`` answer, before huggingface_hub reads them: also
on the second HEAD that ``hf_hub_download`` makes itself.
"""

import contextlib
import os
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx2
from huggingface_hub import constants, get_session
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import build_hf_headers
from huggingface_hub.utils.tqdm import tqdm as hf_tqdm

from gguf_exact.errors import HubError
from gguf_exact.hub.names import COMMIT, SHA256, check_repo_id
from gguf_exact.version import __version__

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


def storage_dir(repo: str, config: HubConfig) -> Path:
    return config.cache_dir / repo_folder_name(repo_id=check_repo_id(repo, "repo"), repo_type="model")


def lock_path(storage: Path, blob_name: str, config: HubConfig) -> Path:
    """The lock file huggingface_hub takes for a blob: ``.locks/<repo folder>/<etag>.lock``."""
    lock = config.cache_dir / ".locks" / storage.name / f"{blob_name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    return lock


def request_headers(config: HubConfig) -> dict[str, str]:
    return build_hf_headers(token=config.token, library_name="gguf-exact", library_version=__version__)


class ProgressBar(hf_tqdm):
    """huggingface_hub's bar (on a terminal only), for large files only."""

    def __init__(self, *args, **kwargs):
        if (kwargs.get("total") or 0) < LARGE_FILE:
            kwargs["disable"] = True
        super().__init__(*args, **kwargs)


# --- the Hub's answers are checked before huggingface_hub uses them ---------------------

_GUARDED: ContextVar[bool] = ContextVar("gguf_exact_hub_guarded", default=False)


def _etag_value(header: str | None) -> str | None:
    """The ETag as huggingface_hub normalises it (``W/"x"`` -> ``x``), the very expression
    of its ``_normalize_etag``, so the value checked is the value it uses."""
    return None if header is None else header.lstrip("W/").strip('"')


def check_hub_answer(response: httpx2.Response) -> None:
    """httpx response hook: refuse a ``/resolve/`` answer whose commit or ETag would be
    unsafe in a cache path. Active only inside :func:`guarded` (the session is shared
    with any other user of huggingface_hub in this process)."""
    if not _GUARDED.get() or "/resolve/" not in response.request.url.path:
        return
    where = f"{response.request.method} {response.request.url}"
    commit = response.headers.get(constants.HUGGINGFACE_HEADER_X_REPO_COMMIT)
    if commit is not None and not COMMIT.fullmatch(commit):
        raise HubError(
            f"the answer to {where} names commit {commit[:80]!r} (X-Repo-Commit), not a 40-hex commit id; "
            "nothing written: check HF_ENDPOINT and any proxy between you and the Hub"
        )
    if response.status_code >= 400:
        return
    linked = response.headers.get(constants.HUGGINGFACE_HEADER_X_LINKED_ETAG)
    etag = _etag_value(linked if linked is not None else response.headers.get("ETag"))
    if etag is not None and not (COMMIT.fullmatch(etag) or SHA256.fullmatch(etag)):
        raise HubError(
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
