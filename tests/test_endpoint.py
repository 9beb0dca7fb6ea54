"""The local endpoint and the CLI commands that read a running agent."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent_helpers import pod_manifest, running_agent, wait_for

pytestmark = pytest.mark.anyio


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _head(port: int, path: str) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="HEAD")
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, r.read().decode()


async def _cli(*args: str) -> str:
    result = await anyio.run_process([sys.executable, "-m", "nodeagent", *args], check=False)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


async def test_healthz_metrics_pods_and_trace(containerd: Any, tmp_path: Path) -> None:
    port = _free_port()
    async with running_agent(containerd, tmp_path, healthz_port=port) as env:
        env.write("web.yaml", pod_manifest("web"))
        await env.wait_running("web")
        await wait_for(lambda: _running_metric(port), what="kubelet_running_pods 1")

        status, body = await anyio.to_thread.run_sync(_get, port, "/healthz")
        assert (status, body) == (200, "ok\n")
        # HEAD as the kubelet answers it (the node e2e suite's health check): GET's status, no body
        status, body = await anyio.to_thread.run_sync(_head, port, "/healthz")
        assert (status, body) == (200, "")
        _, metrics = await anyio.to_thread.run_sync(_get, port, "/metrics")
        assert "kubelet_pod_start_duration_seconds_count 1" in metrics
        assert 'nodeagent_stage_duration_seconds_count{stage="runtime",phase="prepare"}' in metrics
        assert "kubelet_pleg_relist_duration_seconds_count" in metrics
        assert 'nodeagent_bus_queue_depth{subscriber="trace"}' in metrics
        assert 'nodeagent_events_total{kind="SandboxStarted"} 1' in metrics

        table = await _cli("pods", "--healthz-port", str(port))
        line = next(row for row in table.splitlines() if f"web-{env.node}" in row)
        assert "Running" in line and "default" in line

        trace = await _cli("trace", f"default/web-{env.node}", "--healthz-port", str(port))
        kinds = [tok for row in trace.splitlines() for tok in row.split()[3:7] if tok[:1].isupper() and tok.isalpha()]
        for expected in ("PodSpecObserved", "PodAdmitted", "ImagePulled", "SandboxStarted", "ContainerCreated",
                         "PodStarted"):
            assert expected in kinds, trace
        assert kinds.index("PodAdmitted") < kinds.index("SandboxStarted") < kinds.index("PodStarted")

        status, _ = await anyio.to_thread.run_sync(_get, port, "/trace/nobody")
        assert status == 404


async def _running_metric(port: int) -> bool:
    _, metrics = await anyio.to_thread.run_sync(_get, port, "/metrics")
    return "kubelet_running_pods 1\n" in metrics


async def test_cli_reports_a_missing_agent_clearly() -> None:
    port = _free_port()
    result = await anyio.run_process([sys.executable, "-m", "nodeagent", "pods", "--healthz-port", str(port)],
                                     check=False)
    assert result.returncode != 0
    assert f"no agent answers at http://127.0.0.1:{port}/pods" in result.stderr.decode()


def _refused_configuration(tmp_path: Path, text: str) -> str:
    """``nodeagent plugins`` with a configuration it must refuse (exit 2); its stderr."""
    config = tmp_path / "agent.yaml"
    config.write_text(text)
    result = subprocess.run([sys.executable, "-m", "nodeagent", "plugins", "--config", str(config)],
                            capture_output=True, text=True)
    assert result.returncode == 2, result
    return result.stderr


async def test_bad_configuration_is_reported_with_the_field(tmp_path: Path) -> None:
    stderr = _refused_configuration(tmp_path, "maxPods: 3\nstaticPodPth: /x\n")
    assert "staticPodPth: Extra inputs are not permitted" in stderr
    # A bad value is refused by the kubelet's validation, in its words (nodeagent/kubeletconfig).
    stderr = _refused_configuration(tmp_path, "maxPods: -3\n")
    assert "invalid configuration: maxPods (--max-pods) -3 must not be a negative number" in stderr


def test_register_with_taints_are_validated_as_the_kubelet_does(tmp_path: Path) -> None:
    stderr = _refused_configuration(tmp_path, "registerWithTaints:\n- {key: dedicated, value: ok, effect: NoSchedule}\n"
                                              "- {key: 'bad key', effect: NoSchedule}\n- {key: gpu, effect: Sometimes}\n")
    assert "registerWithTaints.1.key: Value error, invalid taint key 'bad key'" in stderr
    assert "registerWithTaints.2.effect: Input should be 'NoSchedule', 'PreferNoSchedule' or 'NoExecute'" in stderr
    assert "registerWithTaints.0" not in stderr


def test_the_image_verification_allowlist_is_validated_at_load(tmp_path: Path) -> None:
    stderr = _refused_configuration(tmp_path, "imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\n"
                                              "preloadedImagesVerificationAllowlist: [registry.example.com/*/x]\n")
    assert ("preloadedImagesVerificationAllowlist: Value error, not a valid wildcard pattern, only patterns "
            "ending with '/*' are allowed: registry.example.com/*/x") in stderr


async def test_malformed_or_failing_requests_never_end_the_local_endpoint() -> None:
    """A request target urllib cannot split, a handler that raises, a request cut short: each
    gets its answer (or a closed connection); the endpoint keeps serving."""
    from nodeagent.endpoint import Routes, serve

    contained: list[str] = []

    def broken_trace(key: str) -> list[dict[str, Any]]:
        raise RuntimeError("trace bug")

    routes = Routes(healthz=lambda: (True, "ok\n"), metrics=lambda: "", pods=lambda: [], trace=broken_trace,
                    plugins=lambda: {})

    async def raw(port: int, data: bytes) -> bytes:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(data)
            chunks = b""
            with anyio.move_on_after(5):
                try:
                    while True:
                        chunks += await stream.receive()
                except anyio.EndOfStream:
                    pass
            return chunks

    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, routes, "127.0.0.1", 0, lambda task, exc: contained.append(task))
        assert (await raw(port, b"GET http://[ HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        assert (await raw(port, b"GET /trace/x HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 500 ")
        assert contained == ["endpoint"]
        assert (await raw(port, b"\xff\xfe\x00 garbage\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        assert (await raw(port, b"GET /healthz HTTP/1.1\r\n\r\n")).endswith(b"ok\n")
        tg.cancel_scope.cancel()


async def test_idle_sockets_cannot_lock_out_the_local_endpoint() -> None:
    """More idle connections than the cap: the oldest are closed to make room, and a real
    request is still answered (the kubelet API's accept loop, nodeagent/listener.py)."""
    from nodeagent.endpoint import LOCAL_MAX_CONNECTIONS, Routes, serve

    routes = Routes(healthz=lambda: (True, "ok\n"), metrics=lambda: "", pods=lambda: [], trace=lambda key: [],
                    plugins=lambda: {})
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, routes, "127.0.0.1", 0)
        idle = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(LOCAL_MAX_CONNECTIONS + 50)]
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(b"GET /healthz HTTP/1.1\r\n\r\n")
            answer = b""
            with anyio.fail_after(10):
                try:
                    while True:
                        answer += await stream.receive()
                except anyio.EndOfStream:
                    pass
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok\n")
        for s in idle:
            await s.aclose()
        tg.cancel_scope.cancel()
