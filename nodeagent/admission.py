"""The node-wide admission cycle: admit and reserve, one pod at a time.

Like the scheduler's scheduling cycle, admission is serial so that every decision sees every
pod admitted before it (and never the candidate itself). Pods enter in the order their workers
ask, which is the order sources reported them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import structlog

from nodeagent.model import Pod
from nodeagent.registry import Pipeline
from nodeagent.stages import PHASE_SPECS, Admit, NodeInfo, NodeView, Phase, Reserve, Result, Verdict

log = structlog.get_logger("nodeagent.admission")

StageReport = Callable[[str, Phase, Result, float], Awaitable[None]]


async def _no_report(stage: str, phase: Phase, result: Result, seconds: float) -> None:
    return None


class AdmissionCycle:
    def __init__(self, pipeline: Pipeline, node: NodeInfo) -> None:
        self._pipeline = pipeline
        self._node = node
        self._lock = anyio.Lock()
        self._admitted: dict[str, Pod] = {}

    def view_for(self, uid: str) -> NodeView:
        return NodeView(node=self._node, admitted=[p for u, p in self._admitted.items() if u != uid])

    @property
    def admitted(self) -> list[Pod]:
        return list(self._admitted.values())

    async def admit(self, pod: Pod, report: StageReport = _no_report) -> tuple[Result, str]:
        """Run admit then reserve for ``pod``; returns the deciding result and the stage name.
        ``report`` hears every stage's answer and how long it took (for trace and metrics)."""
        async with self._lock:
            view = self.view_for(pod.uid)
            for stage in self._pipeline[Phase.ADMIT]:
                assert isinstance(stage, Admit)
                result = await self._ask(Phase.ADMIT, stage.name, stage.admit(pod, view), report)
                if result.verdict is Verdict.REJECT:
                    return result, stage.name
            reserved: list[Reserve] = []
            try:
                for stage in self._pipeline[Phase.RESERVE]:
                    assert isinstance(stage, Reserve)
                    reserved.append(stage)  # a reserve that fails half-way is undone too
                    result = await self._ask(Phase.RESERVE, stage.name, stage.reserve(pod, view), report)
                    if result.verdict is Verdict.REJECT:
                        await self._unreserve(pod, reserved)
                        return result, stage.name
            except BaseException:
                await self._unreserve(pod, reserved)
                raise
            self._admitted[pod.uid] = pod
            return Result.ok(), ""

    @staticmethod
    async def _ask(phase: Phase, stage: str, call: Awaitable[Result], report: StageReport) -> Result:
        """One stage's answer, timed; a stage that raises rejects the pod instead of taking
        the agent down (the same rule the pod worker applies to setup phases)."""
        begin = time.monotonic()
        try:
            result = _checked(phase, stage, await call)
        except Exception as exc:
            log.exception("admission stage raised", stage=stage, phase=phase.value)
            result = Result.reject("StageError", f"stage {stage!r} failed in phase {phase.value}: {exc!r}")
        await report(stage, phase, result, time.monotonic() - begin)
        return result

    async def release(self, pod: Pod) -> None:
        """Give back everything reserved for ``pod`` (idempotent)."""
        stages = [s for s in self._pipeline[Phase.UNRESERVE] if isinstance(s, Reserve)]
        await self._unreserve(pod, list(reversed(stages)))
        self._admitted.pop(pod.uid, None)

    @staticmethod
    async def _unreserve(pod: Pod, reserved: list[Reserve]) -> None:
        with anyio.CancelScope(shield=True):
            for stage in reversed(reserved):
                try:
                    await stage.unreserve(pod)
                except Exception:
                    log.exception("unreserve failed", stage=stage.name, pod=pod.full_name)


def _checked(phase: Phase, stage: str, result: Result) -> Result:
    if not isinstance(result, Result) or result.verdict not in PHASE_SPECS[phase].verdicts:
        # A plugin bug must not admit a pod by accident: treat it as a rejection with a reason
        # that names the culprit.
        return Result.reject(
            "InvalidStageVerdict", f"stage {stage!r} answered {result!r} in phase {phase.value}"
        )
    return result
