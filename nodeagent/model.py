"""The subset of Kubernetes core/v1 Pod that nodeagent reads.

Fields we honour are modelled; every other field still parses (``extra="allow"``) so that
:func:`unhonoured_fields` can report it instead of silently ignoring it. Field names follow the
API (camelCase on the wire, snake_case in Python).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from nodeagent import quantity as _quantity


def _valid_quantity(value: Any) -> Any:
    # Checked here, once: status, admission and the runtime parse quantities wherever they need
    # them and must not meet one that does not parse.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("a quantity must be a string or a number")  # noqa: TRY004 - pydantic wants a ValueError
    try:
        _quantity.parse(value)
    except ValueError:
        raise ValueError("not a valid quantity") from None  # the value is not repeated: it may be anything
    return value


Quantity = Annotated[str | int | float, BeforeValidator(_valid_quantity)]


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
    generation: int = 0
    """Bumped by the API server on every spec change (a resize among them); the node reports
    the generation it acted on as status.observedGeneration (plugins/runtime/resize.py)."""


class ObjectFieldSelector(_ApiModel):
    api_version: str = "v1"
    field_path: str


class ResourceFieldSelector(_ApiModel):
    container_name: str = ""
    resource: str
    divisor: Quantity | None = None


class ConfigMapKeySelector(_ApiModel):
    name: str = ""
    key: str
    optional: bool = False


class SecretKeySelector(_ApiModel):
    name: str = ""
    key: str
    optional: bool = False


class EnvVarSource(_ApiModel):
    # The downward API is resolved by the node alone; configMapKeyRef/secretKeyRef are read
    # from the API by plugins/apivolumes (standalone: reported unhonoured by that stage).
    field_ref: ObjectFieldSelector | None = None
    resource_field_ref: ResourceFieldSelector | None = None
    config_map_key_ref: ConfigMapKeySelector | None = None
    secret_key_ref: SecretKeySelector | None = None


class ConfigMapEnvSource(_ApiModel):
    name: str = ""
    optional: bool = False


class SecretEnvSource(_ApiModel):
    name: str = ""
    optional: bool = False


class EnvFromSource(_ApiModel):
    """envFrom[]: every key of a configMap or secret as a variable (plugins/apivolumes)."""

    prefix: str = ""
    config_map_ref: ConfigMapEnvSource | None = None
    secret_ref: SecretEnvSource | None = None


class EnvVar(_ApiModel):
    name: str
    value: str = ""
    value_from: EnvVarSource | None = None


class ContainerPort(_ApiModel):
    name: str = ""
    container_port: int
    host_port: int = 0
    host_ip: str = Field(default="", alias="hostIP")
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"


class ResourceClaimRef(_ApiModel):
    """A container's use of one of the pod's resourceClaims (resources.claims[]): the CDI devices
    of that claim (of one ``request`` of it when set) are given to the container (plugins/dra)."""

    name: str
    request: str = ""


class ResourceRequirements(_ApiModel):
    limits: dict[str, Quantity] = Field(default_factory=dict)
    requests: dict[str, Quantity] = Field(default_factory=dict)
    claims: list[ResourceClaimRef] = Field(default_factory=list)


class ContainerResizePolicy(_ApiModel):
    """How a resource of a running container is resized in place: NotRequired applies the new
    value to the running container, RestartContainer restarts it (plugins/runtime/resize.py)."""

    resource_name: str
    restart_policy: Literal["NotRequired", "RestartContainer"] = "NotRequired"


class ExecAction(_ApiModel):
    command: list[str] = Field(default_factory=list)


class HTTPHeader(_ApiModel):
    name: str
    value: str = ""


class HTTPGetAction(_ApiModel):
    path: str = ""
    port: int | str
    """A number, or the name of one of the container's ports."""
    host: str = ""
    scheme: Literal["HTTP", "HTTPS"] = "HTTP"
    http_headers: list[HTTPHeader] = Field(default_factory=list)


class TCPSocketAction(_ApiModel):
    port: int | str
    host: str = ""


class GRPCAction(_ApiModel):
    port: int = Field(ge=1, le=65535)
    service: str = ""


