"""RuntimeClient: CRI v1 (RuntimeService + ImageService) over grpc.aio.

Why it looks like this:
  * Every RPC goes through `_unary` (or `container_events` for the one
    stream), and both through `_boundary`, the single place where gRPC
    status codes become cri.errors exceptions.
  * Deadlines follow the kubelet: one default per call (runtimeRequestTimeout,
    2 min), StopContainer gets default + grace, ExecSync default + its own
    timeout (none when the exec has none), PullImage none unless configured.
  * Reconnect: grpc channels reconnect by themselves; we only make the
    back-off short. Reads (`_READS`) wait for the channel to become ready
    within their deadline and retry Unavailable with exponential back-off,
    because repeating them is harmless. Mutations fail fast with Unavailable:
    whether to repeat a RunPodSandbox is the caller's decision. After an
    Unavailable the next successful call re-runs the Version handshake, since
    what answers after a reconnect may be a different runtime.
  * grpc.aio is asyncio-only: use anyio's asyncio backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Sequence
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, overload

import anyio
import anyio.lowlevel
import grpc
from google.protobuf.message import Message
from grpc import aio

from cri import errors
from cri import types as t
from cri._generated import api_pb2 as api
from cri.convert import from_proto, to_proto
from cri.grpcaio import caller_cancelled

M = TypeVar("M", bound=Message)

#: What we send in VersionRequest (the kubelet's kubeRuntimeAPIVersion).
CLIENT_API_VERSION = "0.1.0"
#: What a CRI v1 runtime answers in VersionResponse.runtime_api_version.
RUNTIME_API_VERSION = "v1"
DEFAULT_TIMEOUT = 120.0  # kubelet runtimeRequestTimeout
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # kubelet's maxMsgSize

_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Defaults are 1 s initial and 120 s max: after a runtime restart the
    # channel could sit in back-off for minutes. A unix socket connect is
    # cheap, so try often.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

# Idempotent, side-effect-free RPCs: wait for a connection, retry Unavailable.
_READS = frozenset({
    "Version", "Status", "RuntimeConfig",
    "ListPodSandbox", "PodSandboxStatus", "ListContainers", "ContainerStatus",
    "ContainerStats", "ListContainerStats", "PodSandboxStats", "ListPodSandboxStats",
    "ListImages", "ImageStatus", "ImageFsInfo",
})
_RETRY_FIRST_DELAY = 0.05
_RETRY_MAX_DELAY = 1.0
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_DEADLINE_SECONDS = 10 * 365 * 24 * 3600  # a deadline the clock can hold ("forever" enough)

# "/runtime.v1.RuntimeService/Version", ... straight from the schema.
_PATHS = {
    method.name: f"/{service.full_name}/{method.name}"
    for service in api.DESCRIPTOR.services_by_name.values()
    for method in service.methods
}


def grpc_target(endpoint: str) -> str:
    """The gRPC target for an endpoint: "unix:///path" as is, a bare path made absolute."""
    if endpoint.startswith("unix:"):
        return endpoint
    if "://" in endpoint:
        raise ValueError(f"unsupported CRI endpoint {endpoint!r}: use unix:///path or a socket path")
    return "unix://" + os.path.abspath(endpoint)


def _serialize(message: Message) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def _summary(message: api.ContainerEventResponse, whose: bool) -> t.ContainerEventSummary:
    """An event read as far as its container, type and time, and (``whose``) the identity of
    its sandbox (see container_events)."""
    identity = None
    if whose and message.HasField("pod_sandbox_status"):
        sandbox = message.pod_sandbox_status
        identity = t.PodSandboxIdentity(id=sandbox.id, metadata=from_proto(sandbox.metadata, t.PodSandboxMetadata),
                                        labels=dict(sandbox.labels))
    return t.ContainerEventSummary(container_id=message.container_id, created_at=message.created_at,
                                   container_event_type=t.ContainerEventType(message.container_event_type),
                                   pod_sandbox_status=identity)


def _with_statuses(message: api.ContainerEventResponse) -> t.ContainerEvent:
    """An event read with the sandbox's whole status and of the containers' only the one it
    names (none when it names the sandbox itself); see container_events."""
    sandbox = from_proto(message.pod_sandbox_status, t.PodSandboxStatus) if message.HasField("pod_sandbox_status") \
        else None
    return t.ContainerEvent(
        container_id=message.container_id, created_at=message.created_at,
        container_event_type=t.ContainerEventType(message.container_event_type), pod_sandbox_status=sandbox,
        containers_statuses=[from_proto(s, t.ContainerStatus) for s in message.containers_statuses
                             if s.id == message.container_id])


def _image_spec(image: str | t.ImageSpec) -> api.ImageSpec:
    spec = t.ImageSpec(image=image) if isinstance(image, str) else image
    return to_proto(spec, api.ImageSpec)


class RuntimeClient:
    """An async CRI v1 client for one runtime endpoint.

    Construction does no I/O; `connect()` (or `async with`) dials and checks
    that the runtime serves CRI v1. The client survives runtime restarts.
    """

    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT, *,
                 pull_timeout: float | None = None) -> None:
        self.endpoint = grpc_target(endpoint)
        self.timeout = timeout
        self.pull_timeout = pull_timeout
        self.runtime_version: t.VersionInfo | None = None  # from the last handshake
        self._channel: aio.Channel | None = None
        self._stubs: dict[str, Any] = {}
        self._version_stale = False
        self.observer: Callable[[str, float, bool], None] | None = None
        """Told of every unary call: (CRI method, seconds, failed)."""

    # ------------------------------------------------------------ lifecycle

    async def connect(self) -> t.VersionInfo:
        """Dial (if needed) and run the Version handshake; raise RuntimeVersionError
        when the runtime does not serve CRI v1."""
        if self._channel is None:
            self._channel = aio.insecure_channel(self.endpoint, options=_CHANNEL_OPTIONS)
            self._stubs = {}
        try:
            return await self._handshake()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        self._stubs = {}
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def _handshake(self) -> t.VersionInfo:
        try:
            response = await self._unary("Version", api.VersionRequest(version=CLIENT_API_VERSION),
                                         api.VersionResponse, timeout=self.timeout)
        except errors.Unimplemented as exc:
            raise errors.RuntimeVersionError(
                self.endpoint,
                f"Version answered UNIMPLEMENTED ({exc.details}); the runtime may serve only "
                f"v1alpha2 (containerd < 1.5?)", exc.code) from exc
        info = from_proto(response, t.VersionInfo)
        if info.runtime_api_version != RUNTIME_API_VERSION:
            raise errors.RuntimeVersionError(
                self.endpoint,
                f"{info.runtime_name} {info.runtime_version} answered runtime_api_version "
                f"{info.runtime_api_version!r}, expected {RUNTIME_API_VERSION!r}")
        self.runtime_version = info
        self._version_stale = False
        return info

    # ------------------------------------------------------------ the boundary

    @contextlib.asynccontextmanager
    async def _boundary(self, method: str) -> AsyncIterator[None]:
        """Turn gRPC failures into cri.errors, for every RPC."""
        try:
            yield
        except aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and not self._ready():
                # A read waited for a connection that never came: that is an
                # unreachable runtime, not a slow one.
                code = grpc.StatusCode.UNAVAILABLE
                details = f"no connection before the deadline ({details})"
            if code == grpc.StatusCode.UNAVAILABLE:
                self._version_stale = True
            raise errors.from_rpc_error(method, self.endpoint, code, details) from exc
        except asyncio.CancelledError:
            # grpc.aio's bare CancelledError (cri/grpcaio.py): the scope's own, or the call's.
            if not await caller_cancelled():
                raise errors.CriError(method, self.endpoint, grpc.StatusCode.CANCELLED,
                                      "call cancelled because the client was closed") from None
            raise

    def _ready(self) -> bool:
        channel = self._channel
        return channel is not None and channel.get_state() == grpc.ChannelConnectivity.READY

    def _stub(self, method: str, response_type: type[Message], *, stream: bool = False) -> Any:
        stub = self._stubs.get(method)
        if stub is None:
            if self._channel is None:
                raise RuntimeError(f"RuntimeClient for {self.endpoint} is not connected: "
                                   f"call connect() or use `async with`")
            factory = self._channel.unary_stream if stream else self._channel.unary_unary
            stub = self._stubs[method] = factory(
                _PATHS[method],
                request_serializer=_serialize,
                response_deserializer=response_type.FromString,
            )
        return stub

    async def _unary(self, method: str, request: Message, response_type: type[M], *,
                     timeout: float | None) -> M:
        """One unary RPC with deadline, read retries and the post-reconnect handshake."""
        read = method in _READS
        stub = self._stub(method, response_type)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = _RETRY_FIRST_DELAY
        if not self._ready():
            # Idle, connecting or broken: whoever answers may be a restarted (or
            # different) runtime, so re-check the version after this call.
            self._version_stale = True
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            begin = time.monotonic()
            try:
                async with self._boundary(method):
                    response: M = await stub(request, timeout=remaining, wait_for_ready=read)
                self._observe(method, begin, False)
                break
            except errors.Unavailable:
                self._observe(method, begin, True)
                if not read or (deadline is not None and deadline - time.monotonic() <= delay):
                    raise
                await anyio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_DELAY)
            except errors.CriError:
                self._observe(method, begin, True)
                raise
        if self._version_stale and method != "Version":
            await self._recheck_version()
        return response

    def _observe(self, method: str, begin: float, error: bool) -> None:
        """Every call, for the kubelet_runtime_operations_* metrics (the kubelet's instrumented
        runtime service); an observer that fails never fails the call."""
        if self.observer is not None:
            try:
                self.observer(method, time.monotonic() - begin, error)
            except Exception:  # noqa: BLE001 - metrics are best effort
                pass

    async def _recheck_version(self) -> None:
        self._version_stale = False  # one re-check at a time, not one per concurrent call
        try:
            await self._handshake()
        except errors.RuntimeVersionError:
            raise  # something that is not a CRI v1 runtime answers on the socket now
        except errors.CriError:
            # The call itself succeeded; do not fail it over the check. Try again
            # after the next successful call.
            self._version_stale = True

    # ------------------------------------------------------------ runtime

    async def version(self) -> t.VersionInfo:
        response = await self._unary("Version", api.VersionRequest(version=CLIENT_API_VERSION),
                                     api.VersionResponse, timeout=self.timeout)
        return from_proto(response, t.VersionInfo)

    @overload
    async def status(self, verbose: Literal[False] = False) -> t.RuntimeStatus: ...
    @overload
    async def status(self, verbose: Literal[True]) -> tuple[t.RuntimeStatus, dict[str, str]]: ...

    async def status(self, verbose: bool = False) -> t.RuntimeStatus | tuple[t.RuntimeStatus, dict[str, str]]:
        """Runtime conditions (RuntimeReady, NetworkReady); with verbose also the info map."""
        response = await self._unary("Status", api.StatusRequest(verbose=verbose), api.StatusResponse,
                                     timeout=self.timeout)
        status = from_proto(response.status, t.RuntimeStatus)
        return (status, dict(response.info)) if verbose else status

    async def capabilities(self) -> t.RuntimeCapabilities:
        """The runtime handlers and features of StatusResponse (fields 3 and 4): what the
        kubelet's Node status.runtimeHandlers and its user-namespace check read."""
        response = await self._unary("Status", api.StatusRequest(verbose=False), api.StatusResponse,
                                     timeout=self.timeout)
        return t.RuntimeCapabilities(
            runtime_handlers=[from_proto(h, t.RuntimeHandler) for h in response.runtime_handlers],
            features=from_proto(response.features, t.RuntimeFeatures) if response.HasField("features") else None)

    async def runtime_config(self) -> t.LinuxRuntimeConfiguration | None:
        """The runtime's cgroup driver (cri-api >= 0.28; Unimplemented on containerd 1.6)."""
        response = await self._unary("RuntimeConfig", api.RuntimeConfigRequest(), api.RuntimeConfigResponse,
                                     timeout=self.timeout)
        return from_proto(response.linux, t.LinuxRuntimeConfiguration) if response.HasField("linux") else None

    async def update_runtime_config(self, pod_cidr: str) -> None:
        request = api.UpdateRuntimeConfigRequest(
            runtime_config=api.RuntimeConfig(network_config=api.NetworkConfig(pod_cidr=pod_cidr)))
        await self._unary("UpdateRuntimeConfig", request, api.UpdateRuntimeConfigResponse, timeout=self.timeout)

    # ------------------------------------------------------------ pod sandboxes

    async def run_pod_sandbox(self, config: t.PodSandboxConfig, runtime_handler: str = "") -> str:
        """Create and start a sandbox; return its id."""
        request = api.RunPodSandboxRequest(config=to_proto(config, api.PodSandboxConfig),
                                           runtime_handler=runtime_handler)
        response = await self._unary("RunPodSandbox", request, api.RunPodSandboxResponse, timeout=self.timeout)
        return response.pod_sandbox_id

    async def stop_pod_sandbox(self, pod_sandbox_id: str) -> None:
        await self._unary("StopPodSandbox", api.StopPodSandboxRequest(pod_sandbox_id=pod_sandbox_id),
                          api.StopPodSandboxResponse, timeout=self.timeout)

    async def remove_pod_sandbox(self, pod_sandbox_id: str) -> None:
        await self._unary("RemovePodSandbox", api.RemovePodSandboxRequest(pod_sandbox_id=pod_sandbox_id),
                          api.RemovePodSandboxResponse, timeout=self.timeout)

    @overload
    async def pod_sandbox_status(self, pod_sandbox_id: str,
                                 verbose: Literal[False] = False) -> t.PodSandboxStatus: ...
    @overload
    async def pod_sandbox_status(self, pod_sandbox_id: str,
                                 verbose: Literal[True]) -> tuple[t.PodSandboxStatus, dict[str, str]]: ...

    async def pod_sandbox_status(self, pod_sandbox_id: str, verbose: bool = False
                                 ) -> t.PodSandboxStatus | tuple[t.PodSandboxStatus, dict[str, str]]:
        """Status of one sandbox (NotFound if unknown); with verbose also the info map."""
        request = api.PodSandboxStatusRequest(pod_sandbox_id=pod_sandbox_id, verbose=verbose)
        response = await self._unary("PodSandboxStatus", request, api.PodSandboxStatusResponse,
                                     timeout=self.timeout)
        status = from_proto(response.status, t.PodSandboxStatus)
        return (status, dict(response.info)) if verbose else status

    async def list_pod_sandbox(self, filter: t.PodSandboxFilter | None = None) -> list[t.PodSandbox]:
        request = api.ListPodSandboxRequest()
        if filter is not None:
            request.filter.CopyFrom(to_proto(filter, api.PodSandboxFilter))
        response = await self._unary("ListPodSandbox", request, api.ListPodSandboxResponse, timeout=self.timeout)
        return [from_proto(item, t.PodSandbox) for item in response.items]

    # ------------------------------------------------------------ containers

    async def create_container(self, pod_sandbox_id: str, config: t.ContainerConfig,
                               sandbox_config: t.PodSandboxConfig) -> str:
        """Create a container in a sandbox; return its id. sandbox_config must be the
        config the sandbox was run with (containerd takes log_directory from it)."""
        request = api.CreateContainerRequest(
            pod_sandbox_id=pod_sandbox_id,
            config=to_proto(config, api.ContainerConfig),
            sandbox_config=to_proto(sandbox_config, api.PodSandboxConfig),
        )
        response = await self._unary("CreateContainer", request, api.CreateContainerResponse, timeout=self.timeout)
        return response.container_id

    async def start_container(self, container_id: str) -> None:
        await self._unary("StartContainer", api.StartContainerRequest(container_id=container_id),
                          api.StartContainerResponse, timeout=self.timeout)

    async def stop_container(self, container_id: str, timeout: int) -> None:
        """Stop signal, then SIGKILL after `timeout` seconds; the deadline is default + timeout."""
        # A pod may ask for any int64 grace period: 2^63-1 among them, which the float it
        # travels as through the stop phase rounds up past int64.
        timeout = max(min(int(timeout), _INT64_MAX), _INT64_MIN)
        request = api.StopContainerRequest(container_id=container_id, timeout=timeout)
        await self._unary("StopContainer", request, api.StopContainerResponse,
                          timeout=self.timeout + min(max(timeout, 0), _MAX_DEADLINE_SECONDS))

    async def remove_container(self, container_id: str) -> None:
        await self._unary("RemoveContainer", api.RemoveContainerRequest(container_id=container_id),
                          api.RemoveContainerResponse, timeout=self.timeout)

    async def list_containers(self, filter: t.ContainerFilter | None = None) -> list[t.Container]:
        request = api.ListContainersRequest()
        if filter is not None:
            request.filter.CopyFrom(to_proto(filter, api.ContainerFilter))
        response = await self._unary("ListContainers", request, api.ListContainersResponse, timeout=self.timeout)
        return [from_proto(item, t.Container) for item in response.containers]

    @overload
    async def container_status(self, container_id: str,
                               verbose: Literal[False] = False) -> t.ContainerStatus: ...
    @overload
    async def container_status(self, container_id: str,
                               verbose: Literal[True]) -> tuple[t.ContainerStatus, dict[str, str]]: ...

    async def container_status(self, container_id: str, verbose: bool = False
                               ) -> t.ContainerStatus | tuple[t.ContainerStatus, dict[str, str]]:
        """Status of one container (NotFound if unknown); with verbose also the info map."""
        request = api.ContainerStatusRequest(container_id=container_id, verbose=verbose)
        response = await self._unary("ContainerStatus", request, api.ContainerStatusResponse, timeout=self.timeout)
        status = from_proto(response.status, t.ContainerStatus)
        return (status, dict(response.info)) if verbose else status

    async def update_container_resources(self, container_id: str, linux: t.LinuxContainerResources,
                                         annotations: dict[str, str] | None = None) -> None:
        request = api.UpdateContainerResourcesRequest(
            container_id=container_id,
            linux=to_proto(linux, api.LinuxContainerResources),
            annotations=annotations or {},
        )
        await self._unary("UpdateContainerResources", request, api.UpdateContainerResourcesResponse,
                          timeout=self.timeout)

    async def update_pod_sandbox_resources(self, sandbox_id: str, resources: t.LinuxContainerResources,
                                           overhead: t.LinuxContainerResources | None = None) -> None:
        """The sandbox's resources after a pod-level resize (cri-api >= 0.33; containerd 2.x
        records them and tells NRI plugins; Unimplemented on 1.6)."""
        request = api.UpdatePodSandboxResourcesRequest(
            pod_sandbox_id=sandbox_id, resources=to_proto(resources, api.LinuxContainerResources))
        if overhead is not None:
            request.overhead.CopyFrom(to_proto(overhead, api.LinuxContainerResources))
        await self._unary("UpdatePodSandboxResources", request, api.UpdatePodSandboxResourcesResponse,
                          timeout=self.timeout)

    async def reopen_container_log(self, container_id: str) -> None:
        await self._unary("ReopenContainerLog", api.ReopenContainerLogRequest(container_id=container_id),
                          api.ReopenContainerLogResponse, timeout=self.timeout)

    # ------------------------------------------------------------ exec, attach, port-forward

    async def exec_sync(self, container_id: str, cmd: Sequence[str], timeout: int = 0) -> t.ExecSyncResult:
        """Run cmd in the container and wait for it. timeout (s) is the command's limit,
        enforced by the runtime; 0 = none, and then the call has no deadline either."""
        request = api.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout)
        deadline = self.timeout + timeout if timeout > 0 else None
        response = await self._unary("ExecSync", request, api.ExecSyncResponse, timeout=deadline)
        return from_proto(response, t.ExecSyncResult)

    async def exec(self, request: t.ExecRequest) -> str:
        """URL of the runtime's streaming server for this exec session."""
        response = await self._unary("Exec", to_proto(request, api.ExecRequest), api.ExecResponse,
                                     timeout=self.timeout)
        return response.url

    async def attach(self, request: t.AttachRequest) -> str:
        response = await self._unary("Attach", to_proto(request, api.AttachRequest), api.AttachResponse,
                                     timeout=self.timeout)
        return response.url

    async def port_forward(self, pod_sandbox_id: str, ports: Sequence[int]) -> str:
        request = api.PortForwardRequest(pod_sandbox_id=pod_sandbox_id, port=list(ports))
        response = await self._unary("PortForward", request, api.PortForwardResponse, timeout=self.timeout)
        return response.url

    # ------------------------------------------------------------ stats

    async def container_stats(self, container_id: str) -> t.ContainerStats:
        response = await self._unary("ContainerStats", api.ContainerStatsRequest(container_id=container_id),
                                     api.ContainerStatsResponse, timeout=self.timeout)
        return from_proto(response.stats, t.ContainerStats)

    async def list_container_stats(self, filter: t.ContainerStatsFilter | None = None) -> list[t.ContainerStats]:
        request = api.ListContainerStatsRequest()
        if filter is not None:
            request.filter.CopyFrom(to_proto(filter, api.ContainerStatsFilter))
        response = await self._unary("ListContainerStats", request, api.ListContainerStatsResponse,
                                     timeout=self.timeout)
        return [from_proto(item, t.ContainerStats) for item in response.stats]

    async def pod_sandbox_stats(self, pod_sandbox_id: str) -> t.PodSandboxStats:
        response = await self._unary("PodSandboxStats", api.PodSandboxStatsRequest(pod_sandbox_id=pod_sandbox_id),
                                     api.PodSandboxStatsResponse, timeout=self.timeout)
        return from_proto(response.stats, t.PodSandboxStats)

    async def list_pod_sandbox_stats(self, filter: t.PodSandboxStatsFilter | None = None
                                     ) -> list[t.PodSandboxStats]:
        request = api.ListPodSandboxStatsRequest()
        if filter is not None:
            request.filter.CopyFrom(to_proto(filter, api.PodSandboxStatsFilter))
        response = await self._unary("ListPodSandboxStats", request, api.ListPodSandboxStatsResponse,
                                     timeout=self.timeout)
        return [from_proto(item, t.PodSandboxStats) for item in response.stats]

    # ------------------------------------------------------------ events

    @overload
    def container_events(self, summary: Literal[False] = False) -> AsyncGenerator[t.ContainerEvent, None]: ...
    @overload
    def container_events(self, summary: Literal[True], *,
                         whose: Collection[t.ContainerEventType] | None = None,
                         statuses: Collection[t.ContainerEventType] = ()
                         ) -> AsyncGenerator[t.ContainerEventSummary | t.ContainerEvent, None]: ...

    async def container_events(self, summary: bool = False, *,
                               whose: Collection[t.ContainerEventType] | None = None,
                               statuses: Collection[t.ContainerEventType] = ()
                               ) -> AsyncGenerator[t.ContainerEvent | t.ContainerEventSummary, None]:
        """Container lifecycle events as the runtime reports them, until the stream
        ends or the caller stops iterating (aclose() it, or use contextlib.aclosing,
        to end the RPC promptly). No deadline; no retry (the caller relists
        after a broken stream, as the kubelet's Evented PLEG does). containerd 1.6
        raises Unimplemented on the first iteration. With summary, each event is read
        only as far as saying which container and whose sandbox (the statuses it
        carries are skipped); ``whose``: only events of these types say whose sandbox,
        the others come with their container, type and time alone (reading the sandbox's
        labels out of every creation and start was a relister's largest cost per event);
        ``statuses``: events of these types come whole instead (ContainerEvent), with the
        sandbox's status and, of the containers', only the named one's (containerd reads every
        container of the sandbox into each event)."""
        stub = self._stub("GetContainerEvents", api.ContainerEventResponse, stream=True)
        call = stub(api.GetEventsRequest(), timeout=None, wait_for_ready=False)
        try:
            async with self._boundary("GetContainerEvents"):
                async for message in call:
                    if summary and message.container_event_type in statuses:
                        yield _with_statuses(message)
                        continue
                    if summary:
                        yield _summary(message, whose is None or message.container_event_type in whose)
                        continue
                    yield from_proto(message, t.ContainerEvent)
        finally:
            call.cancel()

    # ------------------------------------------------------------ images

    async def list_images(self, filter: t.ImageFilter | None = None) -> list[t.Image]:
        request = api.ListImagesRequest()
        if filter is not None:
            request.filter.CopyFrom(to_proto(filter, api.ImageFilter))
        response = await self._unary("ListImages", request, api.ListImagesResponse, timeout=self.timeout)
        return [from_proto(item, t.Image) for item in response.images]

    async def image_status(self, image: str | t.ImageSpec) -> t.Image | None:
        """The image, or None when the runtime does not have it."""
        response = await self._unary("ImageStatus", api.ImageStatusRequest(image=_image_spec(image)),
                                     api.ImageStatusResponse, timeout=self.timeout)
        return from_proto(response.image, t.Image) if response.HasField("image") else None

    async def pull_image(self, image: str | t.ImageSpec, sandbox_config: t.PodSandboxConfig | None = None,
                         auth: t.AuthConfig | None = None) -> str:
        """Pull (a present image is not fetched again by containerd); return the image ref (ID)."""
        request = api.PullImageRequest(image=_image_spec(image))
        if sandbox_config is not None:
            request.sandbox_config.CopyFrom(to_proto(sandbox_config, api.PodSandboxConfig))
        if auth is not None:
            request.auth.CopyFrom(to_proto(auth, api.AuthConfig))
        response = await self._unary("PullImage", request, api.PullImageResponse, timeout=self.pull_timeout)
        return response.image_ref

    async def remove_image(self, image: str | t.ImageSpec) -> None:
        await self._unary("RemoveImage", api.RemoveImageRequest(image=_image_spec(image)),
                          api.RemoveImageResponse, timeout=self.timeout)

    async def image_fs_info(self) -> list[t.FilesystemUsage]:
        response = await self._unary("ImageFsInfo", api.ImageFsInfoRequest(), api.ImageFsInfoResponse,
                                     timeout=self.timeout)
        return [from_proto(item, t.FilesystemUsage) for item in response.image_filesystems]
