"""The kubelet's defaulting of a v1beta1 KubeletConfiguration (SetDefaults_KubeletConfiguration,
pkg/kubelet/apis/config/v1beta1/defaults.go at 1.37), and the two other default sets the
kubelet has: the command-line world's (applyLegacyDefaults, when there is no ``--config``) and
the ``evictionHard`` a config file gets when it names none.

Zero means unset for plain Go fields (``0``, ``""``, a ``0s`` duration: kubeadm writes
``cacheTTL: 0s`` and gets 2m0s), nil means unset for pointers. nodeagent's own configuration
format keeps three fields unset ("auto"), which the agent then decides by mode: the kubelet
API, its webhook authentication and its authorization mode (see :func:`apply`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodeagent.kubeletconfig import gates as known
from nodeagent.kubeletconfig.schema import KubeletConfiguration

# pkg/kubelet/eviction/defaults_linux.go
DEFAULT_EVICTION_HARD: Mapping[str, str] = {
    "memory.available": "100Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%",
    "imagefs.available": "15%", "imagefs.inodesFree": "5%",
}
DEFAULT_VOLUME_PLUGIN_DIR = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/"
DEFAULT_POD_LOGS_DIR = "/var/log/pods"
KUBELET_OOM_SCORE_ADJ = -999
KUBELET_READ_ONLY_PORT = 10255
MAX_CONTAINER_BACKOFF = 300.0


def gate_enabled(name: str, gates: Mapping[str, bool] | None) -> bool:
    """A feature gate as this configuration runs with it: its featureGates entry, else AllAlpha /
    AllBeta for an alpha / beta gate, else its 1.37 default."""
    gates = gates or {}
    if name in gates:
        return bool(gates[name])
    default, _locked, stage = known.GATES.get(name, (False, False, "Alpha"))
    if stage == "Alpha" and "AllAlpha" in gates:
        return bool(gates["AllAlpha"])
    if stage == "Beta" and "AllBeta" in gates:
        return bool(gates["AllBeta"])
    return default


def _set(values: dict[str, Any], key: str, default: Any, *, zero: Any = None) -> None:
    """``if obj.X == zero { obj.X = default }`` (zero None: a pointer, unset when nil)."""
    if values.get(key) is None or (zero is not None and values[key] == zero):
        values[key] = default


def apply(config: KubeletConfiguration, *, own_format: bool = False) -> KubeletConfiguration:
    """SetDefaults_KubeletConfiguration. ``own_format``: nodeagent's own configuration format,
    which leaves ``enableServer``, ``authentication.webhook.enabled`` and
    ``authorization.mode`` unset (decided by mode) and domains pods under ``cluster.local``."""
    v = config.model_dump()
    g = v["feature_gates"]
    if not own_format:
        _set(v, "enable_server", True)
    _set(v, "sync_frequency", 60.0, zero=0.0)
    _set(v, "file_check_frequency", 20.0, zero=0.0)
    _set(v, "http_check_frequency", 20.0, zero=0.0)
    _set(v, "address", "0.0.0.0", zero="")
    _set(v, "port", 10250, zero=0)
    authn = v["authentication"]
    _set(authn["anonymous"], "enabled", False)
    if not own_format:
        _set(authn["webhook"], "enabled", True)
    _set(authn["webhook"], "cache_ttl", 120.0, zero=0.0)
    authz = v["authorization"]
    if not own_format:
        _set(authz, "mode", "Webhook", zero="")
    _set(authz["webhook"], "cache_authorized_ttl", 300.0, zero=0.0)
    _set(authz["webhook"], "cache_unauthorized_ttl", 30.0, zero=0.0)
    _set(v, "registry_pull_qps", 5)
    _set(v, "registry_burst", 10, zero=0)
    _set(v, "event_record_qps", 50)
    _set(v, "event_burst", 100, zero=0)
    _set(v, "enable_debugging_handlers", True)
    _set(v, "healthz_port", 10248)
    _set(v, "healthz_bind_address", "127.0.0.1", zero="")
    _set(v, "oom_score_adj", KUBELET_OOM_SCORE_ADJ)
    if own_format:
        _set(v, "cluster_domain", "cluster.local", zero="")
    _set(v, "streaming_connection_idle_timeout", 4 * 3600.0, zero=0.0)
    if not v["node_status_report_frequency"]:
        # Backward compatibility: an explicit nodeStatusUpdateFrequency is the report frequency too.
        v["node_status_report_frequency"] = v["node_status_update_frequency"] or 300.0
    _set(v, "node_status_update_frequency", 10.0, zero=0.0)
    _set(v, "node_lease_duration_seconds", 40, zero=0)
    _set(v, "image_minimum_gc_age", 120.0, zero=0.0)
    _set(v, "image_gc_high_threshold_percent", 85)
    _set(v, "image_gc_low_threshold_percent", 80)
    _set(v, "volume_stats_agg_period", 60.0, zero=0.0)
    _set(v, "cgroups_per_qos", True)
    _set(v, "cgroup_driver", "cgroupfs", zero="")
    _set(v, "cpu_manager_policy", "none", zero="")
    _set(v, "cpu_manager_reconcile_period", 10.0, zero=0.0)
    _set(v, "memory_manager_policy", "None", zero="")
    _set(v, "topology_manager_policy", "none", zero="")
    _set(v, "topology_manager_scope", "container", zero="")
    _set(v, "runtime_request_timeout", 120.0, zero=0.0)
    _set(v, "hairpin_mode", "promiscuous-bridge", zero="")
    _set(v, "max_pods", 110, zero=0)
    if v["pod_pids_limit"] is None or v["pod_pids_limit"] < 0:
        v["pod_pids_limit"] = -1
    _set(v, "resolv_conf", "/etc/resolv.conf")
    _set(v, "cpu_cfs_quota", True)
    _set(v, "cpu_cfs_quota_period", 0.1)
    _set(v, "node_status_max_images", 50)
    _set(v, "max_open_files", 1000000, zero=0)
    _set(v, "content_type", "application/vnd.kubernetes.protobuf", zero="")
    _set(v, "kube_api_qps", 50)
    _set(v, "kube_api_burst", 100, zero=0)
    if v["serialize_image_pulls"] is None:
        parallel = v["max_parallel_image_pulls"]
        v["serialize_image_pulls"] = parallel is None or parallel < 2
    _set(v, "eviction_pressure_transition_period", 300.0, zero=0.0)
    _set(v, "merge_default_eviction_settings", False)
    _set(v, "enable_controller_attach_detach", True)
    _set(v, "make_iptables_util_chains", True)
    _set(v, "iptables_masquerade_bit", 14)
    _set(v, "iptables_drop_bit", 15)
    _set(v, "fail_swap_on", True)
    _set(v, "container_log_max_size", "10Mi", zero="")
    _set(v, "container_log_max_files", 5)
    _set(v, "container_log_max_workers", 1)
    _set(v, "container_log_monitor_interval", 10.0)
    _set(v, "config_map_and_secret_change_detection_strategy", "Watch", zero="")
    _set(v, "enforce_node_allocatable", ["pods"])
    _set(v, "volume_plugin_dir", DEFAULT_VOLUME_PLUGIN_DIR, zero="")
    # logsapi.SetRecommendedLoggingConfiguration
    logging = v["logging"]
    _set(logging, "format", "text", zero="")
    _set(logging, "flush_frequency", 5.0, zero=0.0)
    _set(v, "enable_system_log_handler", True)
    _set(v, "enable_profiling_handler", True)
    _set(v, "enable_debug_flags_handler", True)
    _set(v, "seccomp_default", False)
    _set(v, "fail_cgroup_v1", True)
    _set(v, "memory_reservation_policy", "None", zero="")
    _set(v, "register_node", True)
    _set(v, "local_storage_capacity_isolation", True)
    _set(v, "container_runtime_endpoint", "unix:///run/containerd/containerd.sock", zero="")
    _set(v, "pod_logs_dir", DEFAULT_POD_LOGS_DIR, zero="")
    if gate_enabled("KubeletCrashLoopBackOffMax", g):
        _set(v["crash_loop_back_off"], "max_container_restart_period", MAX_CONTAINER_BACKOFF)
    if gate_enabled("KubeletEnsureSecretPulledImages", g):
        _set(v, "image_pull_credentials_verification_policy", "NeverVerifyPreloadedImages", zero="")
    return KubeletConfiguration.model_validate(v)


def legacy(config: KubeletConfiguration) -> KubeletConfiguration:
    """applyLegacyDefaults: what a kubelet run without ``--config`` starts from (anonymous
    requests allowed, no webhook, AlwaysAllow, the read-only port)."""
    v = config.model_dump()
    v["authentication"]["anonymous"]["enabled"] = True
    v["authentication"]["webhook"]["enabled"] = False
    v["authorization"]["mode"] = "AlwaysAllow"
    v["read_only_port"] = KUBELET_READ_ONLY_PORT
    return KubeletConfiguration.model_validate(v)


def eviction_hard(config: KubeletConfiguration) -> KubeletConfiguration:
    """loadConfigFile's evictionHard: the defaults when the file names none, merged in under
    ``mergeDefaultEvictionSettings``."""
    if config.eviction_hard is None:
        return config.model_copy(update={"eviction_hard": dict(DEFAULT_EVICTION_HARD)})
    if config.merge_default_eviction_settings:
        return config.model_copy(update={"eviction_hard": {**DEFAULT_EVICTION_HARD, **config.eviction_hard}})
    return config


def defaulted(*, own_format: bool = False) -> KubeletConfiguration:
    """An empty configuration file, defaulted: what each field is when nobody set it."""
    return eviction_hard(apply(KubeletConfiguration(), own_format=own_format))
