"""Unit tests of the runtime stage's pure parts: the planner (computePodActions), the back-off,
getPhase, Go durations, termination-message reading, the container config's refusals, and what
a kill reports (against a scripted runtime). The end-to-end behaviour is in
test_lifecycle_parity.py, against the real containerd."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.fakecontext import FakePodContext
from cri import types as t
from nodeagent import labels as L
from nodeagent.model import Pod
from nodeagent.runtimeview import ContainerRecord, PodRuntime, SandboxRecord
from nodeagent.terminationmessage import create_message_file, read_message
from plugins.runtime.backoff import Backoff
from plugins.runtime.container import ContainerConfigError, container_config
from plugins.runtime.events import ContainerKilled
from plugins.runtime.plan import plan
from plugins.runtime.sync import go_duration
from plugins.runtime.termination import Victim, kill
from plugins.status import Facts, carry_last_states, reported_before
from plugins.status import compute as compute_status

SANDBOX = SandboxRecord(id="sb1", attempt=0, ready=True, created_at=1, pod_ip="10.0.0.2")


def pod(restart_policy: str = "Always", init: list[dict[str, Any]] | None = None,
        containers: tuple[str, ...] = ("main",)) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "p", "uid": "u1"},
        "spec": {"restartPolicy": restart_policy, "initContainers": init or [],
                 "containers": [{"name": n, "image": "busybox"} for n in containers]},
    })


def rec(name: str, state: str = "running", exit_code: int = 0, attempt: int = 0, sandbox: str = "sb1",
        created: int = 10, reason: str = "") -> ContainerRecord:
    return ContainerRecord(id=f"{name}-{attempt}-{sandbox}", name=name, pod_uid="u1", sandbox_id=sandbox,
                           attempt=attempt, state=state, created_at=created + attempt, restart_count=attempt,
                           started_at=5 if state != "created" else 0, finished_at=9 if state == "exited" else 0,
                           exit_code=exit_code, reason=reason)


def runtime(*containers: ContainerRecord, sandboxes: tuple[SandboxRecord, ...] = (SANDBOX,)) -> PodRuntime:
    return PodRuntime(uid="u1", sandboxes=sandboxes, containers=containers)


def compute(p: Pod, runtime: PodRuntime, facts: Facts | None = None) -> dict[str, Any]:
    """The status stage's status as the sinks get it (the API's JSON object)."""
    return compute_status(p, runtime, facts).to_api()


def names(p: Any) -> list[str]:
    return [s.container.name for s in p.starts]


INITS = [{"name": "i1", "image": "busybox"}, {"name": "i2", "image": "busybox"}]


def test_init_containers_start_one_at_a_time_in_order() -> None:
    p = pod(init=INITS)
    assert names(plan(p, runtime())) == ["i1"]
    assert names(plan(p, runtime(rec("i1")))) == []  # running: wait for it
    assert names(plan(p, runtime(rec("i1", "exited")))) == ["i2"]
    done = plan(p, runtime(rec("i1", "exited"), rec("i2", "exited")))
    assert done.initialized and names(done) == ["main"]


def test_failed_init_container_restarts_or_fails_the_pod_per_policy() -> None:
    failed = runtime(rec("i1", "exited", exit_code=1))
    assert names(plan(pod("Always", INITS), failed)) == ["i1"]
    assert names(plan(pod("OnFailure", INITS), failed)) == ["i1"]
    never = plan(pod("Never", INITS), failed)
    assert never.kill_pod and not never.starts
    oom = runtime(rec("i1", "exited", exit_code=0, reason="OOMKilled"))
    assert plan(pod("Never", INITS), oom).kill_pod


def test_init_containers_do_not_run_again_once_a_regular_container_ran() -> None:
    # The init instances were removed, but main ran in this sandbox: the pod is initialized.
    p = plan(pod(init=INITS), runtime(rec("main")))
    assert p.initialized and not p.starts


def test_sidecars_start_in_order_without_waiting_to_exit_and_restart_whatever_the_policy() -> None:
    p = pod("Never", init=[{"name": "s1", "image": "b", "restartPolicy": "Always"}, *INITS])
    assert names(plan(p, runtime())) == ["s1"]
    assert names(plan(p, runtime(rec("s1")))) == ["i1"]  # running counts as started
    ready = runtime(rec("s1"), rec("i1", "exited"), rec("i2", "exited"))
    assert names(plan(p, ready)) == ["main"]
    crashed = runtime(rec("s1", "exited", exit_code=1), rec("i1", "exited"), rec("i2", "exited"), rec("main"))
    assert names(plan(p, crashed)) == ["s1"]  # restarted although the pod's policy is Never


def test_sidecars_are_stopped_and_not_restarted_when_the_regular_containers_are_done() -> None:
    p = pod("Never", init=[{"name": "s1", "image": "b", "restartPolicy": "Always"}])
    done = plan(p, runtime(rec("s1"), rec("main", "exited")))
    assert done.kill_pod and not done.starts
    crashed = plan(p, runtime(rec("s1", "exited", exit_code=1), rec("main", "exited")))
    assert crashed.kill_pod and not crashed.starts


def test_regular_containers_restart_per_policy() -> None:
    ok, failed = rec("main", "exited", 0), rec("main", "exited", 1)
    assert names(plan(pod("Always"), runtime(ok))) == ["main"]
    assert plan(pod("OnFailure"), runtime(ok)).kill_pod
    assert names(plan(pod("OnFailure"), runtime(failed))) == ["main"]
    assert plan(pod("Never"), runtime(failed)).kill_pod
    assert plan(pod("Always"), runtime(rec("main"))).starts == ()
    created = plan(pod("Always"), runtime(rec("main", "created")))
    assert names(created) == ["main"] and created.starts[0].resume is not None


def test_a_dead_sandbox_is_replaced_unless_the_policy_is_never() -> None:
    dead = (SandboxRecord(id="sb1", attempt=0, ready=False, created_at=1),)
    assert plan(pod("Always"), runtime(rec("main", "exited"), sandboxes=dead)).new_sandbox
    never = plan(pod("Never"), runtime(rec("main", "exited"), sandboxes=dead))
    assert never.kill_pod and not never.new_sandbox


def test_init_containers_run_again_in_a_new_sandbox() -> None:
    new = SandboxRecord(id="sb2", attempt=1, ready=True, created_at=2)
    old = (rec("i1", "exited", sandbox="sb1"), rec("i2", "exited", sandbox="sb1"), rec("main", "exited", sandbox="sb1"))
    p = plan(pod("Always", INITS), runtime(*old, sandboxes=(SANDBOX, new)))
    assert names(p) == ["i1"] and p.starts[0].latest is not None  # restart count continues


def test_backoff_doubles_caps_and_forgets_after_twice_the_maximum() -> None:
    b = Backoff(10, 300)
    now = 0.0
    delays: list[float] = []
    for _ in range(7):
        assert b.remaining("k", now, now) == (0 if not delays else delays[-1])
        delays.append(b.next("k", now, now))
        now += delays[-1] + 1  # crash again right after each restart
    assert delays == [10, 20, 40, 80, 160, 300, 300]
    # Still in back-off however long the container waited, as long as it crashed soon after.
    assert b.remaining("k", now, now + 100) == 200
    # A container that ran 10 minutes (2 x max) since its last restart starts over.
    restarted_at = now
    b.next("k", now, restarted_at)
    crashed = restarted_at + 601
    assert b.remaining("k", crashed, crashed) == 0
    assert b.next("k", crashed, crashed) == 10


def test_go_duration() -> None:
    assert [go_duration(s) for s in (10, 40, 80, 160, 300)] == ["10s", "40s", "1m20s", "2m40s", "5m0s"]


def test_get_phase_with_init_containers_and_sidecars() -> None:
    facts = Facts(now=1.0)
    p = pod("Never", init=[{"name": "s1", "image": "b", "restartPolicy": "Always"}, INITS[0]])
    assert compute(p, runtime(rec("s1"), rec("i1")), facts)["phase"] == "Pending"
    running = runtime(rec("s1"), rec("i1", "exited"), rec("main"))
    assert compute(p, running, facts)["phase"] == "Running"
    # The main container is done but the sidecar still runs: Running until it is stopped.
    assert compute(p, runtime(rec("s1"), rec("i1", "exited"), rec("main", "exited")), facts)["phase"] == "Running"
    # A sidecar's exit code never decides the outcome.
    done = runtime(rec("s1", "exited", 137), rec("i1", "exited"), rec("main", "exited"))
    assert compute(p, done, facts)["phase"] == "Succeeded"
    failed = compute(p, runtime(rec("s1"), rec("i1", "exited", 1)), facts)
    assert failed["phase"] == "Failed"
    initialized = next(c for c in failed["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "False" and initialized["reason"] == "ContainersNotInitialized"
    assert initialized["message"] == "containers with incomplete status: [i1]"
    assert failed["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}


def test_termination_messages_share_the_pods_12_kib() -> None:
    p = pod("Never", init=INITS)  # three containers: 4096 bytes each
    done = runtime(rec("i1", "exited"), rec("i2", "exited"), rec("main", "exited", exit_code=1))
    status = compute(p, done, Facts(messages={"main-0-sb1": "é" * 5000}, now=1.0))
    message = status["containerStatuses"][0]["state"]["terminated"]["message"]
    assert len(message.encode()) == 4096 and message == "é" * 2048


def test_termination_message_from_file_and_from_logs(tmp_path: Path) -> None:
    # The message is read from the file the agent made for the container, in the pod directory.
    message = create_message_file(tmp_path, "main")
    message.write_bytes(b"x" * 5000 + b"END")
    log = tmp_path / "0.log"
    lines = [f"2024-01-01T00:00:00.000000000Z stdout F line {i}\n" for i in range(100)]
    log.write_text("".join(lines) + "2024-01-01T00:00:00.1Z stderr P DONE\n")

    def status(exit_code: int, policy: str, file: Path, runtime_message: str = "") -> t.ContainerStatus:
        return t.ContainerStatus(
            state=t.ContainerState.CONTAINER_EXITED, exit_code=exit_code, message=runtime_message,
            annotations={L.CONTAINER_TERMINATION_MESSAGE_PATH: "/dev/termination-log",
                         L.CONTAINER_TERMINATION_MESSAGE_POLICY: policy},
            metadata=t.ContainerMetadata(name="main"),
            mounts=[t.Mount(container_path="/dev/termination-log", host_path=str(file))], log_path=str(log))

    from_file = read_message(status(0, "File", message), tmp_path)
    assert len(from_file) == 4096 and from_file.endswith("END")  # the last 4096 bytes
    empty = create_message_file(tmp_path, "main")
    assert read_message(status(1, "File", empty), tmp_path) == ""
    assert read_message(status(0, "FallbackToLogsOnError", empty), tmp_path) == ""  # success: no fallback
    from_logs = read_message(status(1, "FallbackToLogsOnError", empty), tmp_path)
    assert from_logs.endswith("line 99\nDONE")  # partial line: no newline added
    assert "line 20\n" not in from_logs and len(from_logs.encode()) <= 2048
    assert read_message(status(1, "File", message, "Error"), tmp_path).startswith("Error: xxx")


def test_a_restart_created_but_not_started_is_not_shown_before_it_runs() -> None:
    # Between CreateContainer and StartContainer the new instance must not surface: its restart
    # count with the old instance as lastState would read as a restart that started before the
    # previous instance ended (upstream "should cap back-off at MaxContainerBackOff").
    p = pod("Always")
    facts = Facts(now=1.0)
    exited = rec("main", "exited", 1, attempt=0)
    before = compute(p, runtime(exited), facts)["containerStatuses"][0]
    during = compute(p, runtime(exited, rec("main", "created", attempt=1)), facts)["containerStatuses"][0]
    assert during == before
    assert during["restartCount"] == 0 and "terminated" in during["state"]
    after = compute(p, runtime(exited, rec("main", "running", attempt=1)), facts)["containerStatuses"][0]
    assert after["restartCount"] == 1 and "running" in after["state"]
    assert after["lastState"]["terminated"]["exitCode"] == 1


# --- killing: the outcome of a stop ---------------------------------------------------


class _LateExitRuntime:
    """A runtime whose StopContainer returns before its status shows the exit, as containerd 1.6
    does for a container that exited on its own and whose exit its handler has not recorded yet
    (CI at ac70b67: the ContainerKilled fact then had no exit code and no finish time)."""

    def __init__(self, running_reads: int) -> None:
        self.running_reads = running_reads

    async def stop_container(self, container_id: str, timeout: int) -> None:
        return None

    async def container_status(self, container_id: str) -> t.ContainerStatus:
        if self.running_reads > 0:
            self.running_reads -= 1
            return t.ContainerStatus(id=container_id, state=t.ContainerState.CONTAINER_RUNNING)
        return t.ContainerStatus(id=container_id, state=t.ContainerState.CONTAINER_EXITED, exit_code=42,
                                 finished_at=1_700_000_000_500_000_000)


@pytest.mark.anyio
async def test_a_killed_container_reports_the_exit_its_status_shows_only_after_the_stop() -> None:
    ctx = FakePodContext(pod=pod(), runtime=_LateExitRuntime(running_reads=3))
    await kill(ctx, [Victim("c1", "main")], grace=10, reason="Killing")
    (killed,) = [e for e in ctx.events if isinstance(e, ContainerKilled)]
    assert killed.exit_code == 42 and killed.finished_at == 1_700_000_000.5


class _NeverStartedRuntime(_LateExitRuntime):
    """A container created and never started: stopping it leaves it created, with no exit."""

    def __init__(self) -> None:
        super().__init__(running_reads=0)
        self.reads = 0

    async def container_status(self, container_id: str) -> t.ContainerStatus:
        self.reads += 1
        return t.ContainerStatus(id=container_id, state=t.ContainerState.CONTAINER_CREATED)


@pytest.mark.anyio
async def test_killing_a_container_that_never_started_does_not_wait_for_an_exit() -> None:
    runtime = _NeverStartedRuntime()
    ctx = FakePodContext(pod=pod(), runtime=runtime)
    await kill(ctx, [Victim("c1", "main")], grace=10, reason="Killing")
    (killed,) = [e for e in ctx.events if isinstance(e, ContainerKilled)]
    assert killed.exit_code is None and killed.finished_at is None and runtime.reads == 1


def test_a_command_whose_executable_name_no_file_can_have_is_a_config_error() -> None:
    def with_command(*command: str) -> Pod:
        return Pod.model_validate({"metadata": {"name": "p", "uid": "u1"}, "spec": {
            "containers": [{"name": "main", "image": "busybox", "command": list(command)}]}})

    long_name = with_command("y" * 100_000, "-c")
    with pytest.raises(ContainerConfigError, match="100000 bytes long.*cannot be started"):
        container_config(long_name, long_name.spec.containers[0], 0, "sha256:x", "n1")
    fine = with_command("/bin/" + "y" * 4000, "y" * 100_000)  # an argument may be long
    assert container_config(fine, fine.spec.containers[0], 0, "sha256:x", "n1").command[0].startswith("/bin/y")


def test_a_last_state_the_runtime_no_longer_has_is_carried_from_the_status_before() -> None:
    """The container GC keeps one dead instance per container: once an init container's second
    run has ended, its first is removed, and the runtime alone gives no lastState. The kubelet
    (RestartAllContainersOnContainerExits) takes it from the status it reported before; the
    upstream RestartAllContainers test reads it ("container init do not have lastTerminationState")."""
    p = pod("Never", init=[{"name": "init", "image": "busybox"}])
    both = runtime(rec("init", "exited", exit_code=0, attempt=0), rec("init", "exited", exit_code=3, attempt=1),
                   rec("main", "running"))
    before = compute_status(p, both)
    [init] = before.init_container_statuses or []
    assert init.restart_count == 1 and init.last_state.terminated is not None
    first_run = init.last_state.terminated

    collected = runtime(rec("init", "exited", exit_code=3, attempt=1), rec("main", "running"))
    assert (compute_status(p, collected).init_container_statuses or [])[0].last_state.terminated is None
    carried = carry_last_states(compute_status(p, collected), before)
    assert (carried.init_container_statuses or [])[0].last_state.terminated == first_run

    # The instance that was current before, and is replaced since: its end becomes lastState.
    restarted = runtime(rec("init", "exited", exit_code=3, attempt=1), rec("main", "running", attempt=1))
    ended = compute_status(p, runtime(rec("init", "exited", exit_code=3, attempt=1),
                                      rec("main", "exited", exit_code=42, attempt=0)))
    now = carry_last_states(compute_status(p, restarted), ended)
    [main] = now.container_statuses or []
    assert main.last_state.terminated is not None and main.last_state.terminated.exit_code == 42
    # The runtime's own previous instance wins over the status before.
    both_main = runtime(rec("init", "exited", exit_code=3, attempt=1), rec("main", "exited", exit_code=7, attempt=0),
                        rec("main", "running", attempt=1))
    [main] = carry_last_states(compute_status(p, both_main), ended).container_statuses or []
    assert main.last_state.terminated is not None and main.last_state.terminated.exit_code == 7


def test_after_an_agent_restart_the_status_before_is_the_one_the_api_holds() -> None:
    """The kubelet's oldPodStatus is pod.Status when its status manager has none (a restarted
    kubelet): what the agent reported before its restart, read back from the API, carries a
    lastState the container GC removed while the agent was away."""
    p = pod("Never", init=[{"name": "init", "image": "busybox"}])
    reported = compute_status(p, runtime(rec("init", "exited", exit_code=0, attempt=0),
                                         rec("init", "exited", exit_code=3, attempt=1), rec("main", "running")))
    in_api = reported.to_api()
    in_api["initContainerStatuses"][0]["lastState"]["terminated"]["signal"] = 0  # the API's; never ours
    in_api["containerStatuses"].append({"name": "broken", "state": {"terminated": {"reason": "no exit code"}}})
    before = reported_before(in_api)
    assert before is not None and [c.name for c in before.container_statuses or []] == ["main"]
    collected = runtime(rec("init", "exited", exit_code=3, attempt=1), rec("main", "running"))
    [init] = carry_last_states(compute_status(p, collected), before).init_container_statuses or []
    assert init.last_state.terminated is not None and init.last_state.terminated.exit_code == 0
    assert init.last_state == (reported.init_container_statuses or [])[0].last_state
    assert reported_before({}) is None and reported_before({"phase": "Pending", "conditions": []}) is None


# --- a sandbox's IPs: the relister's record first ------------------------------------------


class _SandboxStatusRuntime:
    """PodSandboxStatus alone, counted: what the stage asks when the record cannot tell."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def pod_sandbox_status(self, sandbox_id: str) -> t.PodSandboxStatus:
        self.asked.append(sandbox_id)
        return t.PodSandboxStatus(id=sandbox_id, state=t.PodSandboxState.SANDBOX_READY,
                                  network=t.PodSandboxNetworkStatus(ip="10.0.0.9"))


