"""Probe results and the kubelet's threshold rule (pkg/kubelet/prober/worker.go), kept free of
I/O so the counting can be tested on its own."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import anyio

from nodeagent.model import Container, Probe
from plugins.probes.events import ProbeName


class ProbeType(enum.Enum):
    LIVENESS = "Liveness"
    READINESS = "Readiness"
    STARTUP = "Startup"

    def of(self, container: Container) -> Probe | None:
        return {
            ProbeType.LIVENESS: container.liveness_probe,
            ProbeType.READINESS: container.readiness_probe,
            ProbeType.STARTUP: container.startup_probe,
        }[self]

    @property
    def label(self) -> ProbeName:
        """The probe's name as events and messages spell it."""
        return self.value

    @property
    def kills(self) -> bool:
        """A failed liveness or startup probe gets the container killed; readiness never does."""
        return self is not ProbeType.READINESS


class Outcome(enum.Enum):
    """What one probe run said. WARNING (an HTTP redirect to another host) counts as success."""

    SUCCESS = "Success"
    WARNING = "Warning"
    FAILURE = "Failure"


class Result(enum.Enum):
    """A probe's applied result for one container instance (the kubelet's results.Result)."""

    UNKNOWN = "Unknown"
    SUCCESS = "Success"
    FAILURE = "Failure"


# What a new container instance starts with: not ready until proven, alive until proven
# otherwise, and not started until the startup probe says so.
INITIAL: dict[ProbeType, Result] = {
    ProbeType.READINESS: Result.FAILURE,
    ProbeType.LIVENESS: Result.SUCCESS,
    ProbeType.STARTUP: Result.UNKNOWN,
}


@dataclass
class ProbeState:
    """One (container, probe type): the applied result for the current container instance and
    the run of identical outcomes that leads to the next one."""

    type: ProbeType
    probe: Probe
    result: Result = Result.UNKNOWN
    last: Result | None = None
    run: int = 0
    on_hold: bool = False
    warned: bool = False
    """The current run of successes includes a warning already told."""
    """After a liveness/startup failure killed the instance: idle until a new instance appears."""
    trigger: anyio.Event = field(default_factory=anyio.Event)
    """Set to run the probe now rather than at the next period (a new instance, startup done)."""

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.result = INITIAL[self.type]
        self.last = None
        self.run = 0
        self.on_hold = False
        self.warned = False

    def record(self, outcome: Outcome) -> Result | None:
        """Count one probe run; returns the result to apply once the threshold is reached
        (``failureThreshold`` consecutive failures, ``successThreshold`` consecutive successes),
        else None: a run below its threshold leaves the applied result as it was."""
        result = Result.FAILURE if outcome is Outcome.FAILURE else Result.SUCCESS
        if result is self.last:
            self.run += 1
        else:
            self.last, self.run = result, 1
        threshold = self.probe.failure_threshold if result is Result.FAILURE else self.probe.success_threshold
        if self.run < threshold:
            return None
        self.result = result
        if result is Result.FAILURE and self.type.kills:
            # The instance is about to be killed: probing it further could only race the kill.
            self.on_hold = True
            self.run = 0
        return result

    def wake(self) -> None:
        self.trigger.set()

    def rearm(self) -> None:
        self.trigger = anyio.Event()
