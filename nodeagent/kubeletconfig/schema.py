"""KubeletConfiguration v1beta1 (kubelet.config.k8s.io), every field of the 1.37 kubelet.

The models mirror k8s.io/kubelet@v0.37.2 config/v1beta1/types.go: one field per Go field, its
JSON name as the alias, Go's zero value as the Python default (``0``, ``""``, ``False``, an
empty duration) and ``None`` where Go has a pointer (``*bool``, ``*int32``, ...) or a nil map or
slice, so that the kubelet's defaulting rules ("zero means unset", "nil means unset") apply as
written (nodeagent/kubeletconfig/defaults.py). Each field carries its Go type (:class:`Go`),
which the strict decoder uses to refuse what the kubelet's decoder refuses, in its words.

Durations are float seconds in Python and Go duration strings (``"2m0s"``) in JSON. Paths are
strings, as in the kubelet (``""`` is "not set"); a :class:`pathlib.Path` is accepted when the
configuration is built in Python.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator

from nodeagent import duration as godur
from nodeagent.duration import Duration as _Seconds
from nodeagent.imagenames import allowlist_pattern


class Go:
    """The Go type of a field (``int32``, ``Duration``, ``map[string]string``, ...)."""

    __slots__ = ("type",)

    def __init__(self, type_: str) -> None:
        self.type = type_

    def __repr__(self) -> str:
        return f"Go({self.type!r})"


def _path_text(value: object) -> object:
    return str(value) if isinstance(value, PurePath) else value


def _duration_json(seconds: float) -> str:
    return godur.format(seconds)


Str = Annotated[str, Go("string")]
PathStr = Annotated[str, BeforeValidator(_path_text), Go("string")]
Bool = Annotated[bool, Go("bool")]
Int32 = Annotated[int, Go("int32")]
Int64 = Annotated[int, Go("int64")]
Float64 = Annotated[float, Go("float64")]
Duration = Annotated[_Seconds, PlainSerializer(_duration_json, when_used="json"), Go("Duration")]
StrList = Annotated[list[str], Go("[]string")]
Int32List = Annotated[list[int], Go("[]int32")]
StrMap = Annotated[dict[str, str], Go("map[string]string")]
BoolMap = Annotated[dict[str, bool], Go("map[string]bool")]
HeaderMap = Annotated[dict[str, list[str]], Go("map[string][]string")]
Quantity = Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, (int, float)) else v), Go("Quantity")]
ResourceList = Annotated[dict[str, Quantity], Go("ResourceList")]

_MODEL = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


# --- authentication and authorization of the kubelet API --------------------------------

class KubeletX509Authentication(BaseModel):
    model_config = _MODEL

    client_ca_file: PathStr = Field("", alias="clientCAFile")
    """Client certificates signed by this CA authenticate as CN (user) and O (groups). Empty in
    cluster mode: the cluster CA of the kubeconfig (its certificate-authority file, or its
    certificate-authority-data written to ``rootDir/pki/client-ca.crt``), as kubeadm points
    the kubelet at ``/etc/kubernetes/pki/ca.crt``. Empty standalone: no x509 authentication."""


class KubeletWebhookAuthentication(BaseModel):
    model_config = _MODEL

    enabled: Annotated[bool | None, Go("bool")] = None
    """Bearer tokens (``Authorization: Bearer``, or a websocket's
    ``base64url.bearer.authorization.k8s.io.`` subprotocol) checked with a TokenReview through
    the node's API client. The kubelet's file default is true; nodeagent's own format leaves it
    unset, which means on in cluster mode and off standalone (there is no API server)."""
    cache_ttl: Duration = Field(0.0, alias="cacheTTL")
    """How long a TokenReview's answer (authenticated or not) is reused (2m0s)."""


class KubeletAnonymousAuthentication(BaseModel):
    model_config = _MODEL

    enabled: Annotated[bool | None, Go("bool")] = None
    """Requests no authenticator recognises are served as system:anonymous (group
    system:unauthenticated). Off, as the kubelet's configuration file defaults it."""


