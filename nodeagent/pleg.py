"""The pod lifecycle event generator: relist the runtime, keep a per-pod cache, publish changes.

Like the kubelet's generic PLEG we relist every second: ListPodSandbox + ListContainers, and
ContainerStatus only for containers whose state changed. Changes become facts on the bus
(ContainerStarted, ContainerExited) and wake the pod's observers.

Evented (the 1.37 kubelet's evented PLEG, which no longer replaces relisting): where the
runtime streams container events (containerd 2.x: GetContainerEvents), each event carries the
status of what it is about, and the relister takes it as it comes, as the kubelet's evented
PLEG builds a pod's status from its events: a new sandbox (with its IP; a pod the cache does not
hold yet gets its record from the sandbox's identity), a container's creation, start or exit, a
sandbox's stop. So an exit reaches its pod's worker within milliseconds, with no listing. An
exit or removal the cache cannot place (an unknown pod or sandbox, a removal) relists the pod it
names, or the node when it names none. The periodic relist stays as the safety net. A stream
that breaks is reconnected with back-off (0.5 s doubling to 30 s) while the periodic relist
carries on; a runtime without the stream (containerd 1.6: Unimplemented) is relisted
periodically only, said once.

Expectations: a new sandbox, a container's creation or start are the runtime stage's own doing.
On an evented runtime the stage says what it expects to see (``request_relist(uid,
expect=(id, state))``) instead of asking for a listing; once the cache shows every expectation
of the pod (from the events), the pod's record counts as fresh (``seen_at``) for the stage's
next plan, without a call to the runtime. An expectation no event meets within
EXPECT_GRACE_SECONDS, or one made while a relist of the pod is pending anyway, relists the pod.

Records only move forward (a container: created, running, exited; a sandbox: ready, not
ready): a listing that began before an event the cache holds neither takes its sandbox or
container back nor drops one the event added.

Per pod (the kubelet's on-demand relist, PLEGOnDemandRelist): an event, or a stage that just
changed its pod's runtime state, relists only the pod concerned, as the kubelet's GetPodStatus
reads one pod: ListPodSandbox and ListContainers filtered by the pod's UID label. The pod's
record is built by the same code as in a node-wide relist, so what its workers see is what a
full relist would have shown; the other pods are neither listed nor compared. More waiting
pods than one per PODS_PER_POD_RELIST on the node are relisted node-wide instead (cheaper then).
The node-wide relist keeps its period whatever pods were relisted meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import anyio
import structlog

from cri import CriError, RuntimeClient, Unavailable, Unimplemented
from cri import types as t
from cri.types import ContainerState, PodSandboxState
from nodeagent import labels as L
from nodeagent.backoff import Backoff
from nodeagent.events import ContainerExited, ContainerStarted, Event, PodRef, RuntimeAvailable, RuntimeUnavailable
from nodeagent.runtimeview import ContainerRecord, Expectation, PodRuntime, SandboxRecord, sandbox_ips

log = structlog.get_logger("nodeagent.pleg")


class NoAnswer(Exception):
    """The runtime stopped answering in the middle of a relist: the relist fails as a whole."""

RELIST_TIMEOUT_SECONDS = 5.0
"""A relist's bound: its listings, and then the calls its listing leaves to make."""
EVENT_SETTLE_SECONDS = 0.02
"""After an event relists its pod at once, how long the rest of its burst is gathered into one
more relist (a sandbox being stopped, a mass teardown: many events, two relists)."""
STREAM_TRUSTED_AFTER_SECONDS = 1.0
INSPECT_CONCURRENCY = 8
RELIST_ON = frozenset({t.ContainerEventType.CONTAINER_STOPPED_EVENT, t.ContainerEventType.CONTAINER_DELETED_EVENT})
"""The events that relist their pod when the cache cannot take them as they come (APPLY_ON): an
exit it cannot place, a removal (the garbage collector, an operator). (The 1.37 kubelet relists
on CONTAINER_STOPPED_EVENT.)"""
APPLY_ON = frozenset({t.ContainerEventType.CONTAINER_CREATED_EVENT, t.ContainerEventType.CONTAINER_STARTED_EVENT,
                      t.ContainerEventType.CONTAINER_STOPPED_EVENT})
