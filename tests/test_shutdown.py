"""Graceful node shutdown (issue 17 §4) on the real containerd, through the request file that
``nodeagent shutdown`` writes where there is no systemd-logind (these machines): the normal pod
is stopped before the critical one, each within its group's budget; both end Failed with the
kubelet's reason and message; the node reports not ready and refuses new pods; a cancellation
makes it ready again."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from cri import types as t
from nodeagent import labels as L
from nodeagent.cli import main as cli
from plugins.shutdown import ShutdownConfig, group_of
from plugins.shutdown.config import PriorityGracePeriod
from tests.agent_helpers import pod_manifest, running_agent, runtime_objects, wait_for

pytestmark = pytest.mark.anyio

# Ignores SIGTERM: only the group's budget (the grace period given to StopContainer) ends it.
STUBBORN = "trap '' TERM; while true; do sleep 1; done"
GRACEFUL = "trap 'exit 0' TERM; while true; do sleep 1; done"


def test_groups_as_the_kubelet_builds_them() -> None:
    groups = ShutdownConfig(shutdownGracePeriod="30s", shutdownGracePeriodCriticalPods="10s").groups()
    assert [(g.priority, g.shutdown_grace_period_seconds) for g in groups] == [(0, 20), (2_000_000_000, 10)]
    assert ShutdownConfig().groups() == []
    with pytest.raises(ValueError, match="Cannot specify both shutdownGracePeriodByPodPriority and "
                                         "shutdownGracePeriod at the same time"):
        ShutdownConfig(shutdownGracePeriod="30s",
                       shutdownGracePeriodByPodPriority=[{"priority": 1, "shutdownGracePeriodSeconds": 5}])
    with pytest.raises(ValueError, match="must be <= shutdownGracePeriod"):
        ShutdownConfig(shutdownGracePeriod="5s", shutdownGracePeriodCriticalPods="10s")
    by_priority = [PriorityGracePeriod(priority=p, shutdown_grace_period_seconds=s)
                   for p, s in ((100, 5), (1000, 10), (10000, 20))]

    from nodeagent.model import Pod

    def pod(priority: int) -> Pod:
        return Pod.model_validate({"metadata": {"name": "p"}, "spec": {"priority": priority,
                                                                        "containers": [{"name": "c", "image": "i"}]}})

    assert [group_of(pod(p), by_priority) for p in (0, 100, 999, 1000, 50000)] == [0, 0, 0, 1, 2]


async def _finished_at(client: Any, node: str, name: str) -> float:
    _, containers = await runtime_objects(client, node)
    [found] = [c for c in containers if c.labels.get(L.POD_NAME) == f"{name}-{node}"]
    status = await client.container_status(found.id)
    assert status.state == t.ContainerState.CONTAINER_EXITED
    return status.finished_at / 1e9


@pytest.mark.containerd
async def test_shutdown_stops_the_normal_pod_before_the_critical_one(containerd: Any, tmp_path: Path) -> None:
    shutdown = {"shutdownGracePeriod": "12s", "shutdownGracePeriodCriticalPods": "4s"}
    async with running_agent(containerd, tmp_path, plugins={"shutdown": shutdown}) as env:
        # Static pods, with priorities as the API server would have set them.
        env.write("normal.yaml", pod_manifest("normal", STUBBORN, terminationGracePeriodSeconds=30, priority=0))
        env.write("critical.yaml", pod_manifest("critical", GRACEFUL, terminationGracePeriodSeconds=30,
                                                priority=2_000_001_000, priorityClassName="system-node-critical"))
        await env.wait_seen_running("normal")
        await env.wait_seen_running("critical")
        stage = env.agent.pipeline.stages["shutdown"]  # type: ignore[union-attr]
        assert stage.trigger == "request-file"

        # What an init script runs before the power-off: `nodeagent shutdown`.
        config_file = tmp_path / "config.json"
        config_file.write_text(json.dumps({"rootDir": str(env.config.root_dir),
                                           "plugins": {"shutdown": shutdown}}))
        requested = time.time()
        assert await anyio.to_thread.run_sync(cli, ["shutdown", "--config", str(config_file)]) == 0

        await wait_for(lambda: _ended(stage), 60, "the shutdown to finish")
        normal_done = await _finished_at(env.client, env.node, "normal")
        critical_done = await _finished_at(env.client, env.node, "critical")
        # The normal group first, and only its budget (8 s) long: the stubborn pod is killed then.
        assert critical_done > normal_done, "the critical pod is stopped after the normal one"
        assert 6 <= normal_done - requested <= 8 + 5, normal_done - requested
        assert critical_done - normal_done <= 4 + 3
        for name in ("normal", "critical"):
            status = env.status_of(name)
            assert (status["phase"], status["reason"]) == ("Failed", "Terminated")
            assert status["message"] == "Pod was terminated in response to imminent node shutdown."
            [target] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
            assert (target["status"], target["reason"]) == ("True", "TerminationByKubelet")
        ready = env.agent.conditions.get("Ready")
        assert ready is not None and not ready.status and ready.message == "node is shutting down"
        state = json.loads((env.config.root_dir / "graceful_node_shutdown_state").read_text())
        assert state["endTime"] >= state["startTime"] > "0001"

        # No new pod while shutting down.
        env.write("late.yaml", pod_manifest("late"))
        late = await wait_for(lambda: _phase(env, "late", "Failed"), 30, "the late pod rejected")
        assert (late["reason"], late["message"]) == ("NodeShutdown", "Pod was rejected: Pod was rejected as the node "
                                                                     "is shutting down.")
        # Cancelled: ready again, admitting again.
        assert await anyio.to_thread.run_sync(cli, ["shutdown", "--cancel", "--config", str(config_file)]) == 0
        await wait_for(lambda: _ready(env), 10, "Ready again after the cancellation")
        env.write("after.yaml", pod_manifest("after"))
        await env.wait_seen_running("after")


async def _ended(stage: Any) -> bool:
    return stage.ended_at is not None


async def _ready(env: Any) -> bool:
    ready = env.agent.conditions.get("Ready")
    return ready is not None and ready.status


async def _phase(env: Any, name: str, phase: str) -> dict[str, Any] | None:
    status = env.status_of(name)
    return status if status.get("phase") == phase else None


@pytest.fixture
def fake_logind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A private bus with tests/fake_logind.py on it as org.freedesktop.login1; the agent's
    tools (gdbus, systemd-inhibit) reach it through DBUS_SYSTEM_BUS_ADDRESS."""
    import shutil
    import subprocess

    # dbus-daemon, python3-dbus and python3-gi: devenv/packages.py installs them.
    bus = Path(tempfile.mkdtemp(prefix="na-bus-", dir="/tmp"))
    address = f"unix:path={bus / 'bus'}"
    daemon = subprocess.Popen(["dbus-daemon", "--session", f"--address={address}", "--nofork", "--nopidfile"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record = bus / "record"
    env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": address}
    deadline = time.monotonic() + 10
    while not (bus / "bus").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    fake = subprocess.Popen(["/usr/bin/python3", str(Path(__file__).with_name("fake_logind.py")), str(record)],
                            stdin=subprocess.PIPE, env=env, text=True)
    while "ready" not in (record.read_text() if record.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", address)
    try:
        yield fake, record
    finally:
        for proc in (fake, daemon):
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(bus, ignore_errors=True)


@pytest.mark.containerd
async def test_logind_prepare_for_shutdown_with_the_inhibitor_lock(containerd: Any, tmp_path: Path,
                                                                   fake_logind: Any) -> None:
    fake, record = fake_logind
    shutdown = {"shutdownGracePeriod": "6s", "shutdownGracePeriodCriticalPods": "2s", "shutdownTrigger": "logind"}
    async with running_agent(containerd, tmp_path, plugins={"shutdown": shutdown}) as env:
        env.write("web.yaml", pod_manifest("web", GRACEFUL, terminationGracePeriodSeconds=30))
        await env.wait_seen_running("web")
        stage = env.agent.pipeline.stages["shutdown"]  # type: ignore[union-attr]
        await wait_for(lambda: _true(stage.inhibited), 10, "the delay inhibitor lock taken")
        assert "inhibit|shutdown|kubelet|Kubelet needs time to handle node shutdown|delay" in record.read_text()

        fake.stdin.write("true\n")
        fake.stdin.flush()
        await wait_for(lambda: _ended(stage), 30, "the shutdown to finish")
        status = env.status_of("web")
        assert (status["phase"], status["reason"]) == ("Failed", "Terminated")
        # The pods are down: the lock goes, and logind may power off.
        await wait_for(lambda: _true("released" in record.read_text()), 10, "the lock released")
        assert not stage.inhibited

        fake.stdin.write("false\n")  # cancelled: ready again, the lock taken again
        fake.stdin.flush()
        await wait_for(lambda: _ready(env), 10, "Ready again after the cancellation")
        await wait_for(lambda: _true(record.read_text().count("inhibit|") == 2), 10, "the lock taken again")


async def _true(value: bool) -> bool:
    return value