class KubeletAuthentication(BaseModel):
    """The kubelet's ``authentication`` section of the kubelet API (10250)."""

    model_config = _MODEL

    x509: KubeletX509Authentication = Field(default_factory=lambda: KubeletX509Authentication())
    webhook: KubeletWebhookAuthentication = Field(default_factory=lambda: KubeletWebhookAuthentication())
    anonymous: KubeletAnonymousAuthentication = Field(default_factory=lambda: KubeletAnonymousAuthentication())


class KubeletWebhookAuthorization(BaseModel):
    model_config = _MODEL

    cache_authorized_ttl: Duration = Field(0.0, alias="cacheAuthorizedTTL")
    """How long an allowing SubjectAccessReview answer is reused (5m0s)."""
    cache_unauthorized_ttl: Duration = Field(0.0, alias="cacheUnauthorizedTTL")
    """How long a denying answer is reused (30s)."""


class KubeletAuthorization(BaseModel):
    """The kubelet's ``authorization`` section of the kubelet API (10250)."""

    model_config = _MODEL

    mode: Annotated[str | None, Go("string")] = None
    """``Webhook`` (a SubjectAccessReview per request, on ``nodes/<subresource>`` of this node)
    or ``AlwaysAllow`` (every authenticated request). The kubelet's file default is Webhook;
    nodeagent's own format leaves it unset: Webhook in cluster mode, AlwaysAllow standalone."""
    webhook: KubeletWebhookAuthorization = Field(default_factory=lambda: KubeletWebhookAuthorization())

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, value: str | None) -> str | None:
        # The kubelet's BuildAuthz messages ("" is defaulted to Webhook in the kubelet's format).
        if value and value not in ("Webhook", "AlwaysAllow"):
            raise ValueError(f"unknown authorization mode {value}")
        return value


# --- the smaller structs ---------------------------------------------------------------------

