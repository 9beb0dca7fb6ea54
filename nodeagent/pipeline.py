"""The phase runner: the one place that calls stages.

The pod worker (prepare, permit, start, and the undo phases), the admission cycle (admit,
reserve, unreserve) and the contract suite all run phases through :class:`PhaseRunner`, so a
stage is called, timed, checked and forgiven the same way everywhere:

* stages of a phase run in profile order; the first answer other than CONTINUE / SKIP decides;
* an answer outside the phase's documented verdicts is a bug of that stage: REJECT
  ``InvalidStageVerdict`` (never an accidental CONTINUE);
* an exception becomes a verdict here, once (:func:`verdict_for`): :class:`Permanent` →
  REJECT with its reason; :class:`Retryable` and a retryable CRI error (the runtime down, slow
  or overloaded) → RETRY, as often as it takes; anything else — a non-retryable CRI error, a
  stage's bug — → RETRY too (the kubelet keeps retrying a pod's sync), but counted against a
  :class:`RetryBudget`: after ``UNEXPECTED_ATTEMPTS`` such failures of one stage in one phase
  the pod fails instead of retrying forever. Phases without RETRY (admit, reserve) REJECT;
* undo phases (stop, unprepare, cleanup, unreserve) run every stage whatever the others do,
  each bounded by a timeout; a failure is reported and the next stage runs.

Every answer (and every mapped exception) reaches the runner's ``report`` callback with its
duration: the worker turns them into StageCompleted / StageFailed facts and metrics.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import structlog

from cri import CriError
from nodeagent.errors import Permanent, Retryable
from nodeagent.registry import Pipeline
from nodeagent.stages import PHASE_SPECS, Phase, Result, Stage, Verdict

log = structlog.get_logger("nodeagent.pipeline")

UNEXPECTED_ATTEMPTS = 5
"""Unexpected failures (not Retryable, not a retryable CRI error) a stage may have in one
phase for one pod before the pod fails rather than retrying."""


@dataclass(frozen=True)
class Answer:
    stage: str
    phase: Phase
    result: Result
    seconds: float
    error: BaseException | None = None
    """The exception the result was made from (None: the stage answered)."""


Report = Callable[[Answer], Awaitable[None]]
Call = Callable[[Stage], Awaitable[Result | None]]


async def _ignore(answer: Answer) -> None:
    return None


@dataclass
class RetryBudget:
    """Unexpected failures so far, per (stage, phase), for one pod."""

    attempts: int = UNEXPECTED_ATTEMPTS
    spent: dict[tuple[str, Phase], int] = field(default_factory=dict)

    def spend(self, stage: str, phase: Phase) -> bool:
        """Count one; False once the stage has used up its attempts in this phase."""
        used = self.spent.get((stage, phase), 0) + 1
        self.spent[(stage, phase)] = used
        return used < self.attempts

    def reset(self, stage: str, phase: Phase) -> None:
        self.spent.pop((stage, phase), None)


def expected(exc: BaseException) -> bool:
    """A failure the world may undo by itself: retried without counting."""
    return isinstance(exc, Retryable) or (isinstance(exc, CriError) and exc.retryable)


def verdict_for(phase: Phase, stage: str, exc: BaseException, budget: RetryBudget | None = None) -> Result:
    """The verdict an exception of ``stage`` in ``phase`` stands for (see the module's doc)."""
    retry_allowed = Verdict.RETRY in PHASE_SPECS[phase].verdicts
    if isinstance(exc, Permanent):
        return Result.reject(exc.reason, str(exc))
    if isinstance(exc, Retryable):
        reason, message = exc.reason, str(exc)
    elif isinstance(exc, CriError):
        reason, message = type(exc).__name__, str(exc)
    else:
        reason, message = "StageError", f"stage {stage!r} failed in phase {phase.value}: {exc!r}"
    if not retry_allowed:
        return Result.reject(reason, message)
    if expected(exc) or budget is None or budget.spend(stage, phase):
        return Result.retry(reason, message)
    attempts = budget.attempts
    return Result.reject(reason, f"{message} (failed {attempts} times; not retried again)")


def checked(phase: Phase, stage: str, result: object) -> Result:
    """A stage's answer, if it is one its phase allows."""
    if isinstance(result, Result) and result.verdict in PHASE_SPECS[phase].verdicts:
        return result
    return Result.reject("InvalidStageVerdict", f"stage {stage!r} answered {result!r} in phase {phase.value}")


class PhaseRunner:
    def __init__(self, pipeline: Pipeline, report: Report = _ignore) -> None:
        self._pipeline = pipeline
        self._report = report

    def stages(self, phase: Phase) -> tuple[Stage, ...]:
        return self._pipeline[phase]

    async def run(self, phase: Phase, call: Call, *, budget: RetryBudget | None = None,
                  report: Report | None = None) -> Result:
        """Every stage of ``phase`` in order until one answers other than CONTINUE / SKIP."""
        for stage in self._pipeline[phase]:
            answer = await self.ask(phase, stage, call, budget=budget, report=report)
            if answer.result.verdict not in (Verdict.CONTINUE, Verdict.SKIP):
                return answer.result
        return Result.ok()

    async def ask(self, phase: Phase, stage: Stage, call: Call, *, budget: RetryBudget | None = None,
                  report: Report | None = None) -> Answer:
        """One stage's answer to ``call(stage)``, timed, checked and reported."""
        begin = time.monotonic()
        error: BaseException | None = None
        try:
            result = checked(phase, stage.name, await call(stage))
            if budget is not None and result.verdict is not Verdict.RETRY:
                budget.reset(stage.name, phase)
        except Exception as exc:  # noqa: BLE001 - mapped to a verdict, once, here
            error = exc
            if not expected(exc) and not isinstance(exc, Permanent):
                log.exception("stage raised", stage=stage.name, phase=phase.value)
            result = verdict_for(phase, stage.name, exc, budget)
        answer = Answer(stage.name, phase, result, time.monotonic() - begin, error)
        await (report or self._report)(answer)
        return answer

    async def undo(self, phase: Phase, call: Call, *, timeout: float, report: Report | None = None) -> None:
        """Every stage of an undo phase (already in reverse profile order), each bounded by
        ``timeout`` and shielded: what was set up is taken down even when the caller is being
        cancelled. A stage that fails or times out is reported; the next one still runs."""
        with anyio.CancelScope(shield=True):
            for stage in self._pipeline[phase]:
                begin = time.monotonic()
                error: BaseException | None = None
                with anyio.move_on_after(timeout) as scope:
                    try:
                        await call(stage)
                    except Exception as exc:  # noqa: BLE001 - reported; the other stages still undo
                        log.exception("undo phase failed", stage=stage.name, phase=phase.value)
                        error = exc
                if scope.cancelled_caught and error is None:
                    error = TimeoutError(f"stage {stage.name!r} did not finish {phase.value} within {timeout:g}s")
                    log.error("undo phase timed out", stage=stage.name, phase=phase.value, timeout=timeout)
                result = Result.ok() if error is None else Result.reject(type(error).__name__, str(error))
                await (report or self._report)(Answer(stage.name, phase, result, time.monotonic() - begin, error))


__all__ = ["Answer", "PhaseRunner", "Report", "RetryBudget", "UNEXPECTED_ATTEMPTS", "checked", "expected",
           "verdict_for"]
