"""A loopback stand-in for the Hugging Face Hub, for tests of the real huggingface_hub client.

It answers the requests that huggingface_hub 2.4.0 makes for ``hf_hub_url`` /
``get_hf_file_metadata`` / ``http_get`` and ``HfApi.model_info(files_metadata=True)``:

- ``HEAD`` and ``GET /{repo}/resolve/{revision}/{file}``: ``X-Repo-Commit``, ``ETag``
  (the git blob id), and for LFS files (``.safetensors``, ``.gguf``) ``X-Linked-Etag``
  (the sha256) and ``X-Linked-Size``; ``Range: bytes=N-`` gets 206 with
  ``Content-Range``;
- ``GET /api/models/{repo}/revision/{revision}[?blobs=true]``: ``id``, ``sha`` and
  ``siblings`` (``rfilename``, ``size``, ``blobId``, ``lfs`` with ``sha256``);
- errors as the Hub sends them: ``X-Error-Code`` RepoNotFound (401 for a private repo
  without a token, 404 otherwise), GatedRepo (401/403), RevisionNotFound, EntryNotFound;
  401 "Invalid credentials in Authorization header" for a wrong token.

and (:mod:`hub_upload`) the upload side that ``create_repo`` and ``create_commit`` speak (LFS,
not xet), for ``publish``: ``POST /api/repos/create`` (a new repo starts with a ``.gitattributes``
commit, as the Hub's do; 409 with the repo's url when it exists), ``POST
/api/validate-yaml`` (the README's front matter, parsed), ``POST
/api/models/{repo}/preupload/{revision}`` (``uploadMode`` lfs for LFS suffixes, the
remote ``oid`` of a file already there), ``POST /{repo}.git/info/lfs/objects/batch``
(upload and verify actions for objects not stored yet), ``PUT`` of an object (its sha256
checked), the verify ``POST``, and ``POST /api/models/{repo}/commit/{revision}`` (the
ndjson header, ``file`` and ``lfsFile`` lines; ``parentCommit`` checked): a new commit
on the branch, ``commitOid`` and ``commitUrl``. Writes need the token.

Faults for tests: :meth:`FakeHub.cut` sends part of a file then drops the connection
(optionally answering 503 a few times after); :meth:`FakeHub.corrupt` serves other bytes
under the right headers; :meth:`FakeHub.lie` answers a file's requests with other header
values (a non-hex ``X-Repo-Commit``, an ``ETag`` of ``../../x``) and
:meth:`FakeHub.lie_in_listing` puts other values in a model info answer (a file named
``../../x``, a commit that is not hex). Every request is logged in :attr:`FakeHub.requests`.

Real names, commits and sizes: :meth:`FakeHub.commit_at` makes a commit under a given id
(the real one a checksum file pins), and a :class:`DiskFile` serves a file from disk
without reading it into memory: a sparse file of a real file's size (:func:`sparse_file`),
under the sha256 the real Hub gives for it when the test says so (``claimed_sha256``).

It binds 127.0.0.1 only, on a free port, and shuts itself down after ``lifetime``
seconds even if a test forgets to stop it. It speaks plain HTTP, not xet: set
``HF_HUB_DISABLE_XET=1`` for clients that would try.
"""

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class DiskFile:
    """A file the fake Hub serves from ``path``, read in chunks as it is sent. Its sha256
    in the Hub's answers is ``claimed_sha256`` when given (what the real Hub says of the
    real file), else its own, hashed once."""

    CHUNK = 1 << 20

    def __init__(self, path: str | Path, claimed_sha256: str | None = None):
        self.path, self.claimed_sha256 = Path(path), claimed_sha256
        self._own: str | None = None

    def __len__(self) -> int:
        return self.path.stat().st_size

    def sha256(self) -> str:
        if self.claimed_sha256:
            return self.claimed_sha256
        if self._own is None:
            digest = hashlib.sha256()
            with open(self.path, "rb") as f:
                for chunk in iter(lambda: f.read(self.CHUNK), b""):
                    digest.update(chunk)
            self._own = digest.hexdigest()
        return self._own

    def git_id(self) -> str:
        """The git id of the LFS pointer the real Hub would keep for it."""
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256()}\nsize {len(self)}\n"
        return git_blob_id(pointer.encode())

    def send(self, wfile, start: int, stop: int) -> None:
        with open(self.path, "rb") as f:
            f.seek(start)
            left = stop - start
            while left > 0:
                chunk = f.read(min(self.CHUNK, left))
                if not chunk:
                    return
                wfile.write(chunk)
                left -= len(chunk)


