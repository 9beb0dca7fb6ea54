"""An agent under test: the real :class:`nodeagent.agent.Agent`, on a CRI runtime, with a plugin.

:func:`open_harness` runs what production runs — the agent's worker, admission cycle, relister,
status writer and the registry's pipeline, built from the entry points — standalone, with static
manifests in a temporary directory and ``rootDir``/``podLogsDir`` under it, against either the
in-memory CRI runtime (:mod:`conformance.memruntime`: no root, no containerd) or a real
containerd. The only additions are the recorder's (:mod:`conformance.recorder`): it sees every
phase call and runtime call and can make a pod's kill arrive at a chosen place of its setup::

    async with open_harness(memory_runtime, tmp_path, "myplugin", {"key": "value"}) as h:
        await h.start_agent()
        pod = h.pod()
        await h.run(pod)                      # a manifest in staticPodPath; the agent picks it up
        assert await h.settle(pod) == "Running"
        await h.delete(pod)                   # the manifest goes; the agent tears the pod down
        await h.wait_gone(pod)
        assert await h.leaks(pod.uid) == []

As a pytest plugin (``pytest_plugins = ["conformance.harness"]`` in your top-level conftest.py)
this module provides the session fixture ``containerd`` (a private containerd with the busybox
and pause images, the one nodeagent's own tests use; a ``containerd`` fixture of your own takes
precedence) — needed only for the suite's containerd runs.
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from logging import WARNING
import os
import shutil
import subprocess
import tempfile
import warnings
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from pathlib import Path
from unittest import mock
from typing import Any, Literal, TypeVar, overload

import anyio
import anyio.abc
import pytest
import structlog

from conformance.memruntime import MemoryRuntime
from conformance.recorder import (
    CANCEL_POINTS,
    MUTATIONS,
    SETUP_PHASES,
    UNDO_PHASES,
    CancelPoint,
    Recorder,
    TracingRuntime,
)
from cri import NotFound, RuntimeClient
from cri import types as t
from devenv.images import BUSYBOX_IMAGE
from nodeagent import labels as L
from nodeagent.agent import Agent, Handle
from nodeagent.config import AgentConfig
from nodeagent.lifecycle import PodState
from nodeagent.model import Pod
from nodeagent import registry
from nodeagent.registry import DEFAULT_PROFILE, Pipeline
from nodeagent.stages import Phase, Verdict, phases_of

T = TypeVar("T")

RUNTIME_TIMEOUT = 30.0
"""Seconds per CRI call: generous for a loaded CI machine, far below the agent's 2 min."""
SETTLE_TIMEOUT = 30.0
"""Seconds a pod may take to reach a settled state (running, rejected, waiting, retrying)."""
GONE_TIMEOUT = 30.0
"""Seconds the agent may take to tear a deleted pod down and forget it."""
RUNTIME_SETTLE_SECONDS = 2.0
"""How long a forgotten pod's runtime objects may take to go (a cancelled call completing)."""
GRACE_SECONDS = 2
"""The test pod's terminationGracePeriodSeconds (its container exits on SIGTERM at once)."""
CAUGHT_UP_SECONDS = 5.0
"""How long :meth:`Harness.quiesce` waits for the agent's view to reach the runtime's."""
IN_FLIGHT_HOLD_SECONDS = 2.0
"""How long the memory runtime holds an ``in-flight`` call before acting (the kill comes sooner)."""

RuntimeKind = Literal["memory", "containerd"]

# A container that runs until SIGTERM and then exits at once, so stopping it costs no grace.
UNTIL_TERM = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
SETTLED = frozenset({PodState.RUNNING, PodState.COMPLETED, PodState.REJECTED, PodState.WAITING,
                     PodState.TERMINATED})
# Methods whose requests name their pod (through an id, a filter or the config): the memory
# runtime can hold exactly that pod's call.
_UNSCOPED = frozenset({"ImageStatus", "ListImages", "PullImage", "RemoveImage", "ImageFsInfo", "Version", "Status",
                       "RuntimeConfig"})
_MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class RuntimeObjects:
    """What the runtime holds for one pod UID (label ``io.kubernetes.pod.uid``)."""

    sandboxes: tuple[t.PodSandbox, ...]
    containers: tuple[t.Container, ...]

    def __bool__(self) -> bool:
        return bool(self.sandboxes or self.containers)

    def describe(self) -> str:
        parts = [f"sandbox {s.id[:13]} ({s.state.name})" for s in self.sandboxes]
        parts += [
            f"container {c.id[:13]} {c.labels.get(L.CONTAINER_NAME, '?')} ({c.state.name})" for c in self.containers
        ]
        return ", ".join(parts) or "nothing"

    def ids(self) -> tuple[frozenset[str], frozenset[str]]:
        return frozenset(s.id for s in self.sandboxes), frozenset(c.id for c in self.containers)


@dataclass
class RuntimeUnderTest:
    """The CRI runtime the agent talks to, and what the harness may do to it."""

    kind: RuntimeKind
    endpoint: str
    memory: MemoryRuntime | None = None
    """The in-memory runtime itself (fault injection, call log, controls), when it is that one."""
    cdi_dir: Path | None = None
    """Where the runtime reads CDI specs (a runtime that resolves CDI itself: containerd 2.x);
    None: a directory of the harness's own (the agent resolves them)."""

    @property
    def pod_cgroups(self) -> bool:
        """cgroupsPerQOS for the agent: only on a real runtime and as root (the kubelet's
        default there), never for the memory runtime (no cgroups to make)."""
        return self.kind == "containerd" and os.geteuid() == 0

    def holds_for_one_pod(self, method: str) -> bool:
        """Whether :meth:`in_flight` holds ``method`` (a client method name) for one pod only; a
        call that names no pod (ImageStatus) is held for whichever pod makes it first."""
        from conformance.recorder import grpc_method

        return self.memory is None or grpc_method(method) not in _UNSCOPED

    def in_flight(self, method: str, uid: str) -> anyio.Event | None:
        """Hold the pod's next ``method`` call in the runtime before it acts; an event set once
        it is held. None when the runtime cannot (containerd): the kill then races the call."""
        if self.memory is None:
            return None
        fault = self.memory.faults.delay(method, IN_FLIGHT_HOLD_SECONDS, times=1,
                                         pod=None if method in _UNSCOPED else uid)
        return fault.reached


@asynccontextmanager
async def memory_runtime(**options: Any) -> AsyncIterator[RuntimeUnderTest]:
    """A fresh in-memory runtime (``options``: :class:`~conformance.memruntime.MemoryRuntime`'s)."""
    async with MemoryRuntime(**options).serving() as rt:
        yield RuntimeUnderTest("memory", rt.endpoint, rt)


def containerd_runtime(containerd: Any) -> RuntimeUnderTest:
    """The session's containerd (anything with an ``endpoint``; its ``cdi_spec_dir`` if it has one)."""
    return RuntimeUnderTest("containerd", containerd.endpoint, cdi_dir=getattr(containerd, "cdi_spec_dir", None))


class ContractAgent(Agent):
    """The real agent; its stages' phase methods are recorded, and the runtime client they get
    attributes each call (the relister keeps the agent's own client)."""

    def __init__(self, config: AgentConfig, recorder: Recorder, runtime: RuntimeUnderTest) -> None:
        super().__init__(config, verbose=False)
        self.recorder = recorder
        self.tracing = TracingRuntime(self.runtime, recorder, runtime.in_flight)
        self.runtime = self.tracing  # type: ignore[assignment]

    def load_pipeline(self) -> Pipeline:
        # The same entry points, read once per session: a discovery scans every installed
        # distribution (~40 ms here), and the suite starts an agent per test.
        with mock.patch.object(registry, "discover", _discover):
            pipeline = super().load_pipeline()
        self.recorder.install(pipeline)
        return pipeline


def agent_handle(agent: Agent) -> Handle:
    """The AgentHandle ``agent`` gives its plugin factories (built the way it builds it)."""
    fields = {"runtime": agent.runtime, "clock": agent.clock, "node": agent.node, "config": agent.config,
              "bus": agent.bus, "objects": agent.objects}
    names = inspect.signature(Handle).parameters
    return Handle(**{k: v for k, v in fields.items() if k in names})


_real_discover = registry.discover


@functools.cache
def _entry_points() -> Mapping[str, EntryPoint]:
    return _real_discover()


