"""The composition root: configuration in, a running agent out.

This is the one module that knows every component. It builds them from the configuration,
wires the bus as TOPOLOGY declares, and runs everything in one task group, so that nothing
outlives the agent and a failure anywhere is seen here.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import structlog

from cri import CriError, RuntimeClient
from nodeagent import cgroupdriver, quantity
from nodeagent import events as ev
from nodeagent.admission import AdmissionCycle
from nodeagent.apiclient import make_api_client
from nodeagent.bus import TOPOLOGY, Bus, consume
from nodeagent.clock import Clock, SystemClock
from nodeagent.cluster import ClusterMode
from nodeagent.cluster.node import node_labels
from nodeagent.config import AgentConfig
from nodeagent.dispatcher import Dispatcher
from nodeagent.endpoint import Routes, serve
from nodeagent.errors import PluginError
from nodeagent.fdlimit import raise_to_hard_limit
from nodeagent.kubeletconfig.node import NodeConfig
from nodeagent.kubeletconfig.support import support_of
from nodeagent.kubeletserver import KubeletServer, ReadOnlyServer, RequestCounts, pod_list
from nodeagent.kubeletserver import enabled as kubelet_server_enabled
from nodeagent.kubeletserver.nodestats import NodeReads
from nodeagent.lifecycle import PodState
from nodeagent.metrics import Metrics
from nodeagent.nodeconditions import NodeConditions
from nodeagent.nodeip import NodeIPError, node_ips
from nodeagent.nodeops import NodeOps
from nodeagent.objects import ApiObjects, FileObjects, ObjectStore
from nodeagent.pleg import Relister
from nodeagent.pluginwatcher import PluginHandler, PluginWatcher, polling
from nodeagent.registry import Pipeline, load
from nodeagent.sources.static import StaticPodSource
from nodeagent.stages import Condition, NodeInfo, PodSnapshot, ReclaimKind
from nodeagent.statefile import ensure_private_dir
from nodeagent.stats import Usage, UsageCollector, volume_stats_metrics
from nodeagent.status import FileSink, StatusSink, StatusWriter
from nodeagent.supervisor import Supervisor
from nodeagent.trace import Trace
from nodeagent.volumesinuse import ReportedVolumes
from nodeagent.worker import Services

if TYPE_CHECKING:
    # Imported where they are used: certificates need `cryptography` (about 10 MiB of RSS and
    # 50 modules), which an agent without an API server never uses.
    from nodeagent.certificates.client import ClientCertificates
    from nodeagent.certificates.manager import CertificateManager


log = structlog.get_logger("nodeagent")
_EVENT_LOG = structlog.get_logger("nodeagent.events")

RUNTIME_CONNECT_RETRY_MAX = 10.0
UNSUPPORTED_REASON = "NodeAgentConfigurationUnsupported"
"""The Node Event that lists the KubeletConfiguration fields nodeagent does not honour."""
CONNECT_ATTEMPT_SECONDS = 3.0


def max_pods(config: AgentConfig) -> int:
    """maxPods, or podsPerCore x cores when that is smaller (the kubelet's pods capacity)."""
    pods = config.kubelet.max_pods
    if config.kubelet.pods_per_core > 0:
        pods = min(pods, config.kubelet.pods_per_core * (os.cpu_count() or 1))
    return pods


def node_allocatable(config: AgentConfig) -> dict[str, int]:
    """capacity − kubeReserved − systemReserved − hard eviction, like the kubelet."""
    capacity = {"cpu": (os.cpu_count() or 1) * 1000, "memory": _mem_total(), "pods": max_pods(config)}
    allocatable = dict(capacity)
    for reserved in (config.kubelet.kube_reserved or {}, config.kubelet.system_reserved or {}):
        for res, value in reserved.items():
            if res in allocatable:
                allocatable[res] -= quantity.base_units(res, value)
    allocatable["memory"] -= eviction_hard_memory(config, capacity["memory"])
    return {k: max(v, 0) for k, v in allocatable.items()}


def eviction_hard_memory(config: AgentConfig, capacity: int) -> int:
    """evictionHard's memory.available in bytes (a quantity or a percentage of capacity), which
    the kubelet keeps out of allocatable; 0 when the threshold is off or absent."""
    value = (config.kubelet.eviction_hard or {}).get("memory.available", "")
    if not value:
        return 0
    if value.endswith("%"):
        return int(capacity * float(value[:-1]) / 100)
    return quantity.base_units("memory", value)


def _mem_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


class PodSource(Protocol):
    """What the runtime replay needs of a pod source."""

    @property
    def listed(self) -> bool:
        """The source has published its first complete listing."""

    def wanted(self) -> set[str]:
        """UIDs of the pods the source wants run."""


@dataclass
class Handle:
    """The AgentHandle plugin factories get (see nodeagent.stages.AgentHandle)."""

    runtime: RuntimeClient
    clock: Clock
    node: NodeInfo
    settings: NodeConfig
    """The node's configuration, read-only (the kubelet's fields; a stage's own are its model)."""
    bus: Bus
    objects: ObjectStore
    """API objects (cluster: list and watch with the node's credentials; standalone: manifests)."""
    ops: NodeOps | None = None
    """The node-wide services (usage, pods, evict, Node conditions and Events, reclaim)."""

    async def publish(self, event: ev.Event) -> None:
        await self.bus.publish(event)

    # --- for node-wide managers (nodeagent.stages.AgentHandle; implemented by nodeagent.nodeops) ---

    def _ops(self) -> NodeOps:
        if self.ops is None:
            raise RuntimeError("this handle has no node-wide services")
        return self.ops

    def usage(self) -> Usage | None:
        return self._ops().usage()

    async def usage_changed(self, timeout: float | None = None) -> None:
        await self._ops().usage_changed(timeout)

    def request_usage(self) -> None:
        self._ops().request_usage()

    def pods(self) -> Sequence[PodSnapshot]:
        return self._ops().pods()

    def evict(self, uid: str, *, reason: str, message: str, grace_seconds: int,
              condition: Condition | None = None) -> anyio.Event | None:
        return self._ops().evict(uid, reason=reason, message=message, grace_seconds=grace_seconds,
                                 condition=condition)

    def set_node_condition(self, condition: Condition) -> None:
        self._ops().set_node_condition(condition)

    def node_event(self, type: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self._ops().node_event(type, reason, message)

    def volume_reported_in_use(self, unique_name: str) -> bool:
        return self._ops().volume_reported_in_use(unique_name)

    def provide_reclaim(self, kind: ReclaimKind, reclaim: Callable[[], Awaitable[int]]) -> None:
        self._ops().provide_reclaim(kind, reclaim)

    async def reclaim(self, kind: ReclaimKind) -> int | None:
        return await self._ops().reclaim(kind)


class Agent:
    def __init__(self, config: AgentConfig, *, clock: Clock | None = None, verbose: bool = True,
                 certificates: ClientCertificates | None = None) -> None:
        """``certificates``: the node's rotating client certificate (TLS bootstrap); the API
        client presents whatever it holds, so a renewal reaches new connections at once."""
        self.config = config
        self.settings = config.node_config()
        self.verbose = verbose
        self.clock = clock or SystemClock()
        self.bus = Bus(TOPOLOGY, cluster=config.kubeconfig is not None)
        self.supervisor: Supervisor | None = None
        """Runs every long-lived task (set when the agent runs)."""
        self.cgroup_driver = cgroupdriver.CgroupDriver(cgroupdriver.configured(self.config.kubelet.cgroup_driver),
                                                         from_runtime=False)
        """The node's cgroup driver, asked of the runtime once it is connected."""
        self.metrics = Metrics()
        kubelet = config.kubelet
        self.runtime = RuntimeClient(kubelet.container_runtime_endpoint, timeout=kubelet.runtime_request_timeout)
        self.certificates = certificates
        self.api: Any = (make_api_client(config.kubeconfig, ssl_context=certificates.context if certificates else None,
                                         observer=self.metrics.api_request)
                         if config.kubeconfig else None)
        try:
            ips = node_ips(config.flags.node_ip, config.node_name, config.flags.hostname_override)
        except NodeIPError as exc:
            if config.kubeconfig is not None:
                raise  # the kubelet cannot register a node without an address, nor can we
            # Standalone there is no Node: pods still get a host IP (nodeagent's old default).
            log.warning("no node IP found; standalone, pods get 127.0.0.1 as their host IP", error=str(exc))
            ips = ["127.0.0.1"]
        self.node = NodeInfo(
            name=config.node_name,
            ip=ips[0],
            allocatable=node_allocatable(config),
            labels=node_labels(config.node_name, config.flags.node_labels),
            ips=tuple(ips),
        )
        self.trace = Trace(config.agent.trace_file)
        self.relister = Relister(self.runtime, config.node_name, self.bus.publish,
                                 on_relist=self.metrics.relisted, evented_period=config.agent.evented_relist_period)
        self.runtime.observer = self.metrics.runtime_operation
        self.stats = UsageCollector(self.runtime, self.relister, config.node_name, config.root_dir,
                                    config.pod_logs_dir, volume_stats_seconds=kubelet.volume_stats_agg_period)
        """What the node and its pods use, sampled on the housekeeping period (nodeagent.stats)."""
        self.conditions = NodeConditions()
        """Node conditions node-level managers report (eviction's pressures, shutdown's Ready)."""
        reported_volumes = ReportedVolumes() if self.api is not None else None
        """Cluster mode: what the Node's volumesInUse carries (an attachable volume is mounted
        only once listed there); standalone there is no attach-detach controller to tell."""
        # Cluster mode: Node, Lease, API pod source, API status sink, mirror pods, Events.
        self.cluster = (ClusterMode(self.api, config, self.node, self.runtime, self.relister, self.bus, self.clock,
                                    kubelet_port=lambda: getattr(self.kubelet_server, "port", None) or kubelet.port,
                                    volumes_in_use=self._volumes_in_use,
                                    conditions=self.conditions, reported_volumes=reported_volumes)
                        if self.api is not None else None)
        sinks: list[StatusSink] = [FileSink(config.root_dir / "pod-status")]
        if self.cluster is not None:
            sinks.append(self.cluster.status_sink)
        self.status = StatusWriter(sinks, host_ip=self.node.ip, contain=self._contain)
        self.objects: ApiObjects | FileObjects = ApiObjects(self.api, self.clock) if self.api is not None \
            else FileObjects()
        self.node_ops = NodeOps(self.status, self.conditions, self.stats,
                                node_event=self.cluster.events.record_node if self.cluster is not None else None,
                                reported_volumes=reported_volumes)
        if certificates is not None and certificates.manager is not None:
            certificates.manager.api = lambda: self.api  # renewals go through the node's own client
        self.serving: CertificateManager | None = None
        """serverTLSBootstrap: the kubelet API's certificate from kubernetes.io/kubelet-serving CSRs."""
        if self.api is not None and kubelet.server_tls_bootstrap:
            from nodeagent.certificates.serving import serving_certificates

            self.serving = serving_certificates(config, self.node, lambda: self.api, self.clock)
        self.pipeline: Pipeline | None = None
        self.dispatcher: Dispatcher | None = None
        self.services: Services | None = None
        """What the pod workers share (set when the agent runs; the contract suite reads its
        admission cycle)."""
        self.sources: list[PodSource] = []
        """The running pod sources (a test may ask the static one to ``scan()`` now)."""
        self.endpoint_port: int | None = None
        # Built here, not when it starts: a kubelet API the configuration cannot secure
        # (no authenticator, a webhook without an API client) stops the agent before it runs.
        self.plugin_watcher: PluginWatcher | None = None
        """The kubelet's plugin watcher, when a stage handles a plugin type (dra: DRAPlugin)."""
        self.http_requests = RequestCounts()
        """kubelet_http_requests_total, of both kubelet servers."""
        self.kubelet_server: KubeletServer | None = (
            KubeletServer(config, status=self.status, relister=self.relister, runtime=self.runtime,
                          healthz=self.healthz, api=self.api, node=self.node, serving=self.serving,
                          reads=self._node_reads(), requests=self.http_requests)
            if kubelet_server_enabled(config) else None)
        """The kubelet API (its ``port`` is where it listens, once it does)."""
        self.read_only_server: ReadOnlyServer | None = (
            ReadOnlyServer(config, healthz=self.healthz, pods=lambda: pod_list(self.status), reads=self._node_reads(),
                           requests=self.http_requests)
            if config.kubelet.read_only_port else None)
        """The kubelet's unauthenticated read-only port (``readOnlyPort``; 0, the default, is off)."""
        self.ready = anyio.Event()

    def _contain(self, task: str, exc: Exception) -> None:
        """A failure contained where it happened, reported through the supervisor once it runs."""
        if self.supervisor is not None:
            self.supervisor.contain(task, exc)
        else:
            log.error("task failed before the supervisor started", task=task, error=repr(exc))

    def load_pipeline(self) -> Pipeline:
        handle = Handle(self.runtime, self.clock, self.node, self.settings, self.bus, self.objects, ops=self.node_ops)
        pipeline, warnings = load(self.config.profile, self.config.plugins, handle)
        for warning in warnings:
            log.warning(warning)
        return pipeline

    async def run(self, *, task_status: anyio.abc.TaskStatus[Agent] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._run(task_status=task_status)
        finally:
            # Close the clients the agent opened: a grpc.aio channel left open keeps its poller
            # delivering into an event loop that may be gone ("Event loop is closed").
            with anyio.CancelScope(shield=True):
                await self.runtime.close()
                if self.api is not None:
                    await self.api.close()

    async def _run(self, *, task_status: anyio.abc.TaskStatus[Agent]) -> None:
        self.pipeline = self.load_pipeline()
        log.info("stage order resolved", **{k: ",".join(v) or "-" for k, v in self.pipeline.as_dict().items()})
        # Volume figures a stage measures itself (the csi stage: NodeGetVolumeStats, with the
        # claim), in place of the collector's walk of those volumes' directories.
        for stage in self.pipeline.stages.values():
            provider = getattr(stage, "volume_usage", None)
            if callable(provider):
                self.stats.volume_providers.append(provider)
        # Pod directories hold secrets and tokens: no other user of the host may reach them.
        ensure_private_dir(self.config.root_dir)
        ensure_private_dir(self.config.root_dir / "pods")
        raise_to_hard_limit()
        try:
            async with anyio.create_task_group() as tg:
                sup = self.supervisor = Supervisor(tg, offer=self.bus.offer, clock=self.clock)
                await sup.start(self.objects.run, name="objects")  # stages' views start as they ask
                self._subscribe(sup, "eventlog", self._log_event)
                self._subscribe(sup, "trace", self.trace.record)
                self._subscribe(sup, "metrics", self.metrics.count)
                if self.cluster is not None:
                    await self.cluster.start(sup)  # registers the Node even while the runtime is down
                self._report_unsupported()
                for manager in self._certificate_managers():
                    await sup.start(manager.run, name=f"certificate:{manager.name}")
                await self._connect_runtime()
                self.cgroup_driver = await cgroupdriver.resolve(
                    self.runtime, cgroupdriver.configured(self.config.kubelet.cgroup_driver))
                if self.cgroup_driver.driver != cgroupdriver.CGROUPFS and self.config.kubelet.cgroups_per_qos:
                    log.error("the runtime uses the systemd cgroup driver, which nodeagent does not implement: "
                              "every pod is refused", from_runtime=self.cgroup_driver.from_runtime)
                self.metrics.collectors.append(self.cgroup_driver.render_metrics)
                await sup.start(self.relister.run, name="pleg")
                await sup.start(self.status.run, name="status")
                await sup.start(self.stats.run, name="stats")
                for stage in self.pipeline.stages.values():
                    node_task = getattr(stage, "run", None)  # a stage's node-level task (dra: its reconcile loop)
                    if node_task is not None:
                        await sup.start(node_task, name=f"stage:{stage.name}")
                handlers = self._plugin_handlers()
                if handlers:
                    poll, health = polling(handlers)
                    self.plugin_watcher = PluginWatcher(self.config.agent.plugins_registry_dir, handlers,
                                                        self.bus.publish,
                                                        poll_seconds=poll, health_seconds=health)
                    await sup.start(self.plugin_watcher.run, name="plugin-watcher")
                services = Services(
                    runtime=self.runtime, clock=self.clock, node=self.node, settings=self.settings,
                    # Without pod cgroups (cgroupsPerQOS false) the runtime places sandboxes itself.
                    cgroup_driver=(self.cgroup_driver.driver if self.config.kubelet.cgroups_per_qos
                                   else cgroupdriver.CGROUPFS),
                    relister=self.relister, status=self.status, publish=self.bus.publish,
                    objects=self.objects,
                    admission=AdmissionCycle(self.pipeline, self.node), pipeline=self.pipeline,
                    root_dir=self.config.root_dir,
                    observe_stage_time=lambda stage, phase, s: self.metrics.stage.observe(s, stage, phase),
                    observe_pod_start=self.metrics.pod_start.observe,
                )
                self.services = services
                self.dispatcher = Dispatcher(services, tg, contain=sup.contain)
                self.node_ops.dispatcher = self.dispatcher
                self._subscribe(sup, "dispatcher", self.dispatcher.handle)
                self._register_gauges()
                if self.config.kubelet.healthz_port:
                    self.endpoint_port = await sup.start(self._serve, name="endpoint")
                if self.kubelet_server is not None:
                    await sup.start(self.kubelet_server.run, name="kubelet-server")
                if self.read_only_server is not None:
                    await sup.start(self.read_only_server.run, name="kubelet-read-only-server")
                sources = self.sources = []
                if self.config.static_pod_path is not None:
                    source = StaticPodSource(self.config.static_pod_path, self.config.node_name, self.bus.publish,
                                             full_rescan_seconds=self.config.kubelet.file_check_frequency,
                                             objects=self.objects if isinstance(self.objects, FileObjects) else None)
                    await sup.start(source.run, name="source:file")
                    sources.append(source)
                if self.cluster is not None:
                    await self.cluster.start_source(sup)
                    sources.append(self.cluster.source)
                if all(s.listed for s in sources):
                    await self._replay(sources)
                else:
                    # A source that failed before its first listing cannot say which runtime pods
                    # it wants: nothing is an orphan until it can.
                    log.warning("a pod source has not listed yet; the runtime replay waits for it")
                    sup.start_soon(self._replay_once_listed, sources, name="replay")
                self.ready.set()
                task_status.started(self)
        finally:
            self.bus.close()
            self.trace.close()

    def _certificate_managers(self) -> list[CertificateManager]:
        managers = [self.serving] if self.serving is not None else []
        if self.certificates is not None and self.certificates.manager is not None:
            managers.insert(0, self.certificates.manager)
        return managers

    def _report_unsupported(self) -> None:
        """KubeletConfiguration fields set to what nodeagent does not do: said once, at start (a
        warning each; in cluster mode one Warning Event on the Node)."""
        fields = self.config.unsupported_fields()
        for path, value in fields.items():
            log.warning("KubeletConfiguration field not honoured by nodeagent", field=path, value=value,
                        behaviour=support_of(path).note)
        if fields and self.cluster is not None:
            listed = "; ".join(f"{path}={json.dumps(value)} ({support_of(path).note})"
                               for path, value in fields.items())
            self.cluster.events.record_node("Warning", UNSUPPORTED_REASON,
                                            f"KubeletConfiguration fields nodeagent does not honour: {listed}"[:1024])

    def _plugin_handlers(self) -> dict[str, PluginHandler]:
        """Plugin type → the stage's handler for it (``registration_handlers()``); two stages
        handling one type is a configuration error."""
        handlers: dict[str, PluginHandler] = {}
        for stage in (self.pipeline.stages.values() if self.pipeline else ()):
            for handler in getattr(stage, "registration_handlers", lambda: [])():
                if handler.plugin_type in handlers:
                    raise PluginError(f"stages {handlers[handler.plugin_type]!r} and {stage.name!r} both handle "
                                      f"plugins of type {handler.plugin_type}")
                handlers[handler.plugin_type] = handler
        return handlers

    def _volumes_in_use(self) -> list[str]:
        """node.status.volumesInUse: what the stages that mount attachable volumes report
        (``volumes_in_use()``; the csi stage)."""
        names: set[str] = set()
        for stage in (self.pipeline.stages.values() if self.pipeline else ()):
            report = getattr(stage, "volumes_in_use", None)
            if callable(report):
                names.update(report())
        return sorted(names)

    def _subscribe(self, sup: Supervisor, name: str, handle: Callable[[ev.Event], Awaitable[None] | None]) -> None:
        """A bus subscriber under the supervisor; a fact it fails on is reported and skipped."""
        sup.start_soon(consume, self.bus.stream(name), handle, lambda exc: sup.contain(name, exc), name=name)

    async def _connect_runtime(self) -> None:
        """A dead runtime socket is reported precisely and retried; the agent does not exit."""
        endpoint = self.config.kubelet.container_runtime_endpoint
        delay = 0.5
        while True:
            message = ""
            # The client waits for a ready channel on reads; bound each attempt so the agent
            # keeps saying what is wrong instead of hanging silently.
            with anyio.move_on_after(CONNECT_ATTEMPT_SECONDS):
                try:
                    info = await self.runtime.connect()
                    log.info("runtime connected", endpoint=endpoint,
                             runtime=f"{info.runtime_name} {info.runtime_version}", api=info.runtime_api_version)
                    return
                except CriError as exc:
                    message = str(exc)
            if not message:
                path = endpoint.removeprefix("unix://")
                exists = "exists" if os.path.exists(path) else "does not exist"
                message = (f"CRI runtime at {endpoint} did not answer within {CONNECT_ATTEMPT_SECONDS:g}s "
                           f"(socket {path} {exists}; is containerd running?)")
            log.error("runtime not reachable; retrying", endpoint=endpoint, error=message, retry_in=delay)
            await self.bus.publish(ev.RuntimeUnavailable(source="core", endpoint=endpoint, message=message))
            await self.clock.sleep(delay)
            delay = min(delay * 2, RUNTIME_CONNECT_RETRY_MAX)

    async def _replay(self, sources: Sequence[PodSource]) -> None:
        """Runtime pods of this node that no source wants are orphans: tear them down. Wanted
        ones are adopted by their workers, whose stages find the sandbox and containers."""
        wanted = set().union(*(s.wanted() for s in sources))
        for uid, pod in self.relister.pods().items():
            if uid not in wanted:
                log.warning("orphaned runtime pod; terminating it", pod=f"{pod.namespace}/{pod.name}", uid=uid)
                await self.bus.publish(ev.OrphanFound(source="replay",
                                                      pod=ev.PodRef(uid=uid, name=pod.name, namespace=pod.namespace)))
        if self.cluster is not None:
            self.cluster.replayed()

    async def _replay_once_listed(self, sources: Sequence[PodSource]) -> None:
        while not all(s.listed for s in sources):
            await self.clock.sleep(0.5)
        log.info("every pod source has listed; replaying the runtime")
        await self._replay(sources)

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        routes = Routes(healthz=self.healthz, metrics=self.metrics.render, pods=self.pods_table,
                        trace=self.trace.chain, plugins=self.plugins_info)
        await serve(routes, self.config.kubelet.healthz_bind_address, self.config.kubelet.healthz_port or 0,
                    self._contain,
                    task_status=_PortReport(self, task_status))

    def healthz(self) -> tuple[bool, str]:
        if not self.relister.healthy:
            return False, "runtime relist failing (PLEG is not healthy)\n"
        return True, "ok\n"

    def pods_table(self) -> list[dict[str, Any]]:
        rows = []
        now = time.time()
        workers = self.dispatcher.workers if self.dispatcher else {}
        for uid, (ref, _pod, status, state) in self.status.all().items():
            worker = workers.get(uid)
            restarts = sum(cs.get("restartCount", 0) for cs in status.get("containerStatuses", []))
            rows.append({
                "namespace": ref.namespace, "name": ref.name, "uid": uid, "state": state.value,
                "phase": status.get("phase", ""), "reason": status.get("reason", ""),
                "restarts": restarts, "podIP": status.get("podIP", ""),
                "age_seconds": round(now - worker.observed_wall, 1) if worker else None,
                "status": status,
            })
        return rows

    def plugins_info(self) -> dict[str, Any]:
        stages = self.pipeline.stages if self.pipeline else {}
        return {"order": self.pipeline.as_dict() if self.pipeline else {},
                "stages": {n: s.describe() for n, s in stages.items() if hasattr(s, "describe")},
                "pluginWatcher": self.plugin_watcher.describe() if self.plugin_watcher is not None else None}

    def _node_reads(self) -> NodeReads:
        """What the kubelet API's stats and metrics endpoints read (nodeagent/kubeletserver/nodestats.py)."""
        return NodeReads(node_name=self.config.node_name, usage=lambda: self.stats.latest,
                         metrics=self.metrics.render, probe_metrics=self._probe_metrics, configz=self.configz)

    def _stages(self) -> list[Any]:
        return list(self.pipeline.stages.values()) if self.pipeline else []

    def _probe_metrics(self) -> str:
        """/metrics/probes: the probes stage's prober_probe_* series."""
        text = "".join(render() for stage in self._stages()
                       if callable(render := getattr(stage, "render_probe_metrics", None)))
        return text or "\n"

    def configz(self) -> dict[str, Any]:
        """/configz: the effective KubeletConfiguration (and the node's name); stages that act on
        kubelet fields (eviction, gc, shutdown) add the values they resolved (``kubelet_config()``)."""
        out: dict[str, Any] = {"kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1"}
        out.update(self.config.kubelet.model_dump(mode="json", by_alias=True, exclude_none=True))
        out["nodeName"] = self.config.node_name
        out["cgroupDriver"] = self.cgroup_driver.driver  # the runtime's when it said (the kubelet's too)
        for stage in self._stages():
            fields = getattr(stage, "kubelet_config", None)
            if callable(fields):
                out.update(fields())
        return out

    def _register_gauges(self) -> None:
        def running() -> float:
            return float(sum(1 for _, _, _, s in self.status.all().values() if s is PodState.RUNNING))

        def depth() -> dict[str, float]:
            return {f'subscriber="{k}"': float(v) for k, v in self.bus.depth().items()}

        def containers() -> dict[str, float]:
            counts = {state: 0.0 for state in ("created", "running", "exited", "unknown")}
            for pod in self.relister.pods().values():
                for c in pod.containers:
                    counts[c.state if c.state in counts else "unknown"] += 1
            return {f'container_state="{k}"': v for k, v in counts.items()}

        self.metrics.gauges["kubelet_running_pods"] = running
        self.metrics.gauges["kubelet_running_containers"] = containers
        self.metrics.gauges["kubelet_node_name"] = lambda: {f'node="{self.config.node_name}"': 1.0}
        self.metrics.gauges["nodeagent_bus_queue_depth"] = depth
        self.metrics.collectors.append(self.conditions.render_metrics)
        self.metrics.collectors.append(lambda: volume_stats_metrics(self.stats.latest))
        self.metrics.collectors.append(self.stats.render_metrics)
        if self.supervisor is not None:
            self.metrics.collectors.append(self.supervisor.render_metrics)
        if self.kubelet_server is not None:
            self.metrics.collectors.append(self.kubelet_server.render_metrics)
        self.metrics.collectors.append(self.http_requests.render)
        for manager in self._certificate_managers():
            self.metrics.collectors.append(manager.render_metrics)
        # A stage's own series (the gang stage's nodeagent_gang_*), rendered by the stage.
        for stage in (self.pipeline.stages.values() if self.pipeline else ()):
            render = getattr(stage, "render_metrics", None)
            if callable(render):
                self.metrics.collectors.append(render)

    def _log_event(self, event: ev.Event) -> None:
        if not self.verbose:
            return  # drained, not rendered: dumping every fact costs real CPU at scale
        data: Mapping[str, Any] = event.model_dump(exclude={"pod", "at", "kind", "pod_spec"})
        kind: str = getattr(event, "kind")  # noqa: B009 - each subclass declares kind, the base does not
        _EVENT_LOG.debug(kind, pod=str(event.pod) if event.pod.uid else None, **data)


class _PortReport(anyio.abc.TaskStatus[int]):
    """The local endpoint's task_status: every bind (a restart's too: with port 0 it is a new
    port) is kept in ``agent.endpoint_port``; the first also reaches the starter."""

    def __init__(self, agent: Agent, task_status: anyio.abc.TaskStatus[int]) -> None:
        self._agent = agent
        self._task_status = task_status

    def started(self, port: int) -> None:
        self._agent.endpoint_port = port
        self._task_status.started(port)


async def run_forever(config: AgentConfig, verbose: bool = False) -> None:
    """Run until SIGTERM or SIGINT. Stopping the agent leaves its pods running, as stopping the
    kubelet does: the next agent adopts them. With ``--bootstrap-kubeconfig`` (or
    ``rotateCertificates``) the node's client certificate is had first (TLS bootstrap)."""
    certificates = None
    if config.kubeconfig is not None:
        from nodeagent.certificates.client import prepare as prepare_client_certificates

        certificates = await prepare_client_certificates(
            kubeconfig=config.kubeconfig, bootstrap_kubeconfig=config.flags.bootstrap_kubeconfig,
            cert_dir=config.flags.pki_dir, node_name=config.node_name, rotate=config.kubelet.rotate_certificates)
    agent = Agent(config, verbose=verbose, certificates=certificates)
    running = anyio.CancelScope()

    async def run_agent() -> None:
        with running:
            await agent.run()
        tg.cancel_scope.cancel()  # the agent is down: stop listening for signals

    async def give_up_after(seconds: float, why: str) -> None:
        await anyio.sleep(seconds)
        _exit_stuck(config.root_dir, why)

    async def freeze_what_startup_made() -> None:
        # What the agent made before it was ready (modules, classes, the pipeline, the
        # configuration) lives as long as the process. Moved out of the collector's
        # generations, it is no longer walked by every full collection while pods start and
        # stop (a 110-pod start and teardown spent 0.69 s in its three full collections, 0.09 s
        # frozen: benchmarks/RESULTS.md). Only here, in the agent's own process: a test process
        # running many agents would keep whatever it froze.
        await agent.ready.wait()
        gc.collect()
        gc.freeze()

    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGUSR1) as signals:
            tg.start_soon(run_agent)
            tg.start_soon(freeze_what_startup_made)
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGUSR1:
                    _dump_tasks(config.root_dir, "SIGUSR1")
                elif not running.cancel_called:
                    log.info("stopping; pods keep running", signal=name)
                    running.cancel()
                    tg.start_soon(give_up_after, SHUTDOWN_TIMEOUT_SECONDS,
                                  f"the agent did not stop within {SHUTDOWN_TIMEOUT_SECONDS:g}s of {name}")
                else:
                    _exit_stuck(config.root_dir, f"{name} again while stopping")


SHUTDOWN_TIMEOUT_SECONDS = 30.0
"""How long stopping may take (it leaves pods running: only connections and files close)
before the agent writes a task dump and exits anyway, as a second SIGTERM/SIGINT makes it do
at once. A stop that hangs is a bug; the dump says where."""


def _dump_tasks(root_dir: Path, why: str) -> Path | None:
    from nodeagent import taskdump

    try:
        path = taskdump.write_dump(root_dir, why)
    except Exception as exc:  # noqa: BLE001 - a diagnostic must never be what stops the agent
        log.error("cannot write the task dump", why=why, error=f"{type(exc).__name__}: {exc}")
        return None
    log.warning("task dump written", why=why, path=str(path))
    return path


def _exit_stuck(root_dir: Path, why: str) -> None:
    _dump_tasks(root_dir, why)
    log.error("exiting without a clean stop", why=why)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(1)


__all__ = ["Agent", "run_forever", "node_allocatable", "Path"]
