"""Typed Python values for CRI v1 messages.

These are what the rest of nodeagent sees; the protobuf classes stay inside
cri/. Each dataclass is named like its proto message (a few response shapes
get a clearer name: VersionInfo, ExecSyncResult, ContainerEvent) and has the
proto's fields under snake_case names (``uidMappings`` -> ``uid_mappings``,
``CDI_devices`` -> ``cdi_devices``). cri.convert maps them by field name.

Conventions, applied uniformly:
  * a nested message is ``X | None`` (None = not sent / not reported), except
    ``metadata``, which CRI requires on every config and object: it is a plain
    ``X`` defaulting to an empty one, and always sent;
  * a presence wrapper (Int64Value, UInt64Value, *StateValue) is its
    unwrapped value or None: ``run_as_user: int | None``;
  * repeated fields are lists, maps are dicts, ``ContainerConfig.envs``
    (repeated KeyValue) is an ordered dict;
  * enums are IntEnums with the proto's member names;
  * timestamps stay integers in nanoseconds since the epoch, as on the wire.

nodeagent is Linux-only: the ``windows`` fields and Windows* messages of the
schema have no counterpart here (convert leaves them unset / ignores them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple


class ProtoEnum(IntEnum):
    """An IntEnum that keeps values it does not know.

    proto3 enums are open: a newer runtime may send a number this schema lacks.
    Such a value becomes a pseudo-member named ``UNKNOWN_<n>`` instead of
    failing the whole response.
    """

    @classmethod
    def _missing_(cls, value: object) -> ProtoEnum | None:
        if not isinstance(value, int):
            return None
        member = int.__new__(cls, value)
        member._name_ = f"UNKNOWN_{value}"
        member._value_ = value
        return member


# ----------------------------------------------------------------- enums


class Protocol(ProtoEnum):
    TCP = 0
    UDP = 1
    SCTP = 2


class MountPropagation(ProtoEnum):
    PROPAGATION_PRIVATE = 0
    PROPAGATION_HOST_TO_CONTAINER = 1
    PROPAGATION_BIDIRECTIONAL = 2


class NamespaceMode(ProtoEnum):
    POD = 0
    CONTAINER = 1
    NODE = 2
    TARGET = 3


class SupplementalGroupsPolicy(ProtoEnum):
    Merge = 0
    Strict = 1


class ProfileType(ProtoEnum):
    """SecurityProfile.ProfileType."""

    RuntimeDefault = 0
    Unconfined = 1
    Localhost = 2


class PodSandboxState(ProtoEnum):
    SANDBOX_READY = 0
    SANDBOX_NOTREADY = 1


class ContainerState(ProtoEnum):
    CONTAINER_CREATED = 0
    CONTAINER_RUNNING = 1
    CONTAINER_EXITED = 2
    CONTAINER_UNKNOWN = 3


class ContainerEventType(ProtoEnum):
    CONTAINER_CREATED_EVENT = 0
    CONTAINER_STARTED_EVENT = 1
    CONTAINER_STOPPED_EVENT = 2
    CONTAINER_DELETED_EVENT = 3


class CgroupDriver(ProtoEnum):
    SYSTEMD = 0
    CGROUPFS = 1


class Signal(ProtoEnum):
    """Stop signals; RUNTIME_DEFAULT lets the image / runtime decide."""

    RUNTIME_DEFAULT = 0
    SIGABRT = 1
    SIGALRM = 2
    SIGBUS = 3
    SIGCHLD = 4
    SIGCLD = 5
    SIGCONT = 6
    SIGFPE = 7
    SIGHUP = 8
    SIGILL = 9
    SIGINT = 10
    SIGIO = 11
    SIGIOT = 12
    SIGKILL = 13
    SIGPIPE = 14
    SIGPOLL = 15
    SIGPROF = 16
    SIGPWR = 17
    SIGQUIT = 18
    SIGSEGV = 19
    SIGSTKFLT = 20
    SIGSTOP = 21
    SIGSYS = 22
    SIGTERM = 23
    SIGTRAP = 24
    SIGTSTP = 25
    SIGTTIN = 26
    SIGTTOU = 27
    SIGURG = 28
    SIGUSR1 = 29
    SIGUSR2 = 30
    SIGVTALRM = 31
    SIGWINCH = 32
    SIGXCPU = 33
    SIGXFSZ = 34
    SIGRTMIN = 35
    SIGRTMINPLUS1 = 36
    SIGRTMINPLUS2 = 37
    SIGRTMINPLUS3 = 38
    SIGRTMINPLUS4 = 39
    SIGRTMINPLUS5 = 40
    SIGRTMINPLUS6 = 41
    SIGRTMINPLUS7 = 42
    SIGRTMINPLUS8 = 43
    SIGRTMINPLUS9 = 44
    SIGRTMINPLUS10 = 45
    SIGRTMINPLUS11 = 46
    SIGRTMINPLUS12 = 47
    SIGRTMINPLUS13 = 48
    SIGRTMINPLUS14 = 49
    SIGRTMINPLUS15 = 50
    SIGRTMAXMINUS14 = 51
    SIGRTMAXMINUS13 = 52
    SIGRTMAXMINUS12 = 53
    SIGRTMAXMINUS11 = 54
    SIGRTMAXMINUS10 = 55
    SIGRTMAXMINUS9 = 56
    SIGRTMAXMINUS8 = 57
    SIGRTMAXMINUS7 = 58
    SIGRTMAXMINUS6 = 59
    SIGRTMAXMINUS5 = 60
    SIGRTMAXMINUS4 = 61
    SIGRTMAXMINUS3 = 62
    SIGRTMAXMINUS2 = 63
    SIGRTMAXMINUS1 = 64
    SIGRTMAX = 65


# ----------------------------------------------------------------- shared pieces

# Every value is @dataclass(frozen=True, slots=True, kw_only=True): immutable,
# compact, and built by keyword so that field order carries no meaning.


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionInfo:
    """VersionResponse."""

    version: str = ""
    runtime_name: str = ""
    runtime_version: str = ""
    runtime_api_version: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DNSConfig:
    servers: list[str] = field(default_factory=list)
    searches: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class PortMapping:
    protocol: Protocol = Protocol.TCP
    container_port: int = 0
    host_port: int = 0
    host_ip: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class IDMapping:
    host_id: int = 0
    container_id: int = 0
    length: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageSpec:
    image: str = ""
    annotations: dict[str, str] = field(default_factory=dict)
    user_specified_image: str = ""
    runtime_handler: str = ""
    image_ref: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Mount:
    container_path: str = ""
    host_path: str = ""
    readonly: bool = False
    selinux_relabel: bool = False
    propagation: MountPropagation = MountPropagation.PROPAGATION_PRIVATE
    uid_mappings: list[IDMapping] = field(default_factory=list)
    gid_mappings: list[IDMapping] = field(default_factory=list)
    recursive_read_only: bool = False
    image: ImageSpec | None = None
    image_sub_path: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class UserNamespace:
    mode: NamespaceMode = NamespaceMode.POD
    uids: list[IDMapping] = field(default_factory=list)
    gids: list[IDMapping] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class NamespaceOption:
    network: NamespaceMode = NamespaceMode.POD
    pid: NamespaceMode = NamespaceMode.POD
    ipc: NamespaceMode = NamespaceMode.POD
    target_id: str = ""
    userns_options: UserNamespace | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SELinuxOption:
    user: str = ""
    role: str = ""
    type: str = ""
    level: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityProfile:
    profile_type: ProfileType = ProfileType.RuntimeDefault
    localhost_ref: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Capability:
    add_capabilities: list[str] = field(default_factory=list)
    drop_capabilities: list[str] = field(default_factory=list)
    add_ambient_capabilities: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class HugepageLimit:
    page_size: str = ""
    limit: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxContainerResources:
    """Zero / empty means "not set" for every field."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    hugepage_limits: list[HugepageLimit] = field(default_factory=list)
    unified: dict[str, str] = field(default_factory=dict)
    memory_swap_limit_in_bytes: int = 0


