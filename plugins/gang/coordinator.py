"""Across nodes: what a gang's pods in the API say, and who decides (docs/GANG.md, "Across nodes").

Every member's agent publishes its member's vote in that pod's status (condition
``gang.nodeagent.io/Prepared``, True, with the vote's expiry in the message). One deterministic
member is the *coordinator*: the member with the well-known index 0 if the workload numbers its
pods (Job completion index, LWS worker index, StatefulSet pod index, JobSet job index), else the
member with the smallest name, among the *current* members. Only the coordinator's agent writes
the decision, on the coordinator's own pod (``gang.nodeagent.io/StartCommitted``): True when it
sees minMember unexpired votes, False when a current member failed before the commit (quorum
impossible: it could not be admitted, its preparation failed, it released itself at its vote's
expiry) or when its own vote expired. Every member's agent, the coordinator's included, follows
the record once it sees it in the API.

This module is pure: :func:`pod_info` reads one API pod, :func:`assess` reads a gang's pods as
one agent sees them at one moment. The stage turns an :class:`Assessment` into actions.

Generations across nodes. An abort record ends the attempt of every member created no later
than T, the latest creation second among the members its coordinator saw (the record's message
says T; a record without it ends those created no later than its ``lastTransitionTime``); a pod
created after T is of the next generation (a controller's replacement forms a new quorum, even
when it is created in the same second as the abort). The *current* members are the gang's pods
that are bound to a node, not being deleted, not finished, and created after the latest abort
record. A commit is once satisfied: once a commit record (or its evidence, below) is visible,
every member joins it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent.status import parse_rfc3339, rfc3339
from plugins.gang.names import (
    ABORT_REASONS,
    ABORTED,
    COMMITTED,
    COMMITTED_CONDITION,
    PREPARED_CONDITION,
    WAITING,
)

INDEX_KEYS = (
    "batch.kubernetes.io/job-completion-index",  # Job (Indexed), JobSet's Jobs: label and annotation
    "jobset.sigs.k8s.io/job-index",  # JobSet: which Job of a ReplicatedJob
    "leaderworkerset.sigs.k8s.io/worker-index",  # LWS: 0 is the leader
    "apps.kubernetes.io/pod-index",  # StatefulSet
)
"""A pod whose every index among these (at least one) is 0 is a well-known index-0 member."""

_EXPIRY = re.compile(r"counts until (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")
_ATTEMPT = re.compile(r"\(members created until (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) were of this attempt\)$")
TERMINAL = frozenset({"Succeeded", "Failed"})




def vote_message(expires: float) -> str:
    """The Prepared condition's message: the expiry is floored to the second, so a coordinator
    never counts a vote a moment longer than its member holds it."""
    return f"prepared; this vote counts until {rfc3339(expires)}"


def attempt_end(created: Iterable[float | None], fallback: float) -> float:
    """The creation second that closes an aborted attempt: its latest member's (``fallback``,
    the decision's time, when no member says when it was created). Creation times have
    one-second resolution, so the decision's own time would also take in a replacement created
    in the same second, after the abort: such a pod must start the next attempt, not fail."""
    known = [c for c in created if c is not None]
    return max(known) if known else fallback


def abort_message(message: str, until: float) -> str:
    """An abort record's message: what happened, then which members it ends (read back by
    :func:`assess`; matched at the end, so a cause quoted inside it does not count)."""
    return f"{message} (members created until {rfc3339(until)} were of this attempt)"


def _attempt_until(message: str) -> float | None:
    found = _ATTEMPT.search(message)
    return parse_rfc3339(found.group(1)) if found else None


@dataclass(frozen=True)
class Condition:
    status: bool
    reason: str
    message: str
    at: float | None
    """lastTransitionTime, wall seconds."""


@dataclass(frozen=True)
class PodInfo:
    """What one agent knows of one gang member in the API."""

    uid: str
    namespace: str
    name: str
    node: str
    """spec.nodeName ("" while unbound)."""
    created: float | None
    deleting: bool
    phase: str
    reason: str
    message: str
    prepared: Condition | None
    committed: Condition | None
    started: bool
    """Some container of it has started (running, or terminated after a start)."""
    index0: bool

    @property
    def full_name(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def vote_expires(self) -> float | None:
        if self.prepared is None or not self.prepared.status or self.prepared.reason != WAITING:
            return None
        found = _EXPIRY.search(self.prepared.message)
        return parse_rfc3339(found.group(1)) if found else None


def _condition(raw: Mapping[str, Any] | None) -> Condition | None:
    if not raw:
        return None
    return Condition(raw.get("status") == "True", str(raw.get("reason") or ""), str(raw.get("message") or ""),
                     parse_rfc3339(raw.get("lastTransitionTime")))


def _index0(meta: Mapping[str, Any]) -> bool:
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    values = [labels.get(k, annotations.get(k)) for k in INDEX_KEYS]
    present = [v for v in values if v is not None]
    return bool(present) and all(str(v) == "0" for v in present)


def _started(status: Mapping[str, Any]) -> bool:
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        state = cs.get("state") or {}
        last = cs.get("lastState") or {}
        if "running" in state or (state.get("terminated") or {}).get("startedAt") \
                or (last.get("terminated") or {}).get("startedAt"):
            return True
    return False


def pod_info(obj: Mapping[str, Any]) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}
    return PodInfo(
        uid=str(meta.get("uid") or ""), namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""), node=str(spec.get("nodeName") or ""),
        created=parse_rfc3339(meta.get("creationTimestamp")), deleting=bool(meta.get("deletionTimestamp")),
        phase=str(status.get("phase") or ""), reason=str(status.get("reason") or ""),
        message=str(status.get("message") or ""),
        prepared=_condition(conditions.get(PREPARED_CONDITION)),
        committed=_condition(conditions.get(COMMITTED_CONDITION)),
        started=_started(status), index0=_index0(meta),
    )


@dataclass(frozen=True)
class AbortRecord:
    pod: PodInfo
    at: float
    reason: str
    message: str


@dataclass(frozen=True)
class Assessment:
    """One agent's reading of a gang's pods at one moment."""

    commit: str | None
    """Why the gang counts as committed (None: it does not): the coordinator's record, a member
    that followed it, or minMember members that have started."""
    aborts: tuple[AbortRecord, ...]
    """Abort records, oldest first."""
    current: tuple[PodInfo, ...]
    """The current generation's members, in coordinator order (the coordinator first)."""
    votes: tuple[PodInfo, ...]
    """Current members with an unexpired vote."""
    voted: tuple[PodInfo, ...]
    """Current members that voted, expired votes included (for messages)."""
    failed: tuple[PodInfo, ...]
    """Current-generation members that failed (they cannot be counted, nor replaced in time)."""

    @property
    def coordinator(self) -> PodInfo | None:
        return self.current[0] if self.current else None

    @property
    def epoch(self) -> float | None:
        """The latest abort record's time: pods created no later belong to aborted generations."""
        return self.aborts[-1].at if self.aborts else None

    def abort_for(self, created: float | None) -> AbortRecord | None:
        """The abort that ended the generation of a pod created at ``created`` (None: unknown,
        counts as old), if there was one: the first abort record at or after its creation."""
        for record in self.aborts:
            if created is None or created <= record.at:
                return record
        return None


