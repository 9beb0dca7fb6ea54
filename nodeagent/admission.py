"""The node-wide admission cycle: admit and reserve, one pod at a time.

Like the scheduler's scheduling cycle, admission is serial so that every decision sees every
pod admitted before it (and never the candidate itself). Pods enter in the order their workers
ask, which is the order sources reported them.
"""

from __future__ import annotations

import anyio
import structlog

from nodeagent.model import Pod
from nodeagent.registry import Pipeline
from nodeagent.stages import PHASE_SPECS, NodeInfo, NodeView, Phase, Reserve, Result, Verdict

log = structlog.get_logger("nodeagent.admission")


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

    async def admit(self, pod: Pod) -> tuple[Result, str]:
        """Run admit then reserve for ``pod``; returns the deciding result and the stage name."""
        async with self._lock:
            view = self.view_for(pod.uid)
            for stage in self._pipeline[Phase.ADMIT]:
                result = _checked(Phase.ADMIT, stage.name, await stage.admit(pod, view))  # type: ignore[attr-defined]
                if result.verdict is Verdict.REJECT:
                    return result, stage.name
            reserved: list[Reserve] = []
            try:
                for stage in self._pipeline[Phase.RESERVE]:
                    assert isinstance(stage, Reserve)
                    result = _checked(Phase.RESERVE, stage.name, await stage.reserve(pod, view))
                    if result.verdict is Verdict.REJECT:
                        await self._unreserve(pod, reserved)
                        return result, stage.name
                    reserved.append(stage)
            except BaseException:
                await self._unreserve(pod, reserved)
                raise
            self._admitted[pod.uid] = pod
            return Result.ok(), ""

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
