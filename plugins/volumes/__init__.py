"""The volumes stage: per-pod volume directories, and the mounts containers get from them.

prepare (before the runtime stage creates the sandbox) sets each volume up under
``<rootDir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`` — emptyDir (a 0777 directory,
or a tmpfs for medium Memory), hostPath (its type check), downwardAPI (files written
atomically) — and contributes each container's volumeMounts as CRI mounts through
:mod:`nodeagent.additions`. unprepare, which runs only once no container of the pod runs,
unmounts the tmpfs mounts and removes the volume directories.

Volume sources nodeagent does not implement (configMap, secret, projected, ...) are reported
as unhonoured fields by the model; mounts of them are skipped.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio

from cri import types as t
from nodeagent.additions import CONTAINER_ADDITIONS, contribute
from nodeagent.model import Volume
from nodeagent.stages import AgentHandle, PodContext, Prepare, Result
from nodeagent.stash import StashKey
from plugins.runtime.env import FieldError, PodFacts, container_env
from plugins.volumes import sources
from plugins.volumes.mountinfo import MountError, mounts_under, unmount
from plugins.volumes.mounts import MountConfigError, PreparedVolume, container_mounts

CONTRIBUTED = StashKey[dict[str, list[t.Mount]]]("volumes.contributed")
"""Container name → the mounts this stage added, so that a second prepare replaces them."""

FAILED_MOUNT = "FailedMount"
CONFIG_ERROR = "CreateContainerConfigError"


class VolumesStage(Prepare):
    name: ClassVar[str] = "volumes"

    async def prepare(self, ctx: PodContext) -> Result:
        pod = ctx.pod
        if not pod.spec.volumes and not any(c.volume_mounts for c in pod.all_containers()):
            return Result.skip()
        facts = PodFacts(host_ips=(ctx.node.ip,) if ctx.node.ip else (), allocatable=dict(ctx.node.allocatable))
        prepared: dict[str, PreparedVolume | None] = {}
        for volume in pod.spec.volumes:
            try:
                prepared[volume.name] = await self._set_up(ctx, volume, facts)
            except (sources.SetupError, FieldError, MountError, OSError) as exc:
                # The kubelet's FailedMount: the pod waits (ContainerCreating) and setup retries.
                message = f'MountVolume.SetUp failed for volume "{volume.name}" : {exc}'
                ctx.log.warning("volume setup failed", volume=volume.name, error=str(exc))
                return Result.retry(FAILED_MOUNT, message)
        table: dict[str, list[t.Mount]] = {}
        for container in pod.all_containers():
            try:
                env = container_env(pod, container, facts) if any(m.sub_path_expr for m in container.volume_mounts) \
                    else {}
                table[container.name] = await anyio.to_thread.run_sync(container_mounts, container, prepared, env)
            except (MountConfigError, FieldError, OSError) as exc:
                ctx.status.container_waiting(container.name, CONFIG_ERROR, str(exc))
                return Result.retry(CONFIG_ERROR, f"container {container.name}: {exc}")
        self._contribute(ctx, table)
        return Result.ok()

    async def _set_up(self, ctx: PodContext, volume: Volume, facts: PodFacts) -> PreparedVolume | None:
        pod = ctx.pod
        if volume.empty_dir is not None:
            path = ctx.pod_dir / "volumes" / sources.EMPTY_DIR / volume.name
            if volume.empty_dir.medium == "" and volume.empty_dir.size_limit is not None:
                ctx.log.warning("emptyDir sizeLimit on the node's disk is not enforced", volume=volume.name)
            await sources.setup_empty_dir(path, volume.empty_dir, pod, ctx.node.allocatable.get("memory", 0))
            return PreparedVolume(path)
        if volume.host_path is not None:
            await anyio.to_thread.run_sync(sources.check_host_path, volume.host_path)
            return PreparedVolume(Path(volume.host_path.path))
        if volume.downward_api is not None:
            path = ctx.pod_dir / "volumes" / sources.DOWNWARD_API / volume.name
            payload = sources.downward_payload(volume.downward_api, pod, facts)
            await anyio.to_thread.run_sync(sources.write_atomically, path, payload)
            return PreparedVolume(path, read_only=True)
        return None  # a source nodeagent does not implement: reported, not mounted

    @staticmethod
    def _contribute(ctx: PodContext, table: Mapping[str, list[t.Mount]]) -> None:
        """Replace what an earlier prepare contributed (a retry, an updated spec)."""
        VolumesStage._withdraw(ctx)
        for container, mounts in table.items():
            if mounts:
                contribute(ctx.stash, VolumesStage.name, container).mounts.extend(mounts)
        ctx.stash[CONTRIBUTED] = {name: list(mounts) for name, mounts in table.items()}

    @staticmethod
    def _withdraw(ctx: PodContext) -> None:
        before = ctx.stash.pop(CONTRIBUTED) or {}
        entries = ctx.stash.get(CONTAINER_ADDITIONS, {})
        for container, mounts in before.items():
            entry = entries.get(container)
            if entry is not None:
                entry.mounts[:] = [m for m in entry.mounts if m not in mounts]

    async def unprepare(self, ctx: PodContext) -> None:
        # Found on disk and in the mount table, not remembered: this may be a restarted agent.
        volumes_dir = ctx.pod_dir / "volumes"
        for mount_point in mounts_under(volumes_dir):
            await unmount(mount_point)
        left = mounts_under(volumes_dir)
        if left:
            # Never delete into a mount: its contents are not ours to remove.
            ctx.log.warning("volumes still mounted; directories kept", mounts=[str(p) for p in left])
            return
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(volumes_dir, ignore_errors=True))
        self._withdraw(ctx)


def plugin(config: Mapping[str, Any], handle: AgentHandle) -> VolumesStage:
    if config:
        raise TypeError(f"volumes takes no configuration, got {sorted(config)}")
    return VolumesStage()


plugin.stage_class = VolumesStage  # type: ignore[attr-defined]
__all__ = ["VolumesStage", "plugin"]
