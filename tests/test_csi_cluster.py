"""Persistent volumes in a cluster (issue 18): the real control plane — the PV binder, the
attach-detach and ephemeral-volume controllers, the StatefulSet controller, the scheduler's
volume binding — and containerd, with nodeagent as the node and CSI drivers registered through
the real registration socket: the hostpath CSI test driver (drivers/csihostpath, with its
provisioner loop on the admin credentials) and the upstream mock driver from k8s.io/kubernetes
(built as ``csi-mock``) behind the upstream external-attacher.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane import ControlPlane
from controlplane import build as cp_build
from cri import RuntimeClient
from cri import types as t
from drivers.csihostpath import FAIL_KEY, MESSAGE_KEY, TOPOLOGY_KEY, HostPathDriver
from drivers.csihostpath.controller import Controller
from nodeagent import labels as L
from nodeagent.apiclient import make_api_client
from nodeagent.mounttable import mount_points, mounts_under
from tests.agent_helpers import AgentEnv, runtime_objects, wait_for
from tests.test_cluster_node import (
    cluster_config,
    delete_node,
    get_json,
    kubectl,
    ready_cluster_node,
    wait_node_ready,
)
from tests.test_cluster_pods import GRACEFUL, api_pod, event_reasons
from tests.test_kubelet_server import _client_context, _get

pytestmark = pytest.mark.anyio

CSI_TUNING = {"waitSeconds": 2, "pollSeconds": 0.2, "reconcilePeriodSeconds": 5,
              "resyncSeconds": 1}


@dataclass
class Storage:
    """A hostpath test driver serving one node, with its CSIDriver and StorageClass."""

    driver: HostPathDriver
    name: str
    storage_class: str


@pytest.fixture
def base() -> Iterator[Path]:
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="csi-c-", dir="/tmp"))
    try:
        yield path
    finally:
        for mount in mounts_under(path):
            subprocess.run(["umount", "-l", str(mount)], check=False)
        subprocess.run(f"losetup -j {path}/state/volumes/*.img 2>/dev/null | cut -d: -f1 | xargs -r losetup -d",
                       shell=True, check=False)
        shutil.rmtree(path, ignore_errors=True)


async def apply(cp: ControlPlane, *objects: dict[str, Any]) -> None:
    await kubectl(cp, "apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))


def csidriver(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": name},
            "spec": {"attachRequired": False, "podInfoOnMount": True, "fsGroupPolicy": "File",
                     "volumeLifecycleModes": ["Persistent", "Ephemeral"], **spec}}


def storage_class(name: str, driver: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": driver, "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True, **extra}


def claim(name: str, storage_class: str | None, *, size: str = "8Mi", block: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}},
                            "volumeMode": "Block" if block else "Filesystem"}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
            "spec": spec}


def volume_pod(name: str, node: str, volumes: list[dict[str, Any]], command: str = GRACEFUL, *,
               mounts: list[dict[str, Any]] | None = None, devices: list[dict[str, Any]] | None = None,
               pin: bool = False) -> dict[str, Any]:
    pod = api_pod(name, node, command=command, grace=5)
    container = pod["spec"]["containers"][0]
    container["volumeMounts"] = mounts if mounts is not None else [{"name": v["name"], "mountPath": f"/{v['name']}"}
                                                                   for v in volumes]
    if devices is not None:
        container["volumeDevices"] = devices
    pod["spec"]["volumes"] = volumes
    if pin:  # bound to the node directly, as a pod the scheduler cannot place yet would not be
        pod["spec"].pop("nodeSelector")
        pod["spec"]["nodeName"] = node
    return pod


def claim_volume(name: str, claim_name: str) -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim_name}}


async def exec_in(env: AgentEnv, uid: str, script: str) -> str:
    async def container() -> t.Container | None:
        _, containers = await runtime_objects(env.client, env.node)
        found = [c for c in containers if c.labels.get(L.POD_UID) == uid and c.state == t.ContainerState.CONTAINER_RUNNING]
        return found[0] if found else None

    found: t.Container = await wait_for(container, 60, f"pod {uid}'s container running")
    result = await env.client.exec_sync(found.id, ["sh", "-c", script], timeout=10)
    assert result.exit_code == 0, result
    return result.stdout.decode()


async def pod_uid(cp: ControlPlane, name: str, timeout: float = 90.0, *, other_than: str = "") -> str:
    async def running() -> str | None:
        pod = await get_json(cp, "pod", name)
        uid = ((pod or {}).get("metadata") or {}).get("uid", "")
        return uid if uid and uid != other_than and ((pod or {}).get("status") or {}).get("phase") == "Running" else None

    found: str = await wait_for(running, timeout, f"pod {name} Running")
    return found


async def gone(cp: ControlPlane, *args: str, timeout: float = 60.0) -> None:
    async def absent() -> bool:
        return await get_json(cp, *args) is None

    await wait_for(absent, timeout, f"{' '.join(args)} gone")


async def _true(value: bool) -> bool:
    return value


@asynccontextmanager
async def hostpath(cp: ControlPlane, node: str, base: Path, *, attach: bool = False, **spec: Any) -> AsyncIterator[Storage]:
    """The test driver for ``node`` with its controller loops on the admin credentials."""
    suffix = uuid.uuid4().hex[:6]
    name = f"hp-{suffix}.csi.nodeagent.test"
    driver = HostPathDriver(registry_dir=base / "registry", plugin_dir=base / "plugin", state_dir=base / "state",
                            node_id=node, driver_name=name, attach_required=attach)
    await apply(cp, csidriver(name, attachRequired=attach, **spec), storage_class(f"sc-{suffix}", name))
    api = make_api_client(cp.kubeconfig_admin, field_manager="csihostpath")
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            await tg.start(Controller(driver, api, attach=attach, period=0.2).run)
            yield Storage(driver, name, f"sc-{suffix}")
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await api.close()
            await kubectl(cp, "delete", "storageclass", f"sc-{suffix}", "--wait=false", check=False)
            await kubectl(cp, "delete", "csidriver", name, "--wait=false", check=False)


@asynccontextmanager
async def csi_node(cp: ControlPlane, containerd: Any, base: Path, agent: dict[str, Any] | None = None,
                   **csi: Any) -> AsyncIterator[AgentEnv]:
    config = await cluster_config(cp, containerd, base, plugins_registry_dir=base / "registry",
                                  plugins={"csi": {**CSI_TUNING, **csi}}, volume_stats_agg_period=1.0,
                                  **(agent or {}))
    async with ready_cluster_node(cp, containerd, config) as env:
        yield env


async def registered(cp: ControlPlane, node: str, driver: str) -> dict[str, Any]:
    async def installed() -> dict[str, Any] | None:
        csinode = await get_json(cp, "csinode", node)
        drivers = ((csinode or {}).get("spec") or {}).get("drivers") or []
        return csinode if any(d["name"] == driver for d in drivers) else None

    found: dict[str, Any] = await wait_for(installed, 30, f"driver {driver} in the CSINode of {node}")
    return found


def target_mounts(env: AgentEnv, uid: str) -> list[Path]:
    prefix = env.config.root_dir / "pods" / uid / "volumes" / "kubernetes.io~csi"
    return [p for p in mount_points() if str(p).startswith(str(prefix) + "/")]


# --- a StatefulSet's data outlives its pod ---------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_statefulset_pod_data_outlives_the_pod(control_plane: ControlPlane, containerd: Any,
                                                      base: Path) -> None:
    cp = control_plane
    port = _free_port()
    server = {"enable_server": True, "address": "127.0.0.1", "port": port}
    async with csi_node(cp, containerd, base, server) as env, hostpath(cp, env.node, base) as storage:
        csinode = await registered(cp, env.node, storage.name)
        assert csinode["spec"]["drivers"] == [{"name": storage.name, "nodeID": env.node,
                                               "topologyKeys": [TOPOLOGY_KEY]}]
        assert csinode["metadata"]["ownerReferences"][0]["name"] == env.node
        node = await get_json(cp, "node", env.node)
        assert node["metadata"]["labels"][TOPOLOGY_KEY] == env.node
        assert json.loads(node["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"]) == {storage.name: env.node}
        assert node["metadata"]["annotations"]["volumes.kubernetes.io/controller-managed-attach-detach"] == "true"
        name = f"web-{uuid.uuid4().hex[:5]}"
        template = volume_pod(name, env.node, [], "[ -f /data/id ] || cat /proc/sys/kernel/random/uuid > /data/id; "
                              + GRACEFUL, mounts=[{"name": "data", "mountPath": "/data"}])
        sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": "default"},
               "spec": {"serviceName": name, "replicas": 1, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}}, "spec": template["spec"]},
                        "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                                  "spec": claim("x", storage.storage_class)["spec"]}]}}
        await apply(cp, sts)
        try:
            first = await pod_uid(cp, f"{name}-0")
            written = (await exec_in(env, first, "cat /data/id")).strip()
            assert len(written) == 36
            pvc = await get_json(cp, "pvc", f"data-{name}-0")
            pv = pvc["spec"]["volumeName"]
            unique = f"kubernetes.io/csi/{storage.name}^{(await get_json(cp, 'pv', pv))['spec']['csi']['volumeHandle']}"

            async def in_use() -> bool:
                status = (await get_json(cp, "node", env.node))["status"]
                return unique in (status.get("volumesInUse") or [])

            await wait_for(in_use, 30, "the volume in node.status.volumesInUse")
            assert len(target_mounts(env, first)) == 1
            await _volume_stats_show_the_claim(cp, port, first, f"data-{name}-0")
            await kubectl(cp, "delete", "pod", f"{name}-0", "--wait=false")
            second = await pod_uid(cp, f"{name}-0", other_than=first)
            assert (await exec_in(env, second, "cat /data/id")).strip() == written
            assert storage.driver.count("NodeUnpublishVolume") >= 1
            assert not target_mounts(env, first)  # the first pod's publication is gone
            assert storage.driver.count("CreateVolume") == 1  # the same volume, not a new one
        finally:
            await kubectl(cp, "delete", "statefulset", name, "--wait=false", check=False)
            await kubectl(cp, "delete", "pod", f"{name}-0", "--grace-period=1", check=False)
            await kubectl(cp, "delete", "pvc", f"data-{name}-0", "--wait=false", check=False)


async def _volume_stats_show_the_claim(cp: ControlPlane, port: int, uid: str, pvc: str) -> None:
    """The claim's volume in the Summary API under the pod's volume name with its pvcRef, and
    in kubelet_volume_stats_*: the driver's NodeGetVolumeStats figures (the test driver gives
    the claim's 8Mi as capacity; a walk of the mount would give the host filesystem's)."""
    admin = await anyio.to_thread.run_sync(
        lambda: cp.pki.issue("csi-stats-admin", "csi-stats-admin", orgs=("system:masters",), client=True))
    context = _client_context(admin.cert, admin.key)

    async def text(path: str) -> str:
        status, _, body = await _get(port, path, context)
        assert status == 200, (path, status, body[:300])
        return body.decode()

    async def measured() -> dict[str, Any] | None:
        pods = [p for p in json.loads(await text("/stats/summary"))["pods"] if p["podRef"]["uid"] == uid]
        volumes = [v for v in (pods[0].get("volume") or []) if v["name"] == "data"] if pods else []
        return volumes[0] if volumes and volumes[0].get("usedBytes") else None

    volume = await wait_for(measured, 60, "the claim's volume in the Summary API with figures")
    assert volume["pvcRef"] == {"namespace": "default", "name": pvc}
    assert volume["capacityBytes"] == 8 << 20 and 0 < volume["usedBytes"] <= volume["capacityBytes"]
    series = {f.name: f for f in text_string_to_metric_families(await text("/metrics"))}
    [used] = [s for s in series["kubelet_volume_stats_used_bytes"].samples
              if s.labels == {"namespace": "default", "persistentvolumeclaim": pvc}]
    assert used.value > 0


# --- waiting for a claim --------------------------------------------------------------------


async def test_pod_with_an_unbound_claim_waits_with_the_kubelets_reason_and_starts_once_bound(
        control_plane: ControlPlane, containerd: Any, base: Path) -> None:
    cp = control_plane
    async with csi_node(cp, containerd, base) as env, hostpath(cp, env.node, base) as storage:
        await registered(cp, env.node, storage.name)
        suffix = uuid.uuid4().hex[:5]
        claim_name, pv_name = f"lonely-{suffix}", f"static-{suffix}"
        # No class: only a PV made by hand can bind it (the PV binder's static binding).
        await apply(cp, {**claim(claim_name, ""), "spec": {**claim(claim_name, "")["spec"], "storageClassName": ""}})
        await apply(cp, volume_pod(f"waits-{suffix}", env.node, [claim_volume("data", claim_name)],
                                   "echo bound > /data/hello; " + GRACEFUL, pin=True))
        pod = await get_json(cp, "pod", f"waits-{suffix}")
        uid = pod["metadata"]["uid"]
        expected = ("Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to "
                    f"process volumes=[data]: error processing PVC default/{claim_name}: PVC is not bound")

        async def failed_mount() -> dict[str, Any] | None:
            event = (await event_reasons(cp, uid)).get("FailedMount")
            return event if event and event["message"] == expected else None

        event = await wait_for(failed_mount, 60, "a FailedMount Event with the kubelet's words")
        assert event["type"] == "Warning" and event["source"]["component"] in ("kubelet", "nodeagent")
        status = (await get_json(cp, "pod", f"waits-{suffix}"))["status"]
        assert status["phase"] == "Pending"
        assert status["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
        assert not await _running(env, uid)
        made = storage.driver.create_volume(pv_name, 8 << 20, False, {})
        await apply(cp, {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
                         "spec": {"capacity": {"storage": "8Mi"}, "accessModes": ["ReadWriteOnce"],
                                  "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                                  "csi": {"driver": storage.name, "volumeHandle": made["id"]}}})
        started = await pod_uid(cp, f"waits-{suffix}", 90)
        assert started == uid
        assert (storage.driver.volume_path(made["id"]) / "hello").read_text() == "bound\n"
        await kubectl(cp, "delete", "pod", f"waits-{suffix}", "--grace-period=1")
        await kubectl(cp, "delete", "pvc", claim_name, "--wait=false")
        await kubectl(cp, "delete", "pv", pv_name, "--wait=false")


async def _running(env: AgentEnv, uid: str) -> bool:
    _, containers = await runtime_objects(env.client, env.node)
    return any(c.labels.get(L.POD_UID) == uid and c.state == t.ContainerState.CONTAINER_RUNNING for c in containers)


# --- Block volumes ------------------------------------------------------------------------------


async def test_block_mode_volume_is_a_device_in_the_container(control_plane: ControlPlane, containerd: Any,
                                                              base: Path) -> None:
    cp = control_plane
    async with csi_node(cp, containerd, base) as env, hostpath(cp, env.node, base) as storage:
        await registered(cp, env.node, storage.name)
        suffix = uuid.uuid4().hex[:5]
        await apply(cp, claim(f"raw-{suffix}", storage.storage_class, block=True))
        await apply(cp, volume_pod(f"blk-{suffix}", env.node, [claim_volume("raw", f"raw-{suffix}")], mounts=[],
                                   devices=[{"name": "raw", "devicePath": "/dev/xvda"}]))
        uid = await pod_uid(cp, f"blk-{suffix}")
        out = await exec_in(env, uid, "test -b /dev/xvda && echo block; printf nodeagent | dd of=/dev/xvda "
                                      "conv=notrunc 2>/dev/null; dd if=/dev/xvda bs=9 count=1 2>/dev/null")
        assert out == "block\nnodeagent"
        image = next((base / "state" / "volumes").glob("*.img"))
        assert image.read_bytes()[:9] == b"nodeagent"  # it went to the volume, not to a copy
        events = await event_reasons(cp, uid)
        assert "MapVolume.MapPodDevice succeeded" in events["SuccessfulMountVolume"]["message"]
        await kubectl(cp, "delete", "pod", f"blk-{suffix}", "--grace-period=1")
        await wait_for(lambda: _true(storage.driver.count("NodeUnstageVolume") == 1), 30, "the block volume unstaged")
        await kubectl(cp, "delete", "pvc", f"raw-{suffix}", "--wait=false")


# --- generic ephemeral volumes -------------------------------------------------------------------


async def test_generic_ephemeral_volume_is_created_used_and_deleted_with_its_pod(
        control_plane: ControlPlane, containerd: Any, base: Path) -> None:
    cp = control_plane
    async with csi_node(cp, containerd, base) as env, hostpath(cp, env.node, base) as storage:
        await registered(cp, env.node, storage.name)
        name = f"eph-{uuid.uuid4().hex[:5]}"
        template = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
            "spec": claim("x", storage.storage_class)["spec"]}}}
        await apply(cp, volume_pod(name, env.node, [template], "echo eph > /scratch/f; " + GRACEFUL))
        uid = await pod_uid(cp, name)
        pvc = await get_json(cp, "pvc", f"{name}-scratch")
        assert pvc["metadata"]["ownerReferences"][0]["uid"] == uid and pvc["metadata"]["ownerReferences"][0]["controller"]
        pv = pvc["spec"]["volumeName"]
        handle = (await get_json(cp, "pv", pv))["spec"]["csi"]["volumeHandle"]
        assert (await exec_in(env, uid, "cat /scratch/f")) == "eph\n"
        assert (storage.driver.volume_path(handle) / "f").read_text() == "eph\n"
        await kubectl(cp, "delete", "pod", name, "--grace-period=1")
        await gone(cp, "pvc", f"{name}-scratch")
        await gone(cp, "pv", pv)
        assert not storage.driver.volume_path(handle).exists()
        assert storage.driver.count("DeleteVolume") == 1


async def test_csi_inline_ephemeral_volume_is_published_for_its_pod_only(
        control_plane: ControlPlane, containerd: Any, base: Path) -> None:
    cp = control_plane
    async with csi_node(cp, containerd, base) as env, hostpath(cp, env.node, base) as storage:
        await registered(cp, env.node, storage.name)
        name = f"inline-{uuid.uuid4().hex[:5]}"
        inline = {"name": "scratch", "csi": {"driver": storage.name, "volumeAttributes": {"color": "blue"}}}
        await apply(cp, volume_pod(name, env.node, [inline], "echo x > /scratch/f; " + GRACEFUL))
        uid = await pod_uid(cp, name)
        assert (await exec_in(env, uid, "cat /scratch/f")) == "x\n"
        assert storage.driver.count("NodeStageVolume") == 0 and storage.driver.count("NodePublishVolume") == 1
        await kubectl(cp, "delete", "pod", name, "--grace-period=1")
        await wait_for(lambda: _true(storage.driver.count("NodeUnpublishVolume") == 1), 30, "unpublished")
        assert not list((base / "state" / "ephemeral").glob("*"))


# --- a driver that fails --------------------------------------------------------------------------


async def test_a_driver_that_fails_publish_leaves_that_pod_waiting_with_its_message_and_others_run(
        control_plane: ControlPlane, containerd: Any, base: Path) -> None:
    cp = control_plane
    async with csi_node(cp, containerd, base) as env, hostpath(cp, env.node, base) as storage:
        await registered(cp, env.node, storage.name)
        suffix = uuid.uuid4().hex[:5]
        failing = f"fail-{suffix}"
        await apply(cp, storage_class(failing, storage.name, parameters={FAIL_KEY: "NodePublishVolume",
                                                                         MESSAGE_KEY: "injected publish failure"}))
        try:
            await apply(cp, claim(f"bad-{suffix}", failing), claim(f"good-{suffix}", storage.storage_class))
            await apply(cp, volume_pod(f"bad-{suffix}", env.node, [claim_volume("data", f"bad-{suffix}")]),
                        volume_pod(f"good-{suffix}", env.node, [claim_volume("data", f"good-{suffix}")]),
                        api_pod(f"plain-{suffix}", env.node, grace=1))
            await pod_uid(cp, f"good-{suffix}")
            await pod_uid(cp, f"plain-{suffix}")
            bad = await get_json(cp, "pod", f"bad-{suffix}")
            uid = bad["metadata"]["uid"]
            pv = (await get_json(cp, "pvc", f"bad-{suffix}"))["spec"]["volumeName"]
            operation = (f'MountVolume.SetUp failed for volume "{pv}" : rpc error: code = Internal desc = injected '
                         "publish failure")

            async def both() -> dict[str, Any] | None:
                events = [e for e in ((await get_json(cp, "events", "--field-selector",
                                                      f"involvedObject.uid={uid}")) or {}).get("items", [])
                          if e["reason"] == "FailedMount"]
                messages = {e["message"] for e in events}
                pod_level = [m for m in messages if m.startswith("Unable to attach or mount volumes: unmounted "
                                                                 "volumes=[data], unattached volumes=[], failed to "
                                                                 "process volumes=[]: ")]
                return {"events": events} if operation in messages and pod_level and operation in pod_level[0] \
                    else None

            await wait_for(both, 60, "the driver's message in FailedMount Events")
            bad = await get_json(cp, "pod", f"bad-{suffix}")
            assert bad["status"]["phase"] == "Pending"
            assert bad["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
            assert not await _running(env, uid)
            for other in (f"good-{suffix}", f"plain-{suffix}"):
                assert (await get_json(cp, "pod", other))["status"]["phase"] == "Running"
        finally:
            for kind, n in (("pod", f"bad-{suffix}"), ("pod", f"good-{suffix}"), ("pod", f"plain-{suffix}"),
                            ("pvc", f"bad-{suffix}"), ("pvc", f"good-{suffix}"), ("storageclass", failing)):
                await kubectl(cp, "delete", kind, n, "--wait=false", "--grace-period=1", check=False)


# --- an agent SIGKILLed with a mounted volume -------------------------------------------------------


def _start_agent(config_path: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "nodeagent", "run", "--config", str(config_path)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, env={**os.environ})


async def test_agent_sigkilled_with_a_mounted_volume_adopts_it_and_unmounts_it_once(
        control_plane: ControlPlane, containerd: Any, base: Path) -> None:
    cp = control_plane
    config = await cluster_config(cp, containerd, base, plugins_registry_dir=base / "registry",
                                  plugins={"csi": CSI_TUNING})
    config_path = base / "agent.yaml"
    config_path.write_text(config.to_yaml())
    log = base / "agent.log"
    agent = _start_agent(config_path, log)
    name = f"keep-{uuid.uuid4().hex[:5]}"
    try:
        async with RuntimeClient(containerd.endpoint) as client, hostpath(cp, config.node_name, base) as storage:
            env = AgentEnv(agent=None, config=config, manifests=base / "manifests", client=client)  # type: ignore[arg-type]
            await wait_node_ready(cp, config.node_name)
            await registered(cp, config.node_name, storage.name)
            await apply(cp, claim(f"{name}-data", storage.storage_class))
            await apply(cp, volume_pod(name, config.node_name, [claim_volume("data", f"{name}-data")],
                                       "echo before > /data/f; " + GRACEFUL))
            uid = await pod_uid(cp, name)
            [target] = target_mounts(env, uid)
            assert storage.driver.count("NodePublishVolume") == 1 and storage.driver.count("NodeStageVolume") == 1
            agent.send_signal(signal.SIGKILL)
            agent.wait(10)
            assert await _running(env, uid)  # the pod outlives its agent
            before = log.stat().st_size
            agent = _start_agent(config_path, log)

            async def adopted() -> bool:
                # The restarted agent's worker took the pod through setup again (its csi prepare
                # among it) and has it running: the agent logs each state it reaches.
                lines = log.read_bytes()[before:].decode(errors="replace").splitlines()
                return any("pod state" in line and "state=Running" in line and uid in line for line in lines)

            await wait_for(adopted, 90, "the restarted agent running the pod again")
            assert await exec_in(env, uid, "cat /data/f; echo after >> /data/f") == "before\n"
            assert storage.driver.count("NodePublishVolume") == 1 and storage.driver.count("NodeStageVolume") == 1
            assert [m for m in mount_points() if m == target] == [target]  # mounted once, not twice
            await kubectl(cp, "delete", "pod", name, "--grace-period=1")
            await gone(cp, "pod", name)
            await wait_for(lambda: _true(storage.driver.count("NodeUnstageVolume") == 1), 60, "unstaged")
            assert storage.driver.count("NodeUnpublishVolume", str(target)) == 1
            assert not mounts_under(config.root_dir)
            pv = (await get_json(cp, "pvc", f"{name}-data"))["spec"]["volumeName"]
            handle = (await get_json(cp, "pv", pv))["spec"]["csi"]["volumeHandle"]
            assert (storage.driver.volume_path(handle) / "f").read_text() == "before\nafter\n"
            await kubectl(cp, "delete", "pvc", f"{name}-data", "--wait=false")
    finally:
        with anyio.CancelScope(shield=True):
            await kubectl(cp, "delete", "pod", name, "--force", "--grace-period=0", check=False)
            if agent.poll() is None:
                await anyio.sleep(3)
                agent.send_signal(signal.SIGTERM)
                agent.wait(15)
            await delete_node(cp, config.node_name)


# --- the upstream mock CSI driver and external-attacher -----------------------------------------------


@pytest.fixture(scope="module")
def csi_binaries() -> dict[str, Path]:
    names = ["csi-mock", "csi-attacher"]
    missing = [n for n in names if not cp_build.is_built(n)]
    if missing:
        cp_build.build(missing)
    return {n: cp_build.binary(n) for n in names}


async def test_upstream_mock_driver_is_attached_by_the_real_attacher_then_staged_and_published(
        control_plane: ControlPlane, containerd: Any, base: Path, csi_binaries: dict[str, Path]) -> None:
    cp = control_plane
    mock = f"mock-{uuid.uuid4().hex[:5]}.storage.k8s.io"
    socket = base / "mock" / "csi.sock"
    socket.parent.mkdir()
    (base / "registry").mkdir()
    logs = base / "logs"
    logs.mkdir()
    driver = subprocess.Popen([str(csi_binaries["csi-mock"]), f"--endpoint={socket}", f"--name={mock}",
                               f"--registration-socket={base / 'registry' / f'{mock}-reg.sock'}"],
                              stdout=(logs / "csi-mock.log").open("wb"), stderr=subprocess.STDOUT)
    attacher = subprocess.Popen([str(csi_binaries["csi-attacher"]), f"--csi-address={socket}",
                                 f"--kubeconfig={cp.kubeconfig_admin}", "--leader-election=false", "--v=3",
                                 "--timeout=30s", "--resync=2s"],
                                stdout=(logs / "csi-attacher.log").open("wb"), stderr=subprocess.STDOUT)
    pv_name = f"mock-pv-{uuid.uuid4().hex[:5]}"
    try:
        await apply(cp, csidriver(mock, attachRequired=True, volumeLifecycleModes=["Persistent"]))
        async with csi_node(cp, containerd, base) as env:
            csinode = await registered(cp, env.node, mock)
            # The mock answers NodeGetInfo with its driver name as the node ID.
            assert [d for d in csinode["spec"]["drivers"] if d["name"] == mock][0]["nodeID"] == mock
            await apply(cp, {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
                             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                                      "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                                      # "Mock Volume 1", which the mock has from its start
                                      "csi": {"driver": mock, "volumeHandle": "1"}}},
                        {**claim(pv_name, ""), "spec": {**claim(pv_name, "")["spec"], "storageClassName": "",
                                                        "volumeName": pv_name, "resources": {
                                                            "requests": {"storage": "1Gi"}}}})
            await apply(cp, volume_pod(pv_name, env.node, [claim_volume("data", pv_name)]))
            uid = await pod_uid(cp, pv_name, 120)
            attachments = [a for a in (await get_json(cp, "volumeattachments"))["items"]
                           if a["spec"]["source"].get("persistentVolumeName") == pv_name]
            assert len(attachments) == 1 and attachments[0]["status"]["attached"] is True
            assert attachments[0]["spec"]["nodeName"] == env.node and attachments[0]["spec"]["attacher"] == mock
            node = await get_json(cp, "node", env.node)
            assert f"kubernetes.io/csi/{mock}^1" in node["status"]["volumesInUse"]
            assert f"kubernetes.io/csi/{mock}^1" in [v["name"] for v in node["status"].get("volumesAttached") or []]
            assert target_mounts(env, uid) == []  # the mock mounts nothing; its target is a directory
            assert (env.config.root_dir / "pods" / uid / "volumes" / "kubernetes.io~csi" / pv_name / "mount").is_dir()
            await kubectl(cp, "delete", "pod", pv_name, "--grace-period=1")
            name = attachments[0]["metadata"]["name"]
            await gone(cp, "volumeattachment", name, timeout=120)  # detached once no longer in use
            assert not (env.config.root_dir / "pods" / uid).exists()
    finally:
        for proc in (attacher, driver):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        with anyio.CancelScope(shield=True):
            await kubectl(cp, "delete", "pvc", pv_name, "--wait=false", check=False)
            await kubectl(cp, "delete", "pv", pv_name, "--wait=false", check=False)
            await kubectl(cp, "delete", "csidriver", mock, "--wait=false", check=False)
