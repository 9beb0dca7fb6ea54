"""PodSandboxConfig from a pod, as the kubelet builds it (kuberuntime_sandbox.go)."""

from __future__ import annotations

from pathlib import Path

from cri import types as t
from nodeagent import labels as L
from nodeagent.model import Pod

_PROTOCOLS = {"TCP": t.Protocol.TCP, "UDP": t.Protocol.UDP, "SCTP": t.Protocol.SCTP}


def log_directory(pod_logs_dir: Path, pod: Pod) -> Path:
    """``<podLogsDir>/<namespace>_<name>_<uid>``: the kubelet's pod log directory."""
    return pod_logs_dir / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.uid}"


def pod_labels(pod: Pod, node_name: str) -> dict[str, str]:
    return {
        **pod.metadata.labels,
        L.POD_NAME: pod.metadata.name,
        L.POD_NAMESPACE: pod.metadata.namespace,
        L.POD_UID: pod.uid,
        L.MANAGED_BY: node_name,
    }


def host_dns() -> t.DNSConfig:
    """The node's resolv.conf: what dnsPolicy Default (and ClusterFirst without cluster DNS) gets."""
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    try:
        text = Path("/etc/resolv.conf").read_text()
    except OSError:
        return t.DNSConfig()
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith(("#", ";")):
            continue
        if fields[0] == "nameserver" and len(fields) > 1:
            servers.append(fields[1])
        elif fields[0] in ("search", "domain"):
            searches = fields[1:]
        elif fields[0] == "options":
            options.extend(fields[1:])
    return t.DNSConfig(servers=servers, searches=searches, options=options)


def sandbox_config(pod: Pod, attempt: int, pod_logs_dir: Path, node_name: str) -> t.PodSandboxConfig:
    spec = pod.spec
    ports = [
        t.PortMapping(protocol=_PROTOCOLS[p.protocol], container_port=p.container_port, host_port=p.host_port,
                      host_ip=p.host_ip)
        for c in pod.all_containers()
        for p in c.ports
        if p.host_port
    ]
    network = t.NamespaceMode.NODE if spec.host_network else t.NamespaceMode.POD
    return t.PodSandboxConfig(
        metadata=t.PodSandboxMetadata(name=pod.metadata.name, uid=pod.uid, namespace=pod.metadata.namespace,
                                      attempt=attempt),
        # runc cannot set a hostname without its own UTS namespace: host-network pods get none.
        hostname="" if spec.host_network else (spec.hostname or pod.metadata.name)[:63],
        log_directory=str(log_directory(pod_logs_dir, pod)),
        dns_config=host_dns(),
        port_mappings=ports,
        labels=pod_labels(pod, node_name),
        annotations=dict(pod.metadata.annotations),
        linux=t.LinuxPodSandboxConfig(
            security_context=t.LinuxSandboxSecurityContext(
                namespace_options=t.NamespaceOption(network=network, pid=t.NamespaceMode.CONTAINER,
                                                    ipc=t.NamespaceMode.POD),
                seccomp=t.SecurityProfile(profile_type=t.ProfileType.RuntimeDefault),
            ),
        ),
    )
