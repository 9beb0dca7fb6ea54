"""In-place resize: what the node has allocated to a pod and how a resize stands, as the
runtime stage (plugins/runtime/resize.py, which acts on it) and the status stage (which reports
it: status.resources, allocatedResources, the PodResizePending / PodResizeInProgress
conditions) both read it. The state itself is a per-pod fact (nodeagent.podfacts.RESIZE)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nodeagent import quantity
from nodeagent.kube.resources import Values
from nodeagent.model import Container, Pod, ResourceRequirements

INFEASIBLE = "Infeasible"
DEFERRED = "Deferred"
ERROR = "Error"  # v1.PodReasonError: the in-progress resize failed to actuate
RESIZE_PENDING = "PodResizePending"
RESIZE_IN_PROGRESS = "PodResizeInProgress"


@dataclass
class ResizeState:
    """Per pod: the fact nodeagent.podfacts.RESIZE (provided by the runtime stage)."""

    generation: int
    """The generation of the spec whose resources are allocated."""
    containers: dict[str, ResourceRequirements]
    """Allocated resources per container name."""
    pod: ResourceRequirements | None
    """Allocated pod-level resources (spec.resources)."""
    observed_generation: int = 0
    """The newest generation the node has acted on (allocated, or found pending)."""
    applied: dict[str, tuple[ResourceRequirements, Values]] = field(default_factory=dict)
    """Container id -> the resources its instance runs with (created with, or updated to)."""
    pending: tuple[str, str] | None = None
    """PodResizePending (reason Infeasible or Deferred, message)."""
    in_progress: tuple[str, str] | None = None
    """PodResizeInProgress (reason "" or Error, message)."""
    restarting: set[str] = field(default_factory=set)
    """Container ids killed for a resize: their restart skips the back-off."""
    pod_cgroup: Values | None = None
    """What the pod cgroup was last set to."""
    pod_applied: ResourceRequirements | None = None
    """The pod-level resources the pod cgroup was last set from (status.resources of the pod,
    which the kubelet reads back from that cgroup)."""


def _norm(resources: ResourceRequirements | None) -> tuple[object, ...]:
    """Resources by value: "100m" equals "0.1", and an absent section equals an empty one."""
    if resources is None:
        return ((), ())
    return (tuple(sorted((k, quantity.parse(v)) for k, v in resources.limits.items())),
            tuple(sorted((k, quantity.parse(v)) for k, v in resources.requests.items())))


def same(a: ResourceRequirements | None, b: ResourceRequirements | None) -> bool:
    return _norm(a) == _norm(b)


def with_resources(pod: Pod, containers: Mapping[str, ResourceRequirements],
                   pod_level: ResourceRequirements | None) -> Pod:
    def fix(c: Container) -> Container:
        wanted = containers.get(c.name)
        return c if wanted is None or wanted is c.resources else c.model_copy(update={"resources": wanted})

    spec = pod.spec.model_copy(update={"containers": [fix(c) for c in pod.spec.containers],
                                       "init_containers": [fix(c) for c in pod.spec.init_containers],
                                       "resources": pod_level})
    return pod.model_copy(update={"spec": spec})


def status_resources(resources: ResourceRequirements) -> dict[str, dict[str, str]]:
    """ResourceRequirements as the API shows it: no empty sections, no claims."""
    out: dict[str, dict[str, str]] = {}
    if resources.limits:
        out["limits"] = {k: str(v) for k, v in resources.limits.items()}
    if resources.requests:
        out["requests"] = {k: str(v) for k, v in resources.requests.items()}
    return out


__all__ = ["DEFERRED", "ERROR", "INFEASIBLE", "RESIZE_IN_PROGRESS", "RESIZE_PENDING", "ResizeState", "same",
           "status_resources", "with_resources"]
