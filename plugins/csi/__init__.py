"""The csi stage: persistent volumes and CSI volumes for pods — the kubelet's volume manager
for ``persistentVolumeClaim``, ``ephemeral`` (generic ephemeral) and ``csi`` (CSI inline
ephemeral) volumes, with its CSI plugin.

Drivers register through the agent's plugin watcher (type ``CSIPlugin``,
plugins/csi/registration.py), which also writes the node's CSINode, node-ID annotation and
topology labels (plugins/csi/nodeinfo.py).

prepare (after the volumes and apivolumes stages, before the runtime stage makes the sandbox),
for each such volume a container mounts or maps:

1. follow it to what is mounted (plugins/csi/spec.py): the PVC must be Bound (for a generic
   ephemeral volume, the PVC the ephemeral-volume controller made, owned by the pod), its PV
   bound to it; a ``csi`` PV or inline volume is mounted by its driver, a ``local`` or
   ``hostPath`` PV is a node directory bound in directly;
2. for a CSI PV whose CSIDriver says ``attachRequired`` (the default, and when there is no
   CSIDriver), wait until a Node status write has listed it in volumesInUse (the handle asks for
   that write at once; until then the attach-detach controller may detach it,
   nodeagent.volumesinuse), then for the controller to list it in the Node's
   ``status.volumesAttached`` (the kubelet's VerifyControllerAttachedVolume) and for the
   VolumeAttachment it makes to be attached (its ``attachmentMetadata`` is the publish context);
3. NodeStageVolume once per volume on the node (when the driver has STAGE_UNSTAGE_VOLUME),
   NodePublishVolume per pod, at the kubelet's paths (plugins/csi/layout.py); Block volumes
   (``volumeDevices``) become devices of the containers; fsGroup is applied as the driver's
   CSIDriver ``fsGroupPolicy`` and the pod's ``fsGroupChangePolicy`` say (or passed to a driver
   with VOLUME_MOUNT_GROUP); ``podInfoOnMount`` adds the pod to the volume context.

A volume not ready yet (PVC unbound, not attached, driver not registered) is waited for, up to
``waitSeconds`` per attempt; then, or when a driver call failed, the pod waits (RETRY) with
the kubelet's reason ``FailedMount`` and words ``Unable to attach or mount volumes:
unmounted volumes=[...], unattached volumes=[...], failed to process volumes=[...]: ...``,
and each failed operation is its own Warning Event (``MountVolume.SetUp failed for volume
"pv" : rpc error: ...``). Other pods are not held up.

unprepare (only once no container of the pod runs): NodeUnpublishVolume for each of the pod's
publications found on disk, and NodeUnstageVolume for a volume no pod on the node publishes
any more. What fails (the driver gone) is kept and tried again by the node task.

observe: a PVC whose expansion waits for the node (``allocatedResourceStatuses.storage`` =
NodeResizePending) gets NodeExpandVolume and its status updated, as the kubelet does.

The node task (:meth:`CsiStage.run`): the node's CSINode; every ``reconcilePeriodSeconds``
the volumes of pods that are gone (deleted while the agent was down) are unpublished and
unstaged, and failed teardowns tried again; every ``volumeStatsAggPeriod`` (the agent's field)
NodeGetVolumeStats for the stats collector (:meth:`CsiStage.volume_usage`). After an agent restart nothing is
mounted again: a target or staging path that is a mount point is adopted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import anyio
import structlog
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from cri import CriError
from cri import types as t
from nodeagent import labels as L
from nodeagent.additions import (
    CONTAINER_ADDITIONS,
    ContainerAdditions,
    VolumeBind,
    add_mounts,
)
from nodeagent.kube.configdata import ObjectReader, ObjectUnavailable
from nodeagent.model import Pod, Volume
from nodeagent.objects import ObjectError, View
from nodeagent.objects.kinds import CSI_DRIVER, NODE, VOLUME_ATTACHMENT
from nodeagent.stages import AgentHandle, Observe, PodContext, Prepare, Result
from nodeagent.stash import StashKey
from nodeagent.stats.collector import VOLUME_STATS_SECONDS
from nodeagent.unsupported import UNSUPPORTED_VOLUME
from nodeagent.volumeutil.mounts import (
    MountConfigError,
    PreparedVolume,
    container_mounts,
)
from plugins.csi import api
from plugins.csi.events import VolumeMounted, VolumeOperationFailed, VolumeUnmounted
from plugins.csi.expansion import Expander
from plugins.csi.layout import Layout, Published, attachment_name, unique_name
from plugins.csi.local import LocalError, set_up_local
from plugins.csi.mounter import Mounter, OperationFailed, PodInfo
from plugins.csi.nodeinfo import NodeInfoError, NodeInfoManager
from plugins.csi.registration import (
    REGISTRATION_TIMEOUT_SECONDS,
    CsiRegistrations,
    Drivers,
)
from plugins.csi.spec import (
    NotReady,
    SecretRef,
    VolumeSpec,
    handles,
    resolve,
    used_volumes,
)
from plugins.csi.volumestats import VolumeStats

log = structlog.get_logger("nodeagent.csi")

FAILED_MOUNT = "FailedMount"
CONFIG_ERROR = "CreateContainerConfigError"
POD_INFO_PREFIX = "csi.storage.k8s.io/"


class CsiConfig(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid")

    call_timeout_seconds: float = Field(default=api.CALL_TIMEOUT_SECONDS, gt=0)
    """Every CSI call (the kubelet's csiTimeout: 2 minutes)."""
    registration_timeout_seconds: float = Field(default=REGISTRATION_TIMEOUT_SECONDS, gt=0)
    """NodeGetInfo while a driver registers."""
    wait_seconds: float = Field(default=10.0, ge=0)
    """How long one prepare waits for a volume that is not ready (PVC unbound, not attached,
    driver not registered) before the pod shows FailedMount and is retried."""
    poll_seconds: float = Field(default=0.5, gt=0)
    """How often a waiting prepare looks again (the kubelet polls every 300 ms)."""
    reconcile_period_seconds: float = Field(default=60.0, gt=0)
    """How often volumes of pods that are gone are unpublished and failed teardowns retried."""
    resync_seconds: float = Field(default=60.0, gt=0)
    """observe: how often a mounted PVC is looked at for a pending node expansion."""


@dataclass(frozen=True)
class Ready:
    """One pod volume, set up."""

    spec: VolumeSpec
    path: Path
    """Filesystem: what containers mount; Block: the device."""
    host_path_type: str | None = None
    """hostPath PV: its type (checked at every container start, as the volumes stage does)."""


_READY = StashKey[dict[str, Ready]]("csi.ready")
_REPORTED = StashKey[set[str]]("csi.reported")
"""Operation failures already published as Events for the pod (not repeated every retry)."""


@dataclass
class _Problems:
    not_processed: dict[str, str] = field(default_factory=dict)
    unattached: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.not_processed or self.unattached or self.failed or self.waiting)

    def message(self, unmounted: list[str]) -> str:
        errors = [*self.not_processed.values(), *self.failed.values(), *self.unattached.values(),
                  *self.waiting.values()]
        return (f"Unable to attach or mount volumes: unmounted volumes={_go_list(unmounted)}, unattached "
                f"volumes={_go_list(sorted(self.unattached))}, failed to process "
                f"volumes={_go_list(sorted(self.not_processed))}: {'; '.join(errors)}")


