"""Host port conflicts between a pod and the pods already admitted (the kubelet's NodePorts
predicate, via the scheduler's HostPortInfo): a pod bound to a node by its creator, or a static
pod, must not ask for a (hostIP, protocol, hostPort) another pod holds. 0.0.0.0 (or no hostIP)
conflicts with every address.
"""

from __future__ import annotations

from collections.abc import Iterable

from nodeagent.model import Pod

REASON = "NodePorts"
MESSAGE = "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
ALL_ADDRESSES = "0.0.0.0"

HostPort = tuple[str, str, int]
"""(hostIP, protocol, hostPort)"""


def host_ports(pod: Pod) -> list[HostPort]:
    """The host ports a pod holds for its whole life: its containers' and its sidecars' (not a
    regular init container's). Under hostNetwork every container port is a host port (the API
    defaults hostPort to containerPort there)."""
    containers = [c for c in pod.spec.init_containers if c.restart_policy == "Always"] + pod.spec.containers
    found: list[HostPort] = []
    for c in containers:
        for p in c.ports:
            port = p.host_port or (p.container_port if pod.spec.host_network else 0)
            if port > 0:
                found.append((p.host_ip or ALL_ADDRESSES, p.protocol, port))
    return found


def conflicts(pod: Pod, admitted: Iterable[Pod]) -> bool:
    in_use = {hp for other in admitted for hp in host_ports(other)}
    for ip, protocol, port in host_ports(pod):
        for used_ip, used_protocol, used_port in in_use:
            if (used_protocol, used_port) != (protocol, port):
                continue
            if ALL_ADDRESSES in (ip, used_ip) or ip == used_ip:
                return True
    return False
