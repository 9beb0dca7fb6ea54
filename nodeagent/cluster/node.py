"""The Node object: registration and status, kept current.

At start the agent creates its Node (or, if it exists, updates its labels) with capacity and
allocatable (cpu, memory, pods, ephemeral-storage), the kubelet's well-known labels, addresses,
nodeInfo (the container runtime's version from CRI Version, our own version) and the kubelet
port. Then every ``nodeStatusUpdateFrequency`` (10 s) it computes the status and writes it when
it changed, or at least every ``nodeStatusReportFrequency`` (5 min) so that
``lastHeartbeatTime`` moves; the Lease (nodeagent.cluster.lease) is the frequent heartbeat.

Conditions, with the kubelet's reasons and messages:

* Ready: True (KubeletReady) when the runtime answers CRI Status with RuntimeReady and
  NetworkReady, and the relister is healthy and recent; else False (KubeletNotReady) saying
  which check failed.
* MemoryPressure / DiskPressure / PIDPressure: as the eviction stage reports them
  (plugins/eviction: its thresholds and pressure transition period) through the node
  conditions store (nodeagent.nodeconditions); False with the kubelet's reasons while nothing
  reported them. A change is written at once, not at the next period.
* Ready is also False (KubeletNotReady) while a stage reports it so: the shutdown stage's
  "node is shutting down".

kubeletVersion is ``v1.37.2+nodeagent.<version>``: the Kubernetes API level we implement and
test against, with our own identity as semver build metadata (as k3s reports ``v1.30.2+k3s1``).
Components that parse it (skew checks, `kubectl get nodes`) see 1.37.2, which is the behaviour
we aim at; the suffix says it is not the kubelet.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import structlog
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from cri import RuntimeClient
from nodeagent import __version__, quantity
from nodeagent.clock import Clock, SystemClock
from nodeagent.cluster.apicalls import describe, is_conflict, is_not_found
from nodeagent.config import AgentConfig
from nodeagent.nodeconditions import NodeConditions
from nodeagent.stages import Condition, NodeInfo
from nodeagent.status import rfc3339
from nodeagent.volumesinuse import ReportedVolumes
from nodeagent.waits import first_of

log = structlog.get_logger("nodeagent.cluster.node")

DECLARED_FEATURES = ("InPlacePodLevelResourcesVerticalScaling", "InPlacePodVerticalScalingInitContainers",
                     "RestartAllContainersOnContainerExits")
"""status.declaredFeatures (NodeDeclaredFeatures), sorted: node features the API server requires of
the node before it admits a pod update that needs them (component-helpers nodedeclaredfeatures).
Only what nodeagent honours: pod-level and non-sidecar init container in-place resize
(plugins/runtime/resize.py) and RestartAllContainers (plugins/runtime/restartall.py); not
memory-backed emptyDir resize."""

CONTROLLER_MANAGED_ATTACH_DETACH = "volumes.kubernetes.io/controller-managed-attach-detach"
KUBE_VERSION = "v1.37.2"
"""The Kubernetes release whose kubelet behaviour we implement (tests run its control plane)."""
KUBELET_VERSION = f"{KUBE_VERSION}+nodeagent.{__version__}"
PLEG_THRESHOLD_SECONDS = 180.0  # the kubelet's genericPlegRelistThreshold
MAX_NAMES_PER_IMAGE = 5  # the kubelet's MaxNamesPerImageInNodeStatus
RUNTIME_CHECK_SECONDS = 5.0
EVICTION_HARD_NODEFS = 0.10  # nodefs.available<10%: the ephemeral-storage allocatable leaves it out
RETRY_INITIAL_SECONDS = 0.5
FIRST_RELIST_WAIT_SECONDS = 10.0
"""How long the agent's first status waits for the relister's first listing (see
NodeStatus._await_first_relist)."""
RETRY_MAX_SECONDS = 8.0
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}

_CONDITIONS = {
    # type: (reason when False, message when False, reason when True, message when True)
    "MemoryPressure": ("KubeletHasSufficientMemory", "kubelet has sufficient memory available",
                       "KubeletHasInsufficientMemory", "kubelet has insufficient memory available"),
    "DiskPressure": ("KubeletHasNoDiskPressure", "kubelet has no disk pressure",
                     "KubeletHasDiskPressure", "kubelet has disk pressure"),
    "PIDPressure": ("KubeletHasSufficientPID", "kubelet has sufficient PID available",
                    "KubeletHasInsufficientPID", "kubelet has insufficient PID available"),
}
# The Events the kubelet sends when a condition changes (recordNodeStatusEvent).
_TRANSITION_EVENTS = {
    ("Ready", "True"): "NodeReady", ("Ready", "False"): "NodeNotReady",
    ("MemoryPressure", "False"): "NodeHasSufficientMemory", ("MemoryPressure", "True"): "NodeHasInsufficientMemory",
    ("DiskPressure", "False"): "NodeHasNoDiskPressure", ("DiskPressure", "True"): "NodeHasDiskPressure",
    ("PIDPressure", "False"): "NodeHasSufficientPID", ("PIDPressure", "True"): "NodeHasInsufficientPID",
}


def architecture() -> str:
    machine = platform.machine()
    return ARCHITECTURES.get(machine, machine)


def node_labels(name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """initialNode's labels: hostname, os and arch (stable and beta), then ``--node-labels``,
    which win (the kubelet logs each default they overwrite)."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": architecture(),
              "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": architecture()}
    for key, value in (extra or {}).items():
        if key in labels and labels[key] != value:
            log.info("the node label will overwrite default setting", label=key, value=value, default=labels[key])
        labels[key] = value
    return labels


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return "Linux"


