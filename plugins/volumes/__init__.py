"""The volumes stage: per-pod volume directories, and the mounts containers get from them.

prepare (before the runtime stage creates the sandbox) sets each volume up under
``<rootDir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`` — emptyDir (a 0777 directory,
or a tmpfs for medium Memory), hostPath (its type check), downwardAPI (files written
atomically) — gives emptyDir and downwardAPI volumes to the pod's ``fsGroup``
(:mod:`nodeagent.volumeutil.ownership`), and contributes each container's volumeMounts through
:mod:`nodeagent.additions`: CRI mounts by path, except subPaths and typed hostPaths, which are
contributed as binds that the runtime stage opens safely, checks and bind-mounts at every
container start (:mod:`nodeagent.volumebind`). observe rewrites downwardAPI volumes when the pod's
labels, annotations or spec change. unprepare, which runs only once no container of the pod
runs, unmounts the tmpfs mounts and removes the volume directories.

Volume sources nodeagent does not implement (configMap, secret, projected, ...) are reported
as unhonoured fields by the model; mounts of them are skipped.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import anyio

from cri import types as t
from nodeagent import hostpaths
from nodeagent.additions import CONTAINER_ADDITIONS, ContainerAdditions, VolumeBind, add_mounts
from nodeagent.kube.downward import downward_payload
from nodeagent.kube.env import FieldError, PodFacts, container_env
from nodeagent.model import DownwardAPIVolumeSource, Volume
from nodeagent.pluginconfig import NoConfig
from nodeagent.stages import AgentHandle, Observe, PodContext, Prepare, Result
from nodeagent.volumeutil import SetupError
from nodeagent.volumeutil.atomicwriter import write_atomically
from nodeagent.volumeutil.mounts import MountConfigError, PreparedVolume, container_mounts
from nodeagent.volumeutil.ownership import fs_group_of, set_volume_ownership
from nodeagent.volumeutil.tmpfs import MountError, remove_unmounted
from plugins.volumes import sources

FAILED_MOUNT = "FailedMount"
CONFIG_ERROR = "CreateContainerConfigError"
RESYNC_SECONDS = 60.0
"""The kubelet's pod sync period: downwardAPI volumes are rewritten at least this often."""


