"""The in-memory CRI runtime (conformance.memruntime) through the real RuntimeClient.

Every behaviour test runs twice: against the memory runtime and against the session's real
containerd (marked ``containerd``), with the same assertions — that is what makes the fake
faithful where the agent depends on it. Fault injection, the call log and the controls a test
has over the simulated processes exist only in the fake and are tested on it alone.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest

from conformance.memruntime import MemoryRuntime
from conformance.memruntime.process import parse
from cri import (
    CriError,
    DeadlineExceeded,
    FailedPrecondition,
    NotFound,
    RuntimeClient,
    Unavailable,
    Unimplemented,
    Unknown,
)
from cri import types as t
from devenv.images import BUSYBOX_IMAGE

pytestmark = pytest.mark.anyio

TIMEOUT = 30.0
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z (stdout|stderr) (F|P) (.*)$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
UNTIL_TERM = ["sh", "-c", "trap 'exit 0' TERM; echo trap set; sleep 3600 & wait"]
"""Exits 0 on SIGTERM once its trap is set: it says so in its log (:meth:`Runtime.trap_set`)."""


@dataclass
class Runtime:
    kind: str
    client: RuntimeClient
    base: Path
    memory: MemoryRuntime | None
    sandboxes: list[str]

    @property
    def flavour(self) -> str:
        """Which containerd's answers to expect where 2.x and 1.6 differ."""
        if self.memory is not None:
            return self.memory.state.flavour
        info = self.client.runtime_version
        return "1.6" if info is not None and info.runtime_version.lstrip("v").startswith("1.") else "2.x"

    def sandbox_config(self, *, labels: dict[str, str] | None = None, attempt: int = 0,
                       uid: str | None = None) -> t.PodSandboxConfig:
        uid = uid or str(uuid.uuid4())
        name = f"mem-{uid[:8]}"
        log_dir = self.base / f"cri-test_{name}_{uid}"
        log_dir.mkdir(parents=True, exist_ok=True)
        return t.PodSandboxConfig(
            metadata=t.PodSandboxMetadata(name=name, uid=uid, namespace="cri-test", attempt=attempt),
            hostname=name, log_directory=str(log_dir),
            labels={"io.kubernetes.pod.uid": uid, "suite": "memruntime", **(labels or {})},
            annotations={"note": "echoed"},
            linux=t.LinuxPodSandboxConfig(security_context=t.LinuxSandboxSecurityContext(
                namespace_options=t.NamespaceOption(pid=t.NamespaceMode.CONTAINER))))

    async def sandbox(self, **kw: Any) -> tuple[str, t.PodSandboxConfig]:
        config = self.sandbox_config(**kw)
        sandbox_id = await self.client.run_pod_sandbox(config)
        self.sandboxes.append(sandbox_id)
        return sandbox_id, config

    async def container(self, sandbox_id: str, sandbox_config: t.PodSandboxConfig, command: list[str],
                        *, name: str = "main", start: bool = True, mounts: list[t.Mount] | None = None,
                        envs: dict[str, str] | None = None, pid: t.NamespaceMode = t.NamespaceMode.CONTAINER) -> str:
        # pid=CONTAINER is what the kubelet (and the runtime stage) ask for unless the pod shares
        # its process namespace: the container's process is PID 1 of its own namespace.
        config = t.ContainerConfig(
            metadata=t.ContainerMetadata(name=name, attempt=0), image=t.ImageSpec(image=BUSYBOX_IMAGE),
            command=command, envs=envs or {}, mounts=mounts or [], log_path=f"{name}/0.log",
            labels={"io.kubernetes.container.name": name, **sandbox_config.labels},
            annotations={"container.note": "echoed"},
            linux=t.LinuxContainerConfig(security_context=t.LinuxContainerSecurityContext(
                namespace_options=t.NamespaceOption(pid=pid))))
        container_id = await self.client.create_container(sandbox_id, config, sandbox_config)
        if start:
            await self.client.start_container(container_id)
        return container_id

    async def trap_set(self, container_id: str, timeout: float = 10.0) -> None:
        """Wait until an UNTIL_TERM container has set its trap: a SIGTERM that comes earlier,
        with the shell still starting (a loaded machine), is ignored by PID 1."""
        log_path = Path((await self.client.container_status(container_id)).log_path)
        with anyio.fail_after(timeout):
            while not (log_path.exists() and "trap set" in log_path.read_text()):
                await anyio.sleep(0.02)

    async def exited(self, container_id: str, timeout: float = 10.0) -> t.ContainerStatus:
        with anyio.fail_after(timeout):
            while True:
                status = await self.client.container_status(container_id)
                if status.state == t.ContainerState.CONTAINER_EXITED:
                    return status
                await anyio.sleep(0.05)


