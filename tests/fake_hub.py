"""A small in-memory Hugging Face Hub for tests: real HTTP on 127.0.0.1, spoken to by the real client.

It implements the part of the Hub API that ``huggingface_hub`` 2.x uses to create a repo, upload one
commit (``create_commit``: preupload + NDJSON commit with base64 inline files), read repo info and
download files (``hf_hub_download`` / ``snapshot_download`` / ``AutoModel.from_pretrained``):

- ``GET  /api/whoami-v2``
- ``POST /api/validate-yaml``
- ``POST /api/repos/create``
- ``GET  /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``
- ``GET  /api/models/{repo}/tree/{rev}[/{path}]``
- ``POST /api/models/{repo}/preupload/{rev}`` (always answers ``uploadMode: regular``: no LFS, no Xet)
- ``POST /api/models/{repo}/commit/{rev}`` (``?create_pr=1`` opens ``refs/pr/N``)
- ``POST /api/models/{repo}/branch/{branch}``
- ``GET|HEAD /{repo}/resolve/{rev}/{path}`` with ``ETag``, ``X-Repo-Commit`` and ``Content-Length``

Repos are stored per commit (every commit keeps its full file map), so old revisions stay readable.
Errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``) as the Hub does.
Hooks for tests: ``fail_commits`` (answer the next N commits with 500), ``requests`` (method, path) log,
``create_payloads`` and ``commit_count(repo_id)``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

MAX_BODY = 256 * 1024 * 1024  # bound on one request body


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob (what the Hub reports as a regular file's oid)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    oid: str
    files: dict[str, bytes]
    message: str
    parent: str | None


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    owner: str
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # branch or refs/pr/N -> commit oid
    created_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()))
    pr_count: int = 0
    prs: dict[int, dict] = field(default_factory=dict)

    def resolve(self, rev: str) -> Commit | None:
        if rev in self.refs:
            return self.commits[self.refs[rev]]
        return self.commits.get(rev)


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra


class FakeHub:
    """State of the fake Hub; ``tokens`` maps an access token to (user name, organisations)."""

    def __init__(self, tokens: dict[str, tuple[str, list[str]]] | None = None):
        self.tokens = tokens or {"hf_user_token": ("user", ["papa-org"]), "hf_other_token": ("other", [])}
        self.repos: dict[str, Repo] = {}
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str]] = []
        self.create_payloads: list[dict] = []
        self.fail_commits = 0
        self.fail_status = 500  # 5xx are retried by the client; a 4xx fails the push at once
        self._counter = 0
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            state = hub

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(timeout=5)
            self.server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- helpers for tests ---------------------------------------------------------------------------
    def commit_count(self, repo_id: str) -> int:
        """Commits made through the commit endpoint (the repo's initial commit is not counted)."""
        with self.lock:
            repo = self.repos.get(repo_id)
            return 0 if repo is None else len(repo.commits) - 1

    def files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        with self.lock:
            return dict(self.repos[repo_id].resolve(rev).files)

    def add_repo(self, repo_id: str, owner: str, repo_type: str = "model", private: bool = False) -> Repo:
        with self.lock:
            repo = Repo(repo_id, repo_type, private, owner)
            gitattributes = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
            self._new_commit(repo, "main", {".gitattributes": gitattributes}, "initial commit")
            self.repos[repo_id] = repo
            return repo

    # -- model -------------------------------------------------------------------------------------------
    def _new_commit(self, repo: Repo, ref: str, files: dict[str, bytes], message: str) -> Commit:
        self._counter += 1
        parent = repo.refs.get(ref)
        oid = hashlib.sha1(f"{repo.repo_id}:{self._counter}:{message}".encode()).hexdigest()
        commit = Commit(oid, files, message, parent)
        repo.commits[oid] = commit
        repo.refs[ref] = oid
        return commit

    def user_of(self, headers) -> tuple[str, list[str]] | None:
        auth = headers.get("Authorization") or ""
        if not auth:
            return None
        token = auth.removeprefix("Bearer ").strip()
        if token not in self.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.tokens[token]

    def readable(self, repo_id: str, headers, repo_type: str = "model") -> Repo:
        repo = self.repos.get(repo_id)
        user = self.user_of(headers)
        if repo is None or repo.repo_type != repo_type or (repo.private and (user is None or user[0] != repo.owner)):
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def writable(self, repo_id: str, headers) -> Repo:
        user = self.user_of(headers)
        if user is None:
            raise HubError(401, "You must be authenticated to write to a repository")
        repo = self.readable(repo_id, headers)
        if repo.owner != user[0] and repo.owner not in user[1]:
            raise HubError(403, f"You don't have the rights to write to {repo_id}")
        return repo


def _commit_of(repo: Repo, rev: str) -> Commit:
    commit = repo.resolve(rev)
    if commit is None:
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
    return commit


class _Handler(BaseHTTPRequestHandler):
    state: FakeHub
    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a connection may stay idle: the server never hangs a test

    def log_message(self, format, *args):  # noqa: A002 - keep test output quiet
        pass

    # -- plumbing -------------------------------------------------------------------------------------
    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise HubError(413, "request body too large")
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Type", "application/json")
        headers.setdefault("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode())

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        raw = [s for s in url.path.split("/") if s]
        with self.state.lock:
            self.state.requests.append((method, url.path))
        try:
            body = self._body() if method in ("POST", "PUT") else b""
            with self.state.lock:
                self._route(method, raw, query, body)
        except HubError as err:
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            data = json.dumps({"error": err.message, **err.extra}).encode()
            self._send(err.status, data, headers, head=method == "HEAD")

    def do_GET(self):  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self):  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    # -- routes -----------------------------------------------------------------------------------------
    def _route(self, method: str, raw: list[str], query: dict, body: bytes) -> None:
        hub = self.state
        if raw[:2] == ["api", "whoami-v2"] and method == "GET":
            user = hub.user_of(self.headers)
            if user is None:
                raise HubError(401, "Invalid credentials in Authorization header")
            orgs = [{"name": org, "type": "org"} for org in user[1]]
            return self._json(200, {"type": "user", "name": user[0], "orgs": orgs, "auth": {"type": "access_token"}})
        if raw[:2] == ["api", "validate-yaml"] and method == "POST":
            return self._json(200, {"errors": [], "warnings": []})
        if raw[:3] == ["api", "repos", "create"] and method == "POST":
            return self._create_repo(json.loads(body or b"{}"))
        if len(raw) >= 4 and raw[0] == "api" and raw[1] == "models":
            repo_id = f"{unquote(raw[2])}/{unquote(raw[3])}"
            action, rest = (raw[4], raw[5:]) if len(raw) > 4 else (None, [])
            if method == "GET" and action is None:
                return self._model_info(repo_id, "main", query)
            if method == "GET" and action == "revision" and rest:
                return self._model_info(repo_id, unquote(rest[0]), query)
            if method == "GET" and action == "tree" and rest:
                return self._tree(repo_id, unquote(rest[0]), "/".join(unquote(p) for p in rest[1:]), query)
            if method == "POST" and action == "preupload" and rest:
                return self._preupload(repo_id, unquote(rest[0]), json.loads(body or b"{}"), query)
            if method == "POST" and action == "commit" and rest:
                return self._commit(repo_id, unquote(rest[0]), body, query)
            if method == "POST" and action == "discussions" and not rest:
                return self._open_pr(repo_id, json.loads(body or b"{}"))
            if method == "GET" and action == "discussions" and len(rest) == 1:
                return self._pr_details(repo_id, int(rest[0]))
            if method == "POST" and action == "branch" and rest:
                return self._branch(repo_id, unquote("/".join(rest)), json.loads(body or b"{}"))
        if len(raw) >= 5 and raw[2] == "resolve" and method in ("GET", "HEAD"):
            repo_id = f"{unquote(raw[0])}/{unquote(raw[1])}"
            return self._resolve(repo_id, unquote(raw[3]), "/".join(unquote(p) for p in raw[4:]), method == "HEAD")
        raise HubError(404, f"fake hub: no route for {method} {self.path}")

    def _create_repo(self, payload: dict) -> None:
        hub = self.state
        hub.create_payloads.append(payload)
        user = hub.user_of(self.headers)
        if user is None:
            raise HubError(401, "You must be authenticated to create a repository")
        namespace = payload.get("organization") or user[0]
        repo_id = f"{namespace}/{payload['name']}"
        repo_type = payload.get("type") or "model"
        if repo_type != "model":
            raise HubError(400, "this fake hub only stores model repos")
        if namespace != user[0] and namespace not in user[1]:
            raise HubError(403, f"You don't have the rights to create a model under the namespace {namespace!r}")
        url = f"{self.state.endpoint}/{repo_id}"
        if repo_id in hub.repos:
            raise HubError(409, "You already created this model repo", url=url)
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        hub.add_repo(repo_id, namespace, repo_type, private)
        return self._json(200, {"url": url, "name": repo_id, "id": repo_id})

    def _model_info(self, repo_id: str, rev: str, query: dict) -> None:
        repo = self.state.readable(repo_id, self.headers)
        commit = _commit_of(repo, rev)
        siblings = [{"rfilename": p} for p in sorted(commit.files)]
        if query.get("blobs"):
            for sib in siblings:
                data = commit.files[sib["rfilename"]]
                sib.update(size=len(data), blobId=git_blob_sha1(data))
        return self._json(
            200,
            {
                "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": repo.owner,
                "sha": commit.oid,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "createdAt": repo.created_at,
                "lastModified": repo.created_at,
                "siblings": siblings,
            },
        )

    def _tree(self, repo_id: str, rev: str, prefix: str, query: dict) -> None:
        commit = _commit_of(self.state.readable(repo_id, self.headers), rev)
        recursive = str(query.get("recursive", "")).lower() in ("1", "true")
        prefix = prefix.strip("/")
        entries, folders = [], set()
        for path in sorted(commit.files):
            if prefix and not path.startswith(prefix + "/"):
                continue
            rel = path[len(prefix) + 1 :] if prefix else path
            if "/" in rel and not recursive:
                folders.add((prefix + "/" if prefix else "") + rel.split("/")[0])
                continue
            data = commit.files[path]
            entries.append({"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": path})
        if prefix and not entries and not folders:
            raise HubError(404, f"{prefix} does not exist on {rev}", "EntryNotFound")
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)]
        return self._json(200, entries)

    def _preupload(self, repo_id: str, rev: str, payload: dict, query: dict) -> None:
        repo = self.state.writable(repo_id, self.headers)
        commit = repo.resolve("main" if query.get("create_pr") else rev)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        files = []
        for item in payload.get("files", []):
            existing = commit.files.get(item["path"])
            oid = None if existing is None else git_blob_sha1(existing)
            files.append({"path": item["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": oid})
        return self._json(200, {"files": files, "commitOid": commit.oid})

    def _commit(self, repo_id: str, rev: str, body: bytes, query: dict) -> None:
        hub = self.state
        repo = hub.writable(repo_id, self.headers)
        if hub.fail_commits > 0:
            hub.fail_commits -= 1
            raise HubError(hub.fail_status, "the fake hub failed this commit on purpose")
        create_pr = query.get("create_pr") == "1"
        base = _commit_of(repo, "main" if create_pr else rev)
        header, files = None, dict(base.files)
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, "file content must be base64")
                files[value["path"]] = base64.b64decode(value["content"])
            elif key in ("deletedFile", "deletedFolder"):
                path = value["path"].rstrip("/")
                removed = [p for p in files if p == path or p.startswith(path + "/")]
                if not removed:
                    raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                for p in removed:
                    del files[p]
            else:
                raise HubError(400, f"fake hub: unsupported commit operation {key!r} (only inline files)")
        if header is None or not header.get("summary"):
            raise HubError(400, "commit header with a summary is required")
        parent = header.get("parentCommit")
        if parent is not None and parent != base.oid:
            raise HubError(412, "A commit has happened since. Please refresh and try again.")
        pr_url = None
        if create_pr:
            repo.pr_count += 1
            ref = f"refs/pr/{repo.pr_count}"
            repo.refs[ref] = base.oid
            repo.prs[repo.pr_count] = {"title": header.get("summary", ""), "author": repo.owner}
            pr_url = f"{hub.endpoint}/{repo_id}/discussions/{repo.pr_count}"
        else:
            ref = rev
        commit = hub._new_commit(repo, ref, files, header["summary"])
        return self._json(
            200,
            {
                "success": True,
                "commitOid": commit.oid,
                "commitUrl": f"{hub.endpoint}/{repo_id}/commit/{commit.oid}",
                "hookOutput": "",
                "pullRequestUrl": pr_url,
            },
        )

    def _open_pr(self, repo_id: str, payload: dict) -> None:
        repo = self.state.readable(repo_id, self.headers)
        if self.state.user_of(self.headers) is None:
            raise HubError(401, "You must be authenticated to open a pull request")
        if not payload.get("pullRequest"):
            raise HubError(400, "this fake hub only opens pull requests")
        repo.pr_count += 1
        repo.refs[f"refs/pr/{repo.pr_count}"] = repo.refs["main"]
        repo.prs[repo.pr_count] = {"title": payload.get("title", ""), "author": self.state.user_of(self.headers)[0]}
        return self._json(200, {"num": repo.pr_count, "url": f"{self.state.endpoint}/{repo_id}/discussions/1"})

    def _pr_details(self, repo_id: str, num: int) -> None:
        repo = self.state.readable(repo_id, self.headers)
        if num not in repo.prs:
            raise HubError(404, "Discussion not found")
        pr = repo.prs[num]
        return self._json(
            200,
            {
                "num": num,
                "title": pr["title"],
                "isPullRequest": True,
                "status": "draft",
                "author": {"name": pr["author"]},
                "createdAt": repo.created_at,
                "repo": {"name": repo_id, "type": "model"},
                "changes": {"base": "refs/heads/main"},
                "filesWithConflicts": [],
                "events": [],
                "diff": "",
            },
        )

    def _branch(self, repo_id: str, branch: str, payload: dict) -> None:
        repo = self.state.writable(repo_id, self.headers)
        if branch in repo.refs:
            raise HubError(409, f"Reference already exists: refs/heads/{branch}")
        start = _commit_of(repo, payload.get("startingPoint") or "main")
        repo.refs[branch] = start.oid
        return self._json(200, {})

    def _resolve(self, repo_id: str, rev: str, path: str, head: bool) -> None:
        repo = self.state.readable(repo_id, self.headers)
        commit = _commit_of(repo, rev)
        if path not in commit.files:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        data = commit.files[path]
        status, start, end = 200, 0, len(data)
        ranged = self.headers.get("Range")
        if ranged and ranged.startswith("bytes=") and not head:
            lo, _, hi = ranged[len("bytes=") :].partition("-")
            start = int(lo or 0)
            end = int(hi) + 1 if hi else len(data)
            status = 206
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{git_blob_sha1(data)}"',
            "X-Repo-Commit": commit.oid,
            "Content-Length": str(end - start),
            "Accept-Ranges": "bytes",
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        return self._send(status, data[start:end], headers, head=head)


