"""The facts the probes stage publishes (the kubelet's Unhealthy, ProbeWarning and Killing
events, plus result changes for the trace)."""

from __future__ import annotations

from typing import Literal

from nodeagent.events import Event, KubeEvent

ProbeName = Literal["Liveness", "Readiness", "Startup"]


class ProbeFailed(Event):
    """A probe run failed (the kubelet's ``Unhealthy`` event). A run of failures is published up
    to the probe's failureThreshold, so a probe that keeps failing does not flood the trace."""

    kind: Literal["ProbeFailed"] = "ProbeFailed"
    container: str
    container_id: str
    probe: ProbeName
    message: str
    """``<Type> probe failed: <output>``, the kubelet's wording."""
    consecutive_failures: int

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Warning", "Unhealthy", self.message, self.container)


class ProbeWarned(Event):
    """An HTTP probe stopped at a redirect to another host: a success with a warning (the
    kubelet's ``ProbeWarning`` event)."""

    kind: Literal["ProbeWarned"] = "ProbeWarned"
    container: str
    container_id: str
    probe: ProbeName
    message: str

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Warning", "ProbeWarning", self.message, self.container)


class ProbeResultChanged(Event):
    """The applied result of a probe changed for a container instance (threshold reached)."""

    kind: Literal["ProbeResultChanged"] = "ProbeResultChanged"
    container: str
    container_id: str
    probe: ProbeName
    result: Literal["Success", "Failure"]


class UnhealthyContainerKilled(Event):
    """A liveness or startup probe failed past its threshold and the container was stopped; the
    runtime stage restarts it per restartPolicy."""

    kind: Literal["UnhealthyContainerKilled"] = "UnhealthyContainerKilled"
    container: str
    container_id: str
    probe: ProbeName
    grace_period_seconds: int
    message: str
    """``Container <name> failed <type> probe, will be restarted`` (the kubelet's Killing text)."""

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Normal", "Killing", self.message, self.container)
