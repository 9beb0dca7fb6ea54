"""RuntimeClient behaviour that the real containerd cannot show on demand:
version refusal, injected failures, deadlines, cancellation, events.

A fake CRI server (grpc.aio on a unix socket, our generated servicers) stands
in for the runtime.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest

from cri import (
    CriError,
    DeadlineExceeded,
    RuntimeClient,
    RuntimeVersionError,
    Unavailable,
    errors,
)
from cri import types as t
from cri._generated import api_pb2 as api
from cri._generated import api_pb2_grpc as api_grpc

pytestmark = pytest.mark.anyio


class FakeRuntime(api_grpc.RuntimeServiceServicer):
    """Records every call (name, request, deadline left) and fails on request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, float | None]] = []
        self.failures: dict[str, list[grpc.StatusCode | tuple[grpc.StatusCode, str]]] = {}
        """Per method, the failures its next calls answer: a code, or a code and its message."""
        self.api_version = "v1"
        self.delay = 0.0
        self.cancelled = anyio.Event()

    def names(self) -> list[str]:
        return [name for name, _, _ in self.calls]

    async def _enter(self, name: str, request: Any, context: Any) -> None:
        self.calls.append((name, request, context.time_remaining()))
        pending = self.failures.get(name)
        if pending:
            failure = pending.pop(0)
            code, message = failure if isinstance(failure, tuple) else (failure, f"injected failure of {name}")
            await context.abort(code, message)
        if self.delay:
            try:
                await anyio.sleep(self.delay)
            except BaseException:
                self.cancelled.set()
                raise

    async def Version(self, request: api.VersionRequest, context: Any) -> api.VersionResponse:
        await self._enter("Version", request, context)
        return api.VersionResponse(version="0.1.0", runtime_name="fake", runtime_version="9.9",
                                   runtime_api_version=self.api_version)

    async def RunPodSandbox(self, request: api.RunPodSandboxRequest, context: Any) -> api.RunPodSandboxResponse:
        await self._enter("RunPodSandbox", request, context)
        return api.RunPodSandboxResponse(pod_sandbox_id="sandbox-1")

    async def CreateContainer(self, request: api.CreateContainerRequest, context: Any) -> api.CreateContainerResponse:
        await self._enter("CreateContainer", request, context)
        return api.CreateContainerResponse(container_id="container-1")

    async def StopContainer(self, request: api.StopContainerRequest, context: Any) -> api.StopContainerResponse:
        await self._enter("StopContainer", request, context)
        return api.StopContainerResponse()

    async def ListPodSandbox(self, request: api.ListPodSandboxRequest, context: Any) -> api.ListPodSandboxResponse:
        await self._enter("ListPodSandbox", request, context)
        return api.ListPodSandboxResponse(items=[api.PodSandbox(id="sandbox-1", state=api.SANDBOX_NOTREADY)])

    async def ListContainers(self, request: api.ListContainersRequest, context: Any) -> api.ListContainersResponse:
        await self._enter("ListContainers", request, context)
        return api.ListContainersResponse()

    async def ContainerStatus(self, request: api.ContainerStatusRequest, context: Any) -> api.ContainerStatusResponse:
        await self._enter("ContainerStatus", request, context)
        return api.ContainerStatusResponse(status=api.ContainerStatus(id=request.container_id),
                                           info={"pid": "1"} if request.verbose else {})

    async def ExecSync(self, request: api.ExecSyncRequest, context: Any) -> api.ExecSyncResponse:
        await self._enter("ExecSync", request, context)
        return api.ExecSyncResponse(stdout=b"out", exit_code=0)

    async def GetContainerEvents(self, request: api.GetEventsRequest, context: Any) -> AsyncIterator[api.ContainerEventResponse]:
        await self._enter("GetContainerEvents", request, context)
        for event_type in (api.CONTAINER_CREATED_EVENT, api.CONTAINER_STARTED_EVENT):
            yield api.ContainerEventResponse(
                container_id="container-1", container_event_type=event_type, created_at=1,
                pod_sandbox_status=api.PodSandboxStatus(id="sandbox-1"),
                containers_statuses=[api.ContainerStatus(id="container-1", state=api.CONTAINER_RUNNING)])


