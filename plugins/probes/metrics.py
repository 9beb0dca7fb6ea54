"""The prober's series on the kubelet port's /metrics/probes (pkg/kubelet/prober):

* ``prober_probe_total{probe_type, result, container, pod, namespace, pod_uid}`` (counter, BETA):
  every probe run, ``result`` one of successful, failed, unknown (a probe that could not run);
* ``prober_probe_duration_seconds{probe_type, container, pod, namespace}`` (histogram, ALPHA):
  how long a run took, for successful and unknown runs only, as the kubelet observes it.

A pod's series go when its probe workers stop (the kubelet deletes them with the worker).
"""

from __future__ import annotations

from collections import defaultdict

from nodeagent.metrics import DEFAULT_BUCKETS, Histogram

SUCCESSFUL, FAILED, UNKNOWN = "successful", "failed", "unknown"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class ProbeMetrics:
    def __init__(self) -> None:
        self.totals: dict[tuple[str, str, str, str, str, str], int] = defaultdict(int)
        self.duration = Histogram("prober_probe_duration_seconds", "[ALPHA] Duration in seconds for a probe response.",
                                  ("probe_type", "container", "pod", "namespace"), buckets=DEFAULT_BUCKETS)

    def observe(self, probe_type: str, result: str, container: str, pod: str, namespace: str, uid: str,
                seconds: float) -> None:
        self.totals[(probe_type, result, container, pod, namespace, uid)] += 1
        if result != FAILED:
            self.duration.observe(seconds, probe_type, container, pod, namespace)

    def forget(self, pod: str, namespace: str, uid: str) -> None:
        for total in [k for k in self.totals if k[3:] == (pod, namespace, uid)]:
            del self.totals[total]
        for series in [k for k in self.duration._series if k[2:] == (pod, namespace)]:
            self.duration.forget(*series)

    def render(self) -> str:
        lines = ["# HELP prober_probe_total [BETA] Cumulative number of a liveness, readiness or startup probe "
                 "for a container by result.", "# TYPE prober_probe_total counter"]
        for (kind, result, container, pod, namespace, uid), count in sorted(self.totals.items()):
            lines.append(f'prober_probe_total{{container="{_escape(container)}",namespace="{_escape(namespace)}",'
                         f'pod="{_escape(pod)}",pod_uid="{uid}",probe_type="{kind}",result="{result}"}} {count}')
        lines += self.duration.render()
        return "\n".join(lines) + "\n"


__all__ = ["FAILED", "ProbeMetrics", "SUCCESSFUL", "UNKNOWN"]
