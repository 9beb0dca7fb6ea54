"""The bus: bounded anyio streams carrying facts from publishers to declared subscribers.

Who publishes what and who listens to what is declared once, in :data:`TOPOLOGY`; the agent
creates exactly those subscriptions, so ``nodeagent`` can print the wiring and a test can check
it. Streams are bounded: a slow subscriber slows publishers down (back-pressure) instead of
letting memory grow. No subscriber publishes into its own stream, so back-pressure cannot
deadlock.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from anyio.streams.memory import (
    MemoryObjectReceiveStream,
    MemoryObjectSendStream,
    MemoryObjectStreamStatistics,
)

from nodeagent.events import Event
from nodeagent.supervisor import failing_stray_cancellations

ALL = frozenset({"*"})


@dataclass(frozen=True)
class Publisher:
    name: str
    kinds: frozenset[str]
    why: str


@dataclass(frozen=True)
class Subscriber:
    name: str
    kinds: frozenset[str]
    why: str
    cluster_only: bool = False
    """Only subscribed in cluster mode (a standalone agent has nobody to read the stream)."""

    def wants(self, kind: str) -> bool:
        return self.kinds is ALL or "*" in self.kinds or kind in self.kinds


@dataclass(frozen=True)
class Topology:
    publishers: tuple[Publisher, ...]
    subscribers: tuple[Subscriber, ...]

    def render(self) -> str:
        lines = ["publishers:"]
        for p in self.publishers:
            lines.append(f"  {p.name:<12} {', '.join(sorted(p.kinds))}")
        lines.append("subscribers:")
        for s in self.subscribers:
            mode = "  (cluster mode)" if s.cluster_only else ""
            lines.append(f"  {s.name:<12} {', '.join(sorted(s.kinds))}{mode}")
        return "\n".join(lines)


TOPOLOGY = Topology(
    publishers=(
        Publisher(
            "sources",
            frozenset({"PodSpecObserved", "PodDeletionRequested", "ManifestRejected"}),
            "static manifests, the API server and the runtime replay describe the wanted pods",
        ),
        Publisher(
            "replay",
            frozenset({"OrphanFound"}),
            "at start, runtime pods nobody wants are handed to teardown",
        ),
        Publisher(
            "pleg",
            frozenset({"ContainerStarted", "ContainerExited", "RuntimeUnavailable", "RuntimeAvailable"}),
            "relisting the runtime turns container state changes into facts",
        ),
        Publisher(
            "workers",
            frozenset(
                {
                    "UnhonouredFieldsFound", "PodAdmitted", "PodRejected", "StageCompleted",
                    "StageFailed", "PodWaiting", "PodStarted", "PodCompleted", "PodTerminating",
                    "PodTerminated", "PodForgotten",
                }
            ),
            "pod workers report the outcome of every phase",
        ),
        Publisher(
            "pluginwatcher",
            frozenset({"PluginRejected"}),
            "a plugin registration socket of a type no stage handles (stages publish their own registrations)",
        ),
        Publisher(
            "supervisor",
            frozenset({"TaskFailed"}),
            "a long-running task failed and is restarted (never blocks: dropped when a queue is full)",
        ),
        Publisher(
            "stages",
            ALL,
            "stage plugins publish their own facts through their pod context (ImagePulled, SandboxStarted, ...)",
        ),
    ),
    subscribers=(
        Subscriber(
            "dispatcher",
            frozenset(
                {"PodSpecObserved", "PodDeletionRequested", "OrphanFound"}
            ),
            "routes wanted-pod facts and runtime changes to the pod's worker",
        ),
        Subscriber("trace", ALL, "keeps each pod's causal chain for `nodeagent trace`"),
        Subscriber("metrics", ALL, "counts and times what happens for /metrics"),
        Subscriber("eventlog", ALL, "writes every fact as a structured log line"),
        Subscriber(
            "kubeevents", ALL,
            "turns facts into the kubelet's core/v1 Events (Pulled, Created, Started, Killing, BackOff, "
            "Unhealthy, ...); stage-defined kinds included, hence every kind",
            cluster_only=True,
        ),
        Subscriber(
            "mirrors", frozenset({"PodSpecObserved", "PodDeletionRequested"}),
            "keeps a mirror pod in the API for every static pod",
            cluster_only=True,
        ),
    ),
)


class Inbox:
    """A subscriber's receive side of the bus.

    Iterating takes what is already queued without passing through the event loop, and waits
    (a checkpoint) only when the queue is empty. anyio's ``receive()`` checkpoints on every item:
    at ~130 facts per pod start and teardown, three subscribers each, those loop passes cost
    6.1 ms of CPU per pod in isolation, 0.8 ms without (benchmarks/bus.py). A subscriber that
    takes an event and handles it with no await in between still sees an empty queue only once
    everything published so far was handled.
    """

    def __init__(self, stream: MemoryObjectReceiveStream[Event]) -> None:
        self._stream = stream

    async def __aenter__(self) -> Inbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # The stream is the bus's, not the subscriber's: a subscriber that failed or was
        # cancelled (the supervisor restarting it, or its task group) is started again on this
        # same stream, with what was queued for it meanwhile. Bus.close() ends every inbox.
        return None

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> Event:
        try:
            return self._stream.receive_nowait()
        except anyio.WouldBlock:
            pass
        except anyio.EndOfStream:
            raise StopAsyncIteration from None
        try:
            return await self._stream.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def receive(self) -> Event:
        return await self._stream.receive()

    def receive_nowait(self) -> Event:
        return self._stream.receive_nowait()

    def statistics(self) -> MemoryObjectStreamStatistics:
        return self._stream.statistics()


async def consume(inbox: Inbox, handle: Callable[[Event], Awaitable[None] | None],
                  contain: Callable[[Exception], None]) -> None:
    """Hand every fact of ``inbox`` to ``handle``; a fact it fails on is given to ``contain``
    (the supervisor's report) and the next one is handled: one bad fact must neither stop the
    subscriber nor, with its queue filling up, every publisher behind it."""
    async with inbox:
        async for event in inbox:
            try:
                with failing_stray_cancellations():
                    outcome = handle(event)
                    if inspect.isawaitable(outcome):
                        await outcome
            except Exception as exc:  # noqa: BLE001 - contained and reported
                contain(exc)


@dataclass
class _Outlet:
    subscriber: Subscriber
    send: MemoryObjectSendStream[Event]
    receive: MemoryObjectReceiveStream[Event]


@dataclass
class Bus:
    topology: Topology = TOPOLOGY
    capacity: int = 1024
    cluster: bool = False
    """Cluster mode: the cluster-only subscribers get their streams too."""
    _outlets: dict[str, _Outlet] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for sub in self.topology.subscribers:
            if sub.cluster_only and not self.cluster:
                continue
            send, receive = anyio.create_memory_object_stream[Event](self.capacity)
            self._outlets[sub.name] = _Outlet(sub, send, receive)

    def stream(self, subscriber: str) -> Inbox:
        """The receive side for a declared subscriber (KeyError for an undeclared one)."""
        return Inbox(self._outlets[subscriber].receive)

    async def publish(self, event: Event) -> None:
        """Queue ``event`` for every subscriber that wants its kind. Only a full queue makes the
        publisher wait (back-pressure); otherwise publishing does not pass through the event
        loop (see :class:`Inbox` for what that costs)."""
        kind: str = getattr(event, "kind")  # noqa: B009 - each subclass declares kind, the base does not
        for outlet in self._outlets.values():
            if outlet.subscriber.wants(kind):
                try:
                    try:
                        outlet.send.send_nowait(event)
                    except anyio.WouldBlock:
                        await outlet.send.send(event)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass  # the subscriber is gone (agent shutting down)

    def offer(self, event: Event) -> int:
        """Queue ``event`` where there is room, never waiting; returns how many subscribers
        that wanted it did not get it (their queue was full). For facts about the agent's own
        health, published from places that must not block (a failing subscriber among them)."""
        kind: str = getattr(event, "kind")  # noqa: B009 - each subclass declares kind, the base does not
        missed = 0
        for outlet in self._outlets.values():
            if outlet.subscriber.wants(kind):
                try:
                    outlet.send.send_nowait(event)
                except anyio.WouldBlock:
                    missed += 1
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass
        return missed

    def depth(self) -> dict[str, int]:
        """Queued events per subscriber (metric nodeagent_bus_queue_depth)."""
        return {
            name: o.send.statistics().current_buffer_used for name, o in self._outlets.items()
        }

    def close(self) -> None:
        for outlet in self._outlets.values():
            outlet.send.close()
