"""The kubelet API's read endpoints about the node (pkg/kubelet/server/server.go and
server/stats), behind the server's authentication and authorization (``nodes/stats``,
``nodes/metrics``, ``nodes/configz``):

    GET|POST /stats/summary[?only_cpu_and_memory=true]   the Summary API (stats/v1alpha1)
    GET      /metrics                                      kubelet_* and nodeagent_* series
    GET      /metrics/resource                             what metrics-server reads
    GET      /metrics/cadvisor                             container_* and machine_* series
    GET      /metrics/probes                               prober_probe_total, prober_probe_duration_seconds
    GET      /configz                                      {"kubeletconfig": {...}}

Everything is read from the agent's latest usage sample and its metrics; nothing here calls the
runtime, so a scrape costs the same however often it comes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from anyio.abc import ByteStream

from nodeagent.kubeletserver.wire import Request, respond
from nodeagent.stats import Usage, resource_metrics, summary
from nodeagent.stats.cadvisor import cadvisor_metrics

TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format, as the kubelet's handlers answer."""

PATHS: Mapping[str, tuple[str, ...]] = {
    "/stats/summary": ("GET", "POST"),
    "/metrics": ("GET",),
    "/metrics/resource": ("GET",),
    "/metrics/cadvisor": ("GET",),
    "/metrics/probes": ("GET",),
    "/configz": ("GET",),
}


@dataclass(frozen=True)
class NodeReads:
    """What the endpoints read, given by the composition root."""

    node_name: str
    usage: Callable[[], Usage | None]
    """The latest usage sample (None before the first)."""
    metrics: Callable[[], str]
    """The agent's /metrics text (the same as on the local endpoint)."""
    probe_metrics: Callable[[], str]
    configz: Callable[[], Mapping[str, Any]]
    """The effective configuration, KubeletConfiguration field names."""


async def serve(client: ByteStream, request: Request, reads: NodeReads) -> None:
    path = request.path.rstrip("/") or "/"
    if path == "/stats/summary":
        await _summary(client, request, reads)
    elif path == "/metrics":
        await respond(client, 200, reads.metrics(), TEXT_FORMAT)
    elif path == "/metrics/resource":
        await respond(client, 200, resource_metrics(reads.usage()), TEXT_FORMAT)
    elif path == "/metrics/cadvisor":
        await respond(client, 200, cadvisor_metrics(reads.usage()), TEXT_FORMAT)
    elif path == "/metrics/probes":
        await respond(client, 200, reads.probe_metrics(), TEXT_FORMAT)
    elif path == "/configz":
        await respond(client, 200, json.dumps({"kubeletconfig": reads.configz()}), "application/json")
    else:
        await respond(client, 404, "404 page not found\n")


async def _summary(client: ByteStream, request: Request, reads: NodeReads) -> None:
    # The kubelet's: only_cpu_and_memory counts only when given once and exactly "true".
    values = request.query.get("only_cpu_and_memory", [])
    small = values == ["true"]
    usage = reads.usage()
    if usage is None:
        await respond(client, 500, "Internal Error: failed to get node info: no usage sample yet")
        return
    body = json.dumps(summary(usage, reads.node_name, only_cpu_and_memory=small))
    await respond(client, 200, body, "application/json")


__all__ = ["PATHS", "NodeReads", "serve"]
