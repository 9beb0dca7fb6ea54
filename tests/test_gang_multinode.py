"""Gangs across nodes (issue 7, multi-node part), against the real control plane.

Four nodeagent instances run in this pytest process, each with its own node name, its own
credentials (CN=system:node:<name>, under NodeRestriction) and its **own private containerd**
(devenv.Containerd, its own state, socket and pod subnet): a node's containers are in its own
runtime only, so the evidence of what started where comes from that node's CRI, as on real
machines. One API server, one etcd. The pods are pinned with spec.nodeName (the default scheduler
knows nothing of gangs; the node barrier is what is under test).

Evidence that nothing started early, nothing started twice and nothing started partially comes
from each node's runtime: a monitor lists every node's sandboxes and containers every 100 ms for
the whole test and asks ContainerStatus for each container's start time, so a container that
ran even briefly is caught, whatever the agents' own bookkeeping says.

The node credentials cannot read other nodes' pods nor PodGroups (the Node authorizer lets a
node list/watch only pods bound to it): the module applies plugins/gang/deploy/rbac.yaml (a
read-only ClusterRole for the group system:nodes) and the coscheduling PodGroup CRD
(plugins/gang/deploy/coscheduling-podgroup-crd.yaml), as an operator would.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Pod as ApiPod

from controlplane import ControlPlane
from cri import CriError, RuntimeClient
from devenv import Containerd, build_images, ensure_packages
from devenv.images import BUSYBOX_IMAGE
from nodeagent import labels as L
from nodeagent.agent import Agent
from nodeagent.apiclient import make_api_client
from nodeagent.config import AgentConfig
from tests.agent_helpers import wait_for
from tests.test_cluster_node import cluster_config, delete_node, kubectl

pytestmark = pytest.mark.anyio

DEPLOY = Path(__file__).resolve().parent.parent / "plugins" / "gang" / "deploy"
NODES = 4
GRACEFUL = "trap 'exit 0' TERM; while true; do sleep 1; done"
PREPARED = "gang.nodeagent.io/Prepared"
COMMITTED = "gang.nodeagent.io/StartCommitted"
GANG_PLUGIN = {"graceSeconds": 5, "recheckSeconds": 2}


# --- the machines: one private containerd per node ----------------------------------------------


@pytest.fixture(scope="module")
def runtimes(request: pytest.FixtureRequest) -> Iterator[list[Containerd]]:
    """Four private containerds, started one after another so that each derives a pod subnet no
    running one uses. Deleted at the end unless a test failed (then their logs stay)."""
    ensure_packages()
    archives = build_images()
    envs: list[Containerd] = []
    try:
        for _ in range(NODES):
            env = Containerd(Path(tempfile.mkdtemp(prefix="na-gang-", dir="/tmp")))
            env.start()
            env.import_images(archives)
            envs.append(env)
        assert len({e.subnet for e in envs}) == NODES, [e.subnet for e in envs]
        yield envs
    finally:
        for env in envs:
            env.stop()
            if request.session.testsfailed == 0:
                shutil.rmtree(env.base_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def gang_cluster(control_plane: ControlPlane) -> ControlPlane:
    """The operator's part: the read-only ClusterRole for nodes and the coscheduling CRD."""
    control_plane.kubectl("apply", "-f", str(DEPLOY / "rbac.yaml"), "-f",
                          str(DEPLOY / "coscheduling-podgroup-crd.yaml"))
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                          "crd/podgroups.scheduling.x-k8s.io")
    return control_plane


# --- what each node's runtime showed -------------------------------------------------------------


@dataclass
class Seen:
    pod: str
    container: str
    attempt: int
    created_at: int
    started_at: int