def _with_sandbox(*, ips: tuple[str, ...] = ("10.0.0.2", "fd00::2"), ready: bool = True) -> PodRuntime:
    return runtime(sandboxes=(SandboxRecord(id="sb1", attempt=0, ready=ready, created_at=1,
                                            pod_ip=ips[0] if ips else "", pod_ips=ips),))


@pytest.mark.anyio
async def test_a_sandboxs_ips_come_from_the_relisters_record_without_asking_the_runtime() -> None:
    from plugins.runtime import seen

    asking = _SandboxStatusRuntime()
    ctx = FakePodContext(pod=pod(), runtime=asking, observed=_with_sandbox())
    assert await seen.sandbox_ips(ctx, "sb1") == ("10.0.0.2", "fd00::2")
    assert await seen.sandbox_ips(ctx, "sb1") == ("10.0.0.2", "fd00::2")  # kept
    assert asking.asked == []


@pytest.mark.anyio
async def test_a_just_run_sandboxs_ips_are_awaited_in_the_record_then_asked_for() -> None:
    import anyio

    from plugins.runtime import seen

    # The event (or listing) brings the record a moment after RunPodSandbox answered.
    asking = _SandboxStatusRuntime()
    ctx = FakePodContext(pod=pod(), runtime=asking, observed=runtime(sandboxes=()))
    async with anyio.create_task_group() as tg:
        async def recorded() -> None:
            await anyio.sleep(0.05)
            ctx.set_observed(_with_sandbox(ips=("10.0.0.3",)))
        tg.start_soon(recorded)
        assert await seen.sandbox_ips(ctx, "sb1") == ("10.0.0.3",)
    assert asking.asked == []

    # No record within the bound (an event gone missing): the runtime is asked.
    asking = _SandboxStatusRuntime()
    ctx = FakePodContext(pod=pod(), runtime=asking, observed=runtime(sandboxes=()))
    with anyio.fail_after(seen.RECORD_WAIT_SECONDS + 5):
        assert await seen.sandbox_ips(ctx, "sb1") == ("10.0.0.9",)
    assert asking.asked == ["sb1"]

    # A host-network sandbox has no IP of its own, which the record cannot tell from "not known".
    asking = _SandboxStatusRuntime()
    host = pod().model_copy(update={"spec": pod().spec.model_copy(update={"host_network": True})})
    ctx = FakePodContext(pod=host, runtime=asking, observed=_with_sandbox(ips=()))
    with anyio.fail_after(1):
        await seen.sandbox_ips(ctx, "sb1")
    assert asking.asked == ["sb1"]


@pytest.mark.anyio
async def test_the_status_stage_starts_from_the_status_the_api_holds() -> None:
    import anyio

    from plugins.status import StatusStage

    p = pod("Never", init=[{"name": "init", "image": "busybox"}])
    reported = compute_status(p, runtime(rec("init", "exited", exit_code=0, attempt=0),
                                         rec("init", "exited", exit_code=3, attempt=1), rec("main", "running")))
    restarted = p.model_copy(update={"status": reported.to_api()})  # the pod as the API serves it
    class _Messages:  # ContainerStatus for the termination messages the stage reads: none
        async def container_status(self, container_id: str) -> t.ContainerStatus:
            return t.ContainerStatus(id=container_id, state=t.ContainerState.CONTAINER_EXITED)

    ctx = FakePodContext(pod=restarted, runtime=_Messages(),
                         observed=runtime(rec("init", "exited", exit_code=3, attempt=1), rec("main", "running")))
    with anyio.move_on_after(0.5):
        await StatusStage().observe(ctx)  # type: ignore[arg-type]
    assert ctx.status.observed is not None
    [init] = ctx.status.observed.init_container_statuses or []
    assert init.last_state.terminated is not None and init.last_state.terminated.exit_code == 0
