"""exec, attach and portForward: hand the client's upgrade to the runtime's streaming server.

The kubelet does not speak SPDY or websocket itself for these: it asks the runtime (CRI
``Exec``/``Attach``/``PortForward``) for a one-time URL on the runtime's streaming server
(containerd: http://127.0.0.1:<port>/exec/<token>) and proxies the client's upgrade request
there with the path rewritten (the kubelet's proxyStream, an UpgradeAwareHandler with
upgradeRequired). We do the same at the byte level: send the client's request head with the
URL's path and host, then copy bytes both ways until either side closes. Whatever the runtime
answers (101 Switching Protocols, or an error) reaches the client unchanged, so every
protocol the runtime speaks (SPDY/3.1 with v1–v4.channel.k8s.io, websocket) works.

The API server (1.37) speaks SPDY to nodes that do not declare ExtendWebSocketsToKubelet and
translates kubectl's websocket sessions itself; we declare nothing, so we never have to
translate websocket v5 to SPDY (the kubelet's translator) and a pure splice is enough.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import structlog
from anyio.abc import ByteStream

from nodeagent.kubeletserver.wire import Request

log = structlog.get_logger("nodeagent.kubeletserver")

CONNECT_TIMEOUT_SECONDS = 10.0
COPY_CHUNK = 65536
_CLOSED = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError, ssl.SSLError)


class StreamError(Exception):
    """The request cannot be handed off; ``status`` and the message are what the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class StreamOptions:
    """remotecommand's Options as the kubelet reads them from the query."""

    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def _flag(query: Mapping[str, list[str]], *names: str) -> bool:
    # The API server sends input/output/error/tty=1 (k8s.io/api/core/v1 ExecStdinParam ...);
    # the kubelet accepts only "1". stdin/stdout/stderr are accepted too, for hand-made requests.
    return any(query.get(name, [""])[0] in ("1", "true") for name in names)


def stream_options(query: Mapping[str, list[str]]) -> StreamOptions:
    tty = _flag(query, "tty")
    stdin = _flag(query, "input", "stdin")
    stdout = _flag(query, "output", "stdout")
    stderr = _flag(query, "error", "stderr")
    if tty and stderr:
        stderr = False  # a terminal has one output stream (remotecommand drops stderr too)
    if not (stdin or stdout or stderr):
        raise StreamError(400, "you must specify at least 1 of stdin, stdout, stderr")
    return StreamOptions(stdin=stdin, stdout=stdout, stderr=stderr, tty=tty)


def forward_ports(query: Mapping[str, list[str]], websocket: bool) -> list[int]:
    """portforward.NewV4Options: the ``port`` query parameter matters only for websocket
    clients (SPDY clients name the port per stream)."""
    if not websocket:
        return []
    values = query.get("port", [])
    if not values:
        raise StreamError(400, 'query parameter "port" is required')
    ports = []
    for value in values:
        for part in value.split(","):
            try:
                port = int(part)
            except ValueError:
                raise StreamError(400, f'unable to parse "{value}" as a port') from None
            if not 0 < port < 65536:
                raise StreamError(400, f'port "{value}" must be > 0')
            ports.append(port)
    return ports


async def splice(client: ByteStream, request: Request, url: str, *, idle_timeout: float = 4 * 3600.0) -> None:
    """Send ``request`` to ``url`` and copy bytes both ways until either side is done, or no
    byte has gone either way for ``idle_timeout`` seconds (streamingConnectionIdleTimeout)."""
    target = urlsplit(url)
    if target.scheme not in ("http", "https") or not target.hostname:
        raise StreamError(500, f"the runtime returned an unusable streaming URL {url!r}")
    secure = target.scheme == "https"
    port = target.port or (443 if secure else 80)
    context: ssl.SSLContext | None = None
    if secure:
        # containerd's TLS streaming uses a self-signed certificate it made at start; the
        # kubelet does not verify it either (proxyStream has no TLS configuration).
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with anyio.fail_after(CONNECT_TIMEOUT_SECONDS):
            backend: ByteStream
            if context is not None:
                backend = await anyio.connect_tcp(target.hostname, port, ssl_context=context,
                                                  tls_standard_compatible=False)
            else:
                backend = await anyio.connect_tcp(target.hostname, port)
    except (OSError, TimeoutError) as exc:
        raise StreamError(500, f"error dialing the runtime's streaming server {target.netloc}: {exc}") from exc
    path = target.path + (f"?{target.query}" if target.query else "")
    activity = _Activity()
    async with backend:
        await backend.send(request.head_for(path, target.netloc) + request.rest)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_copy, client, backend, tg.cancel_scope, activity)
            tg.start_soon(_copy, backend, client, tg.cancel_scope, activity)
            tg.start_soon(_idle_watch, activity, idle_timeout, tg.cancel_scope)


class _Activity:
    """When a byte last went either way."""

    def __init__(self) -> None:
        self.last = anyio.current_time()

    def touch(self) -> None:
        self.last = anyio.current_time()


async def _idle_watch(activity: _Activity, timeout: float, done: anyio.CancelScope) -> None:
    while True:
        left = activity.last + timeout - anyio.current_time()
        if left <= 0:
            log.info("streaming session idle; closing it", idle_seconds=timeout)
            done.cancel()
            return
        await anyio.sleep(left)


async def _copy(source: ByteStream, sink: ByteStream, done: anyio.CancelScope, activity: _Activity) -> None:
    # Either direction ending ends the session, as in the kubelet's proxy: a half-open
    # exec session would otherwise hold both connections until some timeout.
    try:
        while True:
            data = await source.receive(COPY_CHUNK)
            activity.touch()
            await sink.send(data)
    except _CLOSED:
        pass
    finally:
        done.cancel()