@dataclass
class Node:
    """One node under test: its containerd, its agent (which the test may kill and restart) and
    a monitor of its runtime."""

    name: str
    runtime: Containerd
    config: AgentConfig
    client: RuntimeClient
    agent: Agent | None = None
    scope: anyio.CancelScope | None = None
    stopped: anyio.Event = field(default_factory=anyio.Event)
    containers: dict[str, Seen] = field(default_factory=dict)
    sandboxes: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Sandbox id -> (pod name, created_at ns): every sandbox the runtime showed."""

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        self.stopped = anyio.Event()
        self.agent = await tg.start(self._run)

    async def _run(self, *, task_status: anyio.abc.TaskStatus[Agent]) -> None:
        agent = Agent(self.config, verbose=False)
        try:
            with anyio.CancelScope() as self.scope:
                await agent.run(task_status=task_status)
        finally:
            self.stopped.set()

    async def kill(self) -> None:
        """Stop the agent as a crash would for its pods: nothing is torn down."""
        assert self.scope is not None
        self.scope.cancel()
        await self.stopped.wait()
        self.agent = None

    async def poll(self) -> None:
        try:
            sandboxes = await self.client.list_pod_sandbox()
            containers = await self.client.list_containers()
        except CriError:
            return
        for s in sandboxes:
            if s.labels.get(L.MANAGED_BY) == self.name:
                self.sandboxes.setdefault(s.id, (s.labels.get(L.POD_NAME, ""), s.created_at))
        for c in containers:
            if c.labels.get(L.MANAGED_BY) != self.name:
                continue
            known = self.containers.get(c.id)
            if known is not None and known.started_at:
                continue
            try:
                status = await self.client.container_status(c.id)
            except CriError:
                continue
            self.containers[c.id] = Seen(c.labels.get(L.POD_NAME, ""), c.labels.get(L.CONTAINER_NAME, ""),
                                         c.metadata.attempt, status.created_at, status.started_at)

    def seen(self, pods: Sequence[str]) -> list[Seen]:
        return [s for s in self.containers.values() if s.pod in pods]

    def started(self, pods: Sequence[str]) -> list[Seen]:
        """What started: a waiting member's containers are created ahead, not started."""
        return [s for s in self.seen(pods) if s.started_at]

    def sandboxes_of(self, pods: Sequence[str]) -> list[tuple[str, int]]:
        return [v for v in self.sandboxes.values() if v[0] in pods]

    async def live_sandboxes(self, pods: Sequence[str]) -> list[str]:
        return [s.id for s in await self.client.list_pod_sandbox()
                if s.labels.get(L.MANAGED_BY) == self.name and s.labels.get(L.POD_NAME) in pods]

    def metrics(self) -> str:
        assert self.agent is not None and self.agent.endpoint_port
        url = f"http://127.0.0.1:{self.agent.endpoint_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.read().decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gang:
    """The cluster under test: four nodes, an admin API client, and the gang's pods."""

    cp: ControlPlane
    nodes: list[Node]
    api: Any
    tg: anyio.abc.TaskGroup
    name: str = field(default_factory=lambda: f"g{uuid.uuid4().hex[:6]}")

    def node_of(self, pod: str) -> Node:
        return next(n for n in self.nodes if any(p == pod for p, _ in n.sandboxes.values())
                    or any(s.pod == pod for s in n.containers.values()))

    def member(self, index: int, node: int, min_member: int | None = None, *, timeout: float = 120,
               podgroup: str | None = None, cpu: str | None = None) -> dict[str, Any]:
        name = f"{self.name}-{index}"
        metadata: dict[str, Any] = {"name": name, "namespace": "default", "labels": {"test-gang": self.name}}
        if podgroup is not None:
            metadata["labels"]["scheduling.x-k8s.io/pod-group"] = podgroup
        else:
            metadata["annotations"] = {"gang.nodeagent.io/name": self.name,
                                       "gang.nodeagent.io/min-member": str(min_member),
                                       "gang.nodeagent.io/timeout-seconds": str(timeout)}
        container: dict[str, Any] = {"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", GRACEFUL]}
        if cpu is not None:
            container["resources"] = {"requests": {"cpu": cpu}}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                "spec": {"nodeName": self.nodes[node].name, "automountServiceAccountToken": False,
                         "terminationGracePeriodSeconds": 2, "containers": [container]}}

    async def create(self, *manifests: dict[str, Any]) -> None:
        for manifest in manifests:
            await self.api.create(codecs.from_dict(manifest))

    async def delete(self, name: str) -> None:
        await self.api.delete(ApiPod, name, namespace="default")

    async def pods(self) -> dict[str, dict[str, Any]]:
        return {p.metadata.name: p.to_dict() async for p in
                self.api.list(ApiPod, namespace="default", labels={"test-gang": self.name})}

    async def wait_pods(self, names: Sequence[str], check: Any, timeout: float, what: str) -> dict[str, dict[str, Any]]:
        async def done() -> dict[str, dict[str, Any]] | None:
            pods = await self.pods()
            return pods if all(n in pods and check(pods[n]) for n in names) else None

        found: dict[str, dict[str, Any]] = await wait_for(done, timeout, what)
        return found

    def names(self, *indexes: int) -> list[str]:
        return [f"{self.name}-{i}" for i in indexes]


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


