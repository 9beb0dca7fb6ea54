"""Image garbage collection, as the kubelet's realImageGCManager (pkg/kubelet/images).

Each run lists the runtime's images and every container it has (running or not, this node's
and any other agent's sharing the runtime: an image in use by anyone is in use). An image gets
``first_detected`` when first seen and ``last_used`` whenever a container uses it; records go
with the images. Candidates are the images no container uses and the runtime has not pinned
(containerd pins its sandbox image), least recently used first.

* age pass (``imageMaximumGCAge`` > 0, and the GC running longer than it): every candidate
  unused for longer is removed (reason ``age``);
* space pass: when the image filesystem is ``imageGCHighThresholdPercent`` full or more,
  candidates first seen at least ``imageMinimumGCAge`` ago are removed until it is back to
  ``imageGCLowThresholdPercent`` (reason ``space``); short of that, the kubelet's
  FreeDiskSpaceFailed Event.

:meth:`ImageGC.delete_unused` is eviction's reclaim (DeleteUnusedImages): every candidate old
enough, whatever the thresholds.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from cri import CriError, NotFound, RuntimeClient
from nodeagent.stats import host
from plugins.gc.config import GcConfig

log = structlog.get_logger("nodeagent.gc")

AGE, SPACE = "age", "space"

NodeEvent = Callable[[str, str, str], None]


@dataclass
class ImageRecord:
    first_detected: float
    last_used: float = 0.0
    size: int = 0
    pinned: bool = False
    names: tuple[str, ...] = ()


class ImageGCError(Exception):
    pass


def format_size(size: int) -> str:
    """The kubelet's formatSize: ``512 B``, ``1.5 KiB``, ..., ``19.5 GiB``, at most TiB."""
    if size < 1024:
        return f"{size} B"
    for power, unit in ((2, "KiB"), (3, "MiB"), (4, "GiB")):
        if size < 1024**power:
            return f"{size / 1024 ** (power - 1):.1f} {unit}"
    return f"{size / 1024**4:.1f} TiB"


