"""Which pod goes first: the kubelet's ranking (pkg/kubelet/eviction/helpers.go), multi-key,
first key wins.

* memory: pods without stats first, then pods whose working set exceeds their memory request,
  then lower priority, then the larger working set over request;
* pids: lower priority, then more processes;
* disk: usage over the ephemeral-storage request (inodes: over the inodes request) first, then
  lower priority, then the larger usage over the ephemeral-storage request. Which usage counts
  depends on the node's layout (:data:`DISK_STATS`).

Critical pods (static, mirror, or priority >= 2000000000) are ranked like the others; the
manager skips them when it evicts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from nodeagent import labels as L
from nodeagent import quantity
from nodeagent.model import Pod
from nodeagent.stages import PodSnapshot
from nodeagent.stats.collector import PodUsage
from plugins.eviction import signals as S

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""scheduling.SystemCriticalPriority: a pod at or above it is critical."""

ROOT, LOGS, LOCAL_VOLUMES = "root", "logs", "localVolumeSource"
"""The per-pod disk figures (fsStatsType) a ranking may count; "images" has no per-pod figure."""

Stats = Callable[[str], PodUsage | None]
Rank = Callable[[list[PodSnapshot], Stats], list[PodSnapshot]]


def priority(pod: Pod) -> int:
    return pod.spec.priority or 0


def is_static(pod: Pod) -> bool:
    source = pod.metadata.annotations.get(L.CONFIG_SOURCE)
    return source is not None and source != "api"


def is_critical(pod: Pod) -> bool:
    """IsCriticalPod: static or mirror pods, and pods of a system-critical priority."""
    return is_static(pod) or L.CONFIG_MIRROR in pod.metadata.annotations or priority(pod) >= SYSTEM_CRITICAL_PRIORITY


def request(pod: Pod, resource: str) -> int:
    """GetResourceRequestQuantity: the containers' requests summed, or the largest init
    container's when larger; pod-level resources when the pod sets them."""
    level = pod.spec.resources
    if level is not None and resource in level.requests and resource in ("cpu", "memory"):
        return quantity.base_units(resource, level.requests[resource])
    total = sum(quantity.base_units(resource, c.resources.requests[resource])
                for c in pod.spec.containers if resource in c.resources.requests)
    for c in pod.spec.init_containers:
        if resource in c.resources.requests:
            total = max(total, quantity.base_units(resource, c.resources.requests[resource]))
    return total


def local_volume_names(pod: Pod) -> set[str]:
    """hostPath volumes and local ephemeral ones: gitRepo, configMap, and emptyDir on the node's
    disk (a memory-backed emptyDir is memory, not disk)."""
    names = set()
    for volume in pod.spec.volumes:
        extra = volume.model_extra or {}
        if volume.host_path is not None or volume.config_map is not None or "gitRepo" in extra \
                or (volume.empty_dir is not None and volume.empty_dir.medium == ""):
            names.add(volume.name)
    return names


def memory_usage(stats: PodUsage) -> int:
    return (stats.memory.working_set_bytes or 0) if stats.memory is not None else 0


def disk_usage(pod: Pod, stats: PodUsage, measure: frozenset[str], resource: str) -> int:
    """podDiskUsage: bytes (ephemeral-storage) or inodes of the figures in ``measure``."""
    def of(fs: object) -> int:
        if fs is None:
            return 0
        value = getattr(fs, "used_bytes" if resource == S.EPHEMERAL_STORAGE else "inodes_used")
        return int(value or 0)

    total = 0
    for c in stats.containers:
        if ROOT in measure:
            total += of(c.rootfs)
        if LOGS in measure:
            total += of(c.logs)
    if LOCAL_VOLUMES in measure:
        names = local_volume_names(pod)
        total += sum(of(v.fs) for v in stats.volumes if v.name in names)
    return total


Cmp = Callable[[PodSnapshot, PodSnapshot], int]


def _cmp_bool(a: bool, b: bool) -> int:
    """cmpBool: True sorts first."""
    return 0 if a == b else (-1 if a else 1)


def _by_priority(p1: PodSnapshot, p2: PodSnapshot) -> int:
    a, b = priority(p1.pod), priority(p2.pod)
    return 0 if a == b else (1 if a > b else -1)