# -- a tiny PAPA checkpoint folder for publishing tests ------------------------------------------------------
TINY_WORDS = "the a of and to in is was it that papa heads attention constant model text on for with as by".split()
TINY_SOURCE = "papa-tests/tiny-bert"


def build_tiny_checkpoint(out_dir, constant_heads=((0, 1), (1, 0)), max_length: int = 16, seed: int = 0):
    """A complete PAPA checkpoint of a tiny BERT (hidden 32, 2 layers, 4 heads) with a local WordPiece tokenizer.

    Made by ``papa_surgery.convert.convert`` + ``save_checkpoint`` from random row-stochastic constants (config
    with ``papa_*`` fields and ``auto_map``, weights, the hub code files, ``papa_recipe.json``, tokenizer, card).
    Returns ``(folder, PAPA model in memory, tokenizer)``.
    """
    import tempfile
    from pathlib import Path

    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *TINY_WORDS, *"abcdefghijklmnopqrstuvwxyz.,!?"]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
        tokenizer = BertTokenizer(vocab_file=str(Path(tmp) / "vocab.txt"), model_max_length=max_length)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = BertModel(config).eval()

    heads = [[int(layer), int(head)] for layer, head in constant_heads]
    recipe_extra = {
        "source_license": "apache-2.0",
        "corpus": {
            "description": "Hub dataset wikitext:wikitext-2-raw-v1:train:text [text]",
            "examples": 64,
            "pairs": False,
        },
        "command": f"papa-surgery convert {TINY_SOURCE} --fraction 0.25 --max-length {max_length} --out {out.name}",
    }
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.conversion.checkpoint import save_checkpoint
    from papa_surgery.conversion.recipe import build_recipe
    from papa_surgery.conversion.surgery import convert

    logits = torch.randn(2, 4, max_length, max_length)  # (layers, heads, L, L)
    constants = Constants(
        values=torch.softmax(logits * 2, dim=-1),
        kind="average",
        max_length=max_length,
        counts=torch.full((max_length, max_length), 64.0, dtype=torch.float64),
        metadata={"source_model": TINY_SOURCE, "corpus": recipe_extra["corpus"]["description"], "examples": 64},
    )
    papa = convert(
        model,
        constants,
        heads,
        tokenizer=tokenizer,
        kind="average",
        method="variance",
        fraction=len(heads) / 8,
        source_name=TINY_SOURCE,
    )
    recipe = build_recipe(papa, constants, command=recipe_extra["command"])
    recipe["source"]["license"] = recipe_extra["source_license"]
    save_checkpoint(papa, out, tokenizer=tokenizer, recipe=recipe, overwrite=True)
    return out, papa, tokenizer
