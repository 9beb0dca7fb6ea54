"""The kubelet's read-only port (readOnlyPort): plain HTTP with no authentication, serving only
/healthz, /pods, /stats and /metrics -- and nothing at all unless configured (0, the default)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from nodeagent.config import AgentConfig
from tests.agent_helpers import pod_manifest, running_agent, wait_for

pytestmark = pytest.mark.anyio


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def get(url: str, method: str = "GET") -> tuple[int, str]:
    return await anyio.to_thread.run_sync(_get, url, method)


def test_the_read_only_port_is_off_unless_configured() -> None:
    assert AgentConfig().kubelet.read_only_port == 0


async def test_the_read_only_port_serves_pods_stats_and_metrics_and_nothing_else(
        containerd: Any, tmp_path: Path) -> None:
    port = _free_port()
    async with running_agent(containerd, tmp_path, readOnlyPort=port, address="127.0.0.1") as env:
        base = f"http://127.0.0.1:{port}"
        env.write("p.yaml", pod_manifest("p"))
        await env.wait_running("p")
        assert await get(f"{base}/healthz") == (200, "ok")

        status, body = await get(f"{base}/pods")
        assert status == 200
        pods = json.loads(body)
        assert pods["kind"] == "PodList" and [p["metadata"]["name"] for p in pods["items"]] == [f"p-{env.config.node_name}"]

        async def summary() -> dict[str, Any] | None:
            status, body = await get(f"{base}/stats/summary")
            return json.loads(body) if status == 200 else None

        found = await wait_for(summary, 60, "a stats summary on the read-only port")
        assert found["node"]["nodeName"] == env.config.node_name
        status, body = await get(f"{base}/metrics/cadvisor")
        assert status == 200 and "container_cpu_usage_seconds_total" in body

        # What the kubelet keeps to its authenticated port, or does not serve there at all.
        assert (await get(f"{base}/configz"))[0] == 404
        for path in ("/exec/default/p/c?command=id", "/containerLogs/default/p/c", "/run/default/p/c",
                     "/portForward/default/p", "/debug/pprof/"):
            assert await get(f"{base}{path}") == (405, "Debug endpoints are disabled.\n"), path
        assert (await get(f"{base}/pods", "POST"))[0] == 405

        text = env.agent.metrics.render()
        assert 'method="GET",path="pods",server_type="readonly"} 1' in text
        assert text.count("# TYPE kubelet_http_requests_total counter") == 1
