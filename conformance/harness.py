"""A stage under test, wired to a real containerd the way the agent wires it.

:func:`open_harness` builds what :class:`nodeagent.agent.Agent` builds for its pod workers — a
CRI :class:`~cri.RuntimeClient`, a running :class:`~nodeagent.pleg.Relister`, a
:class:`~nodeagent.status.StatusWriter`, an :class:`~nodeagent.admission.AdmissionCycle` and a
:class:`~nodeagent.registry.Pipeline` resolved by :func:`nodeagent.registry.resolve` — around
one plugin loaded through its entry point. It then gives tests a
:class:`~nodeagent.worker.PodWorker` per pod, so that ``StageContext(worker, stage.name)`` is
exactly the handle the stage gets in production, and drives phases the way the worker does.

Use it from your own tests::

    async with open_harness(containerd.endpoint, tmp_path, "myplugin", {"key": "value"}) as h:
        worker = h.worker(h.pod())
        await h.setup(worker)
        ...
        await h.teardown(worker)

As a pytest plugin (``pytest_plugins = ["conformance.harness"]`` in your top-level conftest.py)
this module also provides the session fixture ``containerd``: a private containerd with the
busybox and pause images, the one nodeagent's own tests use. A ``containerd`` fixture of your
own (anything with an ``endpoint`` attribute) takes precedence.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload

import anyio
import pytest

from cri import NotFound, RuntimeClient
from cri import types as t
from devenv.images import BUSYBOX_IMAGE
from nodeagent import labels as L
from nodeagent.admission import AdmissionCycle
from nodeagent.agent import node_allocatable
from nodeagent.clock import Clock, SystemClock
from nodeagent.config import AgentConfig
from nodeagent.kubeletconfig.node import NodeConfig
from nodeagent.events import Event, PodRef
from nodeagent.objects import FileObjects
from nodeagent.model import Pod
from nodeagent.pleg import Relister
from nodeagent.registry import CONFIGURABLE, Pipeline, configuration, create, discover, load_factory, resolve
from nodeagent.stages import (
    Admit,
    Cleanup,
    NodeInfo,
    Observe,
    Permit,
    Phase,
    PodContext,
    Prepare,
    Reserve,
    Result,
    Stage,
    Start,
    Verdict,
    phases_of,
)
from nodeagent.status import StatusWriter
from nodeagent.worker import PodWorker, Services, StageContext

T = TypeVar("T")

RUNTIME_TIMEOUT = 30.0
"""Seconds per CRI call: generous for a loaded CI machine, far below the agent's 2 min."""
TEARDOWN_TIMEOUT = 30.0
"""Seconds the whole teardown of one pod may take before the test fails."""
GRACE_SECONDS = 2
"""The test pod's terminationGracePeriodSeconds (its container exits on SIGTERM at once)."""
IN_FLIGHT_SECONDS = 0.005
"""For the ``in-flight`` cancel point: long enough for a request to reach the runtime, shorter
than a slow call (RunPodSandbox takes ~60 ms)."""

CancelPoint = Literal["as-it-begins", "in-flight", "answer-lost"]
"""Where in a runtime call :meth:`RuntimeCalls.cancel_during` cancels:

- ``as-it-begins``: at the call's first await (the request may never be sent);
- ``in-flight``: :data:`IN_FLIGHT_SECONDS` after it began (a fast call completes first and the
  cancellation lands at the stage's next await);
- ``answer-lost``: the call completes in the runtime, then the caller is cancelled before it sees
  the answer (what a client-side timeout does to a sandbox the runtime did create).
"""
CANCEL_POINTS: tuple[CancelPoint, ...] = ("as-it-begins", "in-flight", "answer-lost")

SETUP_PHASES: tuple[Phase, ...] = (Phase.ADMIT, Phase.RESERVE, Phase.PREPARE, Phase.PERMIT, Phase.START)
UNDO_PHASES: tuple[Phase, ...] = (Phase.STOP, Phase.UNPREPARE, Phase.CLEANUP, Phase.UNRESERVE)

# A container that runs until SIGTERM and then exits at once, so stopping it costs no grace.
_UNTIL_TERM = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]


