"""A hostpath-style CSI **test driver**: volumes that are directories (or, for Block, loop
devices over image files) on the node, to test nodeagent's CSI side with data that outlives
pods — never for real data (``python -m drivers.csihostpath --help``).

It does, in one Python process, what a CSI driver's node plugin and (for a cluster) its
controller sidecars do:

* serves **plugin registration** on ``<registry-dir>/<driver>-reg.sock`` (GetInfo: type
  ``CSIPlugin``, its name, endpoint ``<plugin-dir>/csi.sock``, versions ``1.0.0``) — the
  node-driver-registrar's job;
* serves **CSI Identity, Node and Controller** (csi.v1, nodeagent's own proto subset in
  plugins/csi/proto) on ``<plugin-dir>/csi.sock``:

  - CreateVolume makes ``<state-dir>/volumes/<id>/`` (Filesystem) or a sparse
    ``<id>.img`` of the requested size (Block); DeleteVolume removes it; both idempotent;
  - ControllerPublishVolume answers a publish context (``device``: the image or directory);
  - NodeStageVolume bind-mounts the volume's directory on the staging path (Block: attaches a
    loop device to the image); NodePublishVolume bind-mounts the staging path (or, for an
    inline ephemeral volume, a fresh directory) on the target, read-only if asked (Block:
    bind-mounts the loop device on a target file); the Unstage/Unpublish calls undo that;
    every call is idempotent (a mount point is left alone);
  - NodeGetVolumeStats: the bytes used under the volume and its capacity, and the inodes of
    the filesystem holding it; NodeExpandVolume records the new capacity;

* in a cluster (drivers/csihostpath/controller.py) runs a minimal **provisioner** (PVCs of
  its StorageClasses get a PV; released PVs with reclaim policy Delete are deleted), an
  **attacher** (VolumeAttachments naming it are attached through ControllerPublishVolume and
  detached on deletion) and a **resizer** (a grown PVC's PV grows and the node is asked to
  expand): stand-ins for the external-provisioner, external-attacher and external-resizer
  sidecars, which the Go module proxy does not serve (external-attacher is served; see
  docs/VOLUMES.md).

Failures for tests: a volume context key ``nodeagent.test/fail`` naming a method
(``NodePublishVolume``, ``NodeStageVolume``) makes that call fail with gRPC Internal and the
text of ``nodeagent.test/message`` (StorageClass parameters reach the volume context).
Every call is recorded (``calls``; ``call_log``: a JSON line each).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import grpc
import structlog

from nodeagent.mounttable import is_mount_point
from nodeagent.pluginwatcher._generated import (
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from plugins.csi._generated import csi_v1_pb2 as pb
from plugins.csi._generated import csi_v1_pb2_grpc as pb_grpc

log = structlog.get_logger("csihostpath")

DRIVER_NAME = "hostpath.csi.nodeagent.test"
VENDOR_VERSION = "0.1.0"
TOPOLOGY_KEY = "topology.hostpath.csi.nodeagent.test/node"
FAIL_KEY = "nodeagent.test/fail"
MESSAGE_KEY = "nodeagent.test/message"
DEFAULT_CAPACITY = 1 << 30


@dataclass
class Call:
    method: str
    volume_id: str
    path: str = ""


class CsiFailure(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class HostPathDriver:
    registry_dir: Path
    plugin_dir: Path
    state_dir: Path
    node_id: str
    driver_name: str = DRIVER_NAME
    attach_required: bool = False
    """Whether the driver has a controller publish step (ControllerPublishVolume)."""
    stage: bool = True
    """Whether the node plugin stages (STAGE_UNSTAGE_VOLUME)."""
    max_volumes: int = 0
    call_log: Path | None = None
    calls: list[Call] = field(default_factory=list)
    registrations: list[tuple[bool, str]] = field(default_factory=list)
    _lock: anyio.Lock = field(default_factory=anyio.Lock)

    @property
    def endpoint(self) -> Path:
        return self.plugin_dir / "csi.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver_name}-reg.sock"

    @property
    def volumes_dir(self) -> Path:
        return self.state_dir / "volumes"

    def record(self, method: str, volume_id: str, path: str = "") -> None:
        self.calls.append(Call(method, volume_id, path))
        if self.call_log is not None:
            with self.call_log.open("a") as f:
                f.write(json.dumps({"method": method, "volume_id": volume_id, "path": path}) + "\n")

    def count(self, method: str, path: str | None = None) -> int:
        return sum(1 for c in self.calls if c.method == method and (path is None or c.path == path))

    # --- serving ----------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; the sockets go on the way out (the registration socket's
        removal is how the node sees the driver leave)."""
        for directory in (self.registry_dir, self.plugin_dir, self.volumes_dir):
            directory.mkdir(parents=True, exist_ok=True)
        for path in (self.registration_socket, self.endpoint):
            path.unlink(missing_ok=True)
        server = grpc.aio.server()
        pb_grpc.add_IdentityServicer_to_server(_Identity(self), server)  # type: ignore[no-untyped-call]
        pb_grpc.add_NodeServicer_to_server(_Node(self), server)  # type: ignore[no-untyped-call]
        pb_grpc.add_ControllerServicer_to_server(_Controller(self), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix:{self.endpoint}")
        registration = grpc.aio.server()
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            _Registration(self), registration)
        registration.add_insecure_port(f"unix:{self.registration_socket}")
        await server.start()
        await registration.start()  # CSI first: once registration is there the node may call
        log.info("hostpath CSI test driver serving", driver=self.driver_name, endpoint=str(self.endpoint))
        try:
            task_status.started()
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await registration.stop(None)
                await server.stop(None)
                self.registration_socket.unlink(missing_ok=True)
                self.endpoint.unlink(missing_ok=True)

    # --- volumes ------------------------------------------------------------------------------

    def volume_path(self, volume_id: str) -> Path:
        _check_id(volume_id)
        return self.volumes_dir / volume_id

    def _meta_path(self, volume_id: str) -> Path:
        return self.volumes_dir / f"{volume_id}.json"

    def meta(self, volume_id: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._meta_path(_check_id(volume_id)).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _save_meta(self, volume_id: str, meta: Mapping[str, Any]) -> None:
        path = self._meta_path(volume_id)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(meta))
        tmp.replace(path)

    def create_volume(self, name: str, capacity: int, block: bool, parameters: Mapping[str, str]) -> dict[str, Any]:
        volume_id = "vol-" + hashlib.sha256(name.encode()).hexdigest()[:20]
        meta = self.meta(volume_id)
        if meta is not None:
            if meta["block"] != block or meta["capacity"] < capacity:
                raise CsiFailure(grpc.StatusCode.ALREADY_EXISTS,
                                 f"volume {name} exists with another access type or a smaller capacity")
            return meta
        capacity = capacity or DEFAULT_CAPACITY
        path = self.volume_path(volume_id)
        if block:
            image = path.with_suffix(".img")
            with image.open("wb") as f:
                f.truncate(capacity)
        else:
            path.mkdir(mode=0o777, exist_ok=True)
            os.chmod(path, 0o777)
        meta = {"id": volume_id, "name": name, "capacity": capacity, "block": block, "context": dict(parameters)}
        self._save_meta(volume_id, meta)
        return meta

    def delete_volume(self, volume_id: str) -> None:
        path = self.volume_path(volume_id)
        shutil.rmtree(path, ignore_errors=True)
        path.with_suffix(".img").unlink(missing_ok=True)
        self._meta_path(volume_id).unlink(missing_ok=True)

    def expand(self, volume_id: str, capacity: int) -> int:
        meta = self.meta(volume_id)
        if meta is None:
            raise CsiFailure(grpc.StatusCode.NOT_FOUND, f"volume {volume_id} not found")
        if capacity > meta["capacity"]:
            meta["capacity"] = capacity
            if meta["block"]:
                with self.volume_path(volume_id).with_suffix(".img").open("r+b") as f:
                    f.truncate(capacity)
            self._save_meta(volume_id, meta)
        return int(meta["capacity"])


