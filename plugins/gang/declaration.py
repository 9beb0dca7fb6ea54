"""Recognising gangs as the ecosystem declares them, and learning minMember from the declaration.

The sources are tried in the order of reference/gang.md §8.2; the first one that names a group
defines the gang. minMember comes from the group object (PodGroup, Workload) where the scheduler
keeps it, or from the pod itself where the ecosystem puts it there (Kueue, Koordinator, ours).
A gang is never inferred from workload size (LWS size, Job parallelism, replica counts): a
barrier over members that are created only after another member is Ready deadlocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent.model import Pod
from nodeagent.status import parse_rfc3339
from plugins.gang.catalog import GroupCatalog

# nodeagent's own declaration, for standalone use (and to give minMember to a pod whose
# scheduler object the agent cannot read).
NAME = "gang.nodeagent.io/name"
MIN_MEMBER = "gang.nodeagent.io/min-member"
TIMEOUT = "gang.nodeagent.io/timeout-seconds"

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_LEGACY_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
COSCHEDULING_LEGACY_MIN = "pod-group.scheduling.sigs.k8s.io/min-available"
VOLCANO_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
KAI_ANNOTATION = "pod-group-name"
KUEUE_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
KOORDINATOR_NAME = "gang.scheduling.koordinator.sh/name"
KOORDINATOR_MIN = "gang.scheduling.koordinator.sh/min-available"
# Kueue stamps total-count = LWS size on LeaderWorkerSet pods, and LWS creates the workers only
# after the leader is Ready under startupPolicy LeaderReady: counting them would deadlock.
LWS_LABEL = "leaderworkerset.sigs.k8s.io/name"

CORE_GROUP = "scheduling.k8s.io"
COSCHEDULING_GROUP = "scheduling.x-k8s.io"
VOLCANO_GROUP = "scheduling.volcano.sh"
KAI_GROUP = "scheduling.run.ai"

COSCHEDULING_DEFAULT_TIMEOUT = 60.0
"""scheduler-plugins' permitWaitingTimeSeconds default, used when a PodGroup has no
scheduleTimeoutSeconds."""


class DeclarationError(ValueError):
    """The pod declares a gang, but the declaration cannot be used (e.g. min-member "four")."""


@dataclass(frozen=True)
class GangKey:
    namespace: str
    source: str
    """Which declaration named the group: schedulingGroup, workloadRef, coscheduling, volcano,
    kai, kueue, koordinator or nodeagent. Two sources never share a gang."""
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Declaration:
    key: GangKey
    min_member: int | None
    """None: the pod names a group whose minMember cannot be learned here."""
    min_member_from: str
    """Where minMember came from (or why it is unknown), for messages."""
    timeout_seconds: float | None
    """The declaration's own bound on holding, if it has one."""


@dataclass(frozen=True)
class _Found:
    source: str
    name: str
    min_member: int | None
    origin: str
    timeout: float | None = None


def declaration_of(pod: Pod, catalog: GroupCatalog) -> Declaration | None:
    """The gang ``pod`` belongs to, or None for a pod that is in no gang."""
    for source in _SOURCES:
        found = source(pod, catalog)
        if found is None:
            continue
        annotations = pod.metadata.annotations
        min_member, origin = found.min_member, found.origin
        if min_member is None and MIN_MEMBER in annotations:
            min_member, origin = _count(annotations[MIN_MEMBER], MIN_MEMBER), f"annotation {MIN_MEMBER}"
        timeout = found.timeout
        if TIMEOUT in annotations:
            timeout = _seconds(annotations[TIMEOUT], TIMEOUT)
        return Declaration(GangKey(pod.metadata.namespace, found.source, found.name), min_member, origin, timeout)
    return None


def created_at(pod: Pod) -> float | None:
    """When the pod was created (API: creationTimestamp; static pods: when the file was seen),
    in seconds since the epoch, to the second; None when the pod says neither."""
    stamp = pod.metadata.creation_timestamp or pod.metadata.annotations.get("kubernetes.io/config.seen")
    return parse_rfc3339(stamp)


# --- the sources, in order ----------------------------------------------------------------


def _scheduling_group(pod: Pod, catalog: GroupCatalog) -> _Found | None:
    group = pod.spec.scheduling_group
    if group is None:
        return None
    name = group.pod_group_name
    obj = catalog.get(CORE_GROUP, "PodGroup", pod.metadata.namespace, name)
    if obj is None:
        return _Found("schedulingGroup", name, None, f"PodGroup {name} (not found)")
    policy = _path(obj, "spec", "schedulingPolicy")
    if not isinstance(policy, Mapping) or "gang" not in policy:
        return None  # a basic policy: the pods are grouped, not ganged
    return _Found("schedulingGroup", name, _count(_path(policy, "gang", "minCount"), "minCount"),
                  f"PodGroup {name} spec.schedulingPolicy.gang.minCount")


