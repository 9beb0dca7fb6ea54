"""Prometheus metrics in the text exposition format, counted from bus facts.

Names are the kubelet's where the meaning is the same (kubelet_running_pods,
kubelet_pod_start_duration_seconds, kubelet_pleg_relist_duration_seconds, ...); what only
nodeagent has is nodeagent_* (per-stage durations, bus queue depth; a stage's own series, such as
the gang stage's nodeagent_gang_*, come from its ``render_metrics``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from nodeagent.events import Event

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Prometheus' (and component-base's) DefBuckets."""
RUNTIME_BUCKETS = tuple(round(0.005 * 2.5**n, 10) for n in range(14))
"""kubelet_runtime_operations_duration_seconds: exponential 0.005 x 2.5^n, 14 buckets."""
POD_START_BUCKETS = (0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200,
                     1800, 2700, 3600)
"""kubelet_pod_start_duration_seconds' buckets."""

# CRI method -> the kubelet's operation_type (pkg/kubelet/kuberuntime/instrumented_services.go).
RUNTIME_OPERATIONS = {
    "Version": "version", "Status": "status", "RuntimeConfig": "runtime_config",
    "UpdateRuntimeConfig": "update_runtime_config", "RunPodSandbox": "run_podsandbox",
    "StopPodSandbox": "stop_podsandbox", "RemovePodSandbox": "remove_podsandbox",
    "PodSandboxStatus": "podsandbox_status", "ListPodSandbox": "list_podsandbox",
    "CreateContainer": "create_container", "StartContainer": "start_container", "StopContainer": "stop_container",
    "RemoveContainer": "remove_container", "ListContainers": "list_containers", "ContainerStatus": "container_status",
    "UpdateContainerResources": "update_container", "ReopenContainerLog": "reopen_container_log",
    "UpdatePodSandboxResources": "update_podsandbox_resources",
    "ExecSync": "exec_sync", "Exec": "exec", "Attach": "attach", "PortForward": "port_forward",
    "ContainerStats": "container_stats", "ListContainerStats": "list_container_stats",
    "PodSandboxStats": "podsandbox_stats", "ListPodSandboxStats": "list_podsandbox_stats",
    "ListImages": "list_images", "ImageStatus": "image_status", "PullImage": "pull_image",
    "RemoveImage": "remove_image", "ImageFsInfo": "image_fs_info", "GetContainerEvents": "get_container_events",
}


@dataclass
class Histogram:
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = _BUCKETS
    _series: dict[tuple[str, ...], list[float]] = field(default_factory=dict)

    def observe(self, value: float, *label_values: str) -> None:
        series = self._series.setdefault(label_values, [0.0] * (len(self.buckets) + 2))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                series[i] += 1
        series[-2] += value
        series[-1] += 1

    def forget(self, *label_values: str) -> None:
        self._series.pop(label_values, None)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for values, series in sorted(self._series.items()):
            base = ",".join(f'{k}="{v}"' for k, v in zip(self.labels, values, strict=True))
            sep = "," if base else ""
            for i, bound in enumerate(self.buckets):
                lines.append(f'{self.name}_bucket{{{base}{sep}le="{bound}"}} {series[i]:g}')
            lines.append(f'{self.name}_bucket{{{base}{sep}le="+Inf"}} {series[-1]:g}')
            lines.append(f"{self.name}_sum{{{base}}} {series[-2]:g}" if base else f"{self.name}_sum {series[-2]:g}")
            lines.append(f"{self.name}_count{{{base}}} {series[-1]:g}" if base else f"{self.name}_count {series[-1]:g}")
        return lines