def _go_list(items: list[str]) -> str:
    return "[" + " ".join(items) + "]"


class CsiStage(Prepare, Observe):
    name: ClassVar[str] = "csi"
    provides = (CONTAINER_ADDITIONS,)

    def __init__(self, config: CsiConfig, handle: AgentHandle) -> None:
        self.config = config
        self._handle = handle
        settings = handle.settings
        self.layout = Layout(Path(settings.root_dir))
        self.drivers = Drivers()
        objects = getattr(handle, "objects", None)
        self.nodeinfo = (NodeInfoManager(objects, handle.node.name)
                         if objects is not None and getattr(objects, "cluster", False) else None)
        self.registrations = CsiRegistrations(self.drivers, self.nodeinfo, handle.publish,
                                              call_timeout=config.call_timeout_seconds,
                                              registration_timeout=config.registration_timeout_seconds,
                                              on_change=self._drivers_changed)
        self.mounter = Mounter(self.layout, self.drivers, handle.node.name)
        self.stats = VolumeStats(self.layout, self.drivers)
        self.expander = Expander()
        self._csidrivers: View | None = objects.view(CSI_DRIVER) if objects is not None else None
        self._drivers_event = anyio.Event()
        self._active: set[str] = set()
        """Pods prepared (or being prepared) by this process and not unprepared since."""
        self._in_use: dict[str, set[str]] = {}
        """Pod UID → unique names of its CSI volumes (node.status.volumesInUse)."""
        self._failed_teardowns: set[str] = set()
        self._started_at = time.monotonic()

    # --- node level ---------------------------------------------------------------------

    def registration_handlers(self) -> list[CsiRegistrations]:
        """Plugins of type CSIPlugin, handed over by the agent's plugin watcher."""
        return [self.registrations]

    def _drivers_changed(self) -> None:
        event, self._drivers_event = self._drivers_event, anyio.Event()
        event.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The node task: what is mounted on disk counts as in use from the start (so the
        attach-detach controller detaches nothing a restarted agent's pods still use), then the
        CSINode, the reconcile loop and the volume stats."""
        self._reconstruct()
        async with anyio.create_task_group() as tg:
            if self.nodeinfo is not None:
                tg.start_soon(self._csinode_loop)
            tg.start_soon(self._reconcile_loop)
            # NodeGetVolumeStats on the agent's volumeStatsAggPeriod, as the kubelet's metrics
            # cache for CSI volumes (negative: no volume figures at all).
            period = float(self._handle.settings.volume_stats_agg_period)
            if period >= 0:
                tg.start_soon(self.stats.run, period or VOLUME_STATS_SECONDS)
            task_status.started()

    def _reconstruct(self) -> None:
        for pod_dir in self.layout.pod_dirs():
            names = {unique_name(p.record.driverName, p.record.volumeHandle) for p in self.layout.pod_volumes(pod_dir)
                     if p.record.volumeLifecycleMode == "Persistent"}
            if names:
                self._in_use.setdefault(pod_dir.name, set()).update(names)

    async def _csinode_loop(self) -> None:
        assert self.nodeinfo is not None
        delay = 0.5
        while True:
            try:
                await self.nodeinfo.ensure_csinode()
                return
            except (NodeInfoError, ObjectError) as exc:
                log.info("CSINode not written yet; retrying", error=str(exc), retry_in=delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _reconcile_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.reconcile_period_seconds)
            try:
                await self.reconcile()
            except Exception:  # noqa: BLE001 - the next period tries again; the agent goes on
                log.exception("CSI reconcile failed")

    async def reconcile(self) -> None:
        """Unpublish the volumes of pods that are gone (no sandbox, not prepared by this agent),
        retry failed teardowns, unstage what no pod publishes."""
        try:
            sandboxes = await self._handle.runtime.list_pod_sandbox()
        except CriError as exc:
            log.warning("CSI reconcile skipped: cannot list sandboxes", error=str(exc))
            return
        node = self._handle.node.name
        present = {s.labels.get(L.POD_UID, "") for s in sandboxes if s.labels.get(L.MANAGED_BY) == node}
        for pod_dir in self.layout.pod_dirs():
            uid = pod_dir.name
            if uid in self._active or uid in present:
                continue
            published = await anyio.to_thread.run_sync(self.layout.pod_volumes, pod_dir)
            for item in published:
                log.info("unpublishing a CSI volume of a pod that is gone", pod_uid=uid, volume=item.record.specVolID)
                await self._tear_down(item, uid, None)
            if not await anyio.to_thread.run_sync(self.layout.pod_volumes, pod_dir):
                self._in_use.pop(uid, None)
        for record, record_path in await anyio.to_thread.run_sync(self.mounter.staged_records):
            if record.volumeLifecycleMode != "Persistent":
                continue
            async with self.mounter.lock(record.driverName, record.volumeHandle):
                if await anyio.to_thread.run_sync(self.mounter.users, record.driverName, record.volumeHandle):
                    continue
                staging = (Path(record.stagingPath) if record.stagingPath else
                           self.layout.staging_path(record.driverName, record.volumeHandle))
                await self.mounter.unstage(record.driverName, record.volumeHandle, staging, record_path)

    def volumes_in_use(self) -> list[str]:
        """node.status.volumesInUse: the CSI volumes pods on this node want or have mounted."""
        return sorted(set().union(*self._in_use.values())) if self._in_use else []

    def volume_usage(self, uid: str) -> list[Any]:
        """The pod's CSI volumes' last NodeGetVolumeStats figures (nodeagent.stats.VolumeUsage)."""
        return self.stats.of_pod(uid)

    def describe(self) -> dict[str, Any]:
        return {"drivers": [{"name": d.name, "endpoint": d.endpoint, "socket": d.socket, "version": d.version_text,
                             "nodeID": d.node_id, "registeredAt": d.registered_at} for d in self.drivers.all()],
                "volumesInUse": self.volumes_in_use()}

    def _csidriver(self, name: str) -> Mapping[str, Any] | None:
        return self._csidrivers.get(name) if self._csidrivers is not None else None

    def _csidriver_map(self) -> dict[str, Mapping[str, Any]]:
        if self._csidrivers is None:
            return {}
        return {str((d.get("metadata") or {}).get("name")): d for d in self._csidrivers.items()}

    # --- prepare ------------------------------------------------------------------------

    async def prepare(self, ctx: PodContext) -> Result:
        pod = ctx.pod
        used = used_volumes(pod)
        mine = [v for v in pod.spec.volumes if handles(v) and v.name in used]
        unmappable = _unmappable_device(pod)
        if unmappable is not None:
            container, message = unmappable
            ctx.status.container_waiting(container, CONFIG_ERROR, message)
            return Result.retry(CONFIG_ERROR, message)
        if not mine:
            ctx.additions.withdraw()
            return Result.skip()
        if not ctx.objects.cluster:
            refusal = _standalone_refusal(mine)
            if refusal is not None:
                return refusal
        self._active.add(pod.uid)
        if self._csidrivers is not None and ctx.objects.cluster:
            await self._csidrivers.wait_synced(self.config.wait_seconds)
        ready = ctx.stash.setdefault(_READY, {})
        info = PodInfo(uid=pod.uid, name=pod.metadata.name, namespace=pod.metadata.namespace,
                       service_account=pod.spec.service_account_name or "default", pod_dir=ctx.pod_dir,
                       fs_group=pod.spec.security_context.fs_group if pod.spec.security_context else None,
                       fs_group_change_policy=(pod.spec.security_context.fs_group_change_policy
                                               if pod.spec.security_context else None))
        deadline = ctx.clock.monotonic() + self.config.wait_seconds
        while True:
            problems = await self._attempt(ctx, info, mine, used, ready)
            if not problems or problems.failed or ctx.clock.monotonic() >= deadline:
                break
            await self._wait(ctx)
        if problems:
            unmounted = sorted(v.name for v in mine if v.name not in ready)
            message = problems.message(unmounted)
            ctx.log.warning("volumes not mounted; the pod waits", unmounted=unmounted, error=message)
            # Waiting for something else to happen: look again soon; a driver's failure backs off.
            return Result.retry(FAILED_MOUNT, message,
                                retry_after=None if problems.failed else self.config.poll_seconds)
        try:
            self._contribute(ctx, pod, ready)
        except MountConfigError as exc:
            return Result.retry(CONFIG_ERROR, str(exc))
        ctx.stash.pop(_REPORTED)
        return Result.ok()

    async def _wait(self, ctx: PodContext) -> None:
        """Until a poll period passed, or a driver registered or went."""
        with anyio.move_on_after(self.config.poll_seconds):
            await self._drivers_event.wait()
        await anyio.lowlevel.checkpoint()

    async def _attempt(self, ctx: PodContext, info: PodInfo, volumes: list[Volume], used: Mapping[str, Any],
                       ready: dict[str, Ready]) -> _Problems:
        problems = _Problems()
        drivers = self._csidriver_map()
        for volume in volumes:
            if volume.name in ready:
                continue
            try:
                spec = await resolve(ctx.objects, ctx.pod, volume, used[volume.name], drivers)
            except NotReady as exc:
                problems.not_processed[volume.name] = str(exc)
                continue
            try:
                ready[volume.name] = await self._set_up(ctx, info, spec)
            except _NotReportedInUse:
                # The words of the kubelet's VerifyControllerAttachedVolume.
                problems.unattached[volume.name] = (
                    "Volume has not been added to the list of VolumesInUse in the node's volume status "
                    f'for volume "{spec.spec_name}"')
            except _NotInNodeStatus as exc:
                problems.unattached[volume.name] = f'{exc} for volume "{spec.spec_name}"'
            except _Unattached as exc:
                problems.unattached[volume.name] = (
                    f'MountVolume.WaitForAttach failed for volume "{spec.spec_name}" : {exc}')
            except OperationFailed as exc:
                text = f'{exc.operation} failed for volume "{spec.spec_name}" : {exc.error}'
                (problems.waiting if exc.waiting else problems.failed)[volume.name] = text
                reported = ctx.stash.setdefault(_REPORTED, set())
                if text not in reported:
                    reported.add(text)
                    await ctx.publish(VolumeOperationFailed(volume=spec.spec_name, operation=exc.operation,
                                                            error=exc.error, block=spec.block))
            except LocalError as exc:
                problems.failed[volume.name] = f'MountVolume.SetUp failed for volume "{spec.spec_name}" : {exc}'
        return problems

    async def _set_up(self, ctx: PodContext, info: PodInfo, spec: VolumeSpec) -> Ready:
        if spec.source != "csi":
            path, host_path_type = await set_up_local(spec, info, ctx.node.labels)
            return Ready(spec, path, host_path_type)
        name = unique_name(spec.driver, spec.handle)
        if spec.lifecycle == "Persistent":
            self._in_use.setdefault(info.uid, set()).add(name)
        csidriver = self._csidriver(spec.driver)
        publish_context: Mapping[str, str] = {}
        if spec.lifecycle == "Persistent" and _attach_required(csidriver):
            if not self._handle.volume_reported_in_use(name):
                raise _NotReportedInUse()
            await self._listed_attached(ctx, name)
            publish_context = await self._attached(ctx, spec)
        stage_secrets = await _secrets(ctx.objects, spec.stage_secret, "NodeStageSecretRef",
                                       "MapVolume.SetUpDevice" if spec.block else "MountVolume.MountDevice")
        publish_secrets = await _secrets(ctx.objects, spec.publish_secret, "NodePublishSecretRef",
                                         "MapVolume.MapPodDevice" if spec.block else "MountVolume.SetUp")
        context = dict(spec.attributes)
        if ((csidriver or {}).get("spec") or {}).get("podInfoOnMount"):
            context.update({f"{POD_INFO_PREFIX}pod.name": info.name, f"{POD_INFO_PREFIX}pod.namespace": info.namespace,
                            f"{POD_INFO_PREFIX}pod.uid": info.uid,
                            f"{POD_INFO_PREFIX}serviceAccount.name": info.service_account,
                            f"{POD_INFO_PREFIX}ephemeral": "true" if spec.lifecycle == "Ephemeral" else "false"})
        mounted = await self.mounter.set_up(info, spec, csi_driver=csidriver, publish_context=publish_context,
                                            stage_secrets=stage_secrets, publish_secrets=publish_secrets,
                                            volume_context=context)
        self.stats.published(info.uid, spec, mounted.target)
        await ctx.publish(VolumeMounted(volume=spec.spec_name, driver=spec.driver, target=str(mounted.target),
                                        adopted=mounted.adopted, block=spec.block))
        return Ready(spec, mounted.target)

    @staticmethod
    async def _listed_attached(ctx: PodContext, name: str) -> None:
        """The attach-detach controller lists the volume in the Node's volumesAttached once its
        attach succeeded; the kubelet mounts nothing before that, whatever the VolumeAttachment
        says (VerifyControllerAttachedVolume), and neither do we: the controller's own record
        is what keeps it from detaching the volume from under the pod."""
        try:
            node = await ctx.objects.get(NODE, ctx.node.name, max_age=0)
        except ObjectError as exc:
            raise _NotInNodeStatus(f"error getting node {ctx.node.name!r}: {exc}") from None
        attached = ((node or {}).get("status") or {}).get("volumesAttached") or []
        if not any(entry.get("name") == name for entry in attached):
            raise _NotInNodeStatus("Volume not attached according to node status")

    async def _attached(self, ctx: PodContext, spec: VolumeSpec) -> Mapping[str, str]:
        """The VolumeAttachment's attachmentMetadata once attached (csiAttacher.WaitForAttach)."""
        name = attachment_name(spec.handle, spec.driver, ctx.node.name)
        try:
            attachment = await ctx.objects.get(VOLUME_ATTACHMENT, name, max_age=0)
        except ObjectError as exc:
            raise _Unattached(f"volume {spec.handle} has GET error for volume attachment {name}: {exc}") from None
        if attachment is None:
            raise _Unattached(f"volume {spec.handle} has GET error for volume attachment {name}: "
                              f'volumeattachments.storage.k8s.io "{name}" not found')
        if (attachment.get("metadata") or {}).get("deletionTimestamp"):
            raise _Unattached("volume attachment is being deleted")
        status = attachment.get("status") or {}
        if status.get("attached"):
            return dict(status.get("attachmentMetadata") or {})
        error = (status.get("attachError") or {}).get("message")
        raise _Unattached(str(error) if error else f"volume {spec.handle} is not attached for volume attachment {name}")

    def _contribute(self, ctx: PodContext, pod: Pod, ready: Mapping[str, Ready]) -> None:
        """Each container's mounts of these volumes (subPath, readOnly as the volumes stage
        makes them) and its devices for Block volumes."""
        prepared: dict[str, PreparedVolume | None] = {v.name: None for v in pod.spec.volumes}
        for name, item in ready.items():
            if not item.spec.block:
                prepared[name] = PreparedVolume(item.path, read_only=item.spec.read_only,
                                                host_path_type=item.host_path_type)
        ctx.additions.withdraw()
        for container in pod.all_containers():
            mounts: list[t.Mount | VolumeBind] = container_mounts(container, prepared, {}) \
                if any(m.name in ready for m in container.volume_mounts) else []
            devices = []
            for device in container.volume_devices:
                item = ready.get(device.name)
                if item is None:
                    continue
                if not device.device_path.startswith("/"):
                    raise MountConfigError(f"error DevicePath `{device.device_path}` must be an absolute path")
                devices.append(t.Device(container_path=device.device_path, host_path=str(item.path),
                                        permissions="r" if item.spec.read_only else "mrw"))
            if mounts or devices:
                entry = ContainerAdditions(devices=devices)
                add_mounts(entry, mounts)
                ctx.additions.set(container.name, entry)

    # --- observe: node expansion ----------------------------------------------------------

    async def observe(self, ctx: PodContext) -> None:
        ready = ctx.stash.get(_READY) or {}
        claims = [r for r in ready.values() if r.spec.source == "csi" and r.spec.pvc is not None]
        if not claims:
            return
        seen = ctx.pod
        while True:
            for item in claims:
                driver = self.drivers.get(item.spec.driver)
                if driver is None:
                    continue
                try:
                    await self.expander.check(ctx, driver.client, item.spec, item.path, self.layout)
                except Exception as exc:  # noqa: BLE001 - one volume's trouble must not end the observer
                    ctx.log.warning("node expansion check failed", volume=item.spec.spec_name, error=str(exc))
            await ctx.pod_changed(seen, self.config.resync_seconds)
            seen = ctx.pod

    # --- unprepare ----------------------------------------------------------------------

    async def unprepare(self, ctx: PodContext) -> None:
        """Only once no container of the pod runs: unpublish what is on disk for the pod (this
        may be a restarted agent, or an orphan with no spec), unstage the unused."""
        uid = ctx.ref.uid
        ctx.additions.withdraw()
        ctx.stash.pop(_READY)
        published = await anyio.to_thread.run_sync(self.layout.pod_volumes, ctx.pod_dir)
        for item in published:
            await self._tear_down(item, uid, ctx)
        self.stats.forget(uid)
        self._active.discard(uid)
        if not await anyio.to_thread.run_sync(self.layout.pod_volumes, ctx.pod_dir):
            self._in_use.pop(uid, None)

    async def _tear_down(self, item: Published, uid: str, ctx: PodContext | None) -> None:
        done = await self.mounter.tear_down(item, uid)
        if not done:
            self._failed_teardowns.add(uid)
            return
        event = VolumeUnmounted(volume=item.record.specVolID, driver=item.record.driverName, target=str(item.target))
        if ctx is not None:
            await ctx.publish(event)
        else:
            await self._handle.publish(event.model_copy(update={"source": self.name}))


class _Unattached(Exception):
    """The VolumeAttachment is missing or not attached yet."""


class _NotInNodeStatus(Exception):
    """The Node's status.volumesAttached does not list the volume yet."""


class _NotReportedInUse(Exception):
    """No Node status write has listed the volume in volumesInUse yet: until one has, the
    attach-detach controller may detach it (nodeagent.volumesinuse)."""


def _attach_required(csidriver: Mapping[str, Any] | None) -> bool:
    """CSIDriver.spec.attachRequired (default true); no CSIDriver: attach (the kubelet's
    csiAttacher skips only when the CSIDriver says so)."""
    if csidriver is None:
        return True
    return (csidriver.get("spec") or {}).get("attachRequired") is not False


async def _secrets(objects: Any, ref: SecretRef | None, what: str, operation: str) -> dict[str, str]:
    """A secret a PV or inline volume names (nodeStageSecretRef, nodePublishSecretRef), read
    fresh with the node's credentials (the Node authorizer allows exactly these)."""
    if ref is None:
        return {}
    try:
        data = await ObjectReader(objects, ref.namespace).get("Secret", ref.name)
    except ObjectUnavailable as exc:
        raise OperationFailed(operation, f"fetching {what} {ref.namespace}/{ref.name} failed: {exc}",
                              waiting=True) from None
    return data.env_values()


def _unmappable_device(pod: Pod) -> tuple[str, str] | None:
    """A volumeDevices entry naming no persistent volume of the pod (the kubelet's
    makeBlockVolumes: the container cannot be created)."""
    claims = {v.name for v in pod.spec.volumes if v.persistent_volume_claim is not None or v.ephemeral is not None}
    for container in pod.all_containers():
        for device in container.volume_devices:
            if device.name not in claims:
                return container.name, f'cannot find volume "{device.name}" to pass into container "{container.name}"'
    return None


def _standalone_refusal(volumes: list[Volume]) -> Result | None:
    for volume in volumes:
        if volume.persistent_volume_claim is not None or volume.ephemeral is not None:
            source = "persistentVolumeClaim" if volume.persistent_volume_claim is not None else "ephemeral"
            return Result.reject(UNSUPPORTED_VOLUME, f'volume "{volume.name}" is a {source} volume, which needs the '
                                                     "API server, and this node runs standalone: the pod would run "
                                                     "without it")
    return None


def plugin(config: CsiConfig | Mapping[str, Any], handle: AgentHandle) -> CsiStage:
    if not isinstance(config, CsiConfig):
        config = CsiConfig.model_validate(dict(config))
    return CsiStage(config, handle)


plugin.stage_class = CsiStage  # type: ignore[attr-defined]
plugin.config_model = CsiConfig  # type: ignore[attr-defined]
__all__ = ["CsiConfig", "CsiStage", "plugin"]
