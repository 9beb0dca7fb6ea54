"""The csi stage against the hostpath CSI test driver (drivers/csihostpath) served in-process:
real gRPC, real bind mounts and loop devices, the kubelet's directory layout — with the shared
fake pod context and object store instead of an agent and an API server (the integration tests
in test_csi_cluster.py have both).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from conformance.fakecontext import NODE, FakeObjects, FakePodContext
from drivers.csihostpath import FAIL_KEY, MESSAGE_KEY, TOPOLOGY_KEY, HostPathDriver
from nodeagent.model import Pod
from nodeagent.mounttable import is_mount_point, mounts_under
from nodeagent.objects.kinds import (
    CSI_DRIVER,
    CSI_NODE,
    PERSISTENT_VOLUME,
    PERSISTENT_VOLUME_CLAIM,
    VOLUME_ATTACHMENT,
)
from nodeagent.objects.kinds import (
    NODE as NODE_KIND,
)
from nodeagent.pluginwatcher import PluginInfo
from nodeagent.stages import Verdict
from plugins.csi import CsiStage, plugin
from plugins.csi.layout import Layout, attachment_name, inline_volume_id
from plugins.csi.nodeinfo import NODE_ID_ANNOTATION

pytestmark = pytest.mark.anyio

DRIVER = "hostpath.csi.nodeagent.test"


@dataclass
class _Handle:
    settings: Any
    objects: FakeObjects
    node: Any = NODE
    runtime: Any = None
    events: list[Any] = field(default_factory=list)
    reported_in_use: set[str] | None = None
    """The volumes a Node status write listed in volumesInUse; None: every volume."""
    report_requests: list[str] = field(default_factory=list)

    async def publish(self, event: Any) -> None:
        self.events.append(event)

    def volume_reported_in_use(self, unique_name: str) -> bool:
        if self.reported_in_use is None or unique_name in self.reported_in_use:
            return True
        self.report_requests.append(unique_name)
        return False


class _NoSandboxes:
    async def list_pod_sandbox(self) -> list[Any]:
        return []


@dataclass
class Env:
    base: Path
    objects: FakeObjects
    driver: HostPathDriver
    handle: _Handle

    @property
    def root(self) -> Path:
        return self.base / "root"

    def stage(self, **config: Any) -> CsiStage:
        return plugin({"waitSeconds": 0, **config}, self.handle)

    def context(self, pod: Pod) -> FakePodContext:
        return FakePodContext(pod, stage="csi", objects=self.objects, pod_dir=self.root / "pods" / pod.uid)


@pytest.fixture
def base() -> Iterator[Path]:
    # Unix socket paths must stay under 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="csi-u-", dir="/tmp"))
    try:
        yield path
    finally:
        for mount in mounts_under(path):
            os.system(f"umount -l {mount}")
        shutil.rmtree(path, ignore_errors=True)


@asynccontextmanager
async def serving(base: Path, **driver: Any) -> AsyncIterator[Env]:
    objects = FakeObjects()
    objects.put(NODE_KIND, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE.name, "uid": "node-uid"}})
    objects.put(CSI_NODE)
    objects.put(CSI_DRIVER)
    objects.put(PERSISTENT_VOLUME_CLAIM)
    objects.put(PERSISTENT_VOLUME)
    objects.put(VOLUME_ATTACHMENT)
    hostpath = HostPathDriver(registry_dir=base / "reg", plugin_dir=base / "plugin", state_dir=base / "state",
                              node_id="node-1", **driver)
    handle = _Handle(SimpleNamespace(root_dir=base / "root"), objects, runtime=_NoSandboxes())
    async with anyio.create_task_group() as tg:
        await tg.start(hostpath.run)
        yield Env(base, objects, hostpath, handle)
        tg.cancel_scope.cancel()


async def register(env: Env, stage: CsiStage) -> str:
    return await stage.registrations.register(
        PluginInfo("CSIPlugin", DRIVER, str(env.driver.endpoint), ("1.0.0",)), str(env.driver.registration_socket))


def csidriver(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": DRIVER},
            "spec": {"attachRequired": False, "fsGroupPolicy": "ReadWriteOnceWithFSType", **spec}}


def claim(name: str, *, bound_to: str | None = None, uid: str | None = None, owner: str | None = None,
          **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner, "controller": True}]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": bound_to or "",
                     "resources": {"requests": {"storage": "1Mi"}}},
            "status": {"phase": "Bound" if bound_to else "Pending", **status}}


def volume(name: str, handle: str, pvc: dict[str, Any], *, block: bool = False, **csi: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                     "volumeMode": "Block" if block else "Filesystem",
                     "claimRef": {"name": pvc["metadata"]["name"], "namespace": "default",
                                  "uid": pvc["metadata"]["uid"]},
                     "csi": {"driver": DRIVER, "volumeHandle": handle, **csi}}}


def provision(env: Env, name: str, *, block: bool = False, context: dict[str, str] | None = None,
              **csi: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A volume made by the driver, its PV and its bound PVC, put in the store."""
    made = env.driver.create_volume(f"pvc-{name}", 1 << 20, block, context or {})
    pvc = claim(name, bound_to=f"pv-{name}")
    pv = volume(f"pv-{name}", made["id"], pvc, block=block, volumeAttributes=made["context"], **csi)
    env.objects.put(PERSISTENT_VOLUME_CLAIM, *_others(env, PERSISTENT_VOLUME_CLAIM, name), pvc)
    env.objects.put(PERSISTENT_VOLUME, *_others(env, PERSISTENT_VOLUME, f"pv-{name}"), pv)
    return pvc, pv


