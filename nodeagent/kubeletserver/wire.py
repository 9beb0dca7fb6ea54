"""HTTP/1.1 as the kubelet API needs it, over any anyio byte stream.

One request per connection (every response says ``Connection: close``): the API server opens a
connection per log stream or exec session anyway, and it spares us keep-alive and pipelining.
Bodies are never read: every kubelet endpoint we serve is a GET, or an upgrade whose bytes after
the head belong to the upgraded protocol (they are kept in ``Request.rest`` for the splice).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
from anyio.abc import ByteStream

MAX_HEAD_BYTES = 64 * 1024
BEARER_PROTOCOL_PREFIX = "base64url.bearer.authorization.k8s.io."

REASONS = {
    101: "Switching Protocols", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed", 422: "Unprocessable Entity", 429: "Too Many Requests",
    500: "Internal Server Error", 502: "Bad Gateway",
}


class BadRequest(Exception):
    """The bytes are not an HTTP/1.x request head we can read."""


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    """As sent, in order (names keep their case: they are forwarded as they came)."""
    rest: bytes = b""
    """Bytes that arrived after the head."""

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def decoded_path(self) -> str:
        """The path percent-decoded, as Go's URL.Path: what authorization looks at."""
        return unquote(self.path)

    def segments(self) -> list[str]:
        """The path's segments, each percent-decoded (a segment never contains a slash)."""
        return [unquote(s) for s in self.path.split("/")[1:]]

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query, keep_blank_values=True)

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)

    def header_tokens(self, name: str) -> set[str]:
        """Comma-separated values of every occurrence of a header, lower-cased."""
        lowered = name.lower()
        return {t.strip().lower() for k, v in self.headers if k.lower() == lowered for t in v.split(",")}

    @property
    def is_upgrade(self) -> bool:
        """Go's httpstream.IsUpgradeRequest: ``Connection`` names ``upgrade``."""
        return "upgrade" in self.header_tokens("Connection")

    @property
    def is_websocket(self) -> bool:
        return self.is_upgrade and "websocket" in self.header_tokens("Upgrade")

    def without_credentials(self) -> Request:
        """This request without what authenticated it: the ``Authorization`` header and a
        websocket bearer subprotocol are not for the runtime's streaming server (the API
        server's authenticators remove them once used; we remove them always)."""
        headers: list[tuple[str, str]] = []
        for name, value in self.headers:
            lowered = name.lower()
            if lowered == "authorization":
                continue
            if lowered == "sec-websocket-protocol":
                kept = [p.strip() for p in value.split(",")
                        if p.strip() and not p.strip().startswith(BEARER_PROTOCOL_PREFIX)]
                if not kept:
                    continue
                value = ", ".join(kept)
            headers.append((name, value))
        return replace(self, headers=tuple(headers))

    def head_for(self, target: str, host: str) -> bytes:
        """This request's head sent on to ``host`` for ``target``: what the kubelet's
        UpgradeAwareHandler writes to the runtime's streaming server."""
        lines = [f"{self.method} {target} HTTP/1.1", f"Host: {host}"]
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() != "host"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(data: bytes) -> Request:
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"malformed request line {lines[0][:100]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"malformed header line {line[:100]!r}")
        headers.append((name, value.strip()))
    return Request(parts[0], parts[1], parts[2], tuple(headers), rest)


async def read_request(stream: ByteStream) -> Request:
    """Read one request head (raises ``anyio.EndOfStream`` if the client closes first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise BadRequest("request head too large")
        data += await stream.receive()
    return parse_head(data)


def response_head(status: int, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, '')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def respond(stream: ByteStream, status: int, body: bytes | str,
                  content_type: str = "text/plain; charset=utf-8",
                  extra: Iterable[tuple[str, str]] = ()) -> None:
    payload = body.encode() if isinstance(body, str) else body
    headers = [("Content-Type", content_type), ("Content-Length", str(len(payload))), *extra]
    await stream.send(response_head(status, headers) + payload)


async def serve_one(client: ByteStream, handle: Callable[[Request], Awaitable[None]], *, head_timeout: float,
                    gone: tuple[type[Exception], ...], log: Any, what: str) -> None:
    """One request on ``client``: its head read within ``head_timeout`` (400 when malformed),
    then ``handle``. A client that goes (``gone``, a timeout) ends it quietly; anything else
    ``handle`` raises is logged and answered 500: one bad request never takes a listener (and
    the agent) down."""
    quiet: tuple[type[Exception], ...] = (*gone, TimeoutError)
    try:
        try:
            with anyio.fail_after(head_timeout):
                request = await read_request(client)
        except BadRequest as exc:
            await respond(client, 400, f"{exc}\n")
            return
        await handle(request)
    except quiet:
        return
    except Exception:  # noqa: BLE001 - contained: see above
        log.exception(f"{what} request failed")
        try:
            await respond(client, 500, "internal error\n")
        except gone:
            pass


class ChunkedBody:
    """A response body of unknown length (a log that may be followed): chunked transfer
    coding, as the kubelet sends logs. Each write is flushed to the client at once."""

    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream

    async def start(self, status: int = 200, content_type: str = "text/plain") -> None:
        await self._stream.send(response_head(status, [("Content-Type", content_type),
                                                       ("Transfer-Encoding", "chunked")]))

    async def write(self, data: bytes) -> None:
        if data:  # an empty chunk would end the body
            await self._stream.send(b"%x\r\n%s\r\n" % (len(data), data))

    async def end(self) -> None:
        await self._stream.send(b"0\r\n\r\n")


class StatusRecorder(ByteStream):
    """A client stream that remembers the status of the response sent on it (ours, or the
    runtime's answer to a spliced upgrade), for the request log."""

    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self._head = b""
        self.status: int | None = None

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._stream.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        if self.status is None and len(self._head) < 32:
            self._head += item[:32]
            parts = self._head.split(b" ", 2)
            if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1][:3].isdigit():
                self.status = int(parts[1][:3])
        await self._stream.send(item)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()

    @property
    def extra_attributes(self) -> Any:
        return self._stream.extra_attributes