# core/v1 defaulting: an unset (zero) value gets the default.
_PROBE_DEFAULTS = {"period_seconds": 10, "timeout_seconds": 1, "success_threshold": 1, "failure_threshold": 3}


class Probe(_ApiModel):
    exec: ExecAction | None = None
    http_get: HTTPGetAction | None = None
    tcp_socket: TCPSocketAction | None = None
    grpc: GRPCAction | None = None
    initial_delay_seconds: int = Field(default=0, ge=0)
    period_seconds: int = Field(default=10, ge=0)
    timeout_seconds: int = Field(default=1, ge=0)
    success_threshold: int = Field(default=1, ge=0)
    failure_threshold: int = Field(default=3, ge=0)
    termination_grace_period_seconds: int | None = Field(default=None, gt=0)

    @field_validator("period_seconds", "timeout_seconds", "success_threshold", "failure_threshold")
    @classmethod
    def _default_when_zero(cls, value: int, info: Any) -> int:
        return value or _PROBE_DEFAULTS[info.field_name]

    @model_validator(mode="after")
    def _one_handler(self) -> Probe:
        # API validation: exactly one handler per probe.
        handlers = [h for h in (self.exec, self.http_get, self.tcp_socket, self.grpc) if h is not None]
        if len(handlers) != 1:
            raise ValueError("a probe must specify exactly one of exec, httpGet, tcpSocket, grpc")
        return self


class Capabilities(_ApiModel):
    add: list[str] = Field(default_factory=list)
    drop: list[str] = Field(default_factory=list)


class SecurityProfile(_ApiModel):
    """seccompProfile and appArmorProfile have the same shape."""

    type: Literal["RuntimeDefault", "Unconfined", "Localhost"]
    localhost_profile: str | None = None


class SecurityContext(_ApiModel):
    capabilities: Capabilities | None = None
    privileged: bool | None = None
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    read_only_root_filesystem: bool | None = None
    allow_privilege_escalation: bool | None = None
    proc_mount: Literal["Default", "Unmasked"] | None = None
    seccomp_profile: SecurityProfile | None = None
    app_armor_profile: SecurityProfile | None = None


class VolumeMount(_ApiModel):
    name: str
    mount_path: str
    read_only: bool = False
    sub_path: str = ""
    sub_path_expr: str = ""
    mount_propagation: Literal["None", "HostToContainer", "Bidirectional"] | None = None
    recursive_read_only: Literal["Disabled", "IfPossible", "Enabled"] | None = None
    """Submounts read-only too (plugins/runtime/sync.py resolves it against the runtime handler)."""


class VolumeDevice(_ApiModel):
    """volumeDevices[]: a Block-mode persistent volume given to the container as a device node
    at ``device_path`` (plugins/csi)."""

    name: str
    device_path: str


class SleepAction(_ApiModel):
    seconds: int = Field(ge=0)


class LifecycleHandler(_ApiModel):
    exec: ExecAction | None = None
    http_get: HTTPGetAction | None = None
    sleep: SleepAction | None = None
    tcp_socket: TCPSocketAction | None = None
    """Accepted by the API for compatibility; like the kubelet, running it fails the hook."""

    @model_validator(mode="after")
    def _one_handler(self) -> LifecycleHandler:
        if sum(h is not None for h in (self.exec, self.http_get, self.sleep, self.tcp_socket)) != 1:
            raise ValueError("a lifecycle handler must specify exactly one of exec, httpGet, sleep, tcpSocket")
        return self


class Lifecycle(_ApiModel):
    post_start: LifecycleHandler | None = None
    pre_stop: LifecycleHandler | None = None


class ContainerRestartRuleOnExitCodes(_ApiModel):
    operator: Literal["In", "NotIn"]
    values: list[int] = Field(default_factory=list)


class ContainerRestartRule(_ApiModel):
    # Restart: this container; RestartAllContainers (beta since v1.36): every container of the
    # pod, init containers again first, in the same sandbox (plugins/runtime/restartall.py).
    action: Literal["Restart", "RestartAllContainers"]
    exit_codes: ContainerRestartRuleOnExitCodes | None = None


