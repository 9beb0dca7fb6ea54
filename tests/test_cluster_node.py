"""Cluster mode, the node itself (issue 5 §2): the Node registers and becomes Ready with its
capacity, allocatable and nodeInfo; its Lease is renewed; a restarted agent keeps it Ready.

Against the real control plane (`control_plane`) and containerd (`containerd`). Also: unit
tests of the pure parts (merge patches, the token bucket, the node's resources).
"""

from __future__ import annotations

import functools
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from controlplane import ControlPlane
from devenv.images import BUSYBOX_IMAGE
from nodeagent.clock import ManualClock
from nodeagent.cluster.mergepatch import api_status, merge_diff, status_patch
from nodeagent.cluster.node import KUBELET_VERSION, resources
from nodeagent.cluster.ratelimit import TokenBucket
from nodeagent.config import AgentConfig
from nodeagent.stages import NodeInfo
from tests.agent_helpers import AgentEnv, make_config, running_agent, wait_for

pytestmark = pytest.mark.anyio

# --- helpers shared with test_cluster_pods -------------------------------------------------


async def kubectl(cp: ControlPlane, *args: str, check: bool = True,
                  input: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl (admin) in a thread: the agent under test runs in this event loop."""
    return await anyio.to_thread.run_sync(functools.partial(cp.kubectl, *args, check=check, input=input))


async def get_json(cp: ControlPlane, *args: str) -> Any:
    """``kubectl get ... -o json``; None when it is not found."""
    proc = await kubectl(cp, "get", *args, "-o", "json", check=False)
    if proc.returncode != 0:
        if "NotFound" in proc.stderr or "not found" in proc.stderr:
            return None
        raise AssertionError(f"kubectl get {' '.join(args)}: {proc.stderr}")
    return json.loads(proc.stdout)


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


async def cluster_config(cp: ControlPlane, containerd: Any, base: Path, **overrides: Any) -> AgentConfig:
    node = overrides.pop("node", None) or f"c{uuid.uuid4().hex[:8]}"
    kubeconfig = await anyio.to_thread.run_sync(cp.node_kubeconfig, node)
    settings: dict[str, Any] = {
        "kubeconfig": kubeconfig,
        "enable_server": False,  # the kubelet API has its own tests; leave port 10250 alone
        "node_lease_duration_seconds": 8,  # renewed every 2 s
        "node_status_update_frequency": 1.0,
    }
    return make_config(base, containerd.endpoint, node=node, **{**settings, **overrides})


@asynccontextmanager
async def cluster_agent(cp: ControlPlane, containerd: Any, config: AgentConfig) -> AsyncIterator[AgentEnv]:
    """An agent of the cluster; on exit it is stopped with its pods left running (as after
    SIGTERM), so tests decide what to clean up (see `cleanup_node`)."""
    async with running_agent(containerd, config.root_dir.parent, cleanup=False, config=config) as env:
        yield env


async def wait_node_ready(cp: ControlPlane, node: str, timeout: float = 60.0) -> dict[str, Any]:
    """Ready, and schedulable: the node lifecycle controller removed its not-ready taint."""
    async def ready() -> dict[str, Any] | None:
        obj = await get_json(cp, "node", node)
        if condition(obj, "Ready").get("status") != "True":
            return None
        taints = (obj or {}).get("spec", {}).get("taints") or []
        return None if any(t["key"].startswith("node.kubernetes.io/") for t in taints) else obj

    found: dict[str, Any] = await wait_for(ready, timeout, f"node {node} Ready and untainted")
    return found


async def cleanup_node(cp: ControlPlane, env: AgentEnv) -> None:
    """Force-delete what is left of the node's API pods and static pods, wait until the running
    agent has torn everything down, then delete the Node."""
    with anyio.CancelScope(shield=True):
        if env.config.static_pod_path is not None:
            for f in env.config.static_pod_path.iterdir():
                f.unlink()
        await kubectl(cp, "delete", "pods", "-A", "--field-selector", f"spec.nodeName={env.node}",
                      "--force", "--grace-period=0", "--wait=false", check=False)
        await env.wait_empty(60)


async def delete_node(cp: ControlPlane, node: str) -> None:
    with anyio.CancelScope(shield=True):
        await kubectl(cp, "delete", "node", node, "--wait=false", check=False)
        await kubectl(cp, "-n", "kube-node-lease", "delete", "lease", node, "--wait=false", check=False)


@asynccontextmanager
async def ready_cluster_node(cp: ControlPlane, containerd: Any, config: AgentConfig) -> AsyncIterator[AgentEnv]:
    """A Ready, schedulable node running the agent with ``config``; on exit its pods are
    force-deleted and torn down (`cleanup_node`), then the Node and its Lease are deleted."""
    try:
        async with cluster_agent(cp, containerd, config) as env:
            try:
                await wait_node_ready(cp, env.node)
                yield env
            finally:
                await cleanup_node(cp, env)
    finally:
        await delete_node(cp, config.node_name)


# --- the node ---------------------------------------------------------------------------------


async def test_node_registers_becomes_ready_and_renews_its_lease(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    config = await cluster_config(control_plane, containerd, tmp_path)
    node = config.node_name
    try:
        async with cluster_agent(control_plane, containerd, config) as env:
            obj = await wait_node_ready(control_plane, node)
            status = obj["status"]
            meta = obj["metadata"]

            assert meta["labels"]["kubernetes.io/hostname"] == node
            assert meta["labels"]["kubernetes.io/os"] == "linux"
            assert meta["labels"]["kubernetes.io/arch"] == "amd64"
            for res in ("cpu", "memory", "pods", "ephemeral-storage"):
                assert res in status["capacity"], res
                assert res in status["allocatable"], res
            assert status["capacity"]["pods"] == "110"
            assert status["allocatable"]["memory"] == f"{env.agent.node.allocatable['memory'] // 1024}Ki"
            info = status["nodeInfo"]
            assert info["containerRuntimeVersion"].startswith("containerd://"), info
            assert info["kubeletVersion"] == KUBELET_VERSION
            assert info["operatingSystem"] == "linux" and info["architecture"] == "amd64"
            assert info["osImage"] and info["kernelVersion"]
            assert {"type": "InternalIP", "address": config.node_ip} in status["addresses"]
            assert {"type": "Hostname", "address": node} in status["addresses"]
            assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == config.kubelet.port
            # The runtime's images, largest first, with digests then tags (the scheduler's ImageLocality).
            held = await env.client.list_images()
            images = status["images"]
            assert len(images) == min(len(held), 50) and images
            assert [i["sizeBytes"] for i in images] == sorted((i.size for i in held), reverse=True)[:50]
            busybox = next(i for i in held if BUSYBOX_IMAGE in i.repo_tags)
            assert {"names": [*busybox.repo_digests, *busybox.repo_tags][:5], "sizeBytes": busybox.size} in images
            # The runtime's handlers, as CRI Status reports them (2.x; 1.6 reports none): the
            # default ("" — the API omits the empty name), runc and crun, with their features.
            handlers = {h.get("name", ""): h.get("features") for h in status.get("runtimeHandlers", [])}
            if containerd.runtime.name == "containerd1.6":
                assert handlers == {}
            else:
                userns = containerd.runtime.runc is not None  # our runc 1.5: idmapped mounts
                assert handlers == {
                    "": {"recursiveReadOnlyMounts": True, "userNamespaces": userns},
                    "runc": {"recursiveReadOnlyMounts": True, "userNamespaces": userns},
                    "crun": {"recursiveReadOnlyMounts": False, "userNamespaces": False}}, handlers
            ready = condition(obj, "Ready")
            assert ready["reason"] == "KubeletReady" and ready["message"] == "kubelet is posting ready status"
            for kind, reason in (("MemoryPressure", "KubeletHasSufficientMemory"),
                                 ("DiskPressure", "KubeletHasNoDiskPressure"),
                                 ("PIDPressure", "KubeletHasSufficientPID")):
                assert condition(obj, kind)["status"] == "False", kind
                assert condition(obj, kind)["reason"] == reason

            lease = await wait_for(lambda: get_json(control_plane, "-n", "kube-node-lease", "lease", node),
                                   30, "the node's Lease")
            assert lease["spec"]["holderIdentity"] == node
            assert lease["spec"]["leaseDurationSeconds"] == 8

            async def owned_and_renewed() -> bool:
                now = await get_json(control_plane, "-n", "kube-node-lease", "lease", node)
                owners = now["metadata"].get("ownerReferences") or []
                return (now["spec"]["renewTime"] > lease["spec"]["renewTime"]
                        and any(o["kind"] == "Node" and o["uid"] == meta["uid"] for o in owners))

            await wait_for(owned_and_renewed, 30, "the Lease renewed (renewTime advances) and owned by the Node")

            await wait_for(lambda: _node_event(control_plane, node, "NodeReady"), 30, "the NodeReady event")
            events = await get_json(control_plane, "events", "--field-selector",
                                    f"involvedObject.kind=Node,involvedObject.name={node}")
            reasons = {e["reason"] for e in events["items"]}
            assert reasons <= {"Starting", "NodeReady", "NodeHasSufficientMemory", "NodeHasNoDiskPressure",
                               "NodeHasSufficientPID", "RegisteredNode", "NodeNotReady"}, reasons

        # A restarted agent adopts its Node (same UID) and it stays Ready.
        async with cluster_agent(control_plane, containerd, config) as env:
            cluster = env.agent.cluster
            assert cluster is not None
            await wait_for(lambda: _true(cluster.node.uid is not None), 30, "re-registration")
            assert cluster.node.uid == meta["uid"]
            again = await wait_node_ready(control_plane, node)
            assert again["metadata"]["uid"] == meta["uid"]
            assert condition(again, "Ready")["lastTransitionTime"] == ready["lastTransitionTime"]
    finally:
        await delete_node(control_plane, node)


async def _node_event(cp: ControlPlane, node: str, reason: str) -> bool:
    events = await get_json(cp, "events", "--field-selector",
                            f"involvedObject.kind=Node,involvedObject.name={node},reason={reason}")
    return bool(events and events["items"]
                and events["items"][0]["source"] == {"component": "kubelet", "host": node})


async def test_node_is_not_ready_while_the_runtime_is_unreachable(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    """Registration does not wait for the runtime; Ready says what is wrong."""
    config = await cluster_config(control_plane, containerd, tmp_path,
                                  container_runtime_endpoint=f"unix://{tmp_path}/no-such.sock")
    node = config.node_name
    try:
        from nodeagent.agent import Agent

        agent = Agent(config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run)  # never reports started: the runtime never answers

            async def not_ready() -> dict[str, Any]:
                return condition(await get_json(control_plane, "node", node), "Ready")

            ready = await wait_for(not_ready, 30, "the Node registered")
            assert ready["status"] == "False" and ready["reason"] == "KubeletNotReady"
            assert "container runtime" in ready["message"], ready
            tg.cancel_scope.cancel()
    finally:
        await delete_node(control_plane, node)


class _ReadySpy:
    """The real API client, with the Ready status of every status patch noted."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.ready: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    async def patch(self, res: Any, name: str, body: Any, **kwargs: Any) -> Any:
        if isinstance(body, dict):
            self.ready += [c["status"] for c in (body.get("status") or {}).get("conditions", [])
                           if c["type"] == "Ready"]
        return await self.api.patch(res, name, body, **kwargs)


async def test_a_restarted_agent_whose_first_relist_comes_late_keeps_its_node_ready(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    """The Node's status against the real API server and containerd, the relister's health
    played by the test: a restarted agent's first status waits for the first relist, so a Node
    that was Ready is never written NotReady in between and keeps its transition time."""
    import time

    from cri import RuntimeClient
    from nodeagent.apiclient import make_api_client
    from nodeagent.cluster.node import NodeStatus

    config = await cluster_config(control_plane, containerd, tmp_path)
    node = config.node_name
    assert config.kubeconfig is not None
    info = NodeInfo(name=node, ip=config.node_ip or "127.0.0.1",
                    allocatable={"cpu": 2000, "memory": 2 << 30, "pods": 110})
    relisted = {"at": time.time()}

    async def run_until(status: NodeStatus, check: Any, what: str) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(status.run)
            await wait_for(check, 30, what)
            tg.cancel_scope.cancel()

    try:
        async with RuntimeClient(containerd.endpoint) as runtime:
            first = _ReadySpy(make_api_client(config.kubeconfig))
            await run_until(NodeStatus(first, config, info, runtime, lambda: (True, relisted["at"])),
                            lambda: _true("True" in first.ready), "the Node Ready")
            before = condition(await get_json(control_plane, "node", node), "Ready")
            assert before["status"] == "True", before
            await anyio.sleep(1.1)  # a transition written now would show a later second

            relisted["at"] = 0.0  # the restarted agent's relister has not listed yet
            second = _ReadySpy(make_api_client(config.kubeconfig))
            async with anyio.create_task_group() as tg:
                tg.start_soon(NodeStatus(second, config, info, runtime, lambda: (True, relisted["at"])).run)
                await anyio.sleep(1.5)
                assert second.ready == [], "a status was written before the first relist"
                relisted["at"] = time.time()
                await wait_for(lambda: _true(bool(second.ready)), 30, "the restarted agent's first status")
                tg.cancel_scope.cancel()
            assert second.ready[0] == "True"
            after = condition(await get_json(control_plane, "node", node), "Ready")
            assert after["status"] == "True" and after["lastTransitionTime"] == before["lastTransitionTime"]
    finally:
        await delete_node(control_plane, node)


# --- pure parts ------------------------------------------------------------------------------


def test_merge_diff_sets_changes_and_nulls_what_we_no_longer_write() -> None:
    old = {"phase": "Pending", "reason": "X", "conditions": [{"type": "Ready", "status": "False"}],
           "podIP": "10.0.0.2"}
    new = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.0.0.2"}
    assert merge_diff(old, new) == {"phase": "Running", "reason": None,
                                    "conditions": [{"type": "Ready", "status": "True"}]}
    # A first write compares with the API's copy but leaves other writers' keys alone.
    assert merge_diff({"nominatedNodeName": "n", "phase": "Pending"}, {"phase": "Running"}, remove=False) == \
        {"phase": "Running"}
    assert merge_diff(new, new) == {}


def test_api_status_keeps_transition_times_and_foreign_conditions() -> None:
    computed = {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2030-01-01T00:00:09Z"},
        {"type": "Initialized", "status": "True", "lastTransitionTime": "2030-01-01T00:00:09Z"}]}
    previous = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2030-01-01T00:00:01Z"},
                               {"type": "Initialized", "status": "False", "lastTransitionTime": "2030-01-01T00:00:01Z"}]}
    in_api = {"conditions": [{"type": "DisruptionTarget", "status": "True"},
                             {"type": "Ready", "status": "True", "lastTransitionTime": "2030-01-01T00:00:00Z"}]}
    out = api_status(computed, previous, in_api)
    by_type = {c["type"]: c for c in out["conditions"]}
    assert by_type["Ready"]["lastTransitionTime"] == "2030-01-01T00:00:01Z"  # unchanged status: kept
    assert by_type["Initialized"]["lastTransitionTime"] == "2030-01-01T00:00:09Z"  # changed: new time
    assert "DisruptionTarget" not in by_type  # not ours: never sent (status_patch leaves it alone)


