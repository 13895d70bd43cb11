"""A local HTTP server that answers as the Hugging Face hub does, for the calls huggingface_hub makes
to list a repository and download a file (point HF_ENDPOINT at `hub.url`).

- `GET /api/models/{repo}[/revision/{rev}]`: the repository, `siblings` with `lfs` {sha256, size}
  when asked for blobs (files_metadata=True);
- `HEAD|GET /{repo}/resolve/{rev}/{file}`: the file, with X-Repo-Commit, ETag / X-Linked-Etag (its
  SHA-256), X-Linked-Size, Content-Length and Range requests answered 206.

Faults a test can ask for: `corrupt` (bytes other than the listed ones, same length), `drop_after`
(the next GET of that file closes the connection after so many bytes, once), `requests` records
every call with its Range header.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.corrupt: set[tuple[str, str]] = set()
        self.drop_after: dict[tuple[str, str], int] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, repo: str, files: dict[str, bytes]) -> None:
        self.repos.setdefault(repo, {}).update(files)

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def info(self, repo: str, blobs: bool) -> dict:
        siblings = []
        for name, data in self.repos[repo].items():
            sibling = {"rfilename": name}
            if blobs:
                sha = hashlib.sha256(data).hexdigest()
                sibling.update(
                    size=len(data),
                    blobId=sha[:40],
                    lfs={"sha256": sha, "size": len(data), "pointerSize": 134},
                )
            siblings.append(sibling)
        return {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "siblings": siblings}


RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def _answer(self, send_body: bool) -> None:
            parts = urlsplit(self.path)
            path = unquote(parts.path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            if (match := API.match(path)) is not None:
                if match["repo"] not in hub.repos:
                    return self._error(404, "RepoNotFound", "Repository not found")
                body = json.dumps(hub.info(match["repo"], "blobs=" in (parts.query or ""))).encode()
                return self._send(200, {"Content-Type": "application/json"}, body, send_body)
            if (match := RESOLVE.match(path)) is not None:
                return self._file(match["repo"], match["file"], send_body)
            self._error(404, "EntryNotFound", "Not found")

        def _file(self, repo: str, name: str, send_body: bool) -> None:
            if repo not in hub.repos:
                return self._error(404, "RepoNotFound", "Repository not found")
            if name not in hub.repos[repo]:
                return self._error(404, "EntryNotFound", "Entry not found")
            data = hub.repos[repo][name]
            sha = hashlib.sha256(data).hexdigest()
            if (repo, name) in hub.corrupt:
                data = bytes(b ^ 0xFF for b in data[:4096]) + data[4096:]
            start, status = 0, 200
            requested = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            end = len(data)
            if requested is not None:
                start, status = int(requested[1]), 206
                end = int(requested[2]) + 1 if requested[2] else len(data)
            headers = {
                "X-Repo-Commit": COMMIT,
                "ETag": f'"{sha}"',
                "X-Linked-Etag": f'"{sha}"',
                "X-Linked-Size": str(len(data)),
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            if status == 206:
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
            body = data[start:end]
            drop = hub.drop_after.pop((repo, name), None) if send_body else None
            if drop is None:
                return self._send(status, headers, body, send_body)
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the connection drops midway

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self._send(
                status,
                {
                    "X-Error-Code": code,
                    "X-Error-Message": message,
                    "X-Repo-Commit": COMMIT,
                    "Content-Type": "application/json",
                },
                body,
                True,
            )

        def _send(self, status: int, headers: dict, body: bytes, send_body: bool) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            if send_body:
                self.wfile.write(body)

    return Handler
