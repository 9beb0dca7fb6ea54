"""Cluster mode: nodeagent as a node of a Kubernetes cluster (``kubeconfig`` set).

What it adds to the agent, each in its own module:

* ``node``       — the Node object: registration, capacity, conditions, kept current;
* ``lease``      — the heartbeat Lease in kube-node-lease;
* ``source``     — the API pod source (pods bound to the node, as wanted-pod facts);
* ``statussink`` — the status writer's sink to the API (strategic merge patches, graceful deletion's end);
* ``mirror``     — mirror pods for static pods;
* ``kubeevents`` — the kubelet's Events from bus facts;

:class:`ClusterMode` builds them from the configuration and the agent's parts; the composition
root (nodeagent.agent) starts them and wires the source into the runtime replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cri import RuntimeClient
from nodeagent.bus import Bus
from nodeagent.clock import Clock
from nodeagent.cluster.kubeevents import KubeEvents
from nodeagent.cluster.lease import NodeLease
from nodeagent.cluster.mirror import MirrorPods
from nodeagent.cluster.node import NodeStatus
from nodeagent.cluster.ratelimit import TokenBucket
from nodeagent.cluster.source import ApiPodSource
from nodeagent.cluster.statussink import ApiStatusSink
from nodeagent.config import AgentConfig
from nodeagent.nodeconditions import NodeConditions
from nodeagent.pleg import Relister
from nodeagent.stages import NodeInfo
from nodeagent.supervisor import Supervisor
from nodeagent.volumesinuse import ReportedVolumes

EVENT_QPS = 50.0  # the kubelet's eventRecordQPS
EVENT_BURST = 100  # eventBurst


class ClusterMode:
    def __init__(self, api: Any, config: AgentConfig, node: NodeInfo, runtime: RuntimeClient,
                 relister: Relister, bus: Bus, clock: Clock, kubelet_port: Callable[[], int] | None = None,
                 volumes_in_use: Callable[[], list[str]] | None = None,
                 conditions: NodeConditions | None = None,
                 reported_volumes: ReportedVolumes | None = None) -> None:
        self.api = api
        self._bus = bus
        # One budget for pod status, deletions and mirror pods, as the kubelet's client has.
        # The Node status and Lease (a write every 10 s each) stay outside it, so that a burst of
        # pod writes can never delay the heartbeat past the node's grace period.
        kubelet = config.kubelet
        self.limiter = TokenBucket(float(kubelet.kube_api_qps or 50), kubelet.kube_api_burst or 100, clock)
        # eventRecordQPS 0 means no limit, as for the kubelet.
        self.events = KubeEvents(api, node.name, qps=float(kubelet.event_record_qps or 0) or 1e9,
                                 burst=kubelet.event_burst or EVENT_BURST, clock=clock)
        self.node = NodeStatus(api, config, node, runtime,
                               lambda: (relister.healthy, relister.last_relist), clock, self.events.record_node,
                               kubelet_port=kubelet_port, volumes_in_use=volumes_in_use, conditions=conditions,
                               reported_volumes=reported_volumes)
        self.lease = NodeLease(api, node.name, kubelet.node_lease_duration_seconds, lambda: self.node.uid, clock)
        self.mirrors = MirrorPods(api, node.name, self.limiter, lambda: self.node.uid, clock,
                                  on_mirror_changed=lambda: self.status_sink.wake())
        self.source = ApiPodSource(api, node.name, bus.publish, mirrors=self.mirrors,
                                   on_finished_deletion=lambda ref: self.status_sink.delete_when_stopped(ref),
                                   clock=clock)
        self.status_sink = ApiStatusSink(api, self.source, self.mirrors, self.limiter,
                                         is_stopped=lambda uid: not relister.pod(uid).running(), clock=clock)

    async def start(self, sup: Supervisor) -> None:
        """The node-level tasks; none waits for the API server (each retries on its own)."""
        await sup.start(self.events.run, self._bus.stream("kubeevents"), name="cluster:events")
        await sup.start(self.mirrors.run, self._bus.stream("mirrors"), name="cluster:mirrors")
        await sup.start(self.node.run, name="cluster:node")
        await sup.start(self.lease.run, name="cluster:lease")
        await sup.start(self.status_sink.run, name="cluster:status")

    async def start_source(self, sup: Supervisor) -> None:
        """The API pod source; returns once its first listing was published (the pods the
        runtime replay must keep). Waits for the API server if it is away."""
        await sup.start(self.source.run, name="source:api")

    def replayed(self) -> None:
        """The agent has replayed the runtime: every static pod has been seen."""
        self.mirrors.set_ready()


__all__ = ["ClusterMode"]
