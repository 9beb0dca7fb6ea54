"""The kubelet's Events: facts from the bus turned into core/v1 Event objects.

Each Event is in the pod's namespace, names the pod (and the container, as ``fieldPath``
``spec.containers{name}``), and says ``source.component: kubelet`` and ``host: <node>``, with the
kubelet's reasons and wording: Pulled, Created, Started, Killing, BackOff, Unhealthy,
ProbeWarning, FailedMount, Failed, FailedPostStartHook, FailedPreStopHook, Evicted, and a pod's
admission rejection reason. (Scheduled is the scheduler's. Pulling is not sent: no fact marks the start of
a pull, only its end.)

Events are best effort and must never slow a pod down: the bus subscriber only translates and
queues (a bounded queue that drops the oldest entry when full); a separate task sends, at its
own rate (the kubelet's eventRecordQPS / eventBurst), and gives up on an Event after a few
failed tries. Repeats of the same Event for the same object are counted on the existing object
(``count``, ``lastTimestamp``), as client-go's recorder does.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
from lightkube.resources.core_v1 import Event as ApiEvent
from lightkube.types import PatchType

from nodeagent import events as ev
from nodeagent.bus import Inbox
from nodeagent.clock import Clock, SystemClock
from nodeagent.cluster.apicalls import describe, is_not_found, is_refused
from nodeagent.cluster.ratelimit import TokenBucket
from nodeagent.status import rfc3339

log = structlog.get_logger("nodeagent.cluster.events")

QUEUE_MAX = 1000
AGGREGATE_MAX = 4096
ATTEMPTS = 3
RETRY_SECONDS = 1.0
TASK_FAILED = "NodeAgentTaskFailed"
"""Reason of the Node Event for a supervised task that failed (nodeagent.supervisor)."""
NORMAL, WARNING = "Normal", "Warning"

# PodWaiting reasons (a setup phase will be retried) and the Event the kubelet sends for each.
_WAITING: dict[str, tuple[str, str, str]] = {
    # waiting reason: (type, event reason, message format)
    "ErrImagePull": (WARNING, "Failed", "{message}"),
    "ImagePullBackOff": (NORMAL, "BackOff", "{message}"),
    "ErrImageNeverPull": (WARNING, "ErrImageNeverPull", "{message}"),
    "FailedMount": (WARNING, "FailedMount", "{message}"),
    "CreateContainerConfigError": (WARNING, "Failed", "Error: {message}"),
    "CreateContainerError": (WARNING, "Failed", "Error: {message}"),
    "RunContainerError": (WARNING, "Failed", "Error: {message}"),
    # plugins/runtime: an unknown RuntimeClass or handler, a refused user namespace, RunPodSandbox
    "FailedCreatePodSandBox": (WARNING, "FailedCreatePodSandBox", "{message}"),
    "FailedPrepareDynamicResources": (WARNING, "FailedPrepareDynamicResources", "{message}"),  # plugins/dra
}


@dataclass(frozen=True)
class Involved:
    kind: str
    namespace: str
    name: str
    uid: str
    field_path: str = ""

    def as_api(self) -> dict[str, Any]:
        obj = {"apiVersion": "v1", "kind": self.kind, "name": self.name, "uid": self.uid}
        if self.namespace:
            obj["namespace"] = self.namespace
        if self.field_path:
            obj["fieldPath"] = self.field_path
        return obj


@dataclass
class PendingEvent:
    involved: Involved
    type: str
    reason: str
    message: str
    at: float
    attempts: int = 0

    @property
    def key(self) -> tuple[Involved, str, str, str]:
        return (self.involved, self.type, self.reason, self.message)


@dataclass
class _PodFacts:
    """What translating a pod's facts needs: where each container is in the spec."""

    ref: ev.PodRef
    paths: dict[str, str] = field(default_factory=dict)
    images: dict[str, list[str]] = field(default_factory=dict)
    created: set[str] = field(default_factory=set)
    pulled: set[str] = field(default_factory=set)


