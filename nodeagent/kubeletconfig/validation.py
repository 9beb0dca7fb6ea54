"""The kubelet's validation of its effective configuration (ValidateKubeletConfiguration,
pkg/kubelet/apis/config/validation at 1.37), with its messages, so that a configuration the
kubelet refuses is refused here in the same words.

Two host checks are left out on purpose: ``failCgroupV1`` (nodeagent runs on cgroup v1 hosts
too; the field is reported, see support.py) and the swap check (``failSwapOn``, likewise)."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator

from nodeagent import duration as godur
from nodeagent import quantity
from nodeagent.kubeletconfig import gates as known
from nodeagent.kubeletconfig.defaults import gate_enabled
from nodeagent.kubeletconfig.schema import KubeletConfiguration

_SYSCTL = re.compile(r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$")
_NAMESPACED_SYSCTLS = ("kernel.sem", "kernel.shm", "kernel.msg", "fs.mqueue.", "net.")
_USERNS_UNIT = 65536
_TOPOLOGY_POLICIES = ["none", "best-effort", "restricted", "single-numa-node"]


class ValidationError(ValueError):
    """The configuration is invalid; ``errors`` are the kubelet's messages, in its order."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__(aggregate(errors))


def aggregate(errors: list[str]) -> str:
    """utilerrors.NewAggregate's Error(): one message as is, several as ``[a, b]``."""
    return errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"


def _d(seconds: float | None) -> str:
    return godur.format(seconds or 0.0)


def feature_gate_errors(gates: dict[str, bool] | None) -> list[str]:
    """featuregate.SetFromMap's refusals: an unknown gate, a locked gate set against its lock."""
    errors = []
    for name in sorted(gates or {}):
        value = (gates or {})[name]
        if name not in known.GATES:
            errors.append(f"unrecognized feature gate: {name}")
            continue
        default, locked, _stage = known.GATES[name]
        if locked and value != default:
            errors.append(f"cannot set feature gate {name} to {str(value).lower()}, feature is locked to "
                          f"{str(default).lower()}")
    return errors


def errors_of(kc: KubeletConfiguration) -> list[str]:
    """Every problem, as the kubelet lists them (an empty list: valid)."""
    gate_problems = feature_gate_errors(kc.feature_gates)
    if gate_problems:
        return [aggregate(gate_problems)]  # the kubelet returns this one error alone
    return list(_checks(kc))


def validate(kc: KubeletConfiguration) -> None:
    errors = errors_of(kc)
    if errors:
        raise ValidationError(errors)