def _discover(group: str = registry.GROUP) -> dict[str, EntryPoint]:
    return dict(_entry_points()) if group == registry.GROUP else _real_discover(group)


def contract_profile(plugin: str, joined: Sequence[Phase]) -> dict[str, list[str]]:
    """The default profile with ``plugin`` in every phase it joins (where it is not already):
    last in admit, reserve, permit, start and observe; before ``runtime`` in prepare (so that what
    it adds reaches the containers); first to clean up (cleanup runs in reverse, so listed last)."""
    profile = {phase: list(names) for phase, names in DEFAULT_PROFILE.items()}
    for phase in joined:
        if phase.value not in profile:
            continue
        names = profile[phase.value]
        if plugin in names:
            continue
        if phase is Phase.PREPARE and "runtime" in names:
            names.insert(names.index("runtime"), plugin)
        else:
            names.append(plugin)
    return profile


@dataclass
class Harness:
    """One plugin under test in a real agent (see :func:`open_harness`)."""

    plugin: str
    plugin_config: Mapping[str, Any]
    runtime: RuntimeUnderTest
    base: Path
    config: AgentConfig
    recorder: Recorder
    client: RuntimeClient
    """The test's own client, for its assertions (the agent has its own)."""
    task_group: anyio.abc.TaskGroup
    agent: ContractAgent | None = None
    agents: list[ContractAgent] = field(default_factory=list)
    """Every agent started, in order (the last is :attr:`agent`)."""
    uids: list[str] = field(default_factory=list)
    """Every pod UID the harness made; their runtime objects are removed on exit."""
    names: dict[str, str] = field(default_factory=dict)
    """Pod UID → its manifest's name (the agent's is ``<name>-<node>``)."""
    _stop: Callable[[], Awaitable[None]] | None = None
    _scanning: anyio.Lock = field(default_factory=anyio.Lock)

    @property
    def node(self) -> str:
        return self.config.node_name

    @property
    def manifests(self) -> Path:
        assert self.config.static_pod_path is not None
        return self.config.static_pod_path

    # --- pods ---------------------------------------------------------------------------------

    def pod(self, name: str | None = None, *, labels: Mapping[str, str] | None = None,
            annotations: Mapping[str, str] | None = None, containers: Sequence[Mapping[str, Any]] | None = None,
            **spec: Any) -> Pod:
        """A busybox pod with a fresh UID whose container runs until it is stopped (SIGTERM ends
        it at once). ``spec``: further pod spec fields, by their API names."""
        uid = str(uuid.uuid4())
        self.uids.append(uid)
        return Pod.model_validate({
            "metadata": {"name": name or f"contract-{uid[:8]}", "namespace": "conformance", "uid": uid,
                         "labels": dict(labels or {}), "annotations": dict(annotations or {})},
            "spec": {
                "containers": list(containers or [{"name": "main", "image": BUSYBOX_IMAGE, "command": UNTIL_TERM}]),
                "terminationGracePeriodSeconds": GRACE_SECONDS,
                **spec,
            },
        })

    def write(self, filename: str, *documents: Mapping[str, Any]) -> None:
        """Put a manifest file into staticPodPath (atomically: the source never reads half)."""
        tmp = self.manifests / f".{filename}.tmp"
        tmp.write_text("\n---\n".join(json.dumps(d) for d in documents))
        tmp.rename(self.manifests / filename)

    async def run(self, *pods: Pod) -> None:
        """Hand ``pods`` to the agent as static manifests (their UIDs are kept)."""
        for pod in pods:
            if pod.uid not in self.uids:
                self.uids.append(pod.uid)
            self.names[pod.uid] = pod.metadata.name
            # Without the defaults (parsing puts them back): the static source parses manifests
            # with PyYAML in the event loop, and a full dump costs it several times as much.
            document = {"apiVersion": "v1", "kind": "Pod",
                        **pod.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)}
            document.pop("status", None)
            self.write(f"{pod.uid}.json", document)
        await self.rescan()

    async def delete(self, *pods: Pod) -> None:
        """Remove the pods' manifests: the agent kills and tears them down."""
        for pod in pods:
            (self.manifests / f"{pod.uid}.json").unlink(missing_ok=True)
        await self.rescan()

    async def rescan(self) -> None:
        """Let the static source look at the directory now instead of at its next poll."""
        if self.agent is None:
            return
        async with self._scanning:
            for source in self.agent.sources:
                scan = getattr(source, "scan", None)
                if scan is not None:
                    await scan()

    # --- the agent ----------------------------------------------------------------------------

    async def start_agent(self) -> ContractAgent:
        """Start a new agent on the same configuration, runtime and rootDir (a restart, when one
        ran before: stop it first)."""
        assert self.agent is None, "stop the running agent first"
        agent = ContractAgent(self.config, self.recorder, self.runtime)
        done = anyio.Event()
        scope = anyio.CancelScope()

        async def run(*, task_status: anyio.abc.TaskStatus[Agent] = anyio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await agent.run(task_status=task_status)
            finally:
                done.set()

        await self.task_group.start(run)

        async def stop() -> None:
            scope.cancel()
            with anyio.fail_after(30):
                await done.wait()

        self._stop = stop
        self.agent = agent
        self.agents.append(agent)
        return agent

    async def stop_agent(self) -> None:
        """Stop the agent as ``nodeagent run`` stops on SIGTERM: its pods keep running."""
        if self._stop is not None:
            await self._stop()
        self.agent, self._stop = None, None

    async def tear_down_all(self, timeout: float = GONE_TIMEOUT) -> None:
        """Remove every manifest and give the running agent ``timeout`` seconds to tear the pods
        down (what a failed test left running)."""
        if self.agent is None or self.agent.dispatcher is None:
            return
        for path in self.manifests.iterdir():
            path.unlink(missing_ok=True)
        await self.rescan()
        with anyio.move_on_after(timeout):
            while self.agent.dispatcher.workers:
                await anyio.sleep(0.05)

    def state(self, pod: Pod | str) -> PodState | None:
        """The pod's lifecycle state in the running agent (None: the agent has no worker for it)."""
        uid = pod if isinstance(pod, str) else pod.uid
        agent = self.agent
        if agent is None or agent.dispatcher is None:
            return None
        worker = agent.dispatcher.workers.get(uid)
        return worker.state if worker is not None else None

    def retrying(self, uid: str) -> bool:
        """The pod's latest setup answer was RETRY (the worker backs off and asks again)."""
        answers = [p for p in self.recorder.of(uid) if p.phase in SETUP_PHASES and p.ended is not None
                   and p.repeat == 0 and (p.result is not None or p.error is not None)]
        if not answers:
            return False
        last = answers[-1]
        return last.verdict is Verdict.RETRY or last.error is not None

    async def settle(self, pod: Pod, timeout: float = SETTLE_TIMEOUT, *, want: str | None = None) -> str:
        """Until the pod is running, completed, rejected, waiting at permit or retrying setup;
        returns which (the state's name, or ``Retrying``). ``want``: until it is that one."""
        def settled() -> str | None:
            state = self.state(pod)
            found = None
            if state in SETTLED:
                found = state.value
            elif state in (PodState.PREPARING, PodState.STARTING) and self.retrying(pod.uid):
                found = "Retrying"
            return found if want is None or found == want else None

        return await eventually(settled, f"pod {pod.metadata.name} ({pod.uid}) to settle", timeout, interval=0.02)

    async def quiesce(self, *pods: Pod, quiet: float = 0.2, timeout: float = SETTLE_TIMEOUT) -> None:
        """Until each running pod's status shows all its containers running (a settled pod may
        still be starting the containers after its first, once the relister saw the init
        containers finish), then until the runtime objects of ``pods`` stop changing for
        ``quiet`` seconds."""
        def all_running(pod: Pod) -> bool:
            if self.state(pod) is not PodState.RUNNING or self.agent is None:
                return True
            statuses = {cs.get("name"): cs for cs in self.agent.status.get(pod.uid).get("containerStatuses", [])}
            return all("running" in (statuses.get(c.name) or {}).get("state", {}) for c in pod.spec.containers)

        with anyio.move_on_after(timeout):  # a container that cannot run is left to the quiet period
            while not all(all_running(pod) for pod in pods):
                await anyio.sleep(0.02)
        async def snapshot() -> list[tuple[str, str]]:
            found = []
            for pod in pods:
                objects = await self.runtime_objects(pod.uid)
                found += [(s.id, s.state.name) for s in objects.sandboxes]
                found += [(c.id, c.state.name) for c in objects.containers]
            return sorted(found)

        with anyio.fail_after(timeout):
            last, since = await snapshot(), anyio.current_time()
            while anyio.current_time() - since < quiet:
                await anyio.sleep(quiet / 4)
                now = await snapshot()
                if now != last:
                    last, since = now, anyio.current_time()
            with anyio.move_on_after(CAUGHT_UP_SECONDS):  # a profile without the status stage never catches up
                await self._caught_up(pods)

    async def _caught_up(self, pods: Sequence[Pod]) -> None:
        """Until the agent's view is as new as the runtime: a listing made after now, a status
        computed from the newest change it showed, and a pod that status says is done completed."""
        agent = self.agent
        if agent is None:
            return
        asked = time.time()
        agent.relister.request_relist()
        while any(agent.relister.pod(p.uid).seen_at <= asked for p in pods if self.state(p) is not None
                  and (agent.relister.pod(p.uid).sandboxes or agent.relister.pod(p.uid).containers)):
            await anyio.sleep(0.02)
        for pod in pods:
            if self.state(pod) is not PodState.RUNNING:
                continue
            while agent.status.observed_at(pod.uid) <= agent.relister.pod(pod.uid).changed_at:
                await anyio.sleep(0.02)
            while (agent.status.get(pod.uid).get("phase") in ("Succeeded", "Failed")
                   and self.state(pod) is PodState.RUNNING):
                await anyio.sleep(0.02)

    async def wait_gone(self, pod: Pod | str, timeout: float = GONE_TIMEOUT) -> None:
        """Until the agent tore the pod down and forgot it (no worker, no status record); then a
        moment more for the runtime to finish what it was asked (a call whose caller was
        cancelled may still complete there). What is left is for :meth:`leaks` to say."""
        uid = pod if isinstance(pod, str) else pod.uid

        def forgotten() -> bool:
            agent = self.agent
            if agent is None or agent.dispatcher is None:
                return True
            return uid not in agent.dispatcher.workers and uid not in agent.status.all()

        with anyio.move_on_after(timeout):
            while not forgotten():
                await anyio.sleep(0.05)
        if not forgotten():
            calls = [c.describe() for c in self.recorder.of(uid)][-5:]
            pytest.fail(f"waited {timeout}s for pod {uid} to be torn down and forgotten: it is "
                        f"{self.state(uid)}; its last phase calls: {calls}; the runtime holds "
                        f"{(await self.runtime_objects(uid)).describe()}", pytrace=False)
        with anyio.move_on_after(RUNTIME_SETTLE_SECONDS):
            while await self.runtime_objects(uid):
                await anyio.sleep(0.05)

    # --- what is left ---------------------------------------------------------------------------

    async def runtime_objects(self, uid: str) -> RuntimeObjects:
        return await objects_with(self.client, {L.POD_UID: uid})

    async def remove_runtime_objects(self, uid: str) -> RuntimeObjects:
        """Remove by force whatever the runtime holds for ``uid``; returns what it found."""
        found = await self.runtime_objects(uid)
        await remove_objects(self.client, found)
        return found

    async def leaks(self, uid: str, extra: Callable[[Harness, str], list[str]] | None = None) -> list[str]:
        """What is left of pod ``uid`` once it went: runtime objects, mounts and files under its
        pod directory, its log directory and log links, DRA checkpoint entries, an admission
        reservation, container additions its stages did not withdraw, and the agent's own
        records (worker, status, relister cache) — each as a sentence."""
        found: list[str] = []
        objects = await self.runtime_objects(uid)
        if objects:
            found.append(f"the runtime still holds {objects.describe()}")
        pod_dir = self.config.root_dir / "pods" / uid
        # A mount point is a directory: with no pod directory there is none under it (and this
        # machine's mount table is long to read).
        mounts = mounts_under(pod_dir) if pod_dir.exists() else []
        if mounts:
            found.append(f"mounts under the pod directory: {[str(m) for m in mounts]}")
        if pod_dir.exists():
            left = sorted(str(p.relative_to(pod_dir)) for p in pod_dir.rglob("*"))[:10]
            found.append(f"the pod directory {pod_dir} still exists (holding {left})")
        logs = [p for p in self.config.pod_logs_dir.glob(f"*_{uid}")] if self.config.pod_logs_dir.exists() else []
        if logs:
            found.append(f"pod log directories {[str(p) for p in logs]}")
        links_dir = self.config.container_logs_symlink_dir
        names = self._pod_names(uid)
        links = sorted(p.name for p in links_dir.iterdir()
                       if any(p.name.startswith(f"{n}_") for n in names)) if links_dir.exists() and names else []
        if links:
            found.append(f"container log links {links}")
        found += _dra_entries(self.config.dra_checkpoint_path, uid)
        agent = self.agent
        if agent is not None and agent.services is not None:
            if any(p.uid == uid for p in agent.services.admission.admitted):
                found.append("the admission cycle still counts the pod as admitted (its reservation)")
        additions = self.recorder.additions.get(uid)
        if additions:
            found.append(f"container additions left after unprepare: {additions}")
        if agent is not None and agent.dispatcher is not None:
            if uid in agent.dispatcher.workers:
                found.append(f"a pod worker (state {agent.dispatcher.workers[uid].state.value})")
            if uid in agent.status.all():
                found.append("a status record")
            def cached() -> bool:
                view = agent.relister.pod(uid)
                return bool(view.sandboxes or view.containers)

            if cached():
                agent.relister.request_relist()
                with anyio.move_on_after(RUNTIME_SETTLE_SECONDS):
                    while cached():
                        await anyio.sleep(0.05)
                if cached():
                    found.append("the relister's cache still has it (the runtime does too, or a relist is stuck)")
        if extra is not None:
            found += extra(self, uid)
        return found

    def _pod_names(self, uid: str) -> list[str]:
        """The name the agent gave the pod: the static source's ``<name>-<node>``."""
        name = self.names.get(uid)
        return [f"{name}-{self.node}"] if name else []

    # --- the runtime, as a previous agent left it -------------------------------------------------

    async def plant_orphan(self) -> str:
        """A sandbox with a running container labelled for this node, and the pod's directories,
        as an agent that died would have left them for a pod no source wants any more: the next
        agent's replay finds it and tears it down — undo without setup. Returns its UID."""
        uid = str(uuid.uuid4())
        self.uids.append(uid)
        name, namespace = f"orphan-{uid[:8]}-{self.node}", "conformance"
        labels = {L.POD_UID: uid, L.POD_NAME: name, L.POD_NAMESPACE: namespace, L.MANAGED_BY: self.node}
        log_dir = self.config.pod_logs_dir / f"{namespace}_{name}_{uid}"
        log_dir.mkdir(parents=True, exist_ok=True)
        (self.config.root_dir / "pods" / uid / "volumes").mkdir(parents=True, exist_ok=True)
        sandbox = t.PodSandboxConfig(
            metadata=t.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            hostname=name[:63], log_directory=str(log_dir), labels=labels,
            annotations={L.CONFIG_SOURCE: "file"})
        sandbox_id = await self.client.run_pod_sandbox(sandbox)
        container = t.ContainerConfig(
            metadata=t.ContainerMetadata(name="main", attempt=0), image=t.ImageSpec(image=BUSYBOX_IMAGE),
            command=UNTIL_TERM, log_path="main/0.log", labels={**labels, L.CONTAINER_NAME: "main"},
            annotations={L.CONTAINER_RESTART_COUNT: "0", L.POD_TERMINATION_GRACE_PERIOD: str(GRACE_SECONDS),
                         L.CONTAINER_TYPE: "container"})
        container_id = await self.client.create_container(sandbox_id, container, sandbox)
        await self.client.start_container(container_id)
        self.names[uid] = name.removesuffix(f"-{self.node}")
        return uid


def mounts_under(directory: Path, table: Path = _MOUNTINFO) -> list[Path]:
    """Mount points at or below ``directory`` (from the mount table, as the kernel sees it)."""
    root = str(directory)
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].encode().decode("unicode_escape")
        if point == root or point.startswith(root.rstrip("/") + "/"):
            found.append(Path(point))
    return found