@dataclass(frozen=True)
class StageVerdict:
    """One answer a stage gave in a setup phase, as the harness saw it."""

    stage: str
    phase: Phase
    result: object
    """What the stage returned; a :class:`~nodeagent.stages.Result` if it kept the contract."""

    @property
    def verdict(self) -> Verdict | None:
        return self.result.verdict if isinstance(self.result, Result) else None

    @property
    def proceeds(self) -> bool:
        return self.verdict in (Verdict.CONTINUE, Verdict.SKIP)


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


class RuntimeCalls:
    """The runtime client stages get in the harness: the real one, with every call recorded.

    It can also cancel a cancel scope while the n-th call is in flight, which is how the
    contract cancels a setup at each of its awaits on the runtime.
    """

    def __init__(self, inner: RuntimeClient) -> None:
        self._inner = inner
        self.calls: list[str] = []
        self._cancel_at: int | None = None
        self._scope: anyio.CancelScope | None = None
        self._point: CancelPoint = "as-it-begins"

    def cancel_during(self, index: int, scope: anyio.CancelScope, point: CancelPoint = "as-it-begins") -> None:
        """Cancel ``scope`` at ``point`` of call number ``index`` (0-based, counted from now)."""
        self.calls = []
        self._cancel_at, self._scope, self._point = index, scope, point

    def disarm(self) -> None:
        self._cancel_at = self._scope = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            index = len(self.calls)
            self.calls.append(name)
            scope, point = self._scope, self._point
            if scope is None or index != self._cancel_at:
                return await attr(*args, **kwargs)
            self.disarm()
            if point == "as-it-begins":
                scope.cancel()
            elif point == "in-flight":
                scope.deadline = min(scope.deadline, anyio.current_time() + IN_FLIGHT_SECONDS)
            else:
                with anyio.CancelScope(shield=True):
                    result = await attr(*args, **kwargs)
                scope.cancel()
                await anyio.lowlevel.checkpoint()  # raises here unless the stage shielded the call
                return result
            return await attr(*args, **kwargs)

        return call


@dataclass
class _Handle:
    """The AgentHandle a plugin factory gets (as nodeagent.agent.Handle, without the bus)."""

    runtime: RuntimeClient
    clock: Clock
    node: NodeInfo
    config: AgentConfig
    publish_to: Callable[[Event], Awaitable[None]]
    objects: FileObjects = field(default_factory=FileObjects)
    """The harness runs standalone: the (empty) manifest-backed object store."""

    @property
    def settings(self) -> NodeConfig:
        return self.config.node_config()

    async def publish(self, event: Event) -> None:
        await self.publish_to(event)