def _checks(kc: KubeletConfiguration) -> Iterator[str]:  # noqa: C901 - one check per rule, as upstream
    def on(gate: str) -> bool:
        return gate_enabled(gate, kc.feature_gates)

    bad = "invalid configuration: "
    high = kc.image_gc_high_threshold_percent or 0
    low = kc.image_gc_low_threshold_percent or 0
    if kc.node_lease_duration_seconds <= 0:
        yield bad + "nodeLeaseDurationSeconds must be greater than 0"
    if kc.system_cgroups and not kc.cgroup_root:
        yield bad + ("systemCgroups (--system-cgroups) was specified and cgroupRoot (--cgroup-root) was not "
                     "specified")
    if kc.cgroup_root and (".." in kc.cgroup_root.split("/") or "\0" in kc.cgroup_root):
        # nodeagent's own check: the path becomes directories under /sys/fs/cgroup/<hierarchy>.
        yield bad + f"cgroupRoot (--cgroup-root) {kc.cgroup_root!r} must not contain '..' or NUL"
    if kc.event_burst < 0:
        yield bad + f"eventBurst (--event-burst) {kc.event_burst} must not be a negative number"
    if (kc.event_record_qps or 0) < 0:
        yield bad + f"eventRecordQPS (--event-qps) {kc.event_record_qps} must not be a negative number"
    if kc.healthz_port and not 1 <= kc.healthz_port <= 65535:
        yield bad + f"healthzPort (--healthz-port) {kc.healthz_port} must be between 1 and 65535, inclusive"
    period = kc.cpu_cfs_quota_period or 0.0
    if not on("CustomCPUCFSQuotaPeriod") and period != 0.1:
        yield bad + (f"cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {_d(period)} requires feature gate "
                     "CustomCPUCFSQuotaPeriod")
    if on("CustomCPUCFSQuotaPeriod") and not 0.001 <= period <= 1.0:
        yield bad + f"cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {_d(period)} must be between 1ms and 1sec, inclusive"
    if not 0 <= high <= 100:
        yield bad + (f"imageGCHighThresholdPercent (--image-gc-high-threshold) {high} must be between 0 and 100, "
                     "inclusive")
    if not 0 <= low <= 100:
        yield bad + f"imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be between 0 and 100, inclusive"
    if low >= high:
        yield bad + (f"imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be less than "
                     f"imageGCHighThresholdPercent (--image-gc-high-threshold) {high}")
    if kc.image_maximum_gc_age != 0 and not on("ImageMaximumGCAge"):
        yield bad + "ImageMaximumGCAge feature gate is required for Kubelet configuration option imageMaximumGCAge"
    if kc.default_pod_sysctls:
        if not on("DefaultPodSysctls"):
            yield bad + "DefaultPodSysctls feature gate is required for Kubelet configuration option defaultPodSysctls"
        else:
            seen: set[str] = set()
            for name in kc.default_pod_sysctls:
                if len(name) > 253 or not _SYSCTL.match(name):
                    yield bad + f'"{name}" is not a valid sysctl name for defaultPodSysctls'
                    continue
                normal = name.replace("/", ".")
                if not normal.startswith(_NAMESPACED_SYSCTLS):
                    yield bad + f'"{name}" is not known to be namespaced for defaultPodSysctls'
                if normal in seen:
                    yield bad + f'duplicate sysctl "{normal}" found in defaultPodSysctls'
                seen.add(normal)
    if kc.image_minimum_gc_age < 0:
        yield bad + f"imageMinimumGCAge {_d(kc.image_minimum_gc_age)} must not be negative"
    if kc.image_maximum_gc_age < 0:
        yield bad + f"imageMaximumGCAge {_d(kc.image_maximum_gc_age)} must not be negative"
    if 0 < kc.image_maximum_gc_age <= kc.image_minimum_gc_age:
        yield bad + (f"imageMaximumGCAge {_d(kc.image_maximum_gc_age)} must be greater than imageMinimumGCAge "
                     f"{_d(kc.image_minimum_gc_age)}")
    for name, flag, value in (("iptablesDropBit", "iptables-drop-bit", kc.iptables_drop_bit),
                              ("iptablesMasqueradeBit", "iptables-masquerade-bit", kc.iptables_masquerade_bit)):
        if not 0 <= (value or 0) <= 31:
            yield bad + f"{name} (--{flag}) {value} must be between 0 and 31, inclusive"
    if kc.kube_api_burst < 0:
        yield bad + f"kubeAPIBurst (--kube-api-burst) {kc.kube_api_burst} must not be a negative number"
    if (kc.kube_api_qps or 0) < 0:
        yield bad + f"kubeAPIQPS (--kube-api-qps) {kc.kube_api_qps} must not be a negative number"
    if (kc.node_status_max_images or 0) < -1:
        yield bad + f"nodeStatusMaxImages (--node-status-max-images) {kc.node_status_max_images} must be -1 or greater"
    if kc.max_open_files < 0:
        yield bad + f"maxOpenFiles (--max-open-files) {kc.max_open_files} must not be a negative number"
    if kc.max_pods < 0:
        yield bad + f"maxPods (--max-pods) {kc.max_pods} must not be a negative number"
    if not -1000 <= (kc.oom_score_adj or 0) <= 1000:
        yield bad + f"oomScoreAdj (--oom-score-adj) {kc.oom_score_adj} must be between -1000 and 1000, inclusive"
    if kc.pods_per_core < 0:
        yield bad + f"podsPerCore (--pods-per-core) {kc.pods_per_core} must not be a negative number"
    if not 1 <= kc.port <= 65535:
        yield bad + f"port (--port) {kc.port} must be between 1 and 65535, inclusive"
    if kc.read_only_port and not 1 <= kc.read_only_port <= 65535:
        yield bad + f"readOnlyPort (--read-only-port) {kc.read_only_port} must be between 0 and 65535, inclusive"
    if kc.registry_burst < 0:
        yield bad + f"registryBurst (--registry-burst) {kc.registry_burst} must not be a negative number"
    if (kc.registry_pull_qps or 0) < 0:
        yield bad + f"registryPullQPS (--registry-qps) {kc.registry_pull_qps} must not be a negative number"
    parallel = kc.max_parallel_image_pulls
    if parallel is not None and parallel < 1:
        yield bad + f"maxParallelImagePulls {parallel} must be a positive number"
    if kc.serialize_image_pulls and parallel is not None and parallel > 1:
        yield bad + ("maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls "
                     "(--serialize-image-pulls) is set to false")
    if kc.server_tls_bootstrap and not on("RotateKubeletServerCertificate"):
        yield bad + "serverTLSBootstrap true requires feature gate RotateKubeletServerCertificate"
    if kc.run_once:
        yield bad + "runOnce (--runOnce) true, Runonce mode has been deprecated and should not be set"
    for taint in kc.register_with_taints or ():
        if taint.time_added is not None:
            yield bad + "taint.TimeAdded is not nil"
    if kc.topology_manager_policy not in _TOPOLOGY_POLICIES:
        listed = "[" + " ".join(f'"{p}"' for p in _TOPOLOGY_POLICIES) + "]"
        yield bad + (f'topologyManagerPolicy (--topology-manager-policy) "{kc.topology_manager_policy}" '
                     f"must be one of: {listed}")
    if kc.topology_manager_scope not in ("container", "pod"):
        yield bad + (f'topologyManagerScope (--topology-manager-scope) "{kc.topology_manager_scope}" must be one of: '
                     '"container", or "pod"')
    grace, critical = kc.shutdown_grace_period, kc.shutdown_grace_period_critical_pods
    if on("GracefulNodeShutdown"):
        if critical > grace:
            yield bad + f"shutdownGracePeriodCriticalPods {_d(critical)} must be <= shutdownGracePeriod {_d(grace)}"
        if grace < 0 or 0 < grace < 1:
            yield bad + f"shutdownGracePeriod {_d(grace)} must be either zero or otherwise >= 1 sec"
        if critical < 0 or 0 < critical < 1:
            yield bad + f"shutdownGracePeriodCriticalPods {_d(critical)} must be either zero or otherwise >= 1 sec"
    if (grace > 0 or critical > 0) and not on("GracefulNodeShutdown"):
        yield bad + ("specifying shutdownGracePeriod or shutdownGracePeriodCriticalPods requires feature gate "
                     "GracefulNodeShutdown")
    by_priority = kc.shutdown_grace_period_by_pod_priority
    if on("GracefulNodeShutdownBasedOnPodPriority"):
        if by_priority and (grace > 0 or critical > 0):
            yield bad + "Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time"
    elif by_priority:
        yield bad + ("Specifying shutdownGracePeriodByPodPriority requires feature gate "
                     "GracefulNodeShutdownBasedOnPodPriority")
    swap = kc.memory_swap.swap_behavior
    if on("NodeSwap"):
        if swap not in ("", "NoSwap", "LimitedSwap"):
            yield bad + f'memorySwap.swapBehavior "{swap}" must be one of: "", "LimitedSwap" or "NoSwap"'
    elif swap:
        yield bad + "memorySwap.swapBehavior cannot be set when NodeSwap feature flag is disabled"
    restart = kc.crash_loop_back_off.max_container_restart_period
    if on("KubeletCrashLoopBackOffMax"):
        if restart is None:
            yield bad + ("FeatureGate KubeletCrashLoopBackOffMax is enabled, "
                         "CrashLoopBackOff.MaxContainerRestartPeriod must be set")
        elif not 1000 <= int(restart * 1000) <= 300000:
            yield bad + (f"CrashLoopBackOff.MaxContainerRestartPeriod (got: {restart:g} seconds) must be set "
                         "between 1s and 300s")
    elif restart is not None:
        yield bad + ("FeatureGate KubeletCrashLoopBackOffMax not enabled, "
                     "CrashLoopBackOff.MaxContainerRestartPeriod must not be set")
    yield from _node_allocatable(kc)
    if kc.hairpin_mode not in ("none", "hairpin-veth", "promiscuous-bridge"):
        yield bad + (f'option "{kc.hairpin_mode}" specified for hairpinMode (--hairpin-mode). Valid options are '
                     '"none", "hairpin-veth" or "promiscuous-bridge"')
    yield from _image_verification(kc, on("KubeletEnsureSecretPulledImages"))
    if kc.reserved_system_cpus:
        if kc.system_reserved_cgroup or kc.kube_reserved_cgroup:
            yield bad + ("can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup "
                         "(--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)")
        if not re.fullmatch(r"\s*(\d+(-\d+)?)(\s*,\s*\d+(-\d+)?)*\s*", kc.reserved_system_cpus):
            yield bad + (f"unable to parse reservedSystemCPUs (--reserved-cpus) {kc.reserved_system_cpus}, error: "
                         f'strconv.Atoi: parsing "{kc.reserved_system_cpus}": invalid syntax')
    yield from _reserved_memory(kc)
    yield from _os_configuration(kc)
    hidden = kc.show_hidden_metrics_for_version
    if hidden and hidden != "1.36":
        yield (f'invalid showHiddenMetricsForVersion: showHiddenMetricsForVersion: Invalid value: "{hidden}": '
               "must be omitted or have the value '1.36'; only the previous minor version is allowed")
    if kc.logging.flush_frequency <= 0:
        yield (f"logging.flushFrequency: Invalid value: \"{_d(kc.logging.flush_frequency)}\": "
               "Must be greater than zero")
    if kc.logging.format not in ("text", "json"):
        yield f'logging.format: Invalid value: "{kc.logging.format}": Unsupported log format'
    throttle = kc.memory_throttling_factor
    if not on("MemoryQoS") and throttle is not None and throttle != 0.9:
        yield bad + "memoryThrottlingFactor must not be set when MemoryQoS feature gate is disabled"
    if throttle is not None and not 0 < throttle <= 1.0:
        yield bad + f"memoryThrottlingFactor {throttle:g} must be greater than 0 and less than or equal to 1.0"
    policy = kc.memory_reservation_policy
    if not on("MemoryQoS") and policy == "TieredReservation":
        yield bad + f'memoryReservationPolicy "{policy}" requires MemoryQoS feature gate to be enabled'
    if policy not in ("None", "TieredReservation"):
        yield bad + (f'option "{policy}" specified for memoryReservationPolicy. Valid options are "None" or '
                     '"TieredReservation"')
    if not kc.container_runtime_endpoint:
        yield bad + "the containerRuntimeEndpoint was not specified or empty"
    if kc.enable_system_log_query and not on("NodeLogQuery"):
        yield bad + "NodeLogQuery feature gate is required for enableSystemLogQuery"
    if kc.enable_system_log_query and not kc.enable_system_log_handler:
        yield bad + "enableSystemLogHandler is required for enableSystemLogQuery"
    if (kc.container_log_max_workers or 0) < 1:
        yield bad + "containerLogMaxWorkers must be greater than or equal to 1"
    if (kc.container_log_monitor_interval or 0.0) < 3:
        yield bad + "containerLogMonitorInterval must be a positive time duration greater than or equal to 3s"
    if (kc.container_log_max_files or 0) <= 1:
        yield bad + "containerLogMaxFiles must be greater than 1"
    logs = kc.pod_logs_dir
    if not logs:
        yield bad + "podLogsDir was not specified"
    if not logs.startswith("/"):
        yield bad + f'pod logs path "{logs}" must be absolute path'
    if logs and posixpath.normpath(logs) != logs:
        yield bad + f'pod logs path "{logs}" must be normalized'
    if any(ord(ch) > 127 for ch in logs):
        yield bad + f'pod logs path "{logs}" mut contains ASCII characters only'
    # Not the kubelet's validation but its parse at start (resource quantities, ...): a bad
    # containerLogMaxSize stops the kubelet when the log manager is made.
    try:
        if quantity.bytes_(kc.container_log_max_size) <= 0:
            yield bad + f"containerLogMaxSize must be greater than 0, got {kc.container_log_max_size!r}"
    except ValueError as exc:
        yield f"failed to initialize container log manager: {exc}"