def _workload_ref(pod: Pod, catalog: GroupCatalog) -> _Found | None:
    ref = pod.spec.workload_ref
    if ref is None:
        return None
    # podGroupReplicaKey splits one pod group into independent gangs.
    name = "/".join(p for p in (ref.name, ref.pod_group, ref.pod_group_replica_key) if p)
    obj = catalog.get(CORE_GROUP, "Workload", pod.metadata.namespace, ref.name)
    if obj is None:
        return _Found("workloadRef", name, None, f"Workload {ref.name} (not found)")
    spec = obj.get("spec") or {}
    # v1alpha1: podGroups[].policy; later versions: podGroupTemplates[].schedulingPolicy.
    for entries, policy_field in (("podGroups", "policy"), ("podGroupTemplates", "schedulingPolicy")):
        for entry in spec.get(entries) or []:
            if isinstance(entry, Mapping) and entry.get("name") == ref.pod_group:
                policy = entry.get(policy_field) or {}
                if "gang" not in policy:
                    return None
                return _Found("workloadRef", name, _count(_path(policy, "gang", "minCount"), "minCount"),
                              f"Workload {ref.name} pod group {ref.pod_group} gang.minCount")
    return _Found("workloadRef", name, None, f"Workload {ref.name} has no pod group {ref.pod_group}")


def _coscheduling(pod: Pod, catalog: GroupCatalog) -> _Found | None:
    labels = pod.metadata.labels
    if COSCHEDULING_LABEL in labels:
        name = labels[COSCHEDULING_LABEL]
        obj = catalog.get(COSCHEDULING_GROUP, "PodGroup", pod.metadata.namespace, name)
        if obj is None:
            return _Found("coscheduling", name, None, f"PodGroup {name} (not found)",
                          COSCHEDULING_DEFAULT_TIMEOUT)
        timeout = _path(obj, "spec", "scheduleTimeoutSeconds")
        return _Found("coscheduling", name, _count(_path(obj, "spec", "minMember"), "minMember"),
                      f"PodGroup {name} spec.minMember",
                      _seconds(timeout, "scheduleTimeoutSeconds") if timeout is not None
                      else COSCHEDULING_DEFAULT_TIMEOUT)
    if COSCHEDULING_LEGACY_LABEL in labels:  # the older "lightweight coscheduling": all on the pod
        raw = labels.get(COSCHEDULING_LEGACY_MIN)
        return _Found("coscheduling", labels[COSCHEDULING_LEGACY_LABEL],
                      _count(raw, COSCHEDULING_LEGACY_MIN) if raw is not None else None,
                      f"label {COSCHEDULING_LEGACY_MIN}", COSCHEDULING_DEFAULT_TIMEOUT)
    return None


def _podgroup_by_annotation(source: str, keys: tuple[str, ...],
                            api_group: str) -> Callable[[Pod, GroupCatalog], _Found | None]:
    def find(pod: Pod, catalog: GroupCatalog) -> _Found | None:
        for key in keys:
            name = pod.metadata.annotations.get(key)
            if name:
                obj = catalog.get(api_group, "PodGroup", pod.metadata.namespace, name)
                if obj is None:
                    return _Found(source, name, None, f"PodGroup {name} (not found)")
                return _Found(source, name, _count(_path(obj, "spec", "minMember"), "minMember"),
                              f"PodGroup {name} spec.minMember")
        return None

    return find


def _kueue(pod: Pod, catalog: GroupCatalog) -> _Found | None:
    name = pod.metadata.labels.get(KUEUE_LABEL)
    if not name or LWS_LABEL in pod.metadata.labels:
        return None
    raw = pod.metadata.annotations.get(KUEUE_TOTAL)
    return _Found("kueue", name, _count(raw, KUEUE_TOTAL) if raw is not None else None, f"annotation {KUEUE_TOTAL}")


def _koordinator(pod: Pod, catalog: GroupCatalog) -> _Found | None:
    name = pod.metadata.annotations.get(KOORDINATOR_NAME)
    if not name:
        return None
    raw = pod.metadata.annotations.get(KOORDINATOR_MIN)
    return _Found("koordinator", name, _count(raw, KOORDINATOR_MIN) if raw is not None else None,
                  f"annotation {KOORDINATOR_MIN}")


def _nodeagent(pod: Pod, catalog: GroupCatalog) -> _Found | None:
    name = pod.metadata.annotations.get(NAME)
    if not name:
        return None
    # min-member is read by declaration_of for every source.
    return _Found("nodeagent", name, None, f"annotation {MIN_MEMBER} (missing)")


_SOURCES: tuple[Callable[[Pod, GroupCatalog], _Found | None], ...] = (
    _scheduling_group,
    _workload_ref,
    _coscheduling,
    _podgroup_by_annotation("volcano", VOLCANO_ANNOTATIONS, VOLCANO_GROUP),
    _podgroup_by_annotation("kai", (KAI_ANNOTATION,), KAI_GROUP),
    _kueue,
    _koordinator,
    _nodeagent,
)


# --- values ---------------------------------------------------------------------------------


def _path(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _count(raw: Any, what: str) -> int:
    try:
        value = int(str(raw).strip()) if not isinstance(raw, bool) else -1
    except ValueError:
        raise DeclarationError(f"{what} must be a whole number of pods, not {raw!r}") from None
    if value < 1:
        raise DeclarationError(f"{what} must be at least 1, not {raw!r}")
    return value


def _seconds(raw: Any, what: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise DeclarationError(f"{what} must be a number of seconds, not {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise DeclarationError(f"{what} must be more than 0 seconds, not {raw!r}")
    return value
