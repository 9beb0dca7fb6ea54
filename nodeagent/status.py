"""The single status writer.

Stages report pieces (a container waiting for an image, the observed container statuses, a
rejection); the writer merges them with the pod's lifecycle state into one kubelet-shaped
``PodStatus`` and hands it to the sinks when it changed. No stage writes status anywhere else,
so two stages can never race on a pod's status.
"""

from __future__ import annotations

import calendar
import copy
import json
import math
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
from nodeagent.lifecycle import PodState
from nodeagent.model import Pod
from nodeagent.statefile import write_atomic


_log = structlog.get_logger("nodeagent.status")


def rfc3339(ts: float) -> str:
    """metav1.Time: seconds precision, UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def parse_rfc3339(stamp: object) -> float | None:
    """Seconds since the epoch of an API timestamp (its first 19 characters, taken as UTC:
    metav1.Time, or the kubelet's config.seen annotation); None when it is not one."""
    if not isinstance(stamp, str) or len(stamp) < 19:
        return None
    try:
        return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


class StatusSink(Protocol):
    async def write(self, ref: PodRef, status: Mapping[str, Any]) -> None: ...

    async def forget(self, ref: PodRef) -> None: ...


class FileSink:
    """Standalone mode: one JSON file per pod under ``<rootDir>/pod-status``, so status survives
    the agent and can be read by tools. Written as state files (nodeagent.statefile: atomic,
    durable, 0600) in a worker thread, since the fsync must not hold the event loop."""

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
        await anyio.to_thread.run_sync(write_atomic, path, data)

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
    observed: dict[str, Any] = field(default_factory=dict)
    probes: dict[str, tuple[bool | None, bool | None]] = field(default_factory=dict)
    conditions: dict[str, dict[str, str]] = field(default_factory=dict)
    start_time: float | None = None
    failed: bool = False
    """A stage failed the pod as a whole (reason/message say why): its phase is Failed."""
    rejected: bool = False
    """Admission said no. Stays true when the pod then goes (REJECTED → TERMINATED on its
    deletion): its status is the rejection's to the end, as the kubelet's never changes again."""
    observed_at: float = 0.0
    """When an observer last reported the runtime view (set_observed)."""
    computed: dict[str, Any] = field(default_factory=dict)
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
            r.reason, r.message = reason, message

        self._writer._update(self._uid, apply)

    def set_observed(self, status: Mapping[str, Any]) -> None:
        def apply(r: _PodRecord) -> None:
            r.observed, r.observed_at = dict(status), time.time()

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
        condition = {"type": type, "status": "True" if status else "False"}
        if reason:
            condition["reason"] = reason
        if message:
            condition["message"] = message
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
        rec = self._pods.get(uid)
        if rec is None:
            return {}
        if rec.dirty or not rec.computed:
            rec.computed = compute(rec)
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
        for rec in list(self._pods.values()):
            if not rec.dirty and rec.ref.uid not in self._failing:
                continue
            try:
                rec.computed = compute(rec)
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


def compute(rec: _PodRecord) -> dict[str, Any]:
    """Merge lifecycle, stage reports and the observed runtime into a kubelet-shaped status."""
    pod = rec.pod
    status: dict[str, Any] = {"hostIP": rec.host_ip, "hostIPs": [{"ip": rec.host_ip}]}
    if rec.start_time is not None:
        status["startTime"] = rfc3339(rec.start_time)
    status["qosClass"] = qos_class(pod)

    if rec.rejected:
        status.update(phase="Failed", reason=rec.reason, message=f"Pod was rejected: {rec.message}")
        return status

    # A deep copy: the refinements below edit container statuses and conditions in place, and
    # must neither change the observer's report nor a status already handed to the sinks.
    observed = copy.deepcopy(rec.observed)
    if observed:
        status.update({k: v for k, v in observed.items() if k not in ("hostIP", "hostIPs")})
    else:
        status["phase"] = "Pending"
        # The kubelet's default waiting reason is PodInitializing in a pod with init containers.
        default = "PodInitializing" if pod.spec.init_containers else "ContainerCreating"
        if pod.spec.init_containers:
            status["initContainerStatuses"] = [
                _waiting_status(c.name, c.image, *rec.waiting.get(c.name, (default, "")))
                for c in pod.spec.init_containers
            ]
        status["containerStatuses"] = [
            _waiting_status(c.name, c.image, *rec.waiting.get(c.name, (default, "")))
            for c in pod.spec.containers
        ]
        status["conditions"] = pending_conditions(pod, rec)

    # Waiting reasons reported by stages win over a terminated state the runtime shows:
    # the kubelet moves the terminated state to lastState and shows e.g. CrashLoopBackOff.
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key, []):
            reported = rec.waiting.get(cs["name"])
            if reported and "running" not in cs.get("state", {}):
                if "terminated" in cs.get("state", {}):
                    cs["lastState"] = {"terminated": cs["state"]["terminated"]}
                cs["state"] = {"waiting": _reason_dict(*reported)}

    if observed:
        _apply_probe_results(status, rec)
    for condition in rec.conditions.values():
        conditions = [c for c in status.get("conditions", []) if c["type"] != condition["type"]]
        status["conditions"] = [*conditions, dict(condition)]
    _apply_readiness_gates(status, pod)
    _stamp_transitions(status, rec)

    if rec.failed or (rec.reason and rec.state in (PodState.TERMINATING, PodState.TERMINATED)
                      and status.get("phase") != "Succeeded"):
        status.update(phase="Failed", reason=rec.reason, message=rec.message)
    elif rec.reason:
        status.setdefault("reason", rec.reason)
        if rec.message:
            status.setdefault("message", rec.message)
    return status


