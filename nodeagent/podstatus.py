"""The v1 PodStatus the agent writes, as a typed model.

The status stage builds it from the runtime (plugins/status.py), the status writer refines it
(nodeagent/status.py), and it becomes JSON once, when the writer hands it to the sinks
(:meth:`PodStatus.to_api`). Only the fields the agent sets are modelled.

On the wire a field is absent when it is None here, as ``omitempty`` drops it in the API's
JSON; fields the API requires (a container status's image, imageID, state, lastState, ...) are
required here too, so an empty ``lastState`` is written as ``{}``, as the kubelet writes it.
Field names are the API's (camelCase on the wire, snake_case in Python).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]
ConditionStatus = Literal["True", "False", "Unknown"]
QOSClass = Literal["Guaranteed", "Burstable", "BestEffort"]

_INITIALISMS = {"host_ip": "hostIP", "host_ips": "hostIPs", "pod_ip": "podIP", "pod_ips": "podIPs",
                "image_id": "imageID", "container_id": "containerID"}


def _api_name(name: str) -> str:
    """The API's JSON name: camelCase, with Go's initialisms (podIP, imageID) kept upper case."""
    return _INITIALISMS.get(name) or to_camel(name)


class _StatusModel(BaseModel):
    # Frozen: the writer refines a status by building a new one (model_copy), so neither the
    # observer's report nor a status already handed to the sinks ever changes under them.
    model_config = ConfigDict(alias_generator=_api_name, populate_by_name=True, frozen=True, extra="forbid")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        # pydantic's copy takes any key, unchecked: a misspelt field would be carried along unseen.
        if update and not update.keys() <= type(self).model_fields.keys():
            unknown = sorted(set(update) - set(type(self).model_fields))
            raise TypeError(f"{type(self).__name__} has no field {', '.join(unknown)}")
        return super().model_copy(update=update, deep=deep)


class HostIP(_StatusModel):
    ip: str


class PodIP(_StatusModel):
    ip: str


class PodCondition(_StatusModel):
    type: str
    status: ConditionStatus
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    """metav1.Time (nodeagent.status.rfc3339); settled by the writer against what it published."""
    observed_generation: int | None = None
    """The pod generation the condition is about (the resize conditions)."""


class ContainerStateWaiting(_StatusModel):
    reason: str
    message: str | None = None


class ContainerStateRunning(_StatusModel):
    started_at: str | None = None


class ContainerStateTerminated(_StatusModel):
    exit_code: int
    reason: str | None = None
    message: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    container_id: str | None = None


class ContainerState(_StatusModel):
    """At most one of the three is set; none is the API's empty state (a lastState of nothing)."""

    waiting: ContainerStateWaiting | None = None
    running: ContainerStateRunning | None = None
    terminated: ContainerStateTerminated | None = None


class ResourceStatus(_StatusModel):
    """ResourceRequirements as the status shows it: no empty sections, no claims."""

    limits: dict[str, str] | None = None
    requests: dict[str, str] | None = None


class VolumeMountStatus(_StatusModel):
    """convertToAPIContainerStatuses' volumeMounts: one per spec volumeMount; readOnly left out
    when false, recursiveReadOnly only for a read-only mount (Enabled or Disabled)."""
    name: str
    mount_path: str
    read_only: Literal[True] | None = None
    recursive_read_only: Literal["Enabled", "Disabled"] | None = None


class ContainerStatus(_StatusModel):
    name: str
    image: str
    image_id: str
    container_id: str | None = None
    ready: bool
    started: bool | None = None
    restart_count: int
    state: ContainerState
    last_state: ContainerState
    resources: ResourceStatus | None = None
    allocated_resources: dict[str, str] | None = None
    volume_mounts: list[VolumeMountStatus] | None = None


class PodStatus(_StatusModel):
    phase: PodPhase | None = None
    reason: str | None = None
    message: str | None = None
    host_ip: str | None = None
    host_ips: list[HostIP] | None = None
    pod_ip: str | None = None
    pod_ips: list[PodIP] | None = None
    start_time: str | None = None
    qos_class: QOSClass | None = None
    conditions: list[PodCondition] | None = None
    init_container_statuses: list[ContainerStatus] | None = None
    container_statuses: list[ContainerStatus] | None = None
    ephemeral_container_statuses: list[ContainerStatus] | None = None
    observed_generation: int | None = None
    """The generation the node acted on: its resources allocated, or its resize found pending."""
    resources: ResourceStatus | None = None
    """Pod-level resources (a pod with spec.resources)."""
    allocated_resources: dict[str, str] | None = None

    def to_api(self) -> dict[str, Any]:
        """The API's JSON object (what the sinks get): None fields left out. A model built past
        validation with a wrong type in it (``model_construct``) raises here rather than
        reaching a sink."""
        return self.model_dump(by_alias=True, exclude_none=True, warnings="error")

    def condition(self, type: str) -> PodCondition | None:
        return next((c for c in self.conditions or () if c.type == type), None)


__all__ = ["ConditionStatus", "ContainerState", "ContainerStateRunning", "ContainerStateTerminated",
           "ContainerStateWaiting", "ContainerStatus", "HostIP", "PodCondition", "PodIP", "PodPhase", "PodStatus",
           "QOSClass", "ResourceStatus"]