@dataclass
class Harness:
    """One plugin under test and the agent's services around it (see :func:`open_harness`)."""

    plugin: str
    plugin_config: Mapping[str, Any]
    config: AgentConfig
    node: NodeInfo
    runtime: RuntimeClient
    """The real client, for the test's own assertions (stages get :attr:`calls`)."""
    calls: RuntimeCalls
    handle: _Handle
    stage: Stage
    """The plugin under test, created by its entry point's factory and validated."""
    pipeline: Pipeline
    relister: Relister
    status: StatusWriter
    admission: AdmissionCycle
    services: Services
    events: list[Event] = field(default_factory=list)
    """Every fact published through the harness, in order."""
    verdicts: list[StageVerdict] = field(default_factory=list)
    """Every answer a stage gave in :meth:`setup`, in order (kept when setup was cancelled)."""
    uids: list[str] = field(default_factory=list)
    """Every pod UID the harness made or saw; their runtime objects are removed on exit."""

    # --- building -------------------------------------------------------------------------

    def new_stage(self) -> Stage:
        """A fresh instance from the factory, as after an agent restart; the pipeline uses it."""
        self.stage = _instantiate(self.plugin, self.plugin_config, self.handle)
        self.pipeline = _pipeline(self.stage)
        self.admission = AdmissionCycle(self.pipeline, self.node)
        self.services.pipeline = self.pipeline
        self.services.admission = self.admission
        return self.stage

    def pod(self, name: str | None = None, *, labels: Mapping[str, str] | None = None,
            containers: Sequence[Mapping[str, Any]] | None = None) -> Pod:
        """A busybox pod with a fresh UID whose container runs until it is stopped."""
        uid = str(uuid.uuid4())
        self.uids.append(uid)
        return Pod.model_validate({
            "metadata": {"name": name or f"contract-{uid[:8]}", "namespace": "conformance", "uid": uid,
                         "labels": dict(labels or {})},
            "spec": {
                "containers": list(containers or [{"name": "main", "image": BUSYBOX_IMAGE, "command": _UNTIL_TERM}]),
                "terminationGracePeriodSeconds": GRACE_SECONDS,
                "nodeName": self.node.name,
            },
        })

    def worker(self, pod: Pod) -> PodWorker:
        """A pod worker that is never run: it holds the pod, its stash and its status record."""
        if pod.uid not in self.uids:
            self.uids.append(pod.uid)
        ref = PodRef(uid=pod.uid, namespace=pod.metadata.namespace, name=pod.metadata.name)
        return PodWorker(ref, pod, self.services, cause=None)

    def context(self, worker: PodWorker, stage: Stage | None = None) -> PodContext:
        """The handle ``stage`` (default: the plugin under test) gets for ``worker``'s pod."""
        # StageContext is the agent's PodContext; the cast is for mypy, which does not accept
        # read-only properties (pod, ref) for the Protocol's plain attributes.
        return cast(PodContext, StageContext(worker, (stage or self.stage).name))

    # --- driving phases as the worker does -----------------------------------------------

    async def setup(self, worker: PodWorker, phases: Sequence[Phase] = SETUP_PHASES) -> StageVerdict | None:
        """Run ``phases`` in order, every stage of each in profile order, once (no retries).

        Returns the first answer other than CONTINUE/SKIP (setup stops there), or None when every
        stage proceeded. Every answer is appended to :attr:`verdicts`. Exceptions propagate.
        """
        pod = worker.pod
        for phase in phases:
            if phase is Phase.PREPARE:
                worker.pod_dir.mkdir(parents=True, exist_ok=True)  # the worker's promise to prepare
            for stage in self.pipeline[phase]:
                if phase is Phase.ADMIT:
                    result: object = await cast(Admit, stage).admit(pod, self.admission.view_for(pod.uid))
                elif phase is Phase.RESERVE:
                    result = await cast(Reserve, stage).reserve(pod, self.admission.view_for(pod.uid))
                elif phase is Phase.PREPARE:
                    result = await cast(Prepare, stage).prepare(self.context(worker, stage))
                elif phase is Phase.PERMIT:
                    result = await cast(Permit, stage).permit(self.context(worker, stage))
                elif phase is Phase.START:
                    result = await cast(Start, stage).start(self.context(worker, stage))
                else:
                    raise ValueError(f"{phase.value} is not a setup phase")
                answer = StageVerdict(stage.name, phase, result)
                self.verdicts.append(answer)
                if not answer.proceeds:
                    return answer
        return None

    async def observe(self, worker: PodWorker, seconds: float) -> None:
        """Run the observe stages concurrently for ``seconds``, then cancel them (as a kill does).

        Fails when an observer raises, or when one does not stop within 5 s of the cancellation.
        """
        async def watch(stage: Observe) -> None:
            await stage.observe(self.context(worker, stage))

        with anyio.fail_after(seconds + 5.0):
            async with anyio.create_task_group() as tg:
                for stage in self.pipeline[Phase.OBSERVE]:
                    tg.start_soon(watch, cast(Observe, stage))
                await anyio.sleep(seconds)
                tg.cancel_scope.cancel()

    async def teardown(self, worker: PodWorker, *, times: int = 1, grace: float | None = None) -> None:
        """stop → unprepare → cleanup → unreserve, each stage ``times`` times in a row, shielded
        from cancellation and bounded by :data:`TEARDOWN_TIMEOUT` (then the test fails)."""
        grace = float(worker.pod.spec.termination_grace_period_seconds) if grace is None else grace
        with anyio.CancelScope(shield=True), anyio.fail_after(TEARDOWN_TIMEOUT):
            for phase in UNDO_PHASES:
                for stage in self.pipeline[phase]:
                    for _ in range(times):
                        await self.undo(worker, stage, phase, grace)

    async def undo(self, worker: PodWorker, stage: Stage, phase: Phase, grace: float = GRACE_SECONDS) -> None:
        if phase is Phase.STOP:
            await cast(Start, stage).stop(self.context(worker, stage), grace)
        elif phase is Phase.UNPREPARE:
            await cast(Prepare, stage).unprepare(self.context(worker, stage))
        elif phase is Phase.CLEANUP:
            await cast(Cleanup, stage).cleanup(self.context(worker, stage))
        elif phase is Phase.UNRESERVE:
            await cast(Reserve, stage).unreserve(worker.pod)
        else:
            raise ValueError(f"{phase.value} is not an undo phase")

    # --- what the runtime holds ---------------------------------------------------------

    async def runtime_objects(self, uid: str) -> RuntimeObjects:
        return await objects_with(self.runtime, {L.POD_UID: uid})

    async def remove_runtime_objects(self, uid: str) -> RuntimeObjects:
        """Remove by force whatever the runtime holds for ``uid``; returns what it found."""
        found = await self.runtime_objects(uid)
        await remove_objects(self.runtime, found)
        return found


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


