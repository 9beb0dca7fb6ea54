"""PodSandboxConfig from a pod, as the kubelet builds it (kuberuntime_sandbox.go)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cri import CriError
from cri import types as t
from nodeagent import hostpaths
from nodeagent import labels as L
from nodeagent.errors import Retryable
from nodeagent.model import Pod
from plugins.runtime import hosts, podcgroup, security
from plugins.runtime.hosts import host_dns

_PROTOCOLS = {"TCP": t.Protocol.TCP, "UDP": t.Protocol.UDP, "SCTP": t.Protocol.SCTP}
DEFAULT_CLUSTER_DOMAIN = "cluster.local"

__all__ = ["SandboxConfigError", "grpc_error_text", "host_dns", "log_directory", "pod_labels", "sandbox_config"]


class SandboxConfigError(Retryable):
    """The sandbox cannot be configured as the pod asks (the kubelet keeps the pod Pending and
    retries, with the event reason FailedCreatePodSandBox)."""

    reason = "FailedCreatePodSandBox"


def grpc_error_text(exc: CriError) -> str:
    """A CRI failure as the kubelet's messages quote it (Go gRPC's status text)."""
    code = "".join(part.capitalize() for part in exc.code.name.split("_")) if exc.code is not None else "Unknown"
    return f"rpc error: code = {code} desc = {exc.details}"


def log_directory(pod_logs_dir: Path, pod: Pod) -> Path:
    """``<podLogsDir>/<namespace>_<name>_<uid>``: the kubelet's pod log directory."""
    return hostpaths.pod_log_dir(pod_logs_dir, pod.metadata.namespace, pod.metadata.name, pod.uid)


def pod_labels(pod: Pod, node_name: str) -> dict[str, str]:
    return {
        **pod.metadata.labels,
        L.POD_NAME: pod.metadata.name,
        L.POD_NAMESPACE: pod.metadata.namespace,
        L.POD_UID: pod.uid,
        L.MANAGED_BY: node_name,
    }


def sandbox_config(pod: Pod, attempt: int, pod_logs_dir: Path, node_name: str, *,
                   settings: Any = None, userns: t.UserNamespace | None = None) -> t.PodSandboxConfig:
    """``settings`` (the agent's configuration) supplies clusterDomain, clusterDNS, rootDir and
    seccompDefault; without it the kubelet's defaults apply (cluster.local, no cluster DNS).
    ``userns``: the pod's user namespace options (plugins/runtime/userns.py)."""
    spec = pod.spec
    cluster_domain = getattr(settings, "cluster_domain", DEFAULT_CLUSTER_DOMAIN)
    root_dir = getattr(settings, "root_dir", None)
    hostname = ""
    if not spec.host_network:
        # runc cannot set a hostname without its own UTS namespace: host-network pods get none.
        try:
            hostname = hosts.kernel_hostname(pod, cluster_domain)
        except hosts.PodNameError as exc:
            raise SandboxConfigError(f"Failed to create pod sandbox: {exc}") from None
    ports = [
        t.PortMapping(protocol=_PROTOCOLS[p.protocol], container_port=p.container_port, host_port=p.host_port,
                      host_ip=p.host_ip)
        for c in pod.all_containers()
        for p in c.ports
        if p.host_port
    ]
    return t.PodSandboxConfig(
        metadata=t.PodSandboxMetadata(name=pod.metadata.name, uid=pod.uid, namespace=pod.metadata.namespace,
                                      attempt=attempt),
        hostname=hostname,
        log_directory=str(log_directory(pod_logs_dir, pod)),
        dns_config=hosts.pod_dns(pod, cluster_dns=getattr(settings, "cluster_dns", ()),
                                 cluster_domain=cluster_domain),
        port_mappings=ports,
        labels=pod_labels(pod, node_name),
        annotations=dict(pod.metadata.annotations),
        linux=t.LinuxPodSandboxConfig(
            cgroup_parent=podcgroup.cgroup_parent(pod, settings),
            security_context=security.sandbox_security(pod, root_dir=root_dir,
                                                       seccomp_default=getattr(settings, "seccomp_default", False),
                                                       userns=userns),
            sysctls=security.sysctls(pod),
        ),
    )