def _check_id(volume_id: str) -> str:
    if not volume_id or "/" in volume_id or volume_id in (".", "..") or "\0" in volume_id:
        raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, f"invalid volume id {volume_id!r}")
    return volume_id


async def _run(*command: str) -> str:
    result = await anyio.run_process(list(command), check=False)
    if result.returncode != 0:
        raise CsiFailure(grpc.StatusCode.INTERNAL,
                         f"{' '.join(command)}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode().strip()


async def _bind(source: str, target: str, read_only: bool) -> None:
    await _run("mount", "--bind", source, target)
    if read_only:
        await _run("mount", "-o", "remount,bind,ro", target)


async def _loop_device(image: Path) -> str:
    """The loop device over ``image``, attaching one if there is none."""
    found = await _run("losetup", "-j", str(image))
    if found:
        return found.split(":", 1)[0]
    return await _run("losetup", "-f", "--show", str(image))


def _failure(context: Mapping[str, str], method: str) -> None:
    if context.get(FAIL_KEY) == method:
        raise CsiFailure(grpc.StatusCode.INTERNAL,
                         context.get(MESSAGE_KEY) or f"{method} fails on purpose (test driver)")


def _capability_block(capability: Any) -> bool:
    return capability is not None and capability.HasField("block")


def _usage(path: Path, capacity: int) -> list[Any]:
    used = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            try:
                used += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                continue
    fs = os.statvfs(path)
    return [pb.VolumeUsage(unit=pb.VolumeUsage.BYTES, total=capacity, used=used, available=max(capacity - used, 0)),
            pb.VolumeUsage(unit=pb.VolumeUsage.INODES, total=fs.f_files, used=fs.f_files - fs.f_ffree,
                           available=fs.f_ffree)]


class _Servicer:
    def __init__(self, driver: HostPathDriver) -> None:
        self.driver = driver

    async def _guard(self, context: Any, work: Any) -> Any:
        try:
            return await work
        except CsiFailure as exc:
            await context.abort(exc.code, exc.message)
        except OSError as exc:
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))