def _dra_entries(path: Path, uid: str) -> list[str]:
    if not path.exists():
        return []
    from plugins.dra.state import CheckpointError, ClaimCache  # the checkpoint's reader, not its format

    cache = ClaimCache(path)
    try:
        cache.load()
    except CheckpointError as exc:
        return [f"the DRA checkpoint {path} cannot be read: {exc}"]
    return [f"DRA checkpoint entry for claim {e.key} ({e.uid}) still names the pod"
            for e in cache.entries.values() if uid in e.pod_uids]


@asynccontextmanager
async def open_harness(runtime: RuntimeUnderTest | str, directory: Path, plugin: str,
                       plugin_config: Mapping[str, Any] | None = None, *,
                       settings: Mapping[str, Any] | None = None, profile: Mapping[str, Sequence[str]] | None = None,
                       undo_twice: bool = True, quiet: bool = True) -> AsyncIterator[Harness]:
    """A harness for ``plugin`` (its entry-point name) on ``runtime`` (or a CRI endpoint).

    ``directory`` is the pytest tmp_path; the agent's staticPodPath, rootDir, podLogsDir and
    plugin sockets go under a short directory of their own (unix socket paths must stay under
    108 bytes). ``settings`` are further agent configuration fields (their Python names);
    ``profile`` replaces :func:`contract_profile`'s. The node name is unique, so objects of this
    harness never mix with another's. On exit the agent is stopped and whatever the runtime still
    holds for the harness's pods is removed (after the test had its chance to see it).
    ``quiet``: the agent logs warnings and errors only, while the harness is open.
    """
    del directory  # pytest's tmp_path is too long for sockets; it stays for the test's own files
    under = runtime if isinstance(runtime, RuntimeUnderTest) else RuntimeUnderTest("containerd", runtime)
    base = Path(tempfile.mkdtemp(prefix="contract-", dir="/tmp"))
    node_name = f"contract-{uuid.uuid4().hex[:10]}"
    plugin_config = dict(plugin_config or {})
    values: dict[str, Any] = {
        "node_name": node_name,
        "static_pod_path": base / "manifests",
        "container_runtime_endpoint": under.endpoint,
        "runtime_request_timeout": RUNTIME_TIMEOUT,
        "root_dir": base / "root",
        "pod_logs_dir": base / "logs",
        "container_logs_symlink_dir": base / "containers",
        "plugins_registry_dir": base / "registry",
        "cdi_spec_dirs": [under.cdi_dir or base / "cdi"],
        "healthz_port": 0,
        "cgroups_per_qos": under.pod_cgroups,
        "profile": dict(profile or {}),
        "plugins": {plugin: plugin_config},
    }
    extra = dict(settings or {})
    values["plugins"] = {**extra.pop("plugins", {}), plugin: plugin_config}
    values.update(extra)
    if profile is None:
        values["profile"] = contract_profile(plugin, _joined(plugin, plugin_config, AgentConfig(
            **{k: v for k, v in values.items() if k not in ("profile", "plugins")})))
    config = AgentConfig(**values)
    assert config.static_pod_path is not None
    config.static_pod_path.mkdir(parents=True)
    logging = structlog.get_config()
    if quiet:
        # Rendering every debug and info line of a busy agent costs more CPU than the pods do;
        # warnings and errors still show (in the test's captured output).
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(WARNING))
    try:
        async with RuntimeClient(under.endpoint, timeout=RUNTIME_TIMEOUT) as client:
            async with anyio.create_task_group() as tg:
                harness = Harness(plugin, plugin_config, under, base, config, Recorder(plugin, undo_twice=undo_twice),
                                  client, tg)
                try:
                    yield harness
                finally:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(60):
                        await harness.tear_down_all()  # the agent undoes what it did (binds, mounts)
                        await harness.stop_agent()
                        for uid in harness.uids:
                            await harness.remove_runtime_objects(uid)
                    tg.cancel_scope.cancel()
    finally:
        structlog.configure(**logging)
        remove_tree(base)


