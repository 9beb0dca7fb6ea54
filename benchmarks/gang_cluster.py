"""The gang end to end (issue 20): the real kube-scheduler places a Workload/PodGroup gang whose
members each claim G fake GPUs, on N nodes that each run nodeagent, a private containerd and the
fake GPU DRA driver; the node barrier makes the bound members start together or not at all.

Used by ``python -m benchmarks.gang --nodes 8 --gpus 8`` (figures) and tests/test_gang_e2e.py
(the CI-sized scenario and the failure injections). One :class:`GangCluster` is:

* a control plane (the caller's) serving ``scheduling.k8s.io`` (Workload, PodGroup) with the
  scheduler's GangScheduling plugin on (controlplane/cluster.py GANG_FEATURE_GATES); the version
  is discovered from the API server and must be one nodeagent's gang stage reads
  (nodeagent/objects/kinds.py);
* per node: a private containerd (devenv.Containerd: own state, socket, pod subnet, CDI dir),
  ``python -m nodeagent run`` as its own process on the node's credentials (so it can be
  SIGKILLed, and its CPU and RSS read from /proc), and the fake GPU driver (drivers/fakegpu) in
  this process on the node's credentials, publishing G devices in the node's ResourceSlice;
* a monitor that lists every node's CRI (sandboxes, containers, each container's start time) and
  the driver's prepared state (CDI specs on disk) every 100 ms, so the invariants are read from
  the runtimes, not from the agents' bookkeeping;
* a watch of the gang's pods in the API, recording when each was first seen bound, voting,
  committed or failed (the times the figures are measured from).

Times are wall-clock (one machine: containerd, the agents and this process share the clock).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
from lightkube import operators
from lightkube.resources.core_v1 import Event as ApiEvent
from lightkube.resources.core_v1 import Pod as ApiPod

from controlplane import ControlPlane
from cri import CriError, RuntimeClient
from devenv import Containerd, build_images, ensure_packages
from devenv.images import BUSYBOX_IMAGE
from drivers.fakegpu import CDI_KIND, DRIVER_NAME, FakeGpuDriver
from drivers.fakegpu.cluster import MODEL
from nodeagent import labels as L
from nodeagent.apiclient import make_api_client
from nodeagent.config import AgentConfig
from nodeagent.objects import kinds
from nodeagent.registry import DEFAULT_PROFILE
from plugins.dra.state import ClaimCache

log = structlog.get_logger("benchmarks.gang_cluster")

REPO = Path(__file__).resolve().parent.parent
RBAC = REPO / "plugins" / "gang" / "deploy" / "rbac.yaml"
LABEL = "gang-e2e"
TEMPLATE_NAME = "workers"
GRACEFUL = "trap 'exit 0' TERM; while true; do sleep 1; done"
PREPARED = "gang.nodeagent.io/Prepared"
COMMITTED = "gang.nodeagent.io/StartCommitted"
POLL_SECONDS = 0.1
DRA_TUNING = {"pollSeconds": 0.2}
"""The registry is looked at every 0.2 s (drivers register at once); GetInfo health checks at the
default 10 s: the drivers share this process's event loop with the monitor, and on a loaded
machine a 1 s check deregisters a driver that is only slow."""


def served_version(cp: ControlPlane) -> str:
    """The scheduling.k8s.io version the API server serves for Workload and PodGroup that
    nodeagent's gang stage reads too (the first of its versions, newest first, that is served)."""
    discovery = json.loads(cp.kubectl("get", "--raw", "/apis/scheduling.k8s.io").stdout)
    served = {v["version"] for v in discovery.get("versions", [])}
    for version in kinds.POD_GROUP.versions:
        if version in served and version in kinds.WORKLOAD.versions:
            resources = json.loads(cp.kubectl("get", "--raw", f"/apis/scheduling.k8s.io/{version}").stdout)
            names = {r["name"] for r in resources.get("resources", [])}
            if {"podgroups", "workloads"} <= names:
                return version
    raise RuntimeError(f"the API server serves scheduling.k8s.io {sorted(served)}: no Workload/PodGroup "
                       f"version nodeagent reads ({kinds.POD_GROUP.versions})")