class KubeEvents:
    def __init__(self, api: Any, node_name: str, *, qps: float = 50.0, burst: int = 100,
                 clock: Clock | None = None) -> None:
        self._api = api
        self._node = node_name
        self._clock = clock or SystemClock()
        self._limiter = TokenBucket(qps, burst, self._clock)
        self._queue: deque[PendingEvent] = deque(maxlen=QUEUE_MAX)
        self._wake = anyio.Event()
        self._pods: dict[str, _PodFacts] = {}
        self._sent: OrderedDict[tuple[Involved, str, str, str], tuple[str, int]] = OrderedDict()
        """Aggregation: (object, type, reason, message) → (Event name, count)."""
        self.dropped = 0
        self.sent = 0

    # --- recording (never blocks) --------------------------------------------------------

    def record(self, involved: Involved, type: str, reason: str, message: str) -> None:
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1  # the deque drops the oldest
        self._queue.append(PendingEvent(involved, type, reason, message, self._clock.now()))
        self._wake.set()

    def record_node(self, type: str, reason: str, message: str) -> None:
        """An Event about the Node (the kubelet names the node's UID as its name)."""
        self.record(Involved("Node", "", self._node, self._node), type, reason, message)

    def translate(self, event: ev.Event) -> None:
        """Turn one fact into zero or more Events."""
        uid = event.pod.uid
        if isinstance(event, ev.TaskFailed):
            # Not the kubelet's (its failures end the process); an operator watching the Node's
            # Events sees that part of the agent is restarting, and why.
            restart = (f"; restarting in {event.restart_in_seconds:.0f}s" if event.restart_in_seconds is not None
                       else "")
            self.record_node("Warning", TASK_FAILED, f"{event.task} failed ({event.failures} times): "
                             f"{event.error}{restart}")
            return
        if isinstance(event, ev.PodSpecObserved):
            self._track(event)
            return
        if isinstance(event, ev.PodForgotten):
            self._pods.pop(uid, None)
            return
        facts = self._pods.get(uid)
        if facts is None or not uid:
            return
        declared = event.kube_event()  # a stage's fact that says which Event it is
        if declared is not None:
            self.record(self._involved(facts, declared.container), declared.type, declared.reason, declared.message)
            return
        container = str(getattr(event, "container", "") or "")
        at = self._involved(facts, container)
        if isinstance(event, ev.ImagePulled):
            at = self._involved(facts, self._container_of_image(facts, event.image))
            if event.already_present:
                # The 1.37 kubelet's words (KubeletEnsureSecretPulledImages on: the pod's access was checked).
                self.record(at, NORMAL, "Pulled",
                            f'Container image "{event.image}" already present on machine '
                            "and can be accessed by the pod")
            else:
                self.record(at, NORMAL, "Pulled", f'Successfully pulled image "{event.image}"')
        elif isinstance(event, ev.ContainerCreated):
            facts.created.add(event.container_id)
            self.record(at, NORMAL, "Created", f"Created container: {container}")
        elif isinstance(event, ev.ContainerStarted):
            # The relister also reports containers it finds running after an agent restart;
            # only the ones this agent created were started now.
            if event.container_id in facts.created:
                self.record(at, NORMAL, "Started", f"Started container {container}")
        elif isinstance(event, ev.PodRejected):
            self.record(at, WARNING, event.reason, event.message)
        elif isinstance(event, ev.PodWaiting) and event.reason in _WAITING:
            type_, reason, fmt = _WAITING[event.reason]
            self.record(at, type_, reason, fmt.format(message=event.message))
        elif isinstance(event, ev.UnhonouredFieldsFound):
            self.record(at, WARNING, "UnhonouredFields", "nodeagent does not act on: " + ", ".join(event.fields))

    def _track(self, event: ev.PodSpecObserved) -> None:
        spec = event.pod_spec.get("spec") or {}
        facts = self._pods.get(event.pod.uid) or _PodFacts(event.pod)
        facts.ref = event.pod
        facts.paths.clear()
        facts.images.clear()
        for key in ("initContainers", "containers", "ephemeralContainers"):
            for c in spec.get(key) or []:
                facts.paths[c.get("name", "")] = f"spec.{key}{{{c.get('name', '')}}}"
                facts.images.setdefault(c.get("image", ""), []).append(c.get("name", ""))
        self._pods[event.pod.uid] = facts

    @staticmethod
    def _container_of_image(facts: _PodFacts, image: str) -> str:
        names = facts.images.get(image, [])
        for name in names:
            if name not in facts.pulled:
                facts.pulled.add(name)
                return name
        return names[0] if names else ""

    @staticmethod
    def _involved(facts: _PodFacts, container: str) -> Involved:
        ref = facts.ref
        return Involved("Pod", ref.namespace, ref.name, ref.uid, facts.paths.get(container, ""))

    # --- the tasks ----------------------------------------------------------------------

    async def run(self, inbox: Inbox, *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._consume, inbox)
            task_status.started()
            await self._send_forever()

    async def _consume(self, inbox: Inbox) -> None:
        async with inbox:
            async for event in inbox:
                try:
                    self.translate(event)
                except Exception:  # a translation bug must not stop the subscriber (back-pressure)
                    log.exception("event translation failed", kind=getattr(event, "kind", ""))

    async def _send_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._queue:
                item = self._queue.popleft()
                await self._limiter.acquire()
                try:
                    await self._send(item)
                    self.sent += 1
                except Exception as exc:  # noqa: BLE001 - best effort: a few tries, then dropped
                    item.attempts += 1
                    if is_refused(exc):
                        # E.g. the pod's namespace is being deleted (403): asking again cannot
                        # help, and waiting here would hold back every Event queued behind it.
                        self.dropped += 1
                        log.debug("event refused", reason=item.reason, error=describe(exc))
                    elif item.attempts < ATTEMPTS:
                        self._queue.appendleft(item)
                        await self._clock.sleep(RETRY_SECONDS * item.attempts)
                    else:
                        self.dropped += 1
                        log.debug("event dropped", reason=item.reason, error=describe(exc))

    async def _send(self, item: PendingEvent) -> None:
        stamp = rfc3339(item.at)
        seen = self._sent.get(item.key)
        if seen is not None:
            name, count = seen
            try:
                await self._api.patch(ApiEvent, name, {"count": count + 1, "lastTimestamp": stamp},
                                      namespace=self._namespace(item), patch_type=PatchType.MERGE)
                self._remember(item, name, count + 1)
                return
            except Exception as exc:
                if not is_not_found(exc):
                    raise
                # Expired (the API server keeps Events an hour): start a new one.
        name = f"{item.involved.name}.{time.time_ns():x}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": self._namespace(item)},
            "involvedObject": item.involved.as_api(),
            "reason": item.reason,
            "message": item.message,
            "type": item.type,
            "source": {"component": "kubelet", "host": self._node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": "kubelet",
            "reportingInstance": self._node,
        }
        await self._api.create(ApiEvent.from_dict(body))
        self._remember(item, name, 1)

    @staticmethod
    def _namespace(item: PendingEvent) -> str:
        return item.involved.namespace or "default"

    def _remember(self, item: PendingEvent, name: str, count: int) -> None:
        self._sent[item.key] = (name, count)
        self._sent.move_to_end(item.key)
        while len(self._sent) > AGGREGATE_MAX:
            self._sent.popitem(last=False)
