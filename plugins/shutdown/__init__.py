"""The shutdown stage: graceful node shutdown as the kubelet does it (pkg/kubelet/nodeshutdown).

Configured by ``shutdownGracePeriod`` / ``shutdownGracePeriodCriticalPods`` (two groups:
priority 0 gets the difference, priority 2000000000 the critical part) or
``shutdownGracePeriodByPodPriority``; with no group (the default, 0s) the stage does nothing.

When the node is about to go down (systemd-logind's PrepareForShutdown, or ``nodeagent
shutdown`` where there is no logind: :mod:`plugins.shutdown.triggers`):

1. Node Event ``Normal Shutdown "Shutdown manager detected shutdown event"``; the node reports
   Ready False, ``node is shutting down`` (the lifecycle controller then taints it not-ready);
   new pods are refused (reason ``NodeShutdown``, ``Pod was rejected as the node is shutting
   down.``);
2. pods are stopped group by group, lowest priority first: a pod belongs to the group of the
   highest priority not above its own; a group's pods stop together, each with
   min(group seconds, its terminationGracePeriodSeconds), and the stage waits for them (their
   containers stopped, sandbox and volumes released) at most the group's seconds; an empty
   group costs nothing. Each ends ``Failed``, reason ``Terminated``, message ``Pod was terminated
   in response to imminent node shutdown.``, condition DisruptionTarget (TerminationByKubelet);
3. the start and end times are kept in ``<rootDir>/graceful_node_shutdown_state`` (JSON
   startTime / endTime, the kubelet's file) and shown as
   ``kubelet_graceful_shutdown_{start,end}_time_seconds``; the inhibitor lock (logind) is
   released.

A cancellation (PrepareForShutdown(false), the request file removed) is told with
``"Shutdown manager detected shutdown cancellation"``; the node becomes ready and admits again.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.abc
import structlog

from nodeagent import duration
from nodeagent.model import Pod
from nodeagent.stages import (
    Admit,
    AgentHandle,
    Condition,
    NodeTask,
    NodeView,
    PodSnapshot,
    Result,
)
from nodeagent.statefile import write_atomic
from plugins.shutdown import triggers
from plugins.shutdown.config import PriorityGracePeriod, ShutdownConfig, ShutdownOptions

log = structlog.get_logger("nodeagent.shutdown")

REASON = "Terminated"
MESSAGE = "Pod was terminated in response to imminent node shutdown."
REJECT_REASON = "NodeShutdown"
REJECT_MESSAGE = "Pod was rejected as the node is shutting down."
NOT_READY = Condition("Ready", False, "KubeletNotReady", "node is shutting down")
READY = Condition("Ready", True)
STATE_FILE = "graceful_node_shutdown_state"


def group_of(pod: Pod, groups: Sequence[PriorityGracePeriod]) -> int:
    """groupByPriority: the index of the highest group whose priority is not above the pod's
    (the first group for a pod below every group)."""
    priority = pod.spec.priority or 0
    index = 0
    for i, group in enumerate(groups):
        if group.priority <= priority:
            index = i
    return index


class ShutdownStage(Admit, NodeTask):
    name: ClassVar[str] = "shutdown"

    def __init__(self, config: ShutdownConfig, handle: AgentHandle) -> None:
        self.config = config
        self.handle = handle
        self.groups = config.groups()
        root = Path(handle.settings.root_dir)
        self.request_file = root / config.shutdown_request_file
        self.state_file = root / STATE_FILE
        self.shutting_down = False
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.trigger = "none"
        self._lock: anyio.abc.Process | None = None

    # --- admit --------------------------------------------------------------------------------

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        if self.shutting_down:
            return Result.reject(REJECT_REASON, REJECT_MESSAGE)
        return Result.ok()

    # --- the node task ---------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if not self.groups:
            log.info("graceful node shutdown disabled (shutdownGracePeriod 0)")
            task_status.started()
            await anyio.sleep_forever()
        wanted = self.config.shutdown_trigger
        self.trigger = wanted if wanted != "auto" else ("logind" if triggers.logind_available() else "request-file")
        log.info("graceful node shutdown armed", trigger=self.trigger,
                 groups=[(g.priority, g.shutdown_grace_period_seconds) for g in self.groups],
                 request_file=str(self.request_file) if self.trigger == "request-file" else None)
        async with AsyncExitStack() as stack:
            events: AsyncIterator[bool]
            if self.trigger == "logind":
                self._lock = await stack.enter_async_context(triggers.inhibitor_lock())
                events = triggers.logind_events()
            else:
                events = triggers.request_file_events(self.request_file)
            task_status.started()
            async for shutting_down in events:
                if shutting_down and not self.shutting_down:
                    await self.shut_down()
                    if self._lock is not None:
                        await stack.aclose()  # the pods are down: the node may go
                        self._lock = None
                elif not shutting_down and self.shutting_down:
                    self.cancelled()
                    if self.trigger == "logind" and self._lock is None:
                        self._lock = await stack.enter_async_context(triggers.inhibitor_lock())

    @property
    def inhibited(self) -> bool:
        """The logind delay lock is held (the node's shutdown waits for us)."""
        return self._lock is not None and self._lock.returncode is None

    def cancelled(self) -> None:
        log.info("shutdown cancelled")
        self.handle.node_event("Normal", "Shutdown", "Shutdown manager detected shutdown cancellation")
        self.shutting_down = False
        self.handle.set_node_condition(READY)

    async def shut_down(self) -> None:
        self.handle.node_event("Normal", "Shutdown", "Shutdown manager detected shutdown event")
        self.shutting_down = True
        self.handle.set_node_condition(NOT_READY)
        self.started_at, self.ended_at = time.time(), None
        self._write_state()
        pods = [p for p in self.handle.pods() if p.active]
        by_group: list[list[PodSnapshot]] = [[] for _ in self.groups]
        for snapshot in pods:
            by_group[group_of(snapshot.pod, self.groups)].append(snapshot)
        log.warning("shutting down the node's pods", pods=len(pods))
        for group, members in zip(self.groups, by_group, strict=True):
            if members:
                await self._stop_group(group, members)
        self.ended_at = time.time()
        self._write_state()
        log.warning("node shutdown: pods stopped", seconds=round(self.ended_at - self.started_at, 1))

    async def _stop_group(self, group: PriorityGracePeriod, members: Sequence[PodSnapshot]) -> None:
        seconds = group.shutdown_grace_period_seconds
        condition = Condition("DisruptionTarget", True, "TerminationByKubelet", MESSAGE)
        released = []
        for snapshot in members:
            grace = min(seconds, snapshot.pod.spec.termination_grace_period_seconds)
            log.info("shutdown: stopping pod", pod=str(snapshot.ref), priority=snapshot.pod.spec.priority or 0,
                     grace_period_seconds=grace)
            event = self.handle.evict(snapshot.ref.uid, reason=REASON, message=MESSAGE, grace_seconds=grace,
                                      condition=condition)
            if event is not None:
                released.append((snapshot, event))
        with anyio.move_on_after(seconds) as scope:
            for _, event in released:
                await event.wait()
        if scope.cancelled_caught:
            left = [str(s.ref) for s, e in released if not e.is_set()]
            log.warning("shutdown: group's grace period over; moving on", priority=group.priority, pods=left)

    def _write_state(self) -> None:
        def stamp(t: float | None) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t else "0001-01-01T00:00:00Z"

        try:
            write_atomic(self.state_file, json.dumps({"startTime": stamp(self.started_at),
                                                       "endTime": stamp(self.ended_at)}))
        except OSError as exc:
            log.warning("shutdown state not written", path=str(self.state_file), error=str(exc))

    # --- what it shows --------------------------------------------------------------------------

    def render_metrics(self) -> str:
        return ("# HELP kubelet_graceful_shutdown_start_time_seconds [ALPHA] Last graceful shutdown start time "
                "since unix epoch in seconds\n# TYPE kubelet_graceful_shutdown_start_time_seconds gauge\n"
                f"kubelet_graceful_shutdown_start_time_seconds {self.started_at or 0:.3f}\n"
                "# HELP kubelet_graceful_shutdown_end_time_seconds [ALPHA] Last graceful shutdown end time since "
                "unix epoch in seconds\n# TYPE kubelet_graceful_shutdown_end_time_seconds gauge\n"
                f"kubelet_graceful_shutdown_end_time_seconds {self.ended_at or 0:.3f}\n")

    def kubelet_config(self) -> dict[str, Any]:
        c = self.config
        return {"shutdownGracePeriod": duration.format(c.shutdown_grace_period),
                "shutdownGracePeriodCriticalPods": duration.format(c.shutdown_grace_period_critical_pods),
                "shutdownGracePeriodByPodPriority": [g.model_dump(by_alias=True)
                                                     for g in c.shutdown_grace_period_by_pod_priority]}

    def describe(self) -> dict[str, Any]:
        return {"trigger": self.trigger, "shutting_down": self.shutting_down, "inhibited": self.inhibited,
                "groups": [(g.priority, g.shutdown_grace_period_seconds) for g in self.groups]}


def plugin(options: ShutdownOptions | Mapping[str, Any], handle: AgentHandle) -> ShutdownStage:
    """The grace periods are the KubeletConfiguration's (``handle.settings``); the section holds
    only how the shutdown is learnt."""
    if not isinstance(options, ShutdownOptions):
        options = ShutdownOptions.model_validate(dict(options))
    return ShutdownStage(ShutdownConfig.of(handle.settings, options), handle)


plugin.stage_class = ShutdownStage  # type: ignore[attr-defined]
plugin.config_model = ShutdownOptions  # type: ignore[attr-defined]
__all__ = ["MESSAGE", "REASON", "ShutdownConfig", "ShutdownOptions", "ShutdownStage", "group_of", "plugin"]