def device_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER_NAME},
            "spec": {"selectors": [{"cel": {"expression":
                                            f'device.driver == "{DRIVER_NAME}" && '
                                            f'device.attributes["{DRIVER_NAME}"].model == "{MODEL}"'}}]}}


# --- what the runtimes showed --------------------------------------------------------------------


@dataclass
class Seen:
    pod: str
    container: str
    attempt: int
    created_at: int
    started_at: int
    """ns since the epoch (CRI ContainerStatus); 0 while created but not started."""


@dataclass
class Violation:
    at: float
    what: str


@dataclass
class Node:
    """One machine: its containerd, its agent process, its driver and what its runtime showed."""

    index: int
    name: str
    runtime: Containerd
    base: Path
    port: int
    gpus: int
    client: RuntimeClient | None = None
    driver: FakeGpuDriver | None = None
    proc: subprocess.Popen[bytes] | None = None
    containers: dict[str, Seen] = field(default_factory=dict)
    sandboxes: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Sandbox id -> (pod name, created_at ns): every sandbox the runtime showed."""
    live: set[str] = field(default_factory=set)
    """Sandbox ids listed by the last poll."""
    prepared: dict[str, set[str]] = field(default_factory=dict)
    """Claim UID -> devices, from the driver's CDI specs at the last poll."""
    cpu_start: float = 0.0

    @property
    def config_path(self) -> Path:
        return self.base / "agent.yaml"

    @property
    def log_path(self) -> Path:
        return self.base / "agent.log"

    @property
    def checkpoint(self) -> Path:
        return self.base / "root" / "dra_manager_state"

    def start_agent(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT dumps every thread's stack into the log (stop_agent)
        # GANG_AGENT_PROFILE=DIR: each agent under cProfile, DIR/<node>.pstats written at its
        # orderly stop (its timings are then inflated: for where the CPU goes, not for figures).
        profile = os.environ.get("GANG_AGENT_PROFILE")
        python = [sys.executable, *(["-m", "cProfile", "-o", str(Path(profile) / f"{self.name}.pstats")]
                                    if profile else [])]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([*python, "-m", "nodeagent", "run", "--config", str(self.config_path),
                                          "--log-format", "json", *(["-v"] if os.environ.get("GANG_E2E_VERBOSE") else [])],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=REPO, env=env)
            # No core file from the SIGABRT that dumps a stuck agent's stacks. Set from here, not
            # in a preexec_fn: Python code between fork and exec in this multi-threaded, gRPC-using
            # process can hang the child before it runs the agent (seen in CI).
            with contextlib.suppress(ProcessLookupError):  # gone already: its exit is seen later
                resource.prlimit(self.proc.pid, resource.RLIMIT_CORE, (0, 0))

    def kill_agent(self) -> None:
        """SIGKILL: what a crash does; nothing is torn down."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def interrupt_agent(self) -> None:
        """SIGINT: the agent's orderly shutdown begins (:meth:`stop_agent` waits for it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def dump_tasks(self) -> None:
        """SIGUSR1: the agent writes where each of its tasks waits under its root's debug/
        (nodeagent.taskdump) and runs on."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)

    def task_dumps(self) -> list[Path]:
        return sorted((self.base / "root" / "debug").glob("tasks-*.txt"))

    def stop_agent(self, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.interrupt_agent()
        try:
            self.proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            # Where it hangs: faulthandler writes every thread's stack on SIGABRT.
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            tail = self.log_path.read_text(errors="replace").splitlines()[-60:]
            log.warning("agent did not stop in time; killed", node=self.name, log=str(self.log_path),
                        log_tail="\n".join(tail))

    def cpu_seconds(self) -> float:
        """utime + stime of the agent process so far (/proc/PID/stat, clock ticks)."""
        if self.proc is None:
            return 0.0
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) of the agent process, MiB."""
        if self.proc is None:
            return 0.0, 0.0
        values: dict[str, float] = {}
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0]) / 1024
        except OSError:
            pass
        return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)

    async def metrics(self) -> str:
        def get() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as resp:
                return str(resp.read().decode())
        return await anyio.to_thread.run_sync(get)

    async def poll(self) -> None:
        assert self.client is not None
        try:
            sandboxes = await self.client.list_pod_sandbox()
            containers = await self.client.list_containers()
        except CriError:
            return
        self.live = set()
        for s in sandboxes:
            if s.labels.get(L.MANAGED_BY) == self.name:
                self.live.add(s.id)
                self.sandboxes.setdefault(s.id, (s.labels.get(L.POD_NAME, ""), s.created_at))
        for c in containers:
            if c.labels.get(L.MANAGED_BY) != self.name:
                continue
            known = self.containers.get(c.id)
            if known is not None and known.started_at:
                continue
            try:
                status = await self.client.container_status(c.id)
            except CriError:
                continue
            self.containers[c.id] = Seen(c.labels.get(L.POD_NAME, ""), c.labels.get(L.CONTAINER_NAME, ""),
                                         c.metadata.attempt, status.created_at, status.started_at)
        self.prepared = read_prepared(self.runtime.cdi_spec_dir)

    def seen(self, pods: Sequence[str]) -> list[Seen]:
        return [s for s in self.containers.values() if s.pod in pods]

    def live_sandboxes(self, pods: Sequence[str]) -> list[str]:
        return [sid for sid in self.live if self.sandboxes[sid][0] in pods]

    def checkpoint_claims(self) -> list[str]:
        """Claim UIDs in the agent's DRA checkpoint (the kubelet's dra_manager_state)."""
        cache = ClaimCache(self.checkpoint)
        try:
            cache.load()
        except Exception:  # noqa: BLE001 - being rewritten; the next poll reads it
            return []
        return sorted(cache.entries)


