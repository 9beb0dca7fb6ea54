"""Container lifecycle parity with the kubelet, end to end against the real containerd with
busybox pods: restart policies and CrashLoopBackOff, init containers, sidecars, lifecycle hooks,
graceful termination, termination messages, and the status they produce.

Each test mirrors upstream behaviour (conformance.md sections 1, 3, 5, 6; kubelet.md 1.3-1.5,
4.1, 5). Back-off timing runs on a manual clock; grace periods are real time (the runtime's
stop timeout is) and are checked with generous bounds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from cri import NotFound
from cri import types as t
from nodeagent import labels as L
from nodeagent.clock import ManualClock
from tests.agent_helpers import (
    BUSYBOX_IMAGE,
    AgentEnv,
    make_config,
    running_agent,
    runtime_objects,
    wait_for,
)

pytestmark = pytest.mark.anyio

BAD_IMAGE = "invalid.registry.k8s.io/invalid/alpine:3.1"  # upstream's image that cannot be pulled
# A main process that exits at once on SIGTERM (busybox sh runs a trap between commands).
UNTIL_TERM = "trap 'exit 0' TERM; while true; do sleep 0.1; done"
# A sidecar that takes a second to exit after SIGTERM, so stop order shows in finishedAt.
SLOW_TERM = "trap 'sleep 1; exit 0' TERM; while true; do sleep 0.1; done"


def ctr(name: str, command: str | list[str], **extra: Any) -> dict[str, Any]:
    cmd = ["sh", "-c", command] if isinstance(command, str) else command
    return {"name": name, "image": BUSYBOX_IMAGE, "command": cmd, **extra}


def pod(name: str, containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
        **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"terminationGracePeriodSeconds": 2, "containers": containers, **spec}
    if init:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body}


def sidecar(name: str, command: str, **extra: Any) -> dict[str, Any]:
    return ctr(name, command, restartPolicy="Always", **extra)


def cs_of(status: dict[str, Any], name: str) -> dict[str, Any]:
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key, []):
            if cs["name"] == name:
                found: dict[str, Any] = cs
                return found
    return {}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == kind), {})
    return found


async def status_where(env: AgentEnv, name: str, predicate: Callable[[dict[str, Any]], Any], what: str,
                       timeout: float = 45.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        status = env.status_of(name)
        return status if status and predicate(status) else None

    result: dict[str, Any] = await wait_for(check, timeout, f"{name}: {what}")
    return result


async def phase(env: AgentEnv, name: str, wanted: str, timeout: float = 45.0) -> dict[str, Any]:
    return await status_where(env, name, lambda s: s.get("phase") == wanted, f"phase {wanted}", timeout)


async def instances(env: AgentEnv, name: str) -> list[t.ContainerStatus]:
    """Every CRI container of pod ``name``, oldest first, with its full status."""
    _, containers = await runtime_objects(env.client, env.node)
    mine = [c for c in containers if c.labels.get(L.POD_NAME) == f"{name}-{env.node}"]
    statuses = []
    for c in mine:
        try:
            statuses.append(await env.client.container_status(c.id))
        except NotFound:
            continue  # the agent removed an old instance between the list and the status call
    return sorted(statuses, key=lambda s: s.created_at)


def named(statuses: list[t.ContainerStatus], container: str) -> list[t.ContainerStatus]:
    return [s for s in statuses if s.labels.get(L.CONTAINER_NAME) == container]


def facts(env: AgentEnv, name: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in env.agent.trace.chain(f"default/{name}-{env.node}") if e["kind"] == kind]


@asynccontextmanager
async def clocked_agent(containerd: Any, base: Path, clock: ManualClock) -> AsyncIterator[AgentEnv]:
    """running_agent, with the agent on a manual clock (back-off time moves only on advance)."""
    async with running_agent(containerd, base, clock=clock) as env:
        yield env


# --- restarts ---------------------------------------------------------------------------


async def test_crashloop_backoff_doubles_and_resets_after_ten_minutes_of_running(
        containerd: Any, tmp_path: Path) -> None:
    """kubelet.md 4.1: the first failure restarts at once, then 10 s, 20 s, ...; the entry is
    forgotten when the container ran 2 x 300 s before failing again."""
    clock = ManualClock()
    async with clocked_agent(containerd, tmp_path, clock) as env:
        env.write("crash.yaml", pod("crash", [ctr("main", "while [ ! -f /tmp/die ]; do sleep 0.1; done; exit 3")]))

        async def running(restarts: int) -> t.ContainerStatus:
            async def find() -> t.ContainerStatus | None:
                for s in await instances(env, "crash"):
                    if (s.state == t.ContainerState.CONTAINER_RUNNING
                            and s.annotations.get(L.CONTAINER_RESTART_COUNT) == str(restarts)):
                        return s
                return None

            found: t.ContainerStatus = await wait_for(find, 45, f"instance {restarts} running")
            return found

        async def die(restarts: int) -> None:
            instance = await running(restarts)
            await env.client.exec_sync(instance.id, ["touch", "/tmp/die"])

        async def backing_off(delay: str) -> dict[str, Any]:
            status = await status_where(
                env, "crash", lambda s: cs_of(s, "main")["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff"
                and f"back-off {delay} " in cs_of(s, "main")["state"]["waiting"]["message"], f"back-off {delay}")
            return cs_of(status, "main")

        async def still(restarts: int) -> None:
            await anyio.sleep(1.5)
            assert cs_of(env.status_of("crash"), "main")["restartCount"] == restarts

        await die(0)
        await running(1)  # the first failure is restarted at once
        await die(1)
        cs = await backing_off("10s")
        uid = env.uid_of("crash")
        assert cs["state"]["waiting"]["message"] == (
            f"back-off 10s restarting failed container=main pod=crash-{env.node}_default({uid})")
        assert cs["restartCount"] == 1
        assert cs["lastState"]["terminated"]["exitCode"] == 3
        assert cs["lastState"]["terminated"]["reason"] == "Error"
        await still(1)
        # The exit's age when first seen (up to a relist period or two) counts against the
        # delay: 7 s on the clock is still short of it, 11 s is past it.
        clock.advance(7)
        await still(1)
        clock.advance(4)
        await running(2)
        await die(2)
        await backing_off("20s")
        clock.advance(21)
        await running(3)
        clock.advance(601)  # instance 3 ran for ten minutes: its next failure starts over
        await die(3)
        await running(4)
        await die(4)
        await backing_off("10s")
        assert facts(env, "crash", "ContainerBackedOff")


async def test_restart_policies_and_exit_reasons(containerd: Any, tmp_path: Path) -> None:
    """conformance.md RT1/K2a: Always restarts, OnFailure only failures, Never nothing; exit
    reasons Completed, Error, StartError (containerd's word for a command that cannot run)."""
    async with running_agent(containerd, tmp_path) as env:
        env.write("pods.yaml",
                  pod("always-ok", [ctr("main", "exit 0")], restartPolicy="Always"),
                  pod("onfailure-ok", [ctr("main", "exit 0")], restartPolicy="OnFailure"),
                  pod("onfailure-fail", [ctr("main", "exit 1")], restartPolicy="OnFailure"),
                  pod("never-fail", [ctr("main", "exit 2")], restartPolicy="Never"),
                  pod("bad-never", [ctr("main", ["/no/such/binary"])], restartPolicy="Never"),
                  pod("bad-always", [ctr("main", ["/no/such/binary"])], restartPolicy="Always"),
                  pod("nonroot", [ctr("main", UNTIL_TERM, securityContext={"runAsNonRoot": True})]))

        def restarted(s: dict[str, Any]) -> bool:
            return cs_of(s, "main").get("restartCount", 0) >= 1 and bool(cs_of(s, "main").get("lastState"))

        status = await status_where(env, "always-ok", restarted, "a restart after exit 0")
        assert status["phase"] == "Running"
        assert cs_of(status, "main")["lastState"]["terminated"]["reason"] == "Completed"

        status = await phase(env, "onfailure-ok", "Succeeded")
        main = cs_of(status, "main")
        assert main["restartCount"] == 0 and main["state"]["terminated"]["reason"] == "Completed"
        assert main["ready"] is False and main["started"] is False

        status = await status_where(env, "onfailure-fail", restarted, "a restart after exit 1")
        assert status["phase"] == "Running"
        last = cs_of(status, "main")["lastState"]["terminated"]
        assert last["exitCode"] == 1 and last["reason"] == "Error"

        status = await phase(env, "never-fail", "Failed")
        main = cs_of(status, "main")
        assert main["restartCount"] == 0 and main["lastState"] == {}
        assert main["state"]["terminated"]["exitCode"] == 2 and main["state"]["terminated"]["reason"] == "Error"
        assert len(await instances(env, "never-fail")) == 1

        status = await phase(env, "bad-never", "Failed")
        terminated = cs_of(status, "main")["state"]["terminated"]
        assert terminated["reason"] == "StartError" and terminated["exitCode"] == 128
        assert "no/such/binary" in terminated["message"]

        status = await status_where(
            env, "bad-always", lambda s: cs_of(s, "main")["state"].get("waiting", {}).get("reason")
            in ("RunContainerError", "CrashLoopBackOff") and restarted(s), "RunContainerError / CrashLoopBackOff")
        assert cs_of(status, "main")["lastState"]["terminated"]["reason"] == "StartError"
        assert status["phase"] == "Pending" or status["phase"] == "Running"

        status = await status_where(
            env, "nonroot", lambda s: cs_of(s, "main")["state"].get("waiting", {}).get("reason")
            == "CreateContainerConfigError", "CreateContainerConfigError")
        assert status["phase"] == "Pending"
        assert not await instances(env, "nonroot")
        # The fact behind the kubelet's Warning "Failed" event (nodeagent/cluster/kubeevents.py).
        (failed, *_) = facts(env, "nonroot", "ContainerFailed")
        assert failed["reason"] == "CreateContainerConfigError" and "runAsNonRoot" in failed["message"]


async def test_container_restart_policy_and_rules(containerd: Any, tmp_path: Path) -> None:
    """ContainerRestartRules (beta, on by default since v1.35; upstream's "Container Restart
    Rules" tests): a container's own restartPolicy overrides the pod's, and its
    restartPolicyRules, matched on the exit code, come first."""
    rule_42 = [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]
    async with running_agent(containerd, tmp_path) as env:
        env.write("pods.yaml",
                  pod("rule-match", [ctr("main", "exit 42", restartPolicy="Never", restartPolicyRules=rule_42)],
                      restartPolicy="Never"),
                  pod("rule-mismatch", [ctr("main", "exit 1", restartPolicy="Never", restartPolicyRules=rule_42)],
                      restartPolicy="Never"),
                  pod("ctr-never", [ctr("main", "exit 1", restartPolicy="Never")], restartPolicy="Always"),
                  pod("ctr-always", [ctr("main", "exit 1", restartPolicy="Always")], restartPolicy="Never"),
                  pod("not-in", [ctr("main", "exit 0", restartPolicy="OnFailure", restartPolicyRules=[
                      {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [3]}}])]))
        env.write("bad.yaml", pod("bad", [ctr("main", "exit 0", restartPolicyRules=rule_42)]))

        def restarted(s: dict[str, Any]) -> bool:
            return cs_of(s, "main").get("restartCount", 0) >= 1

        for name in ("rule-match", "ctr-always", "not-in"):
            status = await status_where(env, name, restarted, "restarted")
            assert status["phase"] in ("Running", "Pending")
        for name in ("rule-mismatch", "ctr-never"):
            status = await phase(env, name, "Failed")
            assert cs_of(status, "main")["restartCount"] == 0
            assert len(await instances(env, name)) == 1
        # Rules without a container restartPolicy are invalid (API validation): never run.
        assert env.uid_of("bad") is None and not await instances(env, "bad")