def coordinator_order(pod: PodInfo) -> tuple[bool, str]:
    return (not pod.index0, pod.name)


def assess(pods: Iterable[PodInfo], min_member: int, now: float) -> Assessment:
    pods = list(pods)
    commit = None
    for pod in pods:
        if pod.deleting:
            continue  # a recreated group's terminating pods are not its evidence
        if pod.committed is not None and pod.committed.status:
            commit = f"commit record on {pod.full_name}"
            break
        if pod.prepared is not None and pod.prepared.status and pod.prepared.reason == COMMITTED:
            commit = commit or f"member {pod.full_name} followed a commit"
    if commit is None:
        started = [p for p in pods if p.started and not p.deleting]
        if len(started) >= min_member:
            commit = f"{len(started)} members started"
    aborts = []
    for pod in pods:
        record = pod.committed
        if record is not None and not record.status and record.reason in ABORT_REASONS:
            at = _attempt_until(record.message)
            if at is None:
                at = record.at if record.at is not None else pod.created
            if at is not None:
                aborts.append(AbortRecord(pod, at, record.reason or ABORTED, record.message))
    aborts.sort(key=lambda r: r.at)
    epoch = aborts[-1].at if aborts else None

    def of_current_generation(pod: PodInfo) -> bool:
        return epoch is None or (pod.created is not None and pod.created > epoch)

    current = sorted((p for p in pods if p.node and not p.deleting and p.phase not in TERMINAL
                      and of_current_generation(p)), key=coordinator_order)
    voted = tuple(p for p in current if p.vote_expires is not None)
    votes = tuple(p for p in voted if (p.vote_expires or 0) > now)
    # A member deleted from the API ends Failed too (its agent writes the terminal phase, as the
    # kubelet does), but it was withdrawn, not failed: its replacement may still complete the gang.
    failed = tuple(p for p in pods if p.phase == "Failed" and not p.deleting and of_current_generation(p)
                   and not p.started)
    return Assessment(commit, tuple(aborts), tuple(current), votes, voted, failed)