class FakeImages(api_grpc.ImageServiceServicer):
    def __init__(self, runtime: FakeRuntime) -> None:
        self.runtime = runtime

    async def PullImage(self, request: api.PullImageRequest, context: Any) -> api.PullImageResponse:
        await self.runtime._enter("PullImage", request, context)
        return api.PullImageResponse(image_ref="sha256:abc")

    async def ImageStatus(self, request: api.ImageStatusRequest, context: Any) -> api.ImageStatusResponse:
        await self.runtime._enter("ImageStatus", request, context)
        return api.ImageStatusResponse()


async def serve(socket: Path, runtime: FakeRuntime | None) -> grpc.aio.Server:
    server = grpc.aio.server()
    if runtime is not None:
        api_grpc.add_RuntimeServiceServicer_to_server(runtime, server)  # type: ignore[no-untyped-call]
        api_grpc.add_ImageServiceServicer_to_server(FakeImages(runtime), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[FakeRuntime, str]]:
    runtime = FakeRuntime()
    socket = tmp_path / "fake.sock"
    server = await serve(socket, runtime)
    try:
        yield runtime, str(socket)
    finally:
        await server.stop(grace=None)


# ------------------------------------------------------------------ handshake


async def test_runtime_without_v1_is_refused(tmp_path: Path) -> None:
    """A runtime serving only v1alpha2 answers UNIMPLEMENTED for /runtime.v1.*."""
    socket = tmp_path / "old.sock"
    server = await serve(socket, None)
    try:
        client = RuntimeClient(str(socket), timeout=5)
        with pytest.raises(RuntimeVersionError) as caught:
            await client.connect()
        assert f"unix://{socket}" in str(caught.value) and "v1alpha2" in str(caught.value)
        assert isinstance(caught.value, CriError) and not caught.value.retryable
    finally:
        await server.stop(grace=None)


