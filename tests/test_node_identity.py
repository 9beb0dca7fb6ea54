"""Who the node is (issue 16 §4): its addresses as the kubelet chooses them, its labels, and the
Node it registers (or, with registerNode: false, only adopts) on the real API server."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from controlplane import ControlPlane
from nodeagent import nodeip
from nodeagent.agent import node_allocatable
from nodeagent.cluster.node import node_labels
from nodeagent.config import AgentConfig
from tests.agent_helpers import wait_for
from tests.test_cluster_node import cluster_agent, cluster_config, condition, delete_node, get_json, kubectl

A = ipaddress.ip_address


def test_node_ip_is_parsed_as_the_kubelet_parses_it() -> None:
    assert nodeip.node_ips("10.0.0.5", "n") == ["10.0.0.5"]
    assert nodeip.node_ips("10.0.0.5,fd00::5", "n") == ["10.0.0.5", "fd00::5"]
    for text, message in (("ten", 'could not parse --node-ip value "ten"'),
                          ("10.0.0.5,10.0.0.6", "must contain either a single IP or a dual-stack pair of IPs"),
                          ("::,10.0.0.6", "dual-stack --node-ip values may not contain '0.0.0.0' or '::'")):
        with pytest.raises(nodeip.NodeIPError, match=message):
            nodeip.parse_node_ip(text)


def test_the_node_ip_is_detected_as_the_kubelet_detects_it() -> None:
    local = {A("127.0.0.1"), A("10.0.0.7"), A("192.0.2.9"), A("fd00::7"), A("fe80::1")}

    def detect(name: str = "n", override: str = "", prefer: int = 4, dns: list[str] | None = None,
               route: dict[int, str] | None = None) -> str:
        return str(nodeip.detect(name, override, prefer=prefer, lookup=lambda _: [A(a) for a in dns or []],
                                 local=lambda: local,
                                 default_route=lambda v: A((route or {})[v]) if v in (route or {}) else None))

    # 1. a hostname-override that is an address
    assert detect(override="10.9.9.9", dns=["10.0.0.7"]) == "10.9.9.9"
    # 2. the name's DNS addresses that are this host's, not loopback or link-local, IPv4 first
    assert detect(dns=["127.0.0.1", "fe80::1", "203.0.113.1", "fd00::7", "10.0.0.7"]) == "10.0.0.7"
    assert detect(dns=["10.0.0.7", "fd00::7"], prefer=6) == "fd00::7"
    # 3. the default route's interface
    assert detect(dns=["203.0.113.1"], route={4: "192.0.2.9", 6: "fd00::7"}) == "192.0.2.9"
    assert detect(route={6: "fd00::7"}) == "fd00::7"
    with pytest.raises(nodeip.NodeIPError, match="^can't get ip address of node n. error:"):
        detect()
    # --node-ip :: asks for detection, preferring IPv6
    assert nodeip.parse_node_ip("::")[0].is_unspecified


def test_the_kubelets_default_labels_and_node_labels_over_them() -> None:
    labels = node_labels("n1", {"tier": "gpu", "kubernetes.io/arch": "arm64"})
    assert labels["kubernetes.io/hostname"] == "n1" and labels["beta.kubernetes.io/os"] == "linux"
    assert labels["kubernetes.io/arch"] == "arm64" and labels["beta.kubernetes.io/arch"] != "arm64"
    assert labels["tier"] == "gpu"


def test_pods_per_core_caps_the_pods_capacity(tmp_path: Path) -> None:
    import os

    cores = os.cpu_count() or 1
    assert node_allocatable(AgentConfig(root_dir=tmp_path, max_pods=110, pods_per_core=1))["pods"] == min(110, cores)
    assert node_allocatable(AgentConfig(root_dir=tmp_path, max_pods=3))["pods"] == 3



@pytest.mark.anyio
async def test_the_node_carries_its_identity(control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    """Dual-stack InternalIPs, --node-labels beside the kubelet's, providerID, the attach-detach
    annotation, registerWithTaints."""
    config = await cluster_config(control_plane, containerd, tmp_path, node_ip="127.0.0.1,::1",
                                  node_labels={"tier": "gpu", "node.kubernetes.io/pool": "a"},
                                  provider_id="nodeagent://test/1",
                                  register_with_taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
    node = config.node_name
    try:
        async with cluster_agent(control_plane, containerd, config):
            async def registered() -> dict[str, Any] | None:
                obj = await get_json(control_plane, "node", node)
                return obj if obj and obj.get("status", {}).get("addresses") else None

            obj = await wait_for(registered, 60, f"node {node} with its status")
            labels = obj["metadata"]["labels"]
            assert labels["tier"] == "gpu" and labels["node.kubernetes.io/pool"] == "a"
            for key in ("beta.kubernetes.io/os", "beta.kubernetes.io/arch", "kubernetes.io/os", "kubernetes.io/arch"):
                assert key in labels
            assert obj["metadata"]["annotations"]["volumes.kubernetes.io/controller-managed-attach-detach"] == "true"
            assert obj["spec"]["providerID"] == "nodeagent://test/1"
            assert {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"} in obj["spec"]["taints"]
            assert obj["status"]["addresses"] == [{"type": "InternalIP", "address": "127.0.0.1"},
                                                  {"type": "InternalIP", "address": "::1"},
                                                  {"type": "Hostname", "address": node}]
    finally:
        await delete_node(control_plane, node)


@pytest.mark.anyio
async def test_register_node_false_adopts_a_node_someone_else_creates(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    config = await cluster_config(control_plane, containerd, tmp_path, register_node=False)
    node = config.node_name
    try:
        async with cluster_agent(control_plane, containerd, config):
            await anyio.sleep(4)  # several registration attempts' worth
            assert await get_json(control_plane, "node", node) is None
            await kubectl(control_plane, "create", "-f", "-", input=json.dumps(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))

            async def ready() -> bool:
                return condition(await get_json(control_plane, "node", node), "Ready").get("status") == "True"

            await wait_for(ready, 60, f"node {node} Ready once created by someone else")
    finally:
        await delete_node(control_plane, node)
