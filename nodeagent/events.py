"""Events: the facts that flow on the bus.

Every event is a frozen pydantic model named in the past tense. It states something that
happened and carries data only (no clients, no handles). Each names its pod, the stage that
emitted it (``source``), when it happened and the id of the event that caused it, so that a
pod's story can be replayed by ``nodeagent trace POD``.

Commands are not events: the pipeline calls stages through their phase methods; the results of
those calls are published here.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

_ids = itertools.count(1)


def _next_id() -> int:
    return next(_ids)


class PodRef(BaseModel):
    """Who an event is about. ``uid`` is the key; name and namespace are for people."""

    model_config = ConfigDict(frozen=True)
    uid: str
    namespace: str = ""
    name: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else self.uid


NODE = PodRef(uid="", name="")
"""The subject of node-wide facts (runtime became unavailable, a source failed)."""


@dataclass(frozen=True)
class KubeEvent:
    """How a fact is shown as a core/v1 Event on its pod (cluster mode): what a stage's own
    fact class says through :meth:`Event.kube_event`, so that the core needs no list of the
    stages' fact kinds."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    container: str = ""
    """The container the Event's fieldPath names; "": the pod itself."""


class Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int = Field(default_factory=_next_id)
    pod: PodRef = NODE
    source: str = "core"
    """The stage or core component that emitted the event (the log field ``stage=``)."""
    at: float = Field(default_factory=time.time)
    cause: int | None = None
    """The id of the event that caused this one, if any."""

    def kube_event(self) -> KubeEvent | None:
        """The Kubernetes Event this fact is, if any (stages' fact classes override it)."""
        return None


# --- sources -------------------------------------------------------------------------------


class PodSpecObserved(Event):
    kind: Literal["PodSpecObserved"] = "PodSpecObserved"
    origin: Literal["file", "api", "runtime"]
    pod_spec: dict[str, Any]
    """The pod as the source saw it (validated later into :class:`nodeagent.model.Pod`)."""


class PodDeletionRequested(Event):
    kind: Literal["PodDeletionRequested"] = "PodDeletionRequested"
    origin: Literal["file", "api", "runtime"]
    grace_period_seconds: int | None = None


class ManifestRejected(Event):
    """A manifest could not be turned into a pod; nothing was started for it."""

    kind: Literal["ManifestRejected"] = "ManifestRejected"
    path: str
    reason: str
    message: str


class UnhonouredFieldsFound(Event):
    kind: Literal["UnhonouredFieldsFound"] = "UnhonouredFieldsFound"
    fields: list[str]


# --- admission ---------------------------------------------------------------------------


class PodAdmitted(Event):
    kind: Literal["PodAdmitted"] = "PodAdmitted"


class PodRejected(Event):
    kind: Literal["PodRejected"] = "PodRejected"
    reason: str
    message: str


# --- setup and running -------------------------------------------------------------------


class StageCompleted(Event):
    """One stage finished one phase for a pod (the trace's unit of time)."""

    kind: Literal["StageCompleted"] = "StageCompleted"
    phase: str
    verdict: str
    duration_seconds: float
    reason: str = ""
    message: str = ""


class StageFailed(Event):
    kind: Literal["StageFailed"] = "StageFailed"
    phase: str
    error: str
    retryable: bool
    duration_seconds: float


class PodWaiting(Event):
    """Setup is parked: a stage answered WAIT or RETRY and will be asked again."""

    kind: Literal["PodWaiting"] = "PodWaiting"
    phase: str
    reason: str
    message: str = ""
    retry_after_seconds: float | None = None


class ImagePulled(Event):
    kind: Literal["ImagePulled"] = "ImagePulled"
    image: str
    image_ref: str
    already_present: bool


class SandboxStarted(Event):
    kind: Literal["SandboxStarted"] = "SandboxStarted"
    sandbox_id: str
    attempt: int
    pod_ip: str = ""
    adopted: bool = False