def _node_allocatable(kc: KubeletConfiguration) -> Iterator[str]:
    bad = "invalid configuration: "
    listed = kc.enforce_node_allocatable or []
    present = set(listed)
    if {"system-reserved", "system-reserved-compressible"} <= present:
        yield bad + ('both "system-reserved" and "system-reserved-compressible" cannot be specified together in '
                     "enforceNodeAllocatable (--enforce-node-allocatable)")
    if {"kube-reserved", "kube-reserved-compressible"} <= present:
        yield bad + ('both "kube-reserved" and "kube-reserved-compressible" cannot be specified together in '
                     "enforceNodeAllocatable (--enforce-node-allocatable)")
    seen: set[str] = set()
    for value in listed:
        if value in seen:
            yield bad + f'duplicated enforcements "{value}" in enforceNodeAllocatable (--enforce-node-allocatable)'
            continue
        seen.add(value)
        if value == "pods":
            pass
        elif value in ("system-reserved", "system-reserved-compressible"):
            if not kc.system_reserved_cgroup:
                yield bad + ('systemReservedCgroup (--system-reserved-cgroup) must be specified when "system-reserved" '
                             'or "system-reserved-compressible" included in enforceNodeAllocatable '
                             "(--enforce-node-allocatable)")
        elif value in ("kube-reserved", "kube-reserved-compressible"):
            if not kc.kube_reserved_cgroup:
                yield bad + ('kubeReservedCgroup (--kube-reserved-cgroup) must be specified when "kube-reserved" or '
                             '"kube-reserved-compressible" included in enforceNodeAllocatable '
                             "(--enforce-node-allocatable)")
        elif value == "none":
            if len(listed) > 1:
                yield bad + ('enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional '
                             'enforcements when "none" is specified')
            continue
        else:
            yield bad + (f'option "{value}" specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid '
                         'options are "pods", "system-reserved", "system-reserved-compressible", "kube-reserved", '
                         '"kube-reserved-compressible" or "none"')
            continue
        if not kc.cgroups_per_qos:
            yield bad + (f'cgroupsPerQOS (--cgroups-per-qos) must be set to true when "{value}" contained in '
                         "enforceNodeAllocatable (--enforce-node-allocatable)")


