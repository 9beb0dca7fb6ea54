"""The kubelet's read-only port (``readOnlyPort``, 0 = off): plain HTTP, no authentication, no
authorization, only what the kubelet serves there (server.go ListenAndServeKubeletReadOnlyServer:
NewServer without an auth filter and without the debugging handlers):

    GET      /healthz, /pods
    GET|POST /stats/summary
    GET      /metrics, /metrics/resource, /metrics/cadvisor, /metrics/probes
    *        /run/, /exec/, /attach/, /portForward/, /containerLogs/, /runningpods/, /debug/pprof/,
             /logs/                        405 "Debug endpoints are disabled."

/configz is not served here (the kubelet installs it with the authenticated handlers). Anyone who
can reach the port reads every pod's spec and the node's usage: a kubeadm node sets it to 0, and
nodeagent's own configuration format does too; the kubelet's flag defaults (a command line with
no ``--config``) open it on 10255, and so does nodeagent then, with a warning.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import anyio
import structlog
from anyio.abc import SocketListener, SocketStream

from nodeagent.config import AgentConfig
from nodeagent.kubeletserver import nodestats
from nodeagent.kubeletserver.server import RequestCounts
from nodeagent.kubeletserver.wire import Request, StatusRecorder, respond, serve_one
from nodeagent.listener import ConnectionLimit, Slot, accept_loop

log = structlog.get_logger("nodeagent.kubeletserver.readonly")

REQUEST_HEAD_TIMEOUT_SECONDS = 30.0
MAX_CONNECTIONS = 256
DEBUG_DISABLED = "Debug endpoints are disabled."
DEBUG_HEADS = frozenset({"run", "exec", "attach", "portForward", "containerLogs", "runningpods", "logs"})
"""First path segments of the kubelet's debugging handlers (and /debug/pprof/)."""
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


class ReadOnlyServer:
    """Serves the read-only paths from what the kubelet API server reads (its pod list, the
    node's health, the stats and metrics); it changes nothing and calls no runtime."""

    def __init__(self, config: AgentConfig, *, healthz: Callable[[], tuple[bool, str]],
                 pods: Callable[[], dict[str, Any]], reads: nodestats.NodeReads | None,
                 requests: RequestCounts) -> None:
        self._address = config.kubelet.address
        self._port = config.kubelet.read_only_port
        self._healthz = healthz
        self._pods = pods
        self._reads = reads
        self.connections = ConnectionLimit(MAX_CONNECTIONS)
        self.requests = requests
        self.port: int | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled. A port that cannot be bound fails the task: the supervisor
        reports it and retries with back-off (the kubelet exits instead)."""
        listener = await anyio.create_tcp_listener(local_host=self._address, local_port=self._port)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        log.warning("kubelet read-only port serves pods, stats and metrics to every client, unauthenticated",
                    url=f"http://{self._address}:{self.port}")
        task_status.started(self.port)
        async with listener, anyio.create_task_group() as tg:
            for one in listener.listeners:
                assert isinstance(one, SocketListener)  # what create_tcp_listener makes
                tg.start_soon(accept_loop, one, self._connection, self.connections, tg)

    async def _connection(self, raw: SocketStream, slot: Slot) -> None:
        async with raw:
            client = StatusRecorder(raw)

            async def handle(request: Request) -> None:
                self.connections.activate(slot)
                started = time.monotonic()
                try:
                    await self._route(client, request)
                finally:
                    self.requests.add("readonly", request)
                    log.debug("kubelet read-only request", method=request.method, path=request.path,
                              status=client.status, seconds=round(time.monotonic() - started, 3))

            await serve_one(client, handle, head_timeout=REQUEST_HEAD_TIMEOUT_SECONDS, gone=_GONE, log=log,
                            what="kubelet read-only")

    async def _route(self, client: StatusRecorder, request: Request) -> None:
        parts = request.segments()
        head = parts[0] if parts else ""
        path = request.path.rstrip("/") or "/"
        if head in DEBUG_HEADS or (head == "debug" and parts[1:2] == ["pprof"]):
            await respond(client, 405, DEBUG_DISABLED + "\n")
            return
        if path in ("/healthz", "/pods"):
            allowed: tuple[str, ...] = ("GET",)
        elif self._reads is not None and path in nodestats.PATHS and path != "/configz":
            allowed = nodestats.PATHS[path]
        else:
            await respond(client, 404, "404 page not found\n")
            return
        if request.method not in allowed:
            await respond(client, 405, "Method Not Allowed", extra=[("Allow", ", ".join(allowed))])
        elif path == "/healthz":
            ok, why = self._healthz()
            await respond(client, 200 if ok else 500, "ok" if ok else why)
        elif path == "/pods":
            await respond(client, 200, json.dumps(self._pods()), "application/json")
        else:
            assert self._reads is not None
            await nodestats.serve(client, request, self._reads)


__all__ = ["DEBUG_DISABLED", "ReadOnlyServer"]
