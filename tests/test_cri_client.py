"""RuntimeClient against the real containerd of the test session (devenv)."""

from __future__ import annotations

import ipaddress
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from cri import (
    CriError,
    NotFound,
    RuntimeClient,
    Unavailable,
    Unimplemented,
)
from cri import types as t
from devenv.images import BUSYBOX_IMAGE, PAUSE_IMAGE, build_busybox
from devenv.registry import serve as served_registry

pytestmark = [pytest.mark.anyio, pytest.mark.containerd]

TIMEOUT = 30.0  # per call; generous for a loaded CI machine, far below the 2 min default
# "<RFC3339Nano> <stream> <tag> <text>", as containerd writes CRI logs.
LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d) (stdout|stderr) (F|P) (.*)$")


class Pods:
    """Makes uniquely named sandboxes/containers and removes them afterwards."""

    def __init__(self, client: RuntimeClient, tmp_path: Path) -> None:
        self.client = client
        self.tmp_path = tmp_path
        self.sandboxes: list[str] = []
        self.cgroups: list[str] = []

    def cgroup_parent(self) -> str:
        """A pod cgroup path (cgroupfs style) that cleanup() removes again."""
        name = f"/nodeagent-cri-test-{uuid.uuid4().hex[:12]}"
        self.cgroups.append(name)
        return name

    def sandbox_config(self, *, host_network: bool = False, cgroup_parent: str = "") -> t.PodSandboxConfig:
        uid = str(uuid.uuid4())
        name = f"cri-test-{uid[:8]}"
        log_dir = self.tmp_path / f"pods/cri-test_{name}_{uid}"
        log_dir.mkdir(parents=True)
        return t.PodSandboxConfig(
            metadata=t.PodSandboxMetadata(name=name, uid=uid, namespace="cri-test", attempt=0),
            # runc cannot set a hostname without its own UTS namespace.
            hostname="" if host_network else name,
            log_directory=str(log_dir),
            labels={"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": name,
                    "io.kubernetes.pod.namespace": "cri-test"},
            annotations={"test": "cri"},
            linux=t.LinuxPodSandboxConfig(cgroup_parent=cgroup_parent, security_context=t.LinuxSandboxSecurityContext(
                namespace_options=t.NamespaceOption(
                    network=t.NamespaceMode.NODE if host_network else t.NamespaceMode.POD,
                    pid=t.NamespaceMode.CONTAINER,
                ),
            )),
        )

    async def sandbox(self, *, host_network: bool = False, cgroup_parent: str = "") -> tuple[str, t.PodSandboxConfig]:
        config = self.sandbox_config(host_network=host_network, cgroup_parent=cgroup_parent)
        sandbox_id = await self.client.run_pod_sandbox(config)
        self.sandboxes.append(sandbox_id)
        return sandbox_id, config

    async def container(self, sandbox_id: str, sandbox_config: t.PodSandboxConfig, *command: str,
                        name: str = "main", start: bool = True) -> str:
        config = t.ContainerConfig(
            metadata=t.ContainerMetadata(name=name, attempt=0),
            image=t.ImageSpec(image=BUSYBOX_IMAGE),
            command=list(command),
            envs={"GREETING": "hello"},
            labels={"io.kubernetes.container.name": name},
            log_path=f"{name}/0.log",
        )
        container_id = await self.client.create_container(sandbox_id, config, sandbox_config)
        if start:
            await self.client.start_container(container_id)
        return container_id

    async def cleanup(self) -> None:
        with anyio.CancelScope(shield=True):
            for sandbox_id in self.sandboxes:
                try:
                    await self.client.stop_pod_sandbox(sandbox_id)
                except NotFound:
                    continue  # the test removed it already
                await self.client.remove_pod_sandbox(sandbox_id)  # removes its containers too
        for name in self.cgroups:
            for hierarchy in Path("/sys/fs/cgroup").iterdir():
                path = hierarchy / name.lstrip("/")
                if path.is_dir():
                    path.rmdir()


