"""Node-pressure and local-storage eviction (issue 17 §3) against the real control plane and
containerd: a pod over its emptyDir sizeLimit is evicted with the kubelet's message; a
memory.available threshold above what is free evicts the BestEffort pod first and refuses a new
BestEffort pod; the Node shows MemoryPressure."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from controlplane import ControlPlane
from nodeagent.stats import host
from tests.agent_helpers import wait_for
from tests.test_cluster_node import (
    cleanup_node,
    cluster_agent,
    cluster_config,
    condition,
    delete_node,
    get_json,
    ready_cluster_node,
)
from tests.test_cluster_pods import (
    api_pod,
    create_pod,
    event_reasons,
    running_container,
    wait_running,
)

pytestmark = pytest.mark.anyio

# Eviction decides every second and measures volumes every second (the kubelet: 10 s and 1 m).
FAST = {"volume_stats_agg_period": 1.0}


def eviction_plugins(**eviction: Any) -> dict[str, Any]:
    return {"plugins": {"eviction": {"evictionMonitoringPeriod": "1s", **eviction}}}


async def wait_phase(cp: ControlPlane, name: str, phase: str, timeout: float = 60.0) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        pod = await get_json(cp, "pod", name)
        return pod if ((pod or {}).get("status") or {}).get("phase") == phase else None

    found: dict[str, Any] = await wait_for(reached, timeout, f"pod {name} {phase} in the API")
    return found


async def test_a_pod_over_its_emptydir_size_limit_is_evicted(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    cp = control_plane
    # No pressure threshold: only the local storage limits can evict here.
    config = await cluster_config(cp, containerd, tmp_path, **FAST,
                                  **eviction_plugins(evictionHard={"memory.available": "0%"}))
    name = f"filler-{uuid.uuid4().hex[:6]}"
    # It writes after a pause: the test must see it Running first (it may be evicted within a
    # housekeeping period of the write, quicker than the API shows a status on a loaded machine).
    manifest = api_pod(name, config.node_name, "sleep 5; head -c 20000000 /dev/zero > /cache/blob; sleep 3600",
                       grace=30)
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "cache", "mountPath": "/cache"}]
    manifest["spec"]["volumes"] = [{"name": "cache", "emptyDir": {"sizeLimit": "10Mi"}}]
    async with ready_cluster_node(cp, containerd, config) as env:
        await create_pod(cp, manifest)
        uid = (await wait_running(cp, name))["metadata"]["uid"]
        pod = await wait_phase(cp, name, "Failed")
        status = pod["status"]
        assert status["reason"] == "Evicted"
        assert status["message"] == 'Usage of EmptyDir volume "cache" exceeds the limit "10Mi". '
        # A local storage limit is no disruption of the node's making: no DisruptionTarget.
        assert not condition(pod, "DisruptionTarget")
        events = await wait_for(lambda: _with(event_reasons(cp, uid), "Evicted"), 30, "the Evicted Event")
        assert events["Evicted"]["type"] == "Warning" and events["Evicted"]["message"] == status["message"]
        await wait_for(lambda: _none(running_container(env, uid)), 30, "the evicted pod's container stopped")
        stage = env.agent.pipeline.stages["eviction"]  # type: ignore[union-attr]
        assert stage.manager.history == [(uid, "emptydirfs.limit")]


async def test_memory_pressure_evicts_the_best_effort_pod_first_and_refuses_new_ones(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    cp = control_plane
    total = host.meminfo()["MemTotal"]
    # A soft threshold above all the memory there is: met from the start, acting after its grace
    # period, by when both pods run (the condition, and so admission, acts at once).
    config = await cluster_config(cp, containerd, tmp_path, **FAST, **eviction_plugins(
        evictionHard={"memory.available": "0%"}, evictionSoft={"memory.available": str(total)},
        evictionSoftGracePeriod={"memory.available": "30s"}))
    node = config.node_name
    suffix = uuid.uuid4().hex[:6]
    burstable = api_pod(f"burstable-{suffix}", node)
    burstable["spec"]["containers"][0]["resources"] = {"requests": {"memory": "64Mi"}}
    best_effort = api_pod(f"besteffort-{suffix}", node)
    # The node lifecycle controller taints the node memory-pressure, and the kubelet refuses
    # BestEffort pods that do not tolerate it: these two do, to be scheduled and admitted.
    tolerate = [{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}]
    for manifest in (burstable, best_effort):
        manifest["spec"]["tolerations"] = tolerate
    try:
        async with cluster_agent(cp, containerd, config) as env:
            try:
                await _memory_pressure(cp, env, node, suffix, burstable, best_effort)
            finally:
                await cleanup_node(cp, env)
    finally:
        await delete_node(cp, node)


async def _memory_pressure(cp: ControlPlane, env: Any, node: str, suffix: str, burstable: dict[str, Any],
                           best_effort: dict[str, Any]) -> None:
    await wait_for(lambda: _condition_true(cp, node, "Ready"), 60, "the node Ready")
    stage = env.agent.pipeline.stages["eviction"]
    await wait_for(lambda: _true(stage.manager.node_conditions == ["MemoryPressure"]), 30, "MemoryPressure")
    node_obj = await wait_for(lambda: _condition_true(cp, node, "MemoryPressure"), 30, "MemoryPressure on the Node")
    assert condition(node_obj, "MemoryPressure")["reason"] == "KubeletHasInsufficientMemory"
    await wait_for(lambda: _tainted(cp, node, "node.kubernetes.io/memory-pressure"), 60,
                   "the node lifecycle controller's memory-pressure taint")
    for manifest in (burstable, best_effort):
        await create_pod(cp, manifest)
    burstable_uid = (await wait_running(cp, burstable["metadata"]["name"]))["metadata"]["uid"]
    best_effort_uid = (await wait_running(cp, best_effort["metadata"]["name"]))["metadata"]["uid"]
    assert stage.manager.history == [], "nothing evicted before the grace period"

    evicted = await wait_phase(cp, best_effort["metadata"]["name"], "Failed", timeout=90)
    assert stage.manager.history[0] == (best_effort_uid, "memory.available"), "the BestEffort pod goes first"
    status = evicted["status"]
    assert status["reason"] == "Evicted"
    assert status["message"].startswith("The node was low on resource: memory. Threshold quantity: ")
    assert "Container main was using " in status["message"] and "request is 0" in status["message"]
    target = condition(evicted, "DisruptionTarget")
    assert target["status"] == "True" and target["reason"] == "TerminationByKubelet"

    # Bound by name, as a pod can only reach a tainted node without the scheduler.
    refused_name = f"late-{suffix}"
    late = api_pod(refused_name, node)
    del late["spec"]["nodeSelector"]
    late["spec"]["nodeName"] = node
    await create_pod(cp, late)
    refused = await wait_phase(cp, refused_name, "Failed")
    assert refused["status"]["reason"] == "Evicted"
    assert refused["status"]["message"] == "Pod was rejected: The node had condition: [MemoryPressure]. "
    # The Burstable pod is next in line (the threshold never clears), never before.
    assert burstable_uid not in [uid for uid, _ in stage.manager.history[:1]]


async def _with(found: Any, reason: str) -> Any:
    events = await found
    return events if reason in events else None


async def _none(found: Any) -> bool:
    return await found is None


async def _true(value: bool) -> bool:
    return value


async def _tainted(cp: ControlPlane, node: str, key: str) -> bool:
    obj = await get_json(cp, "node", node)
    return any(t["key"] == key for t in ((obj or {}).get("spec") or {}).get("taints") or [])


async def _condition_true(cp: ControlPlane, node: str, kind: str) -> dict[str, Any] | None:
    obj = await get_json(cp, "node", node)
    return obj if condition(obj, kind).get("status") == "True" else None
