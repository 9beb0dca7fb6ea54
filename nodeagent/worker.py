"""One worker per pod: admission, setup, observation and teardown, serially for that pod.

The worker's mailbox is a single slot, not a queue: a new spec replaces the pending one (only
the latest matters) and a kill is sticky (never overwritten by a later update). Setup runs in a
cancel scope that a kill cancels; teardown runs shielded, bounded by the grace period, so that
a pod being deleted is always torn down even when its setup was interrupted half-way.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio
import structlog

from cri import RuntimeClient
from nodeagent import events as ev
from nodeagent import hostpaths
from nodeagent.additions import CONTAINER_ADDITIONS, AdditionsAccess, PodAdditions
from nodeagent.admission import AdmissionCycle
from nodeagent.clock import Clock
from nodeagent.facts import PodFacts
from nodeagent.kubeletconfig.node import NodeConfig
from nodeagent.lifecycle import Lifecycle, PodState, Trigger
from nodeagent.model import Pod, unhonoured_fields
from nodeagent.objects import FileObjects, ObjectStore
from nodeagent.pipeline import Answer, PhaseRunner, RetryBudget
from nodeagent.pleg import Relister
from nodeagent.registry import Pipeline
from nodeagent.runtimeview import Expectation, PodRuntime
from nodeagent.slots import PrioritySlots, Turn
from nodeagent.stages import (
    ACTIVE_STATES,
    Cleanup,
    Condition,
    NodeInfo,
    Observe,
    Permit,
    Phase,
    Prepare,
    Result,
    Stage,
    Start,
    StatusReporter,
    Verdict,
)
from nodeagent.stash import Stash
from nodeagent.status import StatusWriter
from nodeagent.supervisor import failing_stray_cancellations
from nodeagent.unsupported import refusal
from nodeagent.waits import first_of

log = structlog.get_logger("nodeagent.worker")

# The kubelet never gives a container less than 2 s between SIGTERM and SIGKILL.
MINIMUM_GRACE_SECONDS = 2
# Undo phases other than stop are bounded too, so a hung driver cannot hold a worker forever.
UNDO_TIMEOUT_SECONDS = 120.0
SETTLE_TIMEOUT_SECONDS = 3.0  # how long a stopped pod's last listing may take to reach its status
SETUP_CONCURRENCY = 16
RETRY_INITIAL_SECONDS = 1.0
# A pod condition, so that `kubectl get pod -o yaml` users see what we ignored.
UNHONOURED_CONDITION = "nodeagent.io/UnhonouredFields"
ADMIT_WHEN_DELETED_SECONDS = 10.0
"""How long a pod deleted before its admission began may take to get its admission answer."""
ADMIT_ANSWER_SECONDS = 1.0
"""How long an admission under way may still answer once its pod's deletion arrives (a stage
holding it longer is cancelled)."""
UNSAFE_NAMES = "UnsafePodNames"
"""Rejection reason of a pod whose UID, name, namespace, container or volume names cannot be
host path components (nodeagent/hostpaths.py); the API server never lets one through."""
RETRY_MAX_SECONDS = 30.0


@dataclass(frozen=True)
class Eviction:
    """A node-level manager failed the pod as a whole (AgentHandle.evict): eviction, shutdown."""

    reason: str
    message: str
    grace_seconds: int
    condition: Condition | None = None


@dataclass
class Services:
    """Everything a worker needs from the agent (the composition root builds one)."""

    runtime: RuntimeClient
    clock: Clock
    node: NodeInfo
    settings: NodeConfig
    relister: Relister
    status: StatusWriter
    publish: Callable[[ev.Event], Awaitable[None]]
    admission: AdmissionCycle
    pipeline: Pipeline
    root_dir: Path
    cgroup_driver: str = "cgroupfs"
    """The node's cgroup driver (nodeagent/cgroupdriver.py): pods are refused on systemd."""
    objects: ObjectStore = field(default_factory=FileObjects)
    """The agent's object store (nodeagent.objects); stages reach it as ``ctx.objects``
    (standalone and in tests without an API: the manifest-backed store, empty)."""
    setup_slots: PrioritySlots = field(default_factory=lambda: PrioritySlots(SETUP_CONCURRENCY))
    """Pods in prepare or start at once, a prepared pod's start served before the next pod's
    prepare (nodeagent/slots.py). The runtime serialises much of the work anyway; with every
    pod in flight each one finishes near the end of a burst, so a bound roughly halves the
    median start latency of 110 pods (benchmarks/RESULTS.md) without slowing the last."""
    observe_stage_time: Callable[[str, str, float], None] = lambda stage, phase, seconds: None
    observe_pod_start: Callable[[float], None] = lambda seconds: None
    runner: PhaseRunner = field(init=False)
    """Calls the stages of every phase (nodeagent.pipeline), the admission cycle's too."""

    def __post_init__(self) -> None:
        self.runner = PhaseRunner(self.pipeline)


