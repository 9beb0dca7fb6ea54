"""The phase runner (issue 14 §4): exceptions map to verdicts once — Permanent rejects,
Retryable and retryable CRI errors retry for as long as it takes, anything else retries within
a budget and then fails the pod; undo runs every stage whatever the others do; and admission
takes pods waiting together in the kubelet's order (creation time, then UID)."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import grpc
import pytest

from cri import errors as cri_errors
from nodeagent.admission import AdmissionCycle
from nodeagent.errors import Permanent, Retryable
from nodeagent.model import Pod
from nodeagent.pipeline import UNEXPECTED_ATTEMPTS, Answer, PhaseRunner, RetryBudget, verdict_for
from nodeagent.registry import Pipeline
from nodeagent.stages import Admit, NodeInfo, NodeView, Phase, Prepare, Result, Verdict

pytestmark = pytest.mark.anyio


def _cri(cls: type[cri_errors.CriError], code: grpc.StatusCode) -> cri_errors.CriError:
    return cls("CreateContainer", "unix:///x", code, "details")


@pytest.mark.parametrize(("exc", "verdict", "reason"), [
    (Permanent("no", reason="Nope"), Verdict.REJECT, "Nope"),
    (Retryable("later", reason="NotYet"), Verdict.RETRY, "NotYet"),
    (_cri(cri_errors.Unavailable, grpc.StatusCode.UNAVAILABLE), Verdict.RETRY, "Unavailable"),
    (_cri(cri_errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT), Verdict.RETRY, "InvalidArgument"),
    (KeyError("bug"), Verdict.RETRY, "StageError"),
])
def test_exceptions_map_to_verdicts_once(exc: Exception, verdict: Verdict, reason: str) -> None:
    result = verdict_for(Phase.PREPARE, "s", exc, RetryBudget())
    assert (result.verdict, result.reason) == (verdict, reason)
    assert verdict_for(Phase.ADMIT, "s", exc).verdict is Verdict.REJECT, "admission has no RETRY"


def test_unexpected_failures_are_retried_within_a_budget_expected_ones_forever() -> None:
    budget = RetryBudget()
    bug = KeyError("bug")
    verdicts = [verdict_for(Phase.PREPARE, "s", bug, budget).verdict for _ in range(UNEXPECTED_ATTEMPTS)]
    assert verdicts == [Verdict.RETRY] * (UNEXPECTED_ATTEMPTS - 1) + [Verdict.REJECT]
    final = verdict_for(Phase.PREPARE, "other", bug, budget)
    assert final.verdict is Verdict.RETRY, "the budget is per stage"
    down = _cri(cri_errors.Unavailable, grpc.StatusCode.UNAVAILABLE)
    assert all(verdict_for(Phase.PREPARE, "s2", down, budget).verdict is Verdict.RETRY for _ in range(50))


class Flaky(Prepare):
    name: ClassVar[str] = "flaky"

    def __init__(self, failures: list[Exception | Result | None]) -> None:
        self.failures = failures
        self.undone = 0

    async def prepare(self, ctx: Any) -> Result:
        outcome = self.failures.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome if outcome is not None else Result.ok()

    async def unprepare(self, ctx: Any) -> None:
        self.undone += 1
        raise RuntimeError("undo bug")


class Second(Prepare):
    name: ClassVar[str] = "second"
    undone = 0

    async def prepare(self, ctx: Any) -> Result:
        return "yes"  # type: ignore[return-value]  # not a Result: a bug of this stage

    async def unprepare(self, ctx: Any) -> None:
        Second.undone += 1


def _pipeline(*stages: Any) -> Pipeline:
    return Pipeline({s.name: s for s in stages}, {Phase.PREPARE: tuple(stages),
                                                 Phase.UNPREPARE: tuple(reversed(stages))})


async def test_a_stage_that_recovers_resets_its_budget_and_a_wrong_answer_is_rejected() -> None:
    flaky = Flaky([KeyError("1"), KeyError("2"), None, KeyError("3")])
    runner = PhaseRunner(_pipeline(flaky, Second()))
    answers: list[Answer] = []

    async def report(answer: Answer) -> None:
        answers.append(answer)

    budget = RetryBudget(attempts=3)
    call = lambda stage: stage.prepare(None)  # noqa: E731
    assert (await runner.run(Phase.PREPARE, call, budget=budget, report=report)).verdict is Verdict.RETRY
    assert (await runner.run(Phase.PREPARE, call, budget=budget, report=report)).verdict is Verdict.RETRY
    third = await runner.run(Phase.PREPARE, call, budget=budget, report=report)
    assert (third.verdict, third.reason) == (Verdict.REJECT, "InvalidStageVerdict"), "second answered 'yes'"
    assert (await runner.run(Phase.PREPARE, call, budget=budget, report=report)).verdict is Verdict.RETRY, \
        "flaky's success reset its budget"
    assert [a.error is not None for a in answers] == [True, True, False, False, True]


async def test_undo_runs_every_stage_even_when_one_fails_or_hangs() -> None:
    class Hangs(Second):
        name: ClassVar[str] = "hangs"

        async def unprepare(self, ctx: Any) -> None:
            await anyio.sleep_forever()

    flaky, second = Flaky([]), Second()
    runner = PhaseRunner(_pipeline(second, Hangs(), flaky))
    answers: list[Answer] = []

    async def report(answer: Answer) -> None:
        answers.append(answer)

    before = Second.undone
    await runner.undo(Phase.UNPREPARE, lambda stage: stage.unprepare(None), timeout=0.2, report=report)
    assert flaky.undone == 1 and Second.undone == before + 1
    assert [(a.stage, type(a.error).__name__) for a in answers] == [
        ("flaky", "RuntimeError"), ("hangs", "TimeoutError"), ("second", "NoneType")]


class Recorder(Admit):
    name: ClassVar[str] = "recorder"

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        self.seen.append(pod.metadata.name)
        await anyio.sleep(0.01)
        return Result.ok()


def _pod(name: str, created: str | None, uid: str) -> Pod:
    meta: dict[str, Any] = {"name": name, "uid": uid}
    if created:
        meta["creationTimestamp"] = created
    return Pod.model_validate({"metadata": meta, "spec": {"containers": [{"name": "c", "image": "i"}]}})


async def test_pods_waiting_together_are_admitted_by_creation_time_then_uid() -> None:
    recorder = Recorder()
    cycle = AdmissionCycle(Pipeline({"recorder": recorder}, {Phase.ADMIT: (recorder,)}),
                           NodeInfo(name="n", ip="", allocatable={}, labels={}))
    pods = [_pod("late", "2026-01-01T00:00:09Z", "a"), _pod("b-early", "2026-01-01T00:00:01Z", "b"),
            _pod("static", None, "z"), _pod("a-early", "2026-01-01T00:00:01Z", "a2"),
            _pod("middle", "2026-01-01T00:00:05Z", "c")]
    async with anyio.create_task_group() as tg:
        for pod in pods:  # arrive together, newest first
            tg.start_soon(cycle.admit, pod)
    assert recorder.seen == ["static", "a-early", "b-early", "middle", "late"]
    assert len(cycle.admitted) == 5