def _image_verification(kc: KubeletConfiguration, gate: bool) -> Iterator[str]:
    bad = "invalid configuration: "
    policy = kc.image_pull_credentials_verification_policy
    allowlist = kc.preloaded_images_verification_allowlist or []
    if gate:
        valid = ("NeverVerify", "NeverVerifyPreloadedImages", "NeverVerifyAllowlistedImages", "AlwaysVerify")
        if policy not in valid:
            yield bad + (f'option "{policy}" specified for imagePullCredentialsVerificationPolicy. Valid options are '
                         '"NeverVerify", "NeverVerifyPreloadedImages", "NeverVerifyAllowlistedImages" or '
                         '"AlwaysVerify"')
        if allowlist and policy != "NeverVerifyAllowlistedImages":
            yield bad + ("can't set `preloadedImagesVerificationAllowlist` if "
                         '`imagePullCredentialsVertificationPolicy` is not "NeverVerifyAllowlistedImages"')
    else:
        if policy:
            yield bad + ("`imagePullCredentialsVerificationPolicy` must not be set if "
                         "KubeletEnsureSecretPulledImages feature gate is not enabled")
        if allowlist:
            yield bad + ("`preloadedImagesVerificationAllowlist` must not be set if KubeletEnsureSecretPulledImages "
                         "feature gate is not enabled")