class StageContext:
    """The PodContext a stage gets (see nodeagent.stages.PodContext for the contract)."""

    def __init__(self, worker: PodWorker, stage: str) -> None:
        self._worker = worker
        self.stage = stage
        services = worker.services
        self.runtime = services.runtime
        self.clock = services.clock
        self.node = services.node
        self.stash = worker.stash
        declared = services.pipeline.stages.get(stage)
        provides = getattr(declared, "provides", ())
        reads = (*getattr(declared, "requires", ()), *getattr(declared, "uses", ()))
        self.facts = worker.facts.access(stage, provides, reads)
        self.additions = AdditionsAccess(worker.additions, stage, CONTAINER_ADDITIONS in provides,
                                         CONTAINER_ADDITIONS in reads)
        self._status = services.status.reporter(worker.ref.uid)
        self._observed_version: int | None = None
        """The relister's version of the pod's record when this stage last read ``observed``."""
        self.log = log.bind(pod=str(worker.ref), uid=worker.ref.uid, stage=stage)

    @property
    def pod(self) -> Pod:
        return self._worker.pod

    @property
    def status(self) -> StatusReporter:
        return self._status

    @property
    def ref(self) -> ev.PodRef:
        return self._worker.ref

    @property
    def settings(self) -> NodeConfig:
        return self._worker.services.settings

    @property
    def objects(self) -> ObjectStore:
        return self._worker.services.objects

    @property
    def pod_dir(self) -> Path:
        return hostpaths.pod_dir(self._worker.services.root_dir, self._worker.ref.uid)

    @property
    def observed(self) -> PodRuntime:
        relister = self._worker.services.relister
        # The version first: a change between the two reads makes the next wait return at once.
        self._observed_version = relister.version(self._worker.ref.uid)
        return relister.pod(self._worker.ref.uid)

    async def pod_changed(self, since: Pod, timeout: float) -> bool:
        if self.pod is not since:
            return True
        return await first_of(self._worker.spec_changed.wait(), self.clock.sleep(timeout)) == 0

    async def runtime_changed(self, timeout: float | None = None) -> None:
        await self._worker.services.relister.wait_changed(self._worker.ref.uid, timeout,
                                                          since=self._observed_version)

    def request_relist(self, expect: Expectation | None = None) -> None:
        # This pod's runtime state changed: relisting it alone shows the stage what it did.
        self._worker.services.relister.request_relist(self._worker.ref.uid, expect)

    async def publish(self, event: ev.Event) -> None:
        await self._worker.services.publish(
            event.model_copy(update={"pod": self._worker.ref, "source": self.stage, "cause": self._worker.cause})
        )

    @property
    def terminating(self) -> bool:
        return self._worker.kill_requested

    def fail(self, reason: str, message: str) -> None:
        self.log.warning("pod failed", reason=reason, message=message)
        self._worker.services.status.fail(self._worker.ref.uid, reason, message)
        self.complete("Failed")

    def complete(self, phase: Literal["Succeeded", "Failed"]) -> None:
        self._worker.completed_phase = phase
        self._worker.wake.set()

    def wake(self) -> None:
        self._worker.permit_wake.set()


