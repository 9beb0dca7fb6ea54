"""The kubelet's command line (cmd/kubelet/app/options at 1.37), parsed as pflag parses it.

Two kinds of flags: those of KubeletFlags, which exist only on the command line (``--kubeconfig``,
``--bootstrap-kubeconfig``, ``--hostname-override``, ``--node-ip``, ``--cert-dir``,
``--root-dir``, ``--node-labels``, ...), and the deprecated ones that set a KubeletConfiguration
field (``--container-runtime-endpoint``, ``--register-with-taints``, ``--max-pods``, ...),
which win over ``--config`` and ``--config-dir`` as the kubelet re-applies them last. pflag's
rules and words: ``--name=value`` or ``--name value``, a bool flag takes no separate value,
``-v 2``, ``--`` ends the flags, ``_`` is ``-``; ``unknown flag: --pod-infra-container-image``
(removed in 1.35), ``flag needs an argument: --node-ip``, ``invalid argument "x" for "--max-pods"
flag: ...``; a deprecated flag prints ``Flag --max-pods has been deprecated, ...``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nodeagent import duration as godur
from nodeagent.kubeletconfig.schema import label_value_error, qualified_name_error

DEPRECATED = ("This parameter should be set via the config file specified by the Kubelet's --config flag. See "
              "https://kubernetes.io/docs/tasks/administer-cluster/kubelet-config-file/ for more information.")
_GC_DEPRECATED = "Use --eviction-hard or --eviction-soft instead. Will be removed in a future version."


class FlagError(ValueError):
    """The command line cannot be parsed (pflag's message)."""


class KubeletFlags(BaseModel):
    """The kubelet's command-line-only settings (KubeletFlags): not part of KubeletConfiguration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: Path | None = None
    """``--config``: the KubeletConfiguration file."""
    config_dir: Path | None = None
    """``--config-dir``: drop-in ``*.conf`` KubeletConfiguration files, merged in lexical order."""
    kubeconfig: Path | None = None
    """Cluster mode: the node's kubeconfig. None: standalone."""
    bootstrap_kubeconfig: Path | None = None
    """Credentials to ask for a client certificate with when ``kubeconfig`` has no valid one."""
    hostname_override: str = ""
    node_ip: str = ""
    """One address, or two of different families (dual-stack), comma-separated; ``::`` (or
    ``0.0.0.0``) asks for detection preferring IPv6 (IPv4). Empty: detected as the kubelet does."""
    cert_dir: Path | None = None
    """Where client and serving certificates are kept; default ``<rootDir>/pki``."""
    cloud_provider: str = ""
    root_dir: Path = Path("/var/lib/kubelet")
    seccomp_default: bool = False
    node_labels: dict[str, str] = Field(default_factory=dict)
    lock_file: str = ""
    exit_on_lock_contention: bool = False
    minimum_container_ttl_duration: godur.Duration = 0.0
    maximum_dead_containers_per_container: int = 1
    maximum_dead_containers: int = -1
    experimental_mounter_path: str = ""
    experimental_allocatable_ignore_eviction: bool = False
    runtime_cgroups: str = ""
    image_credential_provider_config: str = ""
    image_credential_provider_bin_dir: str = ""
    housekeeping_interval: float = 10.0

    @property
    def pki_dir(self) -> Path:
        return self.cert_dir if self.cert_dir is not None else self.root_dir / "pki"


# --- value parsers (pflag and component-base's cli/flag types) ------------------------------------

def _bool(text: str) -> bool:
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{text}": invalid syntax')


def _int(bits: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise ValueError(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None
        if not -2**(bits - 1) <= value < 2**(bits - 1):
            raise ValueError(f'strconv.ParseInt: parsing "{text}": value out of range')
        return value
    return parse


def _duration(text: str) -> float:
    return godur.parse(text)


def _ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f'"{text}" is not a valid IP address') from None


def _pairs(text: str, separator: str, *, split: bool = True) -> dict[str, str]:
    out = {}
    for item in text.split(",") if split else [text]:
        if not item:
            continue
        key, sep, value = item.partition(separator)
        if not sep:
            raise ValueError(f"malformed pair, expect string{separator}string")
        out[key.strip()] = value.strip()
    return out


def _langle(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        if not item:
            continue
        key, sep, value = item.partition("<")
        if not sep:
            raise ValueError("malformed pair, expect string<string")
        out[key.strip()] = value.strip()
    return out


def _gates(text: str) -> dict[str, bool]:
    out = {}
    for item in text.split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"missing bool value for {key.strip()}")
        try:
            out[key.strip()] = _bool(value.strip())
        except ValueError:
            raise ValueError(f"invalid value of {key.strip()}={value.strip()}, err: strconv.ParseBool: parsing "
                             f'"{value.strip()}": invalid syntax') from None
    return out


def _headers(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in text.split(","):
        if not item:
            continue
        key, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f'malformed pair, expect string:string, got "{item}"')
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def _taints(text: str) -> list[dict[str, str]]:
    out = []
    for spec in text.split(",") if text else []:
        parts = spec.split(":")
        value = ""
        if len(parts) == 1:
            raise ValueError(f"invalid taint spec: {spec}")  # a taint to add needs its effect
        if len(parts) != 2:
            raise ValueError(f"invalid taint spec: {spec}")
        effect = parts[1]
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ValueError(f"invalid taint effect: {effect}, unsupported taint effect")
        key_value = parts[0].split("=")
        if len(key_value) > 2:
            raise ValueError(f"invalid taint spec: {spec}")
        key = key_value[0]
        if len(key_value) == 2:
            value = key_value[1]
            if label_value_error(value):
                raise ValueError(f"invalid taint spec: {spec}, a valid label must be an empty string or consist of "
                                 "alphanumeric characters, '-', '_' or '.'")
        if qualified_name_error(key):
            raise ValueError(f"invalid taint spec: {spec}, name part must consist of alphanumeric characters, '-', "
                             "'_' or '.'")
        out.append({"key": key, "value": value, "effect": effect})
    return out


def _reserved_memory(text: str) -> list[dict[str, Any]]:
    out = []
    for spec in text.split(";"):
        node, sep, limits = spec.partition(":")
        if not sep:
            raise ValueError("the reserved memory has incorrect format, expected "
                             f"numaNodeID:type=quantity[,type=quantity...], got {spec}")
        try:
            numa = int(node.strip())
        except ValueError:
            raise ValueError(f"failed to parse the NUMA node ID: {node}") from None
        out.append({"numaNode": numa, "limits": _pairs(limits, "=")})
    return out


def _vmodule(text: str) -> list[dict[str, Any]]:
    out = []
    for item in text.split(","):
        if not item:
            continue
        pattern, sep, level = item.partition("=")
        if not sep or not level.isdigit():
            raise ValueError(f"{item} is not in the 'pattern=N' format")
        out.append({"filePattern": pattern, "verbosity": int(level)})
    return out


def _verbosity(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f'strconv.ParseUint: parsing "{text}": invalid syntax')
    return int(text)


def _strings(text: str) -> list[str]:
    return [item.strip() for item in text.split(",")] if text else []


@dataclass(frozen=True)
class Flag:
    name: str
    parse: Callable[[str], Any]
    target: str
    """``config:<dotted JSON path>`` (a KubeletConfiguration field) or ``flag:<KubeletFlags field>``."""
    bool_: bool = False
    deprecated: str = ""
    shorthand: str = ""
    accumulate: str = ""
    """How repeated uses combine: ``merge`` (maps), ``append`` (slices); else the last wins."""


def _c(name: str, parse: Callable[[str], Any], path: str, *, deprecated: str = DEPRECATED, bool_: bool = False,
       accumulate: str = "", shorthand: str = "") -> Flag:
    return Flag(name, parse, f"config:{path}", bool_=bool_, deprecated=deprecated, accumulate=accumulate,
                shorthand=shorthand)


def _f(name: str, parse: Callable[[str], Any], attr: str, *, deprecated: str = "", bool_: bool = False,
       accumulate: str = "") -> Flag:
    return Flag(name, parse, f"flag:{attr}", bool_=bool_, deprecated=deprecated, accumulate=accumulate)


_STR, _I32, _I64 = str, _int(32), _int(64)
FLAGS: tuple[Flag, ...] = (
    # KubeletFlags (options.go AddFlags, addContainerRuntimeFlags)
    _f("config", Path, "config"),
    _f("config-dir", Path, "config_dir"),
    _f("kubeconfig", Path, "kubeconfig"),
    _f("bootstrap-kubeconfig", Path, "bootstrap_kubeconfig"),
    _f("hostname-override", _STR, "hostname_override"),
    _f("node-ip", _STR, "node_ip"),
    _f("cert-dir", Path, "cert_dir"),
    _f("cloud-provider", _STR, "cloud_provider"),
    _f("root-dir", Path, "root_dir"),
    _f("seccomp-default", _bool, "seccomp_default", bool_=True),
    _f("node-labels", lambda t: _pairs(t, "="), "node_labels", accumulate="merge"),
    _f("lock-file", _STR, "lock_file"),
    _f("exit-on-lock-contention", _bool, "exit_on_lock_contention", bool_=True),
    _f("minimum-container-ttl-duration", _duration, "minimum_container_ttl_duration", deprecated=_GC_DEPRECATED),
    _f("maximum-dead-containers-per-container", _I32, "maximum_dead_containers_per_container",
       deprecated=_GC_DEPRECATED),
    _f("maximum-dead-containers", _I32, "maximum_dead_containers", deprecated=_GC_DEPRECATED),
    _f("experimental-mounter-path", _STR, "experimental_mounter_path",
       deprecated="will be removed in 1.25 or later. in favor of using CSI."),
    _f("experimental-allocatable-ignore-eviction", _bool, "experimental_allocatable_ignore_eviction", bool_=True,
       deprecated="will be removed in 1.25 or later."),
    _f("runtime-cgroups", _STR, "runtime_cgroups"),
    _f("image-credential-provider-config", _STR, "image_credential_provider_config"),
    _f("image-credential-provider-bin-dir", _STR, "image_credential_provider_bin_dir"),
    _f("housekeeping-interval", _duration, "housekeeping_interval"),  # cadvisor's, a global flag
    # KubeletConfiguration flags (AddKubeletConfigFlags), all deprecated except a few
    _c("enable-server", _bool, "enableServer", bool_=True),
    _c("fail-swap-on", _bool, "failSwapOn", bool_=True),
    _c("pod-manifest-path", _STR, "staticPodPath"),
    _c("sync-frequency", _duration, "syncFrequency"),
    _c("file-check-frequency", _duration, "fileCheckFrequency"),
    _c("http-check-frequency", _duration, "httpCheckFrequency"),
    _c("manifest-url", _STR, "staticPodURL"),
    _c("manifest-url-header", _headers, "staticPodURLHeader", accumulate="merge"),
    _c("address", _ip, "address"),
    _c("port", _I32, "port"),
    _c("read-only-port", _I32, "readOnlyPort"),
    _c("fail-cgroupv1", _bool, "failCgroupV1", bool_=True, deprecated=""),
    _c("container-runtime-endpoint", _STR, "containerRuntimeEndpoint"),
    _c("image-service-endpoint", _STR, "imageServiceEndpoint"),
    _c("anonymous-auth", _bool, "authentication.anonymous.enabled", bool_=True),
    _c("authentication-token-webhook", _bool, "authentication.webhook.enabled", bool_=True),
    _c("authentication-token-webhook-cache-ttl", _duration, "authentication.webhook.cacheTTL"),
    _c("client-ca-file", _STR, "authentication.x509.clientCAFile"),
    _c("authorization-mode", _STR, "authorization.mode"),
    _c("authorization-webhook-cache-authorized-ttl", _duration, "authorization.webhook.cacheAuthorizedTTL"),
    _c("authorization-webhook-cache-unauthorized-ttl", _duration, "authorization.webhook.cacheUnauthorizedTTL"),
    _c("tls-cert-file", _STR, "tlsCertFile"),
    _c("tls-private-key-file", _STR, "tlsPrivateKeyFile"),
    _c("rotate-server-certificates", _bool, "serverTLSBootstrap", bool_=True),
    _c("tls-cipher-suites", _strings, "tlsCipherSuites", accumulate="append"),
    _c("tls-min-version", _STR, "tlsMinVersion"),
    _c("rotate-certificates", _bool, "rotateCertificates", bool_=True),
    _c("registry-qps", _I32, "registryPullQPS"),
    _c("registry-burst", _I32, "registryBurst"),
    _c("event-qps", _I32, "eventRecordQPS"),
    _c("event-burst", _I32, "eventBurst"),
    _c("enable-debugging-handlers", _bool, "enableDebuggingHandlers", bool_=True),
    _c("contention-profiling", _bool, "enableContentionProfiling", bool_=True),
    _c("healthz-port", _I32, "healthzPort"),
    _c("healthz-bind-address", _ip, "healthzBindAddress"),
    _c("oom-score-adj", _I32, "oomScoreAdj"),
    _c("cluster-domain", _STR, "clusterDomain"),
    _c("volume-plugin-dir", _STR, "volumePluginDir"),
    _c("cluster-dns", _strings, "clusterDNS", accumulate="append"),
    _c("streaming-connection-idle-timeout", _duration, "streamingConnectionIdleTimeout"),
    _c("node-status-update-frequency", _duration, "nodeStatusUpdateFrequency"),
    _c("minimum-image-ttl-duration", _duration, "imageMinimumGCAge"),
    _c("image-gc-high-threshold", _I32, "imageGCHighThresholdPercent"),
    _c("image-gc-low-threshold", _I32, "imageGCLowThresholdPercent"),
    _c("volume-stats-agg-period", _duration, "volumeStatsAggPeriod"),
    _c("feature-gates", _gates, "featureGates", accumulate="merge"),
    _c("kubelet-cgroups", _STR, "kubeletCgroups"),
    _c("system-cgroups", _STR, "systemCgroups"),
    _c("provider-id", _STR, "providerID", deprecated=""),
    _c("cgroups-per-qos", _bool, "cgroupsPerQOS", bool_=True),
    _c("cgroup-driver", _STR, "cgroupDriver"),
    _c("cgroup-root", _STR, "cgroupRoot"),
    _c("cpu-manager-policy", _STR, "cpuManagerPolicy"),
    _c("cpu-manager-policy-options", lambda t: _pairs(t, "=", split=False), "cpuManagerPolicyOptions",
       accumulate="merge"),
    _c("cpu-manager-reconcile-period", _duration, "cpuManagerReconcilePeriod"),
    _c("qos-reserved", lambda t: _pairs(t, "="), "qosReserved", accumulate="merge"),
    _c("topology-manager-policy", _STR, "topologyManagerPolicy"),
    _c("runtime-request-timeout", _duration, "runtimeRequestTimeout"),
    _c("hairpin-mode", _STR, "hairpinMode"),
    _c("max-pods", _I32, "maxPods"),
    _c("pod-cidr", _STR, "podCIDR"),
    _c("pod-max-pids", _I64, "podPidsLimit"),
    _c("resolv-conf", _STR, "resolvConf"),
    _c("runonce", _bool, "runOnce", bool_=True),
    _c("cpu-cfs-quota", _bool, "cpuCFSQuota", bool_=True),
    _c("cpu-cfs-quota-period", _duration, "cpuCFSQuotaPeriod"),
    _c("enable-controller-attach-detach", _bool, "enableControllerAttachDetach", bool_=True),
    _c("make-iptables-util-chains", _bool, "makeIPTablesUtilChains", bool_=True),
    _c("container-log-max-size", _STR, "containerLogMaxSize"),
    _c("container-log-max-files", _I32, "containerLogMaxFiles"),
    _c("allowed-unsafe-sysctls", _strings, "allowedUnsafeSysctls", accumulate="append"),
    _c("node-status-max-images", _I32, "nodeStatusMaxImages"),
    _c("kernel-memcg-notification", _bool, "kernelMemcgNotification", bool_=True),
    _c("local-storage-capacity-isolation", _bool, "localStorageCapacityIsolation", bool_=True),
    _c("max-open-files", _I64, "maxOpenFiles"),
    _c("kube-api-content-type", _STR, "contentType"),
    _c("kube-api-qps", _I32, "kubeAPIQPS"),
    _c("kube-api-burst", _I32, "kubeAPIBurst"),
    _c("serialize-image-pulls", _bool, "serializeImagePulls", bool_=True),
    _c("eviction-hard", _langle, "evictionHard", accumulate="merge"),
    _c("eviction-soft", _langle, "evictionSoft", accumulate="merge"),
    _c("eviction-soft-grace-period", lambda t: _pairs(t, "="), "evictionSoftGracePeriod", accumulate="merge"),
    _c("eviction-pressure-transition-period", _duration, "evictionPressureTransitionPeriod"),
    _c("eviction-max-pod-grace-period", _I32, "evictionMaxPodGracePeriod"),
    _c("eviction-minimum-reclaim", lambda t: _pairs(t, "="), "evictionMinimumReclaim", accumulate="merge"),
    _c("pods-per-core", _I32, "podsPerCore"),
    _c("protect-kernel-defaults", _bool, "protectKernelDefaults", bool_=True),
    _c("reserved-cpus", _STR, "reservedSystemCPUs"),
    _c("topology-manager-scope", _STR, "topologyManagerScope"),
    _c("topology-manager-policy-options", lambda t: _pairs(t, "="), "topologyManagerPolicyOptions",
       accumulate="merge"),
    _c("system-reserved", lambda t: _pairs(t, "="), "systemReserved", accumulate="merge"),
    _c("kube-reserved", lambda t: _pairs(t, "="), "kubeReserved", accumulate="merge"),
    _c("enforce-node-allocatable", _strings, "enforceNodeAllocatable", accumulate="append"),
    _c("system-reserved-cgroup", _STR, "systemReservedCgroup"),
    _c("kube-reserved-cgroup", _STR, "kubeReservedCgroup"),
    _c("memory-manager-policy", _STR, "memoryManagerPolicy"),
    _c("reserved-memory", _reserved_memory, "reservedMemory", accumulate="append"),
    _c("register-node", _bool, "registerNode", bool_=True),
    _c("register-with-taints", _taints, "registerWithTaints"),
    # logsapi.AddFlags (the LoggingConfiguration)
    _c("logging-format", _STR, "logging.format"),
    _c("log-flush-frequency", _duration, "logging.flushFrequency", deprecated=""),
    _c("v", _verbosity, "logging.verbosity", deprecated="", shorthand="v"),
    _c("vmodule", _vmodule, "logging.vmodule", deprecated="", accumulate="append"),
    _c("log-text-split-stream", _bool, "logging.options.text.splitStream", bool_=True),
    _c("log-text-info-buffer-size", _STR, "logging.options.text.infoBufferSize"),
    _c("log-json-split-stream", _bool, "logging.options.json.splitStream", bool_=True),
    _c("log-json-info-buffer-size", _STR, "logging.options.json.infoBufferSize"),
)
BY_NAME = {f.name: f for f in FLAGS}
BY_SHORTHAND = {f.shorthand: f for f in FLAGS if f.shorthand}
_DURATION_PATHS = {f.target[7:] for f in FLAGS if f.parse is _duration and f.target.startswith("config:")}


@dataclass
class CommandLine:
    """What a kubelet command line says: KubeletFlags, the configuration fields its flags set
    (a partial KubeletConfiguration, JSON names), and pflag's deprecation lines."""

    flags: KubeletFlags
    config: dict[str, Any] = field(default_factory=dict)
    """JSON patch of the flags that set KubeletConfiguration fields (flags over files)."""
    config_flags: dict[str, str] = field(default_factory=dict)
    """Dotted JSON path -> the flag that set it (``--max-pods``), for ``config explain``."""
    warnings: list[str] = field(default_factory=list)
    given: set[str] = field(default_factory=set)
    """The KubeletFlags fields the command line set (they win over a configuration file's)."""
    help: bool = False
    version: bool = False


def parse(argv: Sequence[str], *, extra: Sequence[Flag] = (), defaults: Mapping[str, Any] | None = None
          ) -> CommandLine:
    """pflag's parse of the kubelet's flag set (plus ``extra`` flags, nodeagent's own).
    ``defaults``: KubeletFlags defaults other than the kubelet's (nodeagent run's rootDir)."""
    defaults = dict(defaults or {})
    table = {**BY_NAME, **{f.name: f for f in extra}}
    shorthands = {**BY_SHORTHAND, **{f.shorthand: f for f in extra if f.shorthand}}
    values: dict[str, Any] = {}
    config: dict[str, Any] = {}
    setters: dict[str, str] = {}
    warnings: list[str] = []
    seen: set[str] = set()
    out = CommandLine(KubeletFlags())
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            if i < len(args):
                raise FlagError(f"unknown command {args[i]}")
            break
        if not arg.startswith("-") or arg == "-":
            raise FlagError(f"unknown command {arg}")
        if arg.startswith("--"):
            name, eq, text = arg[2:].partition("=")
            name = name.replace("_", "-")
            label = f"--{name}"
            if name in ("help", "version"):
                setattr(out, name, True)
                continue
            flag = table.get(name)
            if flag is None:
                raise FlagError(f"unknown flag: --{name}")
        else:
            short = arg[1]
            label = f"'{short}' in {arg}"
            if short == "h":
                out.help = True
                continue
            flag = shorthands.get(short)
            if flag is None:
                raise FlagError(f"unknown shorthand flag: '{short}' in {arg}")
            rest = arg[2:]
            eq = "=" if rest else ""
            text = rest[1:] if rest.startswith("=") else rest
        if not eq:
            if flag.bool_:
                text = "true"
            elif i < len(args):
                text = args[i]
                i += 1
            else:
                raise FlagError(f"flag needs an argument: {label}")
        try:
            value = flag.parse(text)
        except ValueError as exc:
            raise FlagError(f'invalid argument "{text}" for "{_display(flag)}" flag: {exc}') from None
        if flag.deprecated and flag.name not in seen:
            warnings.append(f"Flag --{flag.name} has been deprecated, {flag.deprecated}")
        first = flag.name not in seen
        seen.add(flag.name)
        kind, _, target = flag.target.partition(":")
        if kind == "flag":
            values[target] = _combine(values.get(target), value, flag.accumulate, first)
        else:
            _put(config, target, _combine(_get(config, target), value, flag.accumulate, first), flag)
            setters[target] = f"--{flag.name}"
    out.flags = KubeletFlags(**{**defaults, **values})
    out.given = set(values)
    out.config = config
    out.config_flags = setters
    out.warnings = warnings
    return out


def _display(flag: Flag) -> str:
    return f"-{flag.shorthand}, --{flag.name}" if flag.shorthand else f"--{flag.name}"


def _combine(before: Any, value: Any, how: str, first: bool) -> Any:
    if first or before is None:
        return value
    if how == "merge":
        return {**before, **value}
    if how == "append":
        return [*before, *value]
    return value


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _put(tree: dict[str, Any], dotted: str, value: Any, flag: Flag) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    if flag.parse is _duration:
        value = godur.format(value)  # JSON carries Go durations
    node[leaf] = value


def usage() -> str:
    """The flag list (``nodeagent kubelet --help``)."""
    lines = ["Flags:"]
    for flag in sorted(FLAGS, key=lambda f: f.name):
        note = " (DEPRECATED: set in the --config file)" if flag.deprecated == DEPRECATED else \
            f" (DEPRECATED: {flag.deprecated})" if flag.deprecated else ""
        where = flag.target.partition(":")[2]
        lines.append(f"  {_display(flag):<52} {'sets ' + where if flag.target.startswith('config') else ''}{note}")
    return "\n".join(lines)


# --- --node-labels: the kubelet's restrictions (ValidateKubeletFlags) ------------------------------

KUBELET_LABELS = ("kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
                  "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
                  "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type", "kubernetes.io/os",
                  "kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/arch")
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def _kubernetes_label(key: str) -> bool:
    namespace = key.split("/", 1)[0] if "/" in key else ""
    return namespace in ("kubernetes.io", "k8s.io") or namespace.endswith((".kubernetes.io", ".k8s.io"))


def _kubelet_label(key: str) -> bool:
    namespace = key.split("/", 1)[0] if "/" in key else ""
    return key in KUBELET_LABELS or any(namespace == ns or namespace.endswith("." + ns)
                                        for ns in KUBELET_LABEL_NAMESPACES)


def validate_node_labels(labels: dict[str, str]) -> None:
    """The kubelet's start-up refusal of ``--node-labels`` it may not set (NodeRestriction
    would refuse them on the Node), in its words."""
    unknown = sorted(k for k in labels if _kubernetes_label(k) and not _kubelet_label(k))
    if unknown:
        raise FlagError(
            f"unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [{' '.join(unknown)}]\n"
            f"--node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix "
            f"({', '.join(KUBELET_LABEL_NAMESPACES)}) or be in the specifically allowed set "
            f"({', '.join(KUBELET_LABELS)})")
    problems = []
    for key, value in labels.items():
        if qualified_name_error(key):
            problems.append(f"'{key}' - name part must consist of alphanumeric characters, '-', '_' or '.', and "
                            "must start and end with an alphanumeric character")
        if label_value_error(value):
            problems.append(f"'{value}' - a valid label must be an empty string or consist of alphanumeric "
                            "characters, '-', '_' or '.', and must start and end with an alphanumeric character")
    if problems:
        raise FlagError("invalid node labels: " + "; ".join(problems))