class Container(_ApiModel):
    name: str
    image: str
    lifecycle: Lifecycle | None = None
    restart_policy: Literal["Always", "OnFailure", "Never"] | None = None
    """"Always" on an init container makes it a sidecar (a restartable init container);
    otherwise (ContainerRestartRules) it overrides the pod's policy for this container."""
    restart_policy_rules: list[ContainerRestartRule] = Field(default_factory=list)
    """Evaluated in order on exit, before ``restart_policy``."""
    security_context: SecurityContext | None = None
    volume_mounts: list[VolumeMount] = Field(default_factory=list)
    volume_devices: list[VolumeDevice] = Field(default_factory=list)
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    working_dir: str = ""
    env: list[EnvVar] = Field(default_factory=list)
    env_from: list[EnvFromSource] = Field(default_factory=list)
    ports: list[ContainerPort] = Field(default_factory=list)
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    resize_policy: list[ContainerResizePolicy] = Field(default_factory=list)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    termination_message_path: str = "/dev/termination-log"
    termination_message_policy: Literal["File", "FallbackToLogsOnError"] = "File"
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    startup_probe: Probe | None = None

    @model_validator(mode="after")
    def _probe_rules(self) -> Container:
        # API validation (validateProbe and friends): liveness and startup count one success;
        # only they can kill, so only they may carry a grace period.
        for kind, probe in (("livenessProbe", self.liveness_probe), ("startupProbe", self.startup_probe)):
            if probe is not None and probe.success_threshold != 1:
                raise ValueError(f"{kind}.successThreshold must be 1")
        if self.readiness_probe is not None and self.readiness_probe.termination_grace_period_seconds is not None:
            raise ValueError("readinessProbe.terminationGracePeriodSeconds must not be set")
        return self

    @property
    def pull_policy(self) -> str:
        """The API default: Always for :latest or untagged images, else IfNotPresent."""
        return self.image_pull_policy or default_pull_policy(self.image)



class EphemeralContainer(Container):
    """A container added to a running pod (kubectl debug, the ephemeralcontainers subresource):
    started once, never restarted, no probes, ports or resources (API validation). A
    ``targetContainerName`` is not modelled: it is reported as not honoured."""

class Sysctl(_ApiModel):
    name: str
    value: str


class PodSecurityContext(_ApiModel):
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    supplemental_groups: list[int] = Field(default_factory=list)
    fs_group: int | None = None
    """Added to every container's supplemental groups; emptyDir, configMap, secret, projected
    and downwardAPI volumes are given to this group (nodeagent/volumeutil/ownership.py)."""
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = None
    """As in the kubelet, it only shortens the ownership walk of persistent volumes: the
    volume types nodeagent implements are always walked."""
    sysctls: list[Sysctl] = Field(default_factory=list)
    seccomp_profile: SecurityProfile | None = None
    app_armor_profile: SecurityProfile | None = None


class HostAlias(_ApiModel):
    ip: str
    hostnames: list[str] = Field(default_factory=list)


class PodDNSConfigOption(_ApiModel):
    name: str
    value: str | None = None


class PodDNSConfig(_ApiModel):
    nameservers: list[str] = Field(default_factory=list)
    searches: list[str] = Field(default_factory=list)
    options: list[PodDNSConfigOption] = Field(default_factory=list)


class EmptyDirVolumeSource(_ApiModel):
    medium: Literal["", "Memory"] = ""
    size_limit: Quantity | None = None