_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                             r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def qualified_name_error(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes qualified name (``[prefix/]name``), or None."""
    prefix, _, name = value.rpartition("/")
    if not _QUALIFIED_NAME.match(value) or len(name) > 63 or len(prefix) > 253:
        return "a qualified name ([prefix/]name) is required"
    return None


def label_value_error(value: str) -> str | None:
    if not _LABEL_VALUE.match(value):
        return "at most 63 alphanumerics, '-', '_' or '.'"
    return None


class Taint(BaseModel):
    """One of ``registerWithTaints`` (a core v1.Taint): put on the Node when it is created."""

    model_config = _MODEL

    key: Str
    value: Str = ""
    effect: Annotated[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"], Go("string")]
    time_added: Annotated[str | None, Go("Time")] = Field(None, alias="timeAdded")

    @field_validator("key")
    @classmethod
    def _qualified_name(cls, value: str) -> str:
        if qualified_name_error(value):
            raise ValueError(f"invalid taint key {value!r}: a qualified name ([prefix/]name) is required")
        return value

    @field_validator("value")
    @classmethod
    def _label_value(cls, value: str) -> str:
        if label_value_error(value):
            raise ValueError(f"invalid taint value {value!r}: at most 63 alphanumerics, '-', '_' or '.'")
        return value

    def render(self) -> str:
        """``key=value:Effect``, the ``--register-with-taints`` spelling."""
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


class MemoryReservation(BaseModel):
    model_config = _MODEL

    numa_node: Int32 = Field(alias="numaNode")
    limits: ResourceList


class ShutdownGracePeriodByPodPriority(BaseModel):
    model_config = _MODEL

    priority: Int32
    shutdown_grace_period_seconds: Int64 = Field(alias="shutdownGracePeriodSeconds")


class MemorySwapConfiguration(BaseModel):
    model_config = _MODEL

    swap_behavior: Str = Field("", alias="swapBehavior")


class CrashLoopBackOffConfig(BaseModel):
    model_config = _MODEL

    max_container_restart_period: Annotated[Duration | None, Go("Duration")] = Field(
        None, alias="maxContainerRestartPeriod")
    """The longest CrashLoopBackOff delay (5m0s with the KubeletCrashLoopBackOffMax gate, on)."""


class UserNamespaces(BaseModel):
    model_config = _MODEL

    ids_per_pod: Annotated[int | None, Go("int64")] = Field(None, alias="idsPerPod")


class TracingConfiguration(BaseModel):
    model_config = _MODEL

    endpoint: Annotated[str | None, Go("string")] = None
    sampling_rate_per_million: Annotated[int | None, Go("int32")] = Field(None, alias="samplingRatePerMillion")


class VModuleItem(BaseModel):
    model_config = _MODEL

    file_pattern: Str = Field(alias="filePattern")
    verbosity: Annotated[int, Go("uint32")]


class OutputOptions(BaseModel):
    model_config = _MODEL

    split_stream: Bool = Field(False, alias="splitStream")
    info_buffer_size: Quantity = Field("0", alias="infoBufferSize")


class FormatOptions(BaseModel):
    model_config = _MODEL

    text: OutputOptions = Field(default_factory=lambda: OutputOptions())
    json_: OutputOptions = Field(default_factory=lambda: OutputOptions(), alias="json")


def _flush_seconds(value: object) -> object:
    # TimeOrMetaDuration: a Go duration string, or an integer of nanoseconds.
    if isinstance(value, int) and not isinstance(value, bool):
        return value / 1e9
    return value


class LoggingConfiguration(BaseModel):
    """component-base's logs/api/v1 LoggingConfiguration."""

    model_config = _MODEL

    format: Str = ""
    flush_frequency: Annotated[Duration, BeforeValidator(_flush_seconds), Go("TimeOrMetaDuration")] = Field(
        0.0, alias="flushFrequency")
    verbosity: Annotated[int, Go("uint32")] = 0
    vmodule: Annotated[list[VModuleItem] | None, Go("[]object")] = None
    options: FormatOptions = Field(default_factory=lambda: FormatOptions())


# --- KubeletConfiguration --------------------------------------------------------------------

def _opt(go: str) -> Any:
    """A Go pointer (or nil map/slice): None until set."""
    return Go(go)


class KubeletConfiguration(BaseModel):
    """The kubelet's configuration file (``--config``), v1beta1: every field of 1.37.

    The docstrings that follow a field say what nodeagent does with it where that is not the
    kubelet's own text; docs/cluster-mode.md has the full table (honoured or reported)."""

    model_config = _MODEL

    enable_server: Annotated[bool | None, _opt("bool")] = Field(None, alias="enableServer")
    """Serve the kubelet API on ``address:port``. The kubelet's file default is true; nodeagent's
    own format leaves it unset, which means in cluster mode only."""
    static_pod_path: PathStr = Field("", alias="staticPodPath")
    pod_logs_dir: PathStr = Field("", alias="podLogsDir")
    sync_frequency: Duration = Field(0.0, alias="syncFrequency")
    file_check_frequency: Duration = Field(0.0, alias="fileCheckFrequency")
    http_check_frequency: Duration = Field(0.0, alias="httpCheckFrequency")
    static_pod_url: Str = Field("", alias="staticPodURL")
    static_pod_url_header: Annotated[dict[str, list[str]] | None, _opt("map[string][]string")] = Field(
        None, alias="staticPodURLHeader")
    address: Str = ""
    port: Int32 = 0
    read_only_port: Int32 = Field(0, alias="readOnlyPort")
    tls_cert_file: PathStr = Field("", alias="tlsCertFile")
    tls_private_key_file: PathStr = Field("", alias="tlsPrivateKeyFile")
    tls_cipher_suites: Annotated[list[str] | None, _opt("[]string")] = Field(None, alias="tlsCipherSuites")
    tls_curve_preferences: Annotated[list[int] | None, _opt("[]int32")] = Field(None, alias="tlsCurvePreferences")
    tls_min_version: Str = Field("", alias="tlsMinVersion")
    rotate_certificates: Bool = Field(False, alias="rotateCertificates")
    server_tls_bootstrap: Bool = Field(False, alias="serverTLSBootstrap")
    authentication: KubeletAuthentication = Field(default_factory=lambda: KubeletAuthentication())
    authorization: KubeletAuthorization = Field(default_factory=lambda: KubeletAuthorization())
    registry_pull_qps: Annotated[int | None, _opt("int32")] = Field(None, alias="registryPullQPS")
    registry_burst: Int32 = Field(0, alias="registryBurst")
    image_pull_credentials_verification_policy: Str = Field("", alias="imagePullCredentialsVerificationPolicy")
    """Which present images a pod may use only with the credentials that pulled them (the
    kubelet's KubeletEnsureSecretPulledImages; plugins/runtime/pullrecords.py)."""
    preloaded_images_verification_allowlist: Annotated[list[str] | None, _opt("[]string")] = Field(
        None, alias="preloadedImagesVerificationAllowlist")
    event_record_qps: Annotated[int | None, _opt("int32")] = Field(None, alias="eventRecordQPS")
    event_burst: Int32 = Field(0, alias="eventBurst")
    enable_debugging_handlers: Annotated[bool | None, _opt("bool")] = Field(None, alias="enableDebuggingHandlers")
    enable_contention_profiling: Bool = Field(False, alias="enableContentionProfiling")
    healthz_port: Annotated[int | None, _opt("int32")] = Field(None, alias="healthzPort")
    """The local endpoint (/healthz, /metrics, /pods, /trace); 0 disables it."""
    healthz_bind_address: Str = Field("", alias="healthzBindAddress")
    oom_score_adj: Annotated[int | None, _opt("int32")] = Field(None, alias="oomScoreAdj")
    cluster_domain: Str = Field("", alias="clusterDomain")
    cluster_dns: Annotated[list[str] | None, _opt("[]string")] = Field(None, alias="clusterDNS")
    streaming_connection_idle_timeout: Duration = Field(0.0, alias="streamingConnectionIdleTimeout")
    """An exec, attach or port-forward session with no bytes either way for this long is closed
    (4h0m0s; the 1.37 kubelet deprecated the field and relies on its 4 h server timeouts)."""
    node_status_update_frequency: Duration = Field(0.0, alias="nodeStatusUpdateFrequency")
    node_status_report_frequency: Duration = Field(0.0, alias="nodeStatusReportFrequency")
    node_lease_duration_seconds: Int32 = Field(0, alias="nodeLeaseDurationSeconds")
    image_minimum_gc_age: Duration = Field(0.0, alias="imageMinimumGCAge")
    image_maximum_gc_age: Duration = Field(0.0, alias="imageMaximumGCAge")
    image_gc_high_threshold_percent: Annotated[int | None, _opt("int32")] = Field(
        None, alias="imageGCHighThresholdPercent")
    image_gc_low_threshold_percent: Annotated[int | None, _opt("int32")] = Field(
        None, alias="imageGCLowThresholdPercent")
    volume_stats_agg_period: Duration = Field(0.0, alias="volumeStatsAggPeriod")
    kubelet_cgroups: Str = Field("", alias="kubeletCgroups")
    system_cgroups: Str = Field("", alias="systemCgroups")
    cgroup_root: Str = Field("", alias="cgroupRoot")
    cgroups_per_qos: Annotated[bool | None, _opt("bool")] = Field(None, alias="cgroupsPerQOS")
    cgroup_driver: Str = Field("", alias="cgroupDriver")
    cpu_manager_policy: Str = Field("", alias="cpuManagerPolicy")
    single_process_oom_kill: Annotated[bool | None, _opt("bool")] = Field(None, alias="singleProcessOOMKill")
    cpu_manager_policy_options: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(
        None, alias="cpuManagerPolicyOptions")
    cpu_manager_reconcile_period: Duration = Field(0.0, alias="cpuManagerReconcilePeriod")
    memory_manager_policy: Str = Field("", alias="memoryManagerPolicy")
    topology_manager_policy: Str = Field("", alias="topologyManagerPolicy")
    topology_manager_scope: Str = Field("", alias="topologyManagerScope")
    topology_manager_policy_options: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(
        None, alias="topologyManagerPolicyOptions")
    qos_reserved: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(None, alias="qosReserved")
    runtime_request_timeout: Duration = Field(0.0, alias="runtimeRequestTimeout")
    hairpin_mode: Str = Field("", alias="hairpinMode")
    max_pods: Int32 = Field(0, alias="maxPods")
    pod_cidr: Str = Field("", alias="podCIDR")
    pod_pids_limit: Annotated[int | None, _opt("int64")] = Field(None, alias="podPidsLimit")
    resolv_conf: Annotated[str | None, BeforeValidator(_path_text), _opt("string")] = Field(None, alias="resolvConf")
    run_once: Bool = Field(False, alias="runOnce")
    cpu_cfs_quota: Annotated[bool | None, _opt("bool")] = Field(None, alias="cpuCFSQuota")
    cpu_cfs_quota_period: Annotated[Duration | None, _opt("Duration")] = Field(None, alias="cpuCFSQuotaPeriod")
    node_status_max_images: Annotated[int | None, _opt("int32")] = Field(None, alias="nodeStatusMaxImages")
    """How many images (largest first) the Node's status lists; -1: all."""
    max_open_files: Int64 = Field(0, alias="maxOpenFiles")
    content_type: Str = Field("", alias="contentType")
    kube_api_qps: Annotated[int | None, _opt("int32")] = Field(None, alias="kubeAPIQPS")
    """Client-side rate of API writes (pod status, mirror pods, Events), as the kubelet's."""
    kube_api_burst: Int32 = Field(0, alias="kubeAPIBurst")
    serialize_image_pulls: Annotated[bool | None, _opt("bool")] = Field(None, alias="serializeImagePulls")
    max_parallel_image_pulls: Annotated[int | None, _opt("int32")] = Field(None, alias="maxParallelImagePulls")
    eviction_hard: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(None, alias="evictionHard")
    eviction_soft: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(None, alias="evictionSoft")
    eviction_soft_grace_period: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(
        None, alias="evictionSoftGracePeriod")
    eviction_pressure_transition_period: Duration = Field(0.0, alias="evictionPressureTransitionPeriod")
    eviction_max_pod_grace_period: Int32 = Field(0, alias="evictionMaxPodGracePeriod")
    eviction_minimum_reclaim: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(
        None, alias="evictionMinimumReclaim")
    merge_default_eviction_settings: Annotated[bool | None, _opt("bool")] = Field(
        None, alias="mergeDefaultEvictionSettings")
    pods_per_core: Int32 = Field(0, alias="podsPerCore")
    enable_controller_attach_detach: Annotated[bool | None, _opt("bool")] = Field(
        None, alias="enableControllerAttachDetach")
    protect_kernel_defaults: Bool = Field(False, alias="protectKernelDefaults")
    make_iptables_util_chains: Annotated[bool | None, _opt("bool")] = Field(None, alias="makeIPTablesUtilChains")
    iptables_masquerade_bit: Annotated[int | None, _opt("int32")] = Field(None, alias="iptablesMasqueradeBit")
    iptables_drop_bit: Annotated[int | None, _opt("int32")] = Field(None, alias="iptablesDropBit")
    feature_gates: Annotated[dict[str, bool] | None, _opt("map[string]bool")] = Field(None, alias="featureGates")
    fail_swap_on: Annotated[bool | None, _opt("bool")] = Field(None, alias="failSwapOn")
    memory_swap: MemorySwapConfiguration = Field(default_factory=lambda: MemorySwapConfiguration(),
                                                 alias="memorySwap")
    container_log_max_size: Quantity = Field("", alias="containerLogMaxSize")
    """Rotate a running container's log file once it reaches this size (a quantity)."""
    container_log_max_files: Annotated[int | None, _opt("int32")] = Field(None, alias="containerLogMaxFiles")
    container_log_max_workers: Annotated[int | None, _opt("int32")] = Field(None, alias="containerLogMaxWorkers")
    container_log_monitor_interval: Annotated[Duration | None, _opt("Duration")] = Field(
        None, alias="containerLogMonitorInterval")
    config_map_and_secret_change_detection_strategy: Str = Field(
        "", alias="configMapAndSecretChangeDetectionStrategy")
    system_reserved: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(
        None, alias="systemReserved")
    kube_reserved: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(None, alias="kubeReserved")
    reserved_system_cpus: Str = Field("", alias="reservedSystemCPUs")
    show_hidden_metrics_for_version: Str = Field("", alias="showHiddenMetricsForVersion")
    system_reserved_cgroup: Str = Field("", alias="systemReservedCgroup")
    kube_reserved_cgroup: Str = Field("", alias="kubeReservedCgroup")
    enforce_node_allocatable: Annotated[list[str] | None, _opt("[]string")] = Field(
        None, alias="enforceNodeAllocatable")
    allowed_unsafe_sysctls: Annotated[list[str] | None, _opt("[]string")] = Field(
        None, alias="allowedUnsafeSysctls")
    """Sysctls (or ``prefix.*`` patterns) pods may set beyond the kubelet's safe set."""
    default_pod_sysctls: Annotated[dict[str, str] | None, _opt("map[string]string")] = Field(
        None, alias="defaultPodSysctls")
    volume_plugin_dir: Str = Field("", alias="volumePluginDir")
    provider_id: Str = Field("", alias="providerID")
    kernel_memcg_notification: Bool = Field(False, alias="kernelMemcgNotification")
    logging: LoggingConfiguration = Field(default_factory=lambda: LoggingConfiguration())
    enable_system_log_handler: Annotated[bool | None, _opt("bool")] = Field(None, alias="enableSystemLogHandler")
    enable_system_log_query: Annotated[bool | None, _opt("bool")] = Field(None, alias="enableSystemLogQuery")
    shutdown_grace_period: Duration = Field(0.0, alias="shutdownGracePeriod")
    shutdown_grace_period_critical_pods: Duration = Field(0.0, alias="shutdownGracePeriodCriticalPods")
    shutdown_grace_period_by_pod_priority: Annotated[list[ShutdownGracePeriodByPodPriority] | None,
                                                     _opt("[]object")] = Field(
        None, alias="shutdownGracePeriodByPodPriority")
    crash_loop_back_off: CrashLoopBackOffConfig = Field(default_factory=lambda: CrashLoopBackOffConfig(),
                                                        alias="crashLoopBackOff")
    reserved_memory: Annotated[list[MemoryReservation] | None, _opt("[]object")] = Field(
        None, alias="reservedMemory")
    enable_profiling_handler: Annotated[bool | None, _opt("bool")] = Field(None, alias="enableProfilingHandler")
    enable_debug_flags_handler: Annotated[bool | None, _opt("bool")] = Field(None, alias="enableDebugFlagsHandler")
    seccomp_default: Annotated[bool | None, _opt("bool")] = Field(None, alias="seccompDefault")
    """RuntimeDefault instead of Unconfined for containers that name no seccomp profile."""
    memory_throttling_factor: Annotated[float | None, _opt("float64")] = Field(
        None, alias="memoryThrottlingFactor")
    memory_reservation_policy: Str = Field("", alias="memoryReservationPolicy")
    register_with_taints: Annotated[list[Taint] | None, _opt("[]object")] = Field(None, alias="registerWithTaints")
    """Taints the Node is created with; an existing Node's taints are left as they are."""
    register_node: Annotated[bool | None, _opt("bool")] = Field(None, alias="registerNode")
    tracing: Annotated[TracingConfiguration | None, _opt("object")] = None
    local_storage_capacity_isolation: Annotated[bool | None, _opt("bool")] = Field(
        None, alias="localStorageCapacityIsolation")
    container_runtime_endpoint: Str = Field("", alias="containerRuntimeEndpoint")
    image_service_endpoint: Str = Field("", alias="imageServiceEndpoint")
    fail_cgroup_v1: Annotated[bool | None, _opt("bool")] = Field(None, alias="failCgroupV1")
    user_namespaces: Annotated[UserNamespaces | None, _opt("object")] = Field(None, alias="userNamespaces")

    @field_validator("preloaded_images_verification_allowlist")
    @classmethod
    def _allowlist_patterns(cls, value: list[str] | None) -> list[str] | None:
        for pattern in value or ():
            allowlist_pattern(pattern)  # ValueError with the kubelet's words
        return value

    def to_json(self) -> dict[str, Any]:
        """The JSON object the kubelet would marshal: JSON names, Go durations, no nil fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


API_VERSION = "kubelet.config.k8s.io/v1beta1"
KIND = "KubeletConfiguration"

__all__ = ["API_VERSION", "KIND", "Go", "KubeletConfiguration", "Taint", "qualified_name_error",
           "label_value_error"]