def sparse_file(path: str | Path, size: int, head: bytes = b"") -> Path:
    """A file of ``size`` bytes at ``path`` that takes no disk space beyond ``head`` (its first bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def _sha256(data) -> str:
    return data.sha256() if isinstance(data, DiskFile) else hashlib.sha256(data).hexdigest()


def _git_id(data) -> str:
    return data.git_id() if isinstance(data, DiskFile) else git_blob_id(data)


def _send(wfile, data, start: int, stop: int) -> None:
    if isinstance(data, DiskFile):
        data.send(wfile, start, stop)
    else:
        wfile.write(data[start:stop])


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    private: bool = False
    gated: bool = False


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


class FakeHub:
    """``with FakeHub() as hub:`` ... ``hub.url`` is the endpoint."""

    def __init__(self, lifetime: float = 60.0, token: str = "hf_test_token"):
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.token = token
        self.granted: set[str] = set()  # gated repos the token may read
        self._cuts: dict[tuple[str, str], list[int]] = {}
        self._corrupt: dict[tuple[str, str], bytes] = {}
        self._lies: dict[tuple[str, str], dict] = {}
        self._listing_lies: dict[str, dict] = {}
        self.lfs_objects: dict[str, bytes] = {}  # uploaded LFS objects by sha256
        self._lock = threading.Lock()
        self._lifetime = lifetime
        self._server: ThreadingHTTPServer | None = None
        self._timer: threading.Timer | None = None
        self.url = ""

    # --- content ---------------------------------------------------------------------
    def commit(
        self, repo_id: str, files: dict[str, bytes], branch: str = "main", private: bool = False, gated: bool = False
    ) -> str:
        """A new commit with ``files`` (the whole tree) on ``branch``; returns its id."""
        with self._lock:
            repo = self.repos.setdefault(repo_id, Repo())
            repo.private, repo.gated = repo.private or private, repo.gated or gated
            digest = hashlib.sha1(repo_id.encode() + str(len(repo.commits)).encode())
            for name in sorted(files):
                digest.update(name.encode() + bytes.fromhex(_sha256(files[name])))
            sha = digest.hexdigest()
            repo.commits[sha] = dict(files)
            repo.refs[branch] = sha
            return sha

    def commit_at(self, repo_id: str, commit: str, files: dict[str, "bytes | DiskFile"], branch: str = "main") -> str:
        """A commit under the id ``commit`` (a real one, as a checksum file pins it) with
        ``files`` (bytes or :class:`DiskFile`), also made the head of ``branch``."""
        with self._lock:
            repo = self.repos.setdefault(repo_id, Repo())
            repo.commits[commit] = dict(files)
            repo.refs[branch] = commit
            return commit

    def cut(self, repo_id: str, filename: str, at: int, then_fail: int = 0) -> None:
        """The next GET of ``filename`` sends bytes up to offset ``at``, then drops the
        connection; the ``then_fail`` GETs after it answer 503."""
        with self._lock:
            self._cuts[(repo_id, filename)] = [at] + [-1] * then_fail

    def corrupt(self, repo_id: str, filename: str, data: bytes | None) -> None:
        """Serve ``data`` for ``filename`` while the headers still describe the real file
        (None: serve the real file again)."""
        with self._lock:
            if data is None:
                self._corrupt.pop((repo_id, filename), None)
            else:
                self._corrupt[(repo_id, filename)] = data

    def lie(self, repo_id: str, filename: str, headers: dict[str, str], after: int = 0) -> None:
        """Answer HEAD and GET of ``filename`` (and its 404s) with ``headers`` in place of
        the true ones, from its ``after``-th request on (the first ``after`` tell the truth)."""
        with self._lock:
            self._lies[(repo_id, filename)] = {"headers": dict(headers), "after": after}

    def lie_in_listing(self, repo_id: str, sha: str | None = None, siblings: list[dict] | None = None) -> None:
        """Model info for ``repo_id`` answers commit ``sha`` and/or these extra ``siblings``
        entries (``rfilename``, ``size``, ``blobId``, ``lfs``), served as they are."""
        with self._lock:
            self._listing_lies[repo_id] = {"sha": sha, "siblings": siblings or []}

    def gets(self, filename: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + filename)]

    # --- life cycle ------------------------------------------------------------------
    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self._timer = threading.Timer(self._lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if self._timer:
            self._timer.cancel()
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- request logic (called from handler threads) ---------------------------------
    def _log(self, method: str, path: str, headers) -> None:
        with self._lock:
            self.requests.append(Request(method, path, {k.lower(): v for k, v in headers.items()}))

    def _access(self, repo_id: str, auth: str | None) -> tuple[int, dict[str, str]] | None:
        """None when the request may read ``repo_id``, else (status, error headers)."""
        repo = self.repos.get(repo_id)
        if auth is not None and auth != f"Bearer {self.token}":
            return 401, {"X-Error-Message": "Invalid credentials in Authorization header"}
        if repo is None:
            return 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}
        if repo.private and auth is None:
            return 401, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Invalid username or password."}
        if repo.gated and repo_id not in self.granted:
            status = 401 if auth is None else 403
            return status, {"X-Error-Code": "GatedRepo", "X-Error-Message": f"Access to model {repo_id} is restricted."}
        return None

    def _take_lies(self, repo_id: str, filename: str) -> dict[str, str]:
        with self._lock:
            plan = self._lies.get((repo_id, filename))
            if not plan:
                return {}
            plan["after"] -= 1
            return plan["headers"] if plan["after"] < 0 else {}

    def _resolve(self, repo_id: str, revision: str) -> str | None:
        repo = self.repos[repo_id]
        if revision in repo.commits:
            return revision
        return repo.refs.get(revision)

    def _take_cut(self, repo_id: str, filename: str) -> int | None:
        with self._lock:
            plan = self._cuts.get((repo_id, filename))
            if not plan:
                return None
            step = plan.pop(0)
            if not plan:
                del self._cuts[(repo_id, filename)]
            return step


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def do_POST(self) -> None:
        from hub_upload import upload_route  # the upload side, in a module of its own

        upload_route(self, "POST")

    def do_PUT(self) -> None:
        from hub_upload import upload_route

        upload_route(self, "PUT")

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"", head: bool = False) -> None:
        headers = {"Content-Length": str(len(body)), **headers}
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _error(self, status: int, headers: dict[str, str], head: bool) -> None:
        body = json.dumps({"error": headers.get("X-Error-Message", "error")}).encode()
        self._send(status, {**headers, "Content-Type": "application/json"}, body, head)

    def _route(self, head: bool) -> None:
        hub = self.fake
        split = urlsplit(self.path)
        path = unquote(split.path)
        hub._log("HEAD" if head else "GET", path, self.headers)
        auth = self.headers.get("Authorization")
        if path.startswith("/api/models/") and "/revision/" in path:
            repo_id, revision = path[len("/api/models/") :].split("/revision/", 1)
            return self._model_info(repo_id, revision, "blobs=true" in split.query, auth, head)
        if "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            revision, _, filename = rest.partition("/")
            return self._resolve_file(repo_id, revision, filename, auth, head)
        self._error(404, {"X-Error-Message": "no such route"}, head)

    def _commit(self, repo_id: str, revision: str, auth: str | None, head: bool) -> str | None:
        """The commit a request may read, or None after answering with the Hub's error."""
        denied = self.fake._access(repo_id, auth)
        if denied:
            self._error(*denied, head)
            return None
        commit = self.fake._resolve(repo_id, revision)
        if commit is None:
            self._error(
                404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": f"Invalid rev id: {revision}"}, head
            )
        return commit

    def _model_info(self, repo_id: str, revision: str, blobs: bool, auth: str | None, head: bool) -> None:
        hub = self.fake
        commit = self._commit(repo_id, revision, auth, head)
        if commit is None:
            return None
        siblings = []
        for name, data in sorted(hub.repos[repo_id].commits[commit].items()):
            entry: dict = {"rfilename": name}
            if blobs:
                entry |= {"size": len(data), "blobId": _git_id(data)}
                if name.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"sha256": _sha256(data), "size": len(data), "pointerSize": 134}
            siblings.append(entry)
        lies = hub._listing_lies.get(repo_id, {})
        siblings += lies.get("siblings", [])
        body = json.dumps(
            {
                "id": repo_id,
                "modelId": repo_id,
                "sha": lies.get("sha") or commit,
                "private": hub.repos[repo_id].private,
                "siblings": siblings,
            }
        ).encode()
        self._send(200, {"Content-Type": "application/json"}, body, head)

    def _resolve_file(self, repo_id: str, revision: str, filename: str, auth: str | None, head: bool) -> None:
        hub = self.fake
        commit = self._commit(repo_id, revision, auth, head)
        if commit is None:
            return None
        files = hub.repos[repo_id].commits[commit]
        lies = hub._take_lies(repo_id, filename)
        if filename not in files:
            return self._error(
                404,
                {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found", "X-Repo-Commit": commit} | lies,
                head,
            )
        data = files[filename]
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{_git_id(data)}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if filename.endswith(LFS_SUFFIXES):
            headers |= {"X-Linked-Etag": f'"{_sha256(data)}"', "X-Linked-Size": str(len(data))}
        headers |= lies
        if head:
            return self._send(200, {**headers, "Content-Length": str(len(data))}, head=True)
        start = 0
        rng = self.headers.get("Range")
        if rng:
            first = rng.removeprefix("bytes=").split("-", 1)[0]
            start = int(first)
            if start >= len(data):
                return self._error(416, {"Content-Range": f"bytes */{len(data)}"}, head)
        cut = hub._take_cut(repo_id, filename)
        if cut == -1:
            return self._error(503, {"X-Error-Message": "Service Unavailable"}, head)
        body = hub._corrupt.get((repo_id, filename), data)
        status = 206 if rng else 200
        if rng:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(max(0, len(body) - start)))
        self.end_headers()
        if cut is None:
            _send(self.wfile, body, start, len(body))
            return
        _send(self.wfile, body, start, max(start, cut))
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
