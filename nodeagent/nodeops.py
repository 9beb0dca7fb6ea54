"""The node-wide services of the plugin handle (the second group of
nodeagent.stages.AgentHandle): what node-level managers (eviction, GC, shutdown) may read and
do — the latest usage sample, a snapshot of the agent's pods, evicting a pod through its worker,
Node conditions and Events, whether the Node reports a volume in use, and node-level reclaim
offered by one stage to another.

The composition root builds one and attaches the dispatcher once it exists; plugins only see
it through their handle, so none needs a client, the status writer or a worker of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Literal

import anyio
import structlog

from nodeagent.nodeconditions import NodeConditions
from nodeagent.stages import Condition, PodSnapshot, ReclaimKind
from nodeagent.stats import Usage, UsageCollector
from nodeagent.status import StatusWriter
from nodeagent.volumesinuse import ReportedVolumes
from nodeagent.worker import Eviction

if TYPE_CHECKING:
    from nodeagent.dispatcher import Dispatcher

log = structlog.get_logger("nodeagent.node")

NodeEventSink = Callable[[str, str, str], None]


class NodeOps:
    def __init__(self, status: StatusWriter, conditions: NodeConditions, stats: UsageCollector | None = None,
                 node_event: NodeEventSink | None = None, reported_volumes: ReportedVolumes | None = None) -> None:
        self._status = status
        self._reported_volumes = reported_volumes
        self.conditions = conditions
        self.stats = stats
        self._node_event = node_event
        self.dispatcher: Dispatcher | None = None
        """Set by the composition root once the workers exist (evict needs them)."""
        self._reclaimers: dict[str, Callable[[], Awaitable[int]]] = {}
        self._sampled = anyio.Event()
        if stats is not None:
            stats.listeners.append(self._on_sample)

    def _on_sample(self, usage: Usage) -> None:
        self._sampled.set()
        self._sampled = anyio.Event()

    # --- usage ------------------------------------------------------------------------------

    def usage(self) -> Usage | None:
        return self.stats.latest if self.stats is not None else None

    async def usage_changed(self, timeout: float | None = None) -> None:
        with anyio.move_on_after(timeout):
            await self._sampled.wait()

    def request_usage(self) -> None:
        if self.stats is not None:
            self.stats.request()

    # --- pods -------------------------------------------------------------------------------

    def pods(self) -> Sequence[PodSnapshot]:
        return [PodSnapshot(ref, pod, status, state) for ref, pod, status, state in self._status.all().values()]

    def evict(self, uid: str, *, reason: str, message: str, grace_seconds: int,
              condition: Condition | None = None) -> anyio.Event | None:
        worker = self.dispatcher.workers.get(uid) if self.dispatcher is not None else None
        if worker is None:
            return None
        return worker.evict(Eviction(reason, message, max(int(grace_seconds), 0), condition))

    # --- the Node ---------------------------------------------------------------------------

    def set_node_condition(self, condition: Condition) -> None:
        self.conditions.set(condition)

    def node_event(self, type: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        (log.warning if type == "Warning" else log.info)("node event", reason=reason, message=message)
        if self._node_event is not None:
            self._node_event(type, reason, message)

    def volume_reported_in_use(self, unique_name: str) -> bool:
        if self._reported_volumes is None:
            return True  # standalone: no Node, no attach-detach controller to tell
        if self._reported_volumes.has(unique_name):
            return True
        self._reported_volumes.request()
        return False

    # --- reclaim ----------------------------------------------------------------------------

    def provide_reclaim(self, kind: ReclaimKind, reclaim: Callable[[], Awaitable[int]]) -> None:
        self._reclaimers[kind] = reclaim

    async def reclaim(self, kind: ReclaimKind) -> int | None:
        found = self._reclaimers.get(kind)
        return await found() if found is not None else None


__all__ = ["NodeOps"]
