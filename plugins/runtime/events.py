"""The facts the runtime stage publishes beyond the core ones (the kubelet's Killing,
FailedPostStartHook / FailedPreStopHook, BackOff and Failed events)."""

from __future__ import annotations

from typing import Literal

from nodeagent.events import Event, KubeEvent


class ContainerKilled(Event):
    """A running container was stopped by the agent (the kubelet's ``Killing``), and how it
    ended: the time spent in its preStop hook, the grace StopContainer got, the exit code."""

    kind: Literal["ContainerKilled"] = "ContainerKilled"
    container: str
    container_id: str
    reason: str
    """Why: ``Killing`` (pod termination), ``FailedPostStartHook``, ``PodCompleted`` (sidecars
    of a finished pod), ``SandboxChanged``."""
    pre_stop_seconds: float
    stop_timeout_seconds: int
    """The timeout StopContainer got: the grace left after preStop and ordering, at least 2 s."""
    exit_code: int | None = None
    finished_at: float | None = None
    """When the runtime saw the container exit (seconds since the epoch)."""

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Normal", "Killing", f"Stopping container {self.container}", self.container)


class HookFailed(Event):
    kind: Literal["HookFailed"] = "HookFailed"
    container: str
    container_id: str
    hook: Literal["PostStart", "PreStop"]
    reason: Literal["FailedPostStartHook", "FailedPreStopHook"]
    message: str

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Warning", self.reason, self.message, self.container)


class ContainerBackedOff(Event):
    """An exited container waits before its restart (the kubelet's ``BackOff``); published once
    per dead instance."""

    kind: Literal["ContainerBackedOff"] = "ContainerBackedOff"
    container: str
    container_id: str
    delay_seconds: float
    message: str

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Warning", "BackOff", self.message, self.container)


class ContainerFailed(Event):
    """A container could not be configured, created or started (the kubelet's Warning
    ``Failed`` event, "Error: <message>"): the reason is the container's waiting reason."""

    kind: Literal["ContainerFailed"] = "ContainerFailed"
    container: str
    reason: Literal["CreateContainerConfigError", "CreateContainerError", "RunContainerError"]
    message: str

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Warning", "Failed", f"Error: {self.message}", self.container)


class PullSecretsUnavailable(Event):
    """An image pull failed while some of the pod's imagePullSecrets could not be read (the
    kubelet's Warning ``FailedToRetrieveImagePullSecret``, sent only after a failed pull).
    Names the secrets, never their content."""

    kind: Literal["PullSecretsUnavailable"] = "PullSecretsUnavailable"
    container: str
    secrets: list[str]
    reason: Literal["FailedToRetrieveImagePullSecret"] = "FailedToRetrieveImagePullSecret"
    message: str

    def kube_event(self) -> KubeEvent:
        # On the pod, as the kubelet records it after the sync (no container fieldPath).
        return KubeEvent("Warning", self.reason, self.message)


class ImageVolumePullFailed(Event):
    """An image volume's image could not be had for a container about to start (the kubelet's
    image puller events, recorded on the pod itself for an image volume: Warning ``Failed``
    after a failed pull, Normal ``BackOff`` while waiting, Warning ``ErrImageNeverPull``)."""

    kind: Literal["ImageVolumePullFailed"] = "ImageVolumePullFailed"
    container: str
    """The container held back (the event is the pod's, as the kubelet's)."""
    reason: Literal["ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"]
    message: str

    def kube_event(self) -> KubeEvent:
        if self.reason == "ImagePullBackOff":
            return KubeEvent("Normal", "BackOff", self.message, "")
        if self.reason == "ErrImageNeverPull":
            return KubeEvent("Warning", "ErrImageNeverPull", self.message, "")
        return KubeEvent("Warning", "Failed", self.message, "")
