"""In-place pod resize in cluster mode (issue 8): a resize through the API server's ``resize``
subresource is applied to the running container's cgroup (read from inside the container) and to
the pod cgroup, shown in status (resources, allocatedResources, observedGeneration), restarts
only a container whose resizePolicy says RestartContainer, and a resize no node could hold stays
PodResizePending (Infeasible) with the old resources in force.

Against the real control plane (`control_plane`) and containerd (`containerd`).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from controlplane import ControlPlane
from nodeagent import quantity
from tests.agent_helpers import wait_for
from tests.test_cluster_node import (
    cluster_config,
    get_json,
    kubectl,
    ready_cluster_node,
)
from tests.test_cluster_pods import (
    GRACEFUL,
    api_pod,
    create_pod,
    running_container,
    wait_running,
)

pytestmark = pytest.mark.anyio

CGROUP_FS = Path("/sys/fs/cgroup")
MiB = 1 << 20


def _unified() -> bool:
    return (CGROUP_FS / "cgroup.controllers").exists()


def resizable_pod(name: str, node: str) -> dict[str, Any]:
    pod = api_pod(name, node, command=GRACEFUL, grace=0)
    pod["spec"]["restartPolicy"] = "OnFailure"
    main = pod["spec"]["containers"][0]
    main["name"] = "c1"
    main["resources"] = {"requests": {"cpu": "100m", "memory": "32Mi"},
                         "limits": {"cpu": "200m", "memory": "64Mi"}}
    main["resizePolicy"] = [{"resourceName": "cpu", "restartPolicy": "NotRequired"},
                            {"resourceName": "memory", "restartPolicy": "NotRequired"}]
    restarted = {**main, "name": "c2",
                 "resources": {"requests": {"cpu": "50m", "memory": "16Mi"},
                               "limits": {"cpu": "100m", "memory": "32Mi"}},
                 "resizePolicy": [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]}
    pod["spec"]["containers"].append(restarted)
    return pod


async def resize(cp: ControlPlane, name: str, containers: list[dict[str, Any]]) -> None:
    patch = json.dumps({"spec": {"containers": containers}})
    await kubectl(cp, "patch", "pod", name, "--subresource", "resize", "--type", "strategic", "-p", patch)


def statuses(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cs["name"]: cs for cs in pod["status"].get("containerStatuses", [])}


def conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in pod["status"].get("conditions", [])}


async def container_memory_limit(env: Any, uid: str, name: str) -> int:
    """memory limit as the container itself sees it in its cgroup."""
    container = await running_container_named(env, uid, name)
    path = "/sys/fs/cgroup/memory.max" if _unified() else "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    result = await env.client.exec_sync(container.id, ["cat", path], timeout=10)
    return int(result.stdout.decode().strip())


async def container_cpu_quota(env: Any, uid: str, name: str) -> int:
    container = await running_container_named(env, uid, name)
    if _unified():
        result = await env.client.exec_sync(container.id, ["cat", "/sys/fs/cgroup/cpu.max"], timeout=10)
        return int(result.stdout.decode().split()[0])
    result = await env.client.exec_sync(container.id, ["cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"], timeout=10)
    return int(result.stdout.decode().strip())


async def running_container_named(env: Any, uid: str, name: str) -> Any:
    from cri import types as t
    from nodeagent import labels as L
    from tests.agent_helpers import runtime_objects

    _, containers = await runtime_objects(env.client, env.node)
    for c in containers:
        if (c.labels.get(L.POD_UID) == uid and c.labels.get(L.CONTAINER_NAME) == name
                and c.state == t.ContainerState.CONTAINER_RUNNING):
            return c
    raise AssertionError(f"no running container {name} in pod {uid}")


async def sandbox_resources(env: Any, uid: str) -> dict[str, Any] | None:
    """The pod's sandbox resources as the runtime recorded them (containerd 2.x's verbose
    PodSandboxStatus info), or None when the runtime has no UpdatePodSandboxResources."""
    from cri import Unimplemented
    from cri import types as t
    from nodeagent import labels as L

    try:
        await env.client.update_pod_sandbox_resources("", t.LinuxContainerResources())
    except Unimplemented:
        return None
    except Exception:  # noqa: BLE001 - implemented: an empty sandbox ID is simply not found
        pass
    [sandbox] = [s for s in await env.client.list_pod_sandbox() if s.labels.get(L.POD_UID) == uid
                 and s.state == t.PodSandboxState.SANDBOX_READY]
    _, info = await env.client.pod_sandbox_status(sandbox.id, verbose=True)
    linux: dict[str, Any] = (json.loads(info["info"]).get("resources") or {}).get("linux") or {}
    return linux


def pod_cgroup_memory_limit(uid: str) -> int:
    rel = f"nodeagent-pods/burstable/pod{uid}"
    path = CGROUP_FS / rel / "memory.max" if _unified() else CGROUP_FS / "memory" / rel / "memory.limit_in_bytes"
    return int(path.read_text().strip())


async def test_resize_in_place_restart_policy_and_infeasible(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    cp = control_plane
    config = await cluster_config(cp, containerd, tmp_path)
    node = config.node_name
    name = f"resize-{uuid.uuid4().hex[:6]}"
    async with ready_cluster_node(cp, containerd, config) as env:
        await create_pod(cp, resizable_pod(name, node))
        pod = await wait_running(cp, name)
        uid = pod["metadata"]["uid"]

        async def reported(pod_resources: dict[str, Any], generation: int) -> Any:
            async def check() -> dict[str, Any] | None:
                obj = await get_json(cp, "pod", name)
                s = statuses(obj)
                done = (obj["status"].get("observedGeneration") == generation
                        and s.get("c1", {}).get("resources") == pod_resources
                        and "running" in s["c1"]["state"] and "running" in s.get("c2", {}).get("state", {})
                        and not {"PodResizePending", "PodResizeInProgress"} & set(conditions(obj)))
                return obj if done else None
            return await wait_for(check, 60, f"c1 resources {pod_resources} at generation {generation}")

        # Status: what each container runs with, and what is allocated to it.
        first = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}
        pod = await reported(first, pod["metadata"]["generation"])
        c1 = statuses(pod)["c1"]
        assert c1["allocatedResources"] == {"cpu": "100m", "memory": "32Mi"}
        assert statuses(pod)["c2"]["resources"] == {"requests": {"cpu": "50m", "memory": "16Mi"},
                                                    "limits": {"cpu": "100m", "memory": "32Mi"}}
        assert await container_memory_limit(env, uid, "c1") == 64 * MiB
        assert pod_cgroup_memory_limit(uid) == 96 * MiB  # the sum of the containers' limits
        c1_id = (await running_container(env, uid)) and c1["containerID"]

        # 1. NotRequired: c1 grows in place, without a restart; the pod cgroup follows.
        grown = {"requests": {"cpu": "150m", "memory": "48Mi"}, "limits": {"cpu": "300m", "memory": "96Mi"}}
        await resize(cp, name, [{"name": "c1", "resources": grown}])
        pod = await reported(grown, pod["metadata"]["generation"] + 1)
        c1 = statuses(pod)["c1"]
        assert c1["containerID"] == c1_id and c1["restartCount"] == 0
        assert c1["allocatedResources"] == {"cpu": "150m", "memory": "48Mi"}
        assert await container_memory_limit(env, uid, "c1") == 96 * MiB
        assert await container_cpu_quota(env, uid, "c1") == 30_000
        assert pod_cgroup_memory_limit(uid) == 128 * MiB
        # The runtime was told too (UpdatePodSandboxResources): containerd 2.x shows the
        # sandbox's resources in its verbose status; 1.6 has no such call.
        told = await sandbox_resources(env, uid)
        if told is not None:
            assert told.get("memory_limit_in_bytes") == 128 * MiB, told
            assert told.get("cpu_quota") == 40_000 and told.get("cpu_period") == 100_000, told

        # 2. RestartContainer for memory: c2 restarts with its new limit, c1 stays.
        await resize(cp, name, [{"name": "c2", "resources": {
            "requests": {"cpu": "50m", "memory": "24Mi"}, "limits": {"cpu": "100m", "memory": "48Mi"}}}])

        async def c2_restarted() -> dict[str, Any] | None:
            obj = await get_json(cp, "pod", name)
            c2 = statuses(obj).get("c2", {})
            ok = (c2.get("restartCount") == 1 and "running" in c2.get("state", {})
                  and c2.get("resources", {}).get("limits", {}).get("memory") == "48Mi"
                  and "PodResizeInProgress" not in conditions(obj))
            return obj if ok else None

        try:
            pod = await wait_for(c2_restarted, 60, "c2 restarted with 48Mi")
        except AssertionError:
            obj = await get_json(cp, "pod", name)
            raise AssertionError(json.dumps(obj["status"], indent=1)) from None
        assert statuses(pod)["c1"]["restartCount"] == 0
        assert statuses(pod)["c1"]["containerID"] == c1_id
        assert await container_memory_limit(env, uid, "c2") == 48 * MiB

        # 3. More CPU than the other pods leave: Deferred (the API server itself refuses
        # more than the node's allocatable), the old resources stay in force; accepted once
        # the other pod is gone.
        node_obj = await get_json(cp, "node", node)
        allocatable = int(quantity.milli_cpu(node_obj["status"]["allocatable"]["cpu"]))
        filler = api_pod(f"filler-{uuid.uuid4().hex[:6]}", node)
        filler["spec"]["containers"][0]["resources"] = {"requests": {"cpu": f"{allocatable - 400}m"}}
        await create_pod(cp, filler)
        await wait_running(cp, filler["metadata"]["name"])
        wanted = {"requests": {"cpu": "400m", "memory": "48Mi"}, "limits": {"cpu": "400m", "memory": "96Mi"}}
        await resize(cp, name, [{"name": "c1", "resources": wanted}])

        async def deferred() -> dict[str, Any] | None:
            obj = await get_json(cp, "pod", name)
            pending = conditions(obj).get("PodResizePending", {})
            return obj if pending.get("reason") == "Deferred" else None

        pod = await wait_for(deferred, 30, "PodResizePending Deferred")
        pending = conditions(pod)["PodResizePending"]
        assert pending["status"] == "True"
        assert pending["message"].startswith("Node didn't have enough resource: cpu, requested: 450")
        assert pod["status"]["observedGeneration"] == pod["metadata"]["generation"]
        assert statuses(pod)["c1"]["resources"] == grown
        assert statuses(pod)["c1"]["allocatedResources"] == {"cpu": "150m", "memory": "48Mi"}
        assert await container_cpu_quota(env, uid, "c1") == 30_000

        await kubectl(cp, "delete", "pod", filler["metadata"]["name"], "--grace-period=0", "--force")
        pod = await reported(wanted, pod["metadata"]["generation"])
        assert await container_cpu_quota(env, uid, "c1") == 40_000


# --- the pure parts: fit, applied values, requests -----------------------------------------


def _pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
         resources: dict[str, Any] | None = None) -> Any:
    from nodeagent.model import Pod

    spec: dict[str, Any] = {"containers": [{"image": "busybox", **c} for c in containers]}
    if init:
        spec["initContainers"] = [{"image": "busybox", **c} for c in init]
    if resources is not None:
        spec["resources"] = resources
    return Pod.model_validate({"metadata": {"name": "p", "uid": "u1"}, "spec": spec})


def test_fit_is_infeasible_beyond_allocatable_and_deferred_beside_other_pods() -> None:
    from plugins.runtime.resize import DEFERRED, INFEASIBLE, Ledger

    ledger = Ledger()
    ledger.set("other", _pod([{"name": "a", "resources": {"requests": {"cpu": "1500m"}}}]))
    allocatable = {"cpu": 2000, "memory": 4 << 30}
    small = _pod([{"name": "c", "resources": {"requests": {"cpu": "400m"}}}])
    assert ledger.fit("u1", small, allocatable) is None
    larger = _pod([{"name": "c", "resources": {"requests": {"cpu": "600m"}}}])
    assert ledger.fit("u1", larger, allocatable) == (
        DEFERRED, "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000")
    huge = _pod([{"name": "c", "resources": {"requests": {"cpu": "3"}}}])
    reason, message = ledger.fit("u1", huge, allocatable) or ("", "")
    assert reason == INFEASIBLE and message == "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000"
    ledger.release("other")
    assert ledger.fit("u1", larger, allocatable) is None


def test_pod_level_limits_apply_to_containers_without_their_own() -> None:
    from nodeagent.kube.resources import Values, linux_resources, values
    from nodeagent.model import ResourceRequirements

    pod_level = ResourceRequirements(limits={"cpu": "500m", "memory": "128Mi"}, requests={"cpu": "200m"})
    own = ResourceRequirements(limits={"memory": "64Mi"}, requests={"cpu": "100m"})
    # A limit alone stands for the request too (API defaulting).
    assert values(own, pod_level) == Values(cpu_request=100, cpu_limit=500, memory_request=64 * MiB,
                                            memory_limit=64 * MiB)
    pod = _pod([{"name": "c", "resources": {"requests": {"cpu": "100m"}}}],
               resources={"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": "200m"}})
    linux = linux_resources(pod.spec.containers[0], pod)
    assert (linux.cpu_quota, linux.memory_limit_in_bytes) == (50_000, 128 * MiB)


def test_pod_requests_count_sidecars_and_the_largest_init_container() -> None:
    from nodeagent.kube.resources import pod_requests

    pod = _pod([{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "10Mi"}}}],
               init=[{"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}},
                     {"name": "init", "resources": {"requests": {"cpu": "1", "memory": "1Mi"}}}])
    assert pod_requests(pod) == {"cpu": 1050, "memory": 10 * MiB}
    with_pod_level = _pod([{"name": "c", "resources": {"requests": {"cpu": "100m"}}}],
                          resources={"requests": {"memory": "64Mi"}})
    assert pod_requests(with_pod_level) == {"cpu": 100, "memory": 64 * MiB}


def test_a_resize_condition_the_node_no_longer_reports_is_removed_from_the_api() -> None:
    """The API's copy of PodResizeInProgress is the node's own: not carried over as another
    writer's condition once the resize is done."""
    from nodeagent.cluster.mergepatch import api_status, status_patch

    in_api = {"conditions": [{"type": "PodResizeInProgress", "status": "True"},
                             {"type": "DisruptionTarget", "status": "True"}]}
    sent = api_status({"conditions": [{"type": "Ready", "status": "True"}]}, None, in_api)
    assert status_patch(in_api, sent, first=True)["conditions"] == [
        {"type": "Ready", "status": "True"}, {"type": "PodResizeInProgress", "$patch": "delete"}]


