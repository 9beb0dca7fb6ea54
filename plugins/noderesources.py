"""Admission by node fit (the kubelet's predicate admit handler): the pod's OS, max pods, and
CPU / memory requests against allocatable.

Reasons and messages are the kubelet's (PodOSNotSupported, PodOSSelectorNodeLabelDoesNotMatch,
OutOfpods, OutOfcpu, OutOfmemory; "Node didn't have enough resource: ..."), so that tooling
built for the kubelet recognises them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from nodeagent import quantity
from nodeagent.model import Pod
from nodeagent.stages import Admit, AgentHandle, NodeView, Result

NODE_OS = "linux"  # the kubelet compares with runtime.GOOS; nodeagent runs Linux nodes only
OS_LABEL = "kubernetes.io/os"


def pod_requests(pod: Pod) -> dict[str, int]:
    """The sum of the containers' requests (a limit alone stands for the request)."""
    total: dict[str, int] = {}
    for c in pod.spec.containers:
        for res, value in c.resources.requests.items():
            total[res] = total.get(res, 0) + quantity.base_units(res, value)
        for res, value in c.resources.limits.items():
            # A limit without a request defaults the request to the limit (API defaulting).
            if res not in c.resources.requests:
                total[res] = total.get(res, 0) + quantity.base_units(res, value)
    return total


class NodeResources(Admit):
    name: ClassVar[str] = "noderesources"

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        # OS checks first: evicting other pods could never make room for these.
        if pod.metadata.labels.get(OS_LABEL, NODE_OS) != NODE_OS:
            return Result.reject("PodOSSelectorNodeLabelDoesNotMatch",
                                 f"Failed to admit pod as the `{OS_LABEL}` label doesn't match node label")
        if pod.spec.os is not None and pod.spec.os.name != NODE_OS:
            return Result.reject("PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS")
        allocatable = node.node.allocatable
        used_pods = len(node.admitted)
        if used_pods + 1 > allocatable.get("pods", 110):
            return Result.reject(
                "OutOfpods",
                f"Node didn't have enough resource: pods, requested: 1, used: {used_pods}, "
                f"capacity: {allocatable.get('pods', 110)}",
            )
        wanted = pod_requests(pod)
        for res in ("cpu", "memory", "ephemeral-storage"):
            if res not in wanted or res not in allocatable:
                continue
            used = sum(pod_requests(p).get(res, 0) for p in node.admitted)
            if used + wanted[res] > allocatable[res]:
                return Result.reject(
                    f"OutOf{res}",
                    f"Node didn't have enough resource: {res}, requested: {wanted[res]}, "
                    f"used: {used}, capacity: {allocatable[res]}",
                )
        return Result.ok()


def plugin(config: Mapping[str, Any], handle: AgentHandle) -> NodeResources:
    if config:
        raise TypeError(f"noderesources takes no configuration, got {sorted(config)}")
    return NodeResources()


plugin.stage_class = NodeResources  # type: ignore[attr-defined]
