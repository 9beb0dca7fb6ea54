"""The probes stage: startup, liveness and readiness probes, the kubelet's way (pkg/kubelet/prober).

While the pod runs, one loop per (container, probe type) probes the container's current
instance every ``periodSeconds``: exec through CRI ExecSync, httpGet, tcpSocket or the gRPC
health service against the pod IP (the node's for hostNetwork pods).

* A new instance starts not ready (readiness Failure), alive (liveness Success) and not started
  (startup Unknown). Until the startup probe succeeds, liveness and readiness do not run.
* A result is applied after ``failureThreshold`` consecutive failures or ``successThreshold``
  consecutive successes; probes that cannot run at all (no pod IP yet) do not count.
* Readiness and startup results go to the status writer (container ``ready`` / ``started``,
  the Ready and ContainersReady conditions). A liveness or startup failure stops the instance
  with the probe's terminationGracePeriodSeconds (else the pod's, at least 2 s); the runtime
  stage restarts it per restartPolicy, and this instance is not probed again.

Facts: ``ProbeFailed``, ``ProbeWarned``, ``ProbeResultChanged``, ``UnhealthyContainerKilled``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from nodeagent.podfacts import STARTUP_PASSED
from nodeagent.stages import AgentHandle, Observe, PodContext
from plugins.probes.events import (
    ProbeFailed,
    ProbeResultChanged,
    ProbeWarned,
    UnhealthyContainerKilled,
)
from plugins.probes.metrics import ProbeMetrics
from plugins.probes.worker import PodProbes


class ProbesStage(Observe):
    name: ClassVar[str] = "probes"
    provides = (STARTUP_PASSED,)
    # Readiness keeps being probed while a pod terminates (endpoints must see it go unready);
    # liveness and startup probes stop, so that no probe kills a container that is stopping.
    through_termination: ClassVar[bool] = True

    def __init__(self) -> None:
        self.metrics = ProbeMetrics()

    async def observe(self, ctx: PodContext) -> None:
        probes = PodProbes(ctx, self.metrics)
        if not probes.containers:
            return  # nothing to probe in this pod
        try:
            await probes.run()
        finally:
            # The kubelet deletes a pod's prober series with its workers.
            self.metrics.forget(ctx.ref.name, ctx.ref.namespace, ctx.ref.uid)

    def render_probe_metrics(self) -> str:
        """/metrics/probes on the kubelet port (plugins/probes/metrics.py)."""
        return self.metrics.render()


def plugin(config: Mapping[str, Any], handle: AgentHandle) -> ProbesStage:
    if config:
        raise TypeError(f"probes takes no configuration, got {sorted(config)}")
    return ProbesStage()


plugin.stage_class = ProbesStage  # type: ignore[attr-defined]
__all__ = ["ProbeFailed", "ProbeResultChanged", "ProbeWarned", "ProbesStage", "UnhealthyContainerKilled", "plugin"]