async def test_restart_all_containers_runs_the_pod_again_from_its_first_init_container(
        containerd: Any, tmp_path: Path) -> None:
    """RestartAllContainers (beta; upstream's "Pod Extended (RestartAllContainers)"): an exit
    that matches such a rule stops every container and runs the pod again in its sandbox, init
    containers first; a restartPolicy Never pod is not failed by the containers it stopped."""
    once = "if [ -f /mnt/done ]; then sleep 3600; else touch /mnt/done; exit 42; fi"
    rule = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]
    mount = [{"name": "work", "mountPath": "/mnt"}]
    async with running_agent(containerd, tmp_path) as env:
        env.write("pods.yaml", pod(
            "reset", [ctr("source", once, restartPolicy="Never", restartPolicyRules=rule, volumeMounts=mount),
                      ctr("other", "sleep 3600")],
            init=[ctr("init", "exit 0"), sidecar("side", "sleep 3600")],
            restartPolicy="Never", volumes=[{"name": "work", "emptyDir": {}}]))
        names = ("init", "side", "source", "other")

        def reset_done(s: dict[str, Any]) -> bool:
            return all(cs_of(s, n).get("restartCount", 0) >= 1 and cs_of(s, n).get("lastState", {}).get("terminated")
                       for n in names) and all("running" in cs_of(s, n)["state"] for n in ("side", "source", "other"))

        status = await status_where(env, "reset", reset_done, "every container run again")
        assert status["phase"] == "Running"
        assert cs_of(status, "source")["lastState"]["terminated"]["exitCode"] == 42
        assert cs_of(status, "init")["state"]["terminated"]["exitCode"] == 0
        # Once: the second run of source does not exit, so nothing is reset again.
        await anyio.sleep(2)
        assert len(await instances(env, "reset")) == 2 * len(names)  # one run before, one after
        for n in names:
            assert cs_of(env.status_of("reset"), n)["restartCount"] == 1