def test_status_patch_merges_conditions_by_type_and_leaves_other_writers_alone() -> None:
    ready = {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": "T1"}
    gate = {"type": "example.com/gate", "status": "True"}
    in_api = {"phase": "Pending", "nominatedNodeName": "n", "podIPs": [{"ip": "10.0.0.9"}],
              "conditions": [gate, {"type": "PodResizeInProgress", "status": "True"}, ready]}
    ours = {"phase": "Running", "podIPs": [{"ip": "10.0.0.2"}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "T2"}]}
    # First write against the API's copy: another writer's condition and keys stay; the node's
    # own resize condition and a stale pod IP go; a changed condition nulls what we no longer say.
    assert status_patch(in_api, ours, first=True) == {
        "phase": "Running",
        "podIPs": [{"ip": "10.0.0.2"}, {"ip": "10.0.0.9", "$patch": "delete"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": None, "lastTransitionTime": "T2"},
                       {"type": "PodResizeInProgress", "$patch": "delete"}],
    }
    # Later writes against what we wrote: a condition we stop reporting is deleted by type.
    later = {**ours, "conditions": [*ours["conditions"], {"type": "PodResizePending", "status": "True"}]}
    assert status_patch(later, ours, first=False) == {
        "conditions": [{"type": "PodResizePending", "$patch": "delete"}]}
    assert status_patch(ours, ours, first=False) == {}


async def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    clock = ManualClock()
    bucket = TokenBucket(qps=2, burst=3, clock=clock)
    for _ in range(3):
        await bucket.acquire()  # the burst: no waiting
    assert not bucket.try_acquire()
    done = anyio.Event()

    async def fourth() -> None:
        await bucket.acquire()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(fourth)
        await wait_for(lambda: _true(clock.sleepers == 1), 5, "the fourth request waiting")
        clock.advance(0.4)
        assert not done.is_set()
        clock.advance(0.2)  # 0.5 s after the burst: one token at 2 qps
        await wait_for(lambda: _true(done.is_set()), 5, "the fourth request served")


async def _true(value: bool) -> bool:
    return value


def test_resources_use_the_agents_allocatable_and_add_ephemeral_storage(tmp_path: Path) -> None:
    config = AgentConfig(root_dir=tmp_path, max_pods=7, kube_reserved={"ephemeral-storage": "1Gi"})
    node = NodeInfo(name="n", ip="127.0.0.1", allocatable={"cpu": 1500, "memory": 3 * 2**30, "pods": 7})
    capacity, allocatable = resources(config, node)
    assert allocatable["cpu"] == "1500m" and allocatable["memory"] == f"{3 * 2**20}Ki"
    assert capacity["pods"] == allocatable["pods"] == "7"
    assert int(allocatable["ephemeral-storage"]) < int(capacity["ephemeral-storage"].removesuffix("Ki")) * 1024


async def test_node_registers_with_its_configured_taints_and_admits_against_them(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    taints = [{"key": "dedicated", "value": "nodeagent", "effect": "NoSchedule"},
              {"key": "example.com/gpu", "effect": "NoExecute"}]
    config = await cluster_config(control_plane, containerd, tmp_path, register_with_taints=taints,
                                  node_status_max_images=1)
    async with ready_cluster_node(control_plane, containerd, config) as env:
        obj = await get_json(control_plane, "node", config.node_name)
        assert len(obj["status"]["images"]) == 1  # nodeStatusMaxImages: only the largest
        ours = [t for t in obj["spec"]["taints"] if not t["key"].startswith("node.kubernetes.io/")]
        assert ours == taints
        # The NoExecute one is what admission checks API pods against (tainttoleration).
        stage = env.agent.pipeline.stages["tainttoleration"]

        async def seen() -> bool:
            return any(t["key"] == "example.com/gpu" for t in stage.describe()["taints"])

        await wait_for(seen, 30, "the registered NoExecute taint in the agent's Node watch")