def test_the_sweep_removes_only_idle_cgroups_of_pods_no_longer_run() -> None:
    """On the host's real cgroup filesystem: an orphan pod cgroup (e.g. left by a killed agent)
    goes; one of a pod the stage runs, one holding a process, and a young one stay."""
    import os
    import subprocess
    import time

    from plugins.runtime import podcgroup

    # A root of its own: a sweep of the shared one could take a pod cgroup another agent on
    # this host (another test, a conformance run) has just made.
    root_name = f"nodeagent-test-{uuid.uuid4().hex[:8]}"
    base = podcgroup.CGROUP_FS if podcgroup.unified() else podcgroup.CGROUP_FS / "memory"
    parent = base / root_name / "besteffort"
    orphan, active, busy = (uuid.uuid4().hex for _ in range(3))
    for uid in (orphan, active, busy):
        (parent / f"pod{uid}" / "leftover-container").mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        (parent / f"pod{busy}" / "cgroup.procs").write_text(str(sleeper.pid))
        now = time.time()
        assert podcgroup.sweep({active}, 3600, now, root_name) == []  # too young: a pod being set up
        assert podcgroup.sweep({active}, 0, now + 1, root_name) == [orphan]
        assert not (parent / f"pod{orphan}").exists()
        assert (parent / f"pod{active}").is_dir() and (parent / f"pod{busy}").is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()
        for uid in (orphan, active, busy):
            for d in (parent / f"pod{uid}" / "leftover-container", parent / f"pod{uid}"):
                for _ in range(50):
                    try:
                        os.rmdir(d)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)  # the killed sleeper leaves its cgroup a moment later
        for d in (parent, parent.parent):
            os.rmdir(d)
