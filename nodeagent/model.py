"""The subset of Kubernetes core/v1 Pod that nodeagent reads.

Fields we honour are modelled; every other field still parses (``extra="allow"``) so that
:func:`unhonoured_fields` can report it instead of silently ignoring it. Field names follow the
API (camelCase on the wire, snake_case in Python).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Quantity = str | int | float


class _ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True
    )


class ObjectMeta(_ApiModel):
    name: str = ""
    generate_name: str = ""
    namespace: str = "default"
    uid: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None
    resource_version: str | None = None
    owner_references: list[dict[str, Any]] = Field(default_factory=list)


class EnvVar(_ApiModel):
    name: str
    value: str = ""


class ContainerPort(_ApiModel):
    name: str = ""
    container_port: int
    host_port: int = 0
    host_ip: str = ""
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"


class ResourceRequirements(_ApiModel):
    limits: dict[str, Quantity] = Field(default_factory=dict)
    requests: dict[str, Quantity] = Field(default_factory=dict)


class Container(_ApiModel):
    name: str
    image: str
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    working_dir: str = ""
    env: list[EnvVar] = Field(default_factory=list)
    ports: list[ContainerPort] = Field(default_factory=list)
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    termination_message_path: str = "/dev/termination-log"
    termination_message_policy: Literal["File", "FallbackToLogsOnError"] = "File"
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False

    @property
    def pull_policy(self) -> str:
        """The API default: Always for :latest or untagged images, else IfNotPresent."""
        if self.image_pull_policy:
            return self.image_pull_policy
        ref = self.image.rsplit("/", 1)[-1]
        if "@" in ref:
            return "IfNotPresent"
        if ":" not in ref or ref.endswith(":latest"):
            return "Always"
        return "IfNotPresent"


class PodSpec(_ApiModel):
    containers: list[Container] = Field(min_length=1)
    restart_policy: Literal["Always", "OnFailure", "Never"] = "Always"
    termination_grace_period_seconds: int = 30
    host_network: bool = False
    hostname: str = ""
    subdomain: str = ""
    node_name: str = ""
    priority: int | None = None
    priority_class_name: str = ""
    scheduler_name: str = ""
    service_account_name: str = ""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    enable_service_links: bool | None = None


class Pod(_ApiModel):
    api_version: str = "v1"
    kind: str = "Pod"
    metadata: ObjectMeta
    spec: PodSpec
    status: dict[str, Any] = Field(default_factory=dict)

    @property
    def uid(self) -> str:
        return self.metadata.uid

    @property
    def full_name(self) -> str:
        """``name_namespace``, the kubelet's key for static pods with the same identity."""
        return f"{self.metadata.name}_{self.metadata.namespace}"

    def all_containers(self) -> list[Container]:
        return list(self.spec.containers)


# Fields that parse without being honoured, yet are harmless to accept silently because
# they only matter to other components (the scheduler, the API server) or are informative.
_SILENTLY_ACCEPTED: frozenset[str] = frozenset(
    {
        "status",
        "spec.schedulerName",
        "spec.priority",
        "spec.priorityClassName",
        "spec.tolerations",
        "spec.enableServiceLinks",
        "spec.serviceAccountName",
        "spec.serviceAccount",
        "spec.dnsPolicy",  # the API default ClusterFirst is what we do without cluster DNS
        "spec.preemptionPolicy",
        "metadata.managedFields",
        "metadata.selfLink",
        "metadata.generation",
        "metadata.finalizers",
    }
)


def unhonoured_fields(pod: Pod) -> list[str]:
    """Paths of the fields in ``pod`` that nodeagent parsed but does not act upon.

    A kubelet user expects every field to mean something; rather than dropping what we do not
    implement yet, the agent reports these paths (log, event, pod condition).
    """
    found: list[str] = []

    def walk(model: BaseModel, path: str) -> None:
        for key in model.model_extra or {}:
            p = f"{path}.{key}" if path else key
            if p not in _SILENTLY_ACCEPTED:
                found.append(p)
        for name, field in type(model).model_fields.items():
            value = getattr(model, name)
            alias = field.alias or name
            p = f"{path}.{alias}" if path else alias
            if isinstance(value, BaseModel):
                walk(value, p)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, BaseModel):
                        walk(item, f"{p}[{i}]")

    walk(pod, "")
    return sorted(found)
