"""Prometheus metrics in the text exposition format, counted from bus facts.

Names are the kubelet's where the meaning is the same (kubelet_running_pods,
kubelet_pod_start_duration_seconds, kubelet_pleg_relist_duration_seconds, ...); what only
nodeagent has is nodeagent_* (per-stage durations, bus queue depth; a stage's own series, such as
the gang stage's nodeagent_gang_*, come from its ``render_metrics``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from nodeagent.events import Event

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


@dataclass
class Histogram:
    name: str
    help: str
    labels: tuple[str, ...] = ()
    _series: dict[tuple[str, ...], list[float]] = field(default_factory=dict)

    def observe(self, value: float, *label_values: str) -> None:
        series = self._series.setdefault(label_values, [0.0] * (len(_BUCKETS) + 2))
        for i, bound in enumerate(_BUCKETS):
            if value <= bound:
                series[i] += 1
        series[-2] += value
        series[-1] += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for values, series in sorted(self._series.items()):
            base = ",".join(f'{k}="{v}"' for k, v in zip(self.labels, values))
            sep = "," if base else ""
            for i, bound in enumerate(_BUCKETS):
                lines.append(f'{self.name}_bucket{{{base}{sep}le="{bound}"}} {series[i]:g}')
            lines.append(f'{self.name}_bucket{{{base}{sep}le="+Inf"}} {series[-1]:g}')
            lines.append(f"{self.name}_sum{{{base}}} {series[-2]:g}" if base else f"{self.name}_sum {series[-2]:g}")
            lines.append(f"{self.name}_count{{{base}}} {series[-1]:g}" if base else f"{self.name}_count {series[-1]:g}")
        return lines


class Metrics:
    def __init__(self) -> None:
        self.pod_start = Histogram("kubelet_pod_start_duration_seconds",
                                   "Seconds from a pod being seen to its containers running.")
        self.relist = Histogram("kubelet_pleg_relist_duration_seconds", "Seconds to relist the runtime.")
        self.stage = Histogram("nodeagent_stage_duration_seconds", "Seconds a stage took for one phase.",
                               ("stage", "phase"))
        self.counters: dict[str, int] = defaultdict(int)
        self.gauges: dict[str, Callable[[], float | dict[str, float]]] = {}
        self.collectors: list[Callable[[], str]] = []
        """Series rendered by others in the text format (stages' ``render_metrics``, e.g. the gang
        stage's nodeagent_gang_*), appended as they are."""

    def count(self, event: Event) -> None:
        self.counters[getattr(event, "kind")] += 1

    def render(self) -> str:
        lines: list[str] = []
        for name, read in sorted(self.gauges.items()):
            value = read()
            lines.append(f"# TYPE {name} gauge")
            if isinstance(value, dict):
                for label, v in sorted(value.items()):
                    lines.append(f'{name}{{{label}}} {v:g}')
            else:
                lines.append(f"{name} {value:g}")
        lines.append("# HELP nodeagent_events_total Facts published on the bus, by kind.")
        lines.append("# TYPE nodeagent_events_total counter")
        for kind, count in sorted(self.counters.items()):
            lines.append(f'nodeagent_events_total{{kind="{kind}"}} {count}')
        for hist in (self.pod_start, self.relist, self.stage):
            lines.extend(hist.render())
        text = "\n".join(lines) + "\n"
        for collect in self.collectors:
            text += collect()
        return text
