"""The kubelet's Summary API (``/stats/summary``, stats/v1alpha1) and resource metrics
(``/metrics/resource``, what metrics-server scrapes), built from a :class:`Usage` sample.

Shapes and names are the kubelet's (k8s.io/kubelet/pkg/apis/stats/v1alpha1): timestamps are
RFC 3339, every figure is optional and left out when unknown (never a zero that was not
measured); ``only_cpu_and_memory`` keeps the node's and pods' CPU and memory only.
"""

from __future__ import annotations

import time
from typing import Any

from nodeagent.stats.collector import ContainerUsage, Cpu, Fs, Memory, Network, PodUsage, Usage


def _stamp(seconds: float) -> str:
    fraction = f"{seconds % 1:.6f}"[1:] if seconds % 1 else ""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + fraction + "Z"


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        out[key] = value


def cpu(c: Cpu | None) -> dict[str, Any] | None:
    if c is None:
        return None
    out: dict[str, Any] = {"time": _stamp(c.time)}
    _put(out, "usageNanoCores", c.usage_nano_cores)
    _put(out, "usageCoreNanoSeconds", c.usage_core_nano_seconds)
    return out


def memory(m: Memory | None) -> dict[str, Any] | None:
    if m is None:
        return None
    out: dict[str, Any] = {"time": _stamp(m.time)}
    for key, value in (("availableBytes", m.available_bytes), ("usageBytes", m.usage_bytes),
                       ("workingSetBytes", m.working_set_bytes), ("rssBytes", m.rss_bytes),
                       ("pageFaults", m.page_faults), ("majorPageFaults", m.major_page_faults)):
        _put(out, key, value)
    return out


def fs(f: Fs | None) -> dict[str, Any] | None:
    if f is None:
        return None
    out: dict[str, Any] = {"time": _stamp(f.time)}
    for key, value in (("availableBytes", f.available_bytes), ("capacityBytes", f.capacity_bytes),
                       ("usedBytes", f.used_bytes), ("inodesFree", f.inodes_free), ("inodes", f.inodes),
                       ("inodesUsed", f.inodes_used)):
        _put(out, key, value)
    return out


def network(n: Network | None) -> dict[str, Any] | None:
    if n is None:
        return None

    def interface(i: Any) -> dict[str, Any]:
        return {"name": i.name, "rxBytes": i.rx_bytes, "rxErrors": i.rx_errors, "txBytes": i.tx_bytes,
                "txErrors": i.tx_errors}

    out: dict[str, Any] = {"time": _stamp(n.time)}
    if n.default is not None:
        out.update(interface(n.default))  # the default interface's figures are inlined
    out["interfaces"] = [interface(i) for i in n.interfaces]
    return out


