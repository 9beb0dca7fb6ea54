"""Container resources to CRI Linux resources, QoS class and OOM score adjustment, with the
kubelet's formulas (pkg/kubelet/cm/helpers_linux.go, kuberuntime_container_linux.go,
pkg/apis/core/v1/helper/qos, pkg/kubelet/qos/policy.go)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path

from cri import types as t
from nodeagent import quantity
from nodeagent.model import Container, Pod, Quantity, ResourceRequirements
from nodeagent.status import requirements_qos

CPU_PERIOD_US = 100_000  # quotaPeriod
MIN_SHARES = 2
MAX_SHARES = 262_144
MIN_QUOTA_US = 1000  # minQuotaPeriod
GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000
NODE_CRITICAL_PRIORITY_CLASS = "system-node-critical"
FIT_RESOURCES = ("cpu", "memory")


def requests_of(container: Container) -> dict[str, Quantity]:
    """Requests after API defaulting: an unset request takes the limit's value (the kubelet
    applies the same defaulting to static pods)."""
    return {**container.resources.limits, **container.resources.requests}


def milli_cpu_to_shares(milli: int) -> int:
    if milli == 0:
        return MIN_SHARES
    return min(max(milli * 1024 // 1000, MIN_SHARES), MAX_SHARES)


def milli_cpu_to_quota(milli: int, period: int = CPU_PERIOD_US) -> int:
    if milli == 0:
        return 0  # no limit: the runtime's -1
    return max(milli * period // 1000, MIN_QUOTA_US)


def qos_class(pod: Pod) -> str:
    """ComputePodQOS: Guaranteed when every container limits cpu and memory and the summed
    requests equal the summed limits; BestEffort when nothing is requested or limited."""
    pod_level = pod.spec.resources
    if pod_level is not None and (pod_level.requests or pod_level.limits):
        return requirements_qos(pod_level.requests, pod_level.limits)  # pod-level resources decide
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for c in pod.all_containers():
        for name, amount in requests_of(c).items():
            value = quantity.parse(amount)
            if name in ("cpu", "memory") and value > 0:
                requests[name] = requests.get(name, Decimal(0)) + value
        found = set()
        for name, amount in c.resources.limits.items():
            value = quantity.parse(amount)
            if name in ("cpu", "memory") and value > 0:
                found.add(name)
                limits[name] = limits.get(name, Decimal(0)) + value
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


@cache
def memory_capacity() -> int:
    """The machine's memory (cadvisor's MemoryCapacity), the denominator of the Burstable OOM
    score: capacity, not allocatable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def oom_score_adj(pod: Pod, container: Container, capacity: int | None = None) -> int:
    """GetContainerOOMScoreAdjust (containerd clamps it to its own score when
    restrict_oom_score_adj is set)."""
    if pod.spec.priority_class_name == NODE_CRITICAL_PRIORITY_CLASS:
        return GUARANTEED_OOM_SCORE_ADJ
    qos = qos_class(pod)
    if qos == "Guaranteed":
        return GUARANTEED_OOM_SCORE_ADJ
    if qos == "BestEffort":
        return BESTEFFORT_OOM_SCORE_ADJ
    capacity = capacity or memory_capacity()
    if not capacity:
        return BESTEFFORT_OOM_SCORE_ADJ - 1
    request = _memory_request(container)
    share = _unallocated_pod_memory_per_container(pod)
    adj = 1000 - (1000 * (request + share)) // capacity
    if container.restart_policy == "Always" and any(c is container for c in pod.spec.init_containers):
        # A sidecar scores no better than the smallest regular container of its pod.
        smallest = min(_memory_request(c) for c in pod.spec.containers) + share
        adj = min(adj, 1000 - (1000 * smallest) // capacity)
    # A Burstable container never scores like a Guaranteed one, nor like a BestEffort one.
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ:
        return 1000 + GUARANTEED_OOM_SCORE_ADJ
    if adj == BESTEFFORT_OOM_SCORE_ADJ:
        return adj - 1
    return adj


def _memory_request(container: Container) -> int:
    return quantity.bytes_(requests_of(container).get("memory", 0))


def _unallocated_pod_memory_per_container(pod: Pod) -> int:
    """remainingPodMemReqPerContainer: the pod-level memory request not requested by any
    container, shared equally by all of them in the OOM score."""
    pod_level = pod.spec.resources
    if pod_level is None or not quantity.parse(pod_level.requests.get("memory", 0)):
        return 0
    containers = pod.all_containers()
    rest = quantity.bytes_(pod_level.requests["memory"]) - sum(_memory_request(c) for c in containers)
    return max(rest, 0) // len(containers)


def linux_resources(container: Container, pod: Pod | None = None) -> t.LinuxContainerResources:
    """calculateLinuxResources: shares from the request (or the limit when no request), CFS
    quota from the limit over a 100 ms period, the memory limit (0 = unset), and with the pod
    the OOM score adjustment of its QoS class. A container without a CPU or memory limit in a
    pod with pod-level limits runs with the pod's (getCPULimit / getMemoryLimit)."""
    v = values(container.resources, pod.spec.resources if pod is not None else None)
    return t.LinuxContainerResources(
        cpu_period=CPU_PERIOD_US,
        cpu_quota=milli_cpu_to_quota(v.cpu_limit),
        cpu_shares=milli_cpu_to_shares(v.cpu_request),
        memory_limit_in_bytes=v.memory_limit,
        oom_score_adj=oom_score_adj(pod, container) if pod is not None else 0,
    )


@dataclass(frozen=True)
class Values:
    """What the runtime applies for a container (containerResourcesFromRequirements): CPU in
    millicores, memory in bytes; limits fall back to the pod-level limits."""

    cpu_request: int = 0
    cpu_limit: int = 0
    memory_request: int = 0
    memory_limit: int = 0


def values(container: ResourceRequirements, pod_level: ResourceRequirements | None) -> Values:
    limits = dict(container.limits)
    if pod_level is not None:
        for res in ("cpu", "memory"):
            if not quantity.parse(limits.get(res, 0)) and res in pod_level.limits:
                limits[res] = pod_level.limits[res]
    requests = {**container.limits, **container.requests}
    return Values(cpu_request=quantity.milli_cpu(requests.get("cpu", 0)),
                  cpu_limit=quantity.milli_cpu(limits.get("cpu", 0)),
                  memory_request=quantity.bytes_(requests.get("memory", 0)),
                  memory_limit=quantity.bytes_(limits.get("memory", 0)))


def pod_requests(pod: Pod, resources: tuple[str, ...] = FIT_RESOURCES) -> dict[str, int]:
    """resourcehelper.PodRequests (for CPU and memory unless ``resources`` says otherwise):
    regular containers and sidecars summed, at least any init container with the sidecars
    started before it; pod-level requests win; ``spec.overhead`` added."""
    total: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for c in pod.spec.init_containers:
        req = {r: quantity.base_units(r, v) for r, v in requests_of(c).items() if r in resources}
        if c.restart_policy == "Always":
            for r, v in req.items():
                sidecars[r] = sidecars.get(r, 0) + v
        else:
            for r in resources:
                init_peak[r] = max(init_peak.get(r, 0), req.get(r, 0) + sidecars.get(r, 0))
    for c in pod.spec.containers:
        for r, amount in requests_of(c).items():
            if r in resources:
                total[r] = total.get(r, 0) + quantity.base_units(r, amount)
    for r, v in sidecars.items():
        total[r] = total.get(r, 0) + v
    for r, v in init_peak.items():
        if v > total.get(r, 0):
            total[r] = v
    if pod.spec.resources is not None:
        for r, amount in pod.spec.resources.requests.items():
            if r in resources:
                total[r] = quantity.base_units(r, amount)
    # The runtime class's overhead is the pod's too (admission fit, the pod cgroup).
    for r, amount in (pod.spec.overhead or {}).items():
        if r in resources:
            total[r] = total.get(r, 0) + quantity.base_units(r, amount)
    return {r: v for r, v in total.items() if v}


