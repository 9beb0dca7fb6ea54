"""The logs stage: what the kubelet does for container log files besides letting the runtime
write them (containerd writes ``podLogsDir/<ns>_<name>_<uid>/<container>/<restartCount>.log``).

* observe — keeps the legacy symlinks ``containerLogsSymlinkDir/<pod>_<ns>_<container>-<id>.log``
  for every container instance the runtime has (made once the log file exists, removed when the
  instance is gone), and every ``containerLogMonitorInterval`` rotates the log of each running
  container that reached ``containerLogMaxSize``, keeping ``containerLogMaxFiles`` files
  (see :mod:`plugins.logs.rotation`).
* cleanup — removes the pod's symlinks (the runtime stage removes the log directory).

Reading the logs is ``nodeagent logs`` (:mod:`nodeagent.logreader`), which needs no stage.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import ClassVar

import anyio

from cri import CriError
from nodeagent import hostpaths, quantity
from nodeagent.pluginconfig import PluginConfig
from nodeagent.runtimeview import ContainerRecord
from nodeagent.stages import AgentHandle, Cleanup, Observe, PodContext
from plugins.logs import rotation, symlink

# How often the links are checked when the runtime shows no change (a lost link comes back).
LINK_RESYNC_SECONDS = 10.0


class LogsStage(Observe, Cleanup):
    name: ClassVar[str] = "logs"

    def __init__(self, pod_logs_dir: Path, symlink_dir: Path, max_size: int, max_files: int,
                 interval: float) -> None:
        self._pod_logs = pod_logs_dir
        self._links = symlink_dir
        self._max_size = max_size
        self._max_files = max_files
        self._interval = interval

    def _log_dir(self, ctx: PodContext) -> Path:
        return hostpaths.pod_log_dir(self._pod_logs, ctx.ref.namespace, ctx.ref.name, ctx.ref.uid)

    # --- observe ---------------------------------------------------------------------------

    async def observe(self, ctx: PodContext) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._keep_links, ctx)
            tg.start_soon(self._keep_rotating, ctx)

    async def _keep_links(self, ctx: PodContext) -> None:
        prefix = symlink.pod_prefix(ctx.ref.name, ctx.ref.namespace)
        log_dir = self._log_dir(ctx)
        # The links last made in full: a runtime change that wants the same ones costs no scan
        # of the directory, which holds every pod's links (a scan per change per pod grew with
        # the node's pod count). A link removed by hand comes back at the next resync.
        settled: dict[str, str] | None = None
        resync_at = 0.0
        while True:
            wanted = {
                symlink.link_name(ctx.ref.name, ctx.ref.namespace, c.name, c.id): c.log_path
                for c in ctx.observed.containers if c.log_path
            }
            now = time.monotonic()
            if wanted != settled or now >= resync_at:
                created, removed, complete = await anyio.to_thread.run_sync(
                    symlink.reconcile, self._links, prefix, log_dir, wanted)
                if created or removed:
                    ctx.log.debug("container log symlinks", created=created, removed=removed)
                settled = wanted if complete else None
                resync_at = now + LINK_RESYNC_SECONDS
            await ctx.runtime_changed(timeout=LINK_RESYNC_SECONDS)

    async def _keep_rotating(self, ctx: PodContext) -> None:
        # Like the kubelet's wait.Until: look now, then every interval.
        while True:
            for container in ctx.observed.running():
                try:
                    await self._rotate_if_needed(ctx, container)
                except (CriError, OSError) as exc:
                    # One container's trouble must not stop the others' rotation (the kubelet's rule).
                    ctx.log.warning("container log rotation failed", container=container.name,
                                    container_id=container.id, error=str(exc))
            await ctx.clock.sleep(self._interval)

    async def _rotate_if_needed(self, ctx: PodContext, c: ContainerRecord) -> None:
        if not c.log_path:
            return
        log = Path(c.log_path)
        try:
            size = os.stat(log).st_size
        except FileNotFoundError:
            # A rotation was cut off between the rename and the reopen (an agent crash, or a
            # failed reopen whose rename-back failed too): the runtime writes to a renamed file.
            # Reopening gives the container its live file back.
            await ctx.runtime.reopen_container_log(c.id)
            size = os.stat(log).st_size
        if size < self._max_size:
            return
        await anyio.to_thread.run_sync(rotation.prepare, log, self._max_files)
        rotated = rotation.rotated_name(log, ctx.clock.now())
        if rotated.exists():
            return  # rotated within this second already; renaming again would overwrite it
        # Shielded: cancelled between the rename and the reopen, the container would go on
        # writing into the rotated file until the next check recovers it.
        with anyio.CancelScope(shield=True):
            os.rename(log, rotated)
            try:
                await ctx.runtime.reopen_container_log(c.id)
            except CriError:
                # Put the file back so the next round can try again (the kubelet does the same).
                os.rename(rotated, log)
                raise
        ctx.log.info("container log rotated", container=c.name, container_id=c.id, size=size,
                     rotated=rotated.name)

    # --- cleanup ---------------------------------------------------------------------------

    async def cleanup(self, ctx: PodContext) -> None:
        prefix = symlink.pod_prefix(ctx.ref.name, ctx.ref.namespace)
        await anyio.to_thread.run_sync(symlink.remove_all, self._links, prefix, self._log_dir(ctx))


class LogsConfig(PluginConfig):
    container_logs_symlink_dir: Path = Path("/var/log/containers")
    """Where the legacy ``<pod>_<ns>_<container>-<id>.log`` symlinks go (the kubelet hard-codes
    /var/log/containers)."""


def plugin(config: LogsConfig, handle: AgentHandle) -> LogsStage:
    """The symlink directory is this plugin's own; podLogsDir and rotation (containerLogMaxSize,
    containerLogMaxFiles, containerLogMonitorInterval) are the kubelet's."""
    s = handle.settings
    return LogsStage(
        pod_logs_dir=Path(s.pod_logs_dir),
        symlink_dir=config.container_logs_symlink_dir,
        max_size=quantity.bytes_(s.container_log_max_size),
        max_files=s.container_log_max_files or 5,
        interval=s.container_log_monitor_interval or 10.0,
    )


plugin.stage_class = LogsStage  # type: ignore[attr-defined]
plugin.config_model = LogsConfig  # type: ignore[attr-defined]
__all__ = ["LogsStage", "plugin"]
