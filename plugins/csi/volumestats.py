"""Volume usage of the CSI volumes pods have mounted (the kubelet's csi metrics provider):
NodeGetVolumeStats every ``volumeStatsAggPeriod`` (the agent's) for drivers with GET_VOLUME_STATS (the
kubelet's volumeStatsAggPeriod), kept as the stats collector's :class:`VolumeUsage` — under
the pod's volume name and with the PVC it comes from, so /stats/summary can show ``pvcRef``.
A driver without the capability has no figures, as with the kubelet ("metrics are not
supported"); a call that fails keeps the last figures and is logged once per error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import structlog

from nodeagent.stats.collector import Fs, VolumeUsage
from plugins.csi import api
from plugins.csi.layout import Layout
from plugins.csi.registration import Drivers
from plugins.csi.spec import VolumeSpec

log = structlog.get_logger("nodeagent.csi")


@dataclass(frozen=True)
class _Mounted:
    spec: VolumeSpec
    target: Path


class VolumeStats:
    def __init__(self, layout: Layout, drivers: Drivers) -> None:
        self.layout = layout
        self.drivers = drivers
        self._mounted: dict[str, dict[str, _Mounted]] = {}
        self._usage: dict[str, dict[str, VolumeUsage]] = {}
        self._errors: dict[tuple[str, str], str] = {}

    def published(self, uid: str, spec: VolumeSpec, target: Path) -> None:
        self._mounted.setdefault(uid, {})[spec.volume] = _Mounted(spec, target)

    def forget(self, uid: str) -> None:
        self._mounted.pop(uid, None)
        self._usage.pop(uid, None)

    def of_pod(self, uid: str) -> list[VolumeUsage]:
        return sorted(self._usage.get(uid, {}).values(), key=lambda u: u.name)

    async def run(self, period: float) -> None:
        while True:
            await self.collect()
            await anyio.sleep(period)

    async def collect(self) -> None:
        for uid, volumes in list(self._mounted.items()):
            for name, mounted in list(volumes.items()):
                usage = await self._one(mounted)
                if usage is not None and uid in self._mounted:
                    self._usage.setdefault(uid, {})[name] = usage

    async def _one(self, mounted: _Mounted) -> VolumeUsage | None:
        spec = mounted.spec
        driver = self.drivers.get(spec.driver)
        if driver is None:
            return None
        try:
            if not await driver.client.has(api.NodeCapability.GET_VOLUME_STATS):
                return None
            staging = ""
            if not spec.block and await driver.client.has(api.NodeCapability.STAGE_UNSTAGE_VOLUME) \
                    and spec.lifecycle == "Persistent":
                staging = str(self.layout.staging_path(spec.driver, spec.handle))
            figures = await driver.client.volume_stats(spec.handle, str(mounted.target), staging)
        except api.CsiCallError as exc:
            key = (spec.driver, spec.handle)
            if self._errors.get(key) != str(exc):
                self._errors[key] = str(exc)
                log.warning("NodeGetVolumeStats failed", driver=spec.driver, volume=spec.spec_name, error=str(exc))
            return None
        return to_usage(spec, figures, time.time())


def to_usage(spec: VolumeSpec, figures: list[api.Usage], now: float) -> VolumeUsage:
    by_unit = {f.unit: f for f in figures}
    size = by_unit.get("BYTES")
    inodes = by_unit.get("INODES")
    fs = Fs(time=now, used_bytes=size.used if size else None, capacity_bytes=size.total if size else None,
            available_bytes=size.available if size else None, inodes=inodes.total if inodes else None,
            inodes_free=inodes.available if inodes else None, inodes_used=inodes.used if inodes else None)
    return VolumeUsage(name=spec.volume, fs=fs, pvc=spec.pvc)


__all__ = ["VolumeStats", "to_usage"]