class VolumesStage(Prepare, Observe):
    name: ClassVar[str] = "volumes"
    provides = (CONTAINER_ADDITIONS,)

    async def prepare(self, ctx: PodContext) -> Result:
        pod = ctx.pod
        if not pod.spec.volumes and not any(c.volume_mounts for c in pod.all_containers()):
            return Result.skip()
        facts = PodFacts(host_ips=(ctx.node.ip,) if ctx.node.ip else (), allocatable=dict(ctx.node.allocatable))
        prepared: dict[str, PreparedVolume | None] = {}
        for volume in pod.spec.volumes:
            try:
                prepared[volume.name] = await self._set_up(ctx, volume, facts)
            except (SetupError, FieldError, MountError, OSError) as exc:
                # The kubelet's FailedMount: the pod waits (ContainerCreating) and setup retries.
                message = f'MountVolume.SetUp failed for volume "{volume.name}" : {exc}'
                ctx.log.warning("volume setup failed", volume=volume.name, error=str(exc))
                return Result.retry(FAILED_MOUNT, message)
        table: dict[str, list[t.Mount | VolumeBind]] = {}
        for container in pod.all_containers():
            try:
                env = container_env(pod, container, facts) if any(m.sub_path_expr for m in container.volume_mounts) \
                    else {}
                table[container.name] = container_mounts(container, prepared, env)
            except (MountConfigError, FieldError, OSError) as exc:
                ctx.status.container_waiting(container.name, CONFIG_ERROR, str(exc))
                return Result.retry(CONFIG_ERROR, f"container {container.name}: {exc}")
        self._contribute(ctx, table)
        return Result.ok()

    async def _set_up(self, ctx: PodContext, volume: Volume, facts: PodFacts) -> PreparedVolume | None:
        pod = ctx.pod
        if volume.empty_dir is not None:
            path = hostpaths.volume_dir(ctx.pod_dir, sources.EMPTY_DIR, volume.name)
            fresh = await sources.setup_empty_dir(path, volume.empty_dir, pod, ctx.node.allocatable.get("memory", 0))
            fs_group = fs_group_of(pod)
            if fresh and fs_group is not None:
                # Only when made now, as the kubelet (its ready file): after an agent restart
                # the files are the containers' own and keep the owners they gave them.
                await anyio.to_thread.run_sync(
                    functools.partial(set_volume_ownership, path, fs_group, read_only=False))
            return PreparedVolume(path)
        if volume.host_path is not None:
            await anyio.to_thread.run_sync(sources.check_host_path, volume.host_path)
            # The check is made again, on what is mounted, at each container start.
            return PreparedVolume(Path(volume.host_path.path), host_path_type=volume.host_path.type)
        if volume.downward_api is not None:
            path = await self._write_downward(ctx, volume, volume.downward_api, facts)
            return PreparedVolume(path, read_only=True)
        return None  # a source nodeagent does not implement: reported, not mounted

    @staticmethod
    async def _write_downward(ctx: PodContext, volume: Volume, source: DownwardAPIVolumeSource,
                              facts: PodFacts) -> Path:
        path = hostpaths.volume_dir(ctx.pod_dir, sources.DOWNWARD_API, volume.name)
        payload = downward_payload(source, ctx.pod, facts)
        if await anyio.to_thread.run_sync(write_atomically, path, payload, fs_group_of(ctx.pod)):
            ctx.log.debug("downwardAPI volume written", volume=volume.name, files=sorted(payload))
        return path

    # --- observe: downwardAPI files follow the pod's metadata ----------------------------

    async def observe(self, ctx: PodContext) -> None:
        """Rewrite downwardAPI volumes (atomically) when the pod's spec or metadata change,
        e.g. labels or annotations edited in the API; the kubelet remounts them on each pod
        sync. Containers see the new files through the ``..data`` swap, never half of them."""
        mounted = {m.name for c in ctx.pod.all_containers() for m in c.volume_mounts}
        if not any(v.downward_api is not None and v.name in mounted for v in ctx.pod.spec.volumes):
            return
        seen = ctx.pod
        while True:
            await ctx.pod_changed(seen, RESYNC_SECONDS)
            seen = ctx.pod
            facts = PodFacts(host_ips=(ctx.node.ip,) if ctx.node.ip else (), allocatable=dict(ctx.node.allocatable))
            for volume in seen.spec.volumes:
                if volume.downward_api is None or volume.name not in mounted:
                    continue
                try:
                    await self._write_downward(ctx, volume, volume.downward_api, facts)
                except (SetupError, FieldError, OSError) as exc:
                    # The files keep their last content; the next change or resync tries again.
                    ctx.log.warning("downwardAPI volume refresh failed", volume=volume.name, error=str(exc))

    @staticmethod
    def _contribute(ctx: PodContext, table: Mapping[str, list[t.Mount | VolumeBind]]) -> None:
        """Replace what an earlier prepare contributed (a retry, an updated spec)."""
        ctx.additions.withdraw()
        for container, mounts in table.items():
            if mounts:
                entry = ContainerAdditions()
                add_mounts(entry, mounts)
                ctx.additions.set(container, entry)

    async def unprepare(self, ctx: PodContext) -> None:
        # Found on disk and in the mount table, not remembered: this may be a restarted agent.
        # Only this stage's own volume kinds: the others' (a CSI driver's publication) are
        # their stages' to undo, through their drivers.
        kept = False
        for plugin in (sources.EMPTY_DIR, sources.DOWNWARD_API):
            left = await remove_unmounted(ctx.pod_dir / hostpaths.VOLUMES / plugin)
            if left:
                ctx.log.warning("volumes still mounted; directories kept", mounts=[str(p) for p in left])
                kept = True
        if not kept:
            ctx.additions.withdraw()


def plugin(config: NoConfig, handle: AgentHandle) -> VolumesStage:
    return VolumesStage()


plugin.stage_class = VolumesStage  # type: ignore[attr-defined]
plugin.config_model = NoConfig  # type: ignore[attr-defined]
__all__ = ["VolumesStage", "plugin"]