async def test_runtime_reporting_another_api_version_is_refused(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    runtime.api_version = "v1alpha2"
    with pytest.raises(RuntimeVersionError, match="runtime_api_version 'v1alpha2'"):
        await RuntimeClient(socket, timeout=5).connect()


async def test_client_needs_connect(fake: tuple[FakeRuntime, str]) -> None:
    _, socket = fake
    client = RuntimeClient(socket)  # no I/O yet
    with pytest.raises(RuntimeError, match="not connected"):
        await client.list_pod_sandbox()
    async with client:
        assert client.runtime_version is not None and client.runtime_version.runtime_name == "fake"
        assert await client.list_pod_sandbox() == [t.PodSandbox(id="sandbox-1", state=t.PodSandboxState.SANDBOX_NOTREADY)]


# ------------------------------------------------------------------ retries and re-check


async def test_reads_retry_unavailable_and_recheck_version(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    async with RuntimeClient(socket, timeout=5) as client:
        runtime.failures["ListPodSandbox"] = [grpc.StatusCode.UNAVAILABLE] * 2
        runtime.calls.clear()
        assert len(await client.list_pod_sandbox()) == 1
        # Two failures, one success, then the handshake once more.
        assert runtime.names() == ["ListPodSandbox"] * 3 + ["Version"]
        runtime.calls.clear()
        await client.list_pod_sandbox()
        assert runtime.names() == ["ListPodSandbox"]


async def test_a_runtime_still_starting_is_unavailable_so_reads_wait_for_it(fake: tuple[FakeRuntime, str]) -> None:
    """containerd's CRI answers UNKNOWN "server is not initialized yet" while it starts (seen on
    1.6 in CI, right after a restart): the runtime is not there yet, as with no socket at all."""
    runtime, socket = fake
    starting = (grpc.StatusCode.UNKNOWN, "server is not initialized yet")
    async with RuntimeClient(socket, timeout=5) as client:
        runtime.failures["ListPodSandbox"] = [starting, starting]
        runtime.calls.clear()
        assert len(await client.list_pod_sandbox()) == 1
        assert runtime.names() == ["ListPodSandbox"] * 3
        runtime.failures["RunPodSandbox"] = [starting]
        with pytest.raises(Unavailable) as caught:
            await client.run_pod_sandbox(t.PodSandboxConfig())
        assert caught.value.code == grpc.StatusCode.UNKNOWN and caught.value.retryable
        # Any other UNKNOWN stays what it is.
        runtime.failures["ContainerStatus"] = [(grpc.StatusCode.UNKNOWN, "something else")]
        with pytest.raises(errors.Unknown):
            await client.container_status("c")


async def test_reads_give_up_at_their_deadline(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    async with RuntimeClient(socket, timeout=0.5) as client:
        runtime.failures["ListPodSandbox"] = [grpc.StatusCode.UNAVAILABLE] * 1000
        started = time.monotonic()
        with pytest.raises(Unavailable):
            await client.list_pod_sandbox()
        assert 0.3 < time.monotonic() - started < 2


async def test_writes_fail_fast_on_unavailable(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    async with RuntimeClient(socket, timeout=5) as client:
        runtime.failures["RunPodSandbox"] = [grpc.StatusCode.UNAVAILABLE]
        runtime.calls.clear()
        with pytest.raises(Unavailable) as caught:
            await client.run_pod_sandbox(t.PodSandboxConfig())
        assert caught.value.retryable and caught.value.method == "RunPodSandbox"
        assert f"socket {socket} exists" in str(caught.value)
        assert runtime.names() == ["RunPodSandbox"]
        assert await client.run_pod_sandbox(t.PodSandboxConfig()) == "sandbox-1"
        assert runtime.names() == ["RunPodSandbox", "RunPodSandbox", "Version"]


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c != grpc.StatusCode.OK])
async def test_every_status_code_maps_to_its_error(fake: tuple[FakeRuntime, str], code: grpc.StatusCode) -> None:
    runtime, socket = fake
    async with RuntimeClient(socket, timeout=5) as client:
        runtime.failures["ContainerStatus"] = [code]
        # Reads retry Unavailable; give it only that one failure, so use a write for it.
        method = client.container_status if code != grpc.StatusCode.UNAVAILABLE else None
        if method is None:
            runtime.failures["ContainerStatus"] = []
            runtime.failures["CreateContainer"] = [code]
        with pytest.raises(CriError) as caught:
            if method is None:
                await client.create_container("s", t.ContainerConfig(), t.PodSandboxConfig())
            else:
                await client.container_status("c")
        assert type(caught.value) is errors.error_class(code)
        assert caught.value.code == code and "injected failure" in caught.value.details
        assert caught.value.retryable == (code in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                                   grpc.StatusCode.RESOURCE_EXHAUSTED})


# ------------------------------------------------------------------ deadlines and requests


async def test_deadlines_follow_the_kubelet(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    async with RuntimeClient(socket, timeout=10) as client:
        runtime.calls.clear()
        await client.list_containers()
        await client.stop_container("c", timeout=30)
        await client.exec_sync("c", ["true"], timeout=5)
        await client.exec_sync("c", ["true"])
        await client.pull_image("busybox")
    remaining = {name: left or 0.0 for name, _, left in runtime.calls[:3]}
    assert 9 < remaining["ListContainers"] < 10.5  # grpc rounds the timeout up
    assert 39 < remaining["StopContainer"] < 40.5
    assert 14 < remaining["ExecSync"] < 15.5
    assert runtime.calls[3][2] is None  # exec without a timeout: no deadline
    assert runtime.calls[4][2] is None  # pulls have no deadline by default

    async with RuntimeClient(socket, timeout=10, pull_timeout=600) as client:
        runtime.calls.clear()
        await client.pull_image("busybox")
    assert runtime.calls[0][2] is not None and 590 < runtime.calls[0][2] < 602


async def test_slow_runtime_raises_deadline_exceeded(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    async with RuntimeClient(socket, timeout=0.3) as client:
        runtime.delay = 5
        with pytest.raises(DeadlineExceeded) as caught:
            await client.list_containers()
        assert caught.value.retryable


async def test_requests_carry_every_field(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    sandbox = t.PodSandboxConfig(
        metadata=t.PodSandboxMetadata(name="p", uid="u", namespace="n", attempt=2),
        labels={"a": "b"},
        linux=t.LinuxPodSandboxConfig(security_context=t.LinuxSandboxSecurityContext(
            run_as_user=0, namespace_options=t.NamespaceOption(network=t.NamespaceMode.NODE))),
    )
    container = t.ContainerConfig(
        metadata=t.ContainerMetadata(name="c", attempt=1),
        image=t.ImageSpec(image="busybox", user_specified_image="busybox:1.36"),
        envs={"B": "2", "A": "1"},
        cdi_devices=[t.CDIDevice(name="vendor.com/gpu=0")],
        stop_signal=t.Signal.SIGUSR1,
    )
    async with RuntimeClient(socket, timeout=5) as client:
        assert await client.run_pod_sandbox(sandbox, runtime_handler="crun") == "sandbox-1"
        assert await client.create_container("sandbox-1", container, sandbox) == "container-1"
        assert await client.pull_image(t.ImageSpec(image="busybox", runtime_handler="crun"), sandbox,
                                       auth=t.AuthConfig(username="u", password="p")) == "sha256:abc"
        assert await client.image_status("busybox") is None
    requests = {name: request for name, request, _ in runtime.calls}
    run = requests["RunPodSandbox"]
    assert run.runtime_handler == "crun" and run.config.metadata.attempt == 2
    assert run.config.linux.security_context.HasField("run_as_user")  # 0 is sent, not dropped
    assert run.config.linux.security_context.namespace_options.network == api.NODE
    create = requests["CreateContainer"]
    assert [(kv.key, kv.value) for kv in create.config.envs] == [("B", "2"), ("A", "1")]
    assert [d.name for d in create.config.CDI_devices] == ["vendor.com/gpu=0"]
    assert create.config.stop_signal == api.SIGUSR1
    assert create.sandbox_config.metadata.name == "p"
    pull = requests["PullImage"]
    assert pull.image.runtime_handler == "crun" and pull.auth.password == "p"
    assert pull.sandbox_config.labels == {"a": "b"}


async def test_verbose_status_returns_info(fake: tuple[FakeRuntime, str]) -> None:
    _, socket = fake
    async with RuntimeClient(socket, timeout=5) as client:
        status, info = await client.container_status("c", verbose=True)
        assert status.id == "c" and info == {"pid": "1"}
        assert (await client.container_status("c")).id == "c"


# ------------------------------------------------------------------ cancellation and streams


async def test_cancel_scope_cancels_the_call(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    async with RuntimeClient(socket, timeout=30) as client:
        runtime.delay = 10
        started = time.monotonic()
        with anyio.move_on_after(0.2) as scope:
            await client.list_containers()
        assert scope.cancelled_caught and time.monotonic() - started < 2
        with anyio.fail_after(5):
            await runtime.cancelled.wait()  # the server saw the RPC cancelled
        runtime.delay = 0
        assert await client.list_containers() == []


async def test_cancel_scope_cancels_a_write(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    async with RuntimeClient(socket, timeout=30) as client:
        runtime.delay = 10
        with anyio.move_on_after(0.2) as scope:
            await client.stop_container("c", timeout=1)
        assert scope.cancelled_caught


async def test_closing_the_client_fails_calls_in_flight(fake: tuple[FakeRuntime, str]) -> None:
    runtime, socket = fake
    client = RuntimeClient(socket, timeout=30)
    await client.connect()
    runtime.delay = 10
    failures: list[CriError] = []

    async def call() -> None:
        try:
            await client.list_containers()
        except CriError as exc:
            failures.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.sleep(0.2)
            await client.close()
    assert len(failures) == 1 and failures[0].code == grpc.StatusCode.CANCELLED


async def test_container_events_stream(fake: tuple[FakeRuntime, str]) -> None:
    _, socket = fake
    async with RuntimeClient(socket, timeout=5) as client:
        events = [event async for event in client.container_events()]
    assert [e.container_event_type for e in events] == [
        t.ContainerEventType.CONTAINER_CREATED_EVENT, t.ContainerEventType.CONTAINER_STARTED_EVENT]
    assert events[0].pod_sandbox_status == t.PodSandboxStatus(id="sandbox-1")
    assert events[0].containers_statuses[0].state == t.ContainerState.CONTAINER_RUNNING


async def test_unimplemented_rpc(fake: tuple[FakeRuntime, str]) -> None:
    _, socket = fake
    async with RuntimeClient(socket, timeout=5) as client:
        with pytest.raises(errors.Unimplemented):
            await client.runtime_config()
