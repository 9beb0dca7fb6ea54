"""Container resources to CRI Linux resources, QoS class and OOM score adjustment, with the
kubelet's formulas (pkg/kubelet/cm/helpers_linux.go, kuberuntime_container_linux.go,
pkg/apis/core/v1/helper/qos, pkg/kubelet/qos/policy.go)."""

from __future__ import annotations

from decimal import Decimal
from functools import cache
from pathlib import Path

from cri import types as t
from nodeagent import quantity
from nodeagent.model import Container, Pod, Quantity

CPU_PERIOD_US = 100_000  # quotaPeriod
MIN_SHARES = 2
MAX_SHARES = 262_144
MIN_QUOTA_US = 1000  # minQuotaPeriod
GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000
NODE_CRITICAL_PRIORITY_CLASS = "system-node-critical"


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
    request = quantity.bytes_(requests_of(container).get("memory", 0))
    adj = 1000 - (1000 * request) // capacity if capacity else 1000
    # A Burstable container never scores like a Guaranteed one, nor like a BestEffort one.
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ:
        return 1000 + GUARANTEED_OOM_SCORE_ADJ
    if adj == BESTEFFORT_OOM_SCORE_ADJ:
        return adj - 1
    return adj


def linux_resources(container: Container, pod: Pod | None = None) -> t.LinuxContainerResources:
    """calculateLinuxResources: shares from the request (or the limit when no request), CFS
    quota from the limit over a 100 ms period, the memory limit (0 = unset), and with the pod
    the OOM score adjustment of its QoS class."""
    lim = container.resources.limits
    cpu_request = quantity.milli_cpu(requests_of(container).get("cpu", 0))
    cpu_limit = quantity.milli_cpu(lim.get("cpu", 0))
    return t.LinuxContainerResources(
        cpu_period=CPU_PERIOD_US,
        cpu_quota=milli_cpu_to_quota(cpu_limit),
        cpu_shares=milli_cpu_to_shares(cpu_request),
        memory_limit_in_bytes=quantity.bytes_(lim.get("memory", 0)),
        oom_score_adj=oom_score_adj(pod, container) if pod is not None else 0,
    )
