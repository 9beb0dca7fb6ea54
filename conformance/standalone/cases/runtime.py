"""test/e2e/common/node/runtime.go: ``[sig-node] Container Runtime blackbox test``.

Upstream's ``ConformanceContainer`` builds a one-container pod named ``<container>-<uuid>``;
``GetStatus`` requires exactly one container status with the container's name; its waits poll
every second for up to 5 minutes (``ContainerStatusRetryTimeout``).
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio

from conformance.standalone.framework import (
    BUSYBOX,
    Framework,
    Status,
    brief,
    case,
    is_ready,
    phase,
    state_of,
)

FILE = "test/e2e/common/node/runtime.go"
PREFIX = "[sig-node] Container Runtime blackbox test"
RETRY = 5 * 60.0  # ContainerStatusRetryTimeout
POLL = 1.0  # ContainerStatusPollInterval


def conformance_pod(container: dict[str, Any], restart_policy: str,
                    volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """ConformanceContainer.Create."""
    return {
        "metadata": {"name": f"{container['name']}-{uuid.uuid4()}"},
        "spec": {"containers": [container], "restartPolicy": restart_policy, "volumes": volumes or []},
    }


def only_status(status: Status, container: str) -> dict[str, Any]:
    """ConformanceContainer.GetStatus."""
    statuses = status.get("containerStatuses", [])
    if len(statuses) != 1 or statuses[0].get("name") != container:
        raise AssertionError(f"expected exactly one container status for {container}: {brief(status)}")
    return dict(statuses[0])


async def eventually(f: Framework, name: str, what: str, value: Any, get: Any, timeout: float = RETRY) -> Status:
    """gomega.Eventually(get, timeout, 1s).Should(Equal(value))."""
    last: Any = None
    with anyio.move_on_after(timeout):
        while True:
            status = f.status(name)
            if status is not None:
                try:
                    last = get(status)
                except AssertionError as exc:
                    last = f"<{exc}>"
                if last == value:
                    return status
            await anyio.sleep(POLL)
    raise AssertionError(f"{what}: expected {value!r} within {timeout:g}s, last {last!r}; "
                         f"status: {brief(f.status(name))}")


_RESTART_SCRIPT = """
f=/restart-count/restartCount
count=$(echo 'hello' >> $f ; wc -l $f | awk {'print $1'})
if [ $count -eq 1 ]; then
\texit 1
fi
if [ $count -eq 2 ]; then
\texit 0
fi
while true; do sleep 1; done
"""


@case(f"{PREFIX} when starting a container that exits should run with the expected status "
      "[NodeConformance] [Conformance]",
      key="RT1", number="1", upstream=FILE, framework="container-runtime", timeout=3 * 4 * RETRY + 60)
async def expected_status(f: Framework) -> None:
    """Mirrors runtime.go "should run with the expected status": three pods one after another
    (restartPolicy Always, OnFailure, Never) whose container fails on its first run, succeeds on
    its second and then runs forever, counting its runs in a Memory emptyDir. Expected
    restartCount / phase / Ready / state: Always 2 / Running / true / Running; OnFailure 1 /
    Succeeded / false / Terminated; Never 0 / Failed / false / Terminated; then each pod is
    deleted and must disappear within 5 minutes.

    Port: deleting is removing the manifest, so the pod's default 30 s grace applies where
    upstream deletes with grace 0 (the running container's shell ignores SIGTERM)."""
    cases = [
        ("terminate-cmd-rpa", "Always", "Running", "Running", 2, True),
        ("terminate-cmd-rpof", "OnFailure", "Succeeded", "Terminated", 1, False),
        ("terminate-cmd-rpn", "Never", "Failed", "Terminated", 0, False),
    ]
    volumes = [{"name": "restart-count", "emptyDir": {"medium": "Memory"}}]
    for container_name, policy, want_phase, want_state, want_restarts, want_ready in cases:
        container = {
            "name": container_name, "image": BUSYBOX, "command": ["sh", "-c", _RESTART_SCRIPT],
            "volumeMounts": [{"mountPath": "/restart-count", "name": "restart-count"}],
        }
        name = f.create(conformance_pod(container, policy, volumes))
        f.by(f"Container '{container_name}': should get the expected 'RestartCount'")
        await eventually(f, name, f"{container_name} restartCount", want_restarts,
                         lambda s, c=container_name: only_status(s, c).get("restartCount", 0))
        f.by(f"Container '{container_name}': should get the expected 'Phase'")
        await eventually(f, name, f"{container_name} phase", want_phase, phase)
        f.by(f"Container '{container_name}': should get the expected 'Ready' condition")
        status = f.get(name)
        if is_ready(status) != want_ready:
            raise AssertionError(f"{container_name}: expected Ready {want_ready}: {brief(status)}")
        f.by(f"Container '{container_name}': should get the expected 'State'")
        got = state_of(only_status(status, container_name))
        if got != want_state:
            raise AssertionError(f"{container_name}: expected state {want_state}, got {got}: {brief(status)}")
        f.by(f"Container '{container_name}': should be possible to delete")
        f.delete(name)
        await f.wait_not_found(name, RETRY)


async def match_termination_message(f: Framework, container: dict[str, Any], expected_phase: str,
                                    expected_message: str) -> None:
    """matchTerminationMessage: RestartPolicy Never; wait for the phase, the container is
    Terminated and its ``state.terminated.message`` equals the expected text exactly.

    The phase wait is upstream's Eventually(Equal(phase)) for 5 minutes; a terminal phase
    other than the expected one cannot change any more, so the port fails at once there (same
    verdict, minutes sooner)."""
    container = {**container, "name": "termination-message-container"}
    name = f.create(conformance_pod(container, "Never"))
    f.by(f"wait for the container to reach {expected_phase}")

    def reached(status: Status) -> bool:
        if phase(status) in ("Succeeded", "Failed") and phase(status) != expected_phase:
            raise AssertionError(f"expected phase {expected_phase}, pod ended {phase(status)}: {brief(status)}")
        return phase(status) == expected_phase

    status = await f.wait_for_pod(name, expected_phase, RETRY, reached, poll=POLL)
    cs = only_status(status, "termination-message-container")
    if state_of(cs) != "Terminated":
        raise AssertionError(f"the container should be terminated: {brief(cs)}")
    message = cs["state"]["terminated"].get("message", "")
    if message != expected_message:
        raise AssertionError(f"expected termination message {expected_message!r}, got {message!r}: {brief(cs)}")
    f.delete(name)


@case(f"{PREFIX} on terminated container should report termination message if TerminationMessagePath is set "
      "[NodeConformance]",
      key="RT2", number="4", upstream=FILE, framework="container-runtime", timeout=RETRY + 60)
async def termination_message_path(f: Framework) -> None:
    """Mirrors runtime.go "should report termination message if TerminationMessagePath is set":
    ``/bin/echo -n DONE > /dev/termination-log`` as root (runAsUser 0) must give phase
    Succeeded and the message ``DONE``. Port: as upstream."""
    await match_termination_message(f, {
        "image": BUSYBOX, "command": ["/bin/sh", "-c"], "args": ["/bin/echo -n DONE > /dev/termination-log"],
        "terminationMessagePath": "/dev/termination-log", "securityContext": {"runAsUser": 0},
    }, "Succeeded", "DONE")


@case(f"{PREFIX} on terminated container should report termination message if TerminationMessagePath is set "
      "as non-root user and at a non-default path [NodeConformance] [Conformance]",
      key="RT3", number="5", upstream=FILE, framework="container-runtime", timeout=RETRY + 60)
async def termination_message_non_root(f: Framework) -> None:
    """Mirrors runtime.go "... as non-root user and at a non-default path": uid 10000 writes
    ``DONE`` to /dev/termination-custom-log (so the agent's file there must be writable by any
    user); phase Succeeded, message ``DONE``. Port: as upstream."""
    await match_termination_message(f, {
        "image": BUSYBOX, "command": ["/bin/sh", "-c"], "args": ["/bin/echo -n DONE > /dev/termination-custom-log"],
        "terminationMessagePath": "/dev/termination-custom-log", "securityContext": {"runAsUser": 10000},
    }, "Succeeded", "DONE")


@case(f"{PREFIX} on terminated container should report termination message from log output if "
      "TerminationMessagePolicy FallbackToLogsOnError is set [NodeConformance] [Conformance]",
      key="RT4", number="6", upstream=FILE, framework="container-runtime", timeout=RETRY + 60)
async def termination_message_from_logs(f: Framework) -> None:
    """Mirrors runtime.go "... from log output if TerminationMessagePolicy
    FallbackToLogsOnError is set": ``/bin/echo -n DONE; /bin/false`` fails with an empty message
    file, so the message is the log tail ``DONE``; phase Failed. Port: as upstream."""
    await match_termination_message(f, {
        "image": BUSYBOX, "command": ["/bin/sh", "-c"], "args": ["/bin/echo -n DONE; /bin/false"],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "FallbackToLogsOnError",
    }, "Failed", "DONE")


@case(f"{PREFIX} on terminated container should report termination message as empty when pod succeeds and "
      "TerminationMessagePolicy FallbackToLogsOnError is set [NodeConformance] [Conformance]",
      key="RT5", number="7", upstream=FILE, framework="container-runtime", timeout=RETRY + 60)
async def termination_message_empty_on_success(f: Framework) -> None:
    """Mirrors runtime.go "... as empty when pod succeeds and TerminationMessagePolicy
    FallbackToLogsOnError is set": ``/bin/echo -n DONE; /bin/true`` succeeds, so the logs are not
    used and the message is empty; phase Succeeded. Port: as upstream."""
    await match_termination_message(f, {
        "image": BUSYBOX, "command": ["/bin/sh", "-c"], "args": ["/bin/echo -n DONE; /bin/true"],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "FallbackToLogsOnError",
    }, "Succeeded", "")


@case(f"{PREFIX} on terminated container should report termination message from file when pod succeeds and "
      "TerminationMessagePolicy FallbackToLogsOnError is set [NodeConformance] [Conformance]",
      key="RT6", number="8", upstream=FILE, framework="container-runtime", timeout=RETRY + 60)
async def termination_message_file_wins(f: Framework) -> None:
    """Mirrors runtime.go "... from file when pod succeeds and TerminationMessagePolicy
    FallbackToLogsOnError is set": the file says ``OK``, the log says ``DONE``; the file wins;
    phase Succeeded. Port: as upstream."""
    await match_termination_message(f, {
        "image": BUSYBOX, "command": ["/bin/sh", "-c"],
        "args": ["/bin/echo -n OK > /dev/termination-log; /bin/echo DONE; /bin/true"],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "FallbackToLogsOnError",
    }, "Succeeded", "OK")
