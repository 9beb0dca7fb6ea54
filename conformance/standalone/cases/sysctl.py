"""test/e2e/common/node/sysctl.go: ``[sig-node] Sysctls [LinuxOnly] [NodeConformance]``."""

from __future__ import annotations

import uuid
from pathlib import Path

from conformance.standalone.framework import (
    BUSYBOX,
    POD_START,
    Framework,
    Skipped,
    Status,
    brief,
    case,
    phase,
)

FILE = "test/e2e/common/node/sysctl.go"
PREFIX = "[sig-node] Sysctls [LinuxOnly] [NodeConformance]"
# Waiting reasons the kubelet reports with a "Failed" event (upstream's WaitForErrorEventOrSuccess).
FAILED_REASONS = {"CreateContainerError", "CreateContainerConfigError", "RunContainerError", "ErrImageNeverPull",
                  "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "PreStartHookError", "PostStartHookError"}


def in_user_namespace() -> bool:
    """[Environment:NotInUserNS]: true when this process runs in a user namespace."""
    try:
        fields = Path("/proc/self/uid_map").read_text().split()
    except OSError:
        return False
    return fields[:3] != ["0", "0", "4294967295"]


def started_or_failed(status: Status) -> bool:
    """Stands in for WaitForErrorEventOrSuccess: the container started (``Started`` event), or
    an error the kubelet would report with a ``Failed``, ``Killing`` or ``SysctlForbidden``
    event (then the case fails)."""
    if status.get("reason") == "SysctlForbidden" or (phase(status) == "Failed" and status.get("reason")):
        raise AssertionError(f"pod rejected ({status.get('reason')}): {brief(status)}")
    for cs in status.get("containerStatuses", []):
        state = cs.get("state", {})
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in FAILED_REASONS:
            raise AssertionError(f"container {cs.get('name')} failed to start ({waiting.get('reason')}): {brief(cs)}")
        terminated = state.get("terminated")
        if terminated is not None and terminated.get("reason") in ("ContainerCannotRun", "StartError"):
            raise AssertionError(f"container {cs.get('name')} failed to start: {brief(cs)}")
        if "running" in state or (terminated is not None and terminated.get("startedAt")):
            return True
    return False


@case(f"{PREFIX} should support sysctls [Environment:NotInUserNS] [Conformance]",
      key="SY1", number="40", upstream=FILE, framework="sysctl", timeout=3 * POD_START + 60)
async def support_sysctls(f: Framework) -> None:
    """Mirrors "should support sysctls": pod sysctl ``kernel.shm_rmid_forced=1`` (a safe one)
    and ``/bin/sysctl kernel.shm_rmid_forced``; no error before the container starts, the pod
    ends Succeeded and the log contains ``kernel.shm_rmid_forced = 1``. Port: without Events,
    the wait for a ``Started`` event (or an error event) is a wait for the container status to
    show it started (or an error reason)."""
    if in_user_namespace():
        raise Skipped("[Environment:NotInUserNS]: this process runs in a user namespace")
    name = f.create({"metadata": {"name": f"sysctl-{uuid.uuid4()}", "annotations": {}}, "spec": {
        "containers": [{"name": "test-container", "image": BUSYBOX, "command": ["/bin/sysctl", "kernel.shm_rmid_forced"]}],
        "restartPolicy": "Never",
        "securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]},
    }})
    f.by("Watching for error events or started pod")
    await f.wait_for_pod(name, "started (or failed)", POD_START, started_or_failed)
    f.by("Waiting for pod completion")
    status = await f.wait_no_longer_running(name)
    if phase(status) != "Succeeded":
        raise AssertionError(f"expected phase Succeeded: {brief(status)}")
    logs = f.logs(name, "test-container")
    if "kernel.shm_rmid_forced = 1" not in logs:
        raise AssertionError(f"the sysctl was not updated; logs: {logs!r}")
