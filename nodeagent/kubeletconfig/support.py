"""What nodeagent does with each KubeletConfiguration field: honoured, or known and reported.

Every field of the 1.37 KubeletConfiguration is here (a test checks it against the schema).
A field that is *honoured* is mapped onto what nodeagent does, with the note saying where or
how it differs. A field that is *unsupported* is parsed, defaulted and validated like the
kubelet's, then reported once at start when its effective value is not its default (a
warning log line, a ``NodeAgentConfigurationUnsupported`` Event on the Node in cluster mode)
and always in ``nodeagent config explain``: nodeagent behaves as the note says, whatever the
value. docs/cluster-mode.md carries this table, rendered by :func:`render_table` (a test
keeps the copy true).

Entries may name a nested path (``logging.format``); a field without its own entry takes its
parent's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nodeagent.kubeletconfig.schema import KubeletConfiguration

Status = Literal["honoured", "unsupported"]


_NOTHING: Any = object()


@dataclass(frozen=True)
class Support:
    status: Status
    note: str
    behaves_as: Any = _NOTHING
    """For an unsupported field: the value nodeagent's behaviour amounts to (``failSwapOn:
    false``: swap is not checked). Set to it, the field is not worth a warning either."""


def _h(note: str = "") -> Support:
    return Support("honoured", note)


def _u(note: str, behaves_as: Any = _NOTHING) -> Support:
    return Support("unsupported", note, behaves_as)


_NO_CLOUD = "nodeagent has no cloud provider integration"
_NO_CM = "nodeagent has no CPU, memory or topology manager: containers get CFS shares and quota only"
_EVICTION = "the eviction stage (plugins/eviction, docs/NODE.md)"
_GC = "the gc stage (plugins/gc, docs/NODE.md)"
_SHUTDOWN = "the shutdown stage (plugins/shutdown: systemd-logind or nodeagent shutdown, docs/NODE.md)"

FIELDS: Mapping[str, Support] = {
    "enableServer": _h("the kubelet API (nodeagent/kubeletserver)"),
    "staticPodPath": _h("a directory of manifests (a single file is not supported)"),
    "podLogsDir": _h(),
    "syncFrequency": _h("the resync of configMap/secret volumes and env (apivolumes resyncSeconds)"),
    "fileCheckFrequency": _h("full rescans of staticPodPath; changes are also seen at once (inotify)"),
    "httpCheckFrequency": _u("no manifest URL source"),
    "staticPodURL": _u("no manifest URL source"),
    "staticPodURLHeader": _u("no manifest URL source"),
    "address": _h(),
    "port": _h(),
    "readOnlyPort": _h("plain HTTP, unauthenticated: /healthz, /pods, /stats, /metrics (kubeletserver/readonly.py)"),
    "tlsCertFile": _h("loaded at start; with serverTLSBootstrap only the initial pair"),
    "tlsPrivateKeyFile": _h(),
    "tlsCipherSuites": _u("Python's ssl defaults (TLS 1.2+, OpenSSL's cipher list)"),
    "tlsCurvePreferences": _u("OpenSSL's curve list"),
    "tlsMinVersion": _h("VersionTLS12 or VersionTLS13; never below TLS 1.2"),
    "rotateCertificates": _h("client certificate renewed at 70-90% of its lifetime (nodeagent/certificates)"),
    "serverTLSBootstrap": _h("kubernetes.io/kubelet-serving CSRs; reloaded without a restart"),
    "authentication": _h("x509, webhook (TokenReview), anonymous: nodeagent/kubeletserver/authn.py"),
    "authorization": _h("Webhook (SubjectAccessReview) or AlwaysAllow: nodeagent/kubeletserver/authz.py"),
    "registryPullQPS": _u("image pulls are not rate limited"),
    "registryBurst": _u("image pulls are not rate limited"),
    "imagePullCredentialsVerificationPolicy": _h("plugins/runtime/pullrecords.py"),
    "preloadedImagesVerificationAllowlist": _h(),
    "eventRecordQPS": _h(),
    "eventBurst": _h(),
    "enableDebuggingHandlers": _u("logs, exec, attach and port-forward are always served (authorized per request)",
                                  True),
    "enableContentionProfiling": _u("no profiling endpoints", False),
    "healthzPort": _h("the local endpoint: /healthz, /metrics, /pods, /trace"),
    "healthzBindAddress": _h(),
    "oomScoreAdj": _u("the agent's own OOM score is left as inherited"),
    "clusterDomain": _h(),
    "clusterDNS": _h(),
    "streamingConnectionIdleTimeout": _h(),
    "nodeStatusUpdateFrequency": _h(),
    "nodeStatusReportFrequency": _h(),
    "nodeLeaseDurationSeconds": _h(),
    "imageMinimumGCAge": _h(_GC),
    "imageMaximumGCAge": _h(_GC),
    "imageGCHighThresholdPercent": _h(_GC),
    "imageGCLowThresholdPercent": _h(_GC),
    "volumeStatsAggPeriod": _h("how often the usage collector walks volumes and logs (negative: never)"),
    "kubeletCgroups": _u("the agent runs in the cgroup it was started in"),
    "systemCgroups": _u("system processes are not moved"),
    "cgroupRoot": _h("pod cgroups under <cgroupRoot>/kubepods/<qos>, as the kubelet's (unset: /nodeagent-pods/<qos>, "
                     "so that a kubelet on the same host never takes them for its orphans)"),
    "cgroupsPerQOS": _h("pod cgroups under <cgroupRoot>/kubepods/<qos> (false: none, the runtime places sandboxes)"),
    "cgroupDriver": _u("pod cgroups use the cgroupfs layout: systemd (the runtime's, from CRI RuntimeConfig, or "
                       "this field where the runtime does not say) refuses every pod", "cgroupfs"),
    "cpuManagerPolicy": _u(_NO_CM),
    "singleProcessOOMKill": _u("the runtime's default"),
    "cpuManagerPolicyOptions": _u(_NO_CM),
    "cpuManagerReconcilePeriod": _u(_NO_CM),
    "memoryManagerPolicy": _u(_NO_CM),
    "topologyManagerPolicy": _u(_NO_CM),
    "topologyManagerScope": _u(_NO_CM),
    "topologyManagerPolicyOptions": _u(_NO_CM),
    "qosReserved": _u(_NO_CM),
    "runtimeRequestTimeout": _h(),
    "hairpinMode": _u("left to the CNI plugin"),
    "maxPods": _h(),
    "podCIDR": _u("the CNI configuration decides pod addresses"),
    "podPidsLimit": _u("pod cgroups get no pids limit"),
    "resolvConf": _h("the nameservers and search of dnsPolicy Default (and ClusterFirst without clusterDNS)"),
    "runOnce": _h("refused, as by the kubelet"),
    "cpuCFSQuota": _u("CPU limits always set a CFS quota", True),
    "cpuCFSQuotaPeriod": _u("the CFS period is always 100ms", "100ms"),
    "nodeStatusMaxImages": _h(),
    "maxOpenFiles": _u("the soft open-file limit is raised to the hard limit, as Go programs do"),
    "contentType": _u("the API is spoken in JSON"),
    "kubeAPIQPS": _h(),
    "kubeAPIBurst": _h(),
    "serializeImagePulls": _u("pods pull their images concurrently", False),
    "maxParallelImagePulls": _u("pods pull their images concurrently"),
    "evictionHard": _h(_EVICTION + "; its memory.available is also kept out of allocatable"),
    "evictionSoft": _h(_EVICTION),
    "evictionSoftGracePeriod": _h(_EVICTION),
    "evictionPressureTransitionPeriod": _h(_EVICTION),
    "evictionMaxPodGracePeriod": _h(_EVICTION),
    "evictionMinimumReclaim": _h(_EVICTION),
    "mergeDefaultEvictionSettings": _h(_EVICTION),
    "podsPerCore": _h("maxPods is the smaller of maxPods and podsPerCore x cores"),
    "enableControllerAttachDetach": _h("the Node's volumes.kubernetes.io/controller-managed-attach-detach "
                                       "annotation; nodeagent never attaches volumes itself"),
    "protectKernelDefaults": _u("kernel tunables are not checked"),
    "makeIPTablesUtilChains": _u("no iptables rules are made", False),
    "iptablesMasqueradeBit": _u("no iptables rules are made"),
    "iptablesDropBit": _u("no iptables rules are made"),
    "featureGates": _h("validated as the kubelet validates them; gates that choose a default or a check "
                       "(KubeletCrashLoopBackOffMax, KubeletEnsureSecretPulledImages, ...) act as in the kubelet"),
    "failSwapOn": _u("swap is not checked", False),
    "memorySwap": _u("pods get no swap settings"),
    "containerLogMaxSize": _h(),
    "containerLogMaxFiles": _h(),
    "containerLogMaxWorkers": _u("one rotation loop"),
    "containerLogMonitorInterval": _h(),
    "configMapAndSecretChangeDetectionStrategy": _u("objects are read again every syncFrequency (as Get)", "Get"),
    "systemReserved": _h("subtracted from allocatable (cpu, memory, pods, ephemeral-storage)"),
    "kubeReserved": _h("subtracted from allocatable (cpu, memory, pods, ephemeral-storage)"),
    "reservedSystemCPUs": _u(_NO_CM),
    "showHiddenMetricsForVersion": _u("no hidden metrics"),
    "systemReservedCgroup": _u("node allocatable is not enforced on cgroups"),
    "kubeReservedCgroup": _u("node allocatable is not enforced on cgroups"),
    "enforceNodeAllocatable": _u("node allocatable is enforced by admission only, not on cgroups"),
    "allowedUnsafeSysctls": _h(),
    "defaultPodSysctls": _u("pods get only the sysctls they name"),
    "volumePluginDir": _u("no FlexVolume plugins"),
    "providerID": _h("the Node's spec.providerID"),
    "kernelMemcgNotification": _u("memory is observed every evictionMonitoringPeriod (no memcg notifications)", False),
    "logging": _u("logs are structlog's console or JSON lines"),
    "logging.format": _h("text: console lines, json: JSON lines (nodeagent's logFormat wins when set)"),
    "logging.verbosity": _h("4 or more also logs every bus fact"),
    "enableSystemLogHandler": _u("no /logs/ endpoint", False),
    "enableSystemLogQuery": _u("no /logs/ endpoint", False),
    "shutdownGracePeriod": _h(_SHUTDOWN),
    "shutdownGracePeriodCriticalPods": _h(_SHUTDOWN),
    "shutdownGracePeriodByPodPriority": _h(_SHUTDOWN),
    "crashLoopBackOff": _h("the longest CrashLoopBackOff delay"),
    "reservedMemory": _u(_NO_CM),
    "enableProfilingHandler": _u("no profiling endpoints", False),
    "enableDebugFlagsHandler": _u("no /debug/flags/v endpoint", False),
    "seccompDefault": _h(),
    "memoryThrottlingFactor": _u("no memory.high is set"),
    "memoryReservationPolicy": _u("no memory.min is set"),
    "registerWithTaints": _h(),
    "registerNode": _h(),
    "tracing": _u("no OpenTelemetry export (nodeagent's own trace: nodeagent trace POD)"),
    "localStorageCapacityIsolation": _h(_EVICTION + ": emptyDir sizeLimit and ephemeral-storage limits"),
    "containerRuntimeEndpoint": _h(),
    "imageServiceEndpoint": _u("images go through containerRuntimeEndpoint"),
    "failCgroupV1": _u("nodeagent runs on cgroup v1 hosts too", False),
    "userNamespaces": _h("idsPerPod IDs per pod with hostUsers: false, from the kubelet OS user's subordinate "
                         "IDs (getsubids) or the default range (plugins/runtime/userns.py)"),
}


def support_of(path: str) -> Support:
    """The entry for a dotted JSON path (its own, or its nearest parent's)."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        found = FIELDS.get(".".join(parts[:n]))
        if found is not None:
            return found
    raise KeyError(path)


def leaves_of(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf below ``prefix`` (structs descend; maps, lists and
    scalars are leaves)."""
    if isinstance(value, dict) and value and _struct(prefix):
        for key, item in value.items():
            yield from leaves_of(item, f"{prefix}.{key}")
    else:
        yield prefix, value


_STRUCTS = {"authentication", "authentication.x509", "authentication.webhook", "authentication.anonymous",
            "authorization", "authorization.webhook", "memorySwap", "crashLoopBackOff", "logging",
            "logging.options", "logging.options.text", "logging.options.json", "tracing", "userNamespaces"}


def _struct(path: str) -> bool:
    return path in _STRUCTS


def leaves(config: KubeletConfiguration) -> dict[str, Any]:
    """Every leaf field of the configuration as dotted JSON path -> JSON value (maps and lists
    are leaves; nil pointers are left out)."""
    out: dict[str, Any] = {}
    for key, value in config.to_json().items():
        out.update(leaves_of(value, key))
    return out


def unsupported(effective: KubeletConfiguration, default: KubeletConfiguration) -> dict[str, Any]:
    """The fields nodeagent does not honour whose effective value is not their default: what
    is worth a warning."""
    now, before = leaves(effective), leaves(default)
    out = {}
    for path, value in now.items():
        entry = support_of(path)
        if entry.status == "unsupported" and value != before.get(path) and value != entry.behaves_as:
            out[path] = value
    return out


def render_table() -> str:
    """The compatibility table of docs/cluster-mode.md."""
    lines = ["| field | nodeagent | what nodeagent does |", "|---|---|---|"]
    for path, entry in FIELDS.items():
        lines.append(f"| `{path}` | {entry.status} | {entry.note} |")
    return "\n".join(lines)


__all__ = ["FIELDS", "Support", "leaves", "leaves_of", "render_table", "support_of", "unsupported"]
