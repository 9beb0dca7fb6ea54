"""``/metrics/cadvisor``: the ``container_*`` and ``machine_*`` series dashboards and alerts read
(kube-prometheus, the Kubernetes mixin), as cAdvisor names them, built from a usage sample.

Labels are the kubelet's: ``container``, ``pod``, ``namespace``, ``image``, ``name`` (the runtime's
container ID), ``id`` (a cgroup-like path). Three kinds of series, as cAdvisor has them:

* the node itself: ``id="/"``, every other label empty;
* each pod: ``container=""`` with the pod's labels (``id="/<pod cgroup>"``): CPU, memory, the
  pod's network interfaces and processes;
* each running container: all labels (``id="/<pod cgroup>/<container id>"``): CPU (``cpu="total"``),
  memory, its writable layer (``container_fs_usage_bytes``), start time.

Samples carry their stats timestamp (from CRI stats, not from walking cgroups). ``id`` names the
pod cgroup and the container rather than a full cgroup path (which depends on ``cgroupRoot``,
plugins/runtime/podcgroup.py); no dashboard query we know of matches on it.
"""

from __future__ import annotations

import os
import time

from nodeagent import hostpaths
from nodeagent.stats import host
from nodeagent.stats.collector import (
    ContainerUsage,
    Cpu,
    Memory,
    Network,
    PodUsage,
    Usage,
)

_SERIES = (
    ("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed in seconds."),
    ("container_memory_working_set_bytes", "gauge", "Current working set in bytes."),
    ("container_memory_usage_bytes", "gauge",
     "Current memory usage in bytes, including all memory regardless of when it was accessed"),
    ("container_memory_rss", "gauge", "Size of RSS in bytes."),
    ("container_memory_failures_total", "counter", "Cumulative count of memory allocation failures."),
    ("container_fs_usage_bytes", "gauge", "Number of bytes that are consumed by the container on this filesystem."),
    ("container_fs_inodes_total", "gauge", "Number of Inodes"),
    ("container_network_receive_bytes_total", "counter", "Cumulative count of bytes received"),
    ("container_network_receive_errors_total", "counter", "Cumulative count of errors encountered while receiving"),
    ("container_network_transmit_bytes_total", "counter", "Cumulative count of bytes transmitted"),
    ("container_network_transmit_errors_total", "counter",
     "Cumulative count of errors encountered while transmitting"),
    ("container_processes", "gauge", "Number of processes running inside the container."),
    ("container_start_time_seconds", "gauge", "Start time of the container since unix epoch in seconds."),
    ("container_last_seen", "gauge", "Last time a container was seen by the exporter"),
    ("container_scrape_error", "gauge", "1 if there was an error while getting container metrics, 0 otherwise"),
    ("machine_cpu_cores", "gauge", "Number of logical CPU cores."),
    ("machine_memory_bytes", "gauge", "Amount of memory installed on the machine."),
)
_LABELS = ("container", "id", "image", "name", "namespace", "pod")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Out:
    def __init__(self) -> None:
        self.series: dict[str, list[str]] = {name: [] for name, _, _ in _SERIES}

    def add(self, name: str, labels: dict[str, str], value: float | None, at: float | None = None,
            **extra: str) -> None:
        if value is None:
            return
        pairs = {**labels, **extra}
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(pairs.items()))
        stamp = f" {int(at * 1000)}" if at is not None else ""
        head = f"{name}{{{text}}}" if text else name
        self.series[name].append(f"{head} {float(value):.17g}{stamp}")

    def render(self) -> str:
        lines: list[str] = []
        for name, kind, text in _SERIES:
            if self.series[name]:
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *self.series[name]]
        return "\n".join(lines) + "\n"


def _cpu_memory(out: _Out, labels: dict[str, str], cpu: Cpu | None, memory: Memory | None) -> None:
    if cpu is not None and cpu.usage_core_nano_seconds is not None:
        out.add("container_cpu_usage_seconds_total", labels, cpu.usage_core_nano_seconds / 1e9, cpu.time, cpu="total")
    if memory is not None:
        out.add("container_memory_working_set_bytes", labels, memory.working_set_bytes, memory.time)
        out.add("container_memory_usage_bytes", labels, memory.usage_bytes, memory.time)
        out.add("container_memory_rss", labels, memory.rss_bytes, memory.time)
        if memory.page_faults is not None:
            out.add("container_memory_failures_total", labels, memory.page_faults, memory.time,
                    failure_type="pgfault", scope="container")
        if memory.major_page_faults is not None:
            out.add("container_memory_failures_total", labels, memory.major_page_faults, memory.time,
                    failure_type="pgmajfault", scope="container")


def _network(out: _Out, labels: dict[str, str], network: Network | None) -> None:
    if network is None:
        return
    for i in network.interfaces or ((network.default,) if network.default else ()):
        out.add("container_network_receive_bytes_total", labels, i.rx_bytes, network.time, interface=i.name)
        out.add("container_network_receive_errors_total", labels, i.rx_errors, network.time, interface=i.name)
        out.add("container_network_transmit_bytes_total", labels, i.tx_bytes, network.time, interface=i.name)
        out.add("container_network_transmit_errors_total", labels, i.tx_errors, network.time, interface=i.name)


def _pod_id(pod: PodUsage) -> str:
    try:
        return "/" + hostpaths.pod_cgroup_name(pod.uid)
    except ValueError:
        return "/pod"


def _container(out: _Out, pod: PodUsage, c: ContainerUsage, now: float) -> None:
    labels = {"container": c.name, "id": f"{_pod_id(pod)}/{c.id}", "image": c.image, "name": c.id,
              "namespace": pod.namespace, "pod": pod.name}
    _cpu_memory(out, labels, c.cpu, c.memory)
    if c.rootfs is not None:
        out.add("container_fs_usage_bytes", labels, c.rootfs.used_bytes, c.rootfs.time, device="rootfs")
    if c.start_time > 0:
        out.add("container_start_time_seconds", labels, c.start_time)
    out.add("container_last_seen", labels, int(now), now)


def cadvisor_metrics(usage: Usage | None) -> str:
    out = _Out()
    now = time.time()
    out.add("machine_cpu_cores", {}, os.cpu_count() or 1)
    total = host.meminfo().get("MemTotal")
    out.add("machine_memory_bytes", {}, total)
    if usage is None:
        out.add("container_scrape_error", {}, 1)
        return out.render()
    out.add("container_scrape_error", {}, 0)
    node = usage.node
    root = {name: "" for name in _LABELS} | {"id": "/"}
    _cpu_memory(out, root, node.cpu, node.memory)
    _network(out, root, node.network)
    if node.fs is not None:
        out.add("container_fs_usage_bytes", root, node.fs.used_bytes, node.fs.time, device="nodefs")
        out.add("container_fs_inodes_total", root, node.fs.inodes, node.fs.time, device="nodefs")
    out.add("container_processes", root, node.processes, node.time)
    out.add("container_last_seen", root, int(now), now)
    for pod in usage.pods:
        labels = {"container": "", "id": _pod_id(pod), "image": "", "name": "", "namespace": pod.namespace,
                  "pod": pod.name}
        _cpu_memory(out, labels, pod.cpu, pod.memory)
        _network(out, labels, pod.network)
        out.add("container_processes", labels, pod.process_count)
        out.add("container_start_time_seconds", labels, pod.start_time if pod.start_time > 0 else None)
        out.add("container_last_seen", labels, int(now), now)
        for c in pod.containers:
            _container(out, pod, c, now)
    return out.render()


__all__ = ["cadvisor_metrics"]
