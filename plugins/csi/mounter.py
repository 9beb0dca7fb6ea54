"""Staging and publishing CSI volumes for pods, and undoing it — the kubelet's CSI attacher
(MountDevice / UnmountDevice), mounter (SetUp / TearDown) and block mapper, with the volume
manager's rule that a volume is unstaged only when no pod on the node publishes it.

Everything is found on disk (plugins/csi/layout.py), never only remembered: an undo may run in
a later agent process than its setup. A record is written before each driver call; the mount
table proves the driver's work (a staging path or target that is a mount point was done and
is adopted, not mounted again); anything else is called again — the CSI calls are idempotent.
Staging and unstaging of one volume, and the check for its other users, happen under one
lock per volume, so a pod starting never races the last user's unstage.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import structlog

from nodeagent.mounttable import is_mount_point
from nodeagent.volumeutil.ownership import root_mismatch, set_volume_ownership
from plugins.csi import api
from plugins.csi.layout import Layout, Published, Record, attachment_name, unique_name
from plugins.csi.registration import Drivers
from plugins.csi.spec import VolumeSpec

log = structlog.get_logger("nodeagent.csi")


class OperationFailed(Exception):
    """One operation on one volume failed: ``operation`` is the kubelet's name for it
    (``MountVolume.SetUp``, ``MountVolume.MountDevice``, ``MapVolume.MapPodDevice``, ...)."""

    def __init__(self, operation: str, error: str, *, waiting: bool = False) -> None:
        super().__init__(f"{operation} failed: {error}")
        self.operation = operation
        self.error = error
        self.waiting = waiting
        """Not the driver's failure but something to wait for (the driver not registered yet)."""


@dataclass(frozen=True)
class PodInfo:
    """What the mounter needs of the pod."""

    uid: str
    name: str
    namespace: str
    service_account: str
    pod_dir: Path
    fs_group: int | None
    fs_group_change_policy: str | None


@dataclass(frozen=True)
class Mounted:
    target: Path
    """Filesystem: the directory to bind into containers; Block: the device file."""
    adopted: bool


def _log(message: str) -> str:
    return f"kubernetes.io/csi: {message}"


