"""The agent's configuration: a YAML file validated by pydantic, overridable by flags.

Field names follow the kubelet's KubeletConfiguration where the meaning is the same
(staticPodPath, containerRuntimeEndpoint, maxPods, podLogsDir, rootDir, nodeName, ...), so a
kubelet user can read it without a manual. Unknown fields are errors, with their path.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from nodeagent import quantity
from nodeagent.duration import Duration
from nodeagent.imagenames import allowlist_pattern
from nodeagent.registry import CONFIGURABLE, DEFAULT_PROFILE


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, the field and why."""


_SECTION = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


def _ttl(default: float) -> Any:
    """The kubelet's defaulting of its webhook cache TTLs: 0 (what kubeadm writes) means the
    default, not "no cache"."""
    def default_zero(value: float) -> float:
        return default if value == 0 else value
    return AfterValidator(default_zero)


class X509Authentication(BaseModel):
    model_config = _SECTION

    client_ca_file: Path | None = Field(default=None, alias="clientCAFile")
    """Client certificates signed by this CA authenticate as CN (user) and O (groups). Unset in
    cluster mode: the cluster CA of the kubeconfig (its certificate-authority file, or its
    certificate-authority-data written to ``rootDir/pki/client-ca.crt``), as kubeadm points
    the kubelet at ``/etc/kubernetes/pki/ca.crt``. Unset standalone: no x509 authentication."""


class WebhookAuthentication(BaseModel):
    model_config = _SECTION

    enabled: bool | None = None
    """Bearer tokens (``Authorization: Bearer``, or a websocket's
    ``base64url.bearer.authorization.k8s.io.`` subprotocol) checked with a TokenReview through
    the node's API client. None: on in cluster mode, off standalone (there is no API server)."""
    cache_ttl: Annotated[Duration, _ttl(120.0)] = Field(default=120.0, ge=0, alias="cacheTTL")
    """How long a TokenReview's answer (authenticated or not) is reused (the kubelet's 2m0s)."""


class AnonymousAuthentication(BaseModel):
    model_config = _SECTION

    enabled: bool = False
    """Requests no authenticator recognises are served as system:anonymous (group
    system:unauthenticated). Off, as the kubelet's configuration file defaults it: to be asked
    for explicitly."""


class KubeletAuthentication(BaseModel):
    """The kubelet's ``authentication`` section of the kubelet API (10250)."""

    model_config = _SECTION

    x509: X509Authentication = Field(default_factory=lambda: X509Authentication())
    webhook: WebhookAuthentication = Field(default_factory=lambda: WebhookAuthentication())
    anonymous: AnonymousAuthentication = Field(default_factory=lambda: AnonymousAuthentication())


class WebhookAuthorization(BaseModel):
    model_config = _SECTION

    cache_authorized_ttl: Annotated[Duration, _ttl(300.0)] = Field(default=300.0, ge=0,
                                                                   alias="cacheAuthorizedTTL")
    """How long an allowing SubjectAccessReview answer is reused (the kubelet's 5m0s)."""
    cache_unauthorized_ttl: Annotated[Duration, _ttl(30.0)] = Field(default=30.0, ge=0,
                                                                    alias="cacheUnauthorizedTTL")
    """How long a denying answer is reused (the kubelet's 30s)."""


class KubeletAuthorization(BaseModel):
    """The kubelet's ``authorization`` section of the kubelet API (10250)."""

    model_config = _SECTION

    mode: str | None = None
    """``Webhook`` (a SubjectAccessReview per request, on ``nodes/<subresource>`` of this node)
    or ``AlwaysAllow`` (every authenticated request). None: Webhook in cluster mode,
    AlwaysAllow standalone (no API server to ask; authentication still has to be configured)."""
    webhook: WebhookAuthorization = Field(default_factory=lambda: WebhookAuthorization())

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, value: str | None) -> str | None:
        # The kubelet's BuildAuthz messages.
        if value == "":
            raise ValueError("no authorization mode specified")
        if value is not None and value not in ("Webhook", "AlwaysAllow"):
            raise ValueError(f"unknown authorization mode {value}")
        return value