def remove_tree(base: Path) -> None:
    """Remove the harness's directory — never through a mount point. A bind mount the agent left
    under a pod directory (a hostPath volume of /tmp) would make a plain rmtree delete the host's
    own files through it. Mounts under ``base`` are detached first (they can only be this
    harness's agents' own); if any stays, the directory is kept and said so."""
    for point in sorted(mounts_under(base), key=lambda p: len(p.parts)):
        if mounts_under(point):  # not detached yet with a parent
            subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)
    left = mounts_under(base)
    if left:
        warnings.warn(f"{base} kept: still mounted under it: {[str(p) for p in left[:5]]}", stacklevel=2)
        return
    shutil.rmtree(base, ignore_errors=True)


def _joined(plugin: str, config: Mapping[str, Any], settings: AgentConfig) -> list[Phase]:
    """The phases ``plugin`` joins: from its factory's ``stage_class``, else from an instance
    (a factory does no I/O: building one costs nothing but the handle)."""
    eps = _discover()
    if plugin not in eps:
        raise LookupError(f"no plugin {plugin!r} in entry-point group nodeagent.plugins (installed: {sorted(eps)}); "
                          "is its package installed (pip install -e .)?")
    factory = eps[plugin].load()
    cls = getattr(factory, "stage_class", None)
    if not isinstance(cls, type):
        cls = type(factory(dict(config), agent_handle(Agent(settings, verbose=False))))
    return sorted(phases_of(cls), key=lambda p: list(Phase).index(p))


