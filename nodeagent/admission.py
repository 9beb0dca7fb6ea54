"""The node-wide admission cycle: admit and reserve, one pod at a time.

Like the scheduler's scheduling cycle, admission is serial so that every decision sees every
pod admitted before it (and never the candidate itself). Pods that wait for the cycle together
(the pods of one listing, a restarted agent's pods) go in the kubelet's order: creation time,
then UID (HandlePodAdditions sorts by creation time); a pod without a creation time (a static
pod) sorts first. Stages are called through the phase runner (nodeagent.pipeline); a stage
that raises rejects the pod, it never stops the agent.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import structlog

from nodeagent.model import Pod
from nodeagent.pipeline import Answer, PhaseRunner
from nodeagent.registry import Pipeline
from nodeagent.stages import Admit, NodeInfo, NodeView, Phase, Reserve, Result, Verdict
from nodeagent.status import parse_rfc3339

log = structlog.get_logger("nodeagent.admission")

StageReport = Callable[[Answer], Awaitable[None]]
SETTLE_PASSES = 3
"""Event-loop passes the next candidate waits once the cycle is free, so that pods arriving
together (one listing's workers) are all in line before the earliest created goes first."""


async def _no_report(answer: Answer) -> None:
    return None


def admission_order(pod: Pod) -> tuple[float, str]:
    """The kubelet's order of pod additions: creation time, then UID."""
    return parse_rfc3339(pod.metadata.creation_timestamp) or 0.0, pod.uid


class AdmissionCycle:
    def __init__(self, pipeline: Pipeline, node: NodeInfo, runner: PhaseRunner | None = None) -> None:
        self._pipeline = pipeline
        self._runner = runner or PhaseRunner(pipeline)
        self._node = node
        self._admitted: dict[str, Pod] = {}
        self._line: list[tuple[float, str]] = []
        self._busy = False
        self._moved = anyio.Event()
        self.order: list[str] = []
        """UIDs in the order they were admitted or rejected (for tests and `nodeagent trace`)."""

    def view_for(self, uid: str) -> NodeView:
        return NodeView(node=self._node, admitted=[p for u, p in self._admitted.items() if u != uid])

    @property
    def admitted(self) -> list[Pod]:
        return list(self._admitted.values())

    async def admit(self, pod: Pod, report: StageReport = _no_report) -> tuple[Result, str]:
        """Run admit then reserve for ``pod``; returns the deciding result and the stage name.
        ``report`` hears every stage's answer and how long it took (for trace and metrics)."""
        await self._turn(admission_order(pod))
        try:
            self.order.append(pod.uid)
            return await self._cycle(pod, report)
        finally:
            self._busy = False
            self._wake()

    async def _cycle(self, pod: Pod, report: StageReport) -> tuple[Result, str]:
        view = self.view_for(pod.uid)
        for stage in self._pipeline[Phase.ADMIT]:
            assert isinstance(stage, Admit)
            answer = await self._runner.ask(Phase.ADMIT, stage, lambda s: s.admit(pod, view),  # type: ignore[attr-defined]
                                            report=report)
            if answer.result.verdict is Verdict.REJECT:
                return answer.result, stage.name
        reserved: list[Reserve] = []
        try:
            for stage in self._pipeline[Phase.RESERVE]:
                assert isinstance(stage, Reserve)
                reserved.append(stage)  # a reserve that fails half-way is undone too
                answer = await self._runner.ask(Phase.RESERVE, stage, lambda s: s.reserve(pod, view),  # type: ignore[attr-defined]
                                                report=report)
                if answer.result.verdict is Verdict.REJECT:
                    await self._unreserve(pod, reserved)
                    return answer.result, stage.name
        except BaseException:
            await self._unreserve(pod, reserved)
            raise
        self._admitted[pod.uid] = pod
        return Result.ok(), ""

    # --- the line ---------------------------------------------------------------------------

    async def _turn(self, key: tuple[float, str]) -> None:
        heapq.heappush(self._line, key)
        self._wake()
        try:
            while True:
                if not self._busy and self._line[0] == key:
                    for _ in range(SETTLE_PASSES):
                        await anyio.lowlevel.checkpoint()
                    if not self._busy and self._line[0] == key:
                        heapq.heappop(self._line)
                        self._busy = True
                        return
                    continue
                moved = self._moved
                await moved.wait()
        except BaseException:
            if key in self._line:
                self._line.remove(key)
                heapq.heapify(self._line)
                self._wake()
            raise

    def _wake(self) -> None:
        moved, self._moved = self._moved, anyio.Event()
        moved.set()

    # --- giving back ------------------------------------------------------------------------

    async def release(self, pod: Pod) -> None:
        """Give back everything reserved for ``pod`` (idempotent)."""
        stages = [s for s in self._pipeline[Phase.UNRESERVE] if isinstance(s, Reserve)]
        await self._unreserve(pod, list(reversed(stages)))
        self._admitted.pop(pod.uid, None)

    async def _unreserve(self, pod: Pod, reserved: list[Reserve]) -> None:
        with anyio.CancelScope(shield=True):
            for stage in reversed(reserved):
                try:
                    await stage.unreserve(pod)
                except Exception:
                    log.exception("unreserve failed", stage=stage.name, pod=pod.full_name)
