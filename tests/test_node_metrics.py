"""The kubelet API's stats and metrics endpoints and their real consumers (issue 17 §2, §6),
against the real control plane and containerd: the Summary API, /metrics, /metrics/resource,
/metrics/cadvisor and /metrics/probes through the server's authentication and
SubjectAccessReview authorization, every text endpoint parsed with prometheus_client's own
parser; then metrics-server v0.8.0 behind the aggregation layer, and ``kubectl top`` showing
the busy pod's CPU and memory."""

from __future__ import annotations

import functools
import json
import socket
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane import ControlPlane
from controlplane.metricsserver import MetricsServer
from tests.agent_helpers import wait_for
from tests.test_cluster_node import cluster_config, kubectl, ready_cluster_node
from tests.test_cluster_pods import api_pod, create_pod, wait_running
from tests.test_kubelet_server import _client_context, _get

pytestmark = pytest.mark.anyio

# 20 MB held in tmpfs (charged to the container's memory: kubectl top shows Mi), and busy part
# of the time: CPU shows, and the 2-core machine keeps a core for the rest.
BUSY = ("head -c 20000000 /dev/zero > /dev/shm/held; "
        "while :; do i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; sleep 0.05; done")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def families(text: str) -> dict[str, Any]:
    """Every family of a Prometheus text, by name, through prometheus_client's parser (which
    raises on a line it cannot read)."""
    return {f.name: f for f in text_string_to_metric_families(text)}