# ----------------------------------------------------------------- pod sandboxes


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxSandboxSecurityContext:
    namespace_options: NamespaceOption | None = None
    selinux_options: SELinuxOption | None = None
    run_as_user: int | None = None
    run_as_group: int | None = None
    readonly_rootfs: bool = False
    supplemental_groups: list[int] = field(default_factory=list)
    supplemental_groups_policy: SupplementalGroupsPolicy = SupplementalGroupsPolicy.Merge
    privileged: bool = False
    seccomp: SecurityProfile | None = None
    apparmor: SecurityProfile | None = None
    seccomp_profile_path: str = ""  # deprecated upstream; use seccomp


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxPodSandboxConfig:
    cgroup_parent: str = ""
    security_context: LinuxSandboxSecurityContext | None = None
    sysctls: dict[str, str] = field(default_factory=dict)
    overhead: LinuxContainerResources | None = None
    resources: LinuxContainerResources | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandboxMetadata:
    name: str = ""
    uid: str = ""
    namespace: str = ""
    attempt: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandboxConfig:
    metadata: PodSandboxMetadata = field(default_factory=PodSandboxMetadata)
    hostname: str = ""  # must stay empty with a NODE network namespace
    log_directory: str = ""
    dns_config: DNSConfig | None = None
    port_mappings: list[PortMapping] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    linux: LinuxPodSandboxConfig | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodIP:
    ip: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandboxNetworkStatus:
    ip: str = ""
    additional_ips: list[PodIP] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Namespace:
    options: NamespaceOption | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxPodSandboxStatus:
    namespaces: Namespace | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandboxStatus:
    id: str = ""
    metadata: PodSandboxMetadata = field(default_factory=PodSandboxMetadata)
    state: PodSandboxState = PodSandboxState.SANDBOX_READY
    created_at: int = 0
    network: PodSandboxNetworkStatus | None = None
    linux: LinuxPodSandboxStatus | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    runtime_handler: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandbox:
    id: str = ""
    metadata: PodSandboxMetadata = field(default_factory=PodSandboxMetadata)
    state: PodSandboxState = PodSandboxState.SANDBOX_READY
    created_at: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    runtime_handler: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandboxFilter:
    """All set fields must match; label_selector matches exact values."""

    id: str = ""
    state: PodSandboxState | None = None
    label_selector: dict[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------- containers


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxContainerSecurityContext:
    capabilities: Capability | None = None
    privileged: bool = False
    namespace_options: NamespaceOption | None = None
    selinux_options: SELinuxOption | None = None
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_username: str = ""
    readonly_rootfs: bool = False
    supplemental_groups: list[int] = field(default_factory=list)
    supplemental_groups_policy: SupplementalGroupsPolicy = SupplementalGroupsPolicy.Merge
    no_new_privs: bool = False
    masked_paths: list[str] = field(default_factory=list)
    readonly_paths: list[str] = field(default_factory=list)
    seccomp: SecurityProfile | None = None
    apparmor: SecurityProfile | None = None
    apparmor_profile: str = ""  # deprecated upstream; use apparmor
    seccomp_profile_path: str = ""  # deprecated upstream; use seccomp


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxContainerConfig:
    resources: LinuxContainerResources | None = None
    security_context: LinuxContainerSecurityContext | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerMetadata:
    name: str = ""
    attempt: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    container_path: str = ""
    host_path: str = ""
    permissions: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CDIDevice:
    name: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerConfig:
    metadata: ContainerMetadata = field(default_factory=ContainerMetadata)
    image: ImageSpec | None = None
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    working_dir: str = ""
    envs: dict[str, str] = field(default_factory=dict)  # repeated KeyValue, in order
    mounts: list[Mount] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    log_path: str = ""  # relative to PodSandboxConfig.log_directory
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False
    linux: LinuxContainerConfig | None = None
    cdi_devices: list[CDIDevice] = field(default_factory=list)  # ignored by containerd < 1.7.2
    stop_signal: Signal = Signal.RUNTIME_DEFAULT


@dataclass(frozen=True, slots=True, kw_only=True)
class Container:
    id: str = ""
    pod_sandbox_id: str = ""
    metadata: ContainerMetadata = field(default_factory=ContainerMetadata)
    image: ImageSpec | None = None
    image_ref: str = ""
    state: ContainerState = ContainerState.CONTAINER_CREATED
    created_at: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    image_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerFilter:
    """All set fields must match; label_selector matches exact values."""

    id: str = ""
    state: ContainerState | None = None
    pod_sandbox_id: str = ""
    label_selector: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerResources:
    linux: LinuxContainerResources | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxContainerUser:
    uid: int = 0
    gid: int = 0
    supplemental_groups: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerUser:
    linux: LinuxContainerUser | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerStatus:
    id: str = ""
    metadata: ContainerMetadata = field(default_factory=ContainerMetadata)
    state: ContainerState = ContainerState.CONTAINER_CREATED
    created_at: int = 0
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    image: ImageSpec | None = None
    image_ref: str = ""
    reason: str = ""  # Completed, Error, OOMKilled, StartError, ...
    message: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    log_path: str = ""
    resources: ContainerResources | None = None
    image_id: str = ""
    user: ContainerUser | None = None
    stop_signal: Signal = Signal.RUNTIME_DEFAULT


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecSyncResult:
    """ExecSyncResponse."""

    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecRequest:
    container_id: str = ""
    cmd: list[str] = field(default_factory=list)
    tty: bool = False
    stdin: bool = False
    stdout: bool = False
    stderr: bool = False
    audit_request_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttachRequest:
    container_id: str = ""
    stdin: bool = False
    tty: bool = False
    stdout: bool = False
    stderr: bool = False
    audit_request_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerEvent:
    """ContainerEventResponse."""

    container_id: str = ""
    container_event_type: ContainerEventType = ContainerEventType.CONTAINER_CREATED_EVENT
    created_at: int = 0
    pod_sandbox_status: PodSandboxStatus | None = None
    containers_statuses: list[ContainerStatus] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandboxIdentity:
    """The part of a PodSandboxStatus that says whose sandbox it is."""

    id: str = ""
    metadata: PodSandboxMetadata = field(default_factory=PodSandboxMetadata)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerEventSummary:
    """ContainerEventResponse without the statuses it carries: which container, what happened,
    in whose sandbox. Reading every container's full status out of each event costs more than
    a listing of the one pod it names (the relister reads that pod afresh anyway)."""

    container_id: str = ""
    container_event_type: ContainerEventType = ContainerEventType.CONTAINER_CREATED_EVENT
    created_at: int = 0
    pod_sandbox_status: PodSandboxIdentity | None = None


# ----------------------------------------------------------------- images


@dataclass(frozen=True, slots=True, kw_only=True)
class Image:
    id: str = ""
    repo_tags: list[str] = field(default_factory=list)
    repo_digests: list[str] = field(default_factory=list)
    size: int = 0
    uid: int | None = None
    username: str = ""
    spec: ImageSpec | None = None
    pinned: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageFilter:
    image: ImageSpec | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    username: str = ""
    password: str = field(default="", repr=False)
    auth: str = field(default="", repr=False)
    server_address: str = ""
    identity_token: str = field(default="", repr=False)
    registry_token: str = field(default="", repr=False)


# ----------------------------------------------------------------- runtime status and config


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeCondition:
    type: str = ""  # RuntimeReady, NetworkReady, ...
    status: bool = False
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeStatus:
    conditions: list[RuntimeCondition] = field(default_factory=list)

    def condition(self, type: str) -> RuntimeCondition | None:
        """The condition of the given type, if the runtime reported it."""
        return next((c for c in self.conditions if c.type == type), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeHandlerFeatures:
    recursive_read_only_mounts: bool = False
    user_namespaces: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeHandler:
    name: str = ""  # "" is the default handler
    features: RuntimeHandlerFeatures | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeFeatures:
    supplemental_groups_policy: bool = False
    user_namespaces_host_network: bool = False


class RuntimeCapabilities(NamedTuple):
    """What StatusResponse says besides the conditions: the runtime handlers with their
    features, and runtime-wide features (both empty on runtimes older than CRI 1.30, such as
    containerd 1.6). Not a message of its own: the client unpacks StatusResponse."""

    runtime_handlers: list[RuntimeHandler]
    features: RuntimeFeatures | None

    def handler(self, name: str) -> RuntimeHandler | None:
        return next((h for h in self.runtime_handlers if h.name == name), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxRuntimeConfiguration:
    cgroup_driver: CgroupDriver = CgroupDriver.SYSTEMD


# ----------------------------------------------------------------- stats


@dataclass(frozen=True, slots=True, kw_only=True)
class FilesystemIdentifier:
    mountpoint: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class FilesystemUsage:
    timestamp: int = 0
    fs_id: FilesystemIdentifier | None = None
    used_bytes: int | None = None
    inodes_used: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PsiData:
    total: int = 0  # cumulative stall time, ns
    avg10: float = 0.0
    avg60: float = 0.0
    avg300: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PsiStats:
    full: PsiData | None = None
    some: PsiData | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuUsage:
    timestamp: int = 0
    usage_core_nano_seconds: int | None = None
    usage_nano_cores: int | None = None
    psi: PsiStats | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryUsage:
    timestamp: int = 0
    working_set_bytes: int | None = None
    available_bytes: int | None = None
    usage_bytes: int | None = None
    rss_bytes: int | None = None
    page_faults: int | None = None
    major_page_faults: int | None = None
    psi: PsiStats | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SwapUsage:
    timestamp: int = 0
    swap_available_bytes: int | None = None
    swap_usage_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class IoUsage:
    timestamp: int = 0
    psi: PsiStats | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerAttributes:
    id: str = ""
    metadata: ContainerMetadata = field(default_factory=ContainerMetadata)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerStats:
    attributes: ContainerAttributes | None = None
    cpu: CpuUsage | None = None
    memory: MemoryUsage | None = None
    writable_layer: FilesystemUsage | None = None
    swap: SwapUsage | None = None
    io: IoUsage | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerStatsFilter:
    id: str = ""
    pod_sandbox_id: str = ""
    label_selector: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkInterfaceUsage:
    name: str = ""
    rx_bytes: int | None = None
    rx_errors: int | None = None
    tx_bytes: int | None = None
    tx_errors: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkUsage:
    timestamp: int = 0
    default_interface: NetworkInterfaceUsage | None = None
    interfaces: list[NetworkInterfaceUsage] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessUsage:
    timestamp: int = 0
    process_count: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandboxAttributes:
    id: str = ""
    metadata: PodSandboxMetadata = field(default_factory=PodSandboxMetadata)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinuxPodSandboxStats:
    cpu: CpuUsage | None = None
    memory: MemoryUsage | None = None
    network: NetworkUsage | None = None
    process: ProcessUsage | None = None
    containers: list[ContainerStats] = field(default_factory=list)
    io: IoUsage | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandboxStats:
    attributes: PodSandboxAttributes | None = None
    linux: LinuxPodSandboxStats | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSandboxStatsFilter:
    id: str = ""
    label_selector: dict[str, str] = field(default_factory=dict)
