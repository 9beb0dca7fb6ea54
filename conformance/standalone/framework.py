"""What upstream's e2e framework gives a node-conformance test, rebuilt for a static-pod agent.

A ported case gets a :class:`Framework`: its own namespace (upstream's ``<base>-<4 digits>``),
``create`` (write a static manifest, after the node-e2e ``PodClient`` munging), ``delete``
(remove the manifest: a static pod has no other deletion), the pod's status from the agent's
single status writer, its container logs from the CRI log files, and exec through CRI
``ExecSync``. The waits carry the names and the semantics of the ``e2epod`` helpers they stand
for (a wait for success fails at once on phase Failed, a wait for Running fails on a terminal
phase, ...), so a case reads like its upstream test.

Static pods are named ``<manifest name>-<node>`` by the agent (as by the kubelet). Cases talk in
manifest names; :meth:`Framework.pod_name` gives the name the pod really has, for expectations
such as ``POD_NAME=...`` or a hostname.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio

# Cases import their decorator from here along with the framework.
from conformance.standalone.registry import REGISTRY, Case, Skipped, all_cases, case
from cri import RuntimeClient
from cri import types as t
from nodeagent import labels as L
from nodeagent import logreader
from nodeagent.agent import Agent
from nodeagent.config import AgentConfig
from nodeagent.lifecycle import PodState

# Upstream's framework timeouts (test/e2e/framework/timeouts.go), in seconds.
POD_START = 5 * 60.0
POD_START_SHORT = 2 * 60.0
POD_DELETE = 5 * 60.0
POLL = 2.0
# How often the port looks at a status where upstream watches: often enough to see each state
# a pod passes through for more than a moment, cheap since the status lives in this process.
WATCH_POLL = 0.2
# How long past a pod's grace period its cleanup may take before the case is failed for it.
CLEANUP_SLACK = 60.0
# The kubelet's minimum grace period (a delete with grace 0 still gets it).
MINIMUM_GRACE = 2.0
BUSYBOX = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1"
"""The image upstream names; devenv tags its busybox with this name too."""
PAUSE = "registry.k8s.io/pause:3.10"

Status = dict[str, Any]
Outcome = Literal["pass", "fail", "skip"]


class PodNotFound(AssertionError):
    """The agent has no status for the pod (never admitted, or forgotten after deletion)."""


# --- status helpers (the podutil functions upstream asserts with) -------------------------

def phase(status: Mapping[str, Any]) -> str:
    return str(status.get("phase", ""))


def condition(status: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c.get("type") == kind), None)


def is_ready(status: Mapping[str, Any]) -> bool:
    """podutil.IsPodReady: the Ready condition is True."""
    ready = condition(status, "Ready")
    return ready is not None and ready.get("status") == "True"


def container_status(status: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key, []):
            if cs.get("name") == name:
                return dict(cs)
    return None


def state_of(cs: Mapping[str, Any] | None) -> str:
    """GetContainerState: Waiting, Running, Terminated or Unknown."""
    state = (cs or {}).get("state", {})
    for kind in ("waiting", "running", "terminated"):
        if kind in state:
            return kind.capitalize()
    return "Unknown"


def brief(status: Mapping[str, Any] | None) -> str:
    """A status in one line, for failure messages."""
    return json.dumps(status, sort_keys=True) if status is not None else "<pod not found>"


# --- the node the cases share -------------------------------------------------------------

@dataclass
class Node:
    """The one agent every case runs against, and the CRI client for exec."""

    agent: Agent
    config: AgentConfig
    client: RuntimeClient

    @property
    def name(self) -> str:
        return self.config.node_name

    @property
    def manifests(self) -> Path:
        assert self.config.kubelet.static_pod_path
        return Path(self.config.kubelet.static_pod_path)

    def find(self, namespace: str, pod_name: str) -> tuple[str, Status] | None:
        """(uid, status) of the pod the agent knows by that name (the newest if several)."""
        found = [(uid, status) for uid, (ref, _pod, status, _state) in self.agent.status.all().items()
                 if ref.namespace == namespace and ref.name == pod_name]
        return found[-1] if found else None


def munge(pod: dict[str, Any], namespace: str, node: str) -> dict[str, Any]:
    """What node-e2e's PodClient.mungeSpec does before every create: pin the pod to the node,
    dnsPolicy Default (node e2e has no cluster DNS), and imagePullPolicy Never for every regular
    container not asking for Always (images are pre-pulled; init containers are left alone)."""
    pod = copy.deepcopy(pod)
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    pod.setdefault("metadata", {})["namespace"] = namespace
    spec = pod.setdefault("spec", {})
    spec["nodeName"] = node
    spec["dnsPolicy"] = "Default"
    for container in spec.get("containers", []):
        if container.get("imagePullPolicy") != "Always":
            container["imagePullPolicy"] = "Never"
    return pod


# --- the per-case framework ---------------------------------------------------------------

@dataclass
class Framework:
    node: Node
    case: Case
    namespace: str = ""
    steps: list[str] = field(default_factory=list)
    """What the case did so far (ginkgo.By), shown with a failure."""
    _pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    _force_delete: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.namespace:
            # CreateTestingNS: "<base>-<RandomSuffix()>", four random digits.
            self.namespace = f"{self.case.framework}-{random.randrange(10000)}"

    # names ----------------------------------------------------------------------------

    def pod_name(self, name: str) -> str:
        """The name the agent gives the static pod of manifest ``name``."""
        return f"{name}-{self.node.name}"

    def by(self, step: str) -> None:
        self.steps.append(step)

    # create / delete ------------------------------------------------------------------

    def manifest_path(self, name: str) -> Path:
        # The kubelet's static pod file naming, as the MirrorPod tests write them.
        return self.node.manifests / f"{self.namespace}-{name}.yaml"

    def create(self, pod: dict[str, Any], *, force_delete_at_cleanup: bool = False) -> str:
        """PodClient.Create: write the (munged) static manifest; returns the manifest name.

        ``force_delete_at_cleanup``: upstream's cleanup deletes this pod with grace 0, which a
        static pod cannot ask for; the cleanup then stops its containers through CRI once the
        agent is terminating the pod (the kubelet's 2 s minimum grace), instead of waiting out a
        grace period that only the cleanup would pay for. Never used for a deletion a case
        asserts on."""
        pod = munge(pod, self.namespace, self.node.name)
        name = str(pod["metadata"]["name"])
        self._pods[name] = pod
        if force_delete_at_cleanup:
            self._force_delete.add(name)
        path = self.manifest_path(name)
        tmp = path.with_name(f".{path.name}.tmp")  # dot files are not read: no half-written pod
        tmp.write_text(json.dumps(pod, indent=1))
        tmp.rename(path)
        self.by(f"creating pod {name}")
        return name

    def delete(self, name: str) -> None:
        """PodClient.Delete with the pod's own grace period: remove the manifest."""
        self.manifest_path(name).unlink(missing_ok=True)
        self.by(f"deleting pod {name}")

    def spec_of(self, name: str) -> dict[str, Any]:
        return self._pods[name]

    def created(self) -> list[str]:
        return list(self._pods)

    # status ---------------------------------------------------------------------------

    def lookup(self, name: str) -> tuple[str, Status] | None:
        return self.node.find(self.namespace, self.pod_name(name))

    def status(self, name: str) -> Status | None:
        found = self.lookup(name)
        return found[1] if found else None

    def get(self, name: str) -> Status:
        """podClient.Get: the status, or a failure when the pod does not exist."""
        status = self.status(name)
        if status is None:
            raise PodNotFound(f'pods "{self.pod_name(name)}" not found')
        return status

    def uid(self, name: str) -> str:
        found = self.lookup(name)
        if found is None:
            raise PodNotFound(f'pods "{self.pod_name(name)}" not found')
        return found[0]

    async def wait_for_pod(self, name: str, what: str, timeout: float,
                           check: Callable[[Status], bool], poll: float = POLL) -> Status:
        """WaitForPodCondition: poll until ``check`` says True; an AssertionError from ``check``
        ends the wait at once (upstream's ``return true, err``). A pod the agent does not know
        yet is waited for, since the agent reads manifests asynchronously."""
        last: Status | None = None
        with anyio.move_on_after(timeout):
            while True:
                last = self.status(name)
                if last is not None and check(last):
                    return last
                await anyio.sleep(poll)
        raise AssertionError(f"timed out after {timeout:g}s waiting for pod {name} to be {what}; "
                             f"last status: {brief(last)}")

    async def wait_running(self, name: str, timeout: float = POD_START) -> Status:
        """WaitForPodRunningInNamespace (a pod that ran to completion is an error)."""
        def running(status: Status) -> bool:
            if phase(status) in ("Succeeded", "Failed"):
                raise AssertionError(f"pod {name} ran to completion (phase {phase(status)}): {brief(status)}")
            return phase(status) == "Running"

        return await self.wait_for_pod(name, "running", timeout, running)

    async def create_sync(self, pod: dict[str, Any], timeout: float = POD_START) -> str:
        """PodClient.CreateSync: create, then wait for Running and Ready."""
        name = self.create(pod)

        def ready(status: Status) -> bool:
            if phase(status) in ("Succeeded", "Failed"):
                raise AssertionError(f"pod {name} ran to completion (phase {phase(status)}): {brief(status)}")
            return phase(status) == "Running" and is_ready(status)

        await self.wait_for_pod(name, "running and ready", timeout, ready)
        return name

    async def wait_success(self, name: str, timeout: float = POD_START) -> Status:
        """WaitForPodSuccessInNamespace (phase Failed ends the wait with an error)."""
        def succeeded(status: Status) -> bool:
            if phase(status) == "Failed":
                raise AssertionError(f"pod {name} failed: {brief(status)}")
            return phase(status) == "Succeeded"

        return await self.wait_for_pod(name, "Succeeded", timeout, succeeded)

    async def wait_no_longer_running(self, name: str, timeout: float = POD_START) -> Status:
        """WaitForPodNoLongerRunningInNamespace: phase neither Pending nor Running."""
        return await self.wait_for_pod(name, "no longer running", timeout,
                                       lambda s: phase(s) not in ("", "Pending", "Running"))

    async def wait_not_pending(self, name: str, timeout: float = POD_START) -> Status:
        """WaitForPodNotPending."""
        return await self.wait_for_pod(name, "not pending", timeout, lambda s: phase(s) not in ("", "Pending"))

    async def wait_failed_reason(self, name: str, reason: str, timeout: float = POD_START, *,
                                 succeeded_is_error: bool = True) -> Status:
        """WaitForPodFailedReason: phase Failed with exactly that ``status.reason`` (another
        reason, or phase Succeeded, ends the wait with an error). With ``succeeded_is_error``
        False it is WaitForPodTerminatedInNamespace, which waits on past a success."""
        def failed(status: Status) -> bool:
            if phase(status) == "Succeeded" and succeeded_is_error:
                raise AssertionError(f"pod {name} succeeded unexpectedly: {brief(status)}")
            if phase(status) != "Failed":
                return False
            if status.get("reason", "") != reason:
                raise AssertionError(f"expected pod {name} to be terminated with reason {reason!r}, "
                                     f"got reason {status.get('reason', '')!r}: {brief(status)}")
            return True

        return await self.wait_for_pod(name, f"Failed with reason {reason!r}", timeout, failed)

    async def wait_not_found(self, name: str, timeout: float) -> None:
        """WaitForPodNotFoundInNamespace: the agent has forgotten the pod (its teardown ended)."""
        with anyio.move_on_after(timeout):
            while self.status(name) is not None:
                await anyio.sleep(WATCH_POLL)
            return
        raise AssertionError(f"pod {name} still present {timeout:g}s after deletion: {brief(self.status(name))}")

    async def wait_restart_count(self, name: str, index: int, count: int, timeout: float,
                                 init: bool = False) -> Status:
        """WaitForPodContainerRestartCount / WaitForPodInitContainerRestartCount: restartCount
        of the container at ``index`` reaches ``count``."""
        key = "initContainerStatuses" if init else "containerStatuses"

        def reached(status: Status) -> bool:
            statuses = status.get(key, [])
            return len(statuses) > index and statuses[index].get("restartCount", 0) >= count

        return await self.wait_for_pod(name, f"{key}[{index}].restartCount >= {count}", timeout, reached)

    async def watch(self, name: str, timeout: float, *conditions: Callable[[Status], bool]) -> Status:
        """watchtools.Until: each condition in turn must become true on a status the pod passes
        through; an AssertionError raised by a condition fails the watch. Statuses are sampled
        every WATCH_POLL seconds rather than pushed, so a state shorter than that can be missed."""
        remaining = list(conditions)
        last: Status | None = None
        with anyio.move_on_after(timeout):
            while True:
                status = self.status(name)
                if status is not None and status != last:
                    last = status
                    while remaining and remaining[0](status):
                        remaining.pop(0)
                    if not remaining:
                        return status
                await anyio.sleep(WATCH_POLL)
        raise AssertionError(f"timed out after {timeout:g}s watching pod {name} "
                             f"({len(conditions) - len(remaining)} of {len(conditions)} conditions met); "
                             f"last status: {brief(last)}")

    # logs -----------------------------------------------------------------------------

    def _log_dir(self, name: str, container: str) -> Path:
        uid = self.uid(name)
        pod_dir = logreader.pod_log_dir(Path(self.node.config.kubelet.pod_logs_dir), self.namespace, self.pod_name(name), uid)
        return pod_dir / container

    def log_file(self, name: str, container: str, previous: bool = False) -> Path:
        directory = self._log_dir(name, container)
        attempts = logreader.attempts(directory)
        if not attempts:
            raise AssertionError(f'container "{container}" in pod "{self.pod_name(name)}" has no log file '
                                 f"under {directory}")
        attempt = attempts[-1] - (1 if previous else 0)
        if attempt not in attempts:
            raise AssertionError(f'previous terminated container "{container}" in pod "{self.pod_name(name)}" '
                                 "not found")
        return directory / f"{attempt}.log"

    def logs(self, name: str, container: str, *, previous: bool = False, since: float | None = None) -> str:
        """GetPodLogs (``previous``: GetPreviousPodLogs; ``since``: PodLogOptions.SinceTime, unix
        seconds): the container's CRI log file with the framing removed, as the kubelet serves it."""
        lines = logreader.read(self.log_file(name, container, previous))
        since_nanos = int(since * 1e9) if since is not None else None
        return b"".join(line.render(False) for line in logreader.select(lines, since_nanos=since_nanos)).decode(
            errors="replace")

    # exec -----------------------------------------------------------------------------

    async def exec(self, name: str, container: str, command: Sequence[str],
                   timeout: int = 60) -> t.ExecSyncResult:
        """ExecCommandInContainer, through CRI ExecSync on the container the status names."""
        cs = container_status(self.get(name), container)
        container_id = (cs or {}).get("containerID", "").removeprefix("containerd://")
        if not container_id:
            raise AssertionError(f"container {container} of pod {name} has no containerID: {brief(cs)}")
        return await self.node.client.exec_sync(container_id, list(command), timeout=timeout)

    # TestContainerOutput ----------------------------------------------------------------

    async def container_output(self, pod: dict[str, Any], index: int, expected: Sequence[str], *,
                               regexp: bool = False, init: bool = False) -> str:
        """TestContainerOutput / TestContainerOutputRegexp: create the pod, wait until it
        Succeeded (5 min; Failed is an error), then every expected substring (or regexp) must be
        in the logs of container ``index``. Returns the logs."""
        name = self.create(pod)
        containers = pod["spec"]["initContainers" if init else "containers"]
        container = str(containers[index]["name"])
        try:
            await self.wait_success(name, POD_START)
        except AssertionError as exc:
            raise AssertionError(f"expected pod {name} success: {exc}\n"
                                 f"logs of {container}: {self._logs_or_error(name, container)!r}") from None
        output = self.logs(name, container)
        for item in expected:
            found = re.search(item, output) if regexp else item in output
            if not found:
                kind = "regexp" if regexp else "substring"
                raise AssertionError(f"expected {kind} {item!r} in the output of container {container}; "
                                     f"got {output!r}")
        return output

    def _logs_or_error(self, name: str, container: str) -> str:
        try:
            return self.logs(name, container)
        except AssertionError as exc:
            return f"<{exc}>"

    # cleanup --------------------------------------------------------------------------

    def grace_of(self, name: str) -> float:
        if name in self._force_delete:
            return MINIMUM_GRACE
        return float(self._pods[name].get("spec", {}).get("terminationGracePeriodSeconds", 30))

    async def cleanup(self) -> list[str]:
        """Remove what the case left and wait until the agent has forgotten it (upstream's
        namespace deletion). Returns the pods that did not go away in time."""
        for name in self._pods:
            self.manifest_path(name).unlink(missing_ok=True)
        stuck: list[str] = []
        for name in self._pods:
            try:
                if name in self._force_delete:
                    await self._stop_when_terminating(name)
                await self.wait_not_found(name, self.grace_of(name) + CLEANUP_SLACK)
            except AssertionError:
                stuck.append(name)
        return stuck

    async def _stop_when_terminating(self, name: str) -> None:
        """Once the agent has taken the deletion (the pod is terminating: it will not restart a
        container any more), stop the pod's running containers with the minimum grace."""
        pod_name = self.pod_name(name)
        with anyio.move_on_after(CLEANUP_SLACK):
            while True:
                states = [state for ref, _pod, _status, state in self.node.agent.status.all().values()
                          if ref.namespace == self.namespace and ref.name == pod_name]
                if not states or all(s in (PodState.TERMINATING, PodState.TERMINATED) for s in states):
                    break
                await anyio.sleep(WATCH_POLL)
        for container in await self.node.client.list_containers():
            if (container.labels.get(L.POD_NAMESPACE) == self.namespace and container.labels.get(L.POD_NAME) == pod_name
                    and container.state == t.ContainerState.CONTAINER_RUNNING):
                with anyio.move_on_after(CLEANUP_SLACK):
                    await self.node.client.stop_container(container.id, int(MINIMUM_GRACE))


__all__ = [
    "BUSYBOX",
    "PAUSE",
    "POD_DELETE",
    "POD_START",
    "POD_START_SHORT",
    "POLL",
    "REGISTRY",
    "WATCH_POLL",
    "Case",
    "Framework",
    "Node",
    "PodNotFound",
    "Skipped",
    "Status",
    "all_cases",
    "brief",
    "case",
    "condition",
    "container_status",
    "is_ready",
    "munge",
    "phase",
    "state_of",
]