def _instantiate(plugin: str, config: Mapping[str, Any], handle: _Handle) -> Stage:
    eps = discover()
    if plugin not in eps:
        raise LookupError(
            f"no plugin {plugin!r} in entry-point group nodeagent.plugins (installed: {sorted(eps)}); "
            "is its package installed (pip install -e .)?"
        )
    factory = load_factory(plugin, eps[plugin])
    return create(plugin, factory, configuration(plugin, factory, config), handle)


def _pipeline(stage: Stage) -> Pipeline:
    """The plugin alone, in every configurable phase it joins (undo phases follow)."""
    joined = {p.value for p in phases_of(stage)}
    profile = {phase: [stage.name] for phase in CONFIGURABLE if phase in joined}
    return resolve(profile, {stage.name: stage})


@asynccontextmanager
async def open_harness(endpoint: str, directory: Path, plugin: str,
                       plugin_config: Mapping[str, Any] | None = None) -> AsyncIterator[Harness]:
    """A harness for ``plugin`` (its entry-point name) on the runtime at ``endpoint``.

    ``directory`` holds the agent's root and pod-log directories. The node name is unique, so
    runtime objects of this harness never mix with another's. On exit, whatever the runtime
    still holds for the harness's pods is removed (after the test has had its chance to see it).
    """
    plugin_config = dict(plugin_config or {})
    node_name = f"contract-{uuid.uuid4().hex[:10]}"
    config = AgentConfig(
        node_name=node_name,
        container_runtime_endpoint=endpoint,
        runtime_request_timeout=RUNTIME_TIMEOUT,
        root_dir=directory / "root",
        pod_logs_dir=directory / "logs",
        container_logs_symlink_dir=directory / "containers",
        healthz_port=0,
        node_ip="127.0.0.1",
        profile={},
        plugins={plugin: plugin_config},
    )
    node = NodeInfo(name=node_name, ip=config.node_ip, allocatable=node_allocatable(config),
                    labels={"kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux"})
    runtime = RuntimeClient(endpoint, timeout=RUNTIME_TIMEOUT)
    await runtime.connect()
    try:
        events: list[Event] = []

        async def publish(event: Event) -> None:
            events.append(event)

        clock = SystemClock()
        handle = _Handle(runtime, clock, node, config, publish)
        stage = _instantiate(plugin, plugin_config, handle)
        pipeline = _pipeline(stage)
        calls = RuntimeCalls(runtime)
        relister = Relister(runtime, node_name, publish)
        status = StatusWriter([], host_ip=config.node_ip)
        admission = AdmissionCycle(pipeline, node)
        services = Services(
            runtime=cast(RuntimeClient, calls), clock=clock, node=node, settings=config.node_config(),
            relister=relister,
            status=status, publish=publish, admission=admission, pipeline=pipeline, root_dir=config.root_dir,
        )
        harness = Harness(plugin, plugin_config, config, node, runtime, calls, handle, stage, pipeline,
                          relister, status, admission, services, events)
        async with anyio.create_task_group() as tg:
            await tg.start(relister.run)
            try:
                yield harness
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(TEARDOWN_TIMEOUT):
                    for uid in harness.uids:
                        await harness.remove_runtime_objects(uid)
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await runtime.close()


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
    "SETUP_PHASES",
    "UNDO_PHASES",
    "CancelPoint",
    "Harness",
    "RuntimeCalls",
    "RuntimeObjects",
    "StageVerdict",
    "eventually",
    "objects_with",
    "open_harness",
    "remove_objects",
]
