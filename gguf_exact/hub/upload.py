"""Uploading a release folder to the Hub through huggingface_hub: a repo, one commit.

``create_repo`` (an existing repo is reused), then one ``create_commit`` with every file
of the folder: huggingface_hub asks the Hub how to send each (``preupload``), sends large
files through LFS (or xet where the Hub and ``hf_xet`` speak it) and commits them
together. The commit id it returns is what a reader pins.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi

from gguf_exact.errors import HubError
from gguf_exact.hub.messages import HUB_ERRORS, hub_error
from gguf_exact.hub.names import check_repo_id
from gguf_exact.hub.session import HubConfig


@dataclass(frozen=True)
class Uploaded:
    repo: str
    commit: str  # 40 hex digits
    url: str  # the commit's page
    files: list[str]


def upload_folder(folder: Path, repo: str, message: str, config: HubConfig, private: bool = False) -> Uploaded:
    """Every file directly in ``folder`` to ``repo`` (created when missing) in one commit."""
    repo = check_repo_id(repo, "repo")
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise HubError(f"{folder}: no files to upload")
    api = HfApi(endpoint=config.endpoint, token=config.token)
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        ops = [CommitOperationAdd(path_in_repo=p.name, path_or_fileobj=str(p)) for p in files]
        info = api.create_commit(repo, ops, commit_message=message, repo_type="model")
    except HUB_ERRORS as err:
        raise hub_error(err, repo, "main", endpoint=config.endpoint, download=False) from None
    except ValueError as err:  # huggingface_hub's own checks (the README's metadata, malformed answers)
        raise HubError(f"{repo}: {str(err).strip().splitlines()[0]}") from None
    return Uploaded(repo, info.oid, info.commit_url, [p.name for p in files])


__all__ = ["Uploaded", "upload_folder"]