def _others(env: Env, kind: Any, name: str) -> list[Any]:
    return [o for o in env.objects._objects.get(kind, []) if o["metadata"]["name"] != name]


def pod(name: str, uid: str, volumes: list[dict[str, Any]], *, mounts: list[dict[str, Any]] | None = None,
        devices: list[dict[str, Any]] | None = None, **spec: Any) -> Pod:
    container: dict[str, Any] = {"name": "main", "image": "busybox",
                                 "volumeMounts": mounts if mounts is not None else
                                 [{"name": v["name"], "mountPath": f"/{v['name']}"} for v in volumes]}
    if devices is not None:
        container["volumeDevices"] = devices
    return Pod.model_validate({"metadata": {"name": name, "namespace": "default", "uid": uid},
                               "spec": {"containers": [container], "volumes": volumes, **spec}})


def pvc_volume(name: str, claim_name: str) -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim_name}}


def mounts_of(ctx: FakePodContext) -> dict[str, str]:
    return {m.container_path: m.host_path for m in ctx.pod_additions.merged("main").mounts}


# --- registration ------------------------------------------------------------------------


async def test_registration_checks_versions_installs_the_driver_and_deregistration_removes_it(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        socket = str(env.driver.registration_socket)
        refused = await stage.registrations.register(PluginInfo("CSIPlugin", DRIVER, "", ("0.3.0", "2.0.0")), socket)
        assert refused == ("kubernetes.io/csi: RegisterPlugin for CSI driver 'hostpath.csi.nodeagent.test' failed. "
                           "None of the versions specified ['0.3.0', '2.0.0'] are supported.")
        assert await register(env, stage) == ""
        csinode = await env.objects.get(CSI_NODE, NODE.name)
        assert csinode is not None
        assert csinode["metadata"]["ownerReferences"][0] == {"apiVersion": "v1", "kind": "Node", "name": NODE.name,
                                                             "uid": "node-uid"}
        assert csinode["spec"]["drivers"] == [{"name": DRIVER, "nodeID": "node-1", "topologyKeys": [TOPOLOGY_KEY]}]
        node = await env.objects.get(NODE_KIND, NODE.name)
        assert node is not None
        assert json.loads(node["metadata"]["annotations"][NODE_ID_ANNOTATION]) == {DRIVER: "node-1"}
        assert node["metadata"]["labels"][TOPOLOGY_KEY] == "node-1"
        # The same driver and version again: refused (the kubelet's "higher version" rule).
        again = await stage.registrations.register(PluginInfo("CSIPlugin", DRIVER, "", ("1.0.0",)), "/other.sock")
        assert "Another driver with the same name is already registered with a higher supported version: '1.0.0'" \
            in again
        await stage.registrations.deregister(socket, "socket removed")
        assert stage.drivers.get(DRIVER) is None
        csinode = await env.objects.get(CSI_NODE, NODE.name)
        assert csinode is not None and csinode["spec"]["drivers"] == []
        node = await env.objects.get(NODE_KIND, NODE.name)
        assert node is not None and NODE_ID_ANNOTATION not in (node["metadata"].get("annotations") or {})
        assert [e.kind for e in env.handle.events] == ["CsiPluginRejected", "CsiDriverRegistered",
                                                       "CsiPluginRejected", "CsiDriverDeregistered"]


# --- PVC → PV → CSI ---------------------------------------------------------------------


async def test_unbound_claim_waits_with_the_kubelets_words_and_mounts_once_bound(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        await register(env, stage)
        env.objects.put(CSI_DRIVER, csidriver())
        env.objects.put(PERSISTENT_VOLUME_CLAIM, claim("data"))
        ctx = env.context(pod("web", "u1", [pvc_volume("data", "data")]))
        result = await stage.prepare(ctx)
        assert result.verdict is Verdict.RETRY and result.reason == "FailedMount"
        assert result.message == ("Unable to attach or mount volumes: unmounted volumes=[data], unattached "
                                  "volumes=[], failed to process volumes=[data]: error processing PVC default/data: "
                                  "PVC is not bound")
        assert ctx.pod_additions.stages() == set()
        provision(env, "data")
        assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
        target = Layout.target_path(ctx.pod_dir, "pv-data")
        assert mounts_of(ctx) == {"/data": str(target)}
        assert is_mount_point(target)
        record = json.loads((target.parent / "vol_data.json").read_text())
        assert record["specVolID"] == "pv-data" and record["driverName"] == DRIVER
        staging = env.root / "plugins/kubernetes.io/csi" / DRIVER / hashlib.sha256(
            record["volumeHandle"].encode()).hexdigest() / "globalmount"
        assert is_mount_point(staging)
        assert stage.volumes_in_use() == [f"kubernetes.io/csi/{DRIVER}^{record['volumeHandle']}"]
        await stage.unprepare(ctx)
        assert not target.parent.exists() and not staging.exists() and not mounts_under(env.root)
        assert stage.volumes_in_use() == []


async def test_a_shared_volume_is_staged_once_and_unstaged_after_its_last_pod(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        await register(env, stage)
        env.objects.put(CSI_DRIVER, csidriver())
        provision(env, "shared")
        first, second = (env.context(pod(n, n, [pvc_volume("v", "shared")])) for n in ("a", "b"))
        assert (await stage.prepare(first)).verdict is Verdict.CONTINUE
        assert (await stage.prepare(second)).verdict is Verdict.CONTINUE
        assert env.driver.count("NodeStageVolume") == 1 and env.driver.count("NodePublishVolume") == 2
        await stage.unprepare(first)
        assert env.driver.count("NodeUnpublishVolume") == 1 and env.driver.count("NodeUnstageVolume") == 0
        assert is_mount_point(Layout.target_path(second.pod_dir, "pv-shared"))
        await stage.unprepare(second)
        assert env.driver.count("NodeUnpublishVolume") == 2 and env.driver.count("NodeUnstageVolume") == 1
        assert not mounts_under(env.root)


async def test_a_restarted_agent_adopts_what_is_mounted_and_unmounts_it_once(base: Path) -> None:
    async with serving(base) as env:
        first = env.stage()
        await register(env, first)
        env.objects.put(CSI_DRIVER, csidriver())
        provision(env, "data")
        ctx = env.context(pod("web", "u1", [pvc_volume("data", "data")]))
        assert (await first.prepare(ctx)).verdict is Verdict.CONTINUE
        (Layout.target_path(ctx.pod_dir, "pv-data") / "file").write_text("kept")
        # A new process: nothing remembered, the volume still mounted.
        restarted = env.stage()
        restarted._reconstruct()
        assert restarted.volumes_in_use() == first.volumes_in_use() != []
        await register(env, restarted)
        again = env.context(ctx.pod)
        assert (await restarted.prepare(again)).verdict is Verdict.CONTINUE
        assert env.driver.count("NodeStageVolume") == 1 and env.driver.count("NodePublishVolume") == 1
        target = Layout.target_path(again.pod_dir, "pv-data")
        assert mounts_of(again) == {"/data": str(target)} and (target / "file").read_text() == "kept"
        assert [m for m in mounts_under(env.root) if m == target] == [target]
        adopted = [e for e in again.events if e.kind == "VolumeMounted"]
        assert len(adopted) == 1 and adopted[0].adopted
        await restarted.unprepare(again)
        await restarted.unprepare(again)  # idempotent
        assert env.driver.count("NodeUnpublishVolume") == 1 and env.driver.count("NodeUnstageVolume") == 1
        assert [f.read_text() for f in (env.base / "state" / "volumes").glob("*/file")] == ["kept"]


async def test_a_failing_publish_shows_the_drivers_message_and_leaves_no_directory(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        await register(env, stage)
        env.objects.put(CSI_DRIVER, csidriver())
        provision(env, "bad", context={FAIL_KEY: "NodePublishVolume", MESSAGE_KEY: "disk on fire"})
        ctx = env.context(pod("web", "u1", [pvc_volume("data", "bad")]))
        result = await stage.prepare(ctx)
        assert result.verdict is Verdict.RETRY and result.reason == "FailedMount"
        assert result.message.endswith('failed to process volumes=[]: MountVolume.SetUp failed for volume "pv-bad" : '
                                       "rpc error: code = Internal desc = disk on fire")
        assert result.retry_after is None  # a driver's failure backs off
        failed = [e for e in ctx.events if e.kind == "VolumeOperationFailed"]
        assert len(failed) == 1
        event = failed[0].kube_event()
        assert (event.type, event.reason, event.message) == (
            "Warning", "FailedMount",
            'MountVolume.SetUp failed for volume "pv-bad" : rpc error: code = Internal desc = disk on fire')
        await stage.prepare(ctx)
        assert len([e for e in ctx.events if e.kind == "VolumeOperationFailed"]) == 1  # not repeated
        assert not Layout.target_path(ctx.pod_dir, "pv-bad").exists()
        await stage.unprepare(ctx)
        assert not mounts_under(env.root)


async def test_a_driver_not_registered_yet_is_waited_for(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        env.objects.put(CSI_DRIVER, csidriver())
        provision(env, "data")
        ctx = env.context(pod("web", "u1", [pvc_volume("data", "data")]))
        result = await stage.prepare(ctx)
        assert result.verdict is Verdict.RETRY and result.retry_after is not None
        assert ("MountVolume.SetUp failed for volume \"pv-data\" : kubernetes.io/csi: mounter.SetUpAt failed to get "
                f"CSI client: driver name {DRIVER} not found in the list of registered CSI drivers") in result.message
        await register(env, stage)
        assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
        await stage.unprepare(ctx)


async def test_attach_required_waits_for_the_volume_attachment_and_uses_its_metadata(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        await register(env, stage)
        env.objects.put(CSI_DRIVER, csidriver(attachRequired=True))
        _, pv = provision(env, "data")
        ctx = env.context(pod("web", "u1", [pvc_volume("data", "data")]))
        name = attachment_name(pv["spec"]["csi"]["volumeHandle"], DRIVER, NODE.name)
        # The attach-detach controller's record in the Node's status comes first, as in the kubelet.
        result = await stage.prepare(ctx)
        assert result.verdict is Verdict.RETRY
        assert result.message.endswith("unattached volumes=[data], failed to process volumes=[]: "
                                       'Volume not attached according to node status for volume "pv-data"')
        await list_attached(env, f"kubernetes.io/csi/{DRIVER}^{pv['spec']['csi']['volumeHandle']}")
        result = await stage.prepare(ctx)
        assert result.verdict is Verdict.RETRY
        assert "unattached volumes=[data], failed to process volumes=[]" in result.message
        assert f'volumeattachments.storage.k8s.io "{name}" not found' in result.message
        attachment = {"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": name},
                      "spec": {"attacher": DRIVER, "nodeName": NODE.name, "source": {"persistentVolumeName": "pv-data"}},
                      "status": {"attached": False, "attachError": {"message": "no such disk"}}}
        env.objects.put(VOLUME_ATTACHMENT, attachment)
        result = await stage.prepare(ctx)
        assert result.message.endswith('MountVolume.WaitForAttach failed for volume "pv-data" : no such disk')
        env.objects.put(VOLUME_ATTACHMENT, {**attachment, "status": {"attached": True,
                                                                     "attachmentMetadata": {"device": "/dev/x"}}})
        assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
        await stage.unprepare(ctx)


async def list_attached(env: Any, *names: str) -> None:
    """What the attach-detach controller writes once an attach succeeded."""
    node = dict(await env.objects.get(NODE_KIND, NODE.name))
    node["status"] = {**node.get("status", {}), "volumesAttached": [{"name": n, "devicePath": ""} for n in names]}
    env.objects.put(NODE_KIND, node)


async def test_an_attachable_volume_waits_until_the_node_reports_it_in_use(base: Path) -> None:
    """Attached is not enough: a volume the Node does not list in volumesInUse may be
    detached by the attach-detach controller at any moment, so it is not mounted until a status
    write listed it (the kubelet's VerifyControllerAttachedVolume), and that write is asked for."""
    async with serving(base) as env:
        env.handle.reported_in_use = set()
        stage = env.stage()
        await register(env, stage)
        env.objects.put(CSI_DRIVER, csidriver(attachRequired=True))
        _, pv = provision(env, "data")
        handle = pv["spec"]["csi"]["volumeHandle"]
        name = attachment_name(handle, DRIVER, NODE.name)
        env.objects.put(VOLUME_ATTACHMENT, {
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": name},
            "spec": {"attacher": DRIVER, "nodeName": NODE.name, "source": {"persistentVolumeName": "pv-data"}},
            "status": {"attached": True}})
        ctx = env.context(pod("web", "u1", [pvc_volume("data", "data")]))
        unique = f"kubernetes.io/csi/{DRIVER}^{handle}"
        await list_attached(env, unique)
        result = await stage.prepare(ctx)
        assert result.verdict is Verdict.RETRY
        assert ("unattached volumes=[data], failed to process volumes=[]: Volume has not been added to the list "
                "of VolumesInUse in the node's volume status for volume \"pv-data\"") in result.message
        assert env.handle.report_requests and set(env.handle.report_requests) == {unique}
        assert stage.volumes_in_use() == [unique]  # what the next status write carries
        assert env.driver.count("NodePublishVolume") == 0
        env.handle.reported_in_use = {unique}
        assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
        await stage.unprepare(ctx)


async def test_block_volume_is_a_device_of_the_container(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        await register(env, stage)
        env.objects.put(CSI_DRIVER, csidriver())
        provision(env, "raw", block=True)
        spec_pod = pod("web", "u1", [pvc_volume("raw", "raw")], mounts=[],
                       devices=[{"name": "raw", "devicePath": "/dev/xvda"}])
        ctx = env.context(spec_pod)
        assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
        devices = ctx.pod_additions.merged("main").devices
        assert [(d.container_path, d.permissions) for d in devices] == [("/dev/xvda", "mrw")]
        target = Path(devices[0].host_path)
        assert target == env.root / "plugins/kubernetes.io/csi/volumeDevices/publish/pv-raw/u1"
        assert os.major(target.stat().st_rdev) == 7  # a loop device bound onto the target
        link = ctx.pod_dir / "volumeDevices" / "kubernetes.io~csi" / "pv-raw"
        assert os.readlink(link) == str(target)
        # A Block volume named in volumeMounts is the kubelet's error.
        wrong = env.context(pod("w2", "u2", [pvc_volume("raw", "raw")]))
        assert "volume raw has volumeMode Block, but is specified in volumeMounts" in (await stage.prepare(wrong)).message
        await stage.unprepare(ctx)
        assert not link.exists() and not target.exists() and not mounts_under(env.root)
        assert env.driver.count("NodeUnstageVolume") == 1


# --- ephemeral volumes --------------------------------------------------------------------


async def test_inline_ephemeral_volume_needs_the_ephemeral_mode_and_is_published_only(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        await register(env, stage)
        inline = {"name": "scratch", "csi": {"driver": DRIVER, "volumeAttributes": {"size": "1"}}}
        ctx = env.context(pod("web", "u1", [inline]))
        env.objects.put(CSI_DRIVER, csidriver())
        result = await stage.prepare(ctx)
        assert result.message.endswith(f'volume mode "Ephemeral" not supported by driver {DRIVER} (only supports '
                                       '["Persistent"])')
        env.objects.put(CSI_DRIVER, csidriver(volumeLifecycleModes=["Persistent", "Ephemeral"], podInfoOnMount=True))
        assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
        assert env.driver.count("NodeStageVolume") == 0
        [call] = [c for c in env.driver.calls if c.method == "NodePublishVolume"]
        assert call.volume_id == inline_volume_id("u1", "scratch")
        assert call.path == str(Layout.target_path(ctx.pod_dir, "scratch"))
        await stage.unprepare(ctx)
        assert env.driver.count("NodeUnpublishVolume") == 1 and not mounts_under(env.root)


async def test_generic_ephemeral_volume_uses_the_claim_the_pod_owns(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        await register(env, stage)
        env.objects.put(CSI_DRIVER, csidriver())
        made = env.driver.create_volume("eph", 1 << 20, False, {})
        template = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}
        ctx = env.context(pod("web", "u1", [template]))
        foreign = claim("web-scratch", bound_to="pv-eph", owner="someone-else")
        env.objects.put(PERSISTENT_VOLUME_CLAIM, foreign)
        env.objects.put(PERSISTENT_VOLUME, volume("pv-eph", made["id"], foreign))
        result = await stage.prepare(ctx)
        assert result.message.endswith("PVC default/web-scratch was not created for pod default/web (pod is not owner)")
        owned = claim("web-scratch", bound_to="pv-eph", owner="u1")
        env.objects.put(PERSISTENT_VOLUME_CLAIM, owned)
        assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
        await stage.unprepare(ctx)


# --- fsGroup -----------------------------------------------------------------------------


@pytest.mark.parametrize("policy, fs_type, owned", [("File", "", True), ("None", "ext4", False),
                                                     ("ReadWriteOnceWithFSType", "", False),
                                                     ("ReadWriteOnceWithFSType", "ext4", True)])
async def test_fs_group_follows_the_drivers_policy(base: Path, policy: str, fs_type: str, owned: bool) -> None:
    async with serving(base) as env:
        stage = env.stage()
        await register(env, stage)
        env.objects.put(CSI_DRIVER, csidriver(fsGroupPolicy=policy))
        provision(env, "data", **({"fsType": fs_type} if fs_type else {}))
        ctx = env.context(pod("web", "u1", [pvc_volume("data", "data")], securityContext={"fsGroup": 4321}))
        assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
        target = Layout.target_path(ctx.pod_dir, "pv-data")
        assert (target.stat().st_gid == 4321) is owned
        await stage.unprepare(ctx)


# --- reconcile, expansion, stats ----------------------------------------------------------------


async def test_volumes_of_a_pod_gone_while_the_agent_was_down_are_unmounted(base: Path) -> None:
    async with serving(base) as env:
        first = env.stage()
        await register(env, first)
        env.objects.put(CSI_DRIVER, csidriver())
        provision(env, "data")
        ctx = env.context(pod("web", "u1", [pvc_volume("data", "data")]))
        assert (await first.prepare(ctx)).verdict is Verdict.CONTINUE
        restarted = env.stage()
        await register(env, restarted)
        await restarted.reconcile()  # no sandbox for u1, and this process never prepared it
        assert env.driver.count("NodeUnpublishVolume") == 1 and env.driver.count("NodeUnstageVolume") == 1
        assert not mounts_under(env.root)


async def test_a_claim_waiting_for_node_expansion_is_expanded_and_its_status_updated(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        await register(env, stage)
        env.objects.put(CSI_DRIVER, csidriver())
        pvc, pv = provision(env, "data")
        ctx = env.context(pod("web", "u1", [pvc_volume("data", "data")]))
        assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
        env.objects.put(PERSISTENT_VOLUME, {**pv, "spec": {**pv["spec"], "capacity": {"storage": "2Mi"}}})
        env.objects.put(PERSISTENT_VOLUME_CLAIM, {**pvc, "status": {
            "phase": "Bound", "capacity": {"storage": "1Mi"}, "allocatedResources": {"storage": "2Mi"},
            "allocatedResourceStatuses": {"storage": "NodeResizePending"}}})
        with anyio.move_on_after(2):
            await stage.observe(ctx)
        assert env.driver.count("NodeExpandVolume") == 1
        updated = await env.objects.get(PERSISTENT_VOLUME_CLAIM, "data", "default")
        assert updated is not None
        assert updated["status"]["capacity"] == {"storage": "2Mi"}
        assert "allocatedResourceStatuses" not in updated["status"]
        assert env.driver.meta(pv["spec"]["csi"]["volumeHandle"])["capacity"] == 2 << 20
        assert [e.kind for e in ctx.events].count("VolumeExpanded") == 1
        await stage.stats.collect()
        [usage] = stage.volume_usage("u1")
        assert usage.name == "data" and usage.pvc == ("default", "data") and usage.fs.capacity_bytes == 2 << 20
        await stage.unprepare(ctx)


async def test_standalone_refuses_a_claim_it_cannot_read(base: Path) -> None:
    async with serving(base) as env:
        stage = env.stage()
        ctx = FakePodContext(pod("web", "u1", [pvc_volume("data", "data")]), stage="csi")
        result = await stage.prepare(ctx)
        assert result.verdict is Verdict.REJECT and result.reason == "UnsupportedVolume"


def test_the_stats_collector_takes_csi_figures_from_the_stage_and_keeps_claims_out_of_ephemeral_storage(
        tmp_path: Path) -> None:
    from nodeagent.stats.collector import Fs, UsageCollector, VolumeUsage, _ephemeral

    csi_dir = tmp_path / "pods" / "u1" / "volumes" / "kubernetes.io~csi" / "pv-data" / "mount"
    csi_dir.mkdir(parents=True)
    (csi_dir / "big").write_bytes(b"x" * 65536)
    scratch = tmp_path / "pods" / "u1" / "volumes" / "kubernetes.io~empty-dir" / "scratch"
    scratch.mkdir(parents=True)
    figures = VolumeUsage("data", Fs(time=1.0, used_bytes=4096, capacity_bytes=1 << 20), pvc=("default", "data"))
    collector = UsageCollector(runtime=None, relister=None, node_name="n1", root_dir=tmp_path,  # type: ignore[arg-type]
                               pod_logs_dir=tmp_path / "logs", volume_providers=[lambda uid: [figures] if uid == "u1"
                                                                                 else []])
    volumes = list(collector._volumes("u1", 1.0))
    assert [v.name for v in volumes] == ["data", "scratch"]  # the CSI mount is not walked
    assert volumes[0] is figures
    assert _ephemeral([], tuple(volumes), 1.0).used_bytes == volumes[1].fs.used_bytes  # the claim is not counted
