"""How the relister merges a container's creation or start taken from the runtime's event with
its listings (nodeagent/pleg.py): a record only moves forward, a listing that began before an
event neither takes the container back nor drops it, and an expectation no event meets becomes
a relist of the pod. The relister runs on a stand-in runtime that answers the one call these
listings leave to make (a new sandbox's IP); tests/test_evented_pleg.py has the real runtime's
events."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from cri import types as t
from nodeagent import labels as L
from nodeagent import pleg
from nodeagent.events import ContainerStarted, Event
from nodeagent.pleg import Relister

pytestmark = pytest.mark.anyio

NODE = "n1"
UID = "uid-1"
SANDBOX = "sb-1"
LABELS = {L.MANAGED_BY: NODE, L.POD_UID: UID, L.POD_NAME: "p", L.POD_NAMESPACE: "default"}


class SandboxIpRuntime:
    """Stand-in runtime: answers PodSandboxStatus (an IP) and counts the listings asked of it."""

    endpoint = "stand-in"

    def __init__(self) -> None:
        self.listings = 0

    async def pod_sandbox_status(self, sandbox_id: str) -> t.PodSandboxStatus:
        return t.PodSandboxStatus(id=sandbox_id, network=t.PodSandboxNetworkStatus(ip="10.0.0.2"))

    async def list_pod_sandbox(self, filter: Any = None) -> list[t.PodSandbox]:
        self.listings += 1
        return [sandbox()]

    async def list_containers(self, filter: Any = None) -> list[t.Container]:
        return []


def sandbox() -> t.PodSandbox:
    return t.PodSandbox(id=SANDBOX, metadata=t.PodSandboxMetadata(name="p", uid=UID, namespace="default"),
                        state=t.PodSandboxState.SANDBOX_READY, created_at=1, labels=dict(LABELS))


def listed(container_id: str, state: t.ContainerState) -> t.Container:
    return t.Container(id=container_id, pod_sandbox_id=SANDBOX, metadata=t.ContainerMetadata(name="main"),
                       state=state, created_at=2, labels={**LABELS, L.CONTAINER_NAME: "main"})


def event(container_id: str, kind: t.ContainerEventType, state: t.ContainerState) -> t.ContainerEvent:
    status = t.ContainerStatus(id=container_id, metadata=t.ContainerMetadata(name="main"), state=state,
                               created_at=2, started_at=3 if state != t.ContainerState.CONTAINER_CREATED else 0,
                               labels={**LABELS, L.CONTAINER_NAME: "main"})
    return t.ContainerEvent(container_id=container_id, container_event_type=kind, created_at=time.time_ns(),
                            pod_sandbox_status=t.PodSandboxStatus(
                                id=SANDBOX, metadata=t.PodSandboxMetadata(name="p", uid=UID, namespace="default"),
                                labels=dict(LABELS)),
                            containers_statuses=[status])


async def relister_with_pod() -> tuple[Relister, list[Event], SandboxIpRuntime]:
    facts: list[Event] = []

    async def publish(fact: Event) -> None:
        facts.append(fact)

    runtime = SandboxIpRuntime()
    relister = Relister(runtime, NODE, publish)  # type: ignore[arg-type]
    await relister._update([sandbox()], [], time.time(), None)
    relister._stream_since, relister._stream_events = time.monotonic(), 1  # the stream is up
    return relister, facts, runtime


async def test_a_start_event_puts_the_container_in_the_pods_record_and_meets_the_expectation() -> None:
    relister, facts, _ = await relister_with_pod()
    before = relister.pod(UID).seen_at
    relister.request_relist(UID, expect=("c1", "running"))
    assert relister.pod(UID).seen_at == before, "nothing shows the start yet"
    await relister._apply(event("c1", t.ContainerEventType.CONTAINER_STARTED_EVENT,
                                t.ContainerState.CONTAINER_RUNNING))
    record = relister.pod(UID).latest("main")
    assert record is not None and record.running and record.sandbox_id == SANDBOX
    assert relister.pod(UID).seen_at > before, "the expectation met: the record is fresh"
    assert [type(f) for f in facts] == [ContainerStarted]
    # The creation's event, come late: nothing moves back, nothing is published again.
    await relister._apply(event("c1", t.ContainerEventType.CONTAINER_CREATED_EVENT,
                                t.ContainerState.CONTAINER_CREATED))
    assert relister.pod(UID).latest("main").running  # type: ignore[union-attr]
    assert len(facts) == 1


async def test_a_listing_older_than_an_event_neither_takes_back_nor_drops_the_container() -> None:
    relister, facts, _ = await relister_with_pod()
    began = time.time()
    await relister._apply(event("c1", t.ContainerEventType.CONTAINER_STARTED_EVENT,
                                t.ContainerState.CONTAINER_RUNNING))
    # Listed as created, by a listing that began before the start was applied: kept running.
    await relister._update([sandbox()], [listed("c1", t.ContainerState.CONTAINER_CREATED)], began, {UID})
    assert relister.pod(UID).latest("main").running  # type: ignore[union-attr]
    # Not listed at all by such a listing (created after it answered): kept.
    await relister._update([sandbox()], [], began, None)
    assert relister.pod(UID).latest("main") is not None
    assert len(facts) == 1, facts
    # A listing that began after the event and does not show it: it is gone.
    await relister._update([sandbox()], [], time.time(), {UID})
    assert relister.pod(UID).latest("main") is None


async def test_an_event_for_a_pod_the_cache_does_not_know_is_left_to_a_listing() -> None:
    relister, facts, _ = await relister_with_pod()
    stray = event("c9", t.ContainerEventType.CONTAINER_STARTED_EVENT, t.ContainerState.CONTAINER_RUNNING)
    other = t.PodSandboxStatus(id="sb-9", metadata=t.PodSandboxMetadata(name="q", uid="uid-9"), labels=dict(LABELS))
    await relister._apply(t.ContainerEvent(container_id="c9", container_event_type=stray.container_event_type,
                                           pod_sandbox_status=other, containers_statuses=stray.containers_statuses))
    assert relister.pod("uid-9").containers == () and not facts


async def test_an_expectation_no_event_meets_relists_the_pod_after_the_grace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pleg, "EXPECT_GRACE_SECONDS", 0.2)
    relister, _, runtime = await relister_with_pod()
    relister._full_at = time.monotonic()
    relister._evented_period = 600.0  # no node-wide relist in the test's way
    listings = runtime.listings
    async with anyio.create_task_group() as tg:
        relister._settle_group = tg
        await tg.start(relister._relist_forever)
        listings = runtime.listings
        relister.request_relist(UID, expect=("c1", "running"))
        await anyio.sleep(0.1)
        assert runtime.listings == listings, "relisted before the grace was out"
        with anyio.fail_after(5):
            while runtime.listings == listings:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    assert UID not in relister._expected


async def test_an_expectation_on_a_runtime_without_events_is_a_relist() -> None:
    relister, _, _ = await relister_with_pod()
    relister._stream_since = None  # containerd 1.6: no stream
    relister.request_relist(UID, expect=("c1", "running"))
    assert UID in relister._want_pods and UID not in relister._expected


def sandbox_event(sandbox_id: str, uid: str) -> t.ContainerEvent:
    return t.ContainerEvent(container_id=sandbox_id, container_event_type=t.ContainerEventType.CONTAINER_STARTED_EVENT,
                            created_at=time.time_ns(), pod_sandbox_status=t.PodSandboxStatus(
                                id=sandbox_id, metadata=t.PodSandboxMetadata(name="q", uid=uid, namespace="default"),
                                state=t.PodSandboxState.SANDBOX_READY, created_at=5,
                                network=t.PodSandboxNetworkStatus(ip="10.0.0.9"),
                                labels={**LABELS, L.POD_UID: uid}))


async def test_a_new_sandboxs_event_makes_its_pods_record_and_a_listing_older_than_it_keeps_it() -> None:
    relister, facts, runtime = await relister_with_pod()
    relister.request_relist("uid-2", expect=("sb-2", "ready"))
    assert "uid-2" in relister._expected
    began = time.time()
    await relister._apply(sandbox_event("sb-2", "uid-2"))
    pod = relister.pod("uid-2")
    assert [(sb.id, sb.ready, sb.pod_ip) for sb in pod.sandboxes] == [("sb-2", True, "10.0.0.9")]
    assert pod.name == "q" and pod.seen_at > began, "the expectation met: the record is fresh"
    assert "uid-2" not in relister._expected
    # A node-wide listing that began before the event (it shows only the first pod): kept.
    await relister._update([sandbox()], [], began, None)
    assert [sb.id for sb in relister.pod("uid-2").sandboxes] == ["sb-2"]
    # One that began after it and does not show it: the sandbox is gone, and its pod.
    await relister._update([sandbox()], [], time.time(), None)
    assert relister.pod("uid-2").sandboxes == ()
    assert not facts


async def test_an_exit_and_a_sandboxs_stop_are_taken_from_their_events_and_move_only_forward() -> None:
    relister, facts, _ = await relister_with_pod()
    await relister._apply(event("c1", t.ContainerEventType.CONTAINER_STARTED_EVENT,
                                t.ContainerState.CONTAINER_RUNNING))
    began = time.time()
    exited = event("c1", t.ContainerEventType.CONTAINER_STOPPED_EVENT, t.ContainerState.CONTAINER_EXITED)
    assert await relister._apply(exited)
    assert relister.pod(UID).latest("main").exited  # type: ignore[union-attr]
    assert [type(f).__name__ for f in facts] == ["ContainerStarted", "ContainerExited"]
    stopped = t.ContainerEvent(container_id=SANDBOX, container_event_type=t.ContainerEventType.CONTAINER_STOPPED_EVENT,
                               pod_sandbox_status=t.PodSandboxStatus(
                                   id=SANDBOX, metadata=t.PodSandboxMetadata(name="p", uid=UID, namespace="default"),
                                   state=t.PodSandboxState.SANDBOX_NOTREADY, labels=dict(LABELS)))
    assert await relister._apply(stopped)
    assert [sb.ready for sb in relister.pod(UID).sandboxes] == [False]
    # A listing that began before both shows the sandbox ready and the container running: the
    # events' records stand, and nothing is published again.
    await relister._update([sandbox()], [listed("c1", t.ContainerState.CONTAINER_RUNNING)], began, {UID})
    assert [sb.ready for sb in relister.pod(UID).sandboxes] == [False]
    assert relister.pod(UID).latest("main").exited  # type: ignore[union-attr]
    assert len(facts) == 2
    # An exit the cache cannot place (a pod it does not know) is left to a listing.
    stray = event("c9", t.ContainerEventType.CONTAINER_STOPPED_EVENT, t.ContainerState.CONTAINER_EXITED)
    other = t.PodSandboxStatus(id="sb-9", metadata=t.PodSandboxMetadata(name="q", uid="uid-9"), labels=dict(LABELS))
    assert not await relister._apply(t.ContainerEvent(
        container_id="c9", container_event_type=stray.container_event_type, pod_sandbox_status=other,
        containers_statuses=stray.containers_statuses))


async def test_a_change_that_came_while_the_reader_was_busy_is_not_waited_out() -> None:
    """A stage reads the pod's record, is busy for a moment (a status computed, a message read),
    and a container's exit comes meanwhile: its wait must return at once, not at the next change
    (with events that can be the safety-net relist, 10 s later: a pod whose containers both
    exited right after their start was reported Succeeded only then)."""
    relister, _, _ = await relister_with_pod()
    read_at = relister.version(UID)
    await relister._apply(event("c1", t.ContainerEventType.CONTAINER_STARTED_EVENT, t.ContainerState.CONTAINER_RUNNING))
    with anyio.fail_after(5):
        await relister.wait_changed(UID, timeout=30, since=read_at)
    # Read again: nothing newer, so the wait waits for the next change.
    read_at = relister.version(UID)
    with anyio.move_on_after(0.3) as waited:
        await relister.wait_changed(UID, timeout=30, since=read_at)
    assert waited.cancelled_caught
    # A waiter already waiting is woken by the change, as before.
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(relister.wait_changed, UID, 30, read_at)
            await anyio.sleep(0.05)
            await relister._apply(event("c1", t.ContainerEventType.CONTAINER_STOPPED_EVENT,
                                        t.ContainerState.CONTAINER_EXITED))