class Mounter:
    def __init__(self, layout: Layout, drivers: Drivers, node_name: str) -> None:
        self.layout = layout
        self.drivers = drivers
        self.node_name = node_name
        self._locks: dict[str, anyio.Lock] = {}
        self._staged: set[str] = set()
        """Unique names this process staged (a driver's staging need not be a mount point)."""

    def lock(self, driver: str, handle: str) -> anyio.Lock:
        return self._locks.setdefault(unique_name(driver, handle), anyio.Lock())

    def _driver(self, name: str, operation: str) -> api.CsiClient:
        driver = self.drivers.get(name)
        if driver is None:
            raise OperationFailed(operation, _log(f"{_op_subject(operation)} failed to get CSI client: driver name "
                                                  f"{name} not found in the list of registered CSI drivers"),
                                  waiting=True)
        return driver.client

    # --- setup ------------------------------------------------------------------------------

    async def set_up(self, pod: PodInfo, spec: VolumeSpec, *, csi_driver: Mapping[str, object] | None,
                     publish_context: Mapping[str, str], stage_secrets: Mapping[str, str],
                     publish_secrets: Mapping[str, str], volume_context: Mapping[str, str]) -> Mounted:
        """Stage (if the driver stages, for a persistent volume) and publish ``spec`` for the pod."""
        mount_op = "MapVolume.MapPodDevice" if spec.block else "MountVolume.SetUp"
        client = self._driver(spec.driver, mount_op)
        try:
            stages = await client.has(api.NodeCapability.STAGE_UNSTAGE_VOLUME)
            multi_writer = await client.has(api.NodeCapability.SINGLE_NODE_MULTI_WRITER)
            mount_group = await client.has(api.NodeCapability.VOLUME_MOUNT_GROUP)
        except api.CsiCallError as exc:
            raise OperationFailed(mount_op, _log(f"NodeGetCapabilities failed: {exc}")) from None
        group = str(pod.fs_group) if mount_group and pod.fs_group is not None and not spec.block else ""
        capability = api.Capability(block=spec.block, fs_type=spec.fs_type, mount_flags=spec.mount_options,
                                    mount_group=group, access_mode=access_mode(spec, multi_writer))
        staging = ""
        async with self.lock(spec.driver, spec.handle):
            if stages and spec.lifecycle == "Persistent":
                staging = str(await self._stage(spec, capability, publish_context, stage_secrets))
            mounted = await self._publish(pod, spec, client, capability, staging, publish_context, publish_secrets,
                                          volume_context)
        if not spec.block and not mounted.adopted and not mount_group:
            await self._apply_fs_group(pod, spec, csi_driver, mounted.target)
        return mounted

    async def _stage(self, spec: VolumeSpec, capability: api.Capability, publish_context: Mapping[str, str],
                     secrets: Mapping[str, str]) -> Path:
        operation = "MapVolume.SetUpDevice" if spec.block else "MountVolume.MountDevice"
        client = self._driver(spec.driver, operation)
        if spec.block:
            staging = self.layout.block_staging_path(spec.spec_name)
            record_path = self.layout.block_record(spec.spec_name)
        else:
            staging = self.layout.staging_path(spec.driver, spec.handle)
            record_path = self.layout.staging_record(spec.driver, spec.handle)
        name = unique_name(spec.driver, spec.handle)
        if name in self._staged or (not spec.block and await _mount_point(staging)):
            self._staged.add(name)
            return staging
        record = Record(specVolID=spec.spec_name, volumeHandle=spec.handle, driverName=spec.driver,
                        nodeName=self.node_name, volumeMode="Block" if spec.block else "Filesystem",
                        attachmentID=attachment_name(spec.handle, spec.driver, self.node_name),
                        stagingPath=str(staging))

        def prepare() -> None:
            record.write(record_path)
            staging.mkdir(mode=0o750, parents=True, exist_ok=True)

        await anyio.to_thread.run_sync(prepare)
        try:
            await client.stage(spec.handle, str(staging), capability, publish_context=publish_context,
                               volume_context=spec.attributes, secrets=secrets)
        except api.CsiCallError as exc:
            raise OperationFailed(operation, str(exc)) from None
        self._staged.add(name)
        return staging

    async def _publish(self, pod: PodInfo, spec: VolumeSpec, client: api.CsiClient, capability: api.Capability,
                       staging: str, publish_context: Mapping[str, str], secrets: Mapping[str, str],
                       volume_context: Mapping[str, str]) -> Mounted:
        operation = "MapVolume.MapPodDevice" if spec.block else "MountVolume.SetUp"
        record = Record(specVolID=spec.spec_name, volumeHandle=spec.handle, driverName=spec.driver,
                        nodeName=self.node_name, volumeLifecycleMode=spec.lifecycle,
                        attachmentID=attachment_name(spec.handle, spec.driver, self.node_name)
                        if spec.lifecycle == "Persistent" else "",
                        volumeMode="Block" if spec.block else "Filesystem", stagingPath=staging)
        if spec.block:
            target = self.layout.block_target_path(spec.spec_name, pod.uid)
            record_path = self.layout.block_record(spec.spec_name)
            link = self.layout.device_link(pod.pod_dir, spec.spec_name)
        else:
            target = self.layout.target_path(pod.pod_dir, spec.spec_name)
            record_path = self.layout.publish_record(pod.pod_dir, spec.spec_name)
            link = None
        if await _mount_point(target):
            if link is not None:
                await anyio.to_thread.run_sync(_link, link, target)
            return Mounted(target, adopted=True)

        def prepare() -> None:
            record.write(record_path)
            # The kubelet makes only the target's parent; the driver makes the target itself.
            target.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            if link is not None:
                _link(link, target)

        await anyio.to_thread.run_sync(prepare)
        try:
            await client.publish(spec.handle, str(target), capability, staging_path=staging, read_only=spec.read_only,
                                 publish_context=publish_context, volume_context=volume_context, secrets=secrets)
        except api.CsiCallError as exc:
            if not exc.uncertain and not spec.block:
                # A final error: the driver did nothing, so the mount directory goes (the
                # kubelet's removeMountDir); an uncertain one stays for the unpublish.
                await anyio.to_thread.run_sync(_remove_mount_dir, target)
            raise OperationFailed(operation, str(exc)) from None
        return Mounted(target, adopted=False)

    async def _apply_fs_group(self, pod: PodInfo, spec: VolumeSpec, csi_driver: Mapping[str, object] | None,
                              target: Path) -> None:
        """The kubelet's supportsFSGroup and applyFSGroup: the driver's fsGroupPolicy decides
        (File: always; None: never; ReadWriteOnceWithFSType, the default: with an fsType and a
        ReadWriteOnce(Pod) access mode, or an inline volume); OnRootMismatch skips the walk of a
        volume whose root already shows the fsGroup."""
        fs_group = pod.fs_group
        if fs_group is None or spec.read_only:
            return
        policy = str(((csi_driver or {}).get("spec") or {}).get("fsGroupPolicy")  # type: ignore[union-attr]
                     or "ReadWriteOnceWithFSType")
        if policy == "None":
            return
        if policy != "File":
            if not spec.fs_type:
                return
            if spec.lifecycle == "Persistent" and not {"ReadWriteOnce", "ReadWriteOncePod"} & set(spec.access_modes):
                return
        await apply_ownership(target, fs_group, pod.fs_group_change_policy)

    # --- teardown ---------------------------------------------------------------------------

    async def tear_down(self, published: Published, pod_uid: str) -> bool:
        """NodeUnpublishVolume for one pod's publication, then its directories; then, if no
        pod on the node publishes the volume any more, NodeUnstageVolume. False when the
        driver is not there or failed (kept for the next attempt)."""
        record = published.record
        client = self.drivers.get(record.driverName)
        if client is None:
            log.warning("cannot unpublish a CSI volume: driver not registered; will retry",
                        driver=record.driverName, volume=record.specVolID, target=str(published.target))
            return False
        async with self.lock(record.driverName, record.volumeHandle):
            try:
                await client.client.unpublish(record.volumeHandle, str(published.target))
            except api.CsiCallError as exc:
                log.warning("NodeUnpublishVolume failed; will retry", driver=record.driverName,
                            volume=record.specVolID, target=str(published.target), error=str(exc))
                return False
            if await _mount_point(published.target):
                log.warning("target still mounted after NodeUnpublishVolume; kept", target=str(published.target))
                return False
            await anyio.to_thread.run_sync(self._remove_publication, published)
            return await self._unstage_if_unused(record)

    def _remove_publication(self, published: Published) -> None:
        if published.device_link is not None:
            published.device_link.unlink(missing_ok=True)
            _remove_empty(published.device_link.parent)
            published.target.unlink(missing_ok=True)  # the driver removes it; a leftover file is ours
            _remove_empty(published.target.parent)
            return
        assert published.volume_dir is not None
        _remove_mount_dir(published.target)
        (published.volume_dir / "vol_data.json").unlink(missing_ok=True)
        _remove_empty(published.volume_dir)

    def users(self, driver: str, handle: str) -> list[Published]:
        """Every pod's publication of the volume on this node (from disk)."""
        return [p for pod_dir in self.layout.pod_dirs() for p in self.layout.pod_volumes(pod_dir)
                if p.record.driverName == driver and p.record.volumeHandle == handle]

    async def _unstage_if_unused(self, record: Record) -> bool:
        if record.volumeLifecycleMode == "Ephemeral":
            return True
        if await anyio.to_thread.run_sync(self.users, record.driverName, record.volumeHandle):
            return True
        if record.volumeMode == "Block":
            staging, record_path = self.layout.block_staging_path(record.specVolID), self.layout.block_record(
                record.specVolID)
        else:
            staging = self.layout.staging_path(record.driverName, record.volumeHandle)
            record_path = self.layout.staging_record(record.driverName, record.volumeHandle)
        return await self.unstage(record.driverName, record.volumeHandle, staging, record_path)

    async def unstage(self, driver_name: str, handle: str, staging: Path, record_path: Path) -> bool:
        """NodeUnstageVolume when something was staged there (its record exists)."""
        if not await anyio.to_thread.run_sync(record_path.exists):
            return True
        driver = self.drivers.get(driver_name)
        if driver is None:
            log.warning("cannot unstage a CSI volume: driver not registered; will retry", driver=driver_name,
                        handle=handle)
            return False
        try:
            if await driver.client.has(api.NodeCapability.STAGE_UNSTAGE_VOLUME):
                await driver.client.unstage(handle, str(staging))
        except api.CsiCallError as exc:
            log.warning("NodeUnstageVolume failed; will retry", driver=driver_name, handle=handle, error=str(exc))
            return False
        if await _mount_point(staging):
            log.warning("staging path still mounted after NodeUnstageVolume; kept", staging=str(staging))
            return False
        self._staged.discard(unique_name(driver_name, handle))

        def remove() -> None:
            if staging.is_dir() and not staging.is_symlink():
                _remove_empty(staging)
            record_path.unlink(missing_ok=True)
            _remove_empty(record_path.parent)
            if record_path.parent.name == "data":
                _remove_empty(record_path.parent.parent)

        await anyio.to_thread.run_sync(remove)
        return True

    def staged_records(self) -> list[tuple[Record, Path]]:
        """Every staging record on the node (Filesystem and Block), for the reconcile loop."""
        found: list[tuple[Record, Path]] = []
        plugin_dir = self.layout.plugin_dir
        try:
            drivers = [d for d in plugin_dir.iterdir() if d.is_dir() and d.name != "volumeDevices"]
        except OSError:
            drivers = []
        for driver_dir in drivers:
            for volume_dir in sorted(driver_dir.iterdir()):
                record = Record.read(volume_dir / "vol_data.json")
                if record is not None:
                    found.append((record, volume_dir / "vol_data.json"))
        try:
            blocks = [d for d in self.layout.block_dir.iterdir() if d.name not in ("staging", "publish")]
        except OSError:
            blocks = []
        for block in blocks:
            record = Record.read(block / "data" / "vol_data.json")
            if record is not None:
                found.append((record, block / "data" / "vol_data.json"))
        return found