class _Identity(_Servicer, pb_grpc.IdentityServicer):
    async def GetPluginInfo(self, request: Any, context: Any) -> Any:
        return pb.GetPluginInfoResponse(name=self.driver.driver_name, vendor_version=VENDOR_VERSION)

    async def GetPluginCapabilities(self, request: Any, context: Any) -> Any:
        service = pb.PluginCapability.Service
        return pb.GetPluginCapabilitiesResponse(capabilities=[
            pb.PluginCapability(service=service(type=service.CONTROLLER_SERVICE)),
            pb.PluginCapability(service=service(type=service.VOLUME_ACCESSIBILITY_CONSTRAINTS))])

    async def Probe(self, request: Any, context: Any) -> Any:
        response = pb.ProbeResponse()
        response.ready.value = True
        return response


class _Controller(_Servicer, pb_grpc.ControllerServicer):
    async def CreateVolume(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            if not request.name:
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "name is required")
            if not request.volume_capabilities:
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "volume capabilities are required")
            block = any(_capability_block(c) for c in request.volume_capabilities)
            capacity = request.capacity_range.required_bytes or request.capacity_range.limit_bytes
            async with self.driver._lock:
                meta = await anyio.to_thread.run_sync(self.driver.create_volume, request.name, capacity, block,
                                                      dict(request.parameters))
            self.driver.record("CreateVolume", meta["id"])
            return pb.CreateVolumeResponse(volume=pb.Volume(
                volume_id=meta["id"], capacity_bytes=meta["capacity"], volume_context=meta["context"],
                accessible_topology=[pb.Topology(segments={TOPOLOGY_KEY: self.driver.node_id})]))
        return await self._guard(context, work())

    async def DeleteVolume(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            _check_id(request.volume_id)
            self.driver.record("DeleteVolume", request.volume_id)
            async with self.driver._lock:
                await anyio.to_thread.run_sync(self.driver.delete_volume, request.volume_id)
            return pb.DeleteVolumeResponse()
        return await self._guard(context, work())

    async def ControllerPublishVolume(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            if not request.node_id:
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "node id is required")
            if not request.HasField("volume_capability"):
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "volume capability is required")
            meta = self.driver.meta(request.volume_id)
            if meta is None:
                raise CsiFailure(grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id} not found")
            if request.node_id != self.driver.node_id:
                raise CsiFailure(grpc.StatusCode.NOT_FOUND, f"node {request.node_id} not found")
            self.driver.record("ControllerPublishVolume", request.volume_id)
            return pb.ControllerPublishVolumeResponse(publish_context={"device": str(self.driver.volume_path(
                request.volume_id))})
        return await self._guard(context, work())

    async def ControllerUnpublishVolume(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            _check_id(request.volume_id)
            self.driver.record("ControllerUnpublishVolume", request.volume_id)
            return pb.ControllerUnpublishVolumeResponse()
        return await self._guard(context, work())

    async def ValidateVolumeCapabilities(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            _check_id(request.volume_id)
            if not request.volume_capabilities:
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "volume capabilities are required")
            if self.driver.meta(request.volume_id) is None:
                raise CsiFailure(grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id} not found")
            return pb.ValidateVolumeCapabilitiesResponse(confirmed=pb.ValidateVolumeCapabilitiesResponse.Confirmed(
                volume_context=dict(request.volume_context), volume_capabilities=list(request.volume_capabilities),
                parameters=dict(request.parameters)))
        return await self._guard(context, work())

    async def ControllerGetCapabilities(self, request: Any, context: Any) -> Any:
        rpc = pb.ControllerServiceCapability.RPC
        types = [rpc.CREATE_DELETE_VOLUME] + ([rpc.PUBLISH_UNPUBLISH_VOLUME] if self.driver.attach_required else [])
        return pb.ControllerGetCapabilitiesResponse(
            capabilities=[pb.ControllerServiceCapability(rpc=rpc(type=t)) for t in types])


class _Node(_Servicer, pb_grpc.NodeServicer):
    async def NodeGetInfo(self, request: Any, context: Any) -> Any:
        return pb.NodeGetInfoResponse(node_id=self.driver.node_id, max_volumes_per_node=self.driver.max_volumes,
                                      accessible_topology=pb.Topology(segments={TOPOLOGY_KEY: self.driver.node_id}))

    async def NodeGetCapabilities(self, request: Any, context: Any) -> Any:
        rpc = pb.NodeServiceCapability.RPC
        types = [rpc.GET_VOLUME_STATS, rpc.EXPAND_VOLUME] + ([rpc.STAGE_UNSTAGE_VOLUME] if self.driver.stage else [])
        return pb.NodeGetCapabilitiesResponse(capabilities=[pb.NodeServiceCapability(rpc=rpc(type=t)) for t in types])

    async def NodeStageVolume(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            volume_id, staging = request.volume_id, request.staging_target_path
            _check_id(volume_id)
            if not staging or not request.HasField("volume_capability"):
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "staging path and capability are required")
            self.driver.record("NodeStageVolume", volume_id, staging)
            _failure(request.volume_context, "NodeStageVolume")
            meta = self.driver.meta(volume_id)
            if meta is None:
                raise CsiFailure(grpc.StatusCode.NOT_FOUND, f"volume {volume_id} not found")
            async with self.driver._lock:
                if meta["block"]:
                    await _loop_device(self.driver.volume_path(volume_id).with_suffix(".img"))
                elif not is_mount_point(Path(staging)):
                    Path(staging).mkdir(parents=True, exist_ok=True)
                    await _bind(str(self.driver.volume_path(volume_id)), staging, False)
            return pb.NodeStageVolumeResponse()
        return await self._guard(context, work())

    async def NodeUnstageVolume(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            volume_id, staging = request.volume_id, request.staging_target_path
            _check_id(volume_id)
            if not staging:
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "staging path is required")
            self.driver.record("NodeUnstageVolume", volume_id, staging)
            meta = self.driver.meta(volume_id)
            async with self.driver._lock:
                if is_mount_point(Path(staging)):
                    await _run("umount", staging)
                if meta is not None and meta["block"]:
                    image = self.driver.volume_path(volume_id).with_suffix(".img")
                    found = await _run("losetup", "-j", str(image))
                    for line in found.splitlines():
                        await _run("losetup", "-d", line.split(":", 1)[0])
            return pb.NodeUnstageVolumeResponse()
        return await self._guard(context, work())

    async def NodePublishVolume(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            volume_id, target = request.volume_id, request.target_path
            _check_id(volume_id)
            if not target or not request.HasField("volume_capability"):
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "target path and capability are required")
            self.driver.record("NodePublishVolume", volume_id, target)
            _failure(request.volume_context, "NodePublishVolume")
            ephemeral = request.volume_context.get("csi.storage.k8s.io/ephemeral") == "true" or (
                self.driver.meta(volume_id) is None and volume_id.startswith("csi-"))
            async with self.driver._lock:
                if is_mount_point(Path(target)):
                    return pb.NodePublishVolumeResponse()
                if _capability_block(request.volume_capability):
                    meta = self.driver.meta(volume_id)
                    if meta is None:
                        raise CsiFailure(grpc.StatusCode.NOT_FOUND, f"volume {volume_id} not found")
                    device = await _loop_device(self.driver.volume_path(volume_id).with_suffix(".img"))
                    Path(target).touch(exist_ok=True)
                    await _bind(device, target, request.readonly)
                    return pb.NodePublishVolumeResponse()
                if ephemeral:
                    source = self.driver.state_dir / "ephemeral" / volume_id
                    source.mkdir(parents=True, exist_ok=True)
                    os.chmod(source, 0o777)
                elif request.staging_target_path:
                    source = Path(request.staging_target_path)
                else:
                    if self.driver.meta(volume_id) is None:
                        raise CsiFailure(grpc.StatusCode.NOT_FOUND, f"volume {volume_id} not found")
                    source = self.driver.volume_path(volume_id)
                Path(target).mkdir(parents=True, exist_ok=True)
                await _bind(str(source), target, request.readonly)
            return pb.NodePublishVolumeResponse()
        return await self._guard(context, work())

    async def NodeUnpublishVolume(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            volume_id, target = request.volume_id, request.target_path
            _check_id(volume_id)
            if not target:
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "target path is required")
            self.driver.record("NodeUnpublishVolume", volume_id, target)
            async with self.driver._lock:
                path = Path(target)
                if is_mount_point(path):
                    await _run("umount", target)
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                elif path.exists() or path.is_symlink():
                    path.unlink()
                shutil.rmtree(self.driver.state_dir / "ephemeral" / volume_id, ignore_errors=True)
            return pb.NodeUnpublishVolumeResponse()
        return await self._guard(context, work())

    async def NodeGetVolumeStats(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            _check_id(request.volume_id)
            if not request.volume_path:
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "volume path is required")
            path = Path(request.volume_path)
            if not path.exists():
                raise CsiFailure(grpc.StatusCode.NOT_FOUND, f"volume path {path} not found")
            meta = self.driver.meta(request.volume_id)
            capacity = int(meta["capacity"]) if meta else DEFAULT_CAPACITY
            if stat.S_ISBLK(path.stat().st_mode):
                return pb.NodeGetVolumeStatsResponse(usage=[pb.VolumeUsage(unit=pb.VolumeUsage.BYTES, total=capacity)])
            return pb.NodeGetVolumeStatsResponse(usage=await anyio.to_thread.run_sync(_usage, path, capacity))
        return await self._guard(context, work())

    async def NodeExpandVolume(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            _check_id(request.volume_id)
            if not request.volume_path:
                raise CsiFailure(grpc.StatusCode.INVALID_ARGUMENT, "volume path is required")
            self.driver.record("NodeExpandVolume", request.volume_id, request.volume_path)
            capacity = await anyio.to_thread.run_sync(self.driver.expand, request.volume_id,
                                                      request.capacity_range.required_bytes)
            return pb.NodeExpandVolumeResponse(capacity_bytes=capacity)
        return await self._guard(context, work())


class _Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: HostPathDriver) -> None:
        self.driver = driver

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(type="CSIPlugin", name=self.driver.driver_name,
                                                    endpoint=str(self.driver.endpoint), supported_versions=["1.0.0"])

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.driver.registrations.append((request.plugin_registered, request.error))
        if not request.plugin_registered:
            log.error("registration refused by the node", driver=self.driver.driver_name, error=request.error)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


__all__ = ["DRIVER_NAME", "FAIL_KEY", "HostPathDriver", "MESSAGE_KEY", "TOPOLOGY_KEY"]
