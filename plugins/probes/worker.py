"""The probe workers of one pod: one loop per (container, probe type), as the kubelet's
pkg/kubelet/prober/worker.go, plus the reaction to what they find.

Results belong to a container *instance* (a container ID): a new instance starts from the
initial results again. Readiness and startup results reach status through the single writer;
a liveness or startup failure past its threshold stops the instance, and the runtime stage's
observe loop restarts it per restartPolicy (with its CrashLoopBackOff)."""

from __future__ import annotations

import time
from typing import Any

import anyio

from cri import CriError, NotFound
from nodeagent.clock import Clock
from nodeagent.model import Container
from nodeagent.podfacts import STARTUP_PASSED
from nodeagent.runtimeview import ContainerRecord
from nodeagent.stages import PodContext
from plugins.probes.events import (
    ProbeFailed,
    ProbeResultChanged,
    ProbeWarned,
    UnhealthyContainerKilled,
)
from plugins.probes.metrics import FAILED, SUCCESSFUL, UNKNOWN, ProbeMetrics
from plugins.probes.prober import ProbeError, Target, run_probe
from plugins.probes.results import Outcome, ProbeState, ProbeType, Result

MINIMUM_GRACE_SECONDS = 2  # minimumGracePeriodInSeconds
RESYNC_SECONDS = 10.0


class ContainerProbes:
    """The probes of one container and the instance they currently judge."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.states = {kind: ProbeState(kind, probe) for kind in ProbeType if (probe := kind.of(container)) is not None}
        self.instance = ""

    @property
    def name(self) -> str:
        return self.container.name

    def started(self) -> bool:
        """Started = running and (no startup probe, or it succeeded); running is the caller's."""
        startup = self.states.get(ProbeType.STARTUP)
        return startup is None or startup.result is Result.SUCCESS

    def report(self, ctx: PodContext) -> None:
        startup = self.states.get(ProbeType.STARTUP)
        readiness = self.states.get(ProbeType.READINESS)
        if startup is None and readiness is None:
            return  # a liveness probe alone changes neither started nor ready
        # Without a readiness probe a started container is ready; the writer ANDs ready with
        # started and running.
        ready = readiness.result is Result.SUCCESS if readiness is not None else True
        started = startup.result is Result.SUCCESS if startup is not None else None
        ctx.status.container_probe_result(self.name, ready=ready, started=started)

    def follow(self, ctx: PodContext, record: ContainerRecord) -> None:
        """A new instance (a restart): every probe starts over from its initial result."""
        if record.id == self.instance:
            return
        self.instance = record.id
        for state in self.states.values():
            state.reset()
            state.wake()
        self.report(ctx)


