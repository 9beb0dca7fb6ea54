"""Admission by node fit (the kubelet's predicate admit handler): the pod's OS, max pods, CPU /
memory requests against allocatable, its nodeSelector / required node affinity against the
Node's labels (those the agent knows, then the Node object in the API, which an administrator
may have labelled, as the kubelet fetches it again before rejecting), and its host ports
against those of the pods admitted before.

Reasons and messages are the kubelet's (PodOSNotSupported, PodOSSelectorNodeLabelDoesNotMatch,
OutOfpods, OutOfcpu, OutOfmemory; "Node didn't have enough resource: ..."; NodeAffinity,
NodePorts), so that tooling built for the kubelet recognises them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import structlog
from lightkube.resources.core_v1 import Node

from nodeagent import quantity
from nodeagent.cluster.apicalls import describe
from nodeagent.model import Pod
from nodeagent.pluginconfig import NoConfig
from nodeagent.stages import Admit, AgentHandle, NodeView, Result
from plugins import nodeaffinity, nodeports

log = structlog.get_logger("nodeagent.noderesources")

NODE_OS = "linux"  # the kubelet compares with runtime.GOOS; nodeagent runs Linux nodes only
OS_LABEL = "kubernetes.io/os"
NODE_READ_TIMEOUT_SECONDS = 10.0


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

    def __init__(self, api: Any = None) -> None:
        self._api = api

    async def _affinity_fits(self, pod: Pod, node: NodeView) -> bool:
        spec = pod.spec
        if not spec.node_selector and not spec.affinity:
            return True
        name = node.node.name
        if nodeaffinity.matches(name, node.node.labels, spec.node_selector, spec.affinity):
            return True
        if self._api is None:
            return False
        # Labels an administrator added live only in the API: read the Node before rejecting.
        try:
            with anyio.fail_after(NODE_READ_TIMEOUT_SECONDS):
                found = await self._api.get(Node, name)
        except Exception as exc:  # noqa: BLE001 - the API is away: decide on the labels we know
            log.warning("cannot read the Node's labels; deciding on those the agent set", error=describe(exc))
            return False
        labels = {**node.node.labels, **((found.metadata.labels if found.metadata else None) or {})}
        return nodeaffinity.matches(name, labels, spec.node_selector, spec.affinity)

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
        if not await self._affinity_fits(pod, node):
            return Result.reject(nodeaffinity.REASON, nodeaffinity.MESSAGE)
        if nodeports.conflicts(pod, node.admitted):
            return Result.reject(nodeports.REASON, nodeports.MESSAGE)
        return Result.ok()


def plugin(config: NoConfig, handle: AgentHandle) -> NodeResources:
    return NodeResources(handle.api)


plugin.stage_class = NodeResources  # type: ignore[attr-defined]
plugin.config_model = NoConfig  # type: ignore[attr-defined]