# --- init containers --------------------------------------------------------------------


async def test_init_containers_run_one_at_a_time_in_order(containerd: Any, tmp_path: Path) -> None:
    """conformance.md I2/CL1: each init container runs to success before the next; app
    containers wait with PodInitializing; then the kubelet's status shape."""
    async with running_agent(containerd, tmp_path) as env:
        env.write("init.yaml", pod("init", [ctr("main", UNTIL_TERM)],
                                   init=[ctr("init1", "sleep 1"), ctr("init2", "sleep 1")]))
        during = await status_where(env, "init", lambda s: "initContainerStatuses" in s
                                    and "running" in cs_of(s, "init1")["state"], "init1 running")
        assert during["phase"] == "Pending"
        assert cs_of(during, "main")["state"] == {"waiting": {"reason": "PodInitializing"}}
        assert cs_of(during, "init2")["state"] == {"waiting": {"reason": "PodInitializing"}}
        initialized = condition(during, "Initialized")
        assert initialized["status"] == "False" and initialized["reason"] == "ContainersNotInitialized"
        assert initialized["message"] == "containers with incomplete status: [init1 init2]"

        status = await status_where(env, "init", lambda s: s["phase"] == "Running"
                                    and cs_of(s, "main").get("ready"), "Running and ready")
        assert [c["type"] for c in status["conditions"][:5]] == [
            "PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
        assert all(c["status"] == "True" for c in status["conditions"][:5])
        for name in ("init1", "init2"):
            cs = cs_of(status, name)
            assert cs["ready"] is True and cs["restartCount"] == 0
            assert cs["state"]["terminated"]["exitCode"] == 0 and cs["state"]["terminated"]["reason"] == "Completed"
            assert cs["imageID"] and cs["containerID"].startswith("containerd://")
        main = cs_of(status, "main")
        assert main["started"] is True and "running" in main["state"]
        assert status["podIP"] and status["podIPs"] == [{"ip": status["podIP"]}]
        assert status["hostIP"] and status["startTime"] and status["qosClass"] == "BestEffort"

        runtime = await instances(env, "init")
        (init1,), (init2,), (main_c,) = (named(runtime, n) for n in ("init1", "init2", "main"))
        assert init1.finished_at <= init2.started_at and init2.finished_at <= main_c.started_at
        assert init1.annotations[L.CONTAINER_TYPE] == "init" and main_c.annotations[L.CONTAINER_TYPE] == "container"


async def test_failing_init_containers(containerd: Any, tmp_path: Path) -> None:
    """conformance.md I3/I4/CL2: under Never a failed init container fails the pod and no app
    container is created; under Always it is restarted with back-off and the pod stays Pending."""
    async with running_agent(containerd, tmp_path) as env:
        env.write("pods.yaml",
                  pod("never", [ctr("main", "true")], init=[ctr("init1", "true"), ctr("init2", "exit 1")],
                      restartPolicy="Never"),
                  pod("always", [ctr("main", UNTIL_TERM)], init=[ctr("init1", "exit 1"), ctr("init2", "true")]),
                  pod("badimage", [ctr("main", "true")], init=[ctr("init1", "true", image=BAD_IMAGE)],
                      restartPolicy="Never"))

        status = await phase(env, "never", "Failed")
        assert "reason" not in status
        assert cs_of(status, "init1")["state"]["terminated"]["exitCode"] == 0
        assert cs_of(status, "init2")["state"]["terminated"]["exitCode"] == 1
        assert cs_of(status, "main")["state"] == {"waiting": {"reason": "PodInitializing"}}
        initialized = condition(status, "Initialized")
        assert initialized["status"] == "False" and initialized["reason"] == "ContainersNotInitialized"
        assert initialized["message"] == "containers with incomplete status: [init2]"
        assert condition(status, "ContainersReady")["reason"] == "PodFailed"
        runtime = await instances(env, "never")
        assert not named(runtime, "main")
        assert len(named(runtime, "init2")) == 1 and cs_of(status, "init2")["restartCount"] == 0  # not restarted

        status = await status_where(env, "always", lambda s: cs_of(s, "init1").get("restartCount", 0) >= 1
                                    and cs_of(s, "init1")["state"].get("waiting", {}).get("reason")
                                    == "CrashLoopBackOff", "init1 restarted, then backing off")
        assert status["phase"] == "Pending"
        assert cs_of(status, "init1")["lastState"]["terminated"]["exitCode"] == 1
        assert cs_of(status, "init2")["state"] == {"waiting": {"reason": "PodInitializing"}}
        assert condition(status, "Initialized")["message"] == "containers with incomplete status: [init1 init2]"
        runtime = await instances(env, "always")
        assert not named(runtime, "main") and not named(runtime, "init2")

        # conformance.md CL6: an init container whose image cannot be pulled shows why.
        status = await status_where(env, "badimage", lambda s: cs_of(s, "init1")["state"].get("waiting", {})
                                    .get("reason") in ("ErrImagePull", "ImagePullBackOff"), "init1 image pull failing")
        assert status["phase"] == "Pending" and condition(status, "Initialized")["status"] == "False"
        assert cs_of(status, "main")["state"]["waiting"]["reason"] == "PodInitializing"


async def test_init_containers_run_again_in_a_new_sandbox(containerd: Any, tmp_path: Path) -> None:
    """kubelet.md 1.3: a dead sandbox is replaced (attempt + 1); init containers run again in it
    before the app containers are restarted."""
    async with running_agent(containerd, tmp_path) as env:
        env.write("sb.yaml", pod("sb", [ctr("main", UNTIL_TERM)], init=[ctr("init1", "true")]))
        await phase(env, "sb", "Running")
        sandboxes, _ = await runtime_objects(env.client, env.node)
        (first,) = sandboxes
        await env.client.stop_pod_sandbox(first.id)

        async def replaced() -> list[t.ContainerStatus] | None:
            sandboxes, _ = await runtime_objects(env.client, env.node)
            ready = [s for s in sandboxes if s.state == t.PodSandboxState.SANDBOX_READY]
            if len(ready) != 1 or ready[0].id == first.id:
                return None
            here = [s for s in await instances(env, "sb") if s.id in {
                c.id for c in await env.client.list_containers(t.ContainerFilter(pod_sandbox_id=ready[0].id))}]
            running = [s for s in named(here, "main") if s.state == t.ContainerState.CONTAINER_RUNNING]
            return here if running and named(here, "init1") else None

        here = await wait_for(replaced, 45, "a new sandbox running init1 again, then main")
        (init1,) = named(here, "init1")
        (main,) = named(here, "main")
        assert init1.exit_code == 0 and init1.finished_at <= main.started_at
        assert main.annotations[L.CONTAINER_RESTART_COUNT] == "1"
        sandboxes, _ = await runtime_objects(env.client, env.node)
        assert max(s.metadata.attempt for s in sandboxes if s.metadata) == 1
        await phase(env, "sb", "Running")


# --- sidecars ---------------------------------------------------------------------------


async def test_sidecars_start_in_order_run_alongside_and_stop_last(containerd: Any, tmp_path: Path) -> None:
    """conformance.md SC-A/SC-D/SC-L: sidecars start in order before the app container, are
    restarted whatever the pod's policy, and stop after the app containers, last first."""
    async with running_agent(containerd, tmp_path) as env:
        env.write("pods.yaml",
                  # s1 would exit at once on SIGTERM, s2 takes a second: only the ordering makes s1
                  # the last one to finish.
                  pod("done", [ctr("main", "sleep 2")], init=[sidecar("s1", UNTIL_TERM), sidecar("s2", SLOW_TERM)],
                      restartPolicy="Never", terminationGracePeriodSeconds=10),
                  pod("crashy", [ctr("main", UNTIL_TERM)], init=[sidecar("s1", "sleep 1; exit 1")],
                      restartPolicy="Never"),
                  pod("deleted", [ctr("main", SLOW_TERM)], init=[sidecar("s1", UNTIL_TERM)],
                      terminationGracePeriodSeconds=10))

        running = await status_where(env, "done", lambda s: s["phase"] == "Running"
                                     and "running" in cs_of(s, "main")["state"], "main running beside sidecars")
        assert all("running" in cs_of(running, n)["state"] and cs_of(running, n)["started"] for n in ("s1", "s2"))
        assert condition(running, "Initialized")["status"] == "True"
        status = await phase(env, "done", "Succeeded")
        for name in ("s1", "s2"):
            terminated = cs_of(status, name)["state"]["terminated"]
            assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
        runtime = await instances(env, "done")
        (s1,), (s2,), (main,) = (named(runtime, n) for n in ("s1", "s2", "main"))
        assert s1.started_at < s2.started_at < main.started_at
        assert main.finished_at < s2.finished_at < s1.finished_at  # stopped last first
        # The ContainerKilled fact follows StopContainer's return and a status read; the exit
        # itself (and so the phase) can be seen first (CI at ccca38c read the facts too soon).
        await wait_for(lambda: _async(len(facts(env, "done", "ContainerKilled")) == 2), 45, "both sidecars killed")
        killed = {e["container"]: e for e in facts(env, "done", "ContainerKilled")}
        assert killed["s1"]["reason"] == killed["s2"]["reason"] == "PodCompleted"

        status = await status_where(env, "crashy", lambda s: cs_of(s, "s1").get("restartCount", 0) >= 1,
                                    "the sidecar restarted under restartPolicy Never")
        assert status["phase"] == "Running" and "running" in cs_of(status, "main")["state"]

        await status_where(env, "deleted", lambda s: s["phase"] == "Running" and cs_of(s, "main")["started"],
                           "running")
        env.remove("pods.yaml")
        await wait_for(lambda: _async(len(facts(env, "deleted", "ContainerKilled")) == 2), 45, "both killed")
        killed = {e["container"]: e for e in facts(env, "deleted", "ContainerKilled")}
        assert killed["main"]["exit_code"] == 0 and killed["s1"]["exit_code"] == 0
        assert killed["main"]["finished_at"] < killed["s1"]["finished_at"]


async def _async(value: Any) -> Any:
    return value


# --- lifecycle hooks --------------------------------------------------------------------


class HookServer:
    """An HTTP server on the host for httpGet hooks: it records what each request asked."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.port = 0

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started()
        await listener.serve(self._handle)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            head = data.decode().split("\r\n")
            headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
            self.requests.append((head[0], headers))
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    def paths(self) -> list[str]:
        return [line.split()[1] for line, _ in self.requests]


async def test_post_start_hooks(containerd: Any, tmp_path: Path) -> None:
    """conformance.md H1/H3/CL5: postStart runs right after the start, blocks the next container
    and the started flag; a failing hook kills the container, which is restarted."""
    server = HookServer()
    async with anyio.create_task_group() as tg:
        await tg.start(server.run)
        async with running_agent(containerd, tmp_path) as env:
            wait_file = "for i in $(seq 100); do [ -f /tmp/ps ] && exit 0; sleep 0.1; done; exit 1"
            env.write("pods.yaml",
                      pod("exec", [ctr("first", wait_file, lifecycle={"postStart": {"exec": {
                          "command": ["sh", "-c", "sleep 2; touch /tmp/ps"]}}}), ctr("second", "true")],
                          restartPolicy="Never"),
                      # The hook's 4 s are the window in which a restarted instance shows running
                      # but not started: wide enough for a status under CI load.
                      pod("slow", [ctr("main", "sleep 6; exit 1", lifecycle={"postStart": {"exec": {
                          "command": ["sh", "-c", "sleep 4"]}}})]),
                      pod("failing", [ctr("main", UNTIL_TERM, lifecycle={"postStart": {"exec": {
                          "command": ["sh", "-c", "exit 1"]}}})]),
                      pod("http", [ctr("main", UNTIL_TERM, lifecycle={
                          "postStart": {"httpGet": {"host": "127.0.0.1", "port": server.port, "path": "/start?x=1",
                                                    "httpHeaders": [{"name": "X-Hook", "value": "yes"}]}},
                          "preStop": {"httpGet": {"host": "127.0.0.1", "port": server.port, "path": "/stop"}}})]))

            status = await phase(env, "exec", "Succeeded")  # the main process saw the hook's file
            runtime = await instances(env, "exec")
            (first,), (second,) = named(runtime, "first"), named(runtime, "second")
            assert second.created_at - first.started_at >= 1.9e9  # created only after the hook

            # A restarted instance is running but not started while its postStart runs.
            await status_where(env, "slow", lambda s: cs_of(s, "main").get("restartCount") == 1
                               and "running" in cs_of(s, "main")["state"] and not cs_of(s, "main")["started"],
                               "restarted instance running, not started during postStart")
            await status_where(env, "slow", lambda s: cs_of(s, "main").get("restartCount") == 1
                               and cs_of(s, "main")["started"], "started once postStart returned")

            status = await status_where(env, "failing", lambda s: cs_of(s, "main").get("restartCount", 0) >= 1
                                        and cs_of(s, "main")["state"].get("waiting", {}).get("reason")
                                        in ("PostStartHookError", "CrashLoopBackOff"), "killed and restarted")
            assert cs_of(status, "main")["lastState"]["terminated"]
            failed = facts(env, "failing", "HookFailed")
            assert failed and failed[0]["reason"] == "FailedPostStartHook" and failed[0]["hook"] == "PostStart"
            # The ContainerKilled fact follows StopContainer's return: the status can show the kill first.
            killed = await wait_for(lambda: _async(facts(env, "failing", "ContainerKilled")), 45, "the kill's fact")
            assert killed[0]["reason"] == "FailedPostStartHook"

            await status_where(env, "http", lambda s: cs_of(s, "main").get("started"), "started")
            line, headers = server.requests[server.paths().index("/start?x=1")]
            assert line.startswith("GET /start?x=1 HTTP/1.1")
            assert headers["User-Agent"] == "kube-lifecycle/1.37" and headers["X-Hook"] == "yes"
            env.remove("pods.yaml")
            await wait_for(lambda: _async("/stop" in server.paths()), 45, "the preStop httpGet request")
        tg.cancel_scope.cancel()


async def test_pre_stop_hooks_and_graceful_termination(containerd: Any, tmp_path: Path) -> None:
    """conformance.md CL8/CL9/S1/DP3, kubelet.md 1.5: preStop runs before the stop signal and
    within the grace period, whose rest StopContainer gets (at least 2 s); a container that
    handles SIGTERM exits at once, one that ignores it is killed when the grace ends."""
    ignore_term = "trap '' TERM; while true; do sleep 0.1; done"
    async with running_agent(containerd, tmp_path) as env:
        env.write("pods.yaml",
                  pod("pre-exec", [ctr("main", "trap 'exit 0' TERM; trap 'exit 42' USR1; "
                                       "while true; do sleep 0.1; done",
                                       lifecycle={"preStop": {"exec": {"command": ["kill", "-USR1", "1"]}}})],
                      terminationGracePeriodSeconds=10),
                  pod("pre-sleep", [ctr("main", UNTIL_TERM, lifecycle={"preStop": {"sleep": {"seconds": 2}}})],
                      terminationGracePeriodSeconds=10),
                  pod("term", [ctr("main", "trap 'exit 7' TERM; while true; do sleep 0.1; done")],
                      terminationGracePeriodSeconds=30),
                  pod("ignore", [ctr("main", ignore_term)], terminationGracePeriodSeconds=3),
                  pod("long-pre", [ctr("main", ignore_term, lifecycle={"preStop": {"exec": {
                      "command": ["sleep", "1000"]}}})], terminationGracePeriodSeconds=3))
        names = ("pre-exec", "pre-sleep", "term", "ignore", "long-pre")
        for name in names:
            await status_where(env, name, lambda s: cs_of(s, "main").get("started"), "started")
        env.remove("pods.yaml")

        async def all_killed() -> bool:
            return all(facts(env, n, "ContainerKilled") for n in names)

        await wait_for(all_killed, 45, "every container killed")

        def outcome(name: str) -> tuple[dict[str, Any], float]:
            (killed,) = facts(env, name, "ContainerKilled")
            (terminating,) = facts(env, name, "PodTerminating")
            return killed, killed["finished_at"] - terminating["at"]

        killed, _ = outcome("pre-exec")
        assert killed["exit_code"] == 42  # the hook's signal reached the process before SIGTERM
        killed, took = outcome("pre-sleep")
        assert killed["exit_code"] == 0 and killed["pre_stop_seconds"] >= 2 and took >= 1.9
        assert killed["stop_timeout_seconds"] == 8  # 10 s grace - 2 s of preStop
        killed, took = outcome("term")
        assert killed["exit_code"] == 7 and took < 10  # SIGTERM handled: the grace is not waited out
        killed, took = outcome("ignore")
        assert killed["exit_code"] == 137 and 2.9 <= took < 15  # SIGKILL when the 3 s grace ended
        killed, took = outcome("long-pre")
        # The hook is cut off at the 3 s grace; StopContainer still gets the 2 s minimum.
        assert killed["stop_timeout_seconds"] == 2 and 2.9 <= killed["pre_stop_seconds"] < 5
        assert killed["exit_code"] == 137 and 4.8 <= took < 20


async def test_active_deadline_fails_the_pod_gracefully(containerd: Any, tmp_path: Path) -> None:
    """conformance.md PO4/12a: once activeDeadlineSeconds passed since the pod's start, the pod
    fails as a whole (DeadlineExceeded), its containers get preStop and the grace period, and
    nothing restarts them although restartPolicy is Always."""
    async with running_agent(containerd, tmp_path) as env:
        env.write("pods.yaml",
                  pod("deadline", [ctr("main", "trap 'exit 3' TERM; while true; do sleep 0.1; done",
                                       lifecycle={"preStop": {"sleep": {"seconds": 1}}})],
                      activeDeadlineSeconds=3, terminationGracePeriodSeconds=10),
                  pod("no-deadline", [ctr("main", "sleep 3600")]))
        status = await phase(env, "deadline", "Failed")
        assert status["reason"] == "DeadlineExceeded"
        assert status["message"] == "Pod was active on the node longer than the specified deadline"
        async def killed_fact() -> list[dict[str, Any]]:
            return facts(env, "deadline", "ContainerKilled")

        (killed,) = await wait_for(killed_fact, 30, "the container killed")
        assert killed["exit_code"] == 3 and killed["pre_stop_seconds"] >= 1  # graceful, not SIGKILL
        status = await status_where(env, "deadline", lambda s: "terminated" in cs_of(s, "main")["state"],
                                    "terminated container state")
        assert cs_of(status, "main")["state"]["terminated"]["exitCode"] == 3
        assert condition(status, "Ready")["status"] == "False"
        await anyio.sleep(2)
        assert len(await instances(env, "deadline")) == 1  # never restarted
        assert env.status_of("no-deadline")["phase"] == "Running"


async def test_orphan_keeps_its_pre_stop_hook_and_grace_across_an_agent_restart(
        containerd: Any, tmp_path: Path) -> None:
    """kubelet.md 2 (restoreSpecsFromContainerLabels): a pod removed while the agent was down is
    killed with the preStop hook and grace period recorded in its container's annotations."""
    config = make_config(tmp_path, containerd.endpoint)
    assert config.static_pod_path is not None
    usr1 = "trap 'exit 0' TERM; trap 'exit 42' USR1; while true; do sleep 0.1; done"
    async with running_agent(containerd, tmp_path, config=config, cleanup=False) as env:
        env.write("orphan.yaml", pod("orphan", [ctr("main", usr1, lifecycle={"preStop": {"exec": {
            "command": ["kill", "-USR1", "1"]}}})], terminationGracePeriodSeconds=10))
        await status_where(env, "orphan", lambda s: cs_of(s, "main").get("started"), "started")
    (config.static_pod_path / "orphan.yaml").unlink()
    async with running_agent(containerd, tmp_path, config=config) as env:
        await wait_for(lambda: _async(facts(env, "orphan", "ContainerKilled")), 45, "the orphan killed")
        (killed,) = facts(env, "orphan", "ContainerKilled")
        assert killed["exit_code"] == 42  # its preStop hook ran
        assert killed["stop_timeout_seconds"] >= 9  # its own grace, not the 2 s of an unknown pod


# --- termination messages ---------------------------------------------------------------


async def test_termination_messages(containerd: Any, tmp_path: Path) -> None:
    """conformance.md RT2-RT6: the message file (at any path, writable by any user), and the
    log tail with FallbackToLogsOnError only for a failed container with an empty file."""
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    many_lines = "for i in $(seq 1 100); do echo line $i; done; exit 1"
    async with running_agent(containerd, tmp_path) as env:
        env.write("pods.yaml",
                  pod("file", [ctr("main", "echo -n DONE > /dev/termination-log")], restartPolicy="Never"),
                  pod("custom", [ctr("main", "echo -n DONE > /dev/termination-custom-log",
                                     terminationMessagePath="/dev/termination-custom-log",
                                     securityContext={"runAsUser": 10000})], restartPolicy="Never"),
                  pod("logs", [ctr("main", "echo -n DONE; exit 1", **fallback)], restartPolicy="Never"),
                  pod("logs-ok", [ctr("main", "echo -n DONE; true", **fallback)], restartPolicy="Never"),
                  pod("logs-file", [ctr("main", "echo -n OK > /dev/termination-log; echo DONE; true", **fallback)],
                      restartPolicy="Never"),
                  pod("logs-tail", [ctr("main", many_lines, **fallback)], restartPolicy="Never"))

        def message(status: dict[str, Any]) -> str | None:
            terminated: dict[str, Any] = cs_of(status, "main")["state"]["terminated"]
            return terminated.get("message")

        assert message(await phase(env, "file", "Succeeded")) == "DONE"
        assert message(await phase(env, "custom", "Succeeded")) == "DONE"
        assert message(await phase(env, "logs", "Failed")) == "DONE"
        assert message(await phase(env, "logs-ok", "Succeeded")) is None
        assert message(await phase(env, "logs-file", "Succeeded")) == "OK"
        tail = message(await phase(env, "logs-tail", "Failed"))
        assert tail is not None and tail.endswith("line 100\n") and "line 21\n" in tail and "line 20\n" not in tail
