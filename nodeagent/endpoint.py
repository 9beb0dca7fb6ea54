"""The local HTTP endpoint: /healthz, /metrics, /pods, /trace/POD, /plugins.

Deliberately tiny (GET and HEAD only, one request per connection) so it needs no web framework; it
binds to loopback by default, like the kubelet's healthz port.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
import structlog
from anyio.abc import SocketListener, SocketStream

from nodeagent.listener import ConnectionLimit, Slot, accept_loop

log = structlog.get_logger("nodeagent.endpoint")

Handler = Callable[[str], tuple[int, str, str]]


@dataclass
class Routes:
    healthz: Callable[[], tuple[bool, str]]
    metrics: Callable[[], str]
    pods: Callable[[], list[dict[str, Any]]]
    trace: Callable[[str], list[dict[str, Any]]]
    plugins: Callable[[], dict[str, Any]]

    def handle(self, path: str) -> tuple[int, str, str]:
        if path == "/healthz":
            ok, why = self.healthz()
            return (200 if ok else 500), "text/plain", why
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", self.metrics()
        if path == "/pods":
            return 200, "application/json", json.dumps(self.pods())
        if path == "/plugins":
            return 200, "application/json", json.dumps(self.plugins())
        if path.startswith("/trace/"):
            chain = self.trace(unquote(path[len("/trace/"):]))
            if not chain:
                return 404, "text/plain", "no such pod in the trace\n"
            return 200, "application/json", json.dumps(chain)
        return 404, "text/plain", "not found\n"


LOCAL_MAX_CONNECTIONS = 256
_REASONS = {200: "OK", 404: "Not Found", 400: "Bad Request", 500: "Internal Server Error"}
ENDPOINT_TASK = "endpoint"


def _answer(routes: Routes, target: str, contain: Callable[[str, Exception], None] | None) -> tuple[int, str, str]:
    try:
        path = urlsplit(target).path
    except ValueError:  # e.g. an unbalanced "[" in the authority
        return 400, "text/plain", "malformed request target\n"
    try:
        return routes.handle(path)
    except Exception as exc:  # noqa: BLE001 - one request must not end the endpoint
        if contain is not None:
            contain(ENDPOINT_TASK, exc)
        else:
            log.exception("local endpoint request failed", path=path)
        return 500, "text/plain", f"internal error: {type(exc).__name__}\n"


async def serve(routes: Routes, host: str, port: int, contain: Callable[[str, Exception], None] | None = None,
                *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled. A request that makes a handler fail gets a 500 and is reported
    through ``contain``; it never ends the listener."""
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)
    log.info("local endpoint listening", url=f"http://{host}:{bound}")
    task_status.started(bound)

    async def client(stream: SocketStream, slot: Slot) -> None:
        try:
            with anyio.fail_after(10):
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 65536:
                    chunk = await stream.receive()
                    data += chunk
            limits.activate(slot)  # a whole request: no longer an idle socket to evict
            request_line = data.split(b"\r\n", 1)[0].decode("latin-1").split()
            # HEAD as Go's net/http answers it for the kubelet: GET's headers, no body (the node
            # e2e suite's HealthCheck, test/e2e/framework/node/helper.go, sends HEAD /healthz).
            method = request_line[0] if request_line else ""
            if len(request_line) < 2 or method not in ("GET", "HEAD"):
                status, ctype, body = 400, "text/plain", "only GET and HEAD are served\n"
            else:
                status, ctype, body = _answer(routes, request_line[1], contain)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, TimeoutError):
            return
        payload = body.encode()
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
        try:
            await stream.send(head + (b"" if method == "HEAD" else payload))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass

    # The kubelet API's accept loop: accept errors (EMFILE) back off instead of ending the
    # endpoint, and idle sockets cannot pile up past the cap.
    limits = ConnectionLimit(limit=LOCAL_MAX_CONNECTIONS)
    async with listener, anyio.create_task_group() as tg:
        for one in listener.listeners:  # one per address the host name resolves to
            assert isinstance(one, SocketListener)  # what create_tcp_listener makes
            tg.start_soon(accept_loop, one, client, limits, tg)