_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                             r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class Taint(BaseModel):
    """One of ``registerWithTaints``: put on the Node when the agent creates it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

    @field_validator("key")
    @classmethod
    def _qualified_name(cls, value: str) -> str:
        prefix, _, name = value.rpartition("/")
        if not _QUALIFIED_NAME.match(value) or len(name) > 63 or len(prefix) > 253:
            raise ValueError(f"invalid taint key {value!r}: a qualified name ([prefix/]name) is required")
        return value

    @field_validator("value")
    @classmethod
    def _label_value(cls, value: str) -> str:
        if not _LABEL_VALUE.match(value):
            raise ValueError(f"invalid taint value {value!r}: at most 63 alphanumerics, '-', '_' or '.'")
        return value


class AgentConfig(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    node_name: str = Field(default_factory=lambda: socket.gethostname().lower())
    node_ip: str = "127.0.0.1"
    static_pod_path: Path | None = None
    kubeconfig: Path | None = None
    """Cluster mode: the node's kubeconfig (the kubelet's --kubeconfig). None: standalone."""
    port: int = Field(default=10250, ge=0, le=65535)
    """The kubelet API port (HTTPS), published as the Node's daemonEndpoints.kubeletEndpoint."""
    enable_server: bool | None = None
    """Serve the kubelet API (nodeagent/kubeletserver) on ``address:port``. None (default): in
    cluster mode only, so a standalone agent needs no certificate and leaves 10250 alone."""
    address: str = "0.0.0.0"
    """The kubelet API's bind address (the kubelet's ``address``)."""
    tls_cert_file: Path | None = None
    """The kubelet API's serving certificate; unset (with tlsPrivateKeyFile): a self-signed one
    is made under ``rootDir/pki`` at start, as the kubelet does."""
    tls_private_key_file: Path | None = None
    authentication: KubeletAuthentication = Field(default_factory=lambda: KubeletAuthentication())
    """Who a kubelet API client is (x509, webhook, anonymous); see nodeagent/kubeletserver/authn.py."""
    authorization: KubeletAuthorization = Field(default_factory=lambda: KubeletAuthorization())
    """What a kubelet API client may do (Webhook, AlwaysAllow); see nodeagent/kubeletserver/authz.py."""
    streaming_connection_idle_timeout: Duration = Field(default=4 * 3600.0, gt=0)
    """An exec, attach or port-forward session with no bytes either way for this long is closed
    (the kubelet's 4h0m0s; the 1.37 kubelet deprecated the field and relies on its 4 h server
    timeouts, which apply here too)."""
    image_pull_credentials_verification_policy: Literal[
        "NeverVerify", "NeverVerifyPreloadedImages", "NeverVerifyAllowlistedImages", "AlwaysVerify",
    ] = "NeverVerifyPreloadedImages"
    """Which present images a pod may use only with the credentials that pulled them (the
    kubelet's KubeletEnsureSecretPulledImages; plugins/runtime/pullrecords.py)."""
    preloaded_images_verification_allowlist: list[str] = Field(default_factory=list)
    """Images never verified under NeverVerifyAllowlistedImages: a repository, or a prefix ending ``/*``."""
    node_status_max_images: int = Field(default=50, ge=-1)
    """How many images (largest first) the Node's status lists; -1: all (the kubelet's field)."""
    register_with_taints: list[Taint] = Field(default_factory=list)
    """Taints the Node is created with (the kubelet's registerWithTaints); an existing Node's
    taints are left as they are, as the kubelet leaves them."""
    kube_api_qps: float = Field(default=50.0, gt=0, alias="kubeAPIQPS")
    """Client-side rate of API writes (pod status, mirror pods, Events), as the kubelet's."""
    kube_api_burst: int = Field(default=100, ge=1, alias="kubeAPIBurst")
    node_status_update_frequency: Duration = Field(default=10.0, gt=0)
    """Seconds between node status computations; a change is written at once."""
    node_status_report_frequency: Duration = Field(default=300.0, gt=0)
    """Seconds after which an unchanged node status is written anyway (lastHeartbeatTime)."""
    node_lease_duration_seconds: int = Field(default=40, ge=1)
    """The Lease's duration; it is renewed every quarter of it (the kubelet's 40 s / 10 s)."""
    container_runtime_endpoint: str = "unix:///run/containerd/containerd.sock"
    runtime_request_timeout: Duration = 120.0
    """Seconds per CRI call (the kubelet's runtimeRequestTimeout, 2m)."""
    max_pods: int = Field(default=110, ge=1)
    pod_logs_dir: Path = Path("/var/log/pods")
    container_log_max_size: str = "10Mi"
    """Rotate a running container's log file once it reaches this size (a quantity)."""
    container_log_max_files: int = Field(default=5, ge=2)
    """Log files kept per container, the live one included (the kubelet also requires >= 2)."""
    container_log_monitor_interval: Duration = Field(default=10.0, gt=0)
    """Seconds between log size checks. The kubelet refuses less than 3 s; we allow it for tests."""
    container_logs_symlink_dir: Path = Path("/var/log/containers")
    """Where the legacy ``<pod>_<ns>_<container>-<id>.log`` symlinks go (not a kubelet setting:
    the kubelet hard-codes /var/log/containers)."""
    root_dir: Path = Path("/var/lib/nodeagent")
    volume_stats_agg_period: Annotated[Duration, _ttl(60.0)] = 60.0
    """How often the disk use of logs and pod volumes is measured by walking them (the kubelet's
    1m0s, 0 meaning that too); the rest of the usage sample is taken every 10 s. Negative: never
    (no volume or log figures, so no emptyDir sizeLimit eviction either)."""
    evented_relist_period: Duration = Field(default=1.0, gt=0)
    """nodeagent's own: seconds between full relists of the runtime while it streams container
    events (each event triggers a relist; this is the safety net). Without the stream, and
    while it is broken, the relist runs every second, as the kubelet's."""
    file_check_frequency: Duration = Field(default=20.0, gt=0)
    """Seconds between full rescans of staticPodPath (changes are also seen sooner by polling)."""
    healthz_bind_address: str = "127.0.0.1"
    healthz_port: int = Field(default=10248, ge=0, le=65535)
    """The local endpoint (/healthz, /metrics, /pods, /trace); 0 disables it."""
    system_reserved: dict[str, str] = Field(default_factory=dict)
    kube_reserved: dict[str, str] = Field(default_factory=dict)
    allow_privileged: bool = True
    """Whether pods may run privileged containers (the kubelet's old --allow-privileged); a
    privileged pod on a node that disallows them is rejected at admission (reason Forbidden)."""
    allowed_unsafe_sysctls: list[str] = Field(default_factory=list)
    """Sysctls (or ``prefix.*`` patterns) pods may set beyond the kubelet's safe set."""
    cgroup_driver: Literal["cgroupfs", "systemd"] = "cgroupfs"
    """The kubelet's cgroupDriver: used only when the runtime does not say its own through CRI
    RuntimeConfig (containerd 1.6); containerd 2.x's answer wins (nodeagent/cgroupdriver.py)."""
    cgroups_per_qos: bool = Field(default=True, alias="cgroupsPerQOS")
    """Give every pod a cgroup under a QoS-class hierarchy, with the pod's CPU and memory values
    (the kubelet's cgroupsPerQOS, plugins/runtime/podcgroup.py). False, as the kubelet without it:
    no pod cgroups are made, written or removed (the sandbox gets no cgroup parent and the runtime
    places it), so pod-level limits are not enforced — and nothing under /sys/fs/cgroup needs root."""
    seccomp_default: bool = False
    """RuntimeDefault instead of Unconfined for containers that name no seccomp profile."""
    cluster_domain: str = "cluster.local"
    """The DNS domain of pod FQDNs (``<hostname>.<subdomain>.<ns>.svc.<clusterDomain>``)."""
    cluster_dns: list[str] = Field(default_factory=list, alias="clusterDNS")
    """Nameservers of dnsPolicy ClusterFirst; empty: ClusterFirst falls back to Default."""
    plugins_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    """Where kubelet plugins (DRA drivers) put their registration sockets (the kubelet's path)."""
    cdi_spec_dirs: list[Path] = Field(default_factory=lambda: [Path("/etc/cdi"), Path("/var/run/cdi")])
    """CDI spec directories, lowest priority first (a device in a later one overrides), as
    containerd's cdi_spec_dirs; read by the dra stage for runtimes that do not resolve CDI."""
    dra_checkpoint_file: Path | None = None
    """The prepared ResourceClaims, kept across restarts; default ``<rootDir>/dra_manager_state``."""
    log_format: Literal["console", "json"] = "console"
    trace_file: Path | None = None
    profile: dict[str, list[str]] = Field(default_factory=lambda: {k: list(v) for k, v in DEFAULT_PROFILE.items()})
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("preloaded_images_verification_allowlist")
    @classmethod
    def _allowlist_patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            allowlist_pattern(pattern)  # ValueError with the kubelet's words
        return value

    @field_validator("profile")
    @classmethod
    def _known_phases(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        unknown = set(value) - set(CONFIGURABLE)
        if unknown:
            raise ValueError(f"unknown phase(s) {sorted(unknown)}; configurable phases are {list(CONFIGURABLE)}")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> AgentConfig:
        if (self.tls_cert_file is None) != (self.tls_private_key_file is None):
            raise ValueError("tlsCertFile and tlsPrivateKeyFile must be set together (or neither: self-signed)")
        return self

    @field_validator("container_log_max_size")
    @classmethod
    def _log_size_quantity(cls, value: str) -> str:
        if quantity.bytes_(value) <= 0:  # raises ValueError with the quantity on bad syntax
            raise ValueError(f"containerLogMaxSize must be greater than 0, got {value!r}")
        return value

    @property
    def dra_checkpoint_path(self) -> Path:
        return self.dra_checkpoint_file or self.root_dir / "dra_manager_state"

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.healthz_bind_address}:{self.healthz_port}"


def _format(exc: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration in {origin}:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def load(path: Path | None, overrides: Mapping[str, Any] | None = None) -> AgentConfig:
    data: dict[str, Any] = {}
    origin = str(path) if path else "flags"
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"configuration {path} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"configuration {path} must be a mapping, not {type(loaded).__name__}")
        # Accept a KubeletConfiguration-like header without treating it as a field.
        loaded.pop("apiVersion", None)
        loaded.pop("kind", None)
        data.update(loaded)
    for key, value in (overrides or {}).items():
        if value is not None:
            data[key] = value
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(exc, origin)) from None


def flag_names(fields: Sequence[str]) -> dict[str, str]:
    """``--static-pod-path`` style flag for each camelCase field."""
    out = {}
    for name in fields:
        camel = to_camel(name)
        out[name] = "--" + "".join("-" + ch.lower() if ch.isupper() else ch for ch in camel)
    return out
