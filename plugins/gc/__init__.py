"""The gc stage: image and container garbage collection on the kubelet's periods
(pkg/kubelet/kubelet.go StartGarbageCollection).

* every ``imageGCPeriod`` (5 m): image GC (:mod:`plugins.gc.images`) — unused images past
  ``imageMaximumGCAge``, then, over ``imageGCHighThresholdPercent``, the least recently used
  down to ``imageGCLowThresholdPercent``; never an image a container uses or the runtime pins;
* every ``containerGCPeriod`` (1 m): container GC (:mod:`plugins.gc.containers`) — dead
  containers beyond the policy, sandboxes and log directories of gone pods, dangling log links,
  orphaned pod directories.

A failed run is logged; failures in a row become the kubelet's Node Events (``ImageGCFailed``,
``ContainerGCFailed``). Both are offered to other stages as node-level reclaim (eviction asks
for them before it evicts a pod): ``images`` deletes every unused image old enough,
``containers`` every dead container, of finished pods too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.abc
import structlog

from nodeagent import duration
from nodeagent.stages import AgentHandle, NodeTask
from plugins.gc.config import GcConfig
from plugins.gc.containers import ContainerGC
from plugins.gc.images import ImageGC

log = structlog.get_logger("nodeagent.gc")


class GcStage(NodeTask):
    name: ClassVar[str] = "gc"

    def __init__(self, config: GcConfig, handle: AgentHandle) -> None:
        self.config = config
        self.handle = handle
        settings = handle.settings
        self.images = ImageGC(config, handle.runtime, lambda *e: handle.node_event(*e))
        self.containers = ContainerGC(config, handle.runtime, handle.node.name, handle.pods, Path(settings.root_dir),
                                      Path(settings.pod_logs_dir),
                                      getattr(settings, "container_logs_symlink_dir", None))
        self._lock = anyio.Lock()
        """One GC at a time: a reclaim asked for by eviction waits for a periodic run."""
        handle.provide_reclaim("images", self.delete_unused_images)
        handle.provide_reclaim("containers", self.delete_all_unused_containers)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with anyio.create_task_group() as tg:
            # The image records (first seen, last used) are kept even with image GC off, as the
            # kubelet's image manager does: eviction's reclaim needs their ages.
            tg.start_soon(self._detect_images)
            if self.config.image_gc_enabled:
                tg.start_soon(self._every, self.config.image_gc_period, self._image_gc, "ImageGCFailed")
            else:
                log.info("image garbage collection disabled (imageGCHighThresholdPercent 100, no maximum age)")
            tg.start_soon(self._every, self.config.container_gc_period, self._container_gc, "ContainerGCFailed")

    async def _detect_images(self) -> None:
        while True:
            try:
                async with self._lock:
                    await self.images.detect(self.images.now())
            except Exception as exc:  # noqa: BLE001 - the next period tries again
                log.warning("image detection failed", error=str(exc))
            await self.handle.clock.sleep(self.config.image_gc_period)

    async def _every(self, period: float, run: Callable[[], Awaitable[None]], failed_reason: str) -> None:
        """The kubelet's loops: the first failure is logged, a repeated one becomes a Node Event."""
        failures = 0
        while True:
            await self.handle.clock.sleep(period)
            try:
                async with self._lock:
                    await run()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - one failed run; the next period tries again
                failures += 1
                log.warning("garbage collection failed", kind=failed_reason, error=str(exc), failures=failures)
                if failures > 1:
                    self.handle.node_event("Warning", failed_reason, str(exc))

    async def _image_gc(self) -> None:
        await self.images.garbage_collect()

    async def _container_gc(self) -> None:
        result = await self.containers.garbage_collect()
        if result.errors:
            raise RuntimeError("; ".join(result.errors[:5]))

    async def delete_unused_images(self) -> int:
        async with self._lock:
            return await self.images.delete_unused()

    async def delete_all_unused_containers(self) -> int:
        async with self._lock:
            result = await self.containers.garbage_collect(evict_finished=True)
        return result.containers

    def render_metrics(self) -> str:
        return self.images.render_metrics() + (
            "# HELP kubelet_orphan_pod_cleaned_volumes [ALPHA] The total number of orphaned Pods whose volumes "
            "were cleaned in the last periodic sweep.\n# TYPE kubelet_orphan_pod_cleaned_volumes gauge\n"
            f"kubelet_orphan_pod_cleaned_volumes {self.containers.cleaned_pod_dirs}\n"
            "# HELP kubelet_orphan_pod_cleaned_volumes_errors [ALPHA] The number of orphaned Pods whose volumes "
            "failed to be cleaned in the last periodic sweep.\n# TYPE kubelet_orphan_pod_cleaned_volumes_errors "
            f"gauge\nkubelet_orphan_pod_cleaned_volumes_errors {self.containers.pod_dir_errors}\n")

    def kubelet_config(self) -> dict[str, Any]:
        """Its KubeletConfiguration fields, for /configz."""
        c = self.config
        return {"imageGCHighThresholdPercent": c.image_gc_high_threshold_percent,
                "imageGCLowThresholdPercent": c.image_gc_low_threshold_percent,
                "imageMinimumGCAge": duration.format(c.image_minimum_gc_age),
                "imageMaximumGCAge": duration.format(c.image_maximum_gc_age)}

    def describe(self) -> dict[str, Any]:
        return {"images": len(self.images.records), "collected": dict(self.images.collected)}


def plugin(config: Mapping[str, Any], handle: AgentHandle) -> GcStage:
    return GcStage(GcConfig.model_validate(dict(config)), handle)


plugin.stage_class = GcStage  # type: ignore[attr-defined]
__all__ = ["GcConfig", "GcStage", "plugin"]
