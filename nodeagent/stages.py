"""The stage contract: phases, verdicts, and the interfaces a stage plugin implements.

This module is the manual for plugin authors. Everything nodeagent does to a pod is done by a
stage plugin joining one or more of the fixed phases below; the core only calls the phases in
order and reacts to their verdicts.

The path of one pod::

    admission cycle (node-wide, serial)      pod worker (one per pod, concurrent across pods)
    admit ─▶ reserve ───────────────────▶    prepare ─▶ permit ─▶ start ─▶ observe …
                                             teardown (shielded, bounded by the grace period):
                                             stop ─▶ unprepare ─▶ cleanup ─▶ unreserve

``permit`` sits between ``prepare`` and ``start`` — not in the admission cycle as in the
scheduler framework — because a gang's members must finish *local preparation* (images,
sandbox, devices) before any of them starts a container: preparation is phase one of a
two-phase start, container start is phase two, and ``permit`` is the barrier between them.

Paired phases live in the same plugin (reserve/unreserve, prepare/unprepare, start/stop): a
class that inherits :class:`Reserve` must implement both halves, or it cannot be instantiated.
Undo halves run in the reverse of the profile order and must be idempotent: they may be called
without their partner having run, or after it was cancelled half-way.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import anyio
import anyio.abc

from nodeagent.clock import Clock
from nodeagent.events import Event, PodRef
from nodeagent.facts import Fact, FactAccess
from nodeagent.kubeletconfig.node import NodeConfig
from nodeagent.lifecycle import PodState
from nodeagent.model import Pod
from nodeagent.podstatus import PodStatus
from nodeagent.stash import Stash

if TYPE_CHECKING:
    from cri import RuntimeClient
    from nodeagent.additions import AdditionsAccess
    from nodeagent.objects import ObjectStore
    from nodeagent.runtimeview import Expectation, PodRuntime
    from nodeagent.stats import Usage


class Verdict(enum.Enum):
    """The closed vocabulary of stage answers. Adding one is a design change."""

    CONTINUE = "Continue"
    """Done; go on with the next stage."""
    SKIP = "Skip"
    """This stage has nothing to do for this pod; go on."""
    WAIT = "Wait"
    """(permit only) Not yet: park the pod and ask again after ``retry_after`` seconds or when
    the stage calls :meth:`PodContext.wake`."""
    RETRY = "Retry"
    """A transient failure (an image that cannot be pulled yet, a driver not registered):
    the worker backs off and runs the phase again. ``reason`` is shown in status."""
    REJECT = "Reject"
    """A permanent no: the pod fails with ``reason`` and ``message`` and is torn down."""


@dataclass(frozen=True)
class Result:
    verdict: Verdict
    reason: str = ""
    message: str = ""
    retry_after: float | None = None

    @staticmethod
    def ok() -> Result:
        return Result(Verdict.CONTINUE)

    @staticmethod
    def skip() -> Result:
        return Result(Verdict.SKIP)

    @staticmethod
    def wait(reason: str, message: str = "", retry_after: float | None = None) -> Result:
        return Result(Verdict.WAIT, reason, message, retry_after)

    @staticmethod
    def retry(reason: str, message: str = "", retry_after: float | None = None) -> Result:
        return Result(Verdict.RETRY, reason, message, retry_after)

    @staticmethod
    def reject(reason: str, message: str) -> Result:
        return Result(Verdict.REJECT, reason, message)


class Phase(enum.Enum):
    ADMIT = "admit"
    RESERVE = "reserve"
    PREPARE = "prepare"
    PERMIT = "permit"
    START = "start"
    OBSERVE = "observe"
    STOP = "stop"
    UNPREPARE = "unprepare"
    CLEANUP = "cleanup"
    UNRESERVE = "unreserve"
    NODE = "node"


@dataclass(frozen=True)
class PhaseSpec:
    phase: Phase
    cycle: Literal["admission", "setup", "running", "teardown", "node"]
    verdicts: frozenset[Verdict]
    """The verdicts a stage may return; anything else is a bug the pipeline reports."""
    undo: Phase | None
    """The phase that reverts this one, run in reverse order (None: nothing to revert)."""
    summary: str


_NONE: frozenset[Verdict] = frozenset()

PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec(Phase.ADMIT, "admission", frozenset({Verdict.CONTINUE, Verdict.SKIP, Verdict.REJECT}), None,
              "may this pod run on this node? first REJECT wins"),
    PhaseSpec(Phase.RESERVE, "admission", frozenset({Verdict.CONTINUE, Verdict.SKIP, Verdict.REJECT}), Phase.UNRESERVE,
              "claim node resources for the pod"),
    PhaseSpec(Phase.PREPARE, "setup", frozenset({Verdict.CONTINUE, Verdict.SKIP, Verdict.RETRY, Verdict.REJECT}),
              Phase.UNPREPARE,
              "images, devices, volumes, sandbox: everything before a container starts"),
    PhaseSpec(Phase.PERMIT, "setup", frozenset({Verdict.CONTINUE, Verdict.SKIP, Verdict.WAIT, Verdict.REJECT}), None,
              "the barrier before containers start (gangs wait here)"),
    PhaseSpec(Phase.START, "setup", frozenset({Verdict.CONTINUE, Verdict.SKIP, Verdict.RETRY, Verdict.REJECT}),
              Phase.STOP,
              "create and start containers"),
    PhaseSpec(Phase.OBSERVE, "running", _NONE, None,
              "long-running watchers while the pod lives: status, restarts, probes"),
    PhaseSpec(Phase.STOP, "teardown", _NONE, None, "stop containers within the grace period"),
    PhaseSpec(Phase.UNPREPARE, "teardown", _NONE, None, "release what prepare made; no container runs any more"),
    PhaseSpec(Phase.CLEANUP, "teardown", _NONE, None, "remove runtime objects and pod directories"),
    PhaseSpec(Phase.UNRESERVE, "teardown", _NONE, None, "give back what reserve claimed"),
    PhaseSpec(Phase.NODE, "node", _NONE, None,
              "a node-level task for the agent's life: eviction, garbage collection, shutdown"),
)
PHASE_SPECS: Mapping[Phase, PhaseSpec] = {spec.phase: spec for spec in PHASES}


# --- what stages are given ---------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    name: str
    ip: str
    allocatable: Mapping[str, int]
    """Resources in base units: ``cpu`` in millicores, ``memory`` in bytes, ``pods`` as a count."""
    labels: Mapping[str, str] = field(default_factory=dict)
    ips: tuple[str, ...] = ()
    """Every address of the node, ``ip`` first (two on a dual-stack node); empty: just ``ip``."""


@dataclass(frozen=True)
class NodeView:
    """What the admission cycle shows a stage: the node and every pod admitted before.

    ``admitted`` never contains the candidate itself (the kubelet's rule), and lists pods in the
    order they were admitted.
    """

    node: NodeInfo
    admitted: Sequence[Pod]


class StatusReporter(Protocol):
    """A stage's line to the single status writer. Stages never write status elsewhere."""

    def container_waiting(self, container: str, reason: str, message: str = "") -> None:
        """Show ``container`` as waiting with ``reason`` (ErrImagePull, CrashLoopBackOff, ...)."""

    def clear_container_waiting(self, container: str) -> None: ...

    def set_pod_reason(self, reason: str, message: str = "") -> None: ...

    def set_observed(self, status: PodStatus) -> None:
        """Replace the runtime-derived part of the status (phase, container statuses, IPs,
        conditions, resources); the status stage's (plugins/status.py)."""

    def container_probe_result(self, container: str, *, ready: bool | None = None,
                               started: bool | None = None) -> None:
        """(probes) Readiness / startup of ``container``'s current instance; None = no opinion.
        The writer applies it over the observed status and recomputes Ready/ContainersReady."""

    def set_condition(self, type: str, status: bool, reason: str = "", message: str = "") -> None:
        """Add or replace a pod condition owned by a stage (e.g. a readiness gate or a
        nodeagent.io/* condition)."""


class PodContext(Protocol):
    """The handle a stage gets for one pod. Stages never open their own clients."""

    stage: str
    runtime: RuntimeClient
    clock: Clock
    stash: Stash
    """What this stage keeps about the pod for itself (nobody else reads it)."""
    node: NodeInfo
    log: Any
    """A structlog logger bound to the pod and ``stage=``."""

    @property
    def pod(self) -> Pod:
        """The latest spec of the pod (it may change between calls; never within one)."""

    @property
    def ref(self) -> PodRef: ...

    @property
    def status(self) -> StatusReporter: ...

    @property
    def settings(self) -> NodeConfig:
        """The node's configuration: the effective KubeletConfiguration with the node's name and
        root directory, typed and frozen (a stage's own settings are its config model)."""

    @property
    def objects(self) -> ObjectStore:
        """The agent's object store (see AgentHandle.objects)."""

    @property
    def additions(self) -> AdditionsAccess:
        """(prepare) The mounts, devices and env this stage gives the pod's containers; the
        runtime stage merges every stage's (nodeagent.additions)."""

    @property
    def facts(self) -> FactAccess:
        """The pod's shared facts this stage declared (``provides``, ``requires``, ``uses``)."""

    @property
    def pod_dir(self) -> Path:
        """``<rootDir>/pods/<uid>``: created before prepare, removed after cleanup."""

    @property
    def observed(self) -> PodRuntime:
        """What the runtime relister last saw of this pod (sandboxes, containers, statuses)."""

    async def pod_changed(self, since: Pod, timeout: float) -> bool:
        """(observe) True as soon as ``ctx.pod`` is a newer spec than ``since`` (labels,
        annotations, resources edited in the API, an edited manifest's metadata); False after
        ``timeout`` seconds on ``ctx.clock`` without one. The pod's change feed: no polling."""

    async def runtime_changed(self, timeout: float | None = None) -> None:
        """Return when the relister saw a change for this pod (or ``timeout`` passed): at once
        when the pod's record changed since this stage last read ``observed``, so that a change
        that came while the stage was busy is not waited out."""

    def request_relist(self, expect: Expectation | None = None) -> None:
        """Ask the relister to look at this pod in the runtime now (after this stage changed
        something); it relists the pod alone, not the node. ``expect`` (runtimeview.Expectation):
        the change was a new sandbox, or a container's creation or start; on a runtime that
        streams events, its own event then shows the relister what a listing would have."""

    async def publish(self, event: Event) -> None:
        """Publish a fact about this pod; ``pod``, ``source`` and ``cause`` are filled in."""

    @property
    def terminating(self) -> bool:
        """The pod was asked to stop (deleted, or dropped by its source)."""

    def complete(self, phase: Literal["Succeeded", "Failed"]) -> None:
        """(observe) The pod reached a terminal phase: no container will run again."""

    def fail(self, reason: str, message: str) -> None:
        """(observe) Fail the whole pod (e.g. its activeDeadlineSeconds passed): its containers
        are stopped with the pod's grace period, its phase becomes Failed with this reason and
        message, and nothing of it runs again."""

    def wake(self) -> None:
        """(permit) Ask the worker to call a WAITing permit stage again now."""


# --- the phases --------------------------------------------------------------------------


class Stage(ABC):
    """Base of every stage plugin. ``name`` = entry-point name = config section = log ``stage=``.

    ``provides`` / ``requires`` / ``uses``: the per-pod facts (nodeagent.facts) the stage
    publishes, cannot work without, and reads when they are there. The registry checks that
    every required fact has a provider in the profile; ``ctx.facts`` lets a stage touch only
    what it declared.

    Optional, found by name: ``render_metrics()`` returns the stage's own series (Prometheus
    text) for /metrics, ``render_probe_metrics()`` its series for the kubelet port's
    /metrics/probes (the probes stage's prober_probe_*), ``describe()`` what ``nodeagent
    plugins`` shows of a running agent."""

    name: ClassVar[str]
    provides: ClassVar[tuple[Fact[Any], ...]] = ()
    requires: ClassVar[tuple[Fact[Any], ...]] = ()
    uses: ClassVar[tuple[Fact[Any], ...]] = ()


class Admit(Stage):
    @abstractmethod
    async def admit(self, pod: Pod, node: NodeView) -> Result:
        """May ``pod`` run here?

        Called: in the node-wide admission cycle, once per new pod UID, one pod at a time.
        Assumes: nothing has been done for the pod yet; ``node.admitted`` excludes it.
        Verdicts: CONTINUE / SKIP admit; REJECT fails the pod with ``reason`` (the kubelet's,
        e.g. ``OutOfcpu``) and ``message``. The first REJECT ends the cycle for the pod.
        Idempotent: must be a pure decision; it may be asked again after an agent restart.
        Cancellation: may be cancelled when the pod is deleted; keep no state.
        """


class Reserve(Stage):
    @abstractmethod
    async def reserve(self, pod: Pod, node: NodeView) -> Result:
        """Claim node-level resources (devices, exclusive CPUs) for an admitted pod.

        Called: in the admission cycle after every admit stage said yes.
        Verdicts: CONTINUE / SKIP, or REJECT: then ``unreserve`` runs for the stages that
        reserved before, in reverse order, and the pod fails.
        Cancellation: a cancelled reserve is followed by ``unreserve``.
        """

    @abstractmethod
    async def unreserve(self, pod: Pod) -> None:
        """Give back what ``reserve`` claimed. Idempotent; safe when reserve never ran."""


class Prepare(Stage):
    @abstractmethod
    async def prepare(self, ctx: PodContext) -> Result:
        """Get the pod ready to start containers: pull images, prepare devices and volumes,
        run the sandbox.

        Called: in the pod's worker after admission, in profile order; again after RETRY, and
        after an agent restart (so it must adopt what already exists, e.g. a running sandbox).
        Verdicts: CONTINUE / SKIP; RETRY (transient, with ``reason`` shown to users while the
        worker backs off); REJECT (the pod fails).
        Cancellation: a deletion cancels setup; ``unprepare`` then runs, shielded.
        """

    @abstractmethod
    async def unprepare(self, ctx: PodContext) -> None:
        """Release what prepare made. Called only when no container of the pod runs any more
        (the kubelet's rule for devices). Idempotent; safe after a cancelled or failed prepare
        and when prepare never ran. Runs shielded from cancellation, bounded by a timeout."""


class Permit(Stage):
    @abstractmethod
    async def permit(self, ctx: PodContext) -> Result:
        """The last word before any container starts (the gang barrier).

        Called: after every prepare stage said CONTINUE/SKIP.
        Verdicts: CONTINUE / SKIP let the pod start; WAIT parks it (status shows ``reason``,
        e.g. ``WaitingForGang``) until ``retry_after`` passes or the stage calls ``ctx.wake()``,
        then permit is asked again; REJECT fails the pod and tears its preparation down.
        Must not block for long: return WAIT instead of awaiting a decision.
        """


class Start(Stage):
    @abstractmethod
    async def start(self, ctx: PodContext) -> Result:
        """Create and start containers.

        Called: after permit, in profile order; again after RETRY and after an agent restart
        (adopt running containers, never duplicate them).
        Verdicts: CONTINUE / SKIP; RETRY with back-off; REJECT fails the pod.
        """

    @abstractmethod
    async def stop(self, ctx: PodContext, grace_period: float) -> None:
        """Stop the containers within ``grace_period`` seconds. Idempotent; shielded."""

    async def create_ahead(self, ctx: PodContext) -> None:
        """Optional: create the containers the start phase would start first, without starting
        any, so that the permit's release has only to start them.

        Called: once per pod, when permit first answers WAIT (a gang member at its barrier),
        after every prepare stage; in profile order. The pod may be released instead of started:
        its stop and cleanup then remove what this made. Must never start a container (one
        started before the barrier lets go is a partial start). Best-effort: a failure is
        logged and left to ``start``, which creates what is missing. Cancelled with the setup.
        """
        return None


class Observe(Stage):
    through_termination: ClassVar[bool] = False
    """True: keep observing a killed pod while its stop phase runs (``ctx.terminating`` is then
    True), as the kubelet keeps reporting status and probing readiness during termination.
    Such a stage must not start anything then. False: cancelled as soon as the pod is killed."""

    @abstractmethod
    async def observe(self, ctx: PodContext) -> None:
        """Watch the running pod (status, restarts, probes) until cancelled.

        Called: once the start phase succeeded, concurrently with the other observe stages,
        in the pod's own task group; cancelled when the pod completes, and when it is killed
        (after the stop phase if ``through_termination``, else at once).
        May call ``ctx.complete(phase)`` when no container will run again.
        Returning early is allowed (nothing to watch).
        """


class Cleanup(Stage):
    @abstractmethod
    async def cleanup(self, ctx: PodContext) -> None:
        """Remove what is left (stopped containers, the sandbox, directories) when the pod is
        gone for good. Idempotent; best-effort; runs after unprepare."""


class NodeTask(Stage):
    """A node-wide manager (eviction, garbage collection, graceful shutdown): one task for the
    agent's life rather than a call per pod. It may also join pod phases (eviction and shutdown
    admit pods too); it acts on pods only through the :class:`AgentHandle` it was made with
    (``pods``, ``evict``, ``usage``, node conditions and Events), never through a client.

    Listed in the profile's ``node`` entry; the agent runs :meth:`run` under its supervisor as
    task ``stage:<name>``."""

    @abstractmethod
    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Work until cancelled.

        Called: once, after the runtime answered and before the pod sources start; again after
        a failure (the supervisor restarts it with back-off), so it must rebuild what it needs
        from the handle rather than assume the state of a previous run.
        Report ``task_status.started()`` once ready (soon: the agent's start waits for it).
        Must contain its own per-cycle failures (log, continue): an exception restarts it.
        Cancellation: the agent is stopping; nothing needs undoing.
        """


PHASE_BASES: Mapping[Phase, type[Stage]] = {
    Phase.ADMIT: Admit,
    Phase.RESERVE: Reserve,
    Phase.UNRESERVE: Reserve,
    Phase.PREPARE: Prepare,
    Phase.UNPREPARE: Prepare,
    Phase.PERMIT: Permit,
    Phase.START: Start,
    Phase.STOP: Start,
    Phase.OBSERVE: Observe,
    Phase.CLEANUP: Cleanup,
    Phase.NODE: NodeTask,
}


def phases_of(stage: Stage | type[Stage]) -> frozenset[Phase]:
    cls = stage if isinstance(stage, type) else type(stage)
    return frozenset(p for p, base in PHASE_BASES.items() if issubclass(cls, base))


ACTIVE_STATES = frozenset({PodState.ADMITTED, PodState.PREPARING, PodState.WAITING, PodState.STARTING,
                           PodState.RUNNING})
"""Admitted and not yet finished: the pods a node-level manager may evict (the kubelet's active pods)."""


@dataclass(frozen=True)
class PodSnapshot:
    """One pod as the agent holds it right now (read-only: a copy, not a handle)."""

    ref: PodRef
    pod: Pod
    status: Mapping[str, Any]
    """The status the single writer computed (phase, conditions, container statuses)."""
    state: PodState

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


@dataclass(frozen=True)
class Condition:
    """A condition a node-level manager sets: on a pod (``evict``'s DisruptionTarget) or on the
    Node (MemoryPressure, DiskPressure, PIDPressure; Ready False while shutting down)."""

    type: str
    status: bool
    reason: str = ""
    message: str = ""


ReclaimKind = Literal["images", "containers"]
"""Node-level reclaim a manager may offer and another may ask for (eviction asks the GC):
``images`` deletes every unused image (the kubelet's DeleteUnusedImages), ``containers`` every
dead container, also of terminated pods (DeleteAllUnusedContainers)."""


class AgentHandle(Protocol):
    """Node-level services given to a plugin factory (per-pod services come in PodContext).

    The first group every handle has. The second serves node-wide managers (plugins joining
    ``node``); a handle made for a single stage (the contract suite's) may lack them."""

    runtime: RuntimeClient
    clock: Clock
    node: NodeInfo
    objects: ObjectStore
    """API objects with the node's credentials (nodeagent.objects): views kept current by list
    and watch, cached reads by name, the few writes stages make. Standalone: the documents
    beside the static pods. A stage never opens a client of its own."""

    @property
    def settings(self) -> NodeConfig:
        """The node's configuration (see PodContext.settings)."""

    async def publish(self, event: Event) -> None: ...

    # --- for node-wide managers -------------------------------------------------------------

    def usage(self) -> Usage | None:
        """The latest usage sample (nodeagent.stats: node CPU, memory, filesystems, processes;
        per pod and container CPU, memory, rootfs, logs, volumes), None before the first."""

    async def usage_changed(self, timeout: float | None = None) -> None:
        """Return when a new sample is taken (or ``timeout`` passed)."""

    def request_usage(self) -> None:
        """Ask for a sample now rather than at the next housekeeping tick (after a reclaim)."""

    def pods(self) -> Sequence[PodSnapshot]:
        """Every pod the agent tracks, with its spec, computed status and lifecycle state."""

    def evict(self, uid: str, *, reason: str, message: str, grace_seconds: int,
              condition: Condition | None = None) -> anyio.Event | None:
        """Fail the pod as a whole through its worker, as ``PodContext.fail`` does: its
        containers are stopped with ``grace_seconds`` (a later deletion may only shorten it),
        its phase becomes Failed with ``reason`` and ``message`` (and ``condition``, e.g.
        DisruptionTarget), and nothing of it runs again. Sticky: once accepted, a second call
        changes nothing. Returns an event set once its containers stopped and its sandbox and
        volumes were released; None when the pod is not active (unknown, finished, killed)."""

    def set_node_condition(self, condition: Condition) -> None:
        """Report a Node condition (MemoryPressure, DiskPressure, PIDPressure; Ready False
        with a reason while shutting down). The Node status writer publishes it at once; the
        same condition again is no change. Standalone it is kept and shown in /metrics."""

    def node_event(self, type: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        """An Event about the Node (cluster mode; logged in both modes)."""

    def volume_reported_in_use(self, unique_name: str) -> bool:
        """Whether a successful Node status write listed the volume (``kubernetes.io/csi/
        <driver>^<handle>``) in volumesInUse, which a volume needing attach must be before it is
        mounted (nodeagent.volumesinuse); if not, a write is asked for at once. The name must be
        among what the stage's ``volumes_in_use()`` reports. Standalone: always True."""

    def provide_reclaim(self, kind: ReclaimKind, reclaim: Callable[[], Awaitable[int]]) -> None:
        """Offer a node-level reclaim (returns bytes freed), for :meth:`reclaim`."""

    async def reclaim(self, kind: ReclaimKind) -> int | None:
        """Run the reclaim some manager offered; None when nobody offers ``kind``."""


PluginFactory = Callable[[Any, AgentHandle], Stage]
"""What an entry point in group ``nodeagent.plugins`` names: ``factory(config, handle)``, where
``config`` is the plugin's section validated by the model the factory declares as
``factory.config_model`` (nodeagent/pluginconfig.py), or the raw mapping if it declares none."""

Waker = Callable[[], Awaitable[None]]
