"""The contract every stage plugin passes: ours and third-party ones alike.

Subclass :class:`StageContract` in a test module, name the subclass ``Test...`` and set
``plugin`` to your entry-point name (and ``config`` to its configuration section)::

    from conformance.contract import StageContract

    class TestMyPluginContract(StageContract):
        plugin = "myplugin"
        config = {"key": "value"}

The inherited tests load the plugin through its entry point and drive it against a real
containerd (the ``containerd`` fixture: nodeagent's own session fixture, or
``conformance.harness``'s when you load that module as a pytest plugin). Each checks one
promise of the phase contract in :mod:`nodeagent.stages`:

- **it loads**: the entry point's factory builds a stage that :func:`nodeagent.registry.validate_stage`
  accepts, and :func:`nodeagent.registry.load` orders it as the agent would;
- **only documented verdicts**: every answer in a setup phase is a :class:`~nodeagent.stages.Result`
  whose verdict is in ``PHASE_SPECS[phase].verdicts``; REJECT, RETRY and WAIT carry a reason;
- **undo is idempotent**: stop, unprepare, cleanup and unreserve succeed when their partner never
  ran, and when called twice after a complete setup;
- **teardown after a cancelled setup**: setup cancelled after 0, 10, 50 and 200 ms, and at each
  of its runtime calls (as the call begins, while it is in flight, and after the runtime did the
  work but before the stage saw the answer), is followed by a shielded teardown that leaves
  nothing in the runtime for the pod (no sandbox, no container labelled with its UID);
- **restart replay**: setup run again by a fresh instance (an agent restart) adopts what exists
  instead of duplicating it.

Each test also fails when the runtime still holds anything for its pods at its end. Override
:meth:`StageContract.pods` to run your stage against pods that take it down more paths.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from conformance.harness import (
    CANCEL_POINTS,
    CancelPoint,
    Harness,
    RuntimeObjects,
    StageVerdict,
    open_harness,
)
from nodeagent.model import Pod
from nodeagent.registry import CONFIGURABLE, configuration, create, discover, load, load_factory
from nodeagent.stages import PHASE_SPECS, Phase, Result, Verdict, phases_of

CANCEL_DELAYS: tuple[float, ...] = (0.0, 0.01, 0.05, 0.2)
"""Seconds after which a setup is cancelled (0: before its first await completes)."""
OBSERVE_SECONDS = 0.5
"""How long observe stages watch a started pod in the verdict test before they are cancelled."""

_NEEDS_REASON = frozenset({Verdict.REJECT, Verdict.RETRY, Verdict.WAIT})


class StageContract:
    """Inherit this in a ``Test*`` class and set :attr:`plugin`; see the module docstring."""

    plugin: ClassVar[str] = ""
    """The plugin's entry-point name in group ``nodeagent.plugins``."""
    config: ClassVar[Mapping[str, Any]] = {}
    """The plugin's configuration section (``plugins: {<name>: ...}`` in the agent configuration)."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio, pytest.mark.containerd]

    # --- fixtures and hooks a subclass may override --------------------------------------

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"  # grpc.aio, under the CRI client, runs on asyncio only

    @pytest.fixture
    async def harness(self, containerd: Any, tmp_path: Path) -> AsyncIterator[Harness]:
        assert self.plugin, f"{type(self).__name__} must set plugin = '<entry-point name>'"
        async with open_harness(containerd.endpoint, tmp_path, self.plugin, self.config) as h:
            yield h

    def pods(self, harness: Harness) -> list[Pod]:
        """The pods the verdict test runs the stage against: one busybox pod by default.

        Override to add pods that take your stage down other paths (one it rejects, one it
        skips); build them with ``harness.pod(labels=..., containers=...)``.
        """
        return [harness.pod()]

    # --- the contract --------------------------------------------------------------------

    async def test_loads_through_entry_point(self, harness: Harness) -> None:
        eps = discover()
        assert self.plugin in eps, f"no entry point {self.plugin!r} in group nodeagent.plugins"
        factory = load_factory(self.plugin, eps[self.plugin])
        # The registry's own path: the section validated by the plugin's model, then the factory.
        stage = create(self.plugin, factory, configuration(self.plugin, factory, self.config), harness.handle)
        declared = getattr(factory, "stage_class", None)
        assert declared is None or declared is type(stage), (
            f"{eps[self.plugin].value}.stage_class is {declared!r} but the factory returns "
            f"{type(stage)!r}: `nodeagent plugins` would show the wrong phases"
        )
        joined = phases_of(stage)
        profile = {name: [self.plugin] for name in CONFIGURABLE if Phase(name) in joined}
        pipeline, _ = load(profile, {self.plugin: dict(self.config)}, harness.handle,
                           entry={self.plugin: eps[self.plugin]})
        for phase in joined:
            assert [s.name for s in pipeline[phase]] == [self.plugin], f"{self.plugin} missing from {phase.value}"

    async def test_returns_only_documented_verdicts(self, harness: Harness) -> None:
        for pod in self.pods(harness):
            worker = harness.worker(pod)
            try:
                stopped = await harness.setup(worker)
                if stopped is None:
                    await harness.observe(worker, OBSERVE_SECONDS)
            finally:
                await harness.teardown(worker)
            await _assert_runtime_empty(harness, pod.uid, "setup, observe and teardown")
        _assert_documented(harness.verdicts)

    async def test_undo_is_safe_when_setup_never_ran(self, harness: Harness) -> None:
        pod = harness.pod()
        await harness.teardown(harness.worker(pod), times=2)
        await _assert_runtime_empty(harness, pod.uid, "teardown without setup")

    async def test_undo_is_idempotent_after_setup(self, harness: Harness) -> None:
        pod = harness.pod()
        worker = harness.worker(pod)
        try:
            await harness.setup(worker)
        finally:
            await harness.teardown(worker, times=2)
        await _assert_runtime_empty(harness, pod.uid, "setup and a teardown run twice")
        _assert_documented(harness.verdicts)

    @pytest.mark.parametrize("delay", CANCEL_DELAYS, ids=lambda d: f"{int(d * 1000)}ms")
    async def test_teardown_after_setup_cancelled(self, harness: Harness, delay: float) -> None:
        pod = harness.pod()
        worker = harness.worker(pod)
        with anyio.move_on_after(delay):
            await harness.setup(worker)
        await harness.teardown(worker)
        await _assert_runtime_empty(harness, pod.uid, f"setup cancelled after {delay}s and teardown")
        _assert_documented(harness.verdicts)

    @pytest.mark.parametrize("point", CANCEL_POINTS)
    async def test_teardown_after_setup_cancelled_in_each_runtime_call(
        self, harness: Harness, point: CancelPoint
    ) -> None:
        # First learn which runtime calls a complete setup makes, then cancel in each in turn.
        pod = harness.pod()
        worker = harness.worker(pod)
        harness.calls.calls = []
        try:
            await harness.setup(worker)
        finally:
            calls = list(harness.calls.calls)
            await harness.teardown(worker)
        await _assert_runtime_empty(harness, pod.uid, "setup and teardown")
        for index, name in enumerate(calls):
            pod = harness.pod()
            worker = harness.worker(pod)
            with anyio.CancelScope() as scope:
                harness.calls.cancel_during(index, scope, point)
                await harness.setup(worker)
            harness.calls.disarm()
            await harness.teardown(worker)
            await _assert_runtime_empty(harness, pod.uid, f"setup cancelled ({point}) in runtime call #{index} ({name})")
        # A call cancelled on our side may still complete in the runtime: look again at the end.
        for uid in harness.uids:
            await _assert_runtime_empty(harness, uid, "all the cancelled setups (checked again at the end)")
        _assert_documented(harness.verdicts)

    async def test_setup_after_restart_adopts_what_exists(self, harness: Harness) -> None:
        pod = harness.pod()
        worker = harness.worker(pod)
        try:
            # When the stage does not set this pod up, there is nothing to adopt.
            if await harness.setup(worker) is None:
                before = await harness.runtime_objects(pod.uid)
                harness.new_stage()
                worker = harness.worker(pod)  # a fresh stash: nothing remembered but the runtime
                await harness.setup(worker)
                after = await harness.runtime_objects(pod.uid)
                assert _ids(after) == _ids(before), (
                    f"setup after a restart changed the runtime objects of the pod: "
                    f"before {before.describe()}; after {after.describe()}"
                )
        finally:
            await harness.teardown(worker)
        await _assert_runtime_empty(harness, pod.uid, "setup, restart, setup and teardown")
        _assert_documented(harness.verdicts)


# --- checks ----------------------------------------------------------------------------


def _assert_documented(verdicts: list[StageVerdict]) -> None:
    for v in verdicts:
        allowed = PHASE_SPECS[v.phase].verdicts
        assert isinstance(v.result, Result), (
            f"stage {v.stage!r} returned {v.result!r} from {v.phase.value}(); a phase returns a Result"
        )
        assert v.verdict in allowed, (
            f"stage {v.stage!r} answered {v.result!r} in {v.phase.value}; "
            f"that phase allows only {sorted(a.value for a in allowed)}"
        )
        assert v.verdict not in _NEEDS_REASON or v.result.reason, (
            f"stage {v.stage!r} answered {v.verdict.name if v.verdict else None} in {v.phase.value} "
            "without a reason; users see the reason in the pod's status"
        )


async def _assert_runtime_empty(harness: Harness, uid: str, after: str) -> None:
    left = await harness.runtime_objects(uid)
    assert not left, f"after {after}, the runtime still holds for pod {uid}: {left.describe()}"


def _ids(objects: RuntimeObjects) -> tuple[frozenset[str], frozenset[str]]:
    return frozenset(s.id for s in objects.sandboxes), frozenset(c.id for c in objects.containers)


__all__ = ["CANCEL_DELAYS", "StageContract"]
