"""The agent's own Node as the API server has it, kept current by a list and watch.

The kubelet keeps an informer on its Node (``fieldSelector=metadata.name=<node>``) and admits
pods against it: taints and labels an administrator sets live only there. This is that view.
A node's credentials may get, list and watch its own Node. Nothing here ever waits on the API
server: until the first listing answers, ``node`` is None and readers decide on what the agent
knows itself; failures are logged and retried with back-off.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import anyio.abc
import structlog
from lightkube.resources.core_v1 import Node

from nodeagent.clock import Clock, SystemClock
from nodeagent.cluster.apicalls import describe, is_gone

log = structlog.get_logger("nodeagent.cluster.nodewatch")

BACKOFF_INITIAL_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0
WATCH_TIMEOUT_SECONDS = 300  # the server ends each watch after 5–10 minutes (jittered)


class NodeWatch:
    def __init__(self, api: Any, name: str, clock: Clock | None = None) -> None:
        self._api = api
        self._name = name
        self._clock = clock or SystemClock()
        self._resource_version = ""
        self.node: dict[str, Any] | None = None
        """The Node as last seen (``to_dict`` form); None before the first listing or once deleted."""

    def taints(self) -> list[dict[str, Any]]:
        return list(((self.node or {}).get("spec") or {}).get("taints") or [])

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        delay = BACKOFF_INITIAL_SECONDS
        listed = False
        while True:
            try:
                if not listed:
                    await self._list()
                    listed = True
                await self._watch()
                delay = BACKOFF_INITIAL_SECONDS  # the server closed a healthy watch: resume
            except Exception as exc:  # noqa: BLE001 - transport errors, 5xx, 410: never fatal for the node
                if is_gone(exc):
                    listed = False
                    continue
                log.warning("watching the Node failed; retrying", node=self._name, error=describe(exc),
                            retry_in=delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_SECONDS)

    async def _list(self) -> None:
        listing = self._api.list(Node, fields={"metadata.name": self._name})
        found = [obj.to_dict() async for obj in listing]
        self._resource_version = listing.resourceVersion
        self.node = found[0] if found else None

    async def _watch(self) -> None:
        watch = self._api.watch(Node, fields={"metadata.name": self._name}, resource_version=self._resource_version,
                                server_timeout=WATCH_TIMEOUT_SECONDS + random.randint(0, WATCH_TIMEOUT_SECONDS))
        async for kind, obj in watch:
            self._resource_version = obj.metadata.resourceVersion
            if kind == "BOOKMARK":
                continue
            self.node = None if kind == "DELETED" else obj.to_dict()