@pytest.fixture
async def client(containerd) -> AsyncIterator[RuntimeClient]:  # type: ignore[no-untyped-def]
    async with RuntimeClient(containerd.endpoint, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture
async def pods(client: RuntimeClient, tmp_path: Path) -> AsyncIterator[Pods]:
    made = Pods(client, tmp_path)
    try:
        yield made
    finally:
        await made.cleanup()


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    """A plain-HTTP registry on 127.0.0.1 (devenv.registry: containerd allows HTTP for loopback,
    1.6 directly, 2.x after an HTTPS attempt) serving busybox as cri-test/busybox:1.36; yields
    its host:port."""
    with served_registry({"cri-test/busybox:1.36": build_busybox().path}) as served:
        yield served.host


async def wait_exited(client: RuntimeClient, container_id: str, timeout: float = 20.0) -> t.ContainerStatus:
    with anyio.fail_after(timeout):
        while True:
            status = await client.container_status(container_id)
            if status.state == t.ContainerState.CONTAINER_EXITED:
                return status
            await anyio.sleep(0.05)


# ------------------------------------------------------------------ runtime and images


async def test_version_handshake(client: RuntimeClient) -> None:
    assert client.runtime_version is not None
    assert client.runtime_version.runtime_api_version == "v1"
    assert client.runtime_version.runtime_name == "containerd"
    info = await client.version()
    assert info.runtime_version == client.runtime_version.runtime_version
    assert info.version == "0.1.0"


async def test_status_reports_runtime_and_network_ready(client: RuntimeClient) -> None:
    status = await client.status()
    runtime_ready, network_ready = status.condition("RuntimeReady"), status.condition("NetworkReady")
    assert runtime_ready is not None and runtime_ready.status
    assert network_ready is not None and network_ready.status
    status, info = await client.status(verbose=True)
    assert status.condition("RuntimeReady") is not None
    assert info  # containerd puts its config JSON here


async def test_list_and_status_of_local_images(client: RuntimeClient) -> None:
    images = await client.list_images()
    tags = {tag for image in images for tag in image.repo_tags}
    assert {BUSYBOX_IMAGE, PAUSE_IMAGE} <= tags
    busybox = await client.image_status(BUSYBOX_IMAGE)
    assert busybox is not None
    assert BUSYBOX_IMAGE in busybox.repo_tags
    assert busybox.id.startswith("sha256:") and busybox.size > 0
    by_id = await client.image_status(busybox.id)
    assert by_id is not None and by_id.id == busybox.id
    filtered = await client.list_images(t.ImageFilter(image=t.ImageSpec(image=BUSYBOX_IMAGE)))
    assert busybox.id in [image.id for image in filtered]  # containerd 1.6 ignores the filter
    filesystems = await client.image_fs_info()
    assert filesystems and filesystems[0].fs_id is not None
    assert filesystems[0].used_bytes is not None  # 0 until containerd's first 10 s stats pass


async def test_pull_of_a_present_image_returns_its_id(client: RuntimeClient, registry: str, containerd) -> None:  # type: ignore[no-untyped-def]
    """containerd resolves every pull at the registry, even for an image it has
    (so offline, pulling docker.io/... fails): pull busybox from a local registry,
    where only the manifest is fetched and the blobs are found locally."""
    busybox = await client.image_status(BUSYBOX_IMAGE)
    assert busybox is not None
    reference = f"{registry}/cri-test/busybox:1.36"
    try:
        assert await client.pull_image(reference) == busybox.id
        pulled = await client.image_status(reference)
        assert pulled is not None and reference in pulled.repo_tags
        assert any(d.startswith(f"{registry}/cri-test/busybox@sha256:") for d in pulled.repo_digests)
    finally:
        # Not RemoveImage: it removes every name of the image, busybox's too.
        names = containerd.ctr("images", "ls", "-q").stdout.split()
        ours = [name for name in names if name.startswith(registry + "/")]
        if ours:
            containerd.ctr("images", "rm", *ours)
    # containerd 1.6's CRI image cache learns of the removal from containerd's event stream, a
    # moment after ctr returned.
    busybox_after = await client.image_status(BUSYBOX_IMAGE)
    with anyio.move_on_after(10):
        while busybox_after is not None and busybox_after.repo_digests != busybox.repo_digests:
            await anyio.sleep(0.1)
            busybox_after = await client.image_status(BUSYBOX_IMAGE)
    assert busybox_after is not None and busybox_after.repo_digests == busybox.repo_digests


async def test_missing_image(client: RuntimeClient) -> None:
    missing = "127.0.0.1:1/cri-test/missing:0"  # nothing listens on port 1: fails at once
    assert await client.image_status(missing) is None
    with pytest.raises(CriError) as caught:
        await client.pull_image(missing)
    assert caught.value.method == "PullImage"
    assert "missing" in str(caught.value)


# ------------------------------------------------------------------ sandboxes


async def test_sandbox_with_pod_network(client: RuntimeClient, pods: Pods, containerd) -> None:  # type: ignore[no-untyped-def]
    sandbox_id, config = await pods.sandbox()
    status = await client.pod_sandbox_status(sandbox_id)
    assert status.id == sandbox_id
    assert status.state == t.PodSandboxState.SANDBOX_READY
    assert status.metadata == config.metadata
    assert status.labels == config.labels and status.annotations == config.annotations
    assert status.created_at > 0
    assert status.network is not None
    assert ipaddress.ip_address(status.network.ip) in ipaddress.ip_network(containerd.subnet)

    uid = config.labels["io.kubernetes.pod.uid"]
    listed = await client.list_pod_sandbox(t.PodSandboxFilter(label_selector={"io.kubernetes.pod.uid": uid}))
    assert [s.id for s in listed] == [sandbox_id]
    ready = await client.list_pod_sandbox(t.PodSandboxFilter(id=sandbox_id, state=t.PodSandboxState.SANDBOX_READY))
    assert [s.id for s in ready] == [sandbox_id]

    _, info = await client.pod_sandbox_status(sandbox_id, verbose=True)
    assert "info" in info

    await client.stop_pod_sandbox(sandbox_id)
    await client.stop_pod_sandbox(sandbox_id)  # idempotent
    assert (await client.pod_sandbox_status(sandbox_id)).state == t.PodSandboxState.SANDBOX_NOTREADY
    assert await client.list_pod_sandbox(t.PodSandboxFilter(id=sandbox_id, state=t.PodSandboxState.SANDBOX_READY)) == []
    await client.remove_pod_sandbox(sandbox_id)
    with pytest.raises(NotFound):
        await client.pod_sandbox_status(sandbox_id)


async def test_sandbox_with_host_network(client: RuntimeClient, pods: Pods) -> None:
    sandbox_id, config = await pods.sandbox(host_network=True)
    assert config.hostname == ""
    status = await client.pod_sandbox_status(sandbox_id)
    assert status.state == t.PodSandboxState.SANDBOX_READY
    assert status.network is None or status.network.ip == ""
    assert status.linux is not None and status.linux.namespaces is not None
    options = status.linux.namespaces.options
    assert options is not None and options.network == t.NamespaceMode.NODE


# ------------------------------------------------------------------ containers


async def test_container_create_start_stop_remove(client: RuntimeClient, pods: Pods) -> None:
    sandbox_id, config = await pods.sandbox()
    container_id = await pods.container(
        sandbox_id, config, "sh", "-c", 'trap "" TERM; while true; do sleep 0.1; done', start=False)
    created = await client.container_status(container_id)
    assert created.state == t.ContainerState.CONTAINER_CREATED
    assert created.metadata == t.ContainerMetadata(name="main", attempt=0)
    assert created.image is not None and created.image.image == BUSYBOX_IMAGE and created.image_ref
    assert created.log_path == str(Path(config.log_directory) / "main/0.log")

    await client.start_container(container_id)
    running = await client.container_status(container_id)
    assert running.state == t.ContainerState.CONTAINER_RUNNING and running.started_at > 0
    listed = await client.list_containers(t.ContainerFilter(pod_sandbox_id=sandbox_id))
    assert [(c.id, c.state) for c in listed] == [(container_id, t.ContainerState.CONTAINER_RUNNING)]
    assert listed[0].labels == {"io.kubernetes.container.name": "main"}

    # The shell ignores SIGTERM: the runtime kills it after the 1 s grace.
    started = time.monotonic()
    await client.stop_container(container_id, timeout=1)
    assert time.monotonic() - started >= 0.9
    stopped = await client.container_status(container_id)
    assert stopped.state == t.ContainerState.CONTAINER_EXITED
    assert stopped.exit_code == 137 and stopped.reason == "Error"
    await client.stop_container(container_id, timeout=1)  # idempotent
    exited = await client.list_containers(t.ContainerFilter(id=container_id, state=t.ContainerState.CONTAINER_EXITED))
    assert [c.id for c in exited] == [container_id]

    await client.remove_container(container_id)
    with pytest.raises(NotFound):
        await client.container_status(container_id)
    assert await client.list_containers(t.ContainerFilter(pod_sandbox_id=sandbox_id)) == []


async def test_exec_sync_returns_output_and_exit_code(client: RuntimeClient, pods: Pods) -> None:
    sandbox_id, config = await pods.sandbox()
    container_id = await pods.container(sandbox_id, config, "sleep", "3600")
    result = await client.exec_sync(container_id, ["sh", "-c", 'echo "$GREETING"; echo oops >&2; exit 3'], timeout=10)
    assert result == t.ExecSyncResult(stdout=b"hello\n", stderr=b"oops\n", exit_code=3)
    assert (await client.exec_sync(container_id, ["true"])).exit_code == 0


async def test_log_file_in_cri_format(client: RuntimeClient, pods: Pods) -> None:
    sandbox_id, config = await pods.sandbox()
    container_id = await pods.container(
        sandbox_id, config, "sh", "-c", 'echo "first line"; echo "to stderr" >&2; echo "$GREETING"')
    await wait_exited(client, container_id)
    log = Path(config.log_directory) / "main" / "0.log"
    records = [LOG_LINE.match(line) for line in log.read_text().splitlines()]
    assert all(records), log.read_text()
    assert sorted((m[3], m[4], m[5]) for m in records if m) == [
        ("stderr", "F", "to stderr"), ("stdout", "F", "first line"), ("stdout", "F", "hello")]


async def test_exit_code_and_reason_after_exit(client: RuntimeClient, pods: Pods) -> None:
    sandbox_id, config = await pods.sandbox()
    ok = await pods.container(sandbox_id, config, "true", name="ok")
    failed = await pods.container(sandbox_id, config, "sh", "-c", "exit 7", name="failed")
    ok_status, failed_status = await wait_exited(client, ok), await wait_exited(client, failed)
    assert (ok_status.exit_code, ok_status.reason) == (0, "Completed")
    assert (failed_status.exit_code, failed_status.reason) == (7, "Error")
    # (containerd may stamp finished_at a little before started_at for a quick exit)
    assert failed_status.started_at > 0 and failed_status.finished_at > 0


async def test_stats_resources_and_streaming_urls(client: RuntimeClient, pods: Pods) -> None:
    # Sandbox stats come from the pod cgroup, so this sandbox needs one.
    sandbox_id, config = await pods.sandbox(cgroup_parent=pods.cgroup_parent())
    container_id = await pods.container(sandbox_id, config, "sleep", "3600")

    stats = await client.container_stats(container_id)
    assert stats.attributes is not None and stats.attributes.id == container_id
    assert stats.cpu is not None and stats.memory is not None
    listed = await client.list_container_stats(t.ContainerStatsFilter(pod_sandbox_id=sandbox_id))
    assert [s.attributes.id for s in listed if s.attributes] == [container_id]
    sandbox_stats = await client.pod_sandbox_stats(sandbox_id)
    assert sandbox_stats.attributes is not None and sandbox_stats.attributes.id == sandbox_id
    assert sandbox_id in [s.attributes.id for s in await client.list_pod_sandbox_stats() if s.attributes]

    await client.update_container_resources(container_id, t.LinuxContainerResources(cpu_shares=512))
    await client.reopen_container_log(container_id)

    exec_url = await client.exec(t.ExecRequest(container_id=container_id, cmd=["sh"], stdin=True, stdout=True))
    attach_url = await client.attach(t.AttachRequest(container_id=container_id, stdout=True))
    forward_url = await client.port_forward(sandbox_id, [80])
    for url in (exec_url, attach_url, forward_url):
        assert url.startswith("http://127.0.0.1:")


async def test_container_events(client: RuntimeClient, pods: Pods) -> None:
    """containerd 1.6 does not implement GetContainerEvents; later ones stream events."""
    assert client.runtime_version is not None
    if client.runtime_version.runtime_version.startswith("1.6"):
        with pytest.raises(Unimplemented):
            async for _ in client.container_events():
                pass
        return
    sandbox_id, config = await pods.sandbox()
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            events = client.container_events()
            tg.start_soon(pods.container, sandbox_id, config, "true")
            # The stream is the runtime's, not the sandbox's: other tests' containers (deleted as
            # this one is created) show up in it too.
            first = await events.__anext__()
            while first.pod_sandbox_status is None or first.pod_sandbox_status.id != sandbox_id:
                first = await events.__anext__()
            await events.aclose()
    assert first.container_event_type == t.ContainerEventType.CONTAINER_CREATED_EVENT


async def test_container_event_summaries_say_whose_sandbox(client: RuntimeClient, pods: Pods) -> None:
    """The summary form (what the relister reads) keeps the event's container, type and the
    identity of its sandbox: enough to relist that one pod."""
    assert client.runtime_version is not None
    if client.runtime_version.runtime_version.startswith("1.6"):
        pytest.skip("containerd 1.6 has no GetContainerEvents")
    sandbox_id, config = await pods.sandbox()
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            events = client.container_events(summary=True)
            tg.start_soon(pods.container, sandbox_id, config, "true")
            first = await events.__anext__()
            while first.pod_sandbox_status is None or first.pod_sandbox_status.id != sandbox_id:
                first = await events.__anext__()
            await events.aclose()
    assert isinstance(first, t.ContainerEventSummary) and first.container_id
    assert first.container_event_type == t.ContainerEventType.CONTAINER_CREATED_EVENT
    assert first.pod_sandbox_status is not None
    assert first.pod_sandbox_status.metadata.uid == config.metadata.uid
    assert first.pod_sandbox_status.labels["io.kubernetes.pod.uid"] == config.metadata.uid


async def test_container_event_summaries_read_the_sandbox_only_for_the_types_asked(
        client: RuntimeClient, pods: Pods) -> None:
    """``whose``: the relister reads whose sandbox an event is about only for exits and removals;
    a creation comes with its container, type and time, and no sandbox identity read."""
    assert client.runtime_version is not None
    if client.runtime_version.runtime_version.startswith("1.6"):
        pytest.skip("containerd 1.6 has no GetContainerEvents")
    sandbox_id, config = await pods.sandbox()
    stopped = t.ContainerEventType.CONTAINER_STOPPED_EVENT
    got: list[t.ContainerEventSummary] = []

    async def read() -> None:
        async for event in client.container_events(summary=True, whose={stopped}):
            got.append(event)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.sleep(1)  # the stream is open before the container comes
            container_id = await pods.container(sandbox_id, config, "true")
            while not any(e.container_id == container_id and e.container_event_type == stopped for e in got):
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    seen = {e.container_event_type: e for e in got if e.container_id == container_id}
    created = seen[t.ContainerEventType.CONTAINER_CREATED_EVENT]
    assert created.pod_sandbox_status is None and created.created_at > 0
    assert seen[stopped].pod_sandbox_status is not None
    assert seen[stopped].pod_sandbox_status.id == sandbox_id


# ------------------------------------------------------------------ errors


async def test_unknown_ids_raise_not_found(client: RuntimeClient) -> None:
    unknown = "0" * 64
    with pytest.raises(NotFound) as caught:
        await client.container_status(unknown)
    assert caught.value.method == "ContainerStatus" and caught.value.endpoint == client.endpoint
    assert not caught.value.retryable
    with pytest.raises(NotFound):
        await client.start_container(unknown)
    with pytest.raises(NotFound):
        await client.pod_sandbox_status(unknown)


async def test_dead_socket_is_unavailable(tmp_path: Path) -> None:
    socket = tmp_path / "containerd.sock"
    client = RuntimeClient(str(socket), timeout=0.5)
    assert client.endpoint == f"unix://{socket}"
    started = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        await client.connect()
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert f"CRI runtime at unix://{socket} is unavailable" in message
    assert f"socket {socket} does not exist" in message
    assert caught.value.retryable
    socket.touch()  # a file nobody listens on
    with pytest.raises(Unavailable, match=f"socket {socket} exists"):
        await client.connect()


async def test_cancelled_call_leaves_client_usable(client: RuntimeClient, pods: Pods) -> None:
    sandbox_id, config = await pods.sandbox()
    container_id = await pods.container(sandbox_id, config, "sleep", "3600")
    with anyio.move_on_after(0.3) as scope:
        await client.exec_sync(container_id, ["sleep", "5"], timeout=10)
    assert scope.cancelled_caught
    assert (await client.container_status(container_id)).state == t.ContainerState.CONTAINER_RUNNING


# ------------------------------------------------------------------ reconnect


async def test_reconnects_after_containerd_restart(client: RuntimeClient, pods: Pods, containerd) -> None:  # type: ignore[no-untyped-def]
    sandbox_id, config = await pods.sandbox()
    container_id = await pods.container(sandbox_id, config, "sleep", "3600")
    before = client.runtime_version
    try:
        await anyio.to_thread.run_sync(containerd.restart)
        # Reads wait for the new connection; the sandbox and its container survive.
        status = await client.pod_sandbox_status(sandbox_id)
        assert status.state == t.PodSandboxState.SANDBOX_READY
        assert (await client.container_status(container_id)).state == t.ContainerState.CONTAINER_RUNNING
        # The first success after the connection broke re-ran the handshake.
        assert client.runtime_version is not None and client.runtime_version is not before
        result = await client.exec_sync(container_id, ["echo", "back"], timeout=10)
        assert result.stdout == b"back\n"
    finally:
        await anyio.to_thread.run_sync(containerd.start)  # idempotent; leaves it running


async def test_while_containerd_is_down_reads_wait_and_writes_fail_fast(client: RuntimeClient, containerd) -> None:  # type: ignore[no-untyped-def]
    try:
        await anyio.to_thread.run_sync(containerd.stop)
        started = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            await client.remove_pod_sandbox("0" * 64)
        assert time.monotonic() - started < 5
        assert containerd.socket_path in str(caught.value)

        listed: list[list[t.PodSandbox]] = []

        async def read() -> None:
            listed.append(await client.list_pod_sandbox())

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.sleep(0.5)
            assert not listed  # still waiting for the runtime
            await anyio.to_thread.run_sync(containerd.start)
        assert len(listed) == 1  # answered once containerd was back
    finally:
        await anyio.to_thread.run_sync(containerd.start)
