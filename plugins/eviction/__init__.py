"""The eviction stage: node-pressure eviction as the kubelet does it (pkg/kubelet/eviction).

A node-level task (:mod:`plugins.eviction.manager`) watches the usage samples every
``evictionMonitoringPeriod`` against ``evictionHard`` / ``evictionSoft`` thresholds for
memory.available, nodefs.*, imagefs.*, containerfs.* and pid.available; reports the
MemoryPressure / DiskPressure / PIDPressure Node conditions (kept for
``evictionPressureTransitionPeriod``; the node lifecycle controller turns them into
``node.kubernetes.io/*-pressure`` taints); reclaims at node level first (dead containers and
unused images, through whatever stage offers them: plugins/gc) and then evicts the first pod
of the kubelet's ranking, through its worker (phase Failed, reason Evicted, the kubelet's
message, condition DisruptionTarget, a Warning Evicted Event). Pods over an emptyDir
``sizeLimit`` or their ``ephemeral-storage`` limits are evicted whatever the thresholds.

The admit half is the kubelet's eviction admit handler: under MemoryPressure alone a
BestEffort pod is refused unless it tolerates the memory-pressure taint; under any other
pressure every pod is; critical pods always pass. Reason ``Evicted``, message
``The node had condition: [<conditions>]. ``.

Static and mirror pods are critical, as in the kubelet: never evicted and always admitted.
Standalone every pod is static, so there the stage reports pressure (conditions, metrics) and
reclaims at node level, and evicts nothing: the kubelet's rule, kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import anyio
import anyio.abc

from nodeagent import duration
from nodeagent.model import Pod
from nodeagent.stages import Admit, AgentHandle, NodeTask, NodeView, Result
from plugins.eviction.config import EvictionConfig
from plugins.eviction.events import PodEvicted
from plugins.eviction.manager import REASON, EvictionManager


class EvictionStage(Admit, NodeTask):
    name: ClassVar[str] = "eviction"

    def __init__(self, config: EvictionConfig, handle: AgentHandle) -> None:
        self.config = config
        self.manager = EvictionManager(config, handle)

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        admitted, message = self.manager.admit(pod)
        return Result.ok() if admitted else Result.reject(REASON, message)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self.manager.run(task_status=task_status)

    def render_metrics(self) -> str:
        return self.manager.render_metrics()

    def kubelet_config(self) -> dict[str, Any]:
        """Its KubeletConfiguration fields (effective values), for /configz."""
        c = self.config
        return {"evictionHard": c.hard(), "evictionSoft": dict(c.eviction_soft),
                "evictionSoftGracePeriod": dict(c.eviction_soft_grace_period),
                "evictionMaxPodGracePeriod": c.eviction_max_pod_grace_period,
                "evictionMinimumReclaim": dict(c.eviction_minimum_reclaim),
                "evictionPressureTransitionPeriod": duration.format(c.eviction_pressure_transition_period),
                "mergeDefaultEvictionSettings": c.merge_default_eviction_settings,
                "localStorageCapacityIsolation": c.local_storage_capacity_isolation}

    def describe(self) -> dict[str, Any]:
        return {"conditions": list(self.manager.node_conditions),
                "thresholds": [t.signal for t in self.manager.thresholds],
                "evictions": dict(self.manager.evictions)}


def plugin(config: Mapping[str, Any], handle: AgentHandle) -> EvictionStage:
    return EvictionStage(EvictionConfig.model_validate(dict(config)), handle)


plugin.stage_class = EvictionStage  # type: ignore[attr-defined]
__all__ = ["EvictionConfig", "EvictionStage", "PodEvicted", "plugin"]
