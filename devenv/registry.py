"""A plain-HTTP OCI registry on 127.0.0.1, serving images from our OCI archives (a thread of
the process that serves it: tests, and the upstream e2e run, where containerd's registry
mirror config sends pulls of registry.k8s.io here: devenv.containerd ``registry_mirrors``).

Just enough of the distribution API for a pull (``/v2/``, manifests by tag or digest, blobs by
digest), so that a pull with policy Always really goes to a registry. containerd allows plain
HTTP for a loopback registry (1.6 at once, 2.x after an HTTPS attempt, which is why the server
answers an unparsable TLS hello with an HTTP/1.0 status line, as a real registry's 400 does).
The number of manifest requests per repository is counted, so a test can tell a pull happened.
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import json
import re
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar


class _Handler(http.server.BaseHTTPRequestHandler):
    blobs: ClassVar[dict[str, tuple[str, bytes]]] = {}  # digest -> (media type, bytes)
    tags: ClassVar[dict[tuple[str, str], str]] = {}  # (repository, tag) -> manifest digest
    manifest_gets: ClassVar[collections.Counter[str]] = collections.Counter()
    default_request_version = "HTTP/1.0"

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        # A pull through a mirror names the registry it stands for: ?ns=registry.k8s.io
        path = self.path.split("?", 1)[0]
        match = re.fullmatch(r"/v2/(.+)/(manifests|blobs)/([^/]+)", path)
        found: tuple[str, bytes] | None = None
        if path == "/v2/":
            found = ("application/json", b"{}")
        elif match is not None:
            repo, kind, ref = match[1], match[2], match[3]
            if kind == "manifests":
                self.manifest_gets[repo] += 1
                ref = ref if ref.startswith("sha256:") else self.tags.get((repo, ref), "")
            found = self.blobs.get(ref)
        if found is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        media_type, data = found
        self.send_response(200)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(data).hexdigest())
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Registry:
    def __init__(self, host: str, handler: type[_Handler]) -> None:
        self.host = host  # host:port
        self._handler = handler

    def manifest_gets(self, repository: str) -> int:
        return self._handler.manifest_gets[repository]


@contextmanager
def serve(images: dict[str, Path]) -> Iterator[Registry]:
    """Serve ``images`` (``repository:tag`` -> a one-image OCI archive of ours; the repository
    without a registry host, as a pull through a mirror asks for it)."""
    blobs: dict[str, tuple[str, bytes]] = {}
    tags: dict[tuple[str, str], str] = {}
    for name, archive in images.items():
        repo, tag = name.rsplit(":", 1)
        with tarfile.open(archive) as tar:
            index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
            for member in tar.getmembers():
                if member.isfile() and member.name.startswith("blobs/sha256/"):
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    blobs["sha256:" + member.name.rsplit("/", 1)[1]] = ("application/octet-stream", data)
        manifest = index["manifests"][0]
        blobs[manifest["digest"]] = (manifest["mediaType"], blobs[manifest["digest"]][1])
        tags[(repo, tag)] = manifest["digest"]
    handler = type("Handler", (_Handler,), {"blobs": blobs, "tags": tags,
                                            "manifest_gets": collections.Counter()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Registry(f"127.0.0.1:{server.server_address[1]}", handler)
    finally:
        server.shutdown()
        server.server_close()


__all__ = ["Registry", "serve"]