@pytest.fixture(params=[pytest.param("memory"), pytest.param("memory-1.6"),
                        pytest.param("containerd", marks=pytest.mark.containerd)])
async def rt(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Runtime]:
    if request.param.startswith("memory"):
        async with MemoryRuntime(flavour="1.6" if request.param == "memory-1.6" else "2.x").serving() as memory:
            async with RuntimeClient(memory.endpoint, timeout=TIMEOUT) as client:
                runtime = Runtime("memory", client, tmp_path, memory, [])
                yield runtime
        return
    containerd = request.getfixturevalue("containerd")
    async with RuntimeClient(containerd.endpoint, timeout=TIMEOUT) as client:
        runtime = Runtime("containerd", client, tmp_path, None, [])
        try:
            yield runtime
        finally:
            with anyio.CancelScope(shield=True):
                for sandbox_id in runtime.sandboxes:
                    await client.remove_pod_sandbox(sandbox_id)


# --- sandboxes and containers: states, ids, timestamps, what is echoed ------------------------


async def test_sandbox_and_container_lifecycle(rt: Runtime) -> None:
    before = time.time_ns()
    sandbox_id, config = await rt.sandbox()
    assert HEX64.match(sandbox_id)
    status = await rt.client.pod_sandbox_status(sandbox_id)
    assert status.state == t.PodSandboxState.SANDBOX_READY and status.created_at >= before
    assert status.metadata == config.metadata and status.labels == config.labels
    assert status.annotations == config.annotations
    assert status.network is not None and status.network.ip  # a pod IP outside the host network

    container_id = await rt.container(sandbox_id, config, UNTIL_TERM, start=False)
    assert HEX64.match(container_id)
    created = await rt.client.container_status(container_id)
    assert created.state == t.ContainerState.CONTAINER_CREATED and created.started_at == 0
    await rt.client.start_container(container_id)
    running = await rt.client.container_status(container_id)
    assert running.state == t.ContainerState.CONTAINER_RUNNING and running.started_at >= created.created_at
    assert running.annotations["container.note"] == "echoed"
    assert running.log_path == f"{config.log_directory}/main/0.log"
    await rt.trap_set(container_id)
    await rt.client.stop_container(container_id, 10)
    stopped = await rt.client.container_status(container_id)
    assert stopped.state == t.ContainerState.CONTAINER_EXITED
    assert (stopped.exit_code, stopped.reason) == (0, "Completed") and stopped.finished_at >= stopped.started_at
    await rt.client.stop_container(container_id, 10)  # stopping a stopped container is no error
    with pytest.raises(Unknown, match="CONTAINER_EXITED"):
        await rt.client.start_container(container_id)  # only a created container starts


async def test_unknown_ids(rt: Runtime) -> None:
    unknown = "f" * 64
    with pytest.raises(NotFound):
        await rt.client.pod_sandbox_status(unknown)
    with pytest.raises(NotFound):
        await rt.client.container_status(unknown)
    with pytest.raises(NotFound):
        await rt.client.start_container(unknown)
    await rt.client.remove_pod_sandbox(unknown)  # containerd: removing what is not there succeeds
    await rt.client.remove_container(unknown)
    if rt.flavour == "2.x":  # and stopping it, on 2.x
        await rt.client.stop_pod_sandbox(unknown)
        await rt.client.stop_container(unknown, 1)
    else:
        with pytest.raises(NotFound):
            await rt.client.stop_pod_sandbox(unknown)
        with pytest.raises(NotFound):
            await rt.client.stop_container(unknown, 1)


async def test_stop_and_remove_sandbox_take_its_containers(rt: Runtime) -> None:
    sandbox_id, config = await rt.sandbox()
    container_id = await rt.container(sandbox_id, config, UNTIL_TERM)
    await rt.client.stop_pod_sandbox(sandbox_id)
    assert (await rt.client.pod_sandbox_status(sandbox_id)).state == t.PodSandboxState.SANDBOX_NOTREADY
    assert (await rt.client.container_status(container_id)).state == t.ContainerState.CONTAINER_EXITED
    await rt.client.remove_pod_sandbox(sandbox_id)
    rt.sandboxes.remove(sandbox_id)
    with pytest.raises(NotFound):
        await rt.client.container_status(container_id)
    assert not await rt.client.list_pod_sandbox(t.PodSandboxFilter(id=sandbox_id))