"""The events whose sandbox or container status goes into the pod's record as it comes (see the
module docstring), when the cache knows what they are about; an exit the cache cannot place
relists (RELIST_ON)."""
EXPECT_GRACE_SECONDS = 0.25
"""How long an expectation waits for its event before its pod is relisted instead (the event
comes within milliseconds of the call; this only bounds a lost one)."""
_PROGRESS = {"created": 0, "running": 1, "exited": 2}
"""A container's states in the order it goes through them; "unknown" is none of them."""
PODS_PER_POD_RELIST = 10
"""Relisting one pod costs the agent about what a node-wide relist costs per 10 pods (measured
on containerd 2.4 with one container per pod: 1.0 ms CPU for one pod against 2.4 ms for the
node at 30 pods, 1.3 against 11 ms at 110; two calls each, the node-wide one converting and
comparing every pod). So while more than one pod per 10 on the node waits to be relisted (a
burst of exits, a mass start's stage requests), the node is relisted instead."""

_STATES = {
    ContainerState.CONTAINER_CREATED: "created",
    ContainerState.CONTAINER_RUNNING: "running",
    ContainerState.CONTAINER_EXITED: "exited",
    ContainerState.CONTAINER_UNKNOWN: "unknown",
}


class Relister:
    """Owns the pod cache. One instance per agent; ``run`` is its task."""

    def __init__(
        self,
        runtime: RuntimeClient,
        node_name: str,
        publish: Callable[[Event], Awaitable[None]],
        period: float = 1.0,
        on_relist: Callable[[float], None] | None = None,
        evented_period: float | None = None,
    ) -> None:
        self._runtime = runtime
        self._node = node_name
        self._publish = publish
        self._period = period
        self._evented_period = evented_period if evented_period is not None else period
        self._on_relist = on_relist
        self._pods: dict[str, PodRuntime] = {}
        self._containers: dict[str, ContainerRecord] = {}
        self._changed: dict[str, anyio.Event] = {}
        self._versions: dict[str, int] = {}
        """Per pod: how many changes of its record were announced (``version``)."""
        self._poke = anyio.Event()
        self._want_full = False
        """A node-wide relist was asked for (``request_relist()`` without a pod, a broken stream,
        an event whose pod cannot be told)."""
        self._want_pods: set[str] = set()
        """Pods to relist on their own at the next wake-up (their UIDs)."""
        self._burst_pods: set[str] = set()
        self._burst_full = False
        """What the events after a burst's first name (handed over when its window ends)."""
        self._full_at = 0.0
        """When the last node-wide relist ended (monotonic): the periodic one is due a period later."""
        self.healthy = False
        self.last_relist: float = 0.0
        self._listed_at = 0.0
        """When the last node-wide listing that succeeded began (wall time; 0: none yet)."""
        self._runtime_down = False
        self._stream_since: float | None = None
        """When the current event stream was opened (None: no stream)."""
        self._stream_events = 0
        self._settling = False
        self._settle_group: anyio.abc.TaskGroup | None = None
        self._expected: dict[str, dict[str, str]] = {}
        """Per pod: container or sandbox id -> the state a stage expects its event to show."""
        self._expect_until: dict[str, float] = {}
        """Per pod: when its expectations give way to a relist (monotonic)."""
        self._applied: dict[str, float] = {}
        """Containers an event put in the cache: container id -> when (wall time). A listing that
        began before keeps them; one that began after judges them like any other."""
        self._applied_sandboxes: dict[str, tuple[str, float]] = {}
        """The same for sandboxes: sandbox id -> (its pod's UID, when)."""
        self.events_seen = 0
        self.events_applied = 0
        """Sandboxes and containers the event stream moved on in the cache (creations, starts,
        exits, stops), without a listing."""
        self.pod_relists = 0
        """Pods relisted on their own (each counts once per pod listed)."""

    # --- reading ----------------------------------------------------------------------

    def pod(self, uid: str) -> PodRuntime:
        """The pod's record. A pod the cache does not hold gets an empty one as of the last
        node-wide listing (``seen_at``): the runtime had nothing of it then; 0 before any."""
        return self._pods.get(uid) or PodRuntime(uid=uid, seen_at=self._listed_at)

    def pods(self) -> dict[str, PodRuntime]:
        return dict(self._pods)

    def version(self, uid: str) -> int:
        """A number that changes with every change of the pod's record: a reader keeps the one
        it read with the record, and ``wait_changed(since=)`` tells it what it missed."""
        return self._versions.get(uid, 0)

    async def wait_changed(self, uid: str, timeout: float | None = None, since: int | None = None) -> None:
        """Until the pod's record changes (or ``timeout`` passes). ``since``: the ``version``
        the caller last read the record at; a change after it returns at once. Without it a
        change that came while the caller was busy (between reading the record and this call)
        would be missed until the next one: with events, that can be the safety-net relist."""
        if since is not None and self._versions.get(uid, 0) != since:
            await anyio.lowlevel.checkpoint()
            return
        event = self._changed.setdefault(uid, anyio.Event())
        with anyio.move_on_after(timeout):
            await event.wait()

    def request_relist(self, uid: str | None = None,
                       expect: Expectation | None = None) -> None:
        """Relist now rather than at the next tick (after a stage changed something): only the
        pod ``uid``, or the whole node. ``expect``: (container id, "created" or "running") or
        (sandbox id, "ready"), what the stage's change was; on an evented runtime its event
        shows it instead of a listing (see the module docstring)."""
        if uid and expect is not None and self.evented and not self._relist_pending(uid):
            container_id, state = expect
            self._expected.setdefault(uid, {})[container_id] = state
            self._expect_until.setdefault(uid, time.monotonic() + EXPECT_GRACE_SECONDS)
            if not self._met(uid):
                self._poke.set()  # the loop's wait now ends at this expectation's deadline too
            return
        if uid:
            self._want_pods.add(uid)
        else:
            self._want_full = True
        self._poke.set()

    def _relist_pending(self, uid: str) -> bool:
        return self._want_full or self._burst_full or uid in self._want_pods or uid in self._burst_pods

    def _met(self, uid: str) -> bool:
        """If the cache shows every expectation of the pod (and no relist of it is pending),
        the pod's record counts as fresh now: True."""
        expected = self._expected.get(uid)
        if not expected:
            return False
        for object_id, state in expected.items():
            if state == "ready":
                pod = self._pods.get(uid)
                if pod is None or not any(sb.id == object_id for sb in pod.sandboxes):
                    return False
                continue
            record = self._containers.get(object_id)
            if record is None or _PROGRESS.get(record.state, -1) < _PROGRESS[state]:
                return False
        del self._expected[uid], self._expect_until[uid]
        pod = self._pods.get(uid)
        if self._relist_pending(uid) or pod is None:
            self._want_pods.add(uid)  # a relist of the pod is due anyway: let it show the rest
            self._poke.set()
            return True
        self._pods[uid] = replace(pod, seen_at=max(time.time(), pod.seen_at))
        self._wake(uid)
        return True

    def _expire_expectations(self) -> None:
        """Expectations past their deadline: their pods are relisted."""
        now = time.monotonic()
        for uid, until in list(self._expect_until.items()):
            if until <= now:
                del self._expected[uid], self._expect_until[uid]
                self._want_pods.add(uid)

    def _wake(self, uid: str) -> None:
        if not uid:
            return
        self._versions[uid] = self._versions.get(uid, 0) + 1
        if uid in self._changed:
            self._changed.pop(uid).set()

    @property
    def evented(self) -> bool:
        """The runtime's event stream is up: it delivered an event, or has stayed open for a
        second (a runtime without it fails the call at once; an idle node sends nothing)."""
        if self._stream_since is None:
            return False
        return self._stream_events > 0 or time.monotonic() - self._stream_since >= STREAM_TRUSTED_AFTER_SECONDS

    @property
    def period(self) -> float:
        """Seconds to the next periodic relist: the safety-net period while events flow, else
        the kubelet's second."""
        return self._evented_period if self.evented else self._period

    # --- the loop ---------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._settle_group = tg
            await tg.start(self._relist_forever)
            tg.start_soon(self._follow_events)
            task_status.started()

    async def _relist_forever(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            self._poke = anyio.Event()  # pokes from now on ask for the listing after this one
            self._expire_expectations()
            # The node-wide relist keeps its own period: relisting single pods does not put it
            # off (while pods come and go, events would otherwise postpone it for good).
            if (not started or self._want_full or time.monotonic() - self._full_at >= self.period
                    or len(self._want_pods) > max(1, len(self._pods) // PODS_PER_POD_RELIST)):
                self._want_full = False
                self._want_pods.clear()  # the node-wide listing shows them as well
                await self.relist_once()
                self._full_at = time.monotonic()
            elif self._want_pods:
                uids, self._want_pods = self._want_pods, set()
                await self.relist_pods(uids)
            if not started:
                started = True
                task_status.started()
            wake_at = min([self._full_at + self.period, *self._expect_until.values()])
            with anyio.move_on_after(max(0.0, wake_at - time.monotonic())):
                await self._poke.wait()

    def _relist_for_event(self, uid: str | None) -> None:
        """The first event of a burst relists its pod at once (an exit is news: the kubelet's
        evented PLEG relists at the event too); the events that follow within
        EVENT_SETTLE_SECONDS are gathered into one more relist when the window ends. A sandbox
        being stopped kills its containers first and turns not-ready a little later: the
        trailing relist shows the end state, and the runtime stage waits out its own exit
        settle and asks the runtime before it restarts anything into a sandbox."""
        if self._settling:
            if uid is None:
                self._burst_full = True
            else:
                self._burst_pods.add(uid)
            return
        if uid is None:
            self._want_full = True
        else:
            self._want_pods.add(uid)
        self._poke.set()
        assert self._settle_group is not None, "the stream is followed inside run()"
        self._settling = True
        self._settle_group.start_soon(self._gather_burst)

    async def _gather_burst(self) -> None:
        try:
            await anyio.sleep(EVENT_SETTLE_SECONDS)
        finally:
            self._settling = False
            if self._burst_full or self._burst_pods:
                self._want_full = self._want_full or self._burst_full
                self._want_pods |= self._burst_pods
                self._burst_pods, self._burst_full = set(), False
                self._poke.set()

    def _event_pod(self, event: t.ContainerEventSummary | t.ContainerEvent) -> str | None:
        """The UID of the pod an event is about; "" for a pod this agent does not run (a full
        relist would not list it either); None when it cannot tell (relist the node)."""
        status = event.pod_sandbox_status
        if status is not None and status.id:
            if status.labels.get(L.MANAGED_BY) != self._node:
                return ""
            return status.metadata.uid or None
        # containerd sends no sandbox status once the sandbox is gone (its own deletion, or a
        # container's after it): place the id by what the cache knows.
        record = self._containers.get(event.container_id)
        if record is not None:
            return record.pod_uid or None
        for pod in self._pods.values():
            if any(sb.id == event.container_id for sb in pod.sandboxes):
                return pod.uid
        return None

    async def _follow_events(self) -> None:
        """Relist at the container events the runtime streams; reconnect when the stream
        breaks; give up (periodic relisting only) on a runtime without the stream."""
        backoff = Backoff(initial=0.5, maximum=30.0, jitter=0.2)
        while True:
            was_evented = False
            try:
                stream = self._runtime.container_events(summary=True, whose=RELIST_ON, statuses=APPLY_ON)
                self._stream_since, self._stream_events = time.monotonic(), 0
                try:
                    async for event in stream:
                        if self._stream_events == 0:
                            log.info("following the runtime's container events")
                        backoff.reset()
                        self._stream_events += 1
                        self.events_seen += 1
                        if isinstance(event, t.ContainerEvent) and await self._apply(event):
                            continue
                        if event.container_event_type not in RELIST_ON:
                            continue
                        uid = self._event_pod(event)
                        if uid != "":
                            self._relist_for_event(uid)
                finally:
                    was_evented = self.evented
                    self._stream_since = None
                    await stream.aclose()
                problem = "the runtime ended it"
            except Unimplemented:
                log.info("the runtime streams no container events; relisting every second only")
                return
            except CriError as exc:
                problem = str(exc)
            if was_evented:
                # Events may have been lost with the stream: look now, then every second until
                # it is back.
                log.warning("container event stream broken; relisting every second meanwhile", error=problem)
                self.request_relist()
            await anyio.sleep(backoff.next())

    async def _apply(self, event: t.ContainerEvent) -> bool:
        """A creation, start or exit as the event shows it, then the pod's expectations: a
        sandbox's record (a new one's, and its pod's for a pod the cache does not hold yet; a
        stopped one's), or the named container's record in its pod's when the cache knows the
        pod and the sandbox. True when the event was placed (news or not); False leaves it to a
        listing (an exit: RELIST_ON), as for a container of a pod or sandbox the cache does not
        know."""
        sandbox = event.pod_sandbox_status
        if sandbox is None or sandbox.labels.get(L.MANAGED_BY) != self._node:
            return sandbox is not None  # another node's: nothing of ours
        uid = sandbox.metadata.uid
        if event.container_id == sandbox.id:
            placed = self._apply_sandbox(sandbox)
            if uid in self._expected:
                self._met(uid)
            return placed
        pod = self._pods.get(uid)
        if pod is None or not event.containers_statuses or not any(sb.id == sandbox.id for sb in pod.sandboxes):
            return False
        status = event.containers_statuses[0]
        record = _record(status, uid, sandbox.id, "unknown")
        old = self._containers.get(status.id)
        events: list[Event] = []
        if _PROGRESS.get(record.state, -1) > (_PROGRESS.get(old.state, -1) if old is not None else -1):
            self.events_applied += 1
            self._containers[status.id] = record
            self._applied[status.id] = time.time()
            kept = tuple(c for c in pod.containers if c.id != status.id)
            self._pods[uid] = replace(pod, containers=(*kept, record), changed_at=time.time())
            events = _transitions(record, old, PodRef(uid=uid, name=pod.name, namespace=pod.namespace))
            self._wake(uid)
        if uid in self._expected:
            self._met(uid)
        for fact in events:
            await self._publish(fact)
        return True

    def _apply_sandbox(self, status: t.PodSandboxStatus) -> bool:
        """A sandbox as the event shows it: new to the cache and ready, its record with its IP
        in its pod's (a new pod's record carries the sandbox's identity, as a listing's would);
        known and now not ready, its record so. Sandboxes only go from ready to not ready: an
        event that says less than the cache is no news. False for a sandbox the cache does not
        know that is not ready (a listing's to show)."""
        uid = status.metadata.uid
        pod = self._pods.get(uid)
        ready = status.state == PodSandboxState.SANDBOX_READY
        known = next((sb for sb in pod.sandboxes if sb.id == status.id), None) if pod is not None else None
        now = time.time()
        if known is not None:
            if known.ready and not ready and pod is not None:
                self.events_applied += 1
                stopped = replace(known, ready=False)
                self._pods[uid] = replace(pod, sandboxes=tuple(stopped if sb is known else sb for sb in pod.sandboxes),
                                          changed_at=now)
                self._applied_sandboxes[status.id] = (uid, now)
                self._wake(uid)
            return True
        if not ready:
            return False
        ips = sandbox_ips(status)
        record = SandboxRecord(id=status.id, attempt=status.metadata.attempt, ready=True, created_at=status.created_at,
                               pod_ip=ips[0] if ips else "", pod_ips=ips)
        if pod is None:
            pod = PodRuntime(uid=uid, name=status.metadata.name, namespace=status.metadata.namespace,
                             sandboxes=(record,), changed_at=now, labels=dict(status.labels),
                             annotations=dict(status.annotations))
        else:
            pod = replace(pod, sandboxes=(*pod.sandboxes, record), changed_at=now)
        self.events_applied += 1
        self._pods[uid] = pod
        self._applied_sandboxes[status.id] = (uid, now)
        self._wake(uid)
        return True

    async def relist_once(self) -> None:
        """Relist the node: every sandbox and container this agent runs."""
        begin = time.monotonic()
        # A pod's seen_at is when its listing began: the records show the runtime as of then or
        # later, so a stage that changed the runtime at T can wait for seen_at > T.
        listed_at = time.time()
        problem = f"no answer to ListPodSandbox/ListContainers within {RELIST_TIMEOUT_SECONDS:g}s"
        listed = None
        # The client waits for a ready channel on reads; a relist must not: a runtime that does
        # not answer is news the node has to hear now (healthz, RuntimeUnavailable).
        with anyio.move_on_after(RELIST_TIMEOUT_SECONDS):
            try:
                listed = (await self._runtime.list_pod_sandbox(), await self._runtime.list_containers())
            except CriError as exc:
                problem = str(exc)
        if listed is not None:
            try:
                await self._update(*listed, listed_at, None)
            except NoAnswer as exc:
                listed, problem = None, str(exc)
        if listed is None:
            self.healthy = False
            if not self._runtime_down:
                self._runtime_down = True
                log.warning("runtime unavailable; pods keep their last known state", error=problem)
                await self._publish(RuntimeUnavailable(source="pleg", endpoint=self._runtime.endpoint, message=problem))
            return
        if self._runtime_down:
            self._runtime_down = False
            log.info("runtime available again")
            await self._publish(RuntimeAvailable(source="pleg", endpoint=self._runtime.endpoint, runtime="CRI"))
        self.healthy = True
        self.last_relist = time.time()
        self._listed_at = listed_at
        if self._on_relist:
            self._on_relist(time.monotonic() - begin)

    async def relist_pods(self, uids: set[str]) -> None:
        """Relist these pods only: ListPodSandbox and ListContainers filtered by each one's UID
        label (the kubelet's GetPodStatus). A runtime that fails or does not answer is the
        node-wide relist's to report: it is asked for instead."""
        listed_at = time.time()
        sandboxes: list[t.PodSandbox] = []
        containers: list[t.Container] = []
        listed = False
        if not self._runtime_down:
            with anyio.move_on_after(RELIST_TIMEOUT_SECONDS):
                try:
                    for uid in uids:
                        sandboxes += await self._runtime.list_pod_sandbox(
                            t.PodSandboxFilter(label_selector={L.POD_UID: uid, L.MANAGED_BY: self._node}))
                        # By the UID alone: a node-wide relist keeps any container in this
                        # agent's sandboxes, whatever its own labels say.
                        containers += await self._runtime.list_containers(
                            t.ContainerFilter(label_selector={L.POD_UID: uid}))
                    listed = True
                except CriError as exc:
                    log.info("could not relist pods; relisting the node", error=str(exc))
        if listed:
            try:
                await self._update(sandboxes, containers, listed_at, uids)
            except NoAnswer as exc:
                log.info("could not relist pods; relisting the node", error=str(exc))
                listed = False
        if not listed:
            self.request_relist()
            return
        self.pod_relists += len(uids)

    async def _update(self, sandboxes: list[t.PodSandbox], containers: list[t.Container], listed_at: float,
                      scope: set[str] | None) -> None:
        """Bring the cache in line with a listing of the node (scope None) or of the pods in
        ``scope``, wake the observers of the pods that changed and publish what happened. The
        same steps either way, so a pod's record does not depend on how it was listed."""
        mine = [s for s in sandboxes if s.labels.get(L.MANAGED_BY) == self._node]
        if scope is not None:
            mine = [s for s in mine if s.metadata.uid in scope]
        by_pod: dict[str, list[SandboxRecord]] = {}
        identity: dict[str, tuple[str, str, dict[str, str], dict[str, str]]] = {}
        for s in mine:
            uid = s.metadata.uid
            by_pod.setdefault(uid, []).append(
                SandboxRecord(id=s.id, attempt=s.metadata.attempt, ready=s.state == PodSandboxState.SANDBOX_READY,
                              created_at=s.created_at)
            )
            identity[uid] = (s.metadata.name, s.metadata.namespace, dict(s.labels), dict(s.annotations))

        # What this listing covers of the cache: all of it, or the containers of the pods in scope.
        before = (self._containers if scope is None
                  else {cid: r for cid, r in self._containers.items() if r.pod_uid in scope})
        sandbox_ids = {s.id for s in mine}
        seen: dict[str, ContainerRecord] = {}
        changed_pods: set[str] = set()
        events: list[Event] = []
        changed: list[tuple[t.Container, str]] = []
        for c in containers:
            if c.pod_sandbox_id not in sandbox_ids:
                continue
            state = _STATES.get(c.state, "unknown")
            old = self._containers.get(c.id)
            if old is not None and (old.state == state or _PROGRESS.get(old.state, -1) > _PROGRESS.get(state, -1)):
                seen[c.id] = old  # the same, or a listing older than the event that moved it on
            else:
                changed.append((c, state))
        old_ips = {sb.id: sb.pod_ips for pod in self._pods.values() for sb in pod.sandboxes}
        unknown_ips = [sb.id for sbs in by_pod.values() for sb in sbs if sb.ready and not old_ips.get(sb.id)]
        # What the listing leaves to ask (changed containers, new sandboxes' IPs) is asked before
        # the cache changes, within the relist's bound: a runtime that stops answering between the
        # listing and these calls fails the relist as a whole (NoAnswer), as if it had not
        # listed, instead of holding the relister for a read's whole deadline.
        with anyio.move_on_after(RELIST_TIMEOUT_SECONDS) as bound:
            inspected = await self._inspect_all(changed)
            ips = {sid: await self._sandbox_ips(sid) for sid in unknown_ips}
        if bound.cancelled_caught:
            raise NoAnswer(f"no answer to ContainerStatus/PodSandboxStatus within {RELIST_TIMEOUT_SECONDS:g}s")
        # Sandboxes events added or stopped after this listing began, it could not show: the
        # events' records stand, with their pods. What they did before, the listing has judged.
        for sid, (uid, applied_at) in list(self._applied_sandboxes.items()):
            if scope is not None and uid not in scope:
                continue
            cached_pod = self._pods.get(uid)
            kept = next((sb for sb in cached_pod.sandboxes if sb.id == sid), None) if cached_pod else None
            if applied_at < listed_at or kept is None or cached_pod is None:
                del self._applied_sandboxes[sid]
                continue
            records = by_pod.setdefault(uid, [])
            records[:] = [sb for sb in records if sb.id != sid]  # the listing's, older than the event's
            records.append(kept)
            identity.setdefault(uid, (cached_pod.name, cached_pod.namespace, cached_pod.labels, cached_pod.annotations))
            sandbox_ids.add(sid)
        for cid, listed in list(seen.items()):
            current = self._containers.get(cid)
            if current is not None and _PROGRESS.get(current.state, -1) > _PROGRESS.get(listed.state, -1):
                seen[cid] = current  # an event moved it on while the listing's calls were made
        for c, _ in changed:
            old = self._containers.get(c.id)
            record = inspected.get(c.id)
            if record is None:
                continue
            if old is not None and _PROGRESS.get(old.state, -1) > _PROGRESS.get(record.state, -1):
                seen[c.id] = old  # an event moved it on while its status was being read
                continue
            seen[c.id] = record
            uid = c.labels.get(L.POD_UID, "")
            changed_pods.add(uid)
            ref = PodRef(uid=uid, name=c.labels.get(L.POD_NAME, ""), namespace=c.labels.get(L.POD_NAMESPACE, ""))
            events += _transitions(record, old, ref)
        # What events added after this listing began, it could not show: kept. What they added
        # before, the listing has judged.
        for cid, applied_at in list(self._applied.items()):
            cached = self._containers.get(cid)
            if cached is None or applied_at < listed_at:
                if cached is None or scope is None or cached.pod_uid in scope:
                    del self._applied[cid]
                continue
            if cid not in seen and (scope is None or cached.pod_uid in scope) and cached.sandbox_id in sandbox_ids:
                seen[cid] = cached
        for gone in set(before) - set(seen):
            changed_pods.add(before[gone].pod_uid)
        if scope is None:
            self._containers = seen
        else:
            for cid in before:
                del self._containers[cid]
            self._containers.update(seen)

        by_uid: dict[str, list[ContainerRecord]] = {}
        for r in seen.values():
            by_uid.setdefault(r.pod_uid, []).append(r)
        new_pods: dict[str, PodRuntime] = {}
        for uid, sbs in by_pod.items():
            name, ns, labels, annotations = identity[uid]
            conts = tuple(by_uid.get(uid, ()))
            old_pod = self._pods.get(uid)
            sb_records = [_with_ips(sb, old_ips.get(sb.id) or ips.get(sb.id, ())) for sb in sbs]
            # An expectation met by events since the listing began made the record that fresh.
            seen_at = max(listed_at, old_pod.seen_at) if old_pod is not None else listed_at
            pod = PodRuntime(uid=uid, name=name, namespace=ns, sandboxes=tuple(sb_records), containers=conts,
                             seen_at=seen_at, changed_at=seen_at, labels=labels, annotations=annotations)
            if old_pod is None or old_pod.sandboxes != pod.sandboxes or old_pod.containers != pod.containers:
                changed_pods.add(uid)
            else:
                pod = replace(pod, changed_at=old_pod.changed_at)
            new_pods[uid] = pod
        if scope is None:
            changed_pods |= set(self._pods) - set(new_pods)
            self._pods = new_pods
            # Versions of pods gone with nobody waiting on them (a reader that still holds one
            # sees a different number, looks again and finds the pod gone).
            for uid in set(self._versions) - set(new_pods) - set(self._changed) - changed_pods:
                del self._versions[uid]
        else:
            for uid in scope - set(new_pods):
                if self._pods.pop(uid, None) is not None:
                    changed_pods.add(uid)
            self._pods.update(new_pods)
        for uid in changed_pods:
            self._wake(uid)
        for event in events:
            await self._publish(event)

    async def _inspect_all(self, changed: list[tuple[t.Container, str]]) -> dict[str, ContainerRecord]:
        """ContainerStatus for every changed container, a few at a time: after a mass start or
        teardown, one by one would leave the cache seconds behind."""
        found: dict[str, ContainerRecord] = {}
        unanswered: list[NoAnswer] = []
        limiter = anyio.CapacityLimiter(INSPECT_CONCURRENCY)

        async def one(c: t.Container, state: str) -> None:
            async with limiter:
                try:
                    record = await self._inspect(c, state)
                except NoAnswer as exc:  # raised as itself below, not in an exception group
                    unanswered.append(exc)
                    tg.cancel_scope.cancel()
                    return
            if record is not None:
                found[c.id] = record

        async with anyio.create_task_group() as tg:
            for c, state in changed:
                tg.start_soon(one, c, state)
        if unanswered:
            raise unanswered[0]
        return found

    async def _inspect(self, c: t.Container, state: str) -> ContainerRecord | None:
        try:
            st = await self._runtime.container_status(c.id)
        except Unavailable as exc:
            # Not "removed": the runtime went away after listing it. Dropped, the container would
            # look gone to its pod's stages, which would start it again.
            raise NoAnswer(str(exc)) from exc
        except CriError:
            return None  # removed between list and status; the next relist settles it
        return _record(st, c.labels.get(L.POD_UID, ""), c.pod_sandbox_id, state)

    async def _sandbox_ips(self, sandbox_id: str) -> tuple[str, ...]:
        try:
            st = await self._runtime.pod_sandbox_status(sandbox_id)
        except Unavailable as exc:
            raise NoAnswer(str(exc)) from exc
        except CriError:
            return ()
        return sandbox_ips(st)


def _with_ips(sandbox: SandboxRecord, ips: tuple[str, ...]) -> SandboxRecord:
    """The listing's record with the IPs known for it (a listing does not show them)."""
    return replace(sandbox, pod_ip=ips[0] if ips else "", pod_ips=ips) if ips else sandbox


def _record(st: t.ContainerStatus, pod_uid: str, sandbox_id: str, state: str) -> ContainerRecord:
    """A container's record from its ContainerStatus (``state``: when the status has none)."""
    annotations = st.annotations
    return ContainerRecord(
        id=st.id,
        name=st.labels.get(L.CONTAINER_NAME, st.metadata.name),
        pod_uid=pod_uid,
        sandbox_id=sandbox_id,
        attempt=st.metadata.attempt,
        state=_STATES.get(st.state, state),
        created_at=st.created_at,
        restart_count=int(annotations.get(L.CONTAINER_RESTART_COUNT, st.metadata.attempt) or 0),
        container_type=annotations.get(L.CONTAINER_TYPE, "container"),
        image=st.image.image if st.image else "",
        image_ref=st.image_ref,
        started_at=st.started_at,
        finished_at=st.finished_at,
        exit_code=st.exit_code,
        reason=st.reason,
        message=st.message,
        log_path=st.log_path,
        hash=annotations.get(L.CONTAINER_HASH, ""),
    )


def _transitions(record: ContainerRecord, old: ContainerRecord | None, ref: PodRef) -> list[Event]:
    """The facts of a container's move from ``old`` to ``record``. A container that ran and
    exited between two looks did start: that is published too (the kubelet's Started event must
    not depend on when the runtime was looked at)."""
    events: list[Event] = []
    started_unseen = (record.state == "exited" and record.started_at
                      and (old is None or old.state not in ("running", "exited")))
    if (record.state == "running" and (old is None or old.state != "running")) or started_unseen:
        events.append(ContainerStarted(pod=ref, source="pleg", container=record.name, container_id=record.id,
                                       attempt=record.attempt))
    if record.state == "exited" and (old is None or old.state != "exited"):
        events.append(ContainerExited(pod=ref, source="pleg", container=record.name, container_id=record.id,
                                      exit_code=record.exit_code, reason=record.reason))
    return events