async def test_kubelet_port_serves_stats_and_metrics_and_metrics_server_reads_them(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    cp = control_plane
    port = _free_port()
    config = await cluster_config(cp, containerd, tmp_path, enable_server=True, address="127.0.0.1", port=port,
                                  volume_stats_agg_period=1.0)
    node = config.node_name
    name = f"busy-{uuid.uuid4().hex[:6]}"
    manifest = api_pod(name, node, BUSY)
    container = manifest["spec"]["containers"][0]
    container["readinessProbe"] = {"exec": {"command": ["true"]}, "periodSeconds": 1}
    container["volumeMounts"] = [{"name": "cache", "mountPath": "/cache"}]
    manifest["spec"]["volumes"] = [{"name": "cache", "emptyDir": {}}]
    # A client the cluster trusts as an administrator: x509 of the cluster CA, then a
    # SubjectAccessReview on nodes/stats, nodes/metrics, nodes/configz.
    admin = await anyio.to_thread.run_sync(
        lambda: cp.pki.issue("node-metrics-admin", "node-metrics-admin", orgs=("system:masters",), client=True))
    context = _client_context(admin.cert, admin.key)

    async def text(path: str, method: str = "GET") -> str:
        status, head, body = await _get(port, path, context, method)
        assert status == 200, (path, status, body[:300])
        return body.decode()

    async with ready_cluster_node(cp, containerd, config) as env:
        await create_pod(cp, manifest)
        uid = (await wait_running(cp, name))["metadata"]["uid"]

        # Unauthenticated: the kubelet's 401, for these endpoints too.
        status, _, body = await _get(port, "/stats/summary", _client_context())
        assert (status, body) == (401, b"Unauthorized")

        async def measured() -> dict[str, Any] | None:
            doc = json.loads(await text("/stats/summary"))
            pods = [p for p in doc["pods"] if p["podRef"]["uid"] == uid]
            if not pods or not pods[0]["containers"] or not pods[0]["containers"][0]["cpu"].get("usageNanoCores"):
                return None
            return doc

        summary = await wait_for(measured, 60, "the busy pod in the Summary API with a CPU rate")
        assert summary["node"]["nodeName"] == node and summary["node"]["memory"]["workingSetBytes"] > 0
        assert summary["node"]["fs"]["capacityBytes"] > 0 and summary["node"]["rlimit"]["maxpid"] > 0
        [pod] = [p for p in summary["pods"] if p["podRef"]["uid"] == uid]
        assert pod["containers"][0]["name"] == "main" and pod["containers"][0]["cpu"]["usageNanoCores"] > 0
        assert any(v["name"] == "cache" for v in pod["volume"])
        for method in ("GET", "POST"):
            small = json.loads(await text("/stats/summary?only_cpu_and_memory=true", method))
            assert set(small["node"]) <= {"nodeName", "startTime", "cpu", "memory"}

        resource = families(await text("/metrics/resource"))
        assert resource["resource_scrape_error"].samples[0].value == 0
        labels = {"container": "main", "pod": name, "namespace": "default"}
        assert [s for s in resource["container_cpu_usage_seconds"].samples if s.labels == labels][0].value > 0

        cadvisor = families(await text("/metrics/cadvisor"))
        [cpu] = [s for s in cadvisor["container_cpu_usage_seconds"].samples
                 if s.labels.get("container") == "main" and s.labels.get("pod") == name]
        assert cpu.value > 0 and cpu.labels["namespace"] == "default" and cpu.labels["cpu"] == "total"
        assert cpu.labels["name"] and cpu.labels["id"].endswith(cpu.labels["name"]) and cpu.labels["image"]
        assert any(s.labels["id"] == "/" for s in cadvisor["container_memory_working_set_bytes"].samples)
        assert cadvisor["machine_cpu_cores"].samples[0].value >= 1

        async def probed() -> Any:
            probes = families(await text("/metrics/probes"))
            found = [s for s in probes.get("prober_probe", ()).samples if s.labels.get("pod_uid") == uid] \
                if "prober_probe" in probes else []
            return probes if found else None

        probes = await wait_for(probed, 30, "prober_probe_total for the pod")
        [total] = [s for s in probes["prober_probe"].samples if s.labels.get("pod_uid") == uid]
        assert total.labels == {"probe_type": "Readiness", "result": "successful", "container": "main", "pod": name,
                                "namespace": "default", "pod_uid": uid} and total.value >= 1
        assert any(s.labels.get("pod") == name for s in probes["prober_probe_duration_seconds"].samples)

        metrics = families(await text("/metrics"))
        running = {s.labels["container_state"]: s.value for s in metrics["kubelet_running_containers"].samples}
        assert running["running"] >= 1
        operations = {s.labels["operation_type"]: s.value for s in metrics["kubelet_runtime_operations"].samples}
        assert operations["create_container"] >= 1 and operations["list_container_stats"] >= 1
        assert "kubelet_runtime_operations_duration_seconds" in metrics
        assert metrics["kubelet_pod_start_duration_seconds"].samples
        assert any(s.labels.get("operation_type") == "create"
                   for s in metrics["kubelet_pod_worker_duration_seconds"].samples)
        assert "kubelet_evictions" in metrics and "kubelet_image_garbage_collected" in metrics
        assert [s.labels for s in metrics["kubelet_node_name"].samples] == [{"node": node}]
        assert metrics["nodeagent_stats_samples"].samples[0].value > 0
        # client-go's rest_client_requests_total, as the kubelet has it: the node's own requests
        # to the API server (the pod watch's GETs, the status PATCHes), by code, host and method.
        requests = {(s.labels["method"], s.labels["code"]): s.value
                    for s in metrics["rest_client_requests"].samples
                    if s.name == "rest_client_requests_total" and s.labels["host"] == cp.server_url.removeprefix("https://")}
        assert requests.get(("GET", "200"), 0) >= 1 and requests.get(("PATCH", "200"), 0) >= 1, requests

        configz = json.loads(await text("/configz"))["kubeletconfig"]
        assert configz["nodeName"] == node and configz["evictionHard"]["memory.available"] == "100Mi"
        assert configz["imageGCHighThresholdPercent"] == 85 and configz["shutdownGracePeriod"] == "0s"

        # The real consumer: metrics-server scrapes /metrics/resource through the aggregator.
        server = MetricsServer(cp, tmp_path / "metrics-server")
        try:
            await anyio.to_thread.run_sync(server.start)

            async def top(*args: str) -> list[str] | None:
                proc = await kubectl(cp, "top", *args, "--no-headers", check=False)
                lines = [line.split() for line in proc.stdout.splitlines() if line.strip()]
                return lines[0] if proc.returncode == 0 and lines else None

            node_row = await wait_for(lambda: top("node", node), 120, f"kubectl top node {node}")
            assert node_row[0] == node and _millicores(node_row[1]) > 0 and _bytes(node_row[3]) > 0
            pod_row = await wait_for(lambda: top("pod", name, "-n", "default"), 120, f"kubectl top pod {name}")
            assert pod_row[0] == name and _millicores(pod_row[1]) > 0 and _bytes(pod_row[2]) > 0
        finally:
            await anyio.to_thread.run_sync(functools.partial(server.stop))
        _ = env


def _millicores(text: str) -> int:
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def _bytes(text: str) -> int:
    for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30)):
        if text.endswith(suffix):
            return int(text[:-2]) * factor
    return int(text)