class HostPathVolumeSource(_ApiModel):
    path: str
    type: Literal["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                  "BlockDevice"] = ""


def default_pull_policy(image: str) -> str:
    """The API's default pull policy for an image reference (SetDefaults_Container and
    SetDefaults_Volume): Always for :latest or an untagged image, else IfNotPresent."""
    ref = image.rsplit("/", 1)[-1]
    if "@" in ref:
        return "IfNotPresent"
    if ":" not in ref or ref.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


class ImageVolumeSource(_ApiModel):
    """volumes[].image (KEP-4639, GA in 1.36): an OCI image mounted read-only into the
    containers that mount the volume. Pulled by the runtime stage with the pod's pull secrets
    and mounted by the runtime itself (CRI Mount.image), never by a path of ours."""

    reference: str = ""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None

    @property
    def policy(self) -> str:
        return self.pull_policy or default_pull_policy(self.reference)


class DownwardAPIVolumeFile(_ApiModel):
    path: str
    field_ref: ObjectFieldSelector | None = None
    resource_field_ref: ResourceFieldSelector | None = None
    mode: int | None = None


class DownwardAPIVolumeSource(_ApiModel):
    items: list[DownwardAPIVolumeFile] = Field(default_factory=list)
    default_mode: int = 0o644


class KeyToPath(_ApiModel):
    key: str
    path: str
    mode: int | None = None


class ConfigMapVolumeSource(_ApiModel):
    name: str = ""
    items: list[KeyToPath] = Field(default_factory=list)
    default_mode: int = 0o644
    optional: bool = False


class SecretVolumeSource(_ApiModel):
    secret_name: str = ""
    items: list[KeyToPath] = Field(default_factory=list)
    default_mode: int = 0o644
    optional: bool = False


class ConfigMapProjection(_ApiModel):
    name: str = ""
    items: list[KeyToPath] = Field(default_factory=list)
    optional: bool = False


class SecretProjection(_ApiModel):
    name: str = ""
    items: list[KeyToPath] = Field(default_factory=list)
    optional: bool = False


class DownwardAPIProjection(_ApiModel):
    items: list[DownwardAPIVolumeFile] = Field(default_factory=list)


class ServiceAccountTokenProjection(_ApiModel):
    audience: str = ""
    expiration_seconds: int = Field(default=3600, ge=600)
    path: str


class VolumeProjection(_ApiModel):
    # clusterTrustBundle and podCertificate stay unmodelled: reported as unhonoured.
    secret: SecretProjection | None = None
    config_map: ConfigMapProjection | None = None
    downward_api: DownwardAPIProjection | None = Field(default=None, alias="downwardAPI")
    service_account_token: ServiceAccountTokenProjection | None = None


class ProjectedVolumeSource(_ApiModel):
    sources: list[VolumeProjection] = Field(default_factory=list)
    default_mode: int = 0o644


class PersistentVolumeClaimVolumeSource(_ApiModel):
    claim_name: str
    read_only: bool = False


class EphemeralVolumeSource(_ApiModel):
    """A generic ephemeral volume: the ephemeral-volume controller makes a PVC named
    ``<pod>-<volume>`` from the template, owned by the pod; the node mounts that PVC."""

    volume_claim_template: dict[str, Any] | None = None


class CSIVolumeSource(_ApiModel):
    """A CSI inline ephemeral volume: published by the driver for this pod only."""

    driver: str
    read_only: bool | None = None
    fs_type: str | None = None
    volume_attributes: dict[str, str] = Field(default_factory=dict)
    node_publish_secret_ref: LocalObjectReference | None = None


class Volume(_ApiModel):
    # Sources nodeagent does not implement (nfs, iscsi, ...) stay unmodelled: they are reported
    # as unhonoured and their mounts are skipped. configMap, secret and projected need the API:
    # plugins/apivolumes sets them up (standalone: reported unhonoured by that stage);
    # persistentVolumeClaim, ephemeral and csi are plugins/csi's.
    name: str
    empty_dir: EmptyDirVolumeSource | None = None
    host_path: HostPathVolumeSource | None = None
    downward_api: DownwardAPIVolumeSource | None = Field(default=None, alias="downwardAPI")
    config_map: ConfigMapVolumeSource | None = None
    secret: SecretVolumeSource | None = None
    projected: ProjectedVolumeSource | None = None
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None
    ephemeral: EphemeralVolumeSource | None = None
    csi: CSIVolumeSource | None = None
    image: ImageVolumeSource | None = None
    """Pulled and mounted by the runtime stage (plugins/runtime/imagevolumes.py)."""


class PodResourceClaim(_ApiModel):
    """spec.resourceClaims[]: a ResourceClaim by name, or one made from a template (its name is
    then in status.resourceClaimStatuses). Prepared by plugins/dra before the sandbox."""

    name: str
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> PodResourceClaim:
        if (self.resource_claim_name is None) == (self.resource_claim_template_name is None):
            raise ValueError(f"resourceClaims[{self.name!r}]: exactly one of resourceClaimName and "
                             "resourceClaimTemplateName is required")
        return self


class PodSchedulingGroup(_ApiModel):
    """spec.schedulingGroup (Kubernetes 1.36+): the PodGroup whose gang policy the pod follows
    (honoured by the gang stage)."""

    pod_group_name: str


class WorkloadReference(_ApiModel):
    """spec.workloadRef (Kubernetes 1.35, tombstoned in 1.36): the Workload and pod group the
    pod belongs to (honoured by the gang stage)."""

    name: str
    pod_group: str
    pod_group_replica_key: str = ""


class _NodeSelectorRequirement(TypedDict, total=False):
    key: str | None
    operator: str | None
    values: list[str] | None


class _NodeSelectorTerm(TypedDict, total=False):
    matchExpressions: list[_NodeSelectorRequirement] | None
    matchFields: list[_NodeSelectorRequirement] | None


class _NodeSelector(TypedDict, total=False):
    nodeSelectorTerms: list[_NodeSelectorTerm] | None


class _PreferredTerm(TypedDict, total=False):
    weight: int | None
    preference: _NodeSelectorTerm | None


class _NodeAffinity(TypedDict, total=False):
    requiredDuringSchedulingIgnoredDuringExecution: _NodeSelector | None
    preferredDuringSchedulingIgnoredDuringExecution: list[_PreferredTerm] | None


class _Affinity(TypedDict, total=False):
    """The part of spec.affinity the node reads (plugins/nodeaffinity.py), as a shape to check."""

    nodeAffinity: _NodeAffinity | None


_AFFINITY_SHAPE = TypeAdapter(_Affinity)


_DNS1123_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class PodOS(_ApiModel):
    name: str


class LocalObjectReference(_ApiModel):
    name: str = ""


class PodReadinessGate(_ApiModel):
    """spec.readinessGates[]: a condition another writer sets in status.conditions; the pod is
    Ready only while each is True (nodeagent/status.py, the kubelet's GeneratePodReadyCondition)."""

    condition_type: str


class PodSpec(_ApiModel):
    containers: list[Container] = Field(min_length=1)
    init_containers: list[Container] = Field(default_factory=list)
    ephemeral_containers: list[EphemeralContainer] = Field(default_factory=list)

    @model_validator(mode="after")
    def _container_rules(self) -> PodSpec:
        # API validation: one name space for init and regular containers; a container-level
        # restartPolicy only on init containers (where Always makes a sidecar).
        names = [c.name for c in (*self.init_containers, *self.containers, *self.ephemeral_containers)]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"container names must be unique across initContainers and containers: {duplicates}")
        for c in (*self.init_containers, *self.containers):
            if c.restart_policy_rules and c.restart_policy is None:
                raise ValueError(f"container {c.name!r}: restartPolicyRules need a container restartPolicy")
        for c in self.init_containers:
            if c.restart_policy != "Always" and (c.lifecycle or c.liveness_probe or c.readiness_probe
                                                 or c.startup_probe):
                raise ValueError(f"init container {c.name!r}: lifecycle and probes need restartPolicy: Always")
        claims = {c.name for c in self.resource_claims}
        for c in (*self.init_containers, *self.containers):
            unknown = sorted({ref.name for ref in c.resources.claims} - claims)
            if unknown:
                raise ValueError(f"container {c.name!r}: resources.claims {unknown} name no entry of "
                                 "spec.resourceClaims")
        return self

    volumes: list[Volume] = Field(default_factory=list)
    security_context: PodSecurityContext | None = None
    host_pid: bool = Field(default=False, alias="hostPID")
    host_ipc: bool = Field(default=False, alias="hostIPC")
    share_process_namespace: bool = False
    set_hostname_as_fqdn: bool = Field(default=False, alias="setHostnameAsFQDN")
    host_aliases: list[HostAlias] = Field(default_factory=list)
    dns_policy: Literal["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"] = "ClusterFirst"
    dns_config: PodDNSConfig | None = None
    restart_policy: Literal["Always", "OnFailure", "Never"] = "Always"
    termination_grace_period_seconds: int = 30
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    host_network: bool = False
    hostname: str = ""
    # HostnameOverride (beta): the sandbox's hostname verbatim (a DNS subdomain), no domain.
    hostname_override: str | None = None
    subdomain: str = ""
    node_name: str = ""
    priority: int | None = None
    priority_class_name: str = ""
    scheduler_name: str = ""
    service_account_name: str = ""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    enable_service_links: bool | None = None
    """False: no service variables from the pod's namespace (plugins/apivolumes/services.py)."""
    scheduling_group: PodSchedulingGroup | None = None
    workload_ref: WorkloadReference | None = None
    resource_claims: list[PodResourceClaim] = Field(default_factory=list)
    runtime_class_name: str | None = None
    """Resolved through the RuntimeClass object to the CRI runtime handler of the sandbox
    (plugins/runtime/runtimeclass.py)."""
    overhead: dict[str, Quantity] | None = None
    """The runtime class's per-pod overhead (set by the API server's RuntimeClass admission; for
    static pods by the static source): counted at admission and in the pod cgroup."""
    host_users: bool | None = None
    """False: the pod gets its own user namespace with IDs allocated by the node
    (plugins/runtime/userns.py); unset or true: the host's."""
    resources: ResourceRequirements | None = None
    """Pod-level resources: reported in status and applied to the pod's cgroup
    (plugins/runtime/podcgroup.py), resizable in place (plugins/runtime/resize.py)."""

    @field_validator("hostname_override")
    @classmethod
    def _dns_subdomain(cls, value: str | None) -> str | None:
        if value is not None and not _DNS1123_SUBDOMAIN.fullmatch(value):
            raise ValueError(f"hostnameOverride {value!r} is not a valid DNS subdomain (RFC 1123, at most 253 "
                             "characters of lower-case alphanumerics, '-' and '.')")
        return value

    # Checked at admission (the kubelet's PodOSNotSupported); the node is Linux.
    os: PodOS | None = None
    readiness_gates: list[PodReadinessGate] = Field(default_factory=list)
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list)
    """Registry credentials for pulls, read from the API by the runtime stage
    (plugins/runtime/pullsecrets.py); standalone, reported unhonoured by plugins/apivolumes."""
    # Re-checked at admission against the Node's labels (nodeagent/kube/nodeaffinity.py); of
    # spec.affinity only nodeAffinity's required terms matter to a node, the rest is the
    # scheduler's.
    node_selector: dict[str, str] = Field(default_factory=dict)
    affinity: dict[str, Any] | None = None

    @field_validator("affinity")
    @classmethod
    def _node_affinity_shape(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # Kept as the API's mapping (plugins/nodeaffinity.py reads it as such), but of the shape
        # that code walks: a boolean where a term belongs must not fail admission with a TypeError.
        if value is not None:
            try:
                _AFFINITY_SHAPE.validate_python(value, strict=True)
            except ValidationError:
                raise ValueError("spec.affinity.nodeAffinity is not a valid node affinity") from None
        return value


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
        """Init containers (in order), then regular containers."""
        return [*self.spec.init_containers, *self.spec.containers]


# Fields that parse without being honoured, yet are harmless to accept silently because
# they only matter to other components (the scheduler, the API server) or are informative.
_SILENTLY_ACCEPTED: frozenset[str] = frozenset(
    {
        "status",
        "spec.schedulerName",
        "spec.priority",
        "spec.priorityClassName",
        "spec.tolerations",
        "spec.serviceAccountName",
        "spec.serviceAccount",
        "spec.automountServiceAccountToken",  # the API server's admission acts on it, not the node
        "spec.dnsPolicy",  # the API default ClusterFirst is what we do without cluster DNS
        "spec.preemptionPolicy",
        "metadata.managedFields",
        "metadata.selfLink",
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