async def test_removing_a_running_container_stops_it_first(rt: Runtime) -> None:
    sandbox_id, config = await rt.sandbox()
    container_id = await rt.container(sandbox_id, config, ["sleep", "3600"])
    await rt.client.remove_container(container_id)  # containerd force-stops, then removes
    with pytest.raises(NotFound):
        await rt.client.container_status(container_id)


async def test_names_are_reserved(rt: Runtime) -> None:
    sandbox_id, config = await rt.sandbox()
    error = FailedPrecondition if rt.flavour == "2.x" else Unknown
    with pytest.raises(error, match="failed to reserve sandbox name"):
        await rt.client.run_pod_sandbox(config)
    await rt.container(sandbox_id, config, UNTIL_TERM, start=False)
    with pytest.raises(error, match="failed to reserve container name"):
        await rt.container(sandbox_id, config, UNTIL_TERM, start=False)


async def test_list_filters(rt: Runtime) -> None:
    first, first_config = await rt.sandbox(labels={"which": "first"})
    second, second_config = await rt.sandbox(labels={"which": "second"})
    a = await rt.container(first, first_config, UNTIL_TERM)
    b = await rt.container(second, second_config, UNTIL_TERM, start=False)
    mine = {"suite": "memruntime"}
    listed = await rt.client.list_pod_sandbox(t.PodSandboxFilter(label_selector={**mine, "which": "second"}))
    assert [s.id for s in listed] == [second]
    assert [s.id for s in await rt.client.list_pod_sandbox(t.PodSandboxFilter(id=first[:12]))] == [first]
    created = t.ContainerFilter(state=t.ContainerState.CONTAINER_CREATED,
                                label_selector=mine)
    assert [c.id for c in await rt.client.list_containers(created)] == [b]
    assert [c.id for c in await rt.client.list_containers(t.ContainerFilter(pod_sandbox_id=first))] == [a]
    listed_c = await rt.client.list_containers(t.ContainerFilter(id=a))
    assert listed_c[0].labels["which"] == "first" and listed_c[0].pod_sandbox_id == first


# --- processes: exit codes, reasons, signals, logs, exec --------------------------------------


async def test_exit_codes_and_reasons(rt: Runtime) -> None:
    sandbox_id, config = await rt.sandbox()
    done = await rt.exited(await rt.container(sandbox_id, config, ["true"], name="t"))
    failed = await rt.exited(await rt.container(sandbox_id, config, ["sh", "-c", "exit 3"], name="f"))
    assert (done.exit_code, done.reason) == (0, "Completed")
    assert (failed.exit_code, failed.reason) == (3, "Error")


async def test_pid_1_ignores_sigterm_unless_it_traps_it(rt: Runtime) -> None:
    sandbox_id, config = await rt.sandbox()
    plain = await rt.container(sandbox_id, config, ["sleep", "3600"], name="plain")
    trapping = await rt.container(sandbox_id, config, UNTIL_TERM, name="trapping")
    await rt.trap_set(trapping)
    begin = time.monotonic()
    await rt.client.stop_container(trapping, 10)
    assert time.monotonic() - begin < 5
    assert (await rt.client.container_status(trapping)).exit_code == 0
    begin = time.monotonic()
    await rt.client.stop_container(plain, 1)  # SIGTERM is not delivered to PID 1: SIGKILL after 1 s
    assert time.monotonic() - begin >= 0.9
    killed = await rt.client.container_status(plain)
    assert (killed.exit_code, killed.reason) == (137, "Error")
    # In the pod's PID namespace the pause process is PID 1: the same sleep dies of SIGTERM.
    shared = await rt.container(sandbox_id, config, ["sleep", "3600"], name="shared", pid=t.NamespaceMode.POD)
    await rt.client.stop_container(shared, 10)
    assert (await rt.client.container_status(shared)).exit_code == 143


async def test_output_goes_to_the_cri_log(rt: Runtime) -> None:
    sandbox_id, config = await rt.sandbox()
    container_id = await rt.container(sandbox_id, config, ["sh", "-c", "echo hello; echo oops >&2"])
    status = await rt.exited(container_id)
    lines = Path(status.log_path).read_text().splitlines()
    assert all(LOG_LINE.match(line) for line in lines), lines
    # stdout and stderr are separate pipes: their order in the file is not defined
    assert sorted(line.split(" ", 1)[1] for line in lines) == ["stderr F oops", "stdout F hello"]