def read_prepared(cdi_dir: Path) -> dict[str, set[str]]:
    """The fake driver's prepared state: claim UID -> device names, one CDI spec per claim."""
    prefix = CDI_KIND.replace("/", "-") + "_"
    out: dict[str, set[str]] = {}
    for path in cdi_dir.glob(f"{prefix}*.json"):
        try:
            spec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written (atomically) or removed
        uid = path.name[len(prefix):-len(".json")]
        out[uid] = {d["name"].rsplit("-", 1)[1] for d in spec.get("devices", [])}
    return out


# --- what the API showed ---------------------------------------------------------------------------


@dataclass
class Member:
    """A gang pod as the API showed it: when each fact was first seen by the watch."""

    name: str
    node: str = ""
    created: float = 0.0
    bound: float = 0.0
    voted: float = 0.0
    failed: float = 0.0
    running: float = 0.0
    deleted: float = 0.0
    reason: str = ""
    message: str = ""
    record: dict[str, Any] = field(default_factory=dict)
    vote: dict[str, Any] = field(default_factory=dict)
    record_seen: float = 0.0
    pod: dict[str, Any] = field(default_factory=dict)
    failed_as: dict[str, Any] = field(default_factory=dict)
    """What the API showed when it first said Failed: the status's reason and conditions, and
    which managers had written the pod's status (its managedFields), to tell the writer."""


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


@dataclass
class Gang:
    name: str
    members: list[str]
    min_count: int
    gpus: int
    created: float
    """When the Workload was created (wall time)."""
    gang: bool = True


# --- the cluster ----------------------------------------------------------------------------------------


