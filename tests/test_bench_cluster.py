"""benchmarks/cluster_start.py without a cluster: the kubelet it runs is a kubeadm-like node kept
to a cgroup root of its own, the Deployment lands on the one node, and the table's ratio is the
median of the per-round ratios. (The benchmark itself runs real nodes: benchmarks/RESULTS.md.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import cluster_start


class _FakeControlPlane:
    ca_file = Path("/ca.crt")

    def node_kubeconfig(self, name: str) -> Path:
        return Path(f"/kubeconfigs/{name}")


def _node(system: str, tmp_path: Path) -> cluster_start.NodeProcess:
    return cluster_start.NodeProcess(system, _FakeControlPlane(), "unix:///run/x.sock", tmp_path)  # type: ignore[arg-type]


def test_the_kubelet_is_a_kubeadm_like_node_with_a_cgroup_root_of_its_own(tmp_path: Path) -> None:
    node = _node("kubelet", tmp_path)
    argv = node.argv()
    assert f"--kubeconfig=/kubeconfigs/{node.name}" in argv and f"--hostname-override={node.name}" in argv
    config = json.loads((node.dir / "kubelet-config.json").read_text())
    assert config["authentication"]["webhook"]["enabled"] is True
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["cgroupRoot"] == node.cgroup_root != "/"
    assert config["containerRuntimeEndpoint"] == "unix:///run/x.sock"


def test_nodeagent_joins_with_the_node_kubeconfig(tmp_path: Path) -> None:
    node = _node("nodeagent", tmp_path)
    argv = node.argv()
    assert argv[1:4] == ["-m", "nodeagent", "run"]
    assert argv[argv.index("--kubeconfig") + 1] == f"/kubeconfigs/{node.name}"
    assert argv[argv.index("--node-name") + 1] == node.name


def test_the_deployment_is_pinned_to_the_node_and_pulls_nothing() -> None:
    spec = cluster_start.deployment("bench", "na-1", 30)["spec"]
    assert spec["replicas"] == 30
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "na-1"}
    assert pod["containers"][0]["imagePullPolicy"] == "Never"


def _rec(system: str, k: int, start: float, per_pod: list[float]) -> dict[str, Any]:
    return {"system": system, "n": 2, "round": k, "start_seconds": start, "create_to_running": per_pod,
            "bound_to_running": per_pod, "teardown_seconds": 1.0, "cpu_ms_per_start": 10.0,
            "cpu_ms_per_stop": 5.0, "rss_mib": 80.0, "api_requests_per_pod": 3.0}


def test_the_ratio_is_the_median_of_the_per_round_ratios() -> None:
    results = [_rec("nodeagent", 1, 2.0, [1.0, 2.0]), _rec("kubelet", 1, 4.0, [2.0, 4.0]),
               _rec("nodeagent", 2, 3.0, [1.0, 3.0]), _rec("kubelet", 2, 3.0, [1.0, 3.0]),
               _rec("nodeagent", 3, 1.0, [1.0, 1.0]), _rec("kubelet", 3, 4.0, [1.0, 4.0])]
    meta = {"date": "d", "commit": "c", "command": "x", "cores": 2, "load_before": "0", "load_after": "0",
            "seconds": 1.0, "rounds": 3}
    text = cluster_start.render(results, meta)
    # start: 2/4, 3/3, 1/4 -> ratios 0.5, 1.0, 0.25 -> median 0.5; medians 2.00 and 4.00
    assert "| all N Running s | 2.00 | 4.00 | 0.50× |" in text
    assert "| API requests / pod | 3.0 | 3.0 | 1.00× |" in text