def _stamp_transitions(status: dict[str, Any], rec: _PodRecord) -> None:
    """lastTransitionTime is when a condition's status last changed, as the world saw it: probe
    results and stage conditions change statuses after the runtime view stamped them, so the
    time is settled here, last, against what this writer published before."""
    now = rfc3339(time.time())
    # Rebuilt from this status alone: a condition that went (a resize's, once done) starts
    # afresh if it comes back.
    transitions: dict[str, tuple[str, str]] = {}
    for condition in status.get("conditions", []):
        previous = rec.transitions.get(condition["type"])
        if previous is not None and previous[0] == condition["status"]:
            condition["lastTransitionTime"] = previous[1]
        elif previous is not None or "lastTransitionTime" not in condition:
            condition["lastTransitionTime"] = now
        transitions[condition["type"]] = (condition["status"], condition["lastTransitionTime"])
    rec.transitions = transitions


def _apply_probe_results(status: dict[str, Any], rec: _PodRecord) -> None:
    """Probe results refine what the runtime shows: a running container is started only once its
    startup probe succeeded, and ready only once its readiness probe did (the kubelet's rule)."""
    if not rec.probes:
        return
    unready = []
    # Sidecars are probed and count towards ContainersReady; a regular init container's
    # readiness is its successful exit, which no probe changes.
    sidecars = {c.name for c in rec.pod.spec.init_containers if c.restart_policy == "Always"}
    statuses = [cs for cs in status.get("initContainerStatuses", []) if cs["name"] in sidecars]
    for cs in [*statuses, *status.get("containerStatuses", [])]:
        ready, started = rec.probes.get(cs["name"], (None, None))
        running = "running" in cs.get("state", {})
        if started is not None:
            cs["started"] = running and started
        if ready is not None:
            cs["ready"] = running and cs.get("started", running) and ready
        if not cs.get("ready"):
            unready.append(cs["name"])
    for condition in status.get("conditions", []):
        if condition["type"] in ("Ready", "ContainersReady") and status.get("phase") not in ("Succeeded", "Failed"):
            condition.pop("reason", None)
            condition.pop("message", None)
            if unready:
                condition.update(status="False", reason="ContainersNotReady",
                                 message=f"containers with unready status: [{' '.join(unready)}]")
            else:
                condition["status"] = "True"


def _apply_readiness_gates(status: dict[str, Any], pod: Pod) -> None:
    """GeneratePodReadyCondition: with every container ready, the pod is Ready only while each
    readiness gate's condition (written by another party, read from the API's copy of the pod)
    is True."""
    if not pod.spec.readiness_gates:
        return
    ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
    if ready is None or ready["status"] != "True":
        return  # not ready anyway: the containers' reason stands
    others = {c.get("type"): c.get("status") for c in pod.status.get("conditions") or []}
    unready = []
    for gate in pod.spec.readiness_gates:
        found = others.get(gate.condition_type)
        if found is None:
            unready.append(f'corresponding condition of pod readiness gate "{gate.condition_type}" does not exist.')
        elif found != "True":
            unready.append(f'the status of pod readiness gate "{gate.condition_type}" is not "True", but {found}')
    if unready:
        ready.update(status="False", reason="ReadinessGatesNotReady", message=", ".join(unready))


def _reason_dict(reason: str, message: str) -> dict[str, str]:
    return {"reason": reason, "message": message} if message else {"reason": reason}


def _waiting_status(name: str, image: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": 0,
        "state": {"waiting": _reason_dict(reason, message)},
        "lastState": {},
    }


def pending_conditions(pod: Pod, rec: _PodRecord) -> list[dict[str, Any]]:
    now = rfc3339(time.time())
    sandbox_ready = rec.state in (PodState.STARTING, PodState.WAITING)
    names = [c.name for c in pod.spec.containers]
    return [
        {"type": "PodReadyToStartContainers", "status": "True" if sandbox_ready else "False", "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": now} if not pod.spec.init_containers else
        {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized", "lastTransitionTime": now,
         "message": f"containers with incomplete status: [{' '.join(c.name for c in pod.spec.init_containers)}]"},
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
         "message": f"containers with unready status: [{' '.join(names)}]", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
         "message": f"containers with unready status: [{' '.join(names)}]", "lastTransitionTime": now},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
    ]


def qos_class(pod: Pod) -> str:
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


def requirements_qos(requests: Mapping[str, Any], limits: Mapping[str, Any]) -> str:
    """requirementsQOS of one ResourceRequirements (pod-level resources): Guaranteed when CPU and
    memory are limited with requests equal to the limits, BestEffort when neither is set."""
    classes = set()
    for res in ("cpu", "memory"):
        limit, request = limits.get(res), requests.get(res, limits.get(res))
        if limit is None and request is None:
            classes.add("BestEffort")
        elif limit is not None and quantity.parse(request) == quantity.parse(limit):
            classes.add("Guaranteed")
        else:
            classes.add("Burstable")
    return classes.pop() if len(classes) == 1 else "Burstable"