def _with_stats(stats: Stats, compare: Callable[[PodSnapshot, PodUsage, PodSnapshot, PodUsage], int]) -> Cmp:
    def cmp(p1: PodSnapshot, p2: PodSnapshot) -> int:
        s1, s2 = stats(p1.ref.uid), stats(p2.ref.uid)
        if s1 is None or s2 is None:
            return _cmp_bool(s1 is None, s2 is None)  # no stats: first
        return compare(p1, s1, p2, s2)
    return cmp


def _ordered(pods: Sequence[PodSnapshot], *keys: Cmp) -> list[PodSnapshot]:
    def cmp(p1: PodSnapshot, p2: PodSnapshot) -> int:
        for key in keys:
            result = key(p1, p2)
            if result:
                return result
        return 0
    return sorted(pods, key=functools.cmp_to_key(cmp))


def rank_memory(pods: list[PodSnapshot], stats: Stats) -> list[PodSnapshot]:
    def exceeds(p1: PodSnapshot, s1: PodUsage, p2: PodSnapshot, s2: PodUsage) -> int:
        return _cmp_bool(memory_usage(s1) > request(p1.pod, S.MEMORY), memory_usage(s2) > request(p2.pod, S.MEMORY))

    def usage(p1: PodSnapshot, s1: PodUsage, p2: PodSnapshot, s2: PodUsage) -> int:
        a = memory_usage(s1) - request(p1.pod, S.MEMORY)
        b = memory_usage(s2) - request(p2.pod, S.MEMORY)
        return (b > a) - (b < a)

    return _ordered(pods, _with_stats(stats, exceeds), _by_priority, _with_stats(stats, usage))


def rank_pids(pods: list[PodSnapshot], stats: Stats) -> list[PodSnapshot]:
    def processes(p1: PodSnapshot, s1: PodUsage, p2: PodSnapshot, s2: PodUsage) -> int:
        a, b = s1.process_count or 0, s2.process_count or 0
        return (b > a) - (b < a)

    return _ordered(pods, _by_priority, _with_stats(stats, processes))


def rank_disk(measure: frozenset[str], resource: str) -> Rank:
    def rank(pods: list[PodSnapshot], stats: Stats) -> list[PodSnapshot]:
        def exceeds(p1: PodSnapshot, s1: PodUsage, p2: PodSnapshot, s2: PodUsage) -> int:
            return _cmp_bool(disk_usage(p1.pod, s1, measure, resource) > request(p1.pod, resource),
                             disk_usage(p2.pod, s2, measure, resource) > request(p2.pod, resource))

        def usage(p1: PodSnapshot, s1: PodUsage, p2: PodSnapshot, s2: PodUsage) -> int:
            # The ephemeral-storage request for inodes too: the kubelet's (kept for parity).
            a = disk_usage(p1.pod, s1, measure, resource) - request(p1.pod, S.EPHEMERAL_STORAGE)
            b = disk_usage(p2.pod, s2, measure, resource) - request(p2.pod, S.EPHEMERAL_STORAGE)
            return (b > a) - (b < a)

        return _ordered(pods, _with_stats(stats, exceeds), _by_priority, _with_stats(stats, usage))
    return rank


def rank_functions(dedicated_image_fs: bool) -> Mapping[str, Rank]:
    """buildSignalToRankFunc without a split container filesystem."""
    out: dict[str, Rank] = {S.MEMORY_AVAILABLE: rank_memory, S.ALLOCATABLE_MEMORY_AVAILABLE: rank_memory,
                            S.PID_AVAILABLE: rank_pids}
    everything = frozenset({ROOT, LOGS, LOCAL_VOLUMES})
    if dedicated_image_fs:
        node_measure, image_measure = frozenset({LOGS, LOCAL_VOLUMES}), frozenset({ROOT})
    else:
        node_measure = image_measure = everything
    for prefix, measure in (("nodefs", node_measure), ("imagefs", image_measure),
                            ("containerfs", image_measure if dedicated_image_fs else node_measure)):
        out[f"{prefix}.available"] = rank_disk(measure, S.EPHEMERAL_STORAGE)
        out[f"{prefix}.inodesFree"] = rank_disk(measure, S.INODES)
    return out


__all__ = ["Rank", "Stats", "disk_usage", "is_critical", "is_static", "local_volume_names", "memory_usage",
           "priority", "rank_disk", "rank_functions", "rank_memory", "rank_pids", "request"]
