"""test/e2e_node/oomkiller_linux_test.go: ``[sig-node] OOMKiller [LinuxOnly] [NodeConformance]``."""

from __future__ import annotations

from conformance.standalone.framework import (
    BUSYBOX,
    POD_DELETE,
    POD_START,
    Framework,
    case,
    container_status,
)

FILE = "test/e2e_node/oomkiller_linux_test.go"
PREFIX = "[sig-node] OOMKiller [LinuxOnly] [NodeConformance]"


@case(f"{PREFIX} single process container The containers terminated by OOM killer should have the reason set to "
      "OOMKilled",
      key="OOM1", number="38", upstream=FILE, framework="oomkiller-test", timeout=POD_START + POD_DELETE + 60)
async def single_process_oom(f: Framework) -> None:
    """Mirrors "single process container ... should have the reason set to OOMKilled":
    ``sleep 5 && dd if=/dev/zero of=/dev/null bs=20M`` with memory request = limit 15Mi under
    restartPolicy Never; the pod must end Failed with an empty pod reason (5 minutes) and the
    container terminated with exit code 137 (the reason, if set, OOMKilled -- upstream checks it
    only when it is already OOMKilled); then DeleteSync. Port: as upstream."""
    target = "oomkill-single-target-container"
    name = f.create({"metadata": {"name": "oomkill-target-pod"}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": target, "image": BUSYBOX,
                        "command": ["sh", "-c", "sleep 5 && dd if=/dev/zero of=/dev/null bs=20M"],
                        "resources": {"requests": {"memory": "15Mi"}, "limits": {"memory": "15Mi"}}}],
    }})
    f.by("Waiting for the pod to be failed")
    status = await f.wait_failed_reason(name, "", POD_START, succeeded_is_error=False)
    cs = container_status(status, target)
    terminated = (cs or {}).get("state", {}).get("terminated")
    if terminated is None:
        raise AssertionError(f"OOM target pod {name}, container {target} is not in the terminated state: {cs}")
    if terminated.get("exitCode") != 137:
        raise AssertionError(f"pod: {name!r}, container: {target!r} has unexpected exitCode: "
                             f"{terminated.get('exitCode')!r} (reason {terminated.get('reason')!r})")
    f.by("deleting the pod (DeleteSync)")
    f.delete(name)
    await f.wait_not_found(name, POD_DELETE)
