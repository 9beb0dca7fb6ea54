"""test/e2e/common/node/container_probe.go: ``[sig-node] Probing container``.

The liveness cases run upstream's ``RunLivenessTest``: create the pod, wait until the probed
container is no longer waiting, then poll every 2 s until ``timeout`` (plus 10 s per restart
already seen) and count restarts -- never decreasing; with 0 expected any restart fails, with n
expected the wait ends at n. Upstream deletes the pod with grace 0 afterwards; the port's cleanup
stands in for that (see ``Framework.create``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import anyio

from conformance.standalone.framework import (
    BUSYBOX,
    Framework,
    Status,
    brief,
    case,
    container_status,
)

FILE = "test/e2e/common/node/container_probe.go"
PREFIX = "[sig-node] Probing container"
FRAMEWORK = "container-probe"
OBSERVATION = 4 * 60.0  # defaultObservationTimeout


def busybox_pod(liveness: dict[str, Any] | None, command: list[str], readiness: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """busyBoxPodSpec."""
    c: dict[str, Any] = {"name": "busybox", "image": BUSYBOX, "command": command}
    if liveness is not None:
        c["livenessProbe"] = liveness
    if readiness is not None:
        c["readinessProbe"] = readiness
    return {"metadata": {"name": f"busybox-{uuid.uuid4()}", "labels": {"test": "liveness"}},
            "spec": {"containers": [c]}}


def restart_count(status: Status, container: str) -> int:
    return int((container_status(status, container) or {}).get("restartCount", 0))


async def run_liveness_test(f: Framework, pod: dict[str, Any], expected_restarts: int, timeout: float) -> None:
    """RunLivenessTest (for the first regular container)."""
    container = pod["spec"]["containers"][0]["name"]
    name = f.create(pod, force_delete_at_cleanup=True)

    def not_waiting(status: Status) -> bool:
        state = (container_status(status, container) or {}).get("state", {})
        return "running" in state or "terminated" in state

    f.by("waiting for the container to be no longer waiting")
    status = await f.wait_for_pod(name, "container not waiting", timeout, not_waiting)
    initial = restart_count(status, container)
    deadline = time.monotonic() + timeout + initial * 10
    last = initial
    observed = 0
    begin = time.monotonic()
    while time.monotonic() < deadline:
        status = f.get(name)
        count = restart_count(status, container)
        if count != last:
            f.by(f"restart count of {name} is now {count} ({time.monotonic() - begin:.0f}s elapsed)")
            if count < last:
                raise AssertionError(f"Restart count should increment monotonically: restart count of pod {name} "
                                     f"changed from {last} to {count}")
        observed = count - initial
        if expected_restarts > 0 and observed >= expected_restarts:
            break
        last = count
        await anyio.sleep(2.0)
    if (expected_restarts == 0 and observed > 0) or (expected_restarts > 0 and observed < expected_restarts):
        raise AssertionError(f"pod {name} - expected number of restarts: {expected_restarts}, found restarts: "
                             f"{observed}. Pod status: {brief(f.status(name))}")


@case(f'{PREFIX} should be restarted with a exec "cat /tmp/health" liveness probe [NodeConformance] [Conformance]',
      key="P3", number="30", upstream=FILE, framework=FRAMEWORK, timeout=2 * OBSERVATION + 60)
async def restarted_exec_cat(f: Framework) -> None:
    """Mirrors 'should be restarted with a exec "cat /tmp/health" liveness probe': the container
    removes /tmp/health after 10 s; the exec probe ``cat /tmp/health`` (initialDelay 15, timeout
    5, failureThreshold 1) must fail and restart it once within 4 minutes. Port: as upstream."""
    await run_liveness_test(f, busybox_pod(
        {"exec": {"command": ["cat", "/tmp/health"]}, "initialDelaySeconds": 15, "timeoutSeconds": 5,
         "failureThreshold": 1},
        ["/bin/sh", "-c", "echo ok >/tmp/health; sleep 10; rm -rf /tmp/health; sleep 600"]), 1, OBSERVATION)


@case(f"{PREFIX} should be restarted with an exec liveness probe with timeout [NodeConformance]",
      key="P9", number="31", upstream=FILE, framework=FRAMEWORK, timeout=2 * OBSERVATION + 60)
async def restarted_exec_timeout(f: Framework) -> None:
    """Mirrors "should be restarted with an exec liveness probe with timeout": the probe
    ``sh -c "sleep 10"`` runs past its 1 s timeoutSeconds, which must count as a failure
    (failureThreshold 1, initialDelay 15): one restart within 4 minutes. Port: as upstream."""
    await run_liveness_test(f, busybox_pod(
        {"exec": {"command": ["/bin/sh", "-c", "sleep 10"]}, "initialDelaySeconds": 15, "timeoutSeconds": 1,
         "failureThreshold": 1},
        ["/bin/sh", "-c", "sleep 600"]), 1, OBSERVATION)


@case(f"{PREFIX} should override timeoutGracePeriodSeconds when LivenessProbe field is set [NodeConformance]",
      key="P11", number="32", upstream=FILE, framework=FRAMEWORK, timeout=2 * (40 + OBSERVATION) + 60)
async def liveness_probe_grace(f: Framework) -> None:
    """Mirrors "should override timeoutGracePeriodSeconds when LivenessProbe field is set": an
    HTTP liveness probe on :8080 where nothing listens (initialDelay 10, failureThreshold 1,
    probe terminationGracePeriodSeconds 5) in a pod whose grace is 500 s; ``sleep 1000`` under sh
    ignores SIGTERM, so only a kill after the probe's 5 s lets the restart happen within
    40 s + 4 minutes. Port: as upstream."""
    pod = busybox_pod(
        {"httpGet": {"path": "/healthz", "port": 8080}, "initialDelaySeconds": 10, "failureThreshold": 1,
         "terminationGracePeriodSeconds": 5},
        ["/bin/sh", "-c", "sleep 1000"])
    pod["spec"]["terminationGracePeriodSeconds"] = 500
    await run_liveness_test(f, pod, 1, 40 + OBSERVATION)


@case(f'{PREFIX} should *not* be restarted with a exec "cat /tmp/health" liveness probe [NodeConformance] '
      "[Conformance]",
      key="P4", number="33", upstream=FILE, framework=FRAMEWORK, timeout=2 * OBSERVATION + 60)
async def not_restarted_exec_cat(f: Framework) -> None:
    """Mirrors 'should *not* be restarted with a exec "cat /tmp/health" liveness probe':
    /tmp/health stays, the same probe keeps succeeding, and no restart may happen in 4 minutes
    (the case always takes that long). Port: as upstream."""
    await run_liveness_test(f, busybox_pod(
        {"exec": {"command": ["cat", "/tmp/health"]}, "initialDelaySeconds": 15, "timeoutSeconds": 5,
         "failureThreshold": 1},
        ["/bin/sh", "-c", "echo ok >/tmp/health; sleep 600"]), 0, OBSERVATION)
