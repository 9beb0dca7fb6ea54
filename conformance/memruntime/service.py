"""The gRPC face of the memory runtime: our generated RuntimeService and ImageService servicers.

Each handler records the call, applies the armed faults (before the runtime acts and after),
asks :class:`~conformance.memruntime.runtime.RuntimeState` and turns a
:class:`~conformance.memruntime.runtime.CriFailure` into the gRPC status containerd answers. A
caller that goes away (cancellation, deadline) cancels the handler, as with any gRPC server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from conformance.memruntime.faults import Call, Faults
from conformance.memruntime.images import PullError
from conformance.memruntime.runtime import CriFailure, RuntimeState
from cri._generated import api_pb2 as api
from cri._generated import api_pb2_grpc as api_grpc

RUNTIME_API_VERSION = "v1"


class _Calls:
    """The part both servicers share: the call log, faults and error mapping."""

    def __init__(self, state: RuntimeState, faults: Faults) -> None:
        self.state = state
        self.faults = faults

    @asynccontextmanager
    async def call(self, method: str, request: Any, context: Any, *, before: bool = True) -> AsyncIterator[Call]:
        call = Call(method, request, self.state.pod_of(method, request))
        self.faults.log.append(call)
        try:
            if before:
                await self.faults.apply(call, "before", context)
            try:
                yield call
            except CriFailure as exc:
                call.code = exc.code
                await context.abort(exc.code, exc.message)
            await self.faults.apply(call, "after", context)
        except asyncio.CancelledError:
            call.cancelled = True
            raise


class RuntimeService(api_grpc.RuntimeServiceServicer):
    def __init__(self, calls: _Calls, *, name: str, version: str, runtime_config: bool,
                 network_ready: bool = True) -> None:
        self._calls = calls
        self._state = calls.state
        self.runtime_name = name
        self.runtime_version = version
        self.runtime_config = runtime_config
        """False: RuntimeConfig is Unimplemented (containerd 1.6)."""
        self.network_ready = network_ready

    # --- version and status ---------------------------------------------------------------

    async def Version(self, request: api.VersionRequest, context: Any) -> api.VersionResponse:
        async with self._calls.call("Version", request, context):
            return api.VersionResponse(version="0.1.0", runtime_name=self.runtime_name,
                                       runtime_version=self.runtime_version,
                                       runtime_api_version=RUNTIME_API_VERSION)

    async def Status(self, request: api.StatusRequest, context: Any) -> api.StatusResponse:
        async with self._calls.call("Status", request, context):
            network = api.RuntimeCondition(type="NetworkReady", status=self.network_ready)
            if not self.network_ready:
                network.reason = "NetworkPluginNotReady"
                network.message = "Network plugin returns error: cni plugin not initialized"
            conditions = [api.RuntimeCondition(type="RuntimeReady", status=True), network]
            if self._state.flavour == "2.x":
                conditions.append(api.RuntimeCondition(type="ContainerdHasNoDeprecationWarnings", status=True))
            response = api.StatusResponse(status=api.RuntimeStatus(conditions=conditions))
            for handler in sorted(self._state.handlers):
                response.runtime_handlers.add(name=handler)
            if request.verbose:
                response.info["config"] = '{"runtime":"memory"}'
            return response

    async def RuntimeConfig(self, request: api.RuntimeConfigRequest, context: Any) -> api.RuntimeConfigResponse:
        async with self._calls.call("RuntimeConfig", request, context):
            if not self.runtime_config or self._state.flavour == "1.6":
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method RuntimeConfig")
            return api.RuntimeConfigResponse(linux=api.LinuxRuntimeConfiguration(cgroup_driver=api.CGROUPFS))

    async def UpdateRuntimeConfig(self, request: api.UpdateRuntimeConfigRequest,
                                  context: Any) -> api.UpdateRuntimeConfigResponse:
        async with self._calls.call("UpdateRuntimeConfig", request, context):
            return api.UpdateRuntimeConfigResponse()

    # --- sandboxes ----------------------------------------------------------------------

    async def RunPodSandbox(self, request: api.RunPodSandboxRequest, context: Any) -> api.RunPodSandboxResponse:
        async with self._calls.call("RunPodSandbox", request, context):
            sandbox = self._state.run_pod_sandbox(request.config, request.runtime_handler)
        return api.RunPodSandboxResponse(pod_sandbox_id=sandbox.id)

    async def StopPodSandbox(self, request: api.StopPodSandboxRequest, context: Any) -> api.StopPodSandboxResponse:
        async with self._calls.call("StopPodSandbox", request, context):
            await self._state.stop_pod_sandbox(request.pod_sandbox_id)
        return api.StopPodSandboxResponse()

    async def RemovePodSandbox(self, request: api.RemovePodSandboxRequest,
                               context: Any) -> api.RemovePodSandboxResponse:
        async with self._calls.call("RemovePodSandbox", request, context):
            await self._state.remove_pod_sandbox(request.pod_sandbox_id)
        return api.RemovePodSandboxResponse()

    async def PodSandboxStatus(self, request: api.PodSandboxStatusRequest,
                               context: Any) -> api.PodSandboxStatusResponse:
        async with self._calls.call("PodSandboxStatus", request, context):
            sandbox = self._state.sandbox(request.pod_sandbox_id)
            response = api.PodSandboxStatusResponse(status=self._state.sandbox_status(sandbox),
                                                    timestamp=time.time_ns())
            if request.verbose:
                response.info.update(self._state.sandbox_info(sandbox))
        return response

    async def ListPodSandbox(self, request: api.ListPodSandboxRequest, context: Any) -> api.ListPodSandboxResponse:
        async with self._calls.call("ListPodSandbox", request, context):
            found = self._state.list_pod_sandbox(request.filter if request.HasField("filter") else None)
            items = []
            for sandbox in found:
                item = api.PodSandbox(id=sandbox.id, state=sandbox.state, created_at=sandbox.created_at,  # type: ignore[arg-type]  # a proto enum is an int
                                      labels=dict(sandbox.config.labels),
                                      annotations=dict(sandbox.config.annotations),
                                      runtime_handler=sandbox.runtime_handler)
                item.metadata.CopyFrom(sandbox.config.metadata)
                items.append(item)
        return api.ListPodSandboxResponse(items=items)

    # --- containers ---------------------------------------------------------------------

    async def CreateContainer(self, request: api.CreateContainerRequest,
                              context: Any) -> api.CreateContainerResponse:
        async with self._calls.call("CreateContainer", request, context):
            container = self._state.create_container(request.pod_sandbox_id, request.config, request.sandbox_config)
        return api.CreateContainerResponse(container_id=container.id)

    async def StartContainer(self, request: api.StartContainerRequest, context: Any) -> api.StartContainerResponse:
        # "before" faults hold the call inside containerd's starting window: a caller cancelled
        # there leaves the container exited with "context canceled", as containerd does.
        async with self._calls.call("StartContainer", request, context, before=False) as call:
            await self._state.start_container(
                request.container_id, hold=lambda: self._calls.faults.apply(call, "before", context))
        return api.StartContainerResponse()

    async def StopContainer(self, request: api.StopContainerRequest, context: Any) -> api.StopContainerResponse:
        async with self._calls.call("StopContainer", request, context):
            await self._state.stop_container(request.container_id, int(request.timeout))
        return api.StopContainerResponse()

    async def RemoveContainer(self, request: api.RemoveContainerRequest,
                              context: Any) -> api.RemoveContainerResponse:
        async with self._calls.call("RemoveContainer", request, context):
            await self._state.remove_container(request.container_id)
        return api.RemoveContainerResponse()

    async def ListContainers(self, request: api.ListContainersRequest, context: Any) -> api.ListContainersResponse:
        async with self._calls.call("ListContainers", request, context):
            found = self._state.list_containers(request.filter if request.HasField("filter") else None)
            containers = [self._state.container_summary(c) for c in found]
        return api.ListContainersResponse(containers=containers)

    async def ContainerStatus(self, request: api.ContainerStatusRequest,
                              context: Any) -> api.ContainerStatusResponse:
        async with self._calls.call("ContainerStatus", request, context):
            container = self._state.container(request.container_id)
            response = api.ContainerStatusResponse(status=self._state.container_status(container))
            if request.verbose:
                response.info.update(self._state.container_info(container))
        return response

    async def UpdateContainerResources(self, request: api.UpdateContainerResourcesRequest,
                                       context: Any) -> api.UpdateContainerResourcesResponse:
        async with self._calls.call("UpdateContainerResources", request, context):
            self._state.update_container_resources(request.container_id, request.linux)
        return api.UpdateContainerResourcesResponse()

    async def ReopenContainerLog(self, request: api.ReopenContainerLogRequest,
                                 context: Any) -> api.ReopenContainerLogResponse:
        async with self._calls.call("ReopenContainerLog", request, context):
            self._state.reopen_container_log(request.container_id)
        return api.ReopenContainerLogResponse()

    async def ExecSync(self, request: api.ExecSyncRequest, context: Any) -> api.ExecSyncResponse:
        async with self._calls.call("ExecSync", request, context):
            response = await self._state.exec_sync(request.container_id, list(request.cmd), int(request.timeout))
        return response

    async def Exec(self, request: api.ExecRequest, context: Any) -> api.ExecResponse:
        async with self._calls.call("Exec", request, context):
            self._state.container(request.container_id)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the memory runtime has no streaming server")
        return api.ExecResponse()

    async def Attach(self, request: api.AttachRequest, context: Any) -> api.AttachResponse:
        async with self._calls.call("Attach", request, context):
            self._state.container(request.container_id)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the memory runtime has no streaming server")
        return api.AttachResponse()

    async def PortForward(self, request: api.PortForwardRequest, context: Any) -> api.PortForwardResponse:
        async with self._calls.call("PortForward", request, context):
            self._state.sandbox(request.pod_sandbox_id)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the memory runtime has no streaming server")
        return api.PortForwardResponse()

    # --- stats --------------------------------------------------------------------------

    def _stats(self, container: Any) -> api.ContainerStats:
        stamp = time.time_ns()
        stats = api.ContainerStats()
        stats.attributes.id = container.id
        stats.attributes.metadata.CopyFrom(container.config.metadata)
        stats.attributes.labels.update(container.config.labels)
        stats.attributes.annotations.update(container.config.annotations)
        stats.cpu.timestamp = stamp
        stats.cpu.usage_core_nano_seconds.value = 0
        stats.cpu.usage_nano_cores.value = 0
        stats.memory.timestamp = stamp
        stats.memory.working_set_bytes.value = container.memory_bytes
        stats.memory.usage_bytes.value = container.memory_bytes
        stats.writable_layer.timestamp = stamp
        stats.writable_layer.fs_id.mountpoint = str(self._state.root)
        stats.writable_layer.used_bytes.value = sum(len(v) for v in container.files.values())
        return stats

    async def ContainerStats(self, request: api.ContainerStatsRequest, context: Any) -> api.ContainerStatsResponse:
        async with self._calls.call("ContainerStats", request, context):
            container = self._state.container(request.container_id)
        return api.ContainerStatsResponse(stats=self._stats(container))

    async def ListContainerStats(self, request: api.ListContainerStatsRequest,
                                 context: Any) -> api.ListContainerStatsResponse:
        async with self._calls.call("ListContainerStats", request, context):
            f = request.filter
            found = [c for c in self._state.containers.values() if c.running
                     and (not f.id or c.id.startswith(f.id))
                     and (not f.pod_sandbox_id or c.sandbox_id.startswith(f.pod_sandbox_id))
                     and all(c.config.labels.get(k) == v for k, v in f.label_selector.items())]
        return api.ListContainerStatsResponse(stats=[self._stats(c) for c in found])

    def _sandbox_stats(self, sandbox: Any) -> api.PodSandboxStats:
        stats = api.PodSandboxStats()
        stats.attributes.id = sandbox.id
        stats.attributes.metadata.CopyFrom(sandbox.config.metadata)
        stats.attributes.labels.update(sandbox.config.labels)
        stats.attributes.annotations.update(sandbox.config.annotations)
        members = [c for c in self._state.containers.values() if c.sandbox_id == sandbox.id and c.running]
        stats.linux.memory.timestamp = time.time_ns()
        stats.linux.memory.working_set_bytes.value = sum(c.memory_bytes for c in members)
        stats.linux.containers.extend(self._stats(c) for c in members)
        return stats

    async def PodSandboxStats(self, request: api.PodSandboxStatsRequest,
                              context: Any) -> api.PodSandboxStatsResponse:
        async with self._calls.call("PodSandboxStats", request, context):
            sandbox = self._state.sandbox(request.pod_sandbox_id)
        return api.PodSandboxStatsResponse(stats=self._sandbox_stats(sandbox))

    async def ListPodSandboxStats(self, request: api.ListPodSandboxStatsRequest,
                                  context: Any) -> api.ListPodSandboxStatsResponse:
        async with self._calls.call("ListPodSandboxStats", request, context):
            f = request.filter
            found = [s for s in self._state.sandboxes.values()
                     if (not f.id or s.id.startswith(f.id))
                     and all(s.config.labels.get(k) == v for k, v in f.label_selector.items())]
        return api.ListPodSandboxStatsResponse(stats=[self._sandbox_stats(s) for s in found])

    # --- events -------------------------------------------------------------------------

    async def GetContainerEvents(self, request: api.GetEventsRequest,
                                 context: Any) -> AsyncIterator[api.ContainerEventResponse]:
        async with self._calls.call("GetContainerEvents", request, context):
            if self._state.flavour == "1.6":
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetContainerEvents")
            events = self._state.subscribe()
        try:
            async for event in events:
                yield event
        finally:
            self._state.unsubscribe(events)


class ImageService(api_grpc.ImageServiceServicer):
    def __init__(self, calls: _Calls) -> None:
        self._calls = calls
        self._state = calls.state

    async def ListImages(self, request: api.ListImagesRequest, context: Any) -> api.ListImagesResponse:
        async with self._calls.call("ListImages", request, context):
            images = self._state.images.all()
            if request.HasField("filter") and request.filter.image.image:
                wanted = self._state.image_of(request.filter.image)
                images = [wanted] if wanted is not None else []
        return api.ListImagesResponse(images=[self._state.image_message(i) for i in images])

    async def ImageStatus(self, request: api.ImageStatusRequest, context: Any) -> api.ImageStatusResponse:
        async with self._calls.call("ImageStatus", request, context):
            image = self._state.image_of(request.image)
            response = api.ImageStatusResponse()
            if image is not None:
                response.image.CopyFrom(self._state.image_message(image))
                if request.verbose:
                    response.info["info"] = '{"imageSpec":{}}'
        return response

    async def PullImage(self, request: api.PullImageRequest, context: Any) -> api.PullImageResponse:
        async with self._calls.call("PullImage", request, context):
            auth = None
            if request.HasField("auth") and (request.auth.username or request.auth.password):
                auth = (request.auth.username, request.auth.password)
            try:
                image = self._state.images.pull(request.image.image, auth)
            except PullError as exc:
                raise CriFailure(getattr(grpc.StatusCode, exc.code), exc.message) from None
        return api.PullImageResponse(image_ref=image.id)

    async def RemoveImage(self, request: api.RemoveImageRequest, context: Any) -> api.RemoveImageResponse:
        async with self._calls.call("RemoveImage", request, context):
            self._state.images.remove(request.image.image)  # an absent image is no error (containerd)
        return api.RemoveImageResponse()

    async def ImageFsInfo(self, request: api.ImageFsInfoRequest, context: Any) -> api.ImageFsInfoResponse:
        async with self._calls.call("ImageFsInfo", request, context):
            used, inodes = self._state.images.usage()
            usage = api.FilesystemUsage(timestamp=time.time_ns())
            usage.fs_id.mountpoint = str(self._state.root / "snapshots")
            usage.used_bytes.value = used
            usage.inodes_used.value = inodes
        return api.ImageFsInfoResponse(image_filesystems=[usage])


__all__ = ["ImageService", "RuntimeService"]
