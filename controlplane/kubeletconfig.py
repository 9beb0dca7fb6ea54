"""The KubeletConfiguration of an upstream kubelet run here as a baseline: one writer for the
benchmarks' standalone peer (benchmarks/kubelet_peer.py), the cluster-mode side by side
(benchmarks/cluster_start.py) and the conformance run's node (conformance/e2e ``--node kubelet``).

What every one of them needs on these machines: the cgroupfs driver and ``failCgroupV1: false``
(the hierarchies are v1), a cgroup root of its own (controlplane/confine.py), swap allowed, and
eviction thresholds loose enough for a shared, fuller disk (the default nodefs.available 10 %
would evict the pods under test; nodeagent's are no stricter). With an API server it is
configured as kubeadm configures one: x509 client certificates and webhook token authentication,
Webhook authorization, no anonymous requests, no read-only port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

THIS_HOST: dict[str, Any] = {
    "cgroupDriver": "cgroupfs",
    "cgroupsPerQOS": True,
    "failSwapOn": False,
    "failCgroupV1": False,  # these machines mount cgroup v1 hierarchies
    "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
    "imageGCHighThresholdPercent": 100,
    "serializeImagePulls": False,
}
"""What every kubelet run here needs, whatever else its configuration says (the module's
docstring says why each)."""


def kubelet_config(*, endpoint: str, pod_logs_dir: Path, cgroup_root: str, port: int, healthz_port: int,
                   client_ca: Path | None, static_pod_path: Path | None = None,
                   max_pods: int = 110) -> dict[str, Any]:
    """``client_ca`` None: a standalone kubelet (no API server, so no authentication to delegate:
    every request is allowed, and it listens on loopback only)."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "port": port,
        "healthzPort": healthz_port,
        "readOnlyPort": 0,
        **THIS_HOST,
        "cgroupRoot": cgroup_root,  # its orphan cleanup then sees only its own pods
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": endpoint,
        "podLogsDir": str(pod_logs_dir),
        "maxPods": max_pods,
        "clusterDomain": "cluster.local",
    }
    if static_pod_path is not None:
        config["staticPodPath"] = str(static_pod_path)
    if client_ca is None:
        config["authentication"] = {"anonymous": {"enabled": False}, "webhook": {"enabled": False}}
        config["authorization"] = {"mode": "AlwaysAllow"}
        config["address"] = "127.0.0.1"
        config["healthzBindAddress"] = "127.0.0.1"
    else:
        config["authentication"] = {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                                    "x509": {"clientCAFile": str(client_ca)}}
        config["authorization"] = {"mode": "Webhook"}
    return config