async def test_a_missing_mount_source_is_made_a_directory(rt: Runtime) -> None:
    sandbox_id, config = await rt.sandbox()
    missing = rt.base / "absent" / "deeper"
    container_id = await rt.container(sandbox_id, config, UNTIL_TERM, mounts=[
        t.Mount(container_path="/data", host_path=str(missing))])
    assert missing.is_dir()
    assert (await rt.client.container_status(container_id)).state == t.ContainerState.CONTAINER_RUNNING


async def test_a_failed_start_leaves_a_start_error(rt: Runtime) -> None:
    sandbox_id, config = await rt.sandbox()
    container_id = await rt.container(sandbox_id, config, UNTIL_TERM, start=False)
    await rt.client.stop_pod_sandbox(sandbox_id)  # StartContainer needs a running sandbox
    with pytest.raises(CriError):
        await rt.client.start_container(container_id)
    status = await rt.client.container_status(container_id)
    assert (status.state, status.exit_code, status.reason) == (t.ContainerState.CONTAINER_EXITED, 128, "StartError")


async def test_exec_sync(rt: Runtime) -> None:
    sandbox_id, config = await rt.sandbox()
    data = rt.base / "data"
    data.mkdir()
    (data / "file").write_text("from the host\n")
    container_id = await rt.container(sandbox_id, config, UNTIL_TERM, envs={"GREETING": "hi"},
                                      mounts=[t.Mount(container_path="/data", host_path=str(data))])
    result = await rt.client.exec_sync(container_id, ["sh", "-c", "echo $GREETING; cat /data/file; exit 4"], 5)
    assert (result.stdout, result.exit_code) == (b"hi\nfrom the host\n", 4)
    assert (await rt.client.exec_sync(container_id, ["test", "-e", "/data/nothing"], 5)).exit_code == 1
    with pytest.raises(DeadlineExceeded):
        await rt.client.exec_sync(container_id, ["sleep", "10"], 1)
    await rt.client.stop_container(container_id, 5)
    with pytest.raises(CriError):
        await rt.client.exec_sync(container_id, ["true"], 5)


# --- images ---------------------------------------------------------------------------------


async def test_images(rt: Runtime) -> None:
    present = await rt.client.image_status(BUSYBOX_IMAGE)
    assert present is not None and present.id.startswith("sha256:") and BUSYBOX_IMAGE in present.repo_tags
    assert await rt.client.image_status("docker.io/library/nothing-here:1") is None
    assert present.id in {i.id for i in await rt.client.list_images()}
    await rt.client.remove_image("docker.io/library/nothing-here:1")  # absent: no error
    with pytest.raises(CriError):
        await rt.client.pull_image("docker.io/library/nothing-here:1")
    usage = await rt.client.image_fs_info()
    assert usage and usage[0].fs_id is not None and usage[0].fs_id.mountpoint


async def test_version_and_status(rt: Runtime) -> None:
    version = await rt.client.version()
    assert version.runtime_api_version == "v1"
    status = await rt.client.status()
    conditions = {c.type: c.status for c in status.conditions}
    assert conditions["RuntimeReady"] and conditions["NetworkReady"]  # what the node's status reads
    assert ("ContainerdHasNoDeprecationWarnings" in conditions) == (rt.flavour == "2.x")
    if rt.flavour == "2.x":
        assert (await rt.client.runtime_config()) is not None
    else:
        with pytest.raises(Unimplemented):
            await rt.client.runtime_config()


# --- only the memory runtime: what a test controls --------------------------------------------


