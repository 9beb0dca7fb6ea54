"""DRA in cluster mode (issue 6): the real control plane (kube-scheduler and kube-controller-manager
included) allocates a ResourceClaim made from a template out of the ResourceSlice our fake GPU
driver publishes; nodeagent, as the node, reads the claim from the API server, has the driver
prepare it, and the container sees the device node, mount and env of the driver's CDI spec; the
claim is unprepared when the pod is deleted. A driver that is not registered yet keeps the pod
waiting, with the kubelet's reason in its API status and Events, until it is. The driver keeps
its ResourceSlice right on the node's credentials; the node wipes stale slices at start and a
killed driver's after a delay. Opt-in: the upstream sigs.k8s.io/dra-example-driver against
nodeagent (NODEAGENT_DRA_EXAMPLE_DRIVER, see docs/DRA.md).

Against the real control plane (`control_plane`) and containerd (`containerd`: 2.x applies the
CDI specs itself, on 1.6 nodeagent does). The driver runs in-process on the node's own kubeconfig, or as a
process where it must be killed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from lightkube.resources.resource_v1 import ResourceSlice

from controlplane import ControlPlane
from devenv import Containerd
from drivers.fakegpu import DRIVER_NAME, FakeGpuDriver
from drivers.fakegpu.cluster import MODEL, SlicePublisher, slice_name
from nodeagent.apiclient import make_api_client
from tests.agent_helpers import AgentEnv, wait_for
from tests.test_cluster_node import (
    cluster_config,
    get_json,
    kubectl,
    ready_cluster_node,
)
from tests.test_cluster_pods import GRACEFUL, api_pod, running_container
from tests.test_dra import (
    DRA_TUNING,
    PREPARE,
    UNPREPARE,
    Dirs,
    calls,
    checkpoint,
    registered,
)

pytestmark = pytest.mark.anyio

REASON = "FailedPrepareDynamicResources"


def device_class() -> dict[str, Any]:
    # Selects by driver and by an attribute of our slice: the scheduler must have read both.
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER_NAME},
            "spec": {"selectors": [{"cel": {"expression":
                                            f'device.driver == "{DRIVER_NAME}" && '
                                            f'device.attributes["{DRIVER_NAME}"].model == "{MODEL}"'}}]}}


def claim_template(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}}}}


def gpu_pod(name: str, node: str, template: str) -> dict[str, Any]:
    pod = api_pod(name, node, command=GRACEFUL)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


async def apply(cp: ControlPlane, *objects: dict[str, Any]) -> None:
    await kubectl(cp, "apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))


@pytest.fixture
def dirs(containerd: Containerd) -> Iterator[Dirs]:
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer.
    base = Path(tempfile.mkdtemp(prefix="dra-c-", dir="/tmp"))
    # CDI specs go where the runtime reads them (containerd 2.x resolves CDI itself);
    # the session's tests share that directory one at a time, so each leaves it empty.
    cdi = containerd.cdi_spec_dir
    try:
        yield Dirs(base / "registry", base / "plugin", cdi)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for spec in cdi.iterdir():
            spec.unlink()


@pytest.fixture
def gpu_names() -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:6]
    yield f"gpu-{suffix}", f"tpl-{suffix}"


@asynccontextmanager
async def dra_node(cp: ControlPlane, containerd: Any, tmp_path: Path, dirs: Dirs, node: str | None = None,
                   **dra: Any) -> AsyncIterator[AgentEnv]:
    """A Ready cluster node running nodeagent with the dra stage looking at ``dirs``; on exit
    its pods are force-deleted and torn down, and the Node is deleted (its slices with it)."""
    config = await cluster_config(cp, containerd, tmp_path, node=node, plugins_registry_dir=dirs.registry,
                                  cdi_spec_dirs=[dirs.cdi], plugins={"dra": {**DRA_TUNING, **dra}})
    await apply(cp, device_class())
    async with ready_cluster_node(cp, containerd, config) as env:
        yield env


@asynccontextmanager
async def cluster_driver(cp: ControlPlane, env: AgentEnv, dirs: Dirs) -> AsyncIterator[FakeGpuDriver]:
    """The fake GPU driver of ``env``'s node, on the node's own credentials."""
    kubeconfig = await anyio.to_thread.run_sync(cp.node_kubeconfig, env.node)
    api = make_api_client(kubeconfig, field_manager="fakegpu")
    driver = FakeGpuDriver(registry_dir=dirs.registry, plugin_dir=dirs.plugin, cdi_dir=dirs.cdi, api=api,
                           node_name=env.node)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            yield driver
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await api.close()


async def allocated_claim(cp: ControlPlane, pod: str) -> dict[str, Any]:
    """The pod's generated ResourceClaim, once allocated."""
    async def found() -> dict[str, Any] | None:
        obj = await get_json(cp, "pod", pod)
        statuses = ((obj or {}).get("status") or {}).get("resourceClaimStatuses") or []
        if not statuses:
            return None
        claim = await get_json(cp, "resourceclaim", statuses[0]["resourceClaimName"])
        return claim if claim and (claim.get("status") or {}).get("allocation") else None

    result: dict[str, Any] = await wait_for(found, 60, f"pod {pod}'s ResourceClaim made and allocated")
    return result