def _container(c: ContainerUsage, only_cpu_and_memory: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": c.name, "startTime": _stamp(c.start_time)}
    _put(out, "cpu", cpu(c.cpu))
    _put(out, "memory", memory(c.memory))
    if not only_cpu_and_memory:
        _put(out, "rootfs", fs(c.rootfs))
        _put(out, "logs", fs(c.logs))
    return out


def _pod(p: PodUsage, only_cpu_and_memory: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
        "startTime": _stamp(p.start_time),
        "containers": [_container(c, only_cpu_and_memory) for c in p.containers],
    }
    _put(out, "cpu", cpu(p.cpu))
    _put(out, "memory", memory(p.memory))
    if only_cpu_and_memory:
        return out
    _put(out, "network", network(p.network))
    if p.volumes:
        volumes = []
        for v in p.volumes:
            entry = {**(fs(v.fs) or {}), "name": v.name}
            if v.pvc is not None:
                entry["pvcRef"] = {"namespace": v.pvc[0], "name": v.pvc[1]}
            volumes.append(entry)
        out["volume"] = volumes
    _put(out, "ephemeral-storage", fs(p.ephemeral_storage))
    if p.process_count is not None:
        out["process_stats"] = {"process_count": p.process_count}
    return out


def summary(usage: Usage, node_name: str, *, only_cpu_and_memory: bool = False) -> dict[str, Any]:
    node = usage.node
    out: dict[str, Any] = {"nodeName": node_name}
    if node.start_time is not None:
        out["startTime"] = _stamp(node.start_time)
    _put(out, "cpu", cpu(node.cpu))
    _put(out, "memory", memory(node.memory))
    if not only_cpu_and_memory:
        _put(out, "network", network(node.network))
        _put(out, "fs", fs(node.fs))
        runtime: dict[str, Any] = {}
        _put(runtime, "imageFs", fs(node.image_fs))
        _put(runtime, "containerFs", fs(node.container_fs))
        out["runtime"] = runtime
        rlimit: dict[str, Any] = {"time": _stamp(node.time), "curproc": node.processes}
        _put(rlimit, "maxpid", node.max_pid)
        out["rlimit"] = rlimit
    return {"node": out, "pods": [_pod(p, only_cpu_and_memory) for p in usage.pods]}


# --- /metrics/resource --------------------------------------------------------------------


_RESOURCE_HELP = (
    ("node_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the node in core-seconds"),
    ("node_memory_working_set_bytes", "gauge", "Current working set of the node in bytes"),
    ("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the container in core-seconds"),
    ("container_memory_working_set_bytes", "gauge", "Current working set of the container in bytes"),
    ("container_start_time_seconds", "gauge", "Start time of the container since unix epoch in seconds"),
    ("pod_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the pod in core-seconds"),
    ("pod_memory_working_set_bytes", "gauge", "Current working set of the pod in bytes"),
    ("resource_scrape_error", "gauge", "1 if there was an error while getting container metrics, 0 otherwise"),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def resource_metrics(usage: Usage | None) -> str:
    """The kubelet's /metrics/resource: one sample per series, stamped with its stats time (ms),
    a series without a measured value left out; on no sample only the scrape-error gauge."""
    series: dict[str, list[str]] = {name: [] for name, _, _ in _RESOURCE_HELP}

    def add(name: str, labels: str, value: float | None, at: float | None) -> None:
        if value is None:
            return
        stamp = f" {int(at * 1000)}" if at is not None else ""
        series[name].append(f"{name}{{{labels}}} {value:.17g}{stamp}" if labels else f"{name} {value:.17g}{stamp}")

    if usage is None:
        add("resource_scrape_error", "", 1, None)
    else:
        add("resource_scrape_error", "", 0, None)
        node = usage.node
        if node.cpu is not None and node.cpu.usage_core_nano_seconds is not None:
            add("node_cpu_usage_seconds_total", "", node.cpu.usage_core_nano_seconds / 1e9, node.cpu.time)
        if node.memory is not None:
            add("node_memory_working_set_bytes", "", node.memory.working_set_bytes, node.memory.time)
        for pod in usage.pods:
            pod_labels = f'namespace="{_label(pod.namespace)}",pod="{_label(pod.name)}"'
            for c in pod.containers:
                labels = f'container="{_label(c.name)}",{pod_labels}'
                if c.cpu is not None and c.cpu.usage_core_nano_seconds is not None:
                    add("container_cpu_usage_seconds_total", labels, c.cpu.usage_core_nano_seconds / 1e9, c.cpu.time)
                if c.memory is not None:
                    add("container_memory_working_set_bytes", labels, c.memory.working_set_bytes, c.memory.time)
                if c.start_time > 0:
                    add("container_start_time_seconds", labels, c.start_time, c.start_time)
            if pod.cpu is not None and pod.cpu.usage_core_nano_seconds is not None:
                add("pod_cpu_usage_seconds_total", pod_labels, pod.cpu.usage_core_nano_seconds / 1e9, pod.cpu.time)
            if pod.memory is not None:
                add("pod_memory_working_set_bytes", pod_labels, pod.memory.working_set_bytes, pod.memory.time)
    lines: list[str] = []
    for name, kind, text in _RESOURCE_HELP:
        if series[name]:
            lines += [f"# HELP {name} [STABLE] {text}", f"# TYPE {name} {kind}", *series[name]]
    return "\n".join(lines) + "\n"


_VOLUME_SERIES = (
    ("kubelet_volume_stats_capacity_bytes", "Capacity in bytes of the volume", "capacity_bytes"),
    ("kubelet_volume_stats_available_bytes", "Number of available bytes in the volume", "available_bytes"),
    ("kubelet_volume_stats_used_bytes", "Number of used bytes in the volume", "used_bytes"),
    ("kubelet_volume_stats_inodes", "Maximum number of inodes in the volume", "inodes"),
    ("kubelet_volume_stats_inodes_free", "Number of free inodes in the volume", "inodes_free"),
    ("kubelet_volume_stats_inodes_used", "Number of used inodes in the volume", "inodes_used"),
)


def volume_stats_metrics(usage: Usage | None) -> str:
    """kubelet_volume_stats_*: one series per persistent volume claim mounted by a pod
    (namespace, persistentvolumeclaim), as the kubelet's volume stats collector; other volumes
    (emptyDir, configMap, ...) are in the Summary API only."""
    lines: list[str] = []
    claims: dict[tuple[str, str], Any] = {}
    for pod in usage.pods if usage is not None else ():
        for volume in pod.volumes:
            if volume.pvc is not None:
                claims.setdefault(volume.pvc, volume.fs)
    for name, text, attr in _VOLUME_SERIES:
        lines += [f"# HELP {name} [ALPHA] {text}", f"# TYPE {name} gauge"]
        for (namespace, claim), fs_ in sorted(claims.items()):
            value = getattr(fs_, attr)
            if value is not None:
                lines.append(f'{name}{{namespace="{_label(namespace)}",persistentvolumeclaim="{_label(claim)}"}} '
                             f"{value}")
    return "\n".join(lines) + "\n"


__all__ = ["resource_metrics", "summary", "volume_stats_metrics"]