class ImageGC:
    def __init__(self, config: GcConfig, runtime: RuntimeClient, node_event: NodeEvent,
                 now: Callable[[], float] = time.time) -> None:
        self.config = config
        self.runtime = runtime
        self.node_event = node_event
        self.now = now
        self.began = now()
        self.records: dict[str, ImageRecord] = {}
        self.collected: Counter[str] = Counter()
        """kubelet_image_garbage_collected_total by reason."""
        self.removed_at: dict[str, float] = {}
        """Image ID -> when GC removed it."""

    async def sandbox_images(self) -> set[str]:
        """The runtime's sandbox (pause) image, from CRI Status' config. containerd 1.7+ pins it
        (Image.pinned); 1.6 does not, and no container lists it, so the kubelet's rule alone
        would remove it from an idle 1.6 node. We never do (a deliberate difference)."""
        try:
            _status, info = await self.runtime.status(verbose=True)
            config = json.loads(info.get("config", "{}") or "{}")
        except (CriError, ValueError):
            return set()
        names = {config.get("sandboxImage", "")}
        pinned = config.get("pinnedImages")
        if isinstance(pinned, dict):
            names |= {str(v) for v in pinned.values()}
        return {n for n in names if n}

    async def detect(self, detect_time: float) -> set[str]:
        """detectImages: refresh the records; returns the IDs of the images in use."""
        images = await self.runtime.list_images()
        containers = await self.runtime.list_containers()
        by_name: dict[str, str] = {}
        for image in images:
            for name in (image.id, *image.repo_tags, *image.repo_digests):
                by_name[name] = image.id
        in_use: set[str] = {by_name[n] for n in await self.sandbox_images() if n in by_name}
        for container in containers:
            for ref in (container.image_id, container.image_ref, container.image.image if container.image else ""):
                if ref and ref in by_name:
                    in_use.add(by_name[ref])
            in_use |= await self._mounted_images(container.id, by_name)
        now = self.now()
        current = set()
        for image in images:
            current.add(image.id)
            record = self.records.setdefault(image.id, ImageRecord(first_detected=detect_time))
            if image.id in in_use:
                record.last_used = now
            record.size, record.pinned = image.size, image.pinned
            record.names = tuple(image.repo_tags or image.repo_digests)
        for gone in set(self.records) - current:
            del self.records[gone]
        return in_use

    async def _mounted_images(self, container_id: str, by_name: dict[str, str]) -> set[str]:
        """handleImageVolumes: the images a container mounts (image volumes), from its status'
        mounts — as the kubelet, a ContainerStatus per container at each detection. A
        container gone meanwhile mounts nothing."""
        try:
            status = await self.runtime.container_status(container_id)
        except NotFound:
            return set()
        return {by_name[m.image.image] for m in status.mounts if m.image is not None and m.image.image in by_name}

    async def candidates(self, free_time: float) -> list[tuple[str, ImageRecord]]:
        """imagesInEvictionOrder: unused, unpinned, least recently used (then first detected) first."""
        in_use = await self.detect(free_time)
        found = [(image, r) for image, r in self.records.items() if image not in in_use and not r.pinned]
        found.sort(key=lambda item: (item[1].last_used, item[1].first_detected))
        return found

    async def garbage_collect(self) -> None:
        """One periodic run: the age pass, then the space pass."""
        free_time = self.now()
        images = await self.candidates(free_time)
        images = await self._free_old(images, free_time)
        usage = await self._image_fs()
        if usage is None:
            return
        capacity, available = usage
        available = min(available, capacity)
        if capacity == 0:
            message = "invalid capacity 0 on image filesystem"
            self.node_event("Warning", "InvalidDiskCapacity", message)
            raise ImageGCError(message)
        usage_percent = 100 - int(available * 100 / capacity)
        if usage_percent < self.config.image_gc_high_threshold_percent:
            return
        to_free = capacity * (100 - self.config.image_gc_low_threshold_percent) // 100 - available
        log.info("image filesystem over the high threshold; freeing space", usage=usage_percent,
                 high=self.config.image_gc_high_threshold_percent, low=self.config.image_gc_low_threshold_percent,
                 bytes_to_free=to_free)
        freed = await self._free_space(to_free, free_time, images)
        if freed < to_free:
            message = (f"Insufficient free disk space on the node's image filesystem ({usage_percent}% of "
                       f"{format_size(capacity)} used). Failed to free sufficient space by deleting unused images "
                       f"(freed {freed} bytes). Investigate disk usage, as it could be used by active images, logs, "
                       "volumes, or other data.")
            self.node_event("Warning", "FreeDiskSpaceFailed", message)
            raise ImageGCError(message)

    async def delete_unused(self) -> int:
        """DeleteUnusedImages (eviction's node-level reclaim): bytes freed."""
        log.info("attempting to delete unused images")
        free_time = self.now()
        return await self._free_space(2**63 - 1, free_time, await self.candidates(free_time))

    async def _free_old(self, images: list[tuple[str, ImageRecord]], free_time: float) -> list[tuple[str, ImageRecord]]:
        max_age = self.config.image_maximum_gc_age
        if max_age == 0 or free_time - self.began <= max_age:
            return images
        left, errors = [], []
        for image, record in images:
            if free_time - record.last_used > max_age:
                try:
                    await self._remove(image, record, AGE)
                    continue
                except CriError as exc:
                    errors.append(str(exc))
            left.append((image, record))
        if errors:
            raise ImageGCError(f"wanted to free images older than {max_age:g}s, encountered errors in image "
                               f"deletion: {'; '.join(errors)}")
        return left

    async def _free_space(self, to_free: int, free_time: float, images: list[tuple[str, ImageRecord]]) -> int:
        freed, errors = 0, []
        for image, record in images:
            if record.last_used >= free_time:
                continue  # used at or after this run began
            if free_time - record.first_detected < self.config.image_minimum_gc_age:
                continue  # too young (imageMinimumGCAge)
            try:
                await self._remove(image, record, SPACE)
            except CriError as exc:
                errors.append(str(exc))
                continue
            freed += record.size
            if freed >= to_free:
                break
        if errors:
            raise ImageGCError(f"wanted to free {to_free} bytes, but freed {freed} bytes space with errors in "
                               f"image deletion: {'; '.join(errors)}")
        return freed

    async def _remove(self, image: str, record: ImageRecord, reason: str) -> None:
        log.info("removing image to free bytes", image=image, names=list(record.names), size=record.size,
                 reason=reason)
        try:
            await self.runtime.remove_image(image)
        except NotFound:
            pass
        self.records.pop(image, None)
        self.collected[reason] += 1
        self.removed_at[image] = self.now()

    async def _image_fs(self) -> tuple[int, int] | None:
        """(capacity, available) bytes of the runtime's image filesystem (CRI ImageFsInfo's
        mountpoint, measured with statfs as the kubelet's stats provider does)."""
        usages = await self.runtime.image_fs_info()
        for usage in usages:
            mount = usage.fs_id.mountpoint if usage.fs_id is not None else ""
            found = host.filesystem(Path(mount)) if mount else None
            if found is not None:
                return found.capacity_bytes, found.available_bytes
        return None

    def render_metrics(self) -> str:
        lines = ["# HELP kubelet_image_garbage_collected_total [ALPHA] Total number of images garbage collected "
                 "by the kubelet, whether through disk usage or image age.",
                 "# TYPE kubelet_image_garbage_collected_total counter"]
        for reason in (AGE, SPACE):
            lines.append(f'kubelet_image_garbage_collected_total{{reason="{reason}"}} {self.collected[reason]}')
        return "\n".join(lines) + "\n"


__all__ = ["ImageGC", "ImageGCError", "ImageRecord", "format_size"]
