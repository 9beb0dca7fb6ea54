"""test/e2e_node/container_lifecycle_test.go: ``[sig-node] [NodeConformance] Containers Lifecycle``.

The pods run the lifecycle harness (:mod:`conformance.standalone.lifecycle_harness`: upstream's
ExecCommand, preparePod and parseOutput) and the cases assert on the order of its stamps.
"""

from __future__ import annotations

import time
from typing import Any

from conformance.standalone.framework import BUSYBOX, Framework, case
from conformance.standalone.lifecycle_harness import (
    POST_START,
    Timeline,
    exec_command,
    parse_output,
    prefixed,
    prepare_pod,
)

FILE = "test/e2e_node/container_lifecycle_test.go"
NEVER = "[sig-node] [NodeConformance] Containers Lifecycle Running a pod with init containers and regular " \
        "containers, restartPolicy=Never"
FRAMEWORK = "containers-lifecycle-test"


def container(name: str, **command: Any) -> dict[str, Any]:
    return {"name": name, "image": BUSYBOX, "command": exec_command(name, **command)}


def timeline(f: Framework, name: str) -> Timeline:
    """podClient.Get + parseOutput."""
    return parse_output(f.get(name), lambda c, previous: f.logs(name, c, previous=previous))


@case(f"{NEVER} A pod initializes successfully should launch init container serially before a regular container",
      key="CL1", number="16", upstream=FILE, framework=FRAMEWORK, timeout=60 + 60)
async def init_serially(f: Framework) -> None:
    """Mirrors "should launch init container serially before a regular container": init-1..3
    (each Delay 1), then regular-1 (StartDelay 5, Delay 1) with a startup probe ``test -f
    started``; the pod must finish within 1 minute and each init container must start and exit
    before the next one, the last before regular-1. Port: the harness (see its module)."""
    name = f.create(prepare_pod({"metadata": {"name": "initcontainer-test-pod"}, "spec": {
        "restartPolicy": "Never",
        "initContainers": [container(n, delay=1) for n in ("init-1", "init-2", "init-3")],
        "containers": [{**container("regular-1", start_delay=5, delay=1),
                        "startupProbe": {"exec": {"command": ["test", "-f", "started"]}}}],
    }}))
    f.by("Waiting for the pod to finish")
    await f.wait_no_longer_running(name, 60.0)
    results = timeline(f, name)
    for first, second in (("init-1", "init-2"), ("init-2", "init-3"), ("init-3", "regular-1")):
        results.starts_before(first, second)
        results.exits_before(first, second)


@case(f"{NEVER} an init container fails should not launch regular containers if an init container fails",
      key="CL2", number="17", upstream=FILE, framework=FRAMEWORK, timeout=60 + 60)
async def init_fails(f: Framework) -> None:
    """Mirrors "should not launch regular containers if an init container fails": init-1
    (Delay 1, exit 1), regular-1; within 1 minute the pod must be Failed with an empty reason,
    init-1 started and exited, regular-1 never started. Port: the harness."""
    name = f.create(prepare_pod({"metadata": {"name": "initcontainer-test-pod-failure"}, "spec": {
        "restartPolicy": "Never",
        "initContainers": [container("init-1", delay=1, exit_code=1)],
        "containers": [container("regular-1", delay=1)],
    }}))
    f.by("Waiting for the pod to fail")
    await f.wait_failed_reason(name, "", 60.0)
    results = timeline(f, name)
    results.starts("init-1")
    results.exits("init-1")
    results.doesnt_start("regular-1")


@case(f"{NEVER} Running a pod with multiple containers and a PostStart hook should not launch second container "
      "before PostStart of the first container completed",
      key="CL5", number="18", upstream=FILE, framework=FRAMEWORK, timeout=60 + 60)
async def post_start_blocks(f: Framework) -> None:
    """Mirrors "should not launch second container before PostStart of the first container
    completed": regular-1 (Delay 10) with a postStart exec hook running the harness as
    PostStart-regular-1 (Delay 1), then regular-2 (Delay 1); within 1 minute the pod must finish
    and the hook must have started and exited before regular-2 did. Port: the harness."""
    hook = prefixed(POST_START, "regular-1")
    name = f.create(prepare_pod({"metadata": {"name": "post-start-blocks-second-container"}, "spec": {
        "restartPolicy": "Never",
        "containers": [
            {**container("regular-1", delay=10),
             "lifecycle": {"postStart": {"exec": {"command": exec_command(hook, delay=1, container_name="regular-1")}}}},
            container("regular-2", delay=1),
        ],
    }}))
    f.by("Waiting for the pod to finish")
    await f.wait_no_longer_running(name, 60.0)
    results = timeline(f, name)
    results.starts_before(hook, "regular-2")
    results.exits_before(hook, "regular-2")


@case(f"{NEVER} A regular container restarts with init containers shouldn't restart init containers upon regular "
      "container restart",
      key="CL7", number="19", upstream=FILE, framework=FRAMEWORK, timeout=2 * 60 + 60)
async def init_not_restarted(f: Framework) -> None:
    """Mirrors "shouldn't restart init containers upon regular container restart":
    restartPolicy Always, init-1..3 (Delay 1), regular-1 (Delay 10, exit -1); within 2 minutes
    regular-1's restartCount must reach 3; the init containers ran in order, once each, and
    regular-1 ran more than once. Port: the harness."""
    name = f.create(prepare_pod({"metadata": {"name": "initcontainer-test-pod"}, "spec": {
        "restartPolicy": "Always",
        "initContainers": [container(n, delay=1) for n in ("init-1", "init-2", "init-3")],
        "containers": [container("regular-1", delay=10, exit_code=-1)],
    }}))
    f.by("Waiting for the pod to restart a few times")
    await f.wait_restart_count(name, 0, 3, 2 * 60.0)
    results = timeline(f, name)
    for first, second in (("init-1", "init-2"), ("init-2", "init-3"), ("init-3", "regular-1")):
        results.starts_before(first, second)
        results.exits_before(first, second)
    for init in ("init-1", "init-2", "init-3"):
        results.has_not_restarted(init)
    results.has_restarted("regular-1")


@case(f"{NEVER} a pod cannot terminate gracefully should respect termination grace period seconds [NodeConformance]",
      key="CL8", number="20", upstream=FILE, framework=FRAMEWORK, timeout=5 * 60 + 60 + 60)
async def grace_period(f: Framework) -> None:
    """Mirrors "should respect termination grace period seconds": ``sleep 10000`` as PID 1
    (which ignores SIGTERM), terminationGracePeriodSeconds 30; once Running the pod is deleted
    with its default grace and must be gone within 30 + 30 s. Port: deleting is removing the
    manifest; gone is the agent having forgotten the pod (its teardown finished)."""
    name = f.create({"metadata": {"name": "pod-termination-grace-period"}, "spec": {
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "busybox", "image": BUSYBOX, "command": ["sleep", "10000"]}],
    }})
    f.by("ensuring the pod is running")
    await f.wait_running(name)
    f.by("deleting the pod gracefully")
    begin = time.monotonic()
    f.delete(name)
    f.by("ensuring the pod is terminated within the grace period seconds + buffer seconds")
    await f.wait_not_found(name, 30 + 30)
    f.by(f"pod gone {time.monotonic() - begin:.1f}s after deletion")
