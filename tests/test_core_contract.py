"""The core's own rules: the lifecycle table, the phase contract, plugin validation, the bus
wiring. These need no runtime."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import anyio
import pytest
from pydantic import ValidationError

from nodeagent.bus import TOPOLOGY, Bus
from nodeagent.errors import IllegalTransition, PluginError
from nodeagent.events import EVENT_KINDS, PodAdmitted, PodRef
from nodeagent.lifecycle import TRANSITIONS, Lifecycle, PodState, Trigger, render_table
from nodeagent.model import Pod
from nodeagent.registry import DEFAULT_PROFILE, resolve, validate_stage
from nodeagent.stages import PHASES, Admit, NodeView, Phase, PodContext, Prepare, Reserve, Result, Stage

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("state", list(PodState))
@pytest.mark.parametrize("trigger", list(Trigger))
def test_every_state_and_trigger_pair_is_an_edge_or_refused(state: PodState, trigger: Trigger) -> None:
    life = Lifecycle(state=state)
    if (state, trigger) in TRANSITIONS:
        assert life.apply(trigger) is TRANSITIONS[(state, trigger)]
        assert life.history == [(state, trigger, TRANSITIONS[(state, trigger)])]
    else:
        with pytest.raises(IllegalTransition):
            life.apply(trigger)
        assert life.state is state and not life.history


def test_a_terminating_pod_never_runs_again() -> None:
    reachable = {PodState.TERMINATING}
    frontier = [PodState.TERMINATING]
    while frontier:
        state = frontier.pop()
        for (src, _), dst in TRANSITIONS.items():
            if src is state and dst not in reachable:
                reachable.add(dst)
                frontier.append(dst)
    assert reachable == {PodState.TERMINATING, PodState.TERMINATED}


def test_every_state_can_be_killed() -> None:
    assert all((state, Trigger.KILL) in TRANSITIONS for state in PodState)


def test_architecture_doc_shows_the_current_table() -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert render_table() in doc, "docs/ARCHITECTURE.md is stale: paste `nodeagent lifecycle` into it"


def test_architecture_doc_shows_the_current_profile_and_wiring() -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    profile = "\n".join(f"  {k}: [{', '.join(v)}]" for k, v in DEFAULT_PROFILE.items())
    assert profile in doc, "docs/ARCHITECTURE.md shows a stale default profile"
    assert TOPOLOGY.render() in doc, "docs/ARCHITECTURE.md is stale: paste `nodeagent wiring` into it"
    from nodeagent import facts
    from nodeagent.registry import stage_classes

    assert facts.render(stage_classes(DEFAULT_PROFILE)) in doc, \
        "docs/ARCHITECTURE.md shows a stale fact graph: paste the end of `nodeagent wiring` into it"


def test_phase_table_is_complete_and_pairs_are_declared() -> None:
    assert [spec.phase for spec in PHASES] == list(Phase)
    undo = {spec.phase: spec.undo for spec in PHASES if spec.undo}
    assert undo == {Phase.RESERVE: Phase.UNRESERVE, Phase.PREPARE: Phase.UNPREPARE, Phase.START: Phase.STOP}


# --- plugin validation ----------------------------------------------------------------------


class GoodAdmit(Admit):
    name: ClassVar[str] = "good"

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        return Result.ok()


def test_a_valid_plugin_passes() -> None:
    assert validate_stage("good", GoodAdmit()).name == "good"


def test_missing_undo_half_cannot_be_instantiated() -> None:
    class HalfReserve(Reserve):
        name: ClassVar[str] = "half"

        async def reserve(self, pod: Pod, node: NodeView) -> Result:
            return Result.ok()

    with pytest.raises(TypeError, match="unreserve"):
        HalfReserve()  # type: ignore[abstract]


def test_phase_method_without_its_protocol_is_refused() -> None:
    class Sneaky(GoodAdmit):
        async def prepare(self, ctx: PodContext) -> Result:
            return Result.ok()

    with pytest.raises(PluginError, match="does not inherit Prepare"):
        validate_stage("good", Sneaky())


def test_name_mismatch_and_non_stage_are_refused() -> None:
    with pytest.raises(PluginError, match="must agree"):
        validate_stage("other", GoodAdmit())
    with pytest.raises(PluginError, match="not a Stage"):
        validate_stage("x", object())


def test_wrong_signature_is_refused() -> None:
    class BadSignature(Admit):
        name: ClassVar[str] = "bad"

        async def admit(self, pod: Pod) -> Result:  # type: ignore[override]
            return Result.ok()

    with pytest.raises(PluginError, match="does not match the contract"):
        validate_stage("bad", BadSignature())


def test_profile_errors_are_precise() -> None:
    stages: Mapping[str, Stage] = {"good": GoodAdmit()}
    with pytest.raises(PluginError, match="unknown phase"):
        resolve({"admitt": ["good"]}, stages)
    with pytest.raises(PluginError, match="not installed"):
        resolve({"admit": ["missing"]}, stages)
    with pytest.raises(PluginError, match="does not implement it"):
        resolve({"prepare": ["good"]}, stages)
    with pytest.raises(PluginError, match="twice"):
        resolve({"admit": ["good", "good"]}, stages)


def test_undo_phases_run_in_reverse_profile_order() -> None:
    class P(Prepare):
        name: ClassVar[str] = "p"

        async def prepare(self, ctx: PodContext) -> Result:
            return Result.ok()

        async def unprepare(self, ctx: PodContext) -> None:
            return None

    class Q(P):
        name: ClassVar[str] = "q"

    pipeline = resolve({"prepare": ["p", "q"]}, {"p": P(), "q": Q()})
    assert [s.name for s in pipeline[Phase.PREPARE]] == ["p", "q"]
    assert [s.name for s in pipeline[Phase.UNPREPARE]] == ["q", "p"]


def test_duplicate_entry_point_names_are_refused() -> None:
    from importlib.metadata import EntryPoint

    from nodeagent import registry

    eps = [EntryPoint("x", "a:f", registry.GROUP), EntryPoint("x", "b:f", registry.GROUP)]
    original = registry.entry_points
    registry.entry_points = lambda group: eps  # type: ignore[assignment]
    try:
        with pytest.raises(PluginError, match="two plugins are named 'x'"):
            registry.discover()
    finally:
        registry.entry_points = original  # type: ignore[assignment]


def test_default_profile_resolves_with_the_installed_builtins() -> None:
    from nodeagent.registry import discover

    installed = set(discover())
    assert {n for names in DEFAULT_PROFILE.values() for n in names} <= installed


# --- the bus ------------------------------------------------------------------------------


def test_topology_names_only_real_event_kinds() -> None:
    for part in (*TOPOLOGY.publishers, *TOPOLOGY.subscribers):
        assert part.kinds == {"*"} or part.kinds <= EVENT_KINDS, part.name


@pytest.mark.anyio
async def test_bus_delivers_to_declared_subscribers_with_back_pressure() -> None:
    bus = Bus(capacity=1)
    event = PodAdmitted(pod=PodRef(uid="u"))
    await bus.publish(event)
    assert bus.depth() == {"dispatcher": 0, "trace": 1, "metrics": 1, "eventlog": 1}
    with anyio.move_on_after(0.2) as scope:
        await bus.publish(event)  # trace's stream is full: the publisher waits
    assert scope.cancelled_caught
    assert await bus.stream("trace").receive() is event


@pytest.mark.anyio
async def test_an_inbox_yields_facts_in_order_and_ends_when_the_bus_closes() -> None:
    bus = Bus()
    sent = [PodAdmitted(pod=PodRef(uid=f"u{i}")) for i in range(5)]
    for event in sent[:3]:
        await bus.publish(event)
    got: list[object] = []
    async with anyio.create_task_group() as tg:
        async def consume() -> None:
            async with bus.stream("trace") as inbox:
                async for event in inbox:
                    got.append(event)

        tg.start_soon(consume)
        await anyio.sleep(0.05)
        assert got == sent[:3]  # what was queued is taken at once
        for event in sent[3:]:
            await bus.publish(event)  # the consumer is waiting now
        await anyio.sleep(0.05)
        bus.close()
    assert got == sent


def test_events_are_frozen_facts() -> None:
    event = PodAdmitted(pod=PodRef(uid="u"))
    with pytest.raises(ValidationError, match="frozen"):
        event.source = "x"  # type: ignore[misc]
    for kind in EVENT_KINDS:
        assert re.match(r"^[A-Z][a-zA-Z]+(ed|en|Found|Waiting|Terminating|Unavailable|Available)$", kind), kind

