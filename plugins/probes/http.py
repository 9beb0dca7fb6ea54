"""HTTP GET and TCP connect probes (pkg/probe/http, pkg/probe/tcp), on anyio streams.

A probe needs the status code and at most 10 KiB of body from one request per connection, so a
small HTTP/1.1 client is enough and keeps the probe cancellable by its timeout."""

from __future__ import annotations

import os
import socket
import ssl
import struct
from urllib.parse import urljoin, urlsplit

import anyio
from anyio.abc import ByteStream, SocketAttribute

from plugins.probes.results import Outcome

USER_AGENT = "kube-probe/1.37"
MAX_BODY = 10 * 1024  # maxRespBodyLength
MAX_HEADER = 64 * 1024
MAX_REDIRECTS = 10
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})  # the ones Go's client follows


class DialError(Exception):
    """Connecting failed; the message reads like Go's ``dial tcp HOST:PORT: connect: ...``."""


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _insecure_tls() -> ssl.SSLContext:
    # Probes skip certificate verification, as the kubelet's (InsecureSkipVerify).
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def dial(host: str, port: int, *, tls: bool = False) -> ByteStream:
    try:
        stream: ByteStream
        if tls:
            stream = await anyio.connect_tcp(host, port, ssl_context=_insecure_tls(), tls_standard_compatible=False)
        else:
            stream = await anyio.connect_tcp(host, port)
    except OSError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        reason = os.strerror(cause.errno).lower() if cause.errno else str(cause)
        raise DialError(f"dial tcp {host_port(host, port)}: connect: {reason}") from exc
    # SO_LINGER 0, as the kubelet's ProbeDialer: close with RST so that frequent probes do not
    # fill the node with TIME_WAIT sockets.
    raw = stream.extra(SocketAttribute.raw_socket, None)
    if raw is not None:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return stream


async def probe_tcp(host: str, port: int, timeout: float) -> tuple[Outcome, str]:
    with anyio.move_on_after(timeout):
        try:
            stream = await dial(host, port)
        except DialError as exc:
            return Outcome.FAILURE, str(exc)
        await stream.aclose()
        return Outcome.SUCCESS, ""
    return Outcome.FAILURE, f"dial tcp {host_port(host, port)}: i/o timeout"


def format_url(scheme: str, host: str, port: int, path: str) -> str:
    if path and not path.startswith("/"):
        path = "/" + path
    return f"{scheme.lower()}://{host_port(host, port)}{path}"


async def probe_http(url: str, headers: list[tuple[str, str]], timeout: float) -> tuple[Outcome, str]:
    """GET ``url``: 200 ≤ code < 400 succeeds (3xx with a warning), anything else fails.
    Redirects to the same host are followed (at most 10); one to another host ends the probe
    as a warning, as the kubelet does not follow non-local redirects."""
    with anyio.move_on_after(timeout):
        return await _follow(url, _request_headers(headers))
    return Outcome.FAILURE, f'Get "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'


def _request_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    names = {name.lower() for name, _ in headers}
    out = list(headers)
    if "user-agent" not in names:
        out.append(("User-Agent", USER_AGENT))
    if "accept" not in names:
        out.append(("Accept", "*/*"))
    return out


async def _follow(url: str, headers: list[tuple[str, str]]) -> tuple[Outcome, str]:
    origin = urlsplit(url).hostname
    current = url
    for hops in range(MAX_REDIRECTS + 1):
        try:
            code, location, body = await _get(current, headers)
        except (DialError, OSError, anyio.EndOfStream, anyio.BrokenResourceError, ValueError) as exc:
            return Outcome.FAILURE, f'Get "{current}": {str(exc) or type(exc).__name__}'
        if code in REDIRECT_CODES and location:
            target = urljoin(current, location)
            if urlsplit(target).hostname != origin:
                break  # the redirect response itself is the answer
            if hops == MAX_REDIRECTS:
                return Outcome.FAILURE, f'Get "{target}": stopped after {MAX_REDIRECTS} redirects'
            current = target
            continue
        break
    text = body.decode(errors="replace")
    if 200 <= code < 300:
        return Outcome.SUCCESS, text
    if 300 <= code < 400:
        return Outcome.WARNING, f"Probe terminated redirects, Response body: {text}"
    return Outcome.FAILURE, f"HTTP probe failed with statuscode: {code}"


async def _get(url: str, headers: list[tuple[str, str]]) -> tuple[int, str, bytes]:
    parts = urlsplit(url)
    https = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if https else 80)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    lines = [f"GET {target} HTTP/1.1"]
    if not any(name.lower() == "host" for name, _ in headers):
        lines.append(f"Host: {parts.netloc}")
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append("Connection: close")
    stream = await dial(host, port, tls=https)
    async with stream:
        await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        reader = _Reader(stream)
        head = await reader.head(MAX_HEADER)
        status_line, *header_lines = [line.rstrip("\r") for line in head.decode("latin-1").split("\n")]
        fields = status_line.split(" ", 2)
        if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
            raise ValueError(f"malformed HTTP response {status_line!r}")
        code = int(fields[1])
        response_headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            response_headers.setdefault(name.strip().lower(), value.strip())
        body = await _body(reader, code, response_headers)
    return code, response_headers.get("location", ""), body


async def _body(reader: _Reader, code: int, headers: dict[str, str]) -> bytes:
    if code in (204, 304) or 100 <= code < 200:
        return b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = b""
        while len(body) < MAX_BODY:
            size_line = (await reader.until(b"\n", 1024)).split(b";")[0].strip()
            size = int(size_line, 16)
            if size == 0:
                break
            body += await reader.exactly(size)
            await reader.until(b"\n", 2)
        return body[:MAX_BODY]
    length = headers.get("content-length")
    if length is not None and length.isdigit():
        return await reader.exactly(min(int(length), MAX_BODY))
    return await reader.rest(MAX_BODY)


class _Reader:
    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self._buffer = b""
        self._eof = False

    async def _more(self) -> bool:
        if self._eof:
            return False
        try:
            self._buffer += await self._stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            self._eof = True
            return False
        return True

    async def until(self, marker: bytes, limit: int) -> bytes:
        while marker not in self._buffer:
            if len(self._buffer) > limit:
                raise ValueError("response header too long")
            if not await self._more():
                raise ValueError("unexpected EOF")
        data, _, self._buffer = self._buffer.partition(marker)
        return data

    async def head(self, limit: int) -> bytes:
        """The status line and headers. Lines may end in a bare LF, as Go's reader accepts (a
        CGI script behind busybox httpd writes its headers that way)."""
        while True:
            ends = [(i, len(m)) for m in (b"\r\n\r\n", b"\n\n") if (i := self._buffer.find(m)) >= 0]
            if ends:
                at, size = min(ends)
                data, self._buffer = self._buffer[:at], self._buffer[at + size:]
                return data
            if len(self._buffer) > limit:
                raise ValueError("response header too long")
            if not await self._more():
                raise ValueError("unexpected EOF")

    async def exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            if not await self._more():
                raise ValueError("unexpected EOF")
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    async def rest(self, limit: int) -> bytes:
        while len(self._buffer) < limit and await self._more():
            pass
        return self._buffer[:limit]