class GangCluster:
    """N nodes of G GPUs against ``cp``; see the module docstring. Use :func:`gang_cluster`."""

    def __init__(self, cp: ControlPlane, runtimes: Sequence[Containerd], gpus: int, workdir: Path,
                 gang_plugin: dict[str, Any] | None = None, *, barrier: bool = True) -> None:
        self.cp = cp
        self.barrier = barrier
        """False: the agents run without the gang stage (what the tests must fail against)."""
        self.gpus = gpus
        self.workdir = workdir
        self.gang_plugin = gang_plugin or {}
        self.version = ""
        self.api: Any = None
        self.nodes = [Node(i, f"g{uuid.uuid4().hex[:6]}-n{i}", rt, workdir / f"n{i}", _free_port(), gpus)
                      for i, rt in enumerate(runtimes)]
        self.pods: dict[str, Member] = {}
        self.violations: list[Violation] = []
        self.gangs: list[Gang] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._observers = anyio.CancelScope()
        """The monitor and the watch: cancelled before the nodes' CRI clients close."""
        self._driver_scopes: dict[int, anyio.CancelScope] = {}

    # -- set-up -----------------------------------------------------------------------------------

    def agent_config(self, node: Node) -> AgentConfig:
        kubeconfig = self.cp.node_kubeconfig(node.name)
        (node.base / "manifests").mkdir(parents=True, exist_ok=True)
        profile = {phase: [s for s in stages if self.barrier or s != "gang"] for phase, stages in DEFAULT_PROFILE.items()}
        return AgentConfig(profile=profile,
            node_name=node.name, kubeconfig=kubeconfig, container_runtime_endpoint=node.runtime.endpoint,
            static_pod_path=node.base / "manifests", root_dir=node.base / "root", pod_logs_dir=node.base / "logs",
            container_logs_symlink_dir=node.base / "containers", healthz_port=node.port, enable_server=False,
            node_lease_duration_seconds=8, node_status_update_frequency=1.0,
            plugins_registry_dir=node.base / "registry", cdi_spec_dirs=[node.runtime.cdi_spec_dir],
            plugins={"dra": DRA_TUNING, "gang": {"graceSeconds": 5, "recheckSeconds": 2, **self.gang_plugin}})

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self.version = await anyio.to_thread.run_sync(served_version, self.cp)
        await self.kubectl("apply", "-f", str(RBAC))
        await self.apply(device_class())
        self.api = make_api_client(self.cp.kubeconfig_admin)
        for node in self.nodes:
            node.base.mkdir(parents=True, exist_ok=True)
            config = await anyio.to_thread.run_sync(self.agent_config, node)
            node.config_path.write_text(config.to_yaml())
            node.client = RuntimeClient(node.runtime.endpoint)
            await node.client.connect()
            node.start_agent()
            await self.start_driver(node)
        tg.start_soon(self._observe)
        await self.wait_ready(*self.nodes)

    async def start_driver(self, node: Node) -> None:
        assert self._tg is not None
        kubeconfig = await anyio.to_thread.run_sync(self.cp.node_kubeconfig, node.name)
        api = make_api_client(kubeconfig, field_manager="fakegpu")
        driver = FakeGpuDriver(registry_dir=node.base / "registry", plugin_dir=node.base / "plugin",
                               cdi_dir=node.runtime.cdi_spec_dir, devices=self.gpus, api=api, node_name=node.name)
        node.driver = driver

        async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            try:
                with anyio.CancelScope() as scope:
                    self._driver_scopes[node.index] = scope
                    await driver.run(task_status=task_status)
            finally:
                with anyio.CancelScope(shield=True):
                    await api.close()

        await self._tg.start(run)

    async def wait_ready(self, *nodes: Node, timeout: float = 120) -> None:
        """The Nodes Ready and untainted, and each one's ResourceSlice with G devices in the API.
        One listing of each kind per look, every 0.5 s: eight nodes polled one by one with kubectl
        at 10 Hz took a core from the agents that were starting."""
        waiting = {node.name: node for node in nodes}

        async def ready() -> bool:
            for node in waiting.values():
                if node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(f"{node.name}'s agent exited {node.proc.returncode}; see {node.log_path}")
            listed = await self.get_json("nodes")
            slices = await self.get_json("resourceslices")
            devices = {s["spec"].get("nodeName"): len(s["spec"].get("devices") or [])
                       for s in (slices or {}).get("items", []) if s["metadata"]["name"].endswith(f"-{DRIVER_NAME}")}
            for obj in (listed or {}).get("items", []):
                name = obj["metadata"]["name"]
                if name not in waiting:
                    continue
                conditions = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
                taints = (obj.get("spec") or {}).get("taints") or []
                if conditions.get("Ready") == "True" and devices.get(name) == self.gpus \
                        and not any(t["key"].startswith("node.kubernetes.io/") for t in taints):
                    del waiting[name]
            return not waiting

        await until(ready, timeout, lambda: f"nodes {sorted(waiting)} Ready with their {self.gpus} devices published",
                    interval=0.5)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                names = [n for n, m in self.pods.items() if not m.deleted]
                for name in names:
                    await self.kubectl("delete", "pod", name, "--grace-period=0", "--force", "--wait=false",
                                       check=False)
                for node in self.nodes:
                    if node.proc is None:
                        node.start_agent()
                with anyio.move_on_after(60):
                    await until(lambda: _true(self.quiet()), 60, "every node's runtime empty")
            finally:
                self._observers.cancel()
                # Every agent shuts down at once (one after another costs seconds per node).
                for node in self.nodes:
                    node.interrupt_agent()
                deadline = time.monotonic() + 30
                for node in self.nodes:
                    await anyio.to_thread.run_sync(lambda n=node: n.stop_agent(deadline - time.monotonic()))
                for scope in self._driver_scopes.values():
                    scope.cancel()
                for node in self.nodes:
                    if node.client is not None:
                        await node.client.close()
                names = [node.name for node in self.nodes]
                await self.kubectl("delete", "node", *names, "--wait=false", check=False)
                await self.kubectl("-n", "kube-node-lease", "delete", "lease", *names, "--wait=false", check=False)
                if self.api is not None:
                    await self.api.close()

    # -- the gang -------------------------------------------------------------------------------------

    async def create_gang(self, members: int, *, min_count: int | None = None, gang: bool = True,
                          image: str = BUSYBOX_IMAGE, name: str | None = None, create: int | None = None,
                          on: dict[int, str] | None = None) -> Gang:
        """A Workload (one pod-group template ``workers``, gang policy minCount), its PodGroup,
        a ResourceClaimTemplate for G GPUs and ``members`` pods naming the PodGroup in
        spec.schedulingGroup; no spec.nodeName: the scheduler places them. ``gang=False``: the
        same pods without Workload, PodGroup or schedulingGroup (the comparison). ``create``: only
        the first that many pods now (:meth:`add_members` the rest)."""
        name = name or f"g{uuid.uuid4().hex[:6]}"
        min_count = members if min_count is None else min_count
        group = f"scheduling.k8s.io/{self.version}"
        template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                        "deviceClassName": DRIVER_NAME, "allocationMode": "ExactCount", "count": self.gpus}}]}}}}
        await self.apply(template)
        created = time.time()
        if gang:
            await self.apply(
                {"apiVersion": group, "kind": "Workload", "metadata": {"name": name, "namespace": "default"},
                 "spec": {"podGroupTemplates": [{"name": TEMPLATE_NAME,
                                                 "schedulingPolicy": {"gang": {"minCount": min_count}}}]}},
                {"apiVersion": group, "kind": "PodGroup", "metadata": {"name": name, "namespace": "default"},
                 "spec": {"workloadRef": {"workloadName": name, "templateName": TEMPLATE_NAME},
                          "schedulingPolicy": {"gang": {"minCount": min_count}}}})
        result = Gang(name, [], min_count, self.gpus, created, gang)
        self.gangs.append(result)
        await self.add_members(result, range(members if create is None else create), image=image, on=on)
        return result

    async def add_members(self, gang: Gang, indexes: Sequence[int] | range, *, image: str = BUSYBOX_IMAGE,
                          on: dict[int, str] | None = None) -> list[str]:
        """Pods ``<gang>-<i>``; ``on``: member index -> the node it must go to (a required node
        affinity on kubernetes.io/hostname: the scheduler still places it, with the gang)."""
        pods: list[dict[str, Any]] = []
        names: list[str] = []
        for i in indexes:
            pod = f"{gang.name}-{i}"
            spec: dict[str, Any] = {
                "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 2,
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": gang.name}],
                "containers": [{"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                                "command": ["sh", "-c", GRACEFUL], "resources": {"claims": [{"name": "gpus"}]}}]}
            if gang.gang:
                spec["schedulingGroup"] = {"podGroupName": gang.name}
            if on and i in on:
                spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [on[i]]}]}]}}}
            pods.append({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": pod, "namespace": "default", "labels": {LABEL: gang.name}},
                         "spec": spec})
            self.pods[pod] = Member(pod, created=time.time())
            gang.members.append(pod)
            names.append(pod)
        if pods:
            await self.apply(*pods)
        return names

    async def delete_gang(self, gang: Gang) -> None:
        await self.kubectl("delete", "pods", "-l", f"{LABEL}={gang.name}", "--wait=false")
        if gang.gang:
            await self.kubectl("delete", f"podgroups.{self.version}.scheduling.k8s.io", gang.name, "--wait=false",
                               check=False)
            await self.kubectl("delete", f"workloads.{self.version}.scheduling.k8s.io", gang.name, "--wait=false",
                               check=False)

    # -- observing ------------------------------------------------------------------------------------

    def member_nodes(self, pods: Sequence[str]) -> dict[str, Node]:
        out = {}
        for node in self.nodes:
            for pod, _ in node.sandboxes.values():
                if pod in pods:
                    out[pod] = node
        return out

    def started(self, pods: Sequence[str]) -> list[Seen]:
        return [s for n in self.nodes for s in n.seen(pods) if s.started_at]

    def quiet(self, pods: Sequence[str] | None = None) -> bool:
        """Nothing held on any node (``pods``: on the nodes that ran them, nothing of theirs in
        the runtime; no claim prepared by the driver nor in the DRA checkpoint)."""
        nodes = self.nodes if pods is None else list({id(n): n for n in self.member_nodes(pods).values()}.values())
        for node in nodes:
            live = node.live if pods is None else set(node.live_sandboxes(pods))
            if live or node.prepared or node.checkpoint_claims():
                return False
        return True

    def describe(self, pods: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Where each pod stands as the API last showed it: its node (None: not bound yet), phase
        and reason, its vote and record conditions: what a timeout message needs to say which
        step never came."""
        out: dict[str, dict[str, Any]] = {}
        for name in pods:
            m = self.pods.get(name)
            if m is None:
                out[name] = {"seen": False}
                continue
            status = m.pod.get("status") or {}
            out[name] = {"node": m.node or None, "phase": status.get("phase"),
                         "reason": status.get("reason") or None,
                         "vote": {k: m.vote.get(k) for k in ("status", "reason", "message")} if m.vote else None,
                         "record": {k: m.record.get(k) for k in ("status", "reason")} if m.record else None,
                         "conditions": {c["type"]: c["status"] for c in status.get("conditions") or []}}
        return out

    def held(self) -> dict[str, Any]:
        """What is still held on each node: sandboxes, prepared claims, checkpoint entries."""
        return {n.name: {"sandboxes": sorted(n.sandboxes[s][0] for s in n.live), "prepared": sorted(n.prepared),
                         "checkpoint": n.checkpoint_claims(),
                         "driver calls": [(c.method, c.claims) for c in (n.driver.calls if n.driver else [])]}
                for n in self.nodes
                if n.live or n.prepared or n.checkpoint_claims()}

    async def _observe(self) -> None:
        with self._observers:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._monitor)
                tg.start_soon(self._watch)

    async def _monitor(self) -> None:
        while True:
            for node in self.nodes:
                try:
                    await node.poll()
                except Exception as exc:  # noqa: BLE001 - the monitor must outlive a node's bad moment
                    log.warning("polling a node failed", node=node.name, error=str(exc))
            self._check_devices()
            await anyio.sleep(POLL_SECONDS)

    def _check_devices(self) -> None:
        """Each GPU prepared for at most one claim at a time (driver state, every poll)."""
        for node in self.nodes:
            owners: dict[str, str] = {}
            for uid, devices in node.prepared.items():
                for device in devices:
                    if device in owners and owners[device] != uid:
                        self.violations.append(Violation(time.time(), f"{node.name}/{device} prepared for "
                                                                     f"claims {owners[device]} and {uid}"))
                    owners[device] = uid

    def check_all_or_nothing(self, pods: Sequence[str], *, gang: bool = True) -> list[Seen]:
        """Runtime evidence: either no member container ever started on any node, or every
        member's did, each once (one container instance, attempt 0), none before the last member's
        sandbox existed (``gang``; plain pods start as they come). Returns the starts. (A member
        waiting at the barrier has its containers created ahead: created is not started.)"""
        seen = [s for n in self.nodes for s in n.seen(pods)]
        started = [s for s in seen if s.started_at]
        if not started:
            return []
        per_pod: dict[str, list[Seen]] = {}
        for s in seen:
            per_pod.setdefault(s.pod, []).append(s)
        assert sorted(per_pod) == sorted(pods), \
            f"partial start: containers of {sorted(per_pod)} ran, of {sorted(set(pods) - set(per_pod))} not"
        for pod, instances in per_pod.items():
            assert len(instances) == 1 and instances[0].attempt == 0, f"{pod} started more than once: {instances}"
            assert instances[0].started_at, f"{pod}: created but never started"
        last_sandbox = max(created for n in self.nodes for p, created in n.sandboxes.values() if p in pods)
        early = [s for s in started if s.started_at < last_sandbox]
        assert not gang or not early, f"started before the last member's sandbox existed: {early}"
        return started

    async def _watch(self) -> None:
        """Every gang pod's facts as first seen in the API; survives the API server's absence."""
        while True:
            try:
                async for op, pod in self.api.watch(ApiPod, namespace="default", labels={LABEL: operators.exists()}):
                    self._saw(op, pod.to_dict())
            except Exception as exc:  # noqa: BLE001 - the API server may be away (tests stop it)
                log.info("pod watch ended; again", error=str(exc))
            await anyio.sleep(0.2)

    def _saw(self, op: str, pod: dict[str, Any]) -> None:
        now = time.time()
        name = pod["metadata"]["name"]
        m = self.pods.setdefault(name, Member(name, created=now))
        m.pod = pod
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("nodeName") and not m.bound:
            m.bound, m.node = now, spec["nodeName"]
        vote = condition(pod, PREPARED)
        if vote:
            m.vote = vote
        if vote.get("status") == "True" and not m.voted:
            m.voted = now
        record = condition(pod, COMMITTED)
        if record and record != m.record:
            m.record, m.record_seen = record, now
        if status.get("phase") == "Running" and not m.running:
            m.running = now
        if status.get("phase") == "Failed" and not m.failed:
            m.failed, m.reason, m.message = now, status.get("reason", ""), status.get("message", "")
            m.failed_as = {
                "op": op, "reason": status.get("reason"),
                "conditions": [(c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or []],
                "status_writers": [(f.get("manager"), f.get("time")) for f in
                                   (pod.get("metadata") or {}).get("managedFields") or []
                                   if f.get("subresource") == "status"],
            }
        if op == "DELETED":
            m.deleted = m.deleted or now

    async def pod_events(self, pods: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The core/v1 Events about these pods (what ``kubectl describe pod`` lists), by pod,
        oldest first."""
        out: dict[str, list[dict[str, Any]]] = {p: [] for p in pods}
        async for obj in self.api.list(ApiEvent, namespace="default", fields={"involvedObject.kind": "Pod"}):
            event = obj.to_dict()
            about = event.get("involvedObject") or {}
            if about.get("name") in out:
                out[about["name"]].append(event)
        for events in out.values():
            events.sort(key=lambda e: str(e.get("firstTimestamp") or ""))
        return out

    # -- API helpers ----------------------------------------------------------------------------------

    async def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        def run() -> subprocess.CompletedProcess[str]:
            return self.cp.kubectl(*args, check=check, input=input)
        return await anyio.to_thread.run_sync(run)

    async def apply(self, *objects: dict[str, Any]) -> None:
        await self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))

    async def get_json(self, *args: str) -> Any:
        proc = await self.kubectl("get", *args, "-o", "json", check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise RuntimeError(f"kubectl get {' '.join(args)}: {proc.stderr}")
        return json.loads(proc.stdout)


def start_runtimes(count: int, under: Path = Path("/tmp")) -> list[Containerd]:
    """``count`` private containerds with the test images, started one after another so that
    each derives a pod subnet no running one uses, each with its root and state in a directory
    made ``under``. Blocking (the caller's thread)."""
    ensure_packages(log=False)
    archives = build_images()
    envs: list[Containerd] = []
    try:
        for _ in range(count):
            env = Containerd(Path(tempfile.mkdtemp(prefix="na-ge2e-", dir=under)))
            envs.append(env)
            env.start()
            env.import_images(archives)
        assert len({e.subnet for e in envs}) == count, [e.subnet for e in envs]
    except BaseException:
        stop_runtimes(envs, keep=True)
        raise
    return envs


def stop_runtimes(envs: Sequence[Containerd], *, keep: bool = False) -> None:
    """Stop them; their directories (logs, state) are removed unless ``keep``."""
    for env in envs:
        env.stop()
        if not keep:
            shutil.rmtree(env.base_dir, ignore_errors=True)


@asynccontextmanager
async def private_runtimes(count: int, *, keep: Callable[[], bool] = lambda: False,
                           under: Path = Path("/tmp")) -> AsyncIterator[list[Containerd]]:
    """:func:`start_runtimes` for the length of the block; removed at the end unless ``keep()``."""
    envs = await anyio.to_thread.run_sync(start_runtimes, count, under)
    try:
        yield envs
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: stop_runtimes(envs, keep=keep()))


@asynccontextmanager
async def gang_cluster(cp: ControlPlane, runtimes: Sequence[Containerd], gpus: int, workdir: Path,
                       gang_plugin: dict[str, Any] | None = None, *, barrier: bool = True) -> AsyncIterator[GangCluster]:
    cluster = GangCluster(cp, runtimes, gpus, workdir, gang_plugin, barrier=barrier)
    async with anyio.create_task_group() as tg:
        try:
            await cluster.start(tg)
            yield cluster
        finally:
            with anyio.CancelScope(shield=True):
                await cluster.close()
            tg.cancel_scope.cancel()


async def until(check: Callable[[], Any], timeout: float, what: str | Callable[[], str],
                interval: float = 0.1) -> Any:
    """``await check()`` until truthy; ``what`` (or what it returns, at the timeout) says what for."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what if isinstance(what, str) else what()}")
        await anyio.sleep(interval)


async def _true(value: bool) -> bool:
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


__all__ = ["Gang", "GangCluster", "Member", "Node", "Seen", "gang_cluster", "private_runtimes", "served_version",
           "start_runtimes", "stop_runtimes", "until"]
