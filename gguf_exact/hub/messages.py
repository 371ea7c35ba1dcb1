"""One line for each way talking to the Hub can fail, saying what to do next."""

import httpx2
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from gguf_exact.errors import GgufExactError, HubError


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
        return HubError(f"{thing}: {err}")
    if isinstance(err, LocalEntryNotFoundError) and err.__cause__ is not None:
        err = err.__cause__
    status = getattr(getattr(err, "response", None), "status_code", None)
    login = "log in with `hf auth login` or set HF_TOKEN"
    if isinstance(err, GatedRepoError):
        return HubError(
            f"{thing}: gated repository (HTTP {status}); accept its licence at {endpoint}/{repo} with your account, then {login}"
        )
    if isinstance(err, RevisionNotFoundError):
        return HubError(
            f"{thing}: revision {revision} not found (HTTP {status}); check the revision in the recipe and the commit in its checksum file"
        )
    if isinstance(err, RemoteEntryNotFoundError):
        return HubError(
            f"{thing}: no such file at this revision (HTTP {status}); check the recipe's files list and revision"
        )
    if isinstance(err, RepositoryNotFoundError):
        if status == 401:
            return HubError(
                f"{thing}: not authorised (HTTP 401): the repository is private or gated, or does not exist; check the name, and {login}"
            )
        return HubError(f"{thing}: repository not found (HTTP {status}); check the repo name in the recipe")
    if isinstance(err, (OfflineModeIsEnabled, LocalEntryNotFoundError)):
        return HubError(f"{thing}: HF_HUB_OFFLINE is set and the file is not in the Hub cache; unset it to download")
    if isinstance(err, HfHubHTTPError) and status == 401:
        return HubError(f"{thing}: the Hub rejected the token (HTTP 401); {login} again")
    if isinstance(err, HfHubHTTPError) and status == 403:
        return HubError(
            f"{thing}: access denied (HTTP 403); check that your token may read this repository, or {login}"
        )
    if isinstance(err, HfHubHTTPError) and status is not None:
        return HubError(f"{thing}: the Hub answered HTTP {status}; try again later")
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    then = (
        "and run again (downloads resume), or set HF_HUB_OFFLINE=1 to use the Hub cache"
        if download
        else "and run again"
    )
    return HubError(
        f"{thing}: network error ({type(err).__name__}{': ' + detail if detail else ''}); check your connection and HF_ENDPOINT {then}"
    )


# What a call into huggingface_hub may raise that :func:`hub_error` turns into one line
HUB_ERRORS = (
    HfHubHTTPError,
    OfflineModeIsEnabled,
    LocalEntryNotFoundError,
    httpx2.HTTPError,
    httpx2.InvalidURL,
    GgufExactError,
)