@overload
async def eventually(check: Callable[[], Awaitable[T | None]], what: str, timeout: float = ...,
                     interval: float = ...) -> T: ...
@overload
async def eventually(check: Callable[[], T | None], what: str, timeout: float = ...,
                     interval: float = ...) -> T: ...
async def eventually(check: Callable[[], object], what: str, timeout: float = 30.0,
                     interval: float = 0.1) -> object:
    """Poll ``check`` (a function or a coroutine function) until it returns something true and
    return that; fail the test after ``timeout`` seconds, naming ``what`` was awaited and what
    ``check`` returned last."""
    last: object = None
    with anyio.move_on_after(timeout):
        while True:
            value = check()
            last = await value if inspect.isawaitable(value) else value
            if last:
                return last
            await anyio.sleep(interval)
    pytest.fail(f"waited {timeout}s for {what}; last seen: {last!r}", pytrace=False)


async def objects_with(runtime: RuntimeClient, labels: Mapping[str, str]) -> RuntimeObjects:
    """Every sandbox and container whose labels include ``labels``."""
    selector = dict(labels)
    sandboxes = await runtime.list_pod_sandbox(t.PodSandboxFilter(label_selector=selector))
    containers = await runtime.list_containers(t.ContainerFilter(label_selector=selector))
    return RuntimeObjects(tuple(sandboxes), tuple(containers))