@pytest.fixture
async def memory(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with MemoryRuntime().serving() as mem:
        async with RuntimeClient(mem.endpoint, timeout=TIMEOUT) as client:
            yield Runtime("memory", client, tmp_path, mem, [])


async def test_a_test_makes_a_container_exit(memory: Runtime) -> None:
    assert memory.memory is not None
    sandbox_id, config = await memory.sandbox()
    container_id = await memory.container(sandbox_id, config, UNTIL_TERM)
    memory.memory.exit(container_id, 7)
    assert (await memory.exited(container_id)).exit_code == 7
    other = await memory.container(sandbox_id, config, UNTIL_TERM, name="other")
    memory.memory.oom_kill(other)
    oom = await memory.exited(other)
    assert (oom.exit_code, oom.reason) == (137, "OOMKilled")
    third = await memory.container(sandbox_id, config, UNTIL_TERM, name="third")
    memory.memory.kill_sandbox(sandbox_id)
    assert (await memory.exited(third)).exit_code == 137
    assert (await memory.client.pod_sandbox_status(sandbox_id)).state == t.PodSandboxState.SANDBOX_NOTREADY


async def test_sigterm_behaviour_is_configurable(memory: Runtime) -> None:
    assert memory.memory is not None
    sandbox_id, config = await memory.sandbox()
    container_id = await memory.container(sandbox_id, config, ["sleep", "3600"])
    memory.memory.set_sigterm(container_id, "exit")
    await memory.client.stop_container(container_id, 30)
    assert (await memory.client.container_status(container_id)).exit_code == 143  # 128 + SIGTERM


async def test_faults_and_call_log(memory: Runtime) -> None:
    assert memory.memory is not None
    faults = memory.memory.faults
    faults.fail("RunPodSandbox", grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")
    with pytest.raises(CriError, match="no room") as caught:
        await memory.sandbox()
    assert caught.value.retryable
    sandbox_id, config = await memory.sandbox()
    uid = config.metadata.uid
    assert [c.method for c in memory.memory.calls(pod=uid)] == ["RunPodSandbox"]
    # Delayed before the work: a caller that gives up leaves nothing done.
    faults.delay("CreateContainer", 5.0, pod=uid)
    with anyio.move_on_after(0.3):
        await memory.container(sandbox_id, config, UNTIL_TERM, start=False)
    assert not await memory.client.list_containers(t.ContainerFilter(pod_sandbox_id=sandbox_id))
    assert memory.memory.calls("CreateContainer")[-1].cancelled
    faults.disarm()
    # Delayed after the work: the container exists, the caller never heard of it.
    faults.delay("CreateContainer", 5.0, when="after", times=1)
    with anyio.move_on_after(0.3):
        await memory.container(sandbox_id, config, UNTIL_TERM, start=False)
    assert len(await memory.client.list_containers(t.ContainerFilter(pod_sandbox_id=sandbox_id))) == 1


async def test_start_cancelled_midway_leaves_a_start_error(memory: Runtime) -> None:
    """containerd leaves a container whose StartContainer caller went away exited, with
    "context canceled" (the runtime stage recognises and replaces it)."""
    assert memory.memory is not None
    sandbox_id, config = await memory.sandbox()
    container_id = await memory.container(sandbox_id, config, UNTIL_TERM, start=False)
    memory.memory.faults.delay("StartContainer", 5.0)
    with anyio.move_on_after(0.3):
        await memory.client.start_container(container_id)
    status = await memory.exited(container_id)
    assert (status.reason, status.exit_code) == ("StartError", 128) and "context canceled" in status.message


async def test_restart_keeps_state(memory: Runtime) -> None:
    assert memory.memory is not None
    sandbox_id, config = await memory.sandbox()
    container_id = await memory.container(sandbox_id, config, UNTIL_TERM)
    await memory.memory.restart()
    assert (await memory.client.container_status(container_id)).state == t.ContainerState.CONTAINER_RUNNING
    async with anyio.create_task_group() as tg:
        tg.start_soon(memory.memory.restart, 0.5)
        await anyio.sleep(0.1)
        with pytest.raises(Unavailable):
            await memory.client.run_pod_sandbox(memory.sandbox_config())


async def test_events_follow_the_transitions(memory: Runtime) -> None:
    sandbox_id, config = await memory.sandbox()
    kinds: list[tuple[str, t.ContainerEventType]] = []
    async with anyio.create_task_group() as tg:
        async def listen() -> None:
            async for event in memory.client.container_events():
                kinds.append((event.container_id, event.container_event_type))

        tg.start_soon(listen)
        await anyio.sleep(0.2)
        container_id = await memory.container(sandbox_id, config, ["true"])
        await memory.exited(container_id)
        await memory.client.remove_container(container_id)
        await anyio.sleep(0.2)
        tg.cancel_scope.cancel()
    E = t.ContainerEventType
    assert [k for c, k in kinds if c == container_id] == [
        E.CONTAINER_CREATED_EVENT, E.CONTAINER_STARTED_EVENT, E.CONTAINER_STOPPED_EVENT, E.CONTAINER_DELETED_EVENT]


def test_shell_scripts_parse() -> None:
    script = parse("trap 'exit 0' TERM; while true; do echo tick; sleep 1; done & wait")
    assert [type(node).__name__ for _, node in script] == ["Simple", "Background", "Simple"]
    with pytest.raises(ValueError):
        parse("while true; do echo")