async def test_claim_from_a_template_is_allocated_by_the_scheduler_prepared_and_unprepared(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path, dirs: Dirs,
        gpu_names: tuple[str, str]) -> None:
    cp = control_plane
    name, template = gpu_names
    async with dra_node(cp, containerd, tmp_path, dirs) as env, cluster_driver(cp, env, dirs) as driver:
        node = env.node
        await wait_for(lambda: _true(registered(env) == [DRIVER_NAME]), 30, "the driver registered")
        published = await wait_for(lambda: get_json(cp, "resourceslice", slice_name(node, DRIVER_NAME)), 30,
                                   "the driver's ResourceSlice")
        assert published["spec"]["nodeName"] == node and published["spec"]["pool"]["name"] == node
        assert [d["name"] for d in published["spec"]["devices"]] == ["gpu0", "gpu1", "gpu2", "gpu3"]

        await apply(cp, claim_template(template), gpu_pod(name, node, template))
        claim = await allocated_claim(cp, name)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["request"]) == (DRIVER_NAME, node, "gpu")
        device = result["device"]
        pod = await wait_for(lambda: _running(cp, name), 60, f"pod {name} Running")
        uid = pod["metadata"]["uid"]
        assert {"resource": "pods", "name": name, "uid": uid} in claim["status"]["reservedFor"]
        assert claim["metadata"]["ownerReferences"][0]["uid"] == uid  # made by the controller-manager

        index = device.removeprefix("gpu")
        out = await exec_in_pod(env, uid,
                                f"test -c /dev/fake{device} && echo data > /dev/fake{device} && "
                                f"cat /var/run/fakegpu/{device}/info && echo \"$GPU_DEVICE_{index} $FAKE_GPU_CLAIM\"")
        claim_key = f"default/{claim['metadata']['name']}"
        assert f"device={device}\nclaim={claim_key}\nclaimUID={claim['metadata']['uid']}\n" in out
        assert out.endswith(f"{device} {claim_key}\n")
        assert driver.prepared() == [claim["metadata"]["uid"]]
        assert driver.count(PREPARE) == 1

        await kubectl(cp, "delete", "pod", name, "--wait=false")
        await calls(driver, UNPREPARE, 1, claim["metadata"]["uid"])
        # The driver records the call when it comes in and removes the claim's CDI spec after.
        await wait_for(lambda: _true(driver.prepared() == []), 30, "the claim's CDI spec removed by the driver")
        await wait_for(lambda: _true(checkpoint(env).entries == {}), 30, "the checkpoint emptied")
        await wait_for(lambda: _gone(cp, "pod", name), 60, f"pod {name} gone from the API")

    # The driver stopped cleanly: its devices are gone from the cluster with it.
    assert await get_json(cp, "resourceslice", slice_name(node, DRIVER_NAME)) is None


async def test_pod_waits_with_the_reason_in_the_api_until_its_driver_registers(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path, dirs: Dirs,
        gpu_names: tuple[str, str]) -> None:
    cp = control_plane
    name, template = gpu_names
    async with dra_node(cp, containerd, tmp_path, dirs) as env:
        node = env.node
        # The driver's devices are in the API (so the scheduler allocates and binds), but its
        # kubelet plugin has not registered with the node yet.
        kubeconfig = await anyio.to_thread.run_sync(cp.node_kubeconfig, node)
        api = make_api_client(kubeconfig, field_manager="fakegpu")
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(SlicePublisher(api, DRIVER_NAME, node, 4).run)
                await apply(cp, claim_template(template), gpu_pod(name, node, template))

                message = f"Failed to prepare dynamic resources: DRA driver {DRIVER_NAME} is not registered"

                async def waiting() -> dict[str, Any] | None:
                    # Until the Node authorizer's graph has seen the claim in the pod's status,
                    # reading it is refused (403): the pod waits with that reason first.
                    pod = await get_json(cp, "pod", name)
                    status = (pod or {}).get("status") or {}
                    return pod if status.get("reason") == REASON and status.get("message") == message else None

                pod = await wait_for(waiting, 60, "the pod waiting for its driver, the reason in its API status")
                assert pod["status"]["phase"] == "Pending"
                uid = pod["metadata"]["uid"]
                async def driver_event() -> dict[str, Any] | None:
                    events = await get_json(cp, "events", "--field-selector", f"involvedObject.uid={uid}")
                    return next((e for e in (events or {}).get("items", [])
                                 if e["reason"] == REASON and e["message"] == message), None)

                event = await wait_for(driver_event, 30, "the FailedPrepareDynamicResources Event")
                assert event["type"] == "Warning"

                async with cluster_driver(cp, env, dirs) as driver:
                    running = await wait_for(lambda: _running(cp, name), 60, f"pod {name} Running once registered")
                    assert "reason" not in running["status"]
                    assert driver.count(PREPARE) == 1
                    await kubectl(cp, "delete", "pod", name, "--wait=false")
                    await calls(driver, UNPREPARE, 1)
                    await wait_for(lambda: _gone(cp, "pod", name), 60, f"pod {name} gone from the API")
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await api.close()