async def remove_objects(runtime: RuntimeClient, found: RuntimeObjects) -> None:
    for c in found.containers:
        try:
            await runtime.remove_container(c.id)
        except NotFound:
            pass
    for s in found.sandboxes:
        try:
            await runtime.stop_pod_sandbox(s.id)
            await runtime.remove_pod_sandbox(s.id)
        except NotFound:
            pass


# --- pytest plugin -------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "containerd: needs the real containerd started by devenv")


@pytest.fixture(scope="session")
def containerd() -> Iterator[Any]:
    """A private containerd (CRI, bridge CNI, busybox and pause images) for the session."""
    from devenv import Containerd, build_images, ensure_packages

    ensure_packages()
    archives = build_images()
    base = Path(tempfile.mkdtemp(prefix="nodeagent-conformance-", dir="/tmp"))  # socket paths < 108 bytes
    env = Containerd(base)
    try:
        env.start()
        env.import_images(archives)
        yield env
    finally:
        env.stop()
        shutil.rmtree(base, ignore_errors=True)


__all__ = [
    "CANCEL_POINTS",
    "GRACE_SECONDS",
    "MUTATIONS",
    "SETUP_PHASES",
    "UNDO_PHASES",
    "UNTIL_TERM",
    "CancelPoint",
    "agent_handle",
    "ContractAgent",
    "Harness",
    "RuntimeKind",
    "RuntimeObjects",
    "RuntimeUnderTest",
    "containerd_runtime",
    "contract_profile",
    "eventually",
    "memory_runtime",
    "mounts_under",
    "objects_with",
    "open_harness",
    "remove_objects",
    "remove_tree",
]
