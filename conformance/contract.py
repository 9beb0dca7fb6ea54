"""The contract every stage plugin passes: ours and third-party ones alike.

Subclass :class:`StageContract` in a test module, name the subclass ``Test...`` and set
``plugin`` to your entry-point name (and ``config`` to its configuration section)::

    from conformance.contract import StageContract

    class TestMyPluginContract(StageContract):
        plugin = "myplugin"
        config = {"key": "value"}

The inherited tests run a real agent (:class:`nodeagent.agent.Agent`, standalone, static
manifests in a temporary directory) with your plugin in the default profile, against the
in-memory CRI runtime (:mod:`conformance.memruntime`: no root, no containerd) and against a real
containerd (the ``containerd`` fixture; those runs are marked ``containerd``: deselect them with
``-m "not containerd"`` where there is none). Each checks one promise of the phase contract in
:mod:`nodeagent.stages`, through the agent's own worker and admission cycle:

- **it loads**: the entry point's factory builds a stage that :func:`nodeagent.registry.validate_stage`
  accepts, and :func:`nodeagent.registry.load` orders it as the agent would;
- **only documented verdicts**: every answer of every stage in a setup phase is a
  :class:`~nodeagent.stages.Result` whose verdict is in ``PHASE_SPECS[phase].verdicts``; REJECT,
  RETRY and WAIT carry a reason; only typed errors are raised (Retryable, Permanent, a CRI error),
  never by admit, reserve, an undo phase or observe; observers end when the pod goes;
- **undo is idempotent**: each of the plugin's undo phases (stop, unprepare, cleanup, unreserve)
  runs twice in a row wherever the agent runs it once, and must succeed both times — after a
  complete setup, after a pod completed (unprepare, then the teardown's), and when setup never
  ran (an orphan left in the runtime by an earlier agent, found by the replay);
- **teardown after a cancelled setup**: the pod's deletion arrives at the entry of each setup
  phase call of each stage, and during each runtime call of the plugin's setup (or of the whole
  setup, for a plugin that makes none) — as the call begins, while the runtime handles it, and
  after the runtime did the work but before the stage saw the answer; the agent's teardown must
  then leave nothing behind;
- **restart adoption**: a new agent on the same runtime and rootDir adopts the pods — no new
  sandbox or container, no container restarted, no runtime object changed.

After every pod is gone each test also checks that nothing of it is left (:meth:`Harness.leaks`):
no sandbox or container, no mount or file under its pod directory, no log directory or link, no
DRA checkpoint entry, no admission reservation, no container addition left after unprepare, no
worker, status or relister record; plus what :meth:`StageContract.leaks` adds for your stage.

Override :meth:`StageContract.pods` to send your stage down more paths (a pod it rejects, one it
skips), :meth:`StageContract.manifests` for documents the pods need beside them (ResourceClaims),
:meth:`StageContract.environment` for what must run around the agent (a DRA driver), and
``settings`` for agent configuration fields.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from conformance.harness import (
    CANCEL_POINTS,
    MUTATIONS,
    SETUP_PHASES,
    UNDO_PHASES,
    Harness,
    RuntimeKind,
    agent_handle,
    containerd_runtime,
    memory_runtime,
    open_harness,
)
from conformance.recorder import CriCall, PhaseCall
from cri import CriError
from nodeagent.errors import Permanent, Retryable
from nodeagent.model import Pod
from nodeagent.registry import CONFIGURABLE, configuration, create, discover, load, load_factory
from nodeagent.stages import PHASE_SPECS, Phase, Result, Verdict, phases_of

OBSERVE_SECONDS = {"memory": 0.1, "containerd": 0.5}
"""How long settled pods are left to their observers before they are deleted (the memory
runtime answers at once: a pass of every observer takes milliseconds there)."""
HOLD_TIMEOUT = 30.0

_RUNTIME_CALLERS: dict[type, bool] = {}
"""Contract class → whether its stage called the runtime in setup (learnt by the verdict test)."""
_NEEDS_REASON = frozenset({Verdict.REJECT, Verdict.RETRY, Verdict.WAIT})
_TYPED = (Retryable, Permanent, CriError)


class StageContract:
    """Inherit this in a ``Test*`` class and set :attr:`plugin`; see the module docstring."""

    plugin: ClassVar[str] = ""
    """The plugin's entry-point name in group ``nodeagent.plugins``."""
    config: ClassVar[Mapping[str, Any]] = {}
    """The plugin's configuration section (``plugins: {<name>: ...}`` in the agent configuration)."""
    settings: ClassVar[Mapping[str, Any]] = {}
    """Further agent configuration fields (Python names, e.g. ``{"max_pods": 10}``; ``plugins``
    adds sections for other plugins)."""
    profile: ClassVar[Mapping[str, Sequence[str]] | None] = None
    """The agent's profile; None: the default profile with the plugin in each phase it joins."""
    runtimes: ClassVar[Sequence[RuntimeKind]] = ("memory", "containerd")
    """The runtimes the suite runs on; containerd runs are marked ``containerd``."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "cri" in metafunc.fixturenames:
            metafunc.parametrize("cri", [
                pytest.param(kind, id=kind, marks=[pytest.mark.containerd] if kind == "containerd" else [])
                for kind in self.runtimes], indirect=True)

    # --- fixtures and hooks a subclass may override --------------------------------------

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"  # grpc.aio, under the CRI client, runs on asyncio only

    @pytest.fixture
    def cri(self, request: pytest.FixtureRequest) -> tuple[RuntimeKind, Any]:
        kind: RuntimeKind = request.param
        return kind, request.getfixturevalue("containerd") if kind == "containerd" else None

    @pytest.fixture
    async def harness(self, cri: tuple[RuntimeKind, Any], tmp_path: Path) -> AsyncIterator[Harness]:
        assert self.plugin, f"{type(self).__name__} must set plugin = '<entry-point name>'"
        kind, containerd = cri
        async with _runtime(kind, containerd) as runtime:
            async with open_harness(runtime, tmp_path, self.plugin, self.config, settings=self.settings,
                                    profile=self.profile) as h:
                documents = self.manifests(h)
                if documents:
                    h.write("contract-objects.json", *documents)
                async with self.environment(h):
                    yield h

    def pods(self, harness: Harness) -> list[Pod]:
        """The pods every test runs the agent with: one busybox pod by default.

        Override to add pods that take your stage down other paths (one it rejects, one it
        skips, one it waits for); build them with ``harness.pod(labels=..., containers=...)``.
        Each call must make new pods (``harness.pod()`` gives each a fresh UID).
        """
        return [harness.pod()]

    def _pods(self, harness: Harness) -> list[Pod]:
        """:meth:`pods`, each a pod of its own: one built from another (``model_dump`` of a
        ``harness.pod()``) shares its UID and name, which the agent would take for one pod."""
        pods: list[Pod] = []
        for index, pod in enumerate(self.pods(harness)):
            if any(p.uid == pod.uid or p.metadata.name == pod.metadata.name for p in pods):
                pod = copy_pod(harness, pod, f"p{index}")
            pods.append(pod)
        return pods

    def manifests(self, harness: Harness) -> list[dict[str, Any]]:
        """Documents put into staticPodPath before the agent starts (ResourceClaims the pods
        use); none by default."""
        return []

    @asynccontextmanager
    async def environment(self, harness: Harness) -> AsyncIterator[None]:
        """What runs around the agent for the whole test (a DRA driver); nothing by default."""
        yield

    def leaks(self, harness: Harness, uid: str) -> list[str]:
        """What your stage still holds for pod ``uid`` after it went, as sentences (checked with
        the suite's own leak checks); nothing by default."""
        return []

    # --- the contract --------------------------------------------------------------------

    async def test_loads_through_entry_point(self, harness: Harness) -> None:
        eps = discover()
        assert self.plugin in eps, f"no entry point {self.plugin!r} in group nodeagent.plugins"
        factory = load_factory(self.plugin, eps[self.plugin])
        agent = await harness.start_agent()
        # The registry's own path: the section validated by the plugin's model, then the factory.
        stage = create(self.plugin, factory, configuration(self.plugin, factory, self.config), _handle(agent))
        declared = getattr(factory, "stage_class", None)
        assert declared is None or declared is type(stage), (
            f"{eps[self.plugin].value}.stage_class is {declared!r} but the factory returns "
            f"{type(stage)!r}: `nodeagent plugins` would show the wrong phases"
        )
        joined = phases_of(stage)
        profile = {name: [self.plugin] for name in CONFIGURABLE if Phase(name) in joined}
        pipeline, _ = load(profile, {self.plugin: dict(self.config)}, _handle(agent),
                           entry={self.plugin: eps[self.plugin]})
        for phase in joined:
            assert [s.name for s in pipeline[phase]] == [self.plugin], f"{self.plugin} missing from {phase.value}"
        assert agent.pipeline is not None
        for phase in joined:
            assert self.plugin in [s.name for s in agent.pipeline[phase]], (
                f"the agent's profile does not run {self.plugin} in {phase.value}")

    async def test_returns_only_documented_verdicts(self, harness: Harness) -> None:
        await harness.start_agent()
        pods = self._pods(harness)
        await _through(harness, pods)
        _RUNTIME_CALLERS[type(self)] = any(c.stage == self.plugin for p in pods for c in harness.recorder.cri_of(p.uid))
        _assert_documented(harness.recorder.phases)
        _assert_observers_ended(harness.recorder.phases)
        await self._assert_nothing_left(harness, pods, "setup, observe and teardown")

    async def test_undo_is_safe_when_setup_never_ran(self, harness: Harness) -> None:
        uid = await harness.plant_orphan()
        await harness.start_agent()  # its replay finds the orphan and tears it down
        await harness.wait_gone(uid)
        calls = harness.recorder.of(uid)
        _assert_undone_twice(self.plugin, calls, "an orphan's teardown (setup never ran)")
        assert not any(c.phase in SETUP_PHASES for c in calls), (
            f"setup phases ran for an orphan: {[c.describe() for c in calls if c.phase in SETUP_PHASES]}")
        _assert_documented(harness.recorder.phases)
        left = await harness.leaks(uid, self.leaks)
        assert not left, f"after an orphan's teardown, what is left of pod {uid}: " + "; ".join(left)

    async def test_undo_is_idempotent_after_setup(self, harness: Harness) -> None:
        await harness.start_agent()
        pods = self._pods(harness)
        completing = [_completing(harness, pod, self) for pod in self._pods(harness)]
        await _through(harness, pods + completing)  # the completing ones: Completed, or what their stages said
        for pod in pods + completing:
            _assert_undone_twice(self.plugin, harness.recorder.of(pod.uid), f"the teardown of {pod.metadata.name}")
        _assert_documented(harness.recorder.phases)
        await self._assert_nothing_left(harness, pods + completing, "setup and a teardown whose undo ran twice")

    async def test_teardown_after_setup_cancelled(self, harness: Harness) -> None:
        """The deletion arrives at the entry of each setup phase call, in turn."""
        await harness.start_agent()
        scenarios = []
        pods = self._pods(harness)
        await _through(harness, pods, observe=0)  # what a complete setup of each calls
        for pod in pods:
            reference = [c for c in harness.recorder.of(pod.uid) if c.phase in SETUP_PHASES and c.repeat == 0]
            for index, call in enumerate(reference):
                copy = self.variant(harness, pod, f"e{index}")
                hold = harness.recorder.hold(copy.uid, "phase-entry", index, _setup_phase)
                scenarios.append(Scenario(copy, hold.reached, f"{call.stage}.{call.phase.value}() (#{index})"))
        await self._kill_at_each(harness, scenarios)
        _assert_documented(harness.recorder.phases)

    async def test_teardown_after_setup_cancelled_in_each_runtime_call(self, harness: Harness) -> None:
        """The deletion arrives during each runtime call the plugin's setup makes, at each
        :data:`~conformance.recorder.CANCEL_POINTS` of it."""
        if _RUNTIME_CALLERS.get(type(self)) is False:
            # The verdict test ran the same pods: none made this stage call the runtime.
            pytest.skip(f"{self.plugin} makes no runtime call in setup: there is no runtime call to cancel in")
        await harness.start_agent()
        scenarios = []
        pods = self._pods(harness)
        # First learn which runtime calls a complete setup makes, then cancel in each in turn.
        await _through(harness, pods, observe=0)
        for pod in pods:
            mine = [c for c in harness.recorder.cri_of(pod.uid) if c.stage == self.plugin]
            for point in CANCEL_POINTS:
                for ordinal, call in enumerate(mine):
                    copy = self.variant(harness, pod, f"{point[0]}{ordinal}")
                    hold = harness.recorder.hold(copy.uid, point, ordinal, _by(self.plugin))
                    where = f"runtime call #{ordinal} ({call.stage}.{call.phase.value}(): {call.method}, {point})"
                    # A call the runtime cannot hold for one pod only is held alone.
                    alone = point == "in-flight" and not harness.runtime.holds_for_one_pod(call.method)
                    scenarios.append(Scenario(copy, hold.reached, where, alone))
        if not scenarios:
            # Its setup phases themselves are cancelled at their entries (the test above).
            pytest.skip(f"{self.plugin} makes no runtime call in setup: there is no runtime call to cancel in")
        await self._kill_at_each(harness, scenarios)
        _assert_documented(harness.recorder.phases)

    async def test_setup_after_restart_adopts_what_exists(self, harness: Harness) -> None:
        await harness.start_agent()
        pods = self._pods(harness)
        await harness.run(*pods)
        for pod in pods:
            await harness.settle(pod)
        await harness.quiesce(*pods)  # a settled pod may still start containers, or exit
        before_states = {pod.uid: await harness.settle(pod) for pod in pods}
        before = {pod.uid: await harness.runtime_objects(pod.uid) for pod in pods}
        started = {pod.uid: await _started_at(harness, pod.uid) for pod in pods}
        await harness.stop_agent()
        agent = await harness.start_agent()  # same runtime, rootDir and manifests
        for pod in pods:
            # The same state again (a completed pod passes through Running while it is adopted).
            await harness.settle(pod, want=before_states[pod.uid])
        await anyio.sleep(observe_seconds(harness))
        try:
            for pod in pods:
                after = await harness.runtime_objects(pod.uid)
                assert after.ids() == before[pod.uid].ids(), (
                    f"after a restart the runtime objects of pod {pod.metadata.name} changed: "
                    f"before {before[pod.uid].describe()}; after {after.describe()}")
                assert await _started_at(harness, pod.uid) == started[pod.uid], (
                    f"a container of pod {pod.metadata.name} was restarted by the new agent")
                changed = [name for caller, name in agent.tracing.calls
                           if caller is not None and caller.uid == pod.uid and name in MUTATIONS]
                assert not changed, (
                    f"the new agent changed pod {pod.metadata.name} in the runtime while adopting it: {changed}")
        finally:
            await harness.delete(*pods)
            for pod in pods:
                await harness.wait_gone(pod)
        _assert_documented(harness.recorder.phases)
        await self._assert_nothing_left(harness, pods, "a restart, adoption and teardown")

    # --- helpers ---------------------------------------------------------------------------

    def variant(self, harness: Harness, pod: Pod, tag: str) -> Pod:
        """``pod`` again, as a new pod (a new UID and name: a UID that was torn down never runs
        again), for the cancellation tests. Override when a copy must differ in more (the gang
        test gives each its own gang)."""
        return copy_pod(harness, pod, tag)

    async def _kill_at_each(self, harness: Harness, scenarios: Sequence[Scenario]) -> None:
        """Run every scenario (concurrently, those that may be), each to its place and deleted
        there; then check nothing of any is left."""
        failures: list[str] = []
        await harness.run(*(s.pod for s in scenarios if not s.alone))  # one rescan for all of them

        async def one(scenario: Scenario) -> None:
            try:
                await self._kill_at(harness, scenario)
            except AssertionError as exc:
                failures.append(str(exc))
            except pytest.fail.Exception as exc:
                failures.append(str(exc))

        async with anyio.create_task_group() as tg:
            for scenario in scenarios:
                if not scenario.alone:
                    tg.start_soon(one, scenario)
        for scenario in scenarios:
            if scenario.alone:
                await one(scenario)
        assert not failures, f"{len(failures)} of {len(scenarios)} cancellations failed:\n" + "\n".join(failures)

    async def _kill_at(self, harness: Harness, scenario: Scenario) -> None:
        """Run the pod until ``reached``, delete it there, and check nothing of it is left."""
        pod, reached, where = scenario.pod, scenario.reached, scenario.where
        if harness.state(pod) is None:
            await harness.run(pod)
        settled: str | None = None
        with anyio.move_on_after(HOLD_TIMEOUT):
            async with anyio.create_task_group() as tg:
                async def until_reached() -> None:
                    await reached.wait()
                    tg.cancel_scope.cancel()

                async def until_settled() -> None:
                    nonlocal settled
                    while True:
                        settled = await harness.settle(pod, HOLD_TIMEOUT)
                        if settled != "Retrying":
                            break
                        # A retry the first pod did not make (a driver's health check missed on
                        # a loaded machine) runs the setup again: it may still reach the place.
                        await anyio.sleep(0.1)
                    tg.cancel_scope.cancel()

                tg.start_soon(until_reached)
                tg.start_soon(until_settled)
        assert reached.is_set(), (
            f"the setup of {pod.metadata.name} never reached {where} as the first pod's did (it settled: {settled})")
        await harness.delete(pod)
        await harness.wait_gone(pod)
        left = await harness.leaks(pod.uid, self.leaks)
        assert not left, f"after the deletion arrived at {where}, what is left of pod {pod.uid}: " + "; ".join(left)

    async def _assert_nothing_left(self, harness: Harness, pods: Sequence[Pod], after: str) -> None:
        for pod in pods:
            left = await harness.leaks(pod.uid, self.leaks)
            assert not left, f"after {after}, what is left of pod {pod.metadata.name} ({pod.uid}): " + "; ".join(left)


# --- runs ------------------------------------------------------------------------------------


@asynccontextmanager
async def _runtime(kind: RuntimeKind, containerd: Any) -> AsyncIterator[Any]:
    if kind == "memory":
        async with memory_runtime() as runtime:
            yield runtime
    else:
        yield containerd_runtime(containerd)


async def _through(harness: Harness, pods: Sequence[Pod], observe: float | None = None) -> dict[str, str]:
    """Run ``pods`` until each settled, let the observers watch (``observe`` seconds, default
    :func:`observe_seconds`), delete them, wait until gone."""
    await harness.run(*pods)
    states = {pod.uid: await harness.settle(pod) for pod in pods}
    if observe is None:
        observe = observe_seconds(harness)
    if observe:
        await anyio.sleep(observe)
    await harness.delete(*pods)
    for pod in pods:
        await harness.wait_gone(pod)
    return states


@dataclass(frozen=True)
class Scenario:
    """One pod whose deletion arrives where ``reached`` is set."""

    pod: Pod
    reached: anyio.Event
    where: str
    alone: bool = False
    """Run after the others, alone (the runtime holds its call for any pod)."""


def _setup_phase(call: object) -> bool:
    return isinstance(call, PhaseCall) and call.phase in SETUP_PHASES


def observe_seconds(harness: Harness) -> float:
    return OBSERVE_SECONDS[harness.runtime.kind]


def copy_pod(harness: Harness, pod: Pod, tag: str) -> Pod:
    """The same pod under a new UID and name (a UID that was torn down never runs again)."""
    data = pod.model_dump(by_alias=True, exclude_none=True)
    uid = str(uuid.uuid4())
    data["metadata"]["uid"] = uid
    data["metadata"]["name"] = f"{pod.metadata.name[:40]}-{tag}"
    harness.uids.append(uid)
    return Pod.model_validate(data)


def _completing(harness: Harness, pod: Pod, contract: StageContract) -> Pod:
    """``pod`` whose containers exit 0 at once and are not restarted: it completes, which
    unprepares it while its records stay, and is torn down when deleted."""
    data = pod.model_dump(by_alias=True, exclude_none=True)
    data["spec"]["restartPolicy"] = "Never"
    for container in data["spec"]["containers"]:
        container["command"] = ["sh", "-c", "exit 0"]
        container.pop("args", None)
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            container.pop(probe, None)
    return contract.variant(harness, Pod.model_validate(data), "done")


def _by(stage: str) -> Any:
    return lambda c: isinstance(c, CriCall) and c.stage == stage


def _handle(agent: Any) -> Any:
    """An AgentHandle as the agent builds its own (what a factory gets)."""
    return agent_handle(agent)


async def _started_at(harness: Harness, uid: str) -> dict[str, int]:
    objects = await harness.runtime_objects(uid)
    return {c.id: (await harness.client.container_status(c.id)).started_at for c in objects.containers}


# --- checks ------------------------------------------------------------------------------------


def _assert_documented(calls: Sequence[PhaseCall]) -> None:
    for call in calls:
        if call.cancelled or call.ended is None:
            continue
        spec = PHASE_SPECS[call.phase]
        if call.error is not None:
            if call.phase in (Phase.PREPARE, Phase.PERMIT, Phase.START):
                assert isinstance(call.error, _TYPED), (
                    f"{call.describe()}: {call.phase.value}() may raise only Retryable, Permanent or a CRI "
                    "error; anything else is a stage bug (the agent retries it forever as StageError)")
            elif call.phase in (Phase.ADMIT, Phase.RESERVE):
                raise AssertionError(f"{call.describe()}: {call.phase.value}() must answer with a verdict, "
                                     "not raise (the admission cycle rejects the pod as StageError)")
            else:
                raise AssertionError(f"{call.describe()}: {call.phase.value}() must not raise (the agent logs "
                                     "it and goes on; what it was to release may stay behind)")
            continue
        if call.phase not in SETUP_PHASES:
            continue
        result = call.result
        assert isinstance(result, Result), f"{call.describe()}: a phase returns a Result"
        assert result.verdict in spec.verdicts, (
            f"{call.describe()}: {call.phase.value} allows only {sorted(v.value for v in spec.verdicts)}")
        assert result.verdict not in _NEEDS_REASON or result.reason, (
            f"{call.describe()}: {result.verdict.name} without a reason; users see the reason in the pod's status")


def _assert_observers_ended(calls: Sequence[PhaseCall]) -> None:
    running = [c.describe() for c in calls if c.phase is Phase.OBSERVE and c.ended is None]
    assert not running, f"observe stages still running after their pods went: {running}"


def _assert_undone_twice(plugin: str, calls: Sequence[PhaseCall], during: str) -> None:
    undo = [c for c in calls if c.stage == plugin and c.phase in UNDO_PHASES]
    failed = [c.describe() for c in undo if c.error is not None]
    assert not failed, f"during {during}, an undo phase of {plugin} raised: {failed}"
    for phase in {c.phase for c in undo}:
        runs = [c.repeat for c in undo if c.phase is phase]
        assert 1 in runs, f"during {during}, {plugin}.{phase.value}() was not run a second time: {runs}"


__all__ = ["OBSERVE_SECONDS", "Scenario", "StageContract", "copy_pod"]