class Metrics:
    def __init__(self) -> None:
        self.pod_start = Histogram("kubelet_pod_start_duration_seconds",
                                   "Seconds from a pod being seen to its containers running.",
                                   buckets=POD_START_BUCKETS)
        self.relist = Histogram("kubelet_pleg_relist_duration_seconds", "Seconds to relist the runtime.",
                                buckets=DEFAULT_BUCKETS)
        self.relist_interval = Histogram("kubelet_pleg_relist_interval_seconds",
                                         "Interval in seconds between relisting in PLEG.", buckets=DEFAULT_BUCKETS)
        self.stage = Histogram("nodeagent_stage_duration_seconds", "Seconds a stage took for one phase.",
                               ("stage", "phase"))
        self.runtime_duration = Histogram("kubelet_runtime_operations_duration_seconds",
                                          "Duration in seconds of runtime operations. Broken down by operation type.",
                                          ("operation_type",), buckets=RUNTIME_BUCKETS)
        self.worker_duration = Histogram("kubelet_pod_worker_duration_seconds",
                                         "Duration in seconds to sync a single pod. Broken down by operation type: "
                                         "create, update, sync, kill, terminated.", ("operation_type",),
                                         buckets=DEFAULT_BUCKETS)
        self.api_requests: dict[tuple[str, str, str], int] = defaultdict(int)
        """(code, host, method) -> count: the kubelet's rest_client_requests_total (client-go's)."""
        self.runtime_operations: dict[str, int] = defaultdict(int)
        self.runtime_errors: dict[str, int] = defaultdict(int)
        self._last_relist: float | None = None
        self.last_relist_wall = 0.0
        self._admitted: dict[str, float] = {}
        self._terminating: dict[str, float] = {}
        self.counters: dict[str, int] = defaultdict(int)
        self.gauges: dict[str, Callable[[], float | dict[str, float]]] = {}
        self.collectors: list[Callable[[], str]] = []
        """Series rendered by others in the text format (stages' ``render_metrics``, e.g. the gang
        stage's nodeagent_gang_*), appended as they are."""

    def count(self, event: Event) -> None:
        kind: str = getattr(event, "kind")  # noqa: B009 - each subclass declares kind, the base does not
        self.counters[kind] += 1
        # kubelet_pod_worker_duration_seconds from the facts: "create" from admission to the
        # containers started, "kill" from the stop to the end of teardown.
        uid = event.pod.uid
        if kind == "PodAdmitted":
            self._admitted[uid] = event.at
        elif kind == "PodStarted" and uid in self._admitted:
            self.worker_duration.observe(max(event.at - self._admitted.pop(uid), 0.0), "create")
        elif kind == "PodTerminating":
            self._terminating[uid] = event.at
        elif kind == "PodTerminated" and uid in self._terminating:
            self.worker_duration.observe(max(event.at - self._terminating.pop(uid), 0.0), "kill")
        elif kind == "PodForgotten":
            self._admitted.pop(uid, None)
            self._terminating.pop(uid, None)

    def relisted(self, seconds: float) -> None:
        """One relist (the relister's ``on_relist``): its duration, the interval since the last."""
        now = time.monotonic()
        self.relist.observe(seconds)
        if self._last_relist is not None:
            self.relist_interval.observe(now - self._last_relist)
        self._last_relist = now
        self.last_relist_wall = time.time()

    def runtime_operation(self, method: str, seconds: float, error: bool) -> None:
        """One CRI call (the runtime client's ``observer``)."""
        operation = RUNTIME_OPERATIONS.get(method, method.lower())
        self.runtime_operations[operation] += 1
        if error:
            self.runtime_errors[operation] += 1
        self.runtime_duration.observe(seconds, operation)

    def api_request(self, method: str, host: str, code: int) -> None:
        """One request the API server answered (the API client's ``observer``)."""
        self.api_requests[(str(code), host, method)] += 1

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
        for hist in (self.pod_start, self.relist, self.relist_interval, self.stage, self.runtime_duration,
                     self.worker_duration):
            lines.extend(hist.render())
        lines.append("# HELP kubelet_pleg_last_seen_seconds Timestamp in seconds when PLEG was last seen active.")
        lines.append("# TYPE kubelet_pleg_last_seen_seconds gauge")
        lines.append(f"kubelet_pleg_last_seen_seconds {self.last_relist_wall:.3f}")
        for name, counts, text in (
                ("kubelet_runtime_operations_total", self.runtime_operations,
                 "Cumulative number of runtime operations by operation type."),
                ("kubelet_runtime_operations_errors_total", self.runtime_errors,
                 "Cumulative number of runtime operation errors by operation type.")):
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} counter")
            for operation, count in sorted(counts.items()):
                lines.append(f'{name}{{operation_type="{operation}"}} {count}')
        if self.api_requests:
            lines.append("# HELP rest_client_requests_total Number of HTTP requests, partitioned by status code, "
                         "method, and host.")
            lines.append("# TYPE rest_client_requests_total counter")
            for (code, host, method), count in sorted(self.api_requests.items()):
                lines.append(f'rest_client_requests_total{{code="{code}",host="{host}",method="{method}"}} {count}')
        text = "\n".join(lines) + "\n"
        for collect in self.collectors:
            text += collect()
        return text