class PodProbes:
    def __init__(self, ctx: PodContext, metrics: ProbeMetrics | None = None) -> None:
        self.ctx = ctx
        self.metrics = metrics
        # Sidecars (restartable init containers) are probed like regular containers; the API
        # allows probes on no other init container.
        sidecars = [c for c in ctx.pod.spec.init_containers if c.restart_policy == "Always"]
        self.containers = [ContainerProbes(c) for c in (*sidecars, *ctx.pod.spec.containers)]
        self.containers = [c for c in self.containers if c.states]

    async def run(self) -> None:
        ctx = self.ctx
        for group in self.containers:
            group.report(ctx)
        async with anyio.create_task_group() as tg:
            for group in self.containers:
                for state in group.states.values():
                    tg.start_soon(self._loop, group, state, name=f"probe:{group.name}:{state.type.value}")
            # Notice new instances as soon as the relister does, not a probe period later, so a
            # restarted container never inherits its predecessor's readiness.
            while True:
                for group in self.containers:
                    record = ctx.observed.latest(group.name)
                    if record is not None:
                        group.follow(ctx, record)
                await ctx.runtime_changed(timeout=RESYNC_SECONDS)

    async def _loop(self, group: ContainerProbes, state: ProbeState) -> None:
        clock = self.ctx.clock
        while True:
            begin = clock.monotonic()
            state.rearm()
            try:
                await self._step(group, state)
            except Exception:  # a probe bug must not stop the other probes or the pod
                self.ctx.log.exception("probe step failed", container=group.name, probe=state.type.label)
            # A ticker: the period counts from the start of the previous run.
            elapsed = clock.monotonic() - begin
            await _sleep_or_trigger(clock, state.probe.period_seconds - elapsed, state.trigger)

    async def _step(self, group: ContainerProbes, state: ProbeState) -> None:
        ctx = self.ctx
        record = ctx.observed.latest(group.name)
        if record is None:
            return  # not created yet
        group.follow(ctx, record)
        if state.on_hold:
            return  # killed by this probe; waiting for the next instance
        if ctx.terminating and state.type is not ProbeType.READINESS:
            return  # the kubelet stops liveness and startup probes of a terminating pod
        if not record.running:
            if state.type is ProbeType.READINESS and state.result is not Result.FAILURE:
                state.result = Result.FAILURE
                group.report(ctx)
            return
        since_start = ctx.clock.now() - record.started_at / 1e9
        if int(since_start) < state.probe.initial_delay_seconds:
            return
        # Until the startup probe succeeds only it runs; afterwards it idles for this instance.
        if (state.type is ProbeType.STARTUP) == group.started():
            return

        target = Target(group.container, record.id, self._probe_ip())
        begin = time.monotonic()  # real time, whatever the stage's clock
        try:
            outcome, output = await run_probe(ctx.runtime, state.probe, target)
        except ProbeError as exc:
            self._count(group, state, UNKNOWN, begin)
            ctx.log.info("probe errored; result discarded", container=group.name, probe=state.type.label,
                         error=str(exc))
            return
        self._count(group, state, FAILED if outcome is Outcome.FAILURE else SUCCESSFUL, begin)
        if group.instance != record.id:
            return  # the instance changed while we probed it: the answer is about a dead one

        before = state.result
        applied = state.record(outcome)
        await self._tell(group, state, record, outcome, output)
        if applied is None or applied is before:
            return
        await ctx.publish(ProbeResultChanged(container=group.name, container_id=record.id, probe=state.type.label,
                                             result="Success" if applied is Result.SUCCESS else "Failure"))
        group.report(ctx)
        if state.type is ProbeType.STARTUP and applied is Result.SUCCESS:
            # A sidecar's next containers wait for this (plugins/runtime/plan.py).
            _passed(ctx).add(record.id)
            # The kubelet runs readiness right away once a container has started.
            readiness = group.states.get(ProbeType.READINESS)
            if readiness is not None:
                readiness.wake()
        if applied is Result.FAILURE and state.type.kills:
            await self._kill(group, state, record)

    def _count(self, group: ContainerProbes, state: ProbeState, result: str, begin: float) -> None:
        if self.metrics is not None:
            ref = self.ctx.ref
            self.metrics.observe(state.type.label, result, group.name, ref.name, ref.namespace, ref.uid,
                                 time.monotonic() - begin)

    async def _tell(self, group: ContainerProbes, state: ProbeState, record: ContainerRecord, outcome: Outcome,
                    output: str) -> None:
        """The kubelet's Unhealthy / ProbeWarning events. A run of failures is told up to the
        threshold; a probe that keeps failing past it (readiness) stays quiet until it changes."""
        ctx = self.ctx
        kind = state.type.value
        if outcome is Outcome.WARNING:
            if state.warned:
                return  # a redirect that stays is told once, not every period
            state.warned = True
            message = f"{kind} probe warning: {output}"
            ctx.log.warning(message, container=group.name)
            await ctx.publish(ProbeWarned(container=group.name, container_id=record.id, probe=state.type.label,
                                          message=message))
            return
        state.warned = False
        if outcome is not Outcome.FAILURE:
            return
        consecutive = state.probe.failure_threshold if state.on_hold else state.run
        if consecutive > state.probe.failure_threshold:
            return
        message = f"{kind} probe failed: {output}"
        ctx.log.warning(message, container=group.name, consecutive_failures=consecutive)
        await ctx.publish(ProbeFailed(container=group.name, container_id=record.id, probe=state.type.label,
                                      message=message, consecutive_failures=consecutive))

    async def _kill(self, group: ContainerProbes, state: ProbeState, record: ContainerRecord) -> None:
        ctx = self.ctx
        pod = ctx.pod
        # setTerminationGracePeriod: the probe's own grace wins for a probe kill; never under 2 s.
        grace = state.probe.termination_grace_period_seconds
        if grace is None:
            grace = pod.metadata.deletion_grace_period_seconds
        if grace is None:
            grace = pod.spec.termination_grace_period_seconds
        grace = max(grace, MINIMUM_GRACE_SECONDS)
        message = f"Container {group.name} failed {state.type.value.lower()} probe"
        if pod.spec.restart_policy != "Never":
            message += ", will be restarted"
        ctx.log.warning(message, container=group.name, container_id=record.id, grace_period_seconds=grace)
        try:
            await ctx.runtime.stop_container(record.id, grace)
        except NotFound:
            pass  # gone already: nothing left to kill
        except CriError as exc:
            # Not killed: judge the instance afresh, so the next threshold tries again.
            ctx.log.warning("could not stop unhealthy container", container=group.name, error=str(exc))
            state.reset()
            return
        ctx.request_relist()
        await ctx.publish(UnhealthyContainerKilled(container=group.name, container_id=record.id,
                                                   probe=state.type.label, grace_period_seconds=grace,
                                                   message=message))

    def _probe_ip(self) -> str:
        if self.ctx.pod.spec.host_network:
            return self.ctx.node.ip
        sandbox = self.ctx.observed.ready_sandbox()
        return sandbox.pod_ip if sandbox is not None else ""


async def _sleep_or_trigger(clock: Clock, seconds: float, trigger: anyio.Event) -> None:
    if trigger.is_set():
        return
    async with anyio.create_task_group() as tg:
        async def sleep() -> None:
            await clock.sleep(max(seconds, 0.0))
            tg.cancel_scope.cancel()

        async def wake() -> None:
            await trigger.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(sleep)
        tg.start_soon(wake)


def _passed(ctx: Any) -> set[str]:
    passed = ctx.facts.get(STARTUP_PASSED)
    if passed is None:
        passed = set()
        ctx.facts.set(STARTUP_PASSED, passed)
    return passed