def _meminfo() -> dict[str, int]:
    out = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields:
            out[key] = int(fields[0]) * 1024
    return out


def _filesystem(path: Path) -> tuple[int, int]:
    """(size, available) bytes of the filesystem holding ``path`` (its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def _cpu(millis: int) -> str:
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _bytes(n: int) -> str:
    return f"{n // 1024}Ki" if n % 1024 == 0 else str(n)


def resources(config: AgentConfig, node: NodeInfo) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) as API quantities. cpu, memory and pods allocatable are the
    agent's own (the admission stage decides with the same numbers the scheduler sees);
    ephemeral-storage is the rootDir filesystem less reservations and the 10% eviction floor."""
    size, _ = _filesystem(config.root_dir)
    pods = node.allocatable.get("pods", config.kubelet.max_pods)
    capacity = {
        "cpu": str(os.cpu_count() or 1),
        "memory": _bytes(_meminfo().get("MemTotal", 0)),
        "pods": str(pods),
        "ephemeral-storage": _bytes(size),
    }
    ephemeral = size - int(size * EVICTION_HARD_NODEFS)
    for reserved in (config.kubelet.kube_reserved or {}, config.kubelet.system_reserved or {}):
        if "ephemeral-storage" in reserved:
            ephemeral -= quantity.base_units("ephemeral-storage", reserved["ephemeral-storage"])
    allocatable = {
        "cpu": _cpu(int(node.allocatable.get("cpu", 0))),
        "memory": _bytes(int(node.allocatable.get("memory", 0))),
        "pods": str(pods),
        "ephemeral-storage": str(max(ephemeral, 0)),
    }
    return capacity, allocatable