def access_mode(spec: VolumeSpec, multi_writer: bool) -> str:
    """The PV's first access mode as a CSI access mode (the kubelet's asCSIAccessModeV1);
    inline volumes are ReadWriteOnce."""
    mode = spec.access_modes[0] if spec.access_modes and spec.lifecycle == "Persistent" else "ReadWriteOnce"
    if multi_writer:
        table = {"ReadWriteOnce": "SINGLE_NODE_MULTI_WRITER", "ReadOnlyMany": "MULTI_NODE_READER_ONLY",
                 "ReadWriteMany": "MULTI_NODE_MULTI_WRITER", "ReadWriteOncePod": "SINGLE_NODE_SINGLE_WRITER"}
    else:
        table = {"ReadWriteOnce": "SINGLE_NODE_WRITER", "ReadOnlyMany": "MULTI_NODE_READER_ONLY",
                 "ReadWriteMany": "MULTI_NODE_MULTI_WRITER", "ReadWriteOncePod": "SINGLE_NODE_WRITER"}
    return table.get(mode, "UNKNOWN")


async def apply_ownership(target: Path, fs_group: int, policy: str | None) -> None:
    if policy == "OnRootMismatch" and not await anyio.to_thread.run_sync(
            functools.partial(root_mismatch, target, fs_group, read_only=False)):
        return
    await anyio.to_thread.run_sync(functools.partial(set_volume_ownership, target, fs_group, read_only=False))


def _op_subject(operation: str) -> str:
    return {"MountVolume.SetUp": "mounter.SetUpAt", "MountVolume.MountDevice": "attacher.MountDevice",
            "MapVolume.SetUpDevice": "blockMapper.SetUpDevice",
            "MapVolume.MapPodDevice": "blockMapper.MapPodDevice"}.get(operation, operation)


async def _mount_point(path: Path) -> bool:
    return await anyio.to_thread.run_sync(is_mount_point, path)


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    if link.is_symlink():
        if os.readlink(link) == str(target):
            return
        link.unlink()
    link.symlink_to(target)


def _remove_mount_dir(target: Path) -> None:
    """The target directory, only if nothing is mounted on it and it is empty: what a driver
    left in it is not ours to delete."""
    if is_mount_point(target):
        return
    try:
        target.rmdir()
    except FileNotFoundError:
        return
    except OSError:
        if target.is_dir() and not target.is_symlink():
            log.warning("CSI target directory not empty after unpublish; kept", target=str(target))


def _remove_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        return


__all__ = ["Mounted", "Mounter", "OperationFailed", "PodInfo", "access_mode", "apply_ownership"]

