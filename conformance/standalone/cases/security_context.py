"""test/e2e/common/node/security_context.go: ``[sig-node] Security Context``.

Each pod has one busybox container named like the pod, restartPolicy Never; upstream waits with
``WaitForSuccess`` / ``WaitForFailure`` (5 minutes; the other terminal phase is an error).
"""

from __future__ import annotations

import uuid
from typing import Any

from conformance.standalone.framework import (
    BUSYBOX,
    POD_START,
    Framework,
    brief,
    case,
    phase,
)

FILE = "test/e2e/common/node/security_context.go"
PREFIX = "[sig-node] Security Context"
FRAMEWORK = "security-context-test"


def user_pod(pod_name: str, command: str, security_context: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": pod_name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": pod_name, "image": BUSYBOX, "command": ["sh", "-c", command],
                        "securityContext": security_context}],
    }}


async def wait_for_failure(f: Framework, name: str) -> None:
    """waitForFailure: phase Failed within 5 minutes; Succeeded is an error."""
    def failed(status: dict[str, Any]) -> bool:
        if phase(status) == "Succeeded":
            raise AssertionError(f"pod {name} succeeded, expected it to fail: {brief(status)}")
        return phase(status) == "Failed"

    await f.wait_for_pod(name, "Failed", POD_START, failed)


@case(f"{PREFIX} When creating a container with runAsUser should run the container with uid 65534 "
      "[LinuxOnly] [NodeConformance] [Conformance]",
      key="SC1", number="25", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def run_as_user_65534(f: Framework) -> None:
    """Mirrors "should run the container with uid 65534": runAsUser 65534 and ``test $(id -u)
    -eq 65534`` must succeed. Port: as upstream."""
    pod_name = f"busybox-user-65534-{uuid.uuid4()}"
    name = f.create(user_pod(pod_name, "test $(id -u) -eq 65534", {"runAsUser": 65534}))
    await f.wait_success(name)


@case(f"{PREFIX} When creating a pod with readOnlyRootFilesystem should run the container with readonly rootfs "
      "when readOnlyRootFilesystem=true [LinuxOnly] [NodeConformance]",
      key="SC3", number="26", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def read_only_rootfs(f: Framework) -> None:
    """Mirrors "should run the container with readonly rootfs when readOnlyRootFilesystem=true":
    ``touch checkfile`` on a read-only root must fail, so the pod Fails. Port: as upstream."""
    pod_name = f"busybox-readonly-true-{uuid.uuid4()}"
    name = f.create(user_pod(pod_name, "touch checkfile", {"readOnlyRootFilesystem": True}))
    await wait_for_failure(f, name)


@case(f"{PREFIX} When creating a pod with readOnlyRootFilesystem should run the container with writable rootfs "
      "when readOnlyRootFilesystem=false [NodeConformance] [Conformance]",
      key="SC4", number="27", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def writable_rootfs(f: Framework) -> None:
    """Mirrors "should run the container with writable rootfs when readOnlyRootFilesystem=false":
    ``touch checkfile`` must succeed. Port: as upstream."""
    pod_name = f"busybox-readonly-false-{uuid.uuid4()}"
    name = f.create(user_pod(pod_name, "touch checkfile", {"readOnlyRootFilesystem": False}))
    await f.wait_success(name)


@case(f"{PREFIX} When creating a pod with privileged should run the container as unprivileged when false "
      "[LinuxOnly] [NodeConformance] [Conformance]",
      key="SC5", number="28", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def unprivileged(f: Framework) -> None:
    """Mirrors "should run the container as unprivileged when false": privileged false,
    ``ip link add dummy0 type dummy || true`` succeeds as a shell but its output must say
    ``Operation not permitted`` (no CAP_NET_ADMIN in the default capability set). Port: as
    upstream."""
    pod_name = f"busybox-privileged-false-{uuid.uuid4()}"
    name = f.create(user_pod(pod_name, "ip link add dummy0 type dummy || true", {"privileged": False}))
    await f.wait_success(name)
    logs = f.logs(name, pod_name)
    if "Operation not permitted" not in logs:
        raise AssertionError(f"unprivileged container shouldn't be able to create dummy device; logs: {logs!r}")