class ContainerCreated(Event):
    kind: Literal["ContainerCreated"] = "ContainerCreated"
    container: str
    container_id: str
    attempt: int


class ContainerStarted(Event):
    kind: Literal["ContainerStarted"] = "ContainerStarted"
    container: str
    container_id: str
    attempt: int = 0


class ContainerExited(Event):
    kind: Literal["ContainerExited"] = "ContainerExited"
    container: str
    container_id: str
    exit_code: int
    reason: str = ""


class PodStarted(Event):
    """Every container of the pod's start phase has been started."""

    kind: Literal["PodStarted"] = "PodStarted"
    seconds_since_observed: float


class PodCompleted(Event):
    """No container of the pod will run again (restart policy); the pod reached a terminal phase."""

    kind: Literal["PodCompleted"] = "PodCompleted"
    phase: Literal["Succeeded", "Failed"]


# --- teardown ----------------------------------------------------------------------------


class PodTerminating(Event):
    kind: Literal["PodTerminating"] = "PodTerminating"
    grace_period_seconds: int


class ContainerStopped(Event):
    kind: Literal["ContainerStopped"] = "ContainerStopped"
    container: str
    container_id: str


class SandboxRemoved(Event):
    kind: Literal["SandboxRemoved"] = "SandboxRemoved"
    sandbox_id: str


class PodTerminated(Event):
    kind: Literal["PodTerminated"] = "PodTerminated"
    phase: str


class PodForgotten(Event):
    """The agent dropped every record of the pod (its source no longer has it)."""

    kind: Literal["PodForgotten"] = "PodForgotten"


# --- node ------------------------------------------------------------------------------


class RuntimeUnavailable(Event):
    kind: Literal["RuntimeUnavailable"] = "RuntimeUnavailable"
    endpoint: str
    message: str


class RuntimeAvailable(Event):
    kind: Literal["RuntimeAvailable"] = "RuntimeAvailable"
    endpoint: str
    runtime: str


class PluginRejected(Event):
    """A plugin registration socket that no stage could take (an unknown type); the plugin was
    told why. Rejections by a stage (a bad name, no common version) are that stage's facts."""

    kind: Literal["PluginRejected"] = "PluginRejected"
    socket: str
    plugin: str
    type: str
    message: str


class TaskFailed(Event):
    """A long-running task of the agent (a source, the relister, a sink, a server, a plugin's
    node task, a pod worker) raised; the supervisor restarts it after ``restart_in_seconds``.
    ``task`` is its name (the metric label of nodeagent_task_failures_total)."""

    kind: Literal["TaskFailed"] = "TaskFailed"
    task: str
    error: str
    failures: int
    """How many times this task has failed since the agent started."""
    restart_in_seconds: float | None = None
    """None: the failure was contained without a restart (one request, one event)."""


class OrphanFound(Event):
    """The runtime runs a pod that no source wants; it is being terminated."""

    kind: Literal["OrphanFound"] = "OrphanFound"


AnyEvent = Annotated[
    Union[
        PodSpecObserved,
        PodDeletionRequested,
        ManifestRejected,
        UnhonouredFieldsFound,
        PodAdmitted,
        PodRejected,
        StageCompleted,
        StageFailed,
        PodWaiting,
        ImagePulled,
        SandboxStarted,
        ContainerCreated,
        ContainerStarted,
        ContainerExited,
        PodStarted,
        PodCompleted,
        PodTerminating,
        ContainerStopped,
        SandboxRemoved,
        PodTerminated,
        PodForgotten,
        RuntimeUnavailable,
        RuntimeAvailable,
        TaskFailed,
        PluginRejected,
        OrphanFound,
    ],
    Field(discriminator="kind"),
]

EVENT_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)
EVENT_KINDS: frozenset[str] = frozenset(
    cls.model_fields["kind"].default for cls in Event.__subclasses__()
)
