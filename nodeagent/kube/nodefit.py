"""The kubelet's node fit at admission (its predicate admit handler, GeneralPredicates): the
pod's OS, max pods, CPU / memory / ephemeral-storage requests against allocatable, its
nodeSelector and required node affinity against the Node's labels, and its host ports against
those of the pods admitted before.

Reasons and messages are the kubelet's (PodOSNotSupported, PodOSSelectorNodeLabelDoesNotMatch,
OutOfpods, OutOfcpu, OutOfmemory; "Node didn't have enough resource: ..."; NodeAffinity,
NodePorts), so that tooling built for the kubelet recognises them. Shared by the
noderesources stage and the gang stage (a member that does not fit aborts its gang).
"""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.kube import nodeaffinity, nodeports
from nodeagent.kube.resources import pod_requests
from nodeagent.model import Pod
from nodeagent.stages import NodeView, Result

NODE_OS = "linux"  # the kubelet compares with runtime.GOOS; nodeagent runs Linux nodes only
OS_LABEL = "kubernetes.io/os"
ADMISSION_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def fit(pod: Pod, node: NodeView, labels: Mapping[str, str] | None = None) -> Result:
    """Whether ``pod`` fits beside ``node.admitted``; ``labels``: the Node's labels as the API
    has them (an administrator may have added some), else the ones the agent set."""
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
    wanted = pod_requests(pod, ADMISSION_RESOURCES)
    for res in ADMISSION_RESOURCES:
        if res not in wanted or res not in allocatable:
            continue
        used = sum(pod_requests(p, ADMISSION_RESOURCES).get(res, 0) for p in node.admitted)
        if used + wanted[res] > allocatable[res]:
            return Result.reject(
                f"OutOf{res}",
                f"Node didn't have enough resource: {res}, requested: {wanted[res]}, "
                f"used: {used}, capacity: {allocatable[res]}",
            )
    if not affinity_fits(pod, node, labels):
        return Result.reject(nodeaffinity.REASON, nodeaffinity.MESSAGE)
    if nodeports.conflicts(pod, node.admitted):
        return Result.reject(nodeports.REASON, nodeports.MESSAGE)
    return Result.ok()


def affinity_fits(pod: Pod, node: NodeView, labels: Mapping[str, str] | None = None) -> bool:
    spec = pod.spec
    if not spec.node_selector and not spec.affinity:
        return True
    known = {**node.node.labels, **(labels or {})}
    return nodeaffinity.matches(node.node.name, known, spec.node_selector, spec.affinity)


__all__ = ["ADMISSION_RESOURCES", "NODE_OS", "OS_LABEL", "affinity_fits", "fit"]
