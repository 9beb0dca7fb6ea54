"""test/e2e/common/node/kubelet.go: ``[sig-node] Kubelet``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import anyio

from conformance.standalone.framework import BUSYBOX, POD_START, Framework, brief, case

FILE = "test/e2e/common/node/kubelet.go"
PREFIX = "[sig-node] Kubelet"
FRAMEWORK = "kubelet-test"


async def eventually_logs(f: Framework, name: str, container: str, expected: str, timeout: float,
                          since: Callable[[], float | None] = lambda: None) -> None:
    """gomega.Eventually(GetLogs, timeout, 4s).Should(Equal(expected)); a log that cannot be read
    yet counts as the empty string, as upstream's poll function returns it."""
    got = ""
    with anyio.move_on_after(timeout):
        while True:
            try:
                got = f.logs(name, container, since=since())
            except AssertionError:
                got = ""
            if got == expected:
                return
            await anyio.sleep(4.0)
    raise AssertionError(f"expected the logs of {container} to be exactly {expected!r} within {timeout:g}s, "
                         f"got {got!r}")


@case(f"{PREFIX} when scheduling a busybox command that always fails in a pod should have an terminated reason "
      "[NodeConformance] [Conformance]",
      key="K2a", number="2", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def terminated_reason(f: Framework) -> None:
    """Mirrors kubelet.go "should have an terminated reason": ``/bin/false`` under restartPolicy
    Never; within 5 minutes (polled every 4 s) the one container status must be terminated with
    a non-zero exit code and a non-empty reason. Port: as upstream."""
    pod_name = f"bin-false{uuid.uuid4()}"
    name = f.create({"metadata": {"name": pod_name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"image": BUSYBOX, "name": pod_name, "command": ["/bin/false"]}],
    }})
    last = ""
    with anyio.move_on_after(POD_START):
        while True:
            status = f.status(name)
            statuses = (status or {}).get("containerStatuses", [])
            terminated = statuses[0].get("state", {}).get("terminated") if len(statuses) == 1 else None
            if status is None:
                last = "pod not found"
            elif len(statuses) != 1:
                last = f"expected only one container in the pod {pod_name}"
            elif terminated is None:
                last = f"expected state to be terminated. Got pod status: {brief(status)}"
            elif terminated.get("exitCode", 0) == 0 or not terminated.get("reason"):
                last = (f"expected non-zero exitCode and non-empty terminated state reason. Got exitCode: "
                        f"{terminated.get('exitCode')} and terminated state reason: {terminated.get('reason', '')!r}")
            else:
                return
            await anyio.sleep(4.0)
    raise AssertionError(last)


@case(f"{PREFIX} when scheduling a busybox command in a pod should print the output to logs "
      "[NodeConformance] [Conformance]",
      key="K1", number="3", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60 + 60)
async def print_output_to_logs(f: Framework) -> None:
    """Mirrors kubelet.go "should print the output to logs": ``echo 'Hello World' ; sleep 240``
    under restartPolicy Never; CreateSync (Running and Ready), then within a minute the logs read
    with sinceTime one hour ago must be exactly ``Hello World\\n``. Port: logs are the CRI log
    file with its framing removed; sinceTime filters its records as the kubelet does."""
    pod_name = f"busybox-scheduling-{uuid.uuid4()}"
    name = await f.create_sync({"metadata": {"name": pod_name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"image": BUSYBOX, "name": pod_name, "command": ["sh", "-c", "echo 'Hello World' ; sleep 240"]}],
    }})
    await eventually_logs(f, name, pod_name, "Hello World\n", 60.0, since=lambda: time.time() - 3600)


@case(f"{PREFIX} when scheduling a read only busybox container should not write to root filesystem "
      "[LinuxOnly] [NodeConformance] [Conformance]",
      key="K4", number="29", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60 + 60)
async def read_only_root(f: Framework) -> None:
    """Mirrors kubelet.go "should not write to root filesystem": readOnlyRootFilesystem true,
    ``echo test > /file; sleep 240``; CreateSync, then within a minute the logs must be exactly
    busybox's ``/bin/sh: can't create /file: Read-only file system\\n``. Port: as upstream."""
    pod_name = f"busybox-readonly-fs{uuid.uuid4()}"
    name = await f.create_sync({"metadata": {"name": pod_name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"image": BUSYBOX, "name": pod_name, "command": ["/bin/sh", "-c", "echo test > /file; sleep 240"],
                        "securityContext": {"readOnlyRootFilesystem": True}}],
    }})
    await eventually_logs(f, name, pod_name, "/bin/sh: can't create /file: Read-only file system\n", 60.0)


@case(f"{PREFIX} when scheduling an agnhost Pod with hostAliases should write entries to /etc/hosts "
      "[NodeConformance] [Conformance]",
      key="K3", number="34", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def host_aliases(f: Framework) -> None:
    """Mirrors kubelet.go "should write entries to /etc/hosts": hostAliases 123.45.67.89 ->
    foo, bar; after the pod stops running its log (the container's /etc/hosts) must contain
    ``123.45.67.89\\tfoo\\tbar``. Port: agnhost ``etc-hosts`` is busybox ``cat /etc/hosts``
    (conformance.md section 18), in the container NewAgnhostPod names ``agnhost-container``."""
    pod_name = f"agnhost-host-aliases{uuid.uuid4()}"
    name = f.create({"metadata": {"name": pod_name}, "spec": {
        "restartPolicy": "Never",
        "hostAliases": [{"ip": "123.45.67.89", "hostnames": ["foo", "bar"]}],
        "containers": [{"name": "agnhost-container", "image": BUSYBOX, "command": ["cat", "/etc/hosts"]}],
    }})
    f.by("Waiting for pod completion")
    await f.wait_no_longer_running(name)
    hosts = f.logs(name, "agnhost-container")
    if "123.45.67.89\tfoo\tbar" not in hosts:
        raise AssertionError(f"expected hosts file to contain entries from HostAliases. Got:\n{hosts}")