class NodeStatus:
    """Registers the Node and keeps its status current. ``uid`` is known once registered."""

    def __init__(self, api: Any, config: AgentConfig, node: NodeInfo, runtime: RuntimeClient,
                 relister_health: Callable[[], tuple[bool, float]], clock: Clock | None = None,
                 record_event: Callable[[str, str, str], None] | None = None,
                 kubelet_port: Callable[[], int] | None = None, conditions: NodeConditions | None = None,
                 volumes_in_use: Callable[[], list[str]] | None = None,
                 reported_volumes: ReportedVolumes | None = None) -> None:
        self._api = api
        self._config = config
        self._node = node
        self._runtime = runtime
        self._relister_health = relister_health
        self._clock = clock or SystemClock()
        self._record_event = record_event
        self._conditions = conditions or NodeConditions()
        """Conditions node-level managers report (pressures, Ready while shutting down)."""
        self._kubelet_port = kubelet_port or (lambda: config.kubelet.port)
        self._kubelet = config.kubelet
        """Where the kubelet API listens (the bound port when ``port`` is 0)."""
        self._volumes_in_use = volumes_in_use or (lambda: [])
        """status.volumesInUse: the attachable volumes the node's pods want or have mounted (the
        attach-detach controller detaches none of them)."""
        self._reported_volumes = reported_volumes or ReportedVolumes()
        """What the last successful write carried in volumesInUse; a stage waiting for a
        volume to be reported asks it for a write now."""
        self.uid: str | None = None
        self.registered = anyio.Event()
        self._runtime_version = ""
        self._handlers: list[dict[str, Any]] = []
        self._reported: dict[str, Any] | None = None
        """The last status written, without heartbeat times (to see changes)."""
        self._reported_at = 0.0
        self._transitions: dict[str, tuple[str, str]] = {}
        """Condition type → (status, lastTransitionTime)."""
        self.writes = 0
        self._announced = False

    @property
    def name(self) -> str:
        return self._node.name

    # --- the loop ---------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Reports started at once: the node's pods do not wait for its registration."""
        task_status.started()
        if self._record_event is not None and not self._announced:
            self._announced = True  # once per agent, not again when the supervisor restarts this task
            self._record_event("Normal", "Starting", "Starting kubelet.")
        delay = RETRY_INITIAL_SECONDS
        while True:
            try:
                if self.uid is None:
                    await self.register()
                if self.writes == 0 and self._transitions.get("Ready", ("",))[0] == "True":
                    await self._await_first_relist()
                await self.update()
                delay = RETRY_INITIAL_SECONDS
                await self._wait_for_change(self._kubelet.node_status_update_frequency)
            except Exception as exc:  # noqa: BLE001 - the API server is away: retry, keep the node running
                log.warning("node status not written; retrying", error=describe(exc), retry_in=delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS, self._kubelet.node_status_update_frequency)

    async def _wait_for_change(self, timeout: float) -> None:
        """Until the status period passed, a condition (pressure, shutdown) was reported, or a
        volume waits to be listed in volumesInUse: those two are written at once."""
        await first_of(self._conditions.wait_changed(timeout), self._reported_volumes.wait_requested())

    async def _await_first_relist(self) -> None:
        """A restarted agent whose Node is Ready waits with its first status, at most
        FIRST_RELIST_WAIT_SECONDS, for the relister's first listing. Written before it, Ready
        says "PLEG has not relisted yet" for a beat and the Node flaps NotReady → Ready: a
        NodeNotReady Event and new transition times for a node that never stopped running its
        pods (seen under load, when the registration round trip beat the first relist). A new
        Node, or one that was not Ready, has nothing to lose and is written at once."""
        deadline = self._clock.monotonic() + FIRST_RELIST_WAIT_SECONDS
        while not self._relister_health()[1] and self._clock.monotonic() < deadline:
            await self._clock.sleep(0.05)

    def initial(self) -> dict[str, Any]:
        """initialNode: labels, the controller-managed attach-detach annotation, the
        registerWithTaints taints, spec.providerID."""
        metadata: dict[str, Any] = {"name": self.name, "labels": self.labels()}
        if self._kubelet.enable_controller_attach_detach is not False:
            # The attach-detach controller attaches this node's volumes (VolumeAttachments);
            # the node only waits for them.
            metadata["annotations"] = {CONTROLLER_MANAGED_ATTACH_DETACH: "true"}
        spec: dict[str, Any] = {}
        if self._kubelet.register_with_taints:
            spec["taints"] = [t.model_dump(exclude_defaults=True, exclude_none=True, by_alias=True)
                              for t in self._kubelet.register_with_taints]
        if self._kubelet.provider_id:
            spec["providerID"] = self._kubelet.provider_id
        return {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": spec}

    async def register(self) -> None:
        """Create the Node, or adopt the existing one (labels updated), then write its status.
        With ``registerNode: false`` the Node is only adopted: until someone creates it, the
        status waits (and says so)."""
        body = self.initial()
        labels = body["metadata"]["labels"]
        if self._kubelet.register_node is False:
            created = await self._api.get(Node, self.name)  # NotFound: retried with back-off
            log.info("registerNode is false; adopted the existing node", node=self.name)
        else:
            try:
                created = await self._api.create(Node.from_dict(body))
                log.info("node registered", node=self.name)
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                created = await self._api.patch(Node, self.name, {"metadata": {
                    "labels": labels, "annotations": body["metadata"].get("annotations")}},
                    patch_type=PatchType.MERGE)
                log.info("node exists; updated it", node=self.name)
        self.uid = created.metadata.uid
        # A restarted agent keeps the transition times the Node already shows.
        for condition in (created.status.conditions if created.status else None) or []:
            if condition.lastTransitionTime is not None:
                self._transitions.setdefault(condition.type, (condition.status, rfc3339(
                    condition.lastTransitionTime.timestamp())))
        self._reported = None  # write the full status now
        self.registered.set()

    async def update(self) -> None:
        """Write the status if it changed or is due; re-register a Node that was deleted."""
        self._reported_volumes.take_request()
        status = await self.compute()
        now = self._clock.monotonic()
        if status == self._reported and now - self._reported_at < self._kubelet.node_status_report_frequency:
            return
        stamped = self._stamp(status)
        try:
            await self._api.patch(Node.Status, self.name, {"status": stamped}, patch_type=PatchType.STRATEGIC)
        except Exception as exc:
            if is_not_found(exc):
                log.warning("node object is gone; registering again", node=self.name)
                self.uid = None
            raise
        self._events(status)
        self._reported_volumes.mark(status["volumesInUse"])
        self._reported, self._reported_at = status, now
        self.writes += 1

    # --- what the status says ----------------------------------------------------------

    def labels(self) -> dict[str, str]:
        return {**node_labels(self.name), **dict(self._node.labels)}

    async def _version(self) -> None:
        """containerRuntimeVersion; until the runtime answers, empty (and Ready says why)."""
        with anyio.move_on_after(RUNTIME_CHECK_SECONDS):
            try:
                info = await self._runtime.version()
                self._runtime_version = f"{info.runtime_name}://{info.runtime_version}"
            except Exception as exc:  # noqa: BLE001 - Ready says what is wrong
                log.debug("CRI Version failed", error=str(exc))

    async def compute(self) -> dict[str, Any]:
        """The status without heartbeat or transition times."""
        if not self._runtime_version:
            await self._version()
        capacity, allocatable = resources(self._config, self._node)
        ready, message = await self._readiness()
        conditions = [self._condition(t, reported) for t, reported in self._pressures().items()]
        conditions.append({"type": "Ready", "status": "True" if ready else "False",
                           "reason": "KubeletReady" if ready else "KubeletNotReady",
                           "message": "kubelet is posting ready status" if ready else message})
        return {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [*({"type": "InternalIP", "address": ip} for ip in (self._node.ips or (self._node.ip,))),
                          {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self._kubelet_port()}},
            "declaredFeatures": list(DECLARED_FEATURES),
            "images": await self._images(),
            "runtimeHandlers": await self._runtime_handlers(),
            "volumesInUse": sorted(self._volumes_in_use()),
            "nodeInfo": {
                "machineID": _read("/etc/machine-id"),
                "systemUUID": _read("/sys/class/dmi/id/product_uuid"),
                "bootID": _read("/proc/sys/kernel/random/boot_id"),
                "kernelVersion": platform.release(),
                "osImage": _os_image(),
                "containerRuntimeVersion": self._runtime_version,
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": architecture(),
            },
        }

    async def _images(self) -> list[dict[str, Any]]:
        """The images the runtime holds, largest first, each with up to five names (digests,
        then tags), at most nodeStatusMaxImages of them: the kubelet's list, which the
        scheduler's ImageLocality scoring reads. Empty while the runtime does not answer."""
        try:
            images = await self._runtime.list_images()
        except Exception as exc:  # noqa: BLE001 - Ready says what is wrong with the runtime
            log.debug("CRI ListImages failed", error=str(exc))
            return []
        images.sort(key=lambda image: image.size, reverse=True)
        limit = self._kubelet.node_status_max_images if self._kubelet.node_status_max_images is not None else 50
        if limit > -1:
            images = images[:limit]
        return [{"names": [*image.repo_digests, *image.repo_tags][:MAX_NAMES_PER_IMAGE], "sizeBytes": image.size}
                for image in images]

    async def _runtime_handlers(self) -> list[dict[str, Any]]:
        """status.runtimeHandlers: the runtime's handlers and their features, from CRI Status
        (empty on runtimes that report none, such as containerd 1.6). While the runtime does
        not answer, the last list stands (Ready says what is wrong)."""
        with anyio.move_on_after(RUNTIME_CHECK_SECONDS):
            try:
                caps = await self._runtime.capabilities()
            except Exception as exc:  # noqa: BLE001 - Ready says what is wrong with the runtime
                log.debug("CRI Status failed", error=str(exc))
            else:
                self._handlers = [
                    {"name": h.name, "features": {
                        "recursiveReadOnlyMounts": bool(h.features and h.features.recursive_read_only_mounts),
                        "userNamespaces": bool(h.features and h.features.user_namespaces)}}
                    for h in caps.runtime_handlers]
        return self._handlers

    async def _readiness(self) -> tuple[bool, str]:
        problems: list[str] = []
        status = None
        with anyio.move_on_after(RUNTIME_CHECK_SECONDS):
            try:
                status = await self._runtime.status()
            except Exception as exc:  # noqa: BLE001 - becomes the Ready message
                problems.append(f"container runtime is down: {exc}")
        if status is None and not problems:
            problems.append(f"container runtime did not answer Status within {RUNTIME_CHECK_SECONDS:g}s")
        if status is not None:
            for kind in ("RuntimeReady", "NetworkReady"):
                cond = status.condition(kind)
                if cond is None or not cond.status:
                    reason = cond.reason if cond else "NotReported"
                    text = cond.message if cond else "the runtime did not report it"
                    what = "network" if kind == "NetworkReady" else "runtime"
                    problems.append(f"container runtime {what} not ready: {kind}=false reason:{reason} message:{text}")
        reported = self._conditions.get("Ready")
        if reported is not None and not reported.status:
            problems.append(reported.message or reported.reason)
        healthy, last = self._relister_health()
        age = time.time() - last if last else None
        if not healthy or age is None or age > PLEG_THRESHOLD_SECONDS:
            seen = f"was last seen active {age:.0f}s ago" if age is not None else "has not relisted yet"
            problems.append(f"PLEG is not healthy: pleg {seen}; threshold is {PLEG_THRESHOLD_SECONDS:.0f}s")
        return not problems, "; ".join(problems)

    def _pressures(self) -> dict[str, Condition | None]:
        return {kind: self._conditions.get(kind) for kind in _CONDITIONS}

    @staticmethod
    def _condition(kind: str, reported: Condition | None) -> dict[str, str]:
        no_reason, no_message, yes_reason, yes_message = _CONDITIONS[kind]
        pressure = reported is not None and reported.status
        reason = (reported.reason if reported is not None else "") or (yes_reason if pressure else no_reason)
        message = (reported.message if reported is not None else "") or (yes_message if pressure else no_message)
        return {"type": kind, "status": "True" if pressure else "False", "reason": reason, "message": message}

    def _stamp(self, status: Mapping[str, Any]) -> dict[str, Any]:
        now = rfc3339(self._clock.now())
        conditions = []
        for condition in status["conditions"]:
            before = self._transitions.get(condition["type"])
            since = before[1] if before is not None and before[0] == condition["status"] else now
            self._transitions[condition["type"]] = (condition["status"], since)
            conditions.append({**condition, "lastHeartbeatTime": now, "lastTransitionTime": since})
        return {**status, "conditions": conditions}

    def _events(self, status: Mapping[str, Any]) -> None:
        if self._record_event is None:
            return
        before = {c["type"]: c["status"] for c in (self._reported or {}).get("conditions", [])}
        for condition in status["conditions"]:
            if before.get(condition["type"]) != condition["status"]:
                reason = _TRANSITION_EVENTS.get((condition["type"], condition["status"]))
                if reason:
                    self._record_event("Normal", reason, f"Node {self.name} status is now: {reason}")