async def test_driver_keeps_its_resourceslice_right_and_removes_it_when_it_stops(
        control_plane: ControlPlane) -> None:
    """On the node's own credentials (NodeRestriction: its own node's slices only): published,
    re-created when deleted, replaced with the next pool generation when changed, removed at
    the end; a slice for another node is refused."""
    cp = control_plane
    node = f"s{uuid.uuid4().hex[:8]}"
    await apply(cp, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    kubeconfig = await anyio.to_thread.run_sync(cp.node_kubeconfig, node)
    api = make_api_client(kubeconfig, field_manager="fakegpu")
    name = slice_name(node, DRIVER_NAME)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(SlicePublisher(api, DRIVER_NAME, node, 2, resync_seconds=0.5).run)
            first = await get_json(cp, "resourceslice", name)
            assert first["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
            assert first["metadata"]["ownerReferences"][0]["kind"] == "Node"

            await kubectl(cp, "delete", "resourceslice", name)
            await wait_for(lambda: _uid_changed(cp, name, first["metadata"]["uid"]), 30, "the slice made again")

            await kubectl(cp, "patch", "resourceslice", name, "--type=json", "-p",
                          json.dumps([{"op": "remove", "path": "/spec/devices/1"}]))

            async def repaired() -> bool:
                obj = await get_json(cp, "resourceslice", name)
                return bool(obj and len(obj["spec"]["devices"]) == 2 and obj["spec"]["pool"]["generation"] == 2)

            await wait_for(repaired, 30, "the edited slice replaced, with the next pool generation")
            other = SlicePublisher(api, DRIVER_NAME, f"{node}-other", 1)
            with pytest.raises(Exception, match="can only create ResourceSlice with the same NodeName"):
                await other.api.create(ResourceSlice.from_dict(other.manifest(None, 1)))
            tg.cancel_scope.cancel()
        assert await get_json(cp, "resourceslice", name) is None
    finally:
        with anyio.CancelScope(shield=True):
            await api.close()
            await kubectl(cp, "delete", "node", node, "--wait=false", check=False)


async def _uid_changed(cp: ControlPlane, name: str, uid: str) -> bool:
    obj = await get_json(cp, "resourceslice", name)
    return bool(obj and obj["metadata"]["uid"] != uid)


async def test_node_wipes_stale_slices_at_start_and_a_vanished_drivers_after_a_delay(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path, dirs: Dirs) -> None:
    """The kubelet's housekeeping: the node's slices from before the agent started are deleted;
    a driver killed without cleaning up loses its slice once deregistered (after the delay)."""
    cp = control_plane
    node = f"w{uuid.uuid4().hex[:8]}"
    stale = f"{node}-stale"
    await apply(cp, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": stale},
                     "spec": {"driver": "stale.nodeagent.example", "nodeName": node, "devices": [{"name": "d0"}],
                              "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}})
    async with dra_node(cp, containerd, tmp_path, dirs, node=node, sliceWipeDelaySeconds=1) as env:
        await wait_for(lambda: _gone(cp, "resourceslice", stale), 30, "the stale slice wiped at start")
        kubeconfig = await anyio.to_thread.run_sync(cp.node_kubeconfig, node)
        driver = start_fakegpu(node, kubeconfig, dirs, tmp_path / "fakegpu.log")
        try:
            await wait_for(lambda: _true(registered(env) == [DRIVER_NAME]), 30, "the driver registered")
            name = slice_name(node, DRIVER_NAME)
            await wait_for(lambda: get_json(cp, "resourceslice", name), 30, "the driver's ResourceSlice")
            driver.kill()  # no clean-up: its slice and sockets stay behind
            await anyio.to_thread.run_sync(driver.wait, 10)
            await wait_for(lambda: _gone(cp, "resourceslice", name), 30, "the killed driver's slice wiped")
            assert registered(env) == []
        finally:
            driver.kill()
            await anyio.to_thread.run_sync(driver.wait, 10)


def start_fakegpu(node: str, kubeconfig: Path, dirs: Dirs, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "drivers.fakegpu", "--kubeconfig", str(kubeconfig), "--node-name", node,
             "--registry-dir", str(dirs.registry), "--plugin-dir", str(dirs.plugin), "--cdi-dir", str(dirs.cdi)],
            stdout=out, stderr=subprocess.STDOUT)


EXAMPLE_DRIVER = os.environ.get("NODEAGENT_DRA_EXAMPLE_DRIVER", "")
EXAMPLE_DRIVER_NAME = "gpu.example.com"


@pytest.mark.skipif(not EXAMPLE_DRIVER, reason="opt-in: NODEAGENT_DRA_EXAMPLE_DRIVER=<dra-example-kubeletplugin "
                                               "binary> (see docs/DRA.md for how to build it)")
async def test_upstream_dra_example_driver_against_nodeagent(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path, dirs: Dirs,
        gpu_names: tuple[str, str]) -> None:
    """sigs.k8s.io/dra-example-driver's kubelet plugin (Go, the kubeletplugin helper of
    k8s.io/dynamic-resource-allocation) on the node's credentials: it registers with nodeagent,
    publishes its ResourceSlice, the scheduler allocates one of its GPUs, nodeagent prepares it and
    the container gets the env of its CDI spec; deleting the pod unprepares it (its spec goes)."""
    cp = control_plane
    name, template = gpu_names
    async with dra_node(cp, containerd, tmp_path, dirs) as env:
        node = env.node
        kubeconfig = await anyio.to_thread.run_sync(cp.node_kubeconfig, node)
        await apply(cp, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                         "metadata": {"name": EXAMPLE_DRIVER_NAME},
                         "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{EXAMPLE_DRIVER_NAME}"'}}]}})
        driver = start_example_driver(node, kubeconfig, dirs, tmp_path / "example-driver.log")
        try:
            await wait_for(lambda: _true(registered(env) == [EXAMPLE_DRIVER_NAME]), 60, "the example driver registered")

            async def published() -> bool:
                slices = await get_json(cp, "resourceslices", "--field-selector", f"spec.nodeName={node}")
                return any(s["spec"]["driver"] == EXAMPLE_DRIVER_NAME for s in (slices or {}).get("items", []))

            await wait_for(published, 60, "the example driver's ResourceSlice")
            tpl = claim_template(template)
            tpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = EXAMPLE_DRIVER_NAME
            await apply(cp, tpl, gpu_pod(name, node, template))
            claim = await allocated_claim(cp, name)
            [result] = claim["status"]["allocation"]["devices"]["results"]
            pod = await wait_for(lambda: _running(cp, name), 60, f"pod {name} Running")
            index = result["device"].removeprefix("gpu-")
            out = await exec_in_pod(env, pod["metadata"]["uid"],
                                    f'echo "$GPU_DEVICE_{index} $GPU_DEVICE_{index}_RESOURCE_CLAIM '
                                    '$DRA_RESOURCE_DRIVER_NAME"')
            assert out == f"{result['device']} {claim['metadata']['uid']} {EXAMPLE_DRIVER_NAME}\n"
            spec_files = [p for p in dirs.cdi.iterdir() if claim["metadata"]["uid"] in p.name]
            assert spec_files, "the driver's CDI spec for the claim"

            await kubectl(cp, "delete", "pod", name, "--wait=false")
            await wait_for(lambda: _true(not any(p.exists() for p in spec_files)), 60,
                           "the claim unprepared (the driver removed its CDI spec)")
            await wait_for(lambda: _true(checkpoint(env).entries == {}), 30, "the checkpoint emptied")
        finally:
            driver.terminate()
            await anyio.to_thread.run_sync(driver.wait, 30)


def start_example_driver(node: str, kubeconfig: Path, dirs: Dirs, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [EXAMPLE_DRIVER, "--node-name", node, "--kubeconfig", str(kubeconfig), "--cdi-root", str(dirs.cdi),
             "--kubelet-registrar-directory-path", str(dirs.registry),
             "--kubelet-plugins-directory-path", str(dirs.plugin), "--num-devices", "2", "-v", "4"],
            env={**os.environ, "NODE_NAME": node}, stdout=out, stderr=subprocess.STDOUT)


async def exec_in_pod(env: AgentEnv, uid: str, script: str) -> str:
    """Run ``script`` inside the pod's running container (CRI ExecSync): what the container sees."""
    container = await wait_for(lambda: running_container(env, uid), 30, "the pod's container running")
    result = await env.client.exec_sync(container.id, ["sh", "-c", script], timeout=10)
    assert result.exit_code == 0, result
    return str(result.stdout.decode())


async def _running(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    pod = await get_json(cp, "pod", name)
    return pod if ((pod or {}).get("status") or {}).get("phase") == "Running" else None


async def _gone(cp: ControlPlane, *what: str) -> bool:
    return await get_json(cp, *what) is None


async def _true(value: bool) -> bool:
    return value
