"""The single status writer.

Stages report pieces (a container waiting for an image, the observed container statuses, a
rejection); the writer merges them with the pod's lifecycle state into one kubelet-shaped
``PodStatus`` and hands it to the sinks when it changed. No stage writes status anywhere else,
so two stages can never race on a pod's status.

The status is a typed model (nodeagent.podstatus) from the observer's report through every
refinement here; it becomes the API's JSON object once per computation (``PodStatus.to_api``),
and that one object is what the sinks get, what change detection compares, and what readers
(``get``, ``all``) see.
"""

from __future__ import annotations

import calendar
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog

from nodeagent import hostpaths, quantity
from nodeagent.backoff import Backoff
from nodeagent.events import PodRef
from nodeagent.labels import CONFIG_SOURCE
from nodeagent.lifecycle import PodState
from nodeagent.model import Pod
from nodeagent.podstatus import (
    ContainerState,
    ContainerStateTerminated,
    ContainerStateWaiting,
    ContainerStatus,
    HostIP,
    PodCondition,
    PodStatus,
    QOSClass,
)
from nodeagent.statefile import write_atomic

_log = structlog.get_logger("nodeagent.status")


def rfc3339(ts: float) -> str:
    """metav1.Time: seconds precision, UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


_STAMP = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})")


def parse_rfc3339(stamp: object) -> float | None:
    """Seconds since the epoch of an API timestamp (its first 19 characters, taken as UTC:
    metav1.Time, or the kubelet's config.seen annotation); None when it is not one.

    Read by hand, not by time.strptime: the gang view reads several stamps of every pod event
    in a namespace, and strptime cost five times this."""
    if not isinstance(stamp, str):
        return None
    found = _STAMP.match(stamp)
    if found is None:
        return None
    year, month, day, hour, minute, second = map(int, found.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 61):
        return None  # the ranges strptime accepts
    if day > 28 and day > calendar.monthrange(year, month)[1]:
        return None
    return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))


class StatusSink(Protocol):
    async def write(self, ref: PodRef, status: Mapping[str, Any]) -> None:
        """``status`` is the API's JSON object (PodStatus.to_api), the same one for every sink:
        read it, never change it."""

    async def forget(self, ref: PodRef) -> None: ...


class FileSink:
    """Standalone mode: one JSON file per pod under ``<rootDir>/pod-status``, so status survives
    the agent and can be read by tools. Written as state files (nodeagent.statefile: atomic,
    0600) in a worker thread, but not durable: the agent never reads them back (a restarted
    agent computes every status again from the runtime and rewrites the file), so an fsync of
    the file and its directory at every status change of every pod bought nothing."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o750, parents=True, exist_ok=True)

    def path(self, ref: PodRef) -> Path:
        """``<namespace>_<name>_<uid>.json``, hashed to fit a file name when longer; raises
        :class:`~nodeagent.hostpaths.UnsafeName` for names that are no path component."""
        return hostpaths.status_file(self.directory, ref.namespace, ref.name, ref.uid)

    async def write(self, ref: PodRef, status: Mapping[str, Any]) -> None:
        try:
            path = self.path(ref)
        except hostpaths.UnsafeName as exc:
            # Such a pod is rejected before any stage; its status stays in memory (/pods).
            _log.warning("status file not written: the pod's names are no file name", pod=str(ref), error=str(exc))
            return
        # One line (``jq .`` shows it indented): with ``indent`` json falls back from its C
        # encoder to the pure-Python one, ~5x the CPU, paid on every status change of every pod.
        data = json.dumps({"pod": ref.model_dump(), "status": status}, sort_keys=True, separators=(",", ":"))
        await anyio.to_thread.run_sync(lambda: write_atomic(path, data, durable=False))

    async def forget(self, ref: PodRef) -> None:
        try:
            path = self.path(ref)
        except hostpaths.UnsafeName:
            return  # never written
        path.unlink(missing_ok=True)


@dataclass
class _PodRecord:
    ref: PodRef
    pod: Pod
    host_ip: str
    state: PodState = PodState.OBSERVED
    reason: str = ""
    message: str = ""
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    observed: PodStatus | None = None
    """The runtime view the status stage last reported (set_observed)."""
    probes: dict[str, tuple[bool | None, bool | None]] = field(default_factory=dict)
    conditions: dict[str, PodCondition] = field(default_factory=dict)
    """Conditions owned by stages (set_condition), by type."""
    start_time: float | None = None
    failed: bool = False
    """A stage failed the pod as a whole (reason/message say why): its phase is Failed."""
    rejected: bool = False
    """Admission said no. Stays true when the pod then goes (REJECTED → TERMINATED on its
    deletion): its status is the rejection's to the end, as the kubelet's never changes again."""
    observed_at: float = 0.0
    """When an observer last reported the runtime view (set_observed)."""
    computed: dict[str, Any] = field(default_factory=dict)
    """The newest computed status, serialised (PodStatus.to_api): readers and sinks get this."""
    published: dict[str, Any] = field(default_factory=dict)
    """What the sinks were last given: a reader's get() refreshes ``computed`` without
    publishing, so changes are detected against this, never against ``computed``."""
    dirty: bool = True
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Condition type -> (status, lastTransitionTime) as last published."""


class PodReporter:
    """The StatusReporter a stage gets for one pod (see nodeagent.stages.StatusReporter)."""

    def __init__(self, writer: StatusWriter, uid: str) -> None:
        self._writer = writer
        self._uid = uid

    def container_waiting(self, container: str, reason: str, message: str = "") -> None:
        self._writer._update(self._uid, lambda r: r.waiting.__setitem__(container, (reason, message)))

    def clear_container_waiting(self, container: str) -> None:
        self._writer._update(self._uid, lambda r: r.waiting.pop(container, None))

    def set_pod_reason(self, reason: str, message: str = "") -> None:
        def apply(r: _PodRecord) -> None:
            if r.failed or r.rejected:
                # Final: a stage clearing its own waiting reason on the way out (dra's unprepare)
                # must not erase why the pod failed (a gang released it while dra waited).
                return
            r.reason, r.message = reason, message

        self._writer._update(self._uid, apply)

    def set_observed(self, status: PodStatus) -> None:
        def apply(r: _PodRecord) -> None:
            r.observed, r.observed_at = status, time.time()

        self._writer._update(self._uid, apply)

    def container_probe_result(self, container: str, *, ready: bool | None = None,
                               started: bool | None = None) -> None:
        def apply(r: _PodRecord) -> None:
            if ready is None and started is None:
                r.probes.pop(container, None)
            else:
                r.probes[container] = (ready, started)

        self._writer._update(self._uid, apply)

    def set_condition(self, type: str, status: bool, reason: str = "", message: str = "") -> None:
        condition = PodCondition(type=type, status="True" if status else "False", reason=reason or None,
                                 message=message or None)
        self._writer._update(self._uid, lambda r: r.conditions.__setitem__(type, condition))


FLUSH_SETTLE_SECONDS = 0.005
"""The reports one fact causes (a worker's several status calls) arrive within this."""
FLUSH_INTERVAL_SECONDS = 0.05
"""At most one flush per this interval while reports keep coming."""

SINK_TASK = "status-sink"
"""The supervisor's name for a failed status write (nodeagent_task_failures_total{task})."""


class StatusWriter:
    def __init__(self, sinks: Sequence[StatusSink], host_ip: str,
                 contain: Callable[[str, Exception], None] | None = None) -> None:
        self._sinks = list(sinks)
        self._host_ip = host_ip
        self._pods: dict[str, _PodRecord] = {}
        self._wake = anyio.Event()
        self._contain = contain or (lambda task, exc: None)
        self._retry = Backoff(initial=1.0, maximum=30.0)
        self._failing: set[str] = set()
        """Pods whose last write failed in some sink: written again after a back-off."""
        self._flushed_at = -math.inf
        self._flushing = anyio.Lock()
        """One flush at a time: a worker's flush before it forgets its pod waits for one under
        way, whose sink writes may not have reached every sink yet (the API sink would then be
        told to forget, and delete, a pod before its last status)."""

    # --- inputs -----------------------------------------------------------------------

    def track(self, ref: PodRef, pod: Pod) -> None:
        rec = self._pods.get(ref.uid)
        if rec is None:
            self._pods[ref.uid] = _PodRecord(ref=ref, pod=pod, host_ip=self._host_ip)
        else:
            rec.pod = pod
            rec.dirty = True
        self._wake.set()

    def fail(self, uid: str, reason: str, message: str) -> None:
        """The pod failed as a whole (PodContext.fail): phase Failed with this reason, for good."""
        def apply(r: _PodRecord) -> None:
            r.failed, r.reason, r.message = True, reason, message

        self._update(uid, apply)

    def observed_at(self, uid: str) -> float:
        rec = self._pods.get(uid)
        return rec.observed_at if rec is not None else 0.0

    def failed(self, uid: str) -> bool:
        rec = self._pods.get(uid)
        return rec is not None and rec.failed

    def reporter(self, uid: str) -> PodReporter:
        return PodReporter(self, uid)

    def set_state(self, uid: str, state: PodState) -> None:
        def apply(r: _PodRecord) -> None:
            r.state = state
            r.rejected = r.rejected or state is PodState.REJECTED
            if state is PodState.ADMITTED and r.start_time is None:
                r.start_time = time.time()

        self._update(uid, apply)

    def _update(self, uid: str, change: Any) -> None:
        rec = self._pods.get(uid)
        if rec is None:
            return
        change(rec)
        rec.dirty = True
        self._wake.set()

    async def forget(self, uid: str) -> None:
        rec = self._pods.pop(uid, None)
        self._failing.discard(uid)
        if rec is not None:
            for sink in self._sinks:
                try:
                    await sink.forget(rec.ref)
                except Exception as exc:  # noqa: BLE001 - a sink failing must not stop the worker
                    self._contain(SINK_TASK, exc)

    # --- outputs ----------------------------------------------------------------------

    def get(self, uid: str) -> dict[str, Any]:
        """The pod's status as the sinks get it (the API's JSON object); {} for an unknown pod."""
        rec = self._pods.get(uid)
        if rec is None:
            return {}
        if rec.dirty or not rec.computed:
            rec.computed = compute(rec).to_api()
        return rec.computed

    def all(self) -> dict[str, tuple[PodRef, Pod, dict[str, Any], PodState]]:
        return {uid: (r.ref, r.pod, self.get(uid), r.state) for uid, r in self._pods.items()}

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Flush changed statuses to the sinks; coalesces bursts of reports. Writes that failed
        (a full disk, a sink's error) are tried again after a back-off, 1 s doubling to 30 s."""
        task_status.started()
        while True:
            with anyio.move_on_after(self._retry.upcoming if self._failing else math.inf):
                await self._wake.wait()
            self._wake = anyio.Event()
            # An isolated change goes out at once (an exit is news); a burst of reports (a pod
            # starting, a mass teardown) is gathered into at most one flush per interval.
            await anyio.sleep(max(FLUSH_SETTLE_SECONDS, self._flushed_at + FLUSH_INTERVAL_SECONDS - time.monotonic()))
            failing = bool(self._failing)
            await self.flush()
            self._flushed_at = time.monotonic()
            if not self._failing:
                self._retry.reset()
            elif failing:
                self._retry.next()

    async def flush(self) -> None:
        async with self._flushing:
            await self._flush()

    async def _flush(self) -> None:
        for rec in list(self._pods.values()):
            if not rec.dirty and rec.ref.uid not in self._failing:
                continue
            try:
                rec.computed = compute(rec).to_api()
            except Exception as exc:  # noqa: BLE001 - a status bug for one pod: the others go on
                self._contain(SINK_TASK, exc)
                continue
            rec.dirty = False
            if rec.computed == rec.published and rec.ref.uid not in self._failing:
                continue
            rec.published = rec.computed
            self._failing.discard(rec.ref.uid)
            for sink in self._sinks:
                try:
                    await sink.write(rec.ref, rec.computed)
                except Exception as exc:  # noqa: BLE001 - reported, retried; the writer goes on
                    self._contain(SINK_TASK, exc)
                    self._failing.add(rec.ref.uid)


_PENDING_STATES = {PodState.OBSERVED, PodState.ADMITTED, PodState.PREPARING, PodState.WAITING, PodState.STARTING}


def compute(rec: _PodRecord) -> PodStatus:
    """Merge lifecycle, stage reports and the observed runtime into a kubelet-shaped status."""
    pod = rec.pod
    # The writer's own: the runtime view never says where the node is or when the pod started.
    own = PodStatus(host_ip=rec.host_ip, host_ips=[HostIP(ip=rec.host_ip)],
                    start_time=rfc3339(rec.start_time) if rec.start_time is not None else None,
                    qos_class=qos_class(pod))

    if rec.rejected:
        return own.model_copy(update={"phase": "Failed", "reason": rec.reason,
                                      "message": f"Pod was rejected: {rec.message}"})

    # Each step below builds a new status (the models are frozen); copies are kept to the steps
    # that change something, since a copy costs about as much as the step.
    observed = rec.observed
    update: dict[str, Any] = {"host_ip": own.host_ip, "host_ips": own.host_ips, "qos_class": own.qos_class}
    if observed is not None:
        base = observed
        init, regular = observed.init_container_statuses, observed.container_statuses
        update["start_time"] = own.start_time or observed.start_time
    else:
        base = own
        # The kubelet's default waiting reason is PodInitializing in a pod with init containers.
        default = "PodInitializing" if pod.spec.init_containers else "ContainerCreating"
        init = [_waiting_status(c.name, c.image, *rec.waiting.get(c.name, (default, "")))
                for c in pod.spec.init_containers] or None
        regular = [_waiting_status(c.name, c.image, *rec.waiting.get(c.name, (default, "")))
                   for c in pod.spec.containers]
        update.update(phase="Pending", conditions=pending_conditions(pod, rec))
    update["init_container_statuses"] = _overlay_waiting(init, rec.waiting)
    update["container_statuses"] = _overlay_waiting(regular, rec.waiting)
    if observed is not None and observed.ephemeral_container_statuses:
        update["ephemeral_container_statuses"] = _overlay_waiting(observed.ephemeral_container_statuses,
                                                                  rec.waiting)
    status = base.model_copy(update=update)

    if observed is not None:
        status = _apply_probe_results(status, rec)
    if rec.conditions:
        # A stage's condition replaces the runtime view's of its type, and goes last.
        kept = [c for c in status.conditions or () if c.type not in rec.conditions]
        status = status.model_copy(update={"conditions": [*kept, *rec.conditions.values()]})
    status = _apply_readiness_gates(status, pod)
    status = _stamp_transitions(status, rec)

    status = _terminal_phase(status, rec)
    if rec.failed or (rec.reason and rec.state in (PodState.TERMINATING, PodState.TERMINATED)
                      and status.phase != "Succeeded"):
        return status.model_copy(update={"phase": "Failed", "reason": rec.reason, "message": rec.message})
    if rec.reason:
        return status.model_copy(update={
            "reason": status.reason if status.reason is not None else rec.reason,
            "message": status.message if status.message is not None or not rec.message else rec.message,
        })
    return status


def _terminal_phase(status: PodStatus, rec: _PodRecord) -> PodStatus:
    """A torn-down API pod is terminal whatever its restart policy: Succeeded when every regular
    container exited 0, else Failed (getPhase with podIsTerminal, which the kubelet's
    syncTerminatingPod and SyncTerminatedPod pass, pkg/kubelet/kubelet_pods.go; a deleted
    restartPolicy: Always pod would otherwise stay Running for good). A container that never ran
    to an exit is shown as the kubelet's status manager shows it (TerminatePod): terminated, 137,
    ContainerStatusUnknown -- so a pod deleted while Pending ends Failed. Static pods keep the
    restart policy's phase, as the kubelet's TODO(#116484) does."""
    if rec.state is not PodState.TERMINATED or status.phase in ("Succeeded", "Failed"):
        return status
    if rec.pod.metadata.annotations.get(CONFIG_SOURCE, "api") != "api":
        return status
    regular = list(status.container_statuses or [])
    if not regular:
        return status
    unknown = ContainerStateTerminated(exit_code=137, reason="ContainerStatusUnknown",
                                       message="The container could not be located when the pod was terminated")
    shown = [c if c.state.terminated is not None else
             c.model_copy(update={"state": ContainerState(terminated=unknown), "ready": False, "started": False})
             for c in regular]
    ok = all(c.state.terminated is not None and c.state.terminated.exit_code == 0 for c in shown)
    return status.model_copy(update={"phase": "Succeeded" if ok else "Failed", "container_statuses": shown})


def _overlay_waiting(statuses: list[ContainerStatus] | None,
                     waiting: Mapping[str, tuple[str, str]]) -> list[ContainerStatus] | None:
    """Waiting reasons reported by stages win over a terminated state the runtime shows: the
    kubelet moves the terminated state to lastState and shows e.g. CrashLoopBackOff."""
    if statuses is None or not waiting:
        return statuses
    out = []
    for cs in statuses:
        reported = waiting.get(cs.name)
        if reported and cs.state.running is None:
            last = ContainerState(terminated=cs.state.terminated) if cs.state.terminated is not None else cs.last_state
            cs = cs.model_copy(update={"state": ContainerState(waiting=_waiting(*reported)), "last_state": last})
        out.append(cs)
    return out


def _stamp_transitions(status: PodStatus, rec: _PodRecord) -> PodStatus:
    """lastTransitionTime is when a condition's status last changed, as the world saw it: probe
    results and stage conditions change statuses after the runtime view stamped them, so the
    time is settled here, last, against what this writer published before."""
    if status.conditions is None:
        rec.transitions = {}
        return status
    now = rfc3339(time.time())
    # Rebuilt from this status alone: a condition that went (a resize's, once done) starts
    # afresh if it comes back.
    transitions: dict[str, tuple[str, str]] = {}
    stamped = []
    for condition in status.conditions:
        previous = rec.transitions.get(condition.type)
        stamp = condition.last_transition_time
        if previous is not None and previous[0] == condition.status:
            stamp = previous[1]
        elif previous is not None or stamp is None:
            stamp = now
        if stamp != condition.last_transition_time:
            condition = condition.model_copy(update={"last_transition_time": stamp})
        stamped.append(condition)
        transitions[condition.type] = (condition.status, stamp)
    rec.transitions = transitions
    return status.model_copy(update={"conditions": stamped})


def _apply_probe_results(status: PodStatus, rec: _PodRecord) -> PodStatus:
    """Probe results refine what the runtime shows: a running container is started only once its
    startup probe succeeded, and ready only once its readiness probe did (the kubelet's rule)."""
    if not rec.probes:
        return status
    unready: list[str] = []

    def refine(cs: ContainerStatus) -> ContainerStatus:
        probed_ready, probed_started = rec.probes.get(cs.name, (None, None))
        running = cs.state.running is not None
        started = cs.started if probed_started is None else running and probed_started
        ready = cs.ready
        if probed_ready is not None:
            ready = running and (started if started is not None else running) and probed_ready
        if not ready:
            unready.append(cs.name)
        if (started, ready) == (cs.started, cs.ready):
            return cs
        return cs.model_copy(update={"started": started, "ready": ready})

    # Sidecars are probed and count towards ContainersReady; a regular init container's
    # readiness is its successful exit, which no probe changes.
    sidecars = {c.name for c in rec.pod.spec.init_containers if c.restart_policy == "Always"}
    init = status.init_container_statuses
    if init is not None:
        init = [refine(cs) if cs.name in sidecars else cs for cs in init]
    regular = [refine(cs) for cs in status.container_statuses] if status.container_statuses is not None else None
    conditions = status.conditions
    if conditions is not None and status.phase not in ("Succeeded", "Failed"):
        ready_kinds = ("Ready", "ContainersReady")
        if unready:
            update: dict[str, Any] = {"status": "False", "reason": "ContainersNotReady",
                                      "message": f"containers with unready status: [{' '.join(unready)}]"}
        else:
            update = {"status": "True", "reason": None, "message": None}
        conditions = [c.model_copy(update=update) if c.type in ready_kinds else c for c in conditions]
    return status.model_copy(update={"init_container_statuses": init, "container_statuses": regular,
                                     "conditions": conditions})


def _apply_readiness_gates(status: PodStatus, pod: Pod) -> PodStatus:
    """GeneratePodReadyCondition: with every container ready, the pod is Ready only while each
    readiness gate's condition (written by another party, read from the API's copy of the pod)
    is True."""
    if not pod.spec.readiness_gates:
        return status
    ready = status.condition("Ready")
    if ready is None or ready.status != "True":
        return status  # not ready anyway: the containers' reason stands
    others = {c.get("type"): c.get("status") for c in pod.status.get("conditions") or []}
    unready = []
    for gate in pod.spec.readiness_gates:
        found = others.get(gate.condition_type)
        if found is None:
            unready.append(f'corresponding condition of pod readiness gate "{gate.condition_type}" does not exist.')
        elif found != "True":
            unready.append(f'the status of pod readiness gate "{gate.condition_type}" is not "True", but {found}')
    if not unready:
        return status
    gated = ready.model_copy(update={"status": "False", "reason": "ReadinessGatesNotReady",
                                     "message": ", ".join(unready)})
    return status.model_copy(update={"conditions": [gated if c is ready else c for c in status.conditions or ()]})


def _waiting(reason: str, message: str) -> ContainerStateWaiting:
    return ContainerStateWaiting(reason=reason, message=message or None)


def _waiting_status(name: str, image: str, reason: str, message: str) -> ContainerStatus:
    return ContainerStatus(name=name, image=image, image_id="", ready=False, started=False, restart_count=0,
                           state=ContainerState(waiting=_waiting(reason, message)), last_state=ContainerState())


def pending_conditions(pod: Pod, rec: _PodRecord) -> list[PodCondition]:
    now = rfc3339(time.time())
    sandbox_ready = rec.state in (PodState.STARTING, PodState.WAITING)
    names = " ".join(c.name for c in pod.spec.containers)
    init_names = " ".join(c.name for c in pod.spec.init_containers)
    return [
        PodCondition(type="PodReadyToStartContainers", status="True" if sandbox_ready else "False",
                     last_transition_time=now),
        PodCondition(type="Initialized", status="True", last_transition_time=now) if not pod.spec.init_containers else
        PodCondition(type="Initialized", status="False", reason="ContainersNotInitialized", last_transition_time=now,
                     message=f"containers with incomplete status: [{init_names}]"),
        PodCondition(type="Ready", status="False", reason="ContainersNotReady",
                     message=f"containers with unready status: [{names}]", last_transition_time=now),
        PodCondition(type="ContainersReady", status="False", reason="ContainersNotReady",
                     message=f"containers with unready status: [{names}]", last_transition_time=now),
        PodCondition(type="PodScheduled", status="True", last_transition_time=now),
    ]


def qos_class(pod: Pod) -> QOSClass:
    """Guaranteed when every container limits and requests cpu and memory equally; BestEffort
    when none requests or limits anything; else Burstable (pkg/apis/core/v1/helper/qos).
    Pod-level resources, when set, decide alone."""
    pod_level = pod.spec.resources
    if pod_level is not None and (pod_level.requests or pod_level.limits):
        return requirements_qos(pod_level.requests, pod_level.limits)
    containers = pod.all_containers()
    any_set = False
    guaranteed = True
    for c in containers:
        req, lim = c.resources.requests, c.resources.limits
        if any(res in req or res in lim for res in ("cpu", "memory")):
            any_set = True  # only cpu and memory decide (isSupportedQoSComputeResource)
        for res in ("cpu", "memory"):
            limit = lim.get(res)
            request = req.get(res, limit)
            if limit is None or request is None or quantity.parse(request) != quantity.parse(limit):  # 1 == 1000m
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def requirements_qos(requests: Mapping[str, Any], limits: Mapping[str, Any]) -> QOSClass:
    """requirementsQOS of one ResourceRequirements (pod-level resources): Guaranteed when CPU and
    memory are limited with requests equal to the limits, BestEffort when neither is set."""
    classes: set[QOSClass] = set()
    for res in ("cpu", "memory"):
        limit, request = limits.get(res), requests.get(res, limits.get(res))
        if limit is None and request is None:
            classes.add("BestEffort")
        elif limit is not None and quantity.parse(request) == quantity.parse(limit):
            classes.add("Guaranteed")
        else:
            classes.add("Burstable")
    return classes.pop() if len(classes) == 1 else "Burstable"
