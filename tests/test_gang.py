"""Gang-aware admission on one node, through the whole agent, against the real containerd.

The evidence that no member started before its gang committed comes from the runtime: a monitor
lists the runtime's containers every 50 ms for the whole test and asks ContainerStatus for the
start time of each one it sees, so a container that ran even briefly is caught, whatever the
agent's own bookkeeping says.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from cri import CriError, RuntimeClient
from cri import types as t
from devenv.images import BUSYBOX_IMAGE
from nodeagent import labels as L
from plugins.gang import GangStage
from tests.agent_helpers import (
    AgentEnv,
    pod_manifest,
    running_agent,
    runtime_objects,
    wait_for,
)

pytestmark = pytest.mark.anyio


def member(name: str, gang: str, min_member: int, timeout: float = 120.0, **spec: Any) -> dict[str, Any]:
    manifest = pod_manifest(name, **spec)
    manifest["metadata"]["annotations"] = {
        "gang.nodeagent.io/name": gang,
        "gang.nodeagent.io/min-member": str(min_member),
        "gang.nodeagent.io/timeout-seconds": str(timeout),
    }
    return manifest


@dataclass
class Seen:
    pod: str
    container: str
    created_at: int
    started_at: int


@dataclass
class RuntimeMonitor:
    """Every container of the node the runtime showed during the test, with its start time."""

    client: RuntimeClient
    node: str
    seen: dict[str, Seen] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            await self.poll()
            await anyio.sleep(0.05)

    async def poll(self) -> None:
        try:
            containers = [c for c in await self.client.list_containers() if c.labels.get(L.MANAGED_BY) == self.node]
        except CriError:
            return
        for c in containers:
            known = self.seen.get(c.id)
            if known is not None and known.started_at:
                continue
            try:
                status = await self.client.container_status(c.id)
            except CriError:
                continue  # removed meanwhile; the next list decides
            self.seen[c.id] = Seen(c.labels.get(L.POD_NAME, ""), c.labels.get(L.CONTAINER_NAME, ""),
                                   status.created_at, status.started_at)

    def of(self, env: AgentEnv, names: Iterable[str]) -> list[Seen]:
        pods = {f"{n}-{env.node}" for n in names}
        return [s for s in self.seen.values() if s.pod in pods]

    def started(self, env: AgentEnv, names: Iterable[str]) -> list[Seen]:
        """Containers the runtime showed started (a member's are created ahead while it waits)."""
        return [s for s in self.of(env, names) if s.started_at]


@asynccontextmanager
async def monitored(env: AgentEnv) -> AsyncIterator[RuntimeMonitor]:
    monitor = RuntimeMonitor(env.client, env.node)
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        try:
            yield monitor
        finally:
            tg.cancel_scope.cancel()


def gang_stage(env: AgentEnv) -> GangStage:
    assert env.agent.pipeline is not None
    stage = env.agent.pipeline.stages["gang"]
    assert isinstance(stage, GangStage)
    return stage


async def sandboxes_of(env: AgentEnv, names: Iterable[str]) -> list[t.PodSandbox]:
    pods = {f"{n}-{env.node}" for n in names}
    sandboxes, _ = await runtime_objects(env.client, env.node)
    return [s for s in sandboxes if s.labels.get(L.POD_NAME) in pods]


async def containers_of(env: AgentEnv, names: Iterable[str]) -> list[t.Container]:
    pods = {f"{n}-{env.node}" for n in names}
    _, containers = await runtime_objects(env.client, env.node)
    return [c for c in containers if c.labels.get(L.POD_NAME) in pods]


def waiting_reasons(env: AgentEnv, name: str) -> set[str]:
    statuses = env.status_of(name).get("containerStatuses", [])
    return {cs.get("state", {}).get("waiting", {}).get("reason", "") for cs in statuses}


def story(env: AgentEnv, name: str) -> list[dict[str, Any]]:
    """The pod's facts, in order, from the agent's trace."""
    return env.agent.trace.chain(env.uid_of(name) or "")


async def test_four_members_start_together_others_are_not_held_and_latecomers_start_at_once(
        containerd: Any, tmp_path: Path) -> None:
    # A long recheck: waiting members must be woken by the commit, not find it by polling.
    async with running_agent(containerd, tmp_path, plugins={"gang": {"recheckSeconds": 60}}) as env, \
            monitored(env) as monitor:
        gang = ["w1", "w2", "w3", "w4"]
        for name in gang[:3]:
            spec: dict[str, Any] = {}
            if name == "w2":  # init containers are held too
                spec["initContainers"] = [{"name": "init", "image": BUSYBOX_IMAGE, "command": ["true"]}]
            env.write(f"{name}.yaml", member(name, "train", 4, **spec))

        async def three_waiting() -> bool:
            return all(waiting_reasons(env, n) == {"WaitingForGang"} for n in gang[:3])

        await wait_for(three_waiting, 60, "three members showing WaitingForGang")
        # Phase one is done for them (a ready sandbox each) and phase two has not begun.
        ready = [s for s in await sandboxes_of(env, gang[:3]) if s.state == t.PodSandboxState.SANDBOX_READY]
        assert len(ready) == 3
        # Their first containers are created ahead, none started: the commit only starts them.
        expected = {(f"w1-{env.node}", "main"), (f"w2-{env.node}", "init"), (f"w3-{env.node}", "main")}

        async def created_ahead() -> bool:
            await monitor.poll()
            return {(s.pod, s.container) for s in monitor.of(env, gang)} == expected

        await wait_for(created_ahead, 30, f"containers created ahead: {expected}")
        assert monitor.started(env, gang) == []
        assert env.status_of("w1")["phase"] == "Pending"
        conditions = {c["type"]: c for c in env.status_of("w1")["conditions"]}
        assert conditions["gang.nodeagent.io/Prepared"]["status"] == "True"

        # A pod of no gang is admitted and started while the gang waits.
        env.write("solo.yaml", pod_manifest("solo"))
        await env.wait_running("solo", 60)
        assert monitor.started(env, gang) == []
        assert all(waiting_reasons(env, n) == {"WaitingForGang"} for n in gang[:3])

        env.write("w4.yaml", member("w4", "train", 4))

        async def main_running(name: str) -> list[t.Container]:
            # Not just any container: a member's init container runs (briefly) first.
            return [c for c in await env.running_containers(name) if c.labels.get(L.CONTAINER_NAME) == "main"]

        for name in gang:
            await wait_for(lambda name=name: main_running(name), 60, f"{name}'s main container running")

        # Runtime evidence: no container of any member started before the last member was
        # prepared (its sandbox, the last step of preparation, was created).
        last_prepared = max(s.created_at for s in await sandboxes_of(env, gang))
        await monitor.poll()
        started = monitor.of(env, gang)
        assert {s.pod for s in started} == {f"{n}-{env.node}" for n in gang}
        assert any(s.container == "init" for s in started)
        early = [s for s in started if not s.started_at or s.started_at < last_prepared]
        assert not early, f"containers started before the last member was prepared: {early}"

        stage = gang_stage(env)
        assert stage.metrics.decisions["commit"] == 1
        assert stage.metrics.partial_starts == 0
        committed = [e for n in gang for e in story(env, n) if e["kind"] == "GangCommitted"]
        assert len(committed) == 4 and {e["prepared"] for e in committed} == {4}
        released = [e["at"] for e in committed]
        assert max(released) - min(released) < 5, "members were not released together"
        assert {c["type"]: c["status"] for c in env.status_of("w1")["conditions"]}["gang.nodeagent.io/StartCommitted"] == "True"

        # A member created after the commit starts at once: it never waits at the barrier.
        env.write("w5.yaml", member("w5", "train", 4))
        await env.wait_running("w5", 60)
        late = story(env, "w5")
        assert not [e for e in late if e["kind"] == "PodWaiting" and e["reason"] == "WaitingForGang"]
        assert [e["joined_after_commit"] for e in late if e["kind"] == "GangCommitted"] == [True]
        assert "nodeagent_gang_decisions_total{result=\"commit\"} 1" in stage.metrics.render()


async def test_a_member_that_cannot_be_admitted_aborts_the_gang_and_nothing_starts(
        containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env, monitored(env) as monitor:
        gang = ["m1", "m2", "m3", "m4"]
        for name in gang:
            container = {"resources": {"requests": {"cpu": "100"}}} if name == "m3" else {}
            env.write(f"{name}.yaml", member(name, "infer", 4, container=container))

        async def all_failed() -> bool:
            return all(env.status_of(n).get("phase") == "Failed" for n in gang)

        await wait_for(all_failed, 60, "every member failed")
        culprit = env.status_of("m3")
        assert culprit["reason"] == "GangLocalAdmissionFailed"
        assert "OutOfcpu" in culprit["message"]
        for name in ("m1", "m2", "m4"):
            assert env.status_of(name)["reason"] == "GangAborted", env.status_of(name)
            assert "m3" in env.status_of(name)["message"]

        # Everything is released: no sandbox left, no reservation held (the gang is left in
        # unreserve, which follows the sandbox's removal) ...
        stage = gang_stage(env)
        uids = [env.uid_of(n) for n in gang]
        assert all(uids)

        async def released() -> bool:
            return not await sandboxes_of(env, gang) and all(stage.gangs.member_of(uid) is None for uid in uids)

        await wait_for(released, 60, "the members' sandboxes removed and their reservations given back")
        admitted = {p.uid for p in env.agent.dispatcher._services.admission.admitted}  # type: ignore[union-attr]
        assert not admitted & set(uids)
        # ... no container of any member ever started, and none is left.
        await anyio.sleep(0.2)
        assert monitor.started(env, gang) == []
        assert await containers_of(env, gang) == []
        assert stage.metrics.decisions["abort"] == 1
        assert stage.metrics.partial_starts == 0


async def test_timeout_fails_and_releases_a_gang_that_never_assembles(containerd: Any, tmp_path: Path) -> None:
    port = _free_port()
    async with running_agent(containerd, tmp_path, healthz_port=port) as env, monitored(env) as monitor:
        present = ["t1", "t2", "t3"]  # of 4
        for name in present:
            env.write(f"{name}.yaml", member(name, "short", 4, timeout=3))

        async def all_failed() -> bool:
            return all(env.status_of(n).get("phase") == "Failed" for n in present)

        await wait_for(all_failed, 60, "every member failed")
        for name in present:
            status = env.status_of(name)
            assert status["reason"] == "GangAdmissionTimeout", status
            assert "3 of 4" in status["message"] or "of 4 members" in status["message"]

        # Bounded, not early: the gang held for its timeout, counted from the first reservation.
        admitted = min(e["at"] for n in present for e in story(env, n) if e["kind"] == "PodAdmitted")
        aborted = min(e["at"] for n in present for e in story(env, n) if e["kind"] == "GangAborted")
        assert aborted - admitted >= 2.5

        stage = gang_stage(env)
        uids = [env.uid_of(n) for n in present]
        assert all(uids)

        # Released = sandbox removed and the member gone from its gang (unreserve, which follows
        # the removal and is when the release histogram observes).
        async def released() -> bool:
            return not await sandboxes_of(env, present) and all(stage.gangs.member_of(uid) is None for uid in uids)

        await wait_for(released, 60, "the members' sandboxes removed and their reservations given back")
        # Their containers were created ahead while they waited; none started, none is left.
        assert {s.container for s in monitor.of(env, present)} == {"main"}
        assert monitor.started(env, present) == []
        assert await containers_of(env, present) == []
        assert stage.metrics.decisions["timeout"] == 1
        assert stage.metrics.partial_starts == 0
        # The stage's series on the agent's /metrics.
        metrics = await anyio.to_thread.run_sync(_metrics, port)
        assert 'nodeagent_gang_decisions_total{result="timeout"} 1' in metrics
        assert "nodeagent_gang_partial_start_total 0" in metrics
        assert 'nodeagent_gang_device_hold_seconds_count{result="timeout"} 3' in metrics
        assert 'nodeagent_gang_barrier_wait_seconds_count{result="timeout"} 3' in metrics
        assert "nodeagent_gang_release_seconds_count 3" in metrics
        assert "nodeagent_gang_waiting_members 0" in metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


async def test_a_kubernetes_scheduling_group_with_its_podgroup_beside_the_pods(containerd: Any, tmp_path: Path) -> None:
    groups = tmp_path / "podgroups"
    groups.mkdir()
    (groups / "pg.yaml").write_text(
        "apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: pair, namespace: default}\n"
        "spec: {schedulingPolicy: {gang: {minCount: 2}}}\n")
    async with running_agent(containerd, tmp_path, plugins={"gang": {"podGroupPath": str(groups)}}) as env, \
            monitored(env) as monitor:
        env.write("a.yaml", pod_manifest("a", schedulingGroup={"podGroupName": "pair"}))

        async def waiting() -> bool:
            return waiting_reasons(env, "a") == {"WaitingForGang"}

        await wait_for(waiting, 60, "the first member waiting for its PodGroup's minCount")
        conditions = {c["type"] for c in env.status_of("a")["conditions"]}
        assert "nodeagent.io/UnhonouredFields" not in conditions  # spec.schedulingGroup is honoured
        assert monitor.started(env, ["a"]) == []
        env.write("b.yaml", pod_manifest("b", schedulingGroup={"podGroupName": "pair"}))
        await env.wait_running("a", 60)
        await env.wait_running("b", 60)
        assert gang_stage(env).metrics.decisions["commit"] == 1


# The stage contract for gang runs in tests/test_contract.py (TestGangContract).