class PodWorker:
    def __init__(self, ref: ev.PodRef, pod: Pod, services: Services, cause: int | None,
                 predecessor: PodWorker | None = None) -> None:
        self.ref = ref
        self.pod = pod
        self.services = services
        self.cause = cause
        self.stash = Stash()
        self.facts = PodFacts()
        """What stages share about the pod (nodeagent.facts), declared by each."""
        self.additions = PodAdditions()
        """What prepare stages give the pod's containers (nodeagent.additions)."""
        self.budget = RetryBudget()
        """Unexpected stage failures so far: a stage that keeps failing fails the pod."""
        self.lifecycle = Lifecycle()
        self.predecessor = predecessor
        self.observed_at = time.monotonic()
        self.observed_wall = time.time()
        # mailbox
        self._pending: Pod | None = None
        self.kill_requested = False
        self._admitting = False
        self.orphan = False
        """Rebuilt from the runtime's labels for its teardown alone (the dispatcher's orphan): never admitted."""
        self.kill_grace: int | None = None
        self.forget_requested = False
        self.wake = anyio.Event()
        self.permit_wake = anyio.Event()
        self.spec_changed = anyio.Event()
        """Set (and replaced) whenever ``pod`` becomes a newer spec (StageContext.pod_changed)."""
        self.completed_phase: str | None = None
        self._stopped = False
        self._setup_scope: anyio.CancelScope | None = None
        self.eviction: Eviction | None = None
        """Set once a node-level manager failed the pod (sticky, like a kill)."""
        self.released = anyio.Event()
        """Set once no container runs and the sandbox, volumes and reservations are released."""
        self.done = anyio.Event()
        self.log = log.bind(pod=str(ref), uid=ref.uid)
        services.status.track(ref, pod)

    # --- the mailbox (called by the dispatcher; never blocks) ---------------------------

    def update(self, pod: Pod, cause: int | None) -> None:
        if self.kill_requested:
            return  # a pending kill is never overwritten
        self._pending = pod
        self.cause = cause
        self.wake.set()

    def kill(self, grace: int | None, cause: int | None, *, forget: bool = True) -> None:
        """Sticky: once asked, the pod is torn down; a later kill may only shorten the grace."""
        if grace is not None:
            self.kill_grace = grace if self.kill_grace is None else min(self.kill_grace, grace)
        if not self.kill_requested:
            self.cause = cause
        self.kill_requested = True
        self.forget_requested = self.forget_requested or forget
        if self._setup_scope is not None:
            if self._admitting and not self.orphan:
                # An admission under way may still answer, briefly (the kubelet's is one
                # synchronous step): a refused pod then ends Failed with its reason.
                scope = self._setup_scope
                scope.deadline = min(scope.deadline, anyio.current_time() + ADMIT_ANSWER_SECONDS)
            else:
                self._setup_scope.cancel()
        self.wake.set()
        self.permit_wake.set()

    def evict(self, eviction: Eviction) -> anyio.Event | None:
        """Fail the pod as a whole for a node-level manager (AgentHandle.evict). Sticky; only
        an active pod (admitted, not finished, not killed) is evicted. Returns ``released``."""
        if self.kill_requested or self.eviction is not None or self.completed_phase is not None \
                or self.state not in ACTIVE_STATES:
            return None
        self.eviction = eviction
        self.log.warning("pod failed by the node", reason=eviction.reason, message=eviction.message,
                         grace_period_seconds=eviction.grace_seconds)
        status = self.services.status
        status.fail(self.ref.uid, eviction.reason, eviction.message)
        if eviction.condition is not None:
            c = eviction.condition
            status.reporter(self.ref.uid).set_condition(c.type, c.status, c.reason, c.message)
        self.completed_phase = "Failed"
        if self._setup_scope is not None:
            self._setup_scope.cancel()
        self.wake.set()
        self.permit_wake.set()
        return self.released

    @property
    def pending(self) -> Pod | None:
        """The newest spec not yet taken up (a worker replacing this one starts from it)."""
        return self._pending

    # --- the worker's life -------------------------------------------------------------

    @property
    def state(self) -> PodState:
        return self.lifecycle.state

    def _to(self, trigger: Trigger) -> None:
        old = self.lifecycle.state
        new = self.lifecycle.apply(trigger)
        self.services.status.set_state(self.ref.uid, new)
        if old is not new:
            self.log.info("pod state", state=new.value, trigger=trigger.value)

    async def run(self) -> None:
        try:
            if self.predecessor is not None:
                # Static pods with the same full name never run at once (the kubelet's rule):
                # an edited manifest's new pod waits until the old one is torn down.
                await self.predecessor.done.wait()
            await self._live()
        finally:
            self.done.set()

    async def _live(self) -> None:
        unhonoured = unhonoured_fields(self.pod)
        if unhonoured:
            self.log.warning("pod uses fields nodeagent does not honour", fields=unhonoured)
            await self._emit(ev.UnhonouredFieldsFound(fields=unhonoured))
            self.services.status.reporter(self.ref.uid).set_condition(
                UNHONOURED_CONDITION, True, "FieldsNotHonoured",
                "nodeagent does not act on: " + ", ".join(unhonoured))

        admission: Result | None = None
        if self.kill_requested and not self.orphan:
            # Deleted before its admission began (seen already being deleted, or its deletion
            # came on the heels of its creation): admitted all the same, as the kubelet's
            # HandlePodAdditions admits before its pod worker learns of the deletion, so that a
            # pod the node refuses ends Failed with the refusal's reason, not Pending. Bounded:
            # nothing waits for this pod to start. (A kill during admission: see kill().)
            with anyio.move_on_after(ADMIT_WHEN_DELETED_SECONDS):
                admission = await self._admit()
        else:
            self._admitting = True
            try:
                admission = await self._setup_cancellable(self._admit)
            finally:
                self._admitting = False
        if admission is not None and admission.verdict is Verdict.REJECT:
            return await self._rest_until_forgotten()
        if self.kill_requested:
            return await self._terminate()

        outcome = await self._setup_cancellable(self._setup)
        if self.kill_requested:
            return await self._terminate()
        if self.eviction is not None:
            # Failed by the node before its containers all started: torn down as a rejection is.
            self._to(Trigger.FAIL)
            await self._teardown(grace=self._grace())
            return await self._rest_until_forgotten()
        if isinstance(outcome, Result) and outcome.verdict is Verdict.REJECT:
            self.services.status.reporter(self.ref.uid).set_pod_reason(outcome.reason, outcome.message)
            self._to(Trigger.FAIL)
            await self._teardown(grace=self._grace())
            return await self._rest_until_forgotten()

        self._to(Trigger.STARTED)
        seconds = time.monotonic() - self.observed_at
        self.services.observe_pod_start(seconds)
        await self._emit(ev.PodStarted(seconds_since_observed=seconds))
        await self._observe()
        if self.kill_requested:
            return await self._terminate()
        # Completed: nothing will run again. Release the sandbox and devices, keep the records
        # (status, logs) until the pod is deleted.
        self._to(Trigger.COMPLETE)
        await self._emit(ev.PodCompleted(phase=self.completed_phase or "Succeeded"))
        with anyio.CancelScope(shield=True):
            await self._stop(grace=0, announce=False)
            await self._undo(Phase.UNPREPARE)
            await self.services.admission.release(self.pod)
        self.released.set()
        await self._wait_for_kill()
        await self._terminate()

    async def _setup_cancellable(self, step: Callable[[], Awaitable[Result]]) -> Result | None:
        result: Result | None = None
        with anyio.CancelScope() as scope:
            self._setup_scope = scope
            if self.kill_requested or self.eviction is not None:
                scope.cancel()
            result = await step()
        self._setup_scope = None
        return result

    async def _admit(self) -> Result:
        problem = hostpaths.pod_problem(self.pod)
        refused = refusal(self.pod, getattr(self.services.runtime, "runtime_version", None),
                          cgroup_driver=self.services.cgroup_driver)
        if problem is not None:
            # Before any stage: a name that cannot be a host path component never reaches one.
            result, stage = Result.reject(UNSAFE_NAMES, f"pod names cannot be host paths: {problem}"), "worker"
        elif refused is not None:
            # Refuse, never ignore: the pod would run without something it asks for.
            result, stage = Result.reject(refused.reason, refused.message), "worker"
        else:
            result, stage = await self.services.admission.admit(self.pod, self._answered)
        if result.verdict is Verdict.REJECT:
            self.services.status.reporter(self.ref.uid).set_pod_reason(result.reason, result.message)
            self._to(Trigger.REJECT)
            self.log.warning("pod rejected", stage=stage, reason=result.reason, message=result.message)
            await self._emit(ev.PodRejected(reason=result.reason, message=result.message), source=stage)
            return result
        self._to(Trigger.ADMIT)
        await self._emit(ev.PodAdmitted())
        return result

    async def _answered(self, answer: Answer) -> None:
        """Every stage's answer in every phase (from the phase runner): a metric and a fact."""
        self.services.observe_stage_time(answer.stage, answer.phase.value, answer.seconds)
        result = answer.result
        if answer.error is not None:
            await self._emit(ev.StageFailed(phase=answer.phase.value, error=str(answer.error),
                                            retryable=result.verdict is Verdict.RETRY,
                                            duration_seconds=answer.seconds), source=answer.stage)
            return
        await self._emit(ev.StageCompleted(phase=answer.phase.value, verdict=result.verdict.value,
                                           duration_seconds=answer.seconds, reason=result.reason,
                                           message=result.message), source=answer.stage)

    async def _setup(self) -> Result:
        self._to(Trigger.PREPARE)
        self.pod_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        result = await self._phase_with_retry(Phase.PREPARE)
        if result.verdict is Verdict.REJECT:
            return result
        created_ahead = False
        while True:
            self.permit_wake = anyio.Event()
            result = await self._run_phase(Phase.PERMIT)
            if result.verdict is not Verdict.WAIT:
                break
            self._to(Trigger.WAIT)
            await self._emit(ev.PodWaiting(phase="permit", reason=result.reason, message=result.message,
                                           retry_after_seconds=result.retry_after))
            if not created_ahead:
                # While the barrier holds, so that its release has only containers to start (a
                # wake meanwhile is kept by permit_wake and answered below at once).
                created_ahead = True
                await self._create_ahead()
            with anyio.move_on_after(result.retry_after if result.retry_after is not None else 1.0):
                await self.permit_wake.wait()
        if result.verdict is Verdict.REJECT:
            return result
        self._to(Trigger.PERMIT)
        return await self._phase_with_retry(Phase.START)

    async def _create_ahead(self) -> None:
        """Each start stage's create_ahead (nodeagent.stages.Start): best-effort, as its
        contract says; ``start`` makes whatever this did not."""
        async with self.services.setup_slots.hold(Turn.THEN):
            for stage in self.services.pipeline[Phase.START]:
                if not isinstance(stage, Start):
                    continue
                try:
                    await stage.create_ahead(StageContext(self, stage.name))
                except Exception as exc:  # noqa: BLE001 - left to the start phase, which reports it
                    self.log.warning("creating containers ahead of the start failed; the start creates them",
                                     stage=stage.name, error=f"{type(exc).__name__}: {exc}")

    @property
    def pod_dir(self) -> Path:
        return hostpaths.pod_dir(self.services.root_dir, self.ref.uid)

    async def _phase_with_retry(self, phase: Phase) -> Result:
        delay = RETRY_INITIAL_SECONDS
        while True:
            self._take_pending()
            result = await self._run_phase(phase)
            if result.verdict is not Verdict.RETRY:
                return result
            wait = result.retry_after if result.retry_after is not None else delay
            delay = min(delay * 2, RETRY_MAX_SECONDS)
            await self._emit(ev.PodWaiting(phase=phase.value, reason=result.reason, message=result.message,
                                           retry_after_seconds=wait))
            await self.services.clock.sleep(wait)

    def _take_pending(self) -> None:
        if self._pending is not None:
            self.pod, self._pending = self._pending, None
            self.services.status.track(self.ref, self.pod)
            changed, self.spec_changed = self.spec_changed, anyio.Event()
            changed.set()

    async def _run_phase(self, phase: Phase) -> Result:
        """Every stage of ``phase`` through the phase runner (nodeagent.pipeline): the first
        answer other than CONTINUE/SKIP decides; exceptions become verdicts there, once."""
        def call(stage: Stage) -> Awaitable[Result | None]:
            return getattr(stage, phase.value)(StageContext(self, stage.name))  # type: ignore[no-any-return]

        if phase in (Phase.PREPARE, Phase.START):
            async with self.services.setup_slots.hold(Turn.THEN if phase is Phase.PREPARE else Turn.FIRST):
                return await self.services.runner.run(phase, call, budget=self.budget, report=self._answered)
        return await self.services.runner.run(phase, call, budget=self.budget, report=self._answered)

    async def _observe(self) -> None:
        """Run the observe stages until the pod is killed or completes. On a kill, the stages
        that observe through termination (status, readiness probes) keep running while the
        stop phase runs, as the kubelet keeps probing and reporting a terminating pod."""
        self.wake = anyio.Event()
        observers = [stage for stage in self.services.pipeline[Phase.OBSERVE] if isinstance(stage, Observe)]
        async with anyio.create_task_group() as lingering:
            async with anyio.create_task_group() as tg:
                for stage in observers:
                    group = lingering if stage.through_termination else tg
                    group.start_soon(self._observer, stage, name=f"observe:{stage.name}:{self.ref}")
                while not (self.kill_requested or self.completed_phase):
                    await self.wake.wait()
                    self.wake = anyio.Event()
                    self._take_pending()
                tg.cancel_scope.cancel()
            if self.kill_requested:
                self._to(Trigger.KILL)
                await self._stop(grace=self._grace())
            elif self.services.status.failed(self.ref.uid):
                # Failed as a whole by a stage: stopped as gracefully as a deletion would be.
                await self._stop(grace=self._grace(), announce=False)
            if self._stopped and any(stage.through_termination for stage in observers):
                await self._settle()
            lingering.cancel_scope.cancel()

    async def _observer(self, stage: Observe) -> None:
        ctx = StageContext(self, stage.name)
        delay = RETRY_INITIAL_SECONDS
        while True:
            try:
                with failing_stray_cancellations():  # would silently end the pod's other observers
                    await stage.observe(ctx)
                return
            except Exception:  # an observer bug must not take the pod down: restart it
                ctx.log.exception("observe stage failed; restarting it", retry_in=delay)
                await self.services.clock.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)

    async def _wait_for_kill(self) -> None:
        while not self.kill_requested:
            await self.wake.wait()
            self.wake = anyio.Event()

    async def _rest_until_forgotten(self) -> None:
        """A rejected or failed pod keeps its final status until its source drops it."""
        await self._wait_for_kill()
        self._to(Trigger.KILL)
        await self._finish()

    def _grace(self) -> int:
        grace = self.kill_grace
        if self.eviction is not None:
            # The manager's grace overrides the pod's; a deletion may only shorten it.
            grace = self.eviction.grace_seconds if grace is None else min(grace, self.eviction.grace_seconds)
        if grace is None:
            grace = self.pod.metadata.deletion_grace_period_seconds
        if grace is None:
            grace = self.pod.spec.termination_grace_period_seconds
        return max(grace, 0)

    async def _terminate(self) -> None:
        # Teardown runs even for a pod killed before admission finished: after an agent
        # restart such a pod may already own a sandbox, and every undo is idempotent.
        self._to(Trigger.KILL)
        await self._teardown(grace=self._grace())
        await self._finish()

    async def _settle(self) -> None:
        """Before the lingering observers go: let the status report a listing made after the
        containers stopped, so the last status shows them terminated (bounded: a runtime that
        does not answer must not hold the teardown)."""
        stopped_at = time.time()
        relister, status = self.services.relister, self.services.status
        relister.request_relist(self.ref.uid)
        with anyio.move_on_after(SETTLE_TIMEOUT_SECONDS):
            while relister.pod(self.ref.uid).seen_at <= stopped_at:
                await relister.wait_changed(self.ref.uid, timeout=0.1)
            # The status must reflect the newest listing that changed the pod; a later listing
            # that showed the same wakes no observer, so waiting for it would only time out.
            while status.observed_at(self.ref.uid) <= relister.pod(self.ref.uid).changed_at:
                await anyio.sleep(0.02)

    async def _stop(self, grace: int, announce: bool = True) -> None:
        """The stop phase, once per pod (a terminating pod runs it while it is still observed)."""
        if self._stopped:
            return
        self._stopped = True
        if announce:
            await self._emit(ev.PodTerminating(grace_period_seconds=grace))
        with anyio.CancelScope(shield=True):
            await self._undo(Phase.STOP, grace=grace)

    async def _teardown(self, grace: int) -> None:
        """stop → unprepare → cleanup → unreserve; shielded: a pod being torn down is torn down."""
        await self._stop(grace)
        with anyio.CancelScope(shield=True):
            await self._undo(Phase.UNPREPARE)
            await self._undo(Phase.CLEANUP)
            await self.services.admission.release(self.pod)
            if self.state is PodState.TERMINATING:
                self._to(Trigger.TORN_DOWN)
            self.released.set()
            await self._emit(ev.PodTerminated(phase=self.services.status.get(self.ref.uid).get("phase", "")))

    async def _undo(self, phase: Phase, grace: int = 0) -> None:
        """An undo phase, every stage, each bounded: stop by the grace period plus the
        runtime's own time to SIGKILL, the others by UNDO_TIMEOUT_SECONDS (a hung driver must
        not hold a worker forever)."""
        def call(stage: Stage) -> Awaitable[None]:
            ctx = StageContext(self, stage.name)
            if phase is Phase.STOP:
                assert isinstance(stage, Start)
                return stage.stop(ctx, float(grace))
            if phase is Phase.UNPREPARE:
                assert isinstance(stage, Prepare)
                return stage.unprepare(ctx)
            assert isinstance(stage, Cleanup)
            return stage.cleanup(ctx)

        timeout = grace + UNDO_TIMEOUT_SECONDS if phase is Phase.STOP else UNDO_TIMEOUT_SECONDS
        await self.services.runner.undo(phase, call, timeout=timeout, report=self._answered)

    async def _finish(self) -> None:
        if self.forget_requested:
            await self.services.status.flush()
            await self.services.status.forget(self.ref.uid)
            await self._emit(ev.PodForgotten())

    async def _emit(self, event: ev.Event, source: str = "worker") -> None:
        await self.services.publish(event.model_copy(update={"pod": self.ref, "source": source, "cause": self.cause}))


__all__ = ["Eviction", "PodWorker", "Services", "StageContext", "MINIMUM_GRACE_SECONDS", "Permit"]
