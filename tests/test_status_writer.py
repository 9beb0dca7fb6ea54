"""The single status writer: what reaches the sinks, whoever else reads the status."""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.events import PodRef
from nodeagent.lifecycle import PodState
from nodeagent.model import Pod
from nodeagent.podstatus import PodStatus
from nodeagent.status import StatusWriter, parse_rfc3339

pytestmark = pytest.mark.anyio


class RecordingSink:
    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    async def write(self, ref: PodRef, status: Mapping[str, Any]) -> None:
        self.writes.append(dict(status))

    async def forget(self, ref: PodRef) -> None:
        pass


REF = PodRef(uid="u1", namespace="ns", name="p")
ONE_CONTAINER = Pod.model_validate({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
                                   "spec": {"containers": [{"name": "c", "image": "i"}]}})
"""The pod most tests track (as ``REF``): one container ``c``, nothing else."""

RUNNING = {"name": "c", "image": "i", "imageID": "", "ready": True, "started": True, "restartCount": 0,
           "state": {"running": {}}, "lastState": {}}
"""The observed status of a running container ``c``."""


def _ready(status: Mapping[str, Any]) -> str:
    return next(c["status"] for c in status["conditions"] if c["type"] == "Ready")


async def test_a_change_seen_first_by_a_reader_still_reaches_the_sinks() -> None:
    # A reader (the local /pods endpoint, the kubelet API, a stage) computing the status
    # between a change and the flush must not make the writer think it was already sent.
    sink = RecordingSink()
    writer = StatusWriter([sink], host_ip="10.0.0.1")
    pod = Pod.model_validate({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
                              "spec": {"containers": [{"name": "c", "image": "i",
                                                       "readinessProbe": {"exec": {"command": ["true"]}}}]}})
    writer.track(PodRef(uid="u1", namespace="ns", name="p"), pod)
    writer.set_state("u1", PodState.RUNNING)
    observed = PodStatus.model_validate({"phase": "Running", "containerStatuses": [RUNNING],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                       {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    reporter = writer.reporter("u1")
    reporter.set_observed(observed)
    reporter.container_probe_result("c", ready=False)
    await writer.flush()
    assert _ready(sink.writes[-1]) == "False"

    reporter.container_probe_result("c", ready=True)
    assert _ready(writer.get("u1")) == "True"  # a reader sees it first
    await writer.flush()
    assert _ready(sink.writes[-1]) == "True"
    assert len(sink.writes) == 2
    await writer.flush()  # nothing changed: nothing is written again
    assert len(sink.writes) == 2


async def test_a_condition_that_goes_and_comes_back_gets_a_new_transition_time() -> None:
    # A resize condition is reported, dropped when the resize is done, and reported again by the
    # next resize: its lastTransitionTime is that of its return, not of its first appearance.
    writer = StatusWriter([RecordingSink()], host_ip="10.0.0.1")
    writer.track(REF, ONE_CONTAINER)
    writer.set_state("u1", PodState.RUNNING)
    reporter = writer.reporter("u1")
    base = {"phase": "Running", "containerStatuses": [RUNNING]}
    resizing = {"type": "PodResizeInProgress", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}

    def transition() -> str | None:
        found = [c for c in writer.get("u1")["conditions"] if c["type"] == "PodResizeInProgress"]
        return found[0]["lastTransitionTime"] if found else None

    def observe(*conditions: dict[str, Any]) -> None:
        reporter.set_observed(PodStatus.model_validate({**base, "conditions": list(conditions)}))

    observe(resizing)
    assert transition() == "2026-01-01T00:00:00Z"
    observe({**resizing, "lastTransitionTime": "2026-01-01T00:00:05Z"})
    assert transition() == "2026-01-01T00:00:00Z"  # unchanged status: the first time stays
    observe()
    assert transition() is None
    observe({**resizing, "lastTransitionTime": "2026-01-01T00:01:00Z"})
    assert transition() != "2026-01-01T00:00:00Z"  # back: not the time of its first appearance


async def test_a_rejected_pod_keeps_its_rejection_status_when_it_is_then_deleted() -> None:
    # The kubelet's rejected status is final. Deleting the pod (here: the taint eviction
    # controller deleting a pod that the node just rejected) moves it on to TERMINATED; the
    # status must still say why it was rejected, in the kubelet's words.
    sink = RecordingSink()
    writer = StatusWriter([sink], host_ip="10.0.0.1")
    writer.track(REF, ONE_CONTAINER)
    writer.reporter("u1").set_pod_reason("TaintToleration", "Predicate TaintToleration failed: ...")
    writer.set_state("u1", PodState.REJECTED)
    await writer.flush()
    rejected = {k: sink.writes[-1][k] for k in ("phase", "reason", "message")}
    assert rejected == {"phase": "Failed", "reason": "TaintToleration",
                        "message": "Pod was rejected: Predicate TaintToleration failed: ..."}
    writer.set_state("u1", PodState.TERMINATED)
    await writer.flush()
    assert {k: sink.writes[-1][k] for k in ("phase", "reason", "message")} == rejected


async def test_a_failed_pods_reason_outlives_a_stage_clearing_its_own_waiting_reason() -> None:
    # A gang released a member while its devices' preparation was failing: the pod failed with
    # the gang's reason, then the dra stage's unprepare cleared its own waiting reason. The
    # test_gang_e2e API-outage test read the member Failed with no reason at all (846d1ab).
    sink = RecordingSink()
    writer = StatusWriter([sink], host_ip="10.0.0.1")
    writer.track(REF, ONE_CONTAINER)
    writer.set_state("u1", PodState.PREPARING)
    reporter = writer.reporter("u1")
    reporter.set_pod_reason("FailedPrepareDynamicResources", "Failed to prepare dynamic resources: ...")
    writer.fail("u1", "GangAdmissionTimeout", "gang default/g did not commit within 8s")
    reporter.set_pod_reason("", "")
    writer.set_state("u1", PodState.TERMINATED)
    await writer.flush()
    assert {k: sink.writes[-1].get(k) for k in ("phase", "reason", "message")} == {
        "phase": "Failed", "reason": "GangAdmissionTimeout", "message": "gang default/g did not commit within 8s"}


class SlowSink(RecordingSink):
    """A sink whose writes wait until let go (a file sink's write in a worker thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()
        self.go = anyio.Event()

    async def write(self, ref: PodRef, status: Mapping[str, Any]) -> None:
        self.entered.set()
        await self.go.wait()
        await super().write(ref, status)


class OrderSink(RecordingSink):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def write(self, ref: PodRef, status: Mapping[str, Any]) -> None:
        self.calls.append(f"write {status['phase']}")

    async def forget(self, ref: PodRef) -> None:
        self.calls.append("forget")


async def test_a_worker_s_last_flush_waits_for_one_under_way_before_its_pod_is_forgotten() -> None:
    # The writer's own flush can be between two sinks' writes when a worker flushes and forgets
    # its pod: every sink must get the last status before it is told to forget the pod (the API
    # sink deletes a forgotten pod: a rejected pod deleted before its Failed status stayed
    # Pending in the API).
    slow, api = SlowSink(), OrderSink()
    writer = StatusWriter([slow, api], host_ip="10.0.0.1")
    writer.track(REF, ONE_CONTAINER)
    writer.reporter("u1").set_pod_reason("TaintToleration", "Predicate TaintToleration failed: ...")
    writer.set_state("u1", PodState.REJECTED)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.flush)  # the writer's loop
        await slow.entered.wait()

        async def worker_finishes() -> None:
            await writer.flush()
            await writer.forget("u1")

        tg.start_soon(worker_finishes)
        await anyio.sleep(0.05)
        slow.go.set()
    assert api.calls == ["write Failed", "forget"]


class FailingSink(RecordingSink):
    """A sink whose writes fail while ``failing`` (a full disk, an unwritable name)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True
        self.attempts = 0

    async def write(self, ref: PodRef, status: Mapping[str, Any]) -> None:
        self.attempts += 1
        if self.failing:
            raise OSError(28, "No space left on device")
        await super().write(ref, status)

    async def forget(self, ref: PodRef) -> None:
        if self.failing:
            raise OSError(28, "No space left on device")


async def test_a_failing_sink_is_contained_retried_and_catches_up() -> None:
    """One sink failing (ENOSPC) neither stops the writer nor keeps the other sinks behind;
    the failed pod is written again after a back-off, with its newest status, once it works."""
    good, bad = RecordingSink(), FailingSink()
    contained: list[tuple[str, Exception]] = []
    writer = StatusWriter([bad, good], host_ip="10.0.0.1", contain=lambda task, exc: contained.append((task, exc)))
    writer.track(REF, ONE_CONTAINER)
    writer.set_state("u1", PodState.ADMITTED)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.run)
        with anyio.fail_after(5):
            while not (good.writes and contained):
                await anyio.sleep(0.01)
        assert contained[0][0] == "status-sink" and "No space left" in str(contained[0][1])
        writer.set_state("u1", PodState.RUNNING)  # a change while the sink fails
        with anyio.fail_after(10):
            while bad.attempts < 3:
                await anyio.sleep(0.05)
        bad.failing = False
        with anyio.fail_after(40):
            while not bad.writes:
                await anyio.sleep(0.05)
        assert bad.writes[-1] == good.writes[-1], "the recovered sink gets the newest status"
        attempts = bad.attempts
        await anyio.sleep(1.5)
        assert bad.attempts == attempts, "written once it worked: no more retries"
        bad.failing = True
        await writer.forget("u1")  # a failing forget is contained too
        assert len(contained) > 3
        tg.cancel_scope.cancel()


async def test_a_status_that_cannot_be_computed_is_contained() -> None:
    sink = RecordingSink()
    contained: list[str] = []
    writer = StatusWriter([sink], host_ip="10.0.0.1", contain=lambda task, exc: contained.append(task))
    other = Pod.model_validate({"metadata": {"name": "q", "namespace": "ns", "uid": "u2"},
                                "spec": {"containers": [{"name": "c", "image": "i"}]}})
    writer.track(REF, ONE_CONTAINER)
    writer.track(PodRef(uid="u2", namespace="ns", name="q"), other)
    # What a buggy stage might say, past the model's validation.
    writer.reporter("u1").set_observed(PodStatus.model_construct(container_statuses="not a list"))
    await writer.flush()
    assert contained == ["status-sink"]
    assert len(sink.writes) == 1, "the other pod's status is written"


def _terminated(exit_code: int) -> dict[str, Any]:
    return {**RUNNING, "ready": False, "started": False,
            "state": {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}}}


@pytest.mark.parametrize(("observed", "source", "phase"), [
    ([_terminated(0)], "api", "Succeeded"),
    ([_terminated(143)], "api", "Failed"),
    ([{**RUNNING, "ready": False, "started": False,
       "state": {"waiting": {"reason": "ContainerCreating"}}}], "api", "Failed"),
    ([_terminated(0)], "file", None),
])
async def test_a_torn_down_api_pod_is_terminal_whatever_its_restart_policy(
        observed: list[dict[str, Any]], source: str, phase: str | None) -> None:
    # The kubelet's getPhase with podIsTerminal: a deleted restartPolicy Always pod whose
    # containers have stopped is Succeeded (all exited 0) or Failed, not Running for good; a
    # container that never ran shows as TerminatePod shows it (137, ContainerStatusUnknown).
    # A static pod keeps its restart policy's phase (the kubelet's TODO #116484).
    from nodeagent.labels import CONFIG_SOURCE
    sink = RecordingSink()
    writer = StatusWriter([sink], host_ip="10.0.0.1")
    pod = Pod.model_validate({"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                                           "annotations": {CONFIG_SOURCE: source}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}})
    writer.track(PodRef(uid="u1", namespace="ns", name="p"), pod)
    writer.set_state("u1", PodState.RUNNING)
    writer.reporter("u1").set_observed(PodStatus.model_validate({"phase": "Running", "containerStatuses": observed}))
    await writer.flush()
    before = sink.writes[-1]["phase"]
    writer.set_state("u1", PodState.TERMINATED)
    await writer.flush()
    status = sink.writes[-1]
    assert status["phase"] == (phase or before), status
    if observed[0]["state"].get("waiting"):
        assert status["containerStatuses"][0]["state"] == {"terminated": {
            "exitCode": 137, "reason": "ContainerStatusUnknown",
            "message": "The container could not be located when the pod was terminated"}}, status


def _strptime_reading(stamp: object) -> float | None:
    """What parse_rfc3339 answered while it was time.strptime (the reference for the hand parser)."""
    if not isinstance(stamp, str) or len(stamp) < 19:
        return None
    try:
        return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31)).map(
        lambda d: d.strftime("%Y-%m-%dT%H:%M:%S") + ".%06dZ" % d.microsecond),
    st.text(alphabet="0123456789-T:Z.", min_size=15, max_size=24),
    st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z"),
))
def test_api_timestamps_are_read_as_strptime_read_them(stamp: str) -> None:
    assert parse_rfc3339(stamp) == _strptime_reading(stamp)