def _reserved_memory(kc: KubeletConfiguration) -> Iterator[str]:
    bad = "invalid configuration: "
    seen: dict[int, set[str]] = {}
    for reservation in kc.reserved_memory or ():
        node = reservation.numa_node
        names = seen.setdefault(node, set())
        for resource, value in reservation.limits.items():
            if resource != "memory" and not resource.startswith("hugepages-"):
                yield bad + (f'the limit type "{resource}" for NUMA node {node} is not supported, only '
                             "[memory hugepages-<HugePageSize>] is accepted")
            try:
                zero = quantity.bytes_(value) == 0
            except ValueError:
                zero = False
            if zero:
                yield bad + f'reserved memory may not be zero for NUMA node {node} and resource "{resource}"'
            if resource in names:
                yield bad + (f'the reserved memory has a duplicate value for NUMA node {node} and resource '
                             f'"{resource}"')
            names.add(resource)


def cgroup_v1() -> bool:
    return not os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def _os_configuration(kc: KubeletConfiguration) -> Iterator[str]:
    """validateKubeletOSConfiguration (Linux) without the failCgroupV1 refusal (see the module
    docstring); it returns at the first problem, as upstream."""
    bad = "invalid configuration: "
    if cgroup_v1() and kc.single_process_oom_kill is False:
        yield bad + "singleProcessOOMKill must not be explicitly set to false when using cgroup v1"
        return
    ids = kc.user_namespaces.ids_per_pod if kc.user_namespaces is not None else None
    if ids is not None:
        if ids < _USERNS_UNIT:
            yield bad + f"userNamespaces.idsPerPod must not be less than {_USERNS_UNIT}"
        elif ids % _USERNS_UNIT:
            yield bad + f"userNamespaces.idsPerPod must be a multiple of {_USERNS_UNIT}"
        elif ids > 2**32 - 1:
            yield bad + f"userNamespaces.idsPerPod must not be more than {2**32 - 1}"