def voted(pod: dict[str, Any]) -> bool:
    vote = condition(pod, PREPARED)
    return vote.get("status") == "True" and vote.get("reason") == "WaitingForGang"


def running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def failed(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Failed"


@asynccontextmanager
async def cluster(cp: ControlPlane, runtimes: list[Containerd], tmp_path: Path) -> AsyncIterator[Gang]:
    """Four agents of the cluster, each on its own containerd; on exit every pod of the test is
    force-deleted, each node's runtime must end empty, the agents stop and the Nodes go."""
    nodes: list[Node] = []
    api = make_api_client(cp.kubeconfig_admin)
    try:
        async with anyio.create_task_group() as tg:
            for i, runtime in enumerate(runtimes):
                config = await cluster_config(cp, runtime, tmp_path / f"n{i}", healthz_port=_free_port(),
                                              plugins={"gang": GANG_PLUGIN})
                client = RuntimeClient(runtime.endpoint)
                await client.connect()
                node = Node(config.node_name, runtime, config, client)
                nodes.append(node)
                await node.start(tg)

            async def monitor() -> None:
                while True:
                    for node in nodes:
                        await node.poll()
                    await anyio.sleep(0.1)

            tg.start_soon(monitor)
            gang = Gang(cp, nodes, api, tg)
            try:
                yield gang
            finally:
                with anyio.CancelScope(shield=True):
                    await _cleanup(gang, tg)
    finally:
        with anyio.CancelScope(shield=True):
            for node in nodes:
                await node.client.close()
                await delete_node(cp, node.name)
            await api.close()


async def _cleanup(gang: Gang, tg: anyio.abc.TaskGroup) -> None:
    try:
        for node in gang.nodes:
            if node.agent is None:
                await node.start(tg)  # a test that failed while a node was down
        for name in await gang.pods():
            try:
                await gang.api.delete(ApiPod, name, namespace="default", grace_period=0)
            except ApiError:
                pass

        async def empty() -> bool:
            for node in gang.nodes:
                if await node.live_sandboxes(list(await _all_pod_names(node))):
                    return False
            return True

        await wait_for(empty, 60, "every node's runtime empty")
    finally:
        tg.cancel_scope.cancel()


async def _all_pod_names(node: Node) -> set[str]:
    return {s.labels.get(L.POD_NAME, "") for s in await node.client.list_pod_sandbox()
            if s.labels.get(L.MANAGED_BY) == node.name}


def started_once(nodes: Sequence[Node], pods: Sequence[str]) -> list[Seen]:
    """Each pod's one container, started once: one container instance ever, attempt 0, and one
    sandbox ever, on the pod's own node only (runtime evidence)."""
    seen = [s for n in nodes for s in n.seen(pods)]
    per_pod: dict[str, list[Seen]] = {}
    for s in seen:
        per_pod.setdefault(s.pod, []).append(s)
    assert sorted(per_pod) == sorted(pods), f"containers seen for {sorted(per_pod)}, want {sorted(pods)}"
    for pod, instances in per_pod.items():
        assert len(instances) == 1 and instances[0].attempt == 0, f"{pod} started more than once: {instances}"
        assert instances[0].started_at, f"{pod}: created but never started"
    for pod in pods:
        owners = [n.name for n in nodes if n.sandboxes_of([pod])]
        assert len(owners) == 1 and len(next(n for n in nodes if n.name == owners[0]).sandboxes_of([pod])) == 1, \
            f"{pod}: sandboxes on {owners}"
    return seen


def series(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


# --- the tests -------------------------------------------------------------------------------------


async def test_eight_members_on_four_nodes_commit_only_when_all_are_prepared(
        gang_cluster: ControlPlane, runtimes: list[Containerd], tmp_path: Path) -> None:
    async with cluster(gang_cluster, runtimes, tmp_path) as g:
        # A coscheduling PodGroup carries minMember; the agents read it from the API.
        podgroup = f"pg-{g.name}"
        await kubectl(g.cp, "apply", "-f", "-", input=(
            "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\n"
            f"metadata: {{name: {podgroup}, namespace: default}}\nspec: {{minMember: 8, scheduleTimeoutSeconds: 120}}\n"))
        members = g.names(*range(8))
        await g.create(*(g.member(i, i % NODES, podgroup=podgroup) for i in range(7)))
        await g.wait_pods(members[:7], voted, 90, "seven members prepared (their votes in the API)")
        # Seven votes of eight: no decision, and no container anywhere, for a while.
        await anyio.sleep(1.5)
        pods = await g.pods()
        assert not any(condition(p, COMMITTED) for p in pods.values()), "decided without every vote"
        for name in members[:7]:
            status = pods[name]["status"]
            assert status["phase"] == "Pending"
            assert status["containerStatuses"][0]["state"]["waiting"]["reason"] == "WaitingForGang"
            assert condition(pods[name], "PodReadyToStartContainers")["status"] == "True"
        assert not [s for n in g.nodes for s in n.started(members)], "a member started before the gang committed"
        # Created ahead on each member's node, so that the commit has only to start them.
        assert {s.pod for n in g.nodes for s in n.seen(members)} == set(members[:7])

        await g.create(g.member(7, 3, podgroup=podgroup))
        pods = await g.wait_pods(members, running, 90, "all eight members Running")
        await anyio.sleep(0.3)
        for node in g.nodes:
            await node.poll()

        # Runtime evidence: every member started once, and none before the last member's
        # sandbox (the end of its preparation) existed.
        seen = started_once(g.nodes, members)
        last_prepared = g.nodes[3].sandboxes_of([members[7]])[0][1]
        early = [s for s in seen if s.started_at < last_prepared]
        assert not early, f"started before the last member was prepared: {early}"
        starts = [s.started_at / 1e9 for s in seen]
        skew = max(starts) - min(starts)
        print(f"start skew across the 8 members: {skew:.3f}s")

        # The one decision record is on the coordinator: the smallest name, on node 0.
        records = {n: condition(p, COMMITTED) for n, p in pods.items() if condition(p, COMMITTED)}
        assert list(records) == [members[0]], records
        assert records[members[0]]["status"] == "True" and records[members[0]]["reason"] == "GangQuorumReached"
        assert "8 of 8 members prepared" in records[members[0]]["message"]
        for name in members[1:]:
            assert condition(pods[name], PREPARED)["reason"] == "GangCommitted"

        # /metrics of each node: one commit followed each, one decision written by the
        # coordinator's node, no partial start.
        for i, node in enumerate(g.nodes):
            text = await anyio.to_thread.run_sync(node.metrics)
            assert series(text, 'nodeagent_gang_decisions_total{result="commit"}') == 1
            assert series(text, 'nodeagent_gang_coordinator_decisions_total{result="commit"}') == (1 if i == 0 else 0)
            assert series(text, "nodeagent_gang_partial_start_total") == 0
            assert series(text, 'nodeagent_gang_barrier_wait_seconds_count{result="commit"}') == 2
            assert 'nodeagent_gang_device_hold_seconds_count{result="commit"} 2' in text


async def test_a_node_that_rejects_its_member_aborts_the_gang_on_every_node(
        gang_cluster: ControlPlane, runtimes: list[Containerd], tmp_path: Path) -> None:
    async with cluster(gang_cluster, runtimes, tmp_path) as g:
        members = g.names(*range(8))
        # Member 5 (node 1) asks for 100 CPUs: node 1 cannot admit it.
        await g.create(*(g.member(i, i % NODES, 8, cpu="100" if i == 5 else None) for i in range(8)))
        pods = await g.wait_pods(members, failed, 90, "every member Failed")
        culprit = pods[members[5]]["status"]
        assert culprit["reason"] == "GangLocalAdmissionFailed" and "OutOfcpu" in culprit["message"], culprit
        for name in members:
            if name == members[5]:
                continue
            status = pods[name]["status"]
            assert status["reason"] == "GangAborted", (name, status)
            assert f"member default/{members[5]} failed on node {g.nodes[1].name}" in status["message"], status
        record = condition(pods[members[0]], COMMITTED)
        assert record["status"] == "False" and record["reason"] == "GangAborted"

        # Released on every node: no sandbox left, and no container of any member ever started.
        async def released() -> bool:
            return all([not await n.live_sandboxes(members) for n in g.nodes])

        await wait_for(released, 60, "every member's sandbox removed on every node")
        await anyio.sleep(0.3)
        for node in g.nodes:
            await node.poll()
            assert not node.started(members), f"{node.name} ran a container of an aborted gang"
        text = await anyio.to_thread.run_sync(g.nodes[0].metrics)
        assert series(text, 'nodeagent_gang_coordinator_decisions_total{result="abort"}') == 1
        assert series(text, "nodeagent_gang_partial_start_total") == 0
        assert series(text, "nodeagent_gang_release_seconds_count") >= 1


async def test_the_coordinator_deleted_before_deciding_is_replaced_by_the_next_member(
        gang_cluster: ControlPlane, runtimes: list[Containerd], tmp_path: Path) -> None:
    async with cluster(gang_cluster, runtimes, tmp_path) as g:
        members = g.names(0, 1, 2, 3)
        await g.create(g.member(0, 0, 3), g.member(1, 1, 3))
        await g.wait_pods(members[:2], voted, 60, "two of three members prepared")
        # The coordinator (member 0) goes before it could decide; the gang is not aborted.
        await g.delete(members[0])

        async def gone() -> bool:
            return members[0] not in await g.pods()

        await wait_for(gone, 60, "the coordinator's pod deleted")
        await g.create(g.member(2, 2, 3), g.member(3, 3, 3))
        pods = await g.wait_pods(members[1:], running, 90, "the three remaining members Running")
        record = condition(pods[members[1]], COMMITTED)
        assert record["status"] == "True" and record["reason"] == "GangQuorumReached", record
        assert [n for n, p in pods.items() if condition(p, COMMITTED)] == [members[1]]
        for node in g.nodes:
            await node.poll()
        started_once(g.nodes, members[1:])
        assert not g.nodes[0].started([members[0]]), "the deleted coordinator ran a container"


async def test_an_agent_killed_mid_barrier_and_restarted_starts_nothing_twice_and_nothing_partially(
        gang_cluster: ControlPlane, runtimes: list[Containerd], tmp_path: Path) -> None:
    async with cluster(gang_cluster, runtimes, tmp_path) as g:
        members = g.names(0, 1, 2, 3)
        await g.create(*(g.member(i, i, 4) for i in range(3)))
        await g.wait_pods(members[:3], voted, 60, "three of four members prepared")
        # The coordinator's agent (node 0) dies mid-barrier; its pod keeps its sandbox.
        await g.nodes[0].kill()
        await g.create(g.member(3, 3, 4))
        await g.wait_pods(members, voted, 60, "all four votes in the API")
        await anyio.sleep(2)  # nobody else may decide, nothing may start
        pods = await g.pods()
        assert not any(condition(p, COMMITTED) for p in pods.values())
        for node in g.nodes[1:]:
            await node.poll()
        assert not [s for n in g.nodes for s in n.started(members)], "started while the coordinator was down"

        restarted = time.time_ns()
        await g.nodes[0].start(g.tg)
        pods = await g.wait_pods(members, running, 90, "all four members Running after the restart")
        await anyio.sleep(0.3)
        for node in g.nodes:
            await node.poll()
        seen = started_once(g.nodes, members)
        assert all(s.started_at > restarted for s in seen), "a member started before the coordinator came back"
        assert condition(pods[members[0]], COMMITTED)["reason"] == "GangQuorumReached"


async def test_a_gang_that_never_assembles_across_nodes_times_out_and_releases(
        gang_cluster: ControlPlane, runtimes: list[Containerd], tmp_path: Path) -> None:
    async with cluster(gang_cluster, runtimes, tmp_path) as g:
        members = g.names(0, 1)  # of 3
        await g.create(g.member(0, 0, 3, timeout=4), g.member(1, 2, 3, timeout=4))
        pods = await g.wait_pods(members, failed, 60, "both members Failed")
        for name in members:
            status = pods[name]["status"]
            assert status["reason"] == "GangAdmissionTimeout", status
            assert "2 of 3 members were prepared" in status["message"], status
        assert condition(pods[members[0]], COMMITTED)["reason"] == "GangAdmissionTimeout"

        async def released() -> bool:
            return all([not await n.live_sandboxes(members) for n in g.nodes])

        await wait_for(released, 60, "sandboxes removed")
        assert not [s for n in g.nodes for s in n.started(members)]


async def test_members_outlive_a_dead_coordinator_by_their_votes_expiry_plus_grace(
        gang_cluster: ControlPlane, runtimes: list[Containerd], tmp_path: Path) -> None:
    """Bounded holding without a coordinator: its agent is down, so nobody decides; each other
    member releases itself after its vote's expiry plus grace, and the coordinator, back, aborts."""
    async with cluster(gang_cluster, runtimes, tmp_path) as g:
        members = g.names(0, 1, 2)
        await g.nodes[0].kill()
        await g.create(*(g.member(i, i, 3, timeout=4) for i in range(3)))
        pods = await g.wait_pods(members[1:], failed, 60, "the two members with agents released themselves")
        for name in members[1:]:
            status = pods[name]["status"]
            assert status["reason"] == "GangAdmissionTimeout", status
            assert "released without starting" in status["message"], status
            assert condition(pods[name], PREPARED)["status"] == "False"
        assert not any(condition(p, COMMITTED) for p in pods.values()), "decided without a coordinator"

        # The coordinator's agent comes back: the other members failed before any commit, so it
        # aborts, and its member never starts either.
        await g.nodes[0].start(g.tg)
        pods = await g.wait_pods(members[:1], failed, 60, "the coordinator's member Failed")
        assert pods[members[0]]["status"]["reason"] == "GangAborted"
        assert f"member default/{members[1]}" in pods[members[0]]["status"]["message"] \
            or f"member default/{members[2]}" in pods[members[0]]["status"]["message"]

        async def released() -> bool:
            return all([not await n.live_sandboxes(members) for n in g.nodes])

        await wait_for(released, 60, "sandboxes removed")
        assert not [s for n in g.nodes for s in n.started(members)]
