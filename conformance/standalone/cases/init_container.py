"""test/e2e/common/node/init_container.go: ``[sig-node] InitContainer [NodeConformance]``.

Upstream follows each pod with a watch (``watchtools.Until``, 5 minutes) and evaluates its
conditions on every status the pod goes through; the port samples the agent's status every
0.2 s and evaluates the same conditions, in the same order, on every status that changed.

Upstream also records the watch events for ``checkInvariants(events, containerInitInvariant)``,
but its event slice is never filled (``recordEvents`` appends to a copy), so the check never
runs -- and its ``initialized()`` would reject any terminated init container if it did. The port
keeps upstream's effective behaviour and does not check it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from conformance.standalone.framework import (
    BUSYBOX,
    PAUSE,
    POD_START,
    Framework,
    Status,
    brief,
    case,
    condition,
    phase,
)

FILE = "test/e2e/common/node/init_container.go"
PREFIX = "[sig-node] InitContainer [NodeConformance]"
FRAMEWORK = "init-container"
CPU_100M = {"limits": {"cpu": "100m"}}


def init_pod(init: list[tuple[str, str]], run1: dict[str, Any], restart_policy: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "initContainers": [{"name": n, "image": BUSYBOX, "command": [cmd]} for n, cmd in init],
        "containers": [{"name": "run1", **run1}],
    }
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return {"metadata": {"name": f"pod-init-{uuid.uuid4()}",
                         "labels": {"name": "foo", "time": str(time.time_ns() % 1_000_000_000)}},
            "spec": spec}


def pod_completed(status: Status) -> bool:
    """conditions.PodCompleted."""
    return phase(status) in ("Succeeded", "Failed")


def pod_running(status: Status) -> bool:
    """conditions.PodRunning: a pod that completed is an error."""
    if phase(status) in ("Succeeded", "Failed"):
        raise AssertionError(f"pod ran to completion: {brief(status)}")
    return phase(status) == "Running"


def debug(cs: Any) -> str:
    return brief(cs)


def app_containers_initializing(status: Status) -> None:
    for cs in status.get("containerStatuses", []):
        waiting = cs.get("state", {}).get("waiting")
        if waiting is None:
            raise AssertionError(f"container {cs.get('name')!r} should not be out of waiting: {debug(cs)}")
        if waiting.get("reason") != "PodInitializing":
            raise AssertionError(f"container {cs.get('name')!r} should have reason PodInitializing: {debug(cs)}")


def expect_initialized(status: Status, want: str, reason: str = "", message: str = "") -> None:
    init = condition(status, "Initialized")
    if init is None:
        raise AssertionError(f"no Initialized condition: {brief(status)}")
    if init.get("status") != want:
        raise AssertionError(f"Initialized condition should be {want}: {brief(init)}")
    if reason and init.get("reason") != reason:
        raise AssertionError(f"Initialized reason should be {reason!r}: {brief(init)}")
    if message and init.get("message") != message:
        raise AssertionError(f"Initialized message should be {message!r}: {brief(init)}")


def expect_inits_done(status: Status) -> None:
    statuses = status.get("initContainerStatuses", [])
    if len(statuses) != 2:
        raise AssertionError(f"expected 2 init container statuses: {brief(status)}")
    for cs in statuses:
        if not cs.get("ready"):
            raise AssertionError(f"init container {cs.get('name')} should be in Ready status: {debug(cs)}")
        terminated = cs.get("state", {}).get("terminated")
        if terminated is None or terminated.get("exitCode") != 0:
            raise AssertionError(f"init container {cs.get('name')} should have terminated with exit code 0: {debug(cs)}")


@case(f"{PREFIX} should invoke init containers on a RestartNever pod [Conformance]",
      key="I1", number="12", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def init_restart_never(f: Framework) -> None:
    """Mirrors init_container.go "should invoke init containers on a RestartNever pod": init1,
    init2 and run1 all ``/bin/true``; watch until the pod completed, then phase Succeeded,
    Initialized True, two init statuses each ready and terminated with exit code 0. Port: the
    watch is sampled (see the module docstring)."""
    name = f.create(init_pod([("init1", "/bin/true"), ("init2", "/bin/true")],
                             {"image": BUSYBOX, "command": ["/bin/true"]}, "Never"))
    end = await f.watch(name, POD_START, pod_completed)
    if phase(end) != "Succeeded":
        raise AssertionError(f"expected phase Succeeded: {brief(end)}")
    expect_initialized(end, "True")
    expect_inits_done(end)


@case(f"{PREFIX} should not start app containers and fail the pod if init containers fail on a RestartNever pod "
      "[Conformance]",
      key="I4", number="13", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def init_fails_restart_never(f: Framework) -> None:
    """Mirrors init_container.go "should not start app containers and fail the pod if init
    containers fail on a RestartNever pod": init1 ``/bin/true``, init2 ``/bin/false``, run1
    ``/bin/true`` (cpu limit 100m). On every status until init2 failed: run1 waiting with reason
    PodInitializing, init1 (until terminated) waiting with PodInitializing, never a non-zero
    init1 exit, init2 not exiting 0; then the pod completes with phase Failed, Initialized False
    (ContainersNotInitialized, ``containers with incomplete status: [init2]``), two init
    statuses and run1 still waiting. Port: the watch is sampled (see the module docstring)."""
    name = f.create(init_pod([("init1", "/bin/true"), ("init2", "/bin/false")],
                             {"image": BUSYBOX, "command": ["/bin/true"], "resources": CPU_100M}, "Never"))

    def second_init_failed(status: Status) -> bool:
        app_containers_initializing(status)
        inits = status.get("initContainerStatuses", [])
        if len(inits) != 2:
            return False
        first = inits[0].get("state", {})
        if first.get("terminated") is None:
            waiting = first.get("waiting")
            if waiting is not None and waiting.get("reason") != "PodInitializing":
                raise AssertionError(f"second init container should have reason PodInitializing: {debug(inits[0])}")
            return False
        if first["terminated"].get("exitCode") != 0:
            raise AssertionError(f"first init container should have exitCode != 0: {debug(inits[0])}")
        second = inits[1].get("state", {}).get("terminated")
        if second is None:
            return False
        if second.get("exitCode") == 0:
            raise AssertionError(f"second init container should have failed: {debug(inits[1])}")
        return True

    end = await f.watch(name, POD_START, second_init_failed, pod_completed)
    if phase(end) != "Failed":
        raise AssertionError(f"expected phase Failed: {brief(end)}")
    expect_initialized(end, "False", "ContainersNotInitialized", "containers with incomplete status: [init2]")
    if len(end.get("initContainerStatuses", [])) != 2:
        raise AssertionError(f"expected 2 init container statuses: {brief(end)}")
    statuses = end.get("containerStatuses", [])
    if not statuses or "waiting" not in statuses[0].get("state", {}):
        raise AssertionError(f"run1 should still be waiting: {brief(end)}")


@case(f"{PREFIX} should invoke init containers on a RestartAlways pod [Conformance]",
      key="I2", number="14", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def init_restart_always(f: Framework) -> None:
    """Mirrors init_container.go "should invoke init containers on a RestartAlways pod": init1
    and init2 ``/bin/true``, run1 the pause image (cpu limit 100m), default restartPolicy;
    watch until Running, then Initialized True and two init statuses ready, terminated, exit
    code 0. Port: the watch is sampled; the pause image is the one devenv builds."""
    name = f.create(init_pod([("init1", "/bin/true"), ("init2", "/bin/true")],
                             {"image": PAUSE, "resources": CPU_100M}, None))
    end = await f.watch(name, POD_START, pod_running)
    if phase(end) != "Running":
        raise AssertionError(f"expected phase Running: {brief(end)}")
    expect_initialized(end, "True")
    expect_inits_done(end)


@case(f"{PREFIX} should not start app containers if init containers fail on a RestartAlways pod [Conformance]",
      key="I3", number="15", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def init_fails_restart_always(f: Framework) -> None:
    """Mirrors init_container.go "should not start app containers if init containers fail on a
    RestartAlways pod": init1 ``/bin/false``, init2 ``/bin/true``, run1 pause (cpu limit 100m).
    Until init1 shows a lastState: run1 and init2 waiting with reason PodInitializing and init1
    never terminated with exit code 0; then init1's restartCount must reach 3 (crash-loop
    back-off 10 s, 20 s, ...); finally phase Pending, Initialized False
    (ContainersNotInitialized, ``containers with incomplete status: [init1 init2]``), two init
    statuses. Port: the watch is sampled; the pause image is the one devenv builds."""
    name = f.create(init_pod([("init1", "/bin/false"), ("init2", "/bin/true")],
                             {"image": PAUSE, "resources": CPU_100M}, None))

    def first_init_restarted(status: Status) -> bool:
        app_containers_initializing(status)
        inits = status.get("initContainerStatuses", [])
        if len(inits) != 2:
            return False
        second = inits[1].get("state", {}).get("waiting")
        if second is None:
            raise AssertionError(f"second init container should not be out of waiting: {debug(inits[1])}")
        if second.get("reason") != "PodInitializing":
            raise AssertionError(f"second init container should have reason PodInitializing: {debug(inits[1])}")
        first = inits[0]
        terminated = first.get("state", {}).get("terminated")
        if terminated is not None and terminated.get("exitCode") == 0:
            raise AssertionError(f"first init container should have exitCode != 0: {debug(first)}")
        return first.get("lastState", {}).get("terminated") is not None

    def restarted_three_times(status: Status) -> bool:
        return int(status["initContainerStatuses"][0].get("restartCount", 0)) >= 3

    end = await f.watch(name, POD_START, first_init_restarted, restarted_three_times)
    if phase(end) != "Pending":
        raise AssertionError(f"expected phase Pending: {brief(end)}")
    expect_initialized(end, "False", "ContainersNotInitialized", "containers with incomplete status: [init1 init2]")
    if len(end.get("initContainerStatuses", [])) != 2:
        raise AssertionError(f"expected 2 init container statuses: {brief(end)}")
