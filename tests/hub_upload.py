"""The upload side of the loopback Hub (tests/hubserver.py): what ``create_repo`` and
``create_commit`` send, over LFS (not xet). Requests reach :func:`upload_route` from the
hub's request handler; repos, commits and stored LFS objects live on its :class:`FakeHub`."""

import base64
import hashlib
import json
from urllib.parse import unquote, urlsplit

import yaml
from hubserver import LFS_SUFFIXES, _Handler, git_blob_id


def _read_body(handler: _Handler) -> bytes:
    """The request body, by Content-Length or chunked (httpx streams file objects chunked)."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(handler.rfile.read(size))
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def _json(handler: _Handler, status: int, body: dict) -> None:
    handler._send(status, {"Content-Type": "application/json"}, json.dumps(body).encode())


def _may_write(handler: _Handler, repo_id: str | None = None) -> bool:
    """True when the request carries the token (and ``repo_id`` exists); else answers the error."""
    hub = handler.fake
    if handler.headers.get("Authorization") != f"Bearer {hub.token}":
        handler._error(401, {"X-Error-Message": "Invalid credentials in Authorization header"}, False)
        return False
    if repo_id is not None and repo_id not in hub.repos:
        handler._error(404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, False)
        return False
    return True


def _remote_oid(name: str, data: bytes) -> str:
    return hashlib.sha256(data).hexdigest() if name.endswith(LFS_SUFFIXES) else git_blob_id(data)


def upload_route(handler: _Handler, method: str) -> None:
    hub = handler.fake
    path = unquote(urlsplit(handler.path).path)
    body = _read_body(handler)
    hub._log(method, path, handler.headers)
    if method == "PUT" and path.startswith("/lfs-upload/"):
        return _lfs_put(handler, path.rsplit("/", 1)[1], body)
    if path.startswith("/lfs-verify/"):
        oid = path.rsplit("/", 1)[1]
        want = json.loads(body or b"{}")
        ok = oid in hub.lfs_objects and want.get("size") == len(hub.lfs_objects[oid])
        return _json(handler, 200 if ok else 404, {"ok": ok})
    if path == "/api/repos/create":
        return _create_repo(handler, json.loads(body or b"{}"))
    if path == "/api/validate-yaml":
        return _validate_yaml(handler, json.loads(body or b"{}"))
    if path.endswith(".git/info/lfs/objects/batch"):
        return _lfs_batch(handler, path.lstrip("/")[: -len(".git/info/lfs/objects/batch")], json.loads(body))
    if path.startswith("/api/models/") and "/preupload/" in path:
        repo_id, revision = path[len("/api/models/") :].split("/preupload/", 1)
        return _preupload(handler, repo_id, revision, json.loads(body))
    if path.startswith("/api/models/") and "/commit/" in path:
        repo_id, revision = path[len("/api/models/") :].split("/commit/", 1)
        return _commit_files(handler, repo_id, revision, body)
    handler._error(404, {"X-Error-Message": "no such route"}, False)


def _create_repo(handler: _Handler, payload: dict) -> None:
    hub = handler.fake
    if not _may_write(handler):
        return None
    repo_id = f"{payload.get('organization')}/{payload.get('name')}"
    url = f"{hub.url}/{repo_id}"
    if repo_id in hub.repos:
        return _json(handler, 409, {"error": "You already created this model repo", "url": url})
    hub.commit(repo_id, {".gitattributes": b"*.gguf filter=lfs diff=lfs merge=lfs -text\n"})
    hub.repos[repo_id].private = payload.get("visibility") == "private"
    _json(handler, 200, {"url": url, "name": repo_id})


def _validate_yaml(handler: _Handler, payload: dict) -> None:
    content = payload.get("content", "")
    if not content.startswith("---\n") or "\n---\n" not in content[4:]:
        return _json(handler, 400, {"errors": [{"message": "no YAML front matter between --- lines"}]})
    try:
        meta = yaml.safe_load(content[4:].split("\n---\n", 1)[0])
    except yaml.YAMLError as e:
        return _json(handler, 400, {"errors": [{"message": f"invalid YAML: {e}"}]})
    if not isinstance(meta, dict):
        return _json(handler, 400, {"errors": [{"message": "the front matter is not a mapping"}]})
    _json(handler, 200, {"errors": [], "warnings": []})


def _preupload(handler: _Handler, repo_id: str, revision: str, payload: dict) -> None:
    hub = handler.fake
    if not _may_write(handler, repo_id):
        return None
    commit = hub._resolve(repo_id, revision)
    tree = hub.repos[repo_id].commits.get(commit, {}) if commit else {}
    files = []
    for f in payload.get("files", []):
        name = f["path"]
        old = tree.get(name)
        files.append(
            {
                "path": name,
                "uploadMode": "lfs" if name.endswith(LFS_SUFFIXES) else "regular",
                "shouldIgnore": False,
                "oid": _remote_oid(name, old) if old is not None else None,
            }
        )
    _json(handler, 200, {"files": files, "commitOid": commit})


def _lfs_batch(handler: _Handler, repo_id: str, payload: dict) -> None:
    hub = handler.fake
    if not _may_write(handler, repo_id):
        return None
    objects = []
    for o in payload.get("objects", []):
        entry = {"oid": o["oid"], "size": o["size"]}
        if o["oid"] not in hub.lfs_objects:
            entry["actions"] = {
                "upload": {"href": f"{hub.url}/lfs-upload/{o['oid']}"},
                "verify": {"href": f"{hub.url}/lfs-verify/{o['oid']}"},
            }
        objects.append(entry)
    handler._send(200, {"Content-Type": "application/vnd.git-lfs+json"}, json.dumps({"objects": objects}).encode())


def _lfs_put(handler: _Handler, oid: str, body: bytes) -> None:
    if hashlib.sha256(body).hexdigest() != oid:
        return handler._error(400, {"X-Error-Message": "the object's sha256 is not its oid"}, False)
    with handler.fake._lock:
        handler.fake.lfs_objects[oid] = body
    handler._send(200, {})


def _commit_files(handler: _Handler, repo_id: str, revision: str, body: bytes) -> None:
    hub = handler.fake
    if not _may_write(handler, repo_id):
        return None
    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
    if not lines or lines[0].get("key") != "header":
        return _json(handler, 400, {"error": "the first line must be the commit header"})
    parent = hub._resolve(repo_id, revision)
    want_parent = lines[0]["value"].get("parentCommit")
    if want_parent and want_parent != parent:
        return _json(handler, 412, {"error": f"parent commit {want_parent} is not the head of {revision}"})
    tree = dict(hub.repos[repo_id].commits.get(parent, {})) if parent else {}
    for line in lines[1:]:
        value = line["value"]
        if line["key"] == "file":
            tree[value["path"]] = base64.b64decode(value["content"])
        elif line["key"] == "lfsFile":
            data = hub.lfs_objects.get(value["oid"])
            if data is None:
                return _json(handler, 400, {"error": f"LFS object {value['oid']} was never uploaded"})
            tree[value["path"]] = data
        elif line["key"] in ("deletedFile", "deletedFolder"):
            tree = {k: v for k, v in tree.items() if k != value["path"] and not k.startswith(value["path"] + "/")}
    sha = hub.commit(repo_id, tree, branch=revision)
    _json(handler, 200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{sha}", "commitOid": sha, "success": True})
