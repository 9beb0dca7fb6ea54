"""The CSI Node and Identity services a driver serves, as typed calls (csi.v1, our own proto
subset in plugins/csi/proto). The generated stubs stay behind this module; a gRPC failure
becomes :class:`CsiCallError` here, once, worded as Go's gRPC status prints (the kubelet's
events show the driver's error that way: ``rpc error: code = Internal desc = ...``).

The kubelet dials ``unix://<endpoint>`` insecurely and gives every CSI call ``csiTimeout``
(2 minutes); so does this client, unless told otherwise.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from cri.grpcaio import caller_cancelled
from nodeagent.pluginwatcher import target
from plugins.csi._generated import csi_v1_pb2 as pb
from plugins.csi._generated import csi_v1_pb2_grpc as pb_grpc

PLUGIN_TYPE = "CSIPlugin"
CALL_TIMEOUT_SECONDS = 120.0  # the kubelet's csiTimeout

# Codes after which the driver may have done the work anyway: the kubelet marks such an
# operation "uncertain" (it will unmount or retry later), never done or undone.
_UNCERTAIN = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED})
# Go's codes.Code.String(): what the kubelet's messages show.
_GO_CODE_NAMES = {
    grpc.StatusCode.OK: "OK", grpc.StatusCode.CANCELLED: "Canceled", grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument", grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound", grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied", grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition", grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange", grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal", grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss", grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}


class NodeCapability(enum.IntEnum):
    """NodeServiceCapability.RPC.Type."""

    STAGE_UNSTAGE_VOLUME = 1
    GET_VOLUME_STATS = 2
    EXPAND_VOLUME = 3
    SINGLE_NODE_MULTI_WRITER = 5
    VOLUME_MOUNT_GROUP = 6
    GET_VOLUME_HEALTH = 7
    GET_STORAGE_HEALTH = 8


ACCESS_MODES = {name: value for name, value in pb.VolumeCapability.AccessMode.Mode.items()}


class CsiCallError(Exception):
    """A CSI call failed as a whole: the transport, the deadline, or the driver's own error."""

    def __init__(self, method: str, error: grpc.aio.AioRpcError | grpc.aio.UsageError) -> None:
        self.method = method
        if isinstance(error, grpc.aio.AioRpcError):
            self.code: grpc.StatusCode | None = error.code()
            self.details = error.details() or ""
            name = _GO_CODE_NAMES.get(self.code, "Unknown") if self.code is not None else "Unknown"
            super().__init__(f"rpc error: code = {name} desc = {self.details}")
        else:  # the channel was closed under the call: the driver was deregistered meanwhile
            self.code = None
            self.details = f"the driver was deregistered during the call ({error})"
            super().__init__(self.details)

    @property
    def uncertain(self) -> bool:
        """The driver may have done (part of) the work: treat it as neither done nor undone."""
        return self.code is None or self.code in _UNCERTAIN


@dataclass(frozen=True)
class DriverNodeInfo:
    node_id: str
    max_volumes_per_node: int
    topology: Mapping[str, str]


@dataclass(frozen=True)
class Capability:
    """What a volume is asked to be: the CSI VolumeCapability."""

    block: bool = False
    fs_type: str = ""
    mount_flags: tuple[str, ...] = ()
    mount_group: str = ""
    """volume_mount_group: the pod's fsGroup, for drivers with VOLUME_MOUNT_GROUP."""
    access_mode: str = "SINGLE_NODE_WRITER"

    def message(self) -> Any:
        mode = pb.VolumeCapability.AccessMode(mode=ACCESS_MODES[self.access_mode])  # type: ignore[arg-type]
        if self.block:
            return pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume(), access_mode=mode)
        return pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(
            fs_type=self.fs_type, mount_flags=list(self.mount_flags), volume_mount_group=self.mount_group),
            access_mode=mode)


@dataclass(frozen=True)
class Usage:
    """One entry of NodeGetVolumeStats: BYTES or INODES."""

    unit: str
    available: int
    total: int
    used: int


@dataclass
class CsiClient:
    """Calls on one driver endpoint (a Unix socket); the channel is opened once and closed
    when the driver is deregistered."""

    endpoint: str
    timeout: float = CALL_TIMEOUT_SECONDS
    _channel: Any = None
    _node: Any = None
    _identity: Any = None
    _capabilities: frozenset[int] | None = field(default=None)

    def __post_init__(self) -> None:
        # The kubelet's authority for a unix target; the default would be the socket path.
        self._channel = grpc.aio.insecure_channel(target(self.endpoint),
                                                  options=[("grpc.default_authority", "localhost")])
        self._node = pb_grpc.NodeStub(self._channel)  # type: ignore[no-untyped-call]
        self._identity = pb_grpc.IdentityStub(self._channel)  # type: ignore[no-untyped-call]

    async def _call(self, stub: Any, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return await getattr(stub, method)(request, timeout=timeout or self.timeout)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
            raise CsiCallError(method, exc) from None
        except asyncio.CancelledError:
            # Bare, from grpc.aio (cri/grpcaio.py): the caller's scope's cancellation goes on
            # as the scope's own; a call grpc cancelled (the channel closed) failed.
            if await caller_cancelled():
                raise
            raise CsiCallError(method, grpc.aio.UsageError("the call was cancelled: its channel was closed")) from None

    # --- Identity ---------------------------------------------------------------------------

    async def plugin_name(self, timeout: float | None = None) -> str:
        return str((await self._call(self._identity, "GetPluginInfo", pb.GetPluginInfoRequest(), timeout)).name)

    # --- Node -------------------------------------------------------------------------------

    async def node_info(self, timeout: float | None = None) -> DriverNodeInfo:
        answer = await self._call(self._node, "NodeGetInfo", pb.NodeGetInfoRequest(), timeout)
        return DriverNodeInfo(answer.node_id, int(answer.max_volumes_per_node),
                              dict(answer.accessible_topology.segments) if answer.HasField("accessible_topology")
                              else {})

    async def capabilities(self) -> frozenset[int]:
        """NodeGetCapabilities, asked once per registration (a driver's capabilities do not
        change while it runs; a restarted driver registers again and gets a new client)."""
        if self._capabilities is None:
            answer = await self._call(self._node, "NodeGetCapabilities", pb.NodeGetCapabilitiesRequest())
            self._capabilities = frozenset(c.rpc.type for c in answer.capabilities if c.HasField("rpc"))
        return self._capabilities

    async def has(self, capability: NodeCapability) -> bool:
        return int(capability) in await self.capabilities()

    async def stage(self, volume_id: str, staging_path: str, capability: Capability, *,
                    publish_context: Mapping[str, str], volume_context: Mapping[str, str],
                    secrets: Mapping[str, str]) -> None:
        await self._call(self._node, "NodeStageVolume", pb.NodeStageVolumeRequest(
            volume_id=volume_id, publish_context=dict(publish_context), staging_target_path=staging_path,
            volume_capability=capability.message(), secrets=dict(secrets), volume_context=dict(volume_context)))

    async def unstage(self, volume_id: str, staging_path: str) -> None:
        await self._call(self._node, "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
            volume_id=volume_id, staging_target_path=staging_path))

    async def publish(self, volume_id: str, target_path: str, capability: Capability, *, staging_path: str,
                      read_only: bool, publish_context: Mapping[str, str], volume_context: Mapping[str, str],
                      secrets: Mapping[str, str]) -> None:
        await self._call(self._node, "NodePublishVolume", pb.NodePublishVolumeRequest(
            volume_id=volume_id, publish_context=dict(publish_context), staging_target_path=staging_path,
            target_path=target_path, volume_capability=capability.message(), readonly=read_only,
            secrets=dict(secrets), volume_context=dict(volume_context)))

    async def unpublish(self, volume_id: str, target_path: str) -> None:
        await self._call(self._node, "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
            volume_id=volume_id, target_path=target_path))

    async def volume_stats(self, volume_id: str, volume_path: str, staging_path: str = "") -> list[Usage]:
        answer = await self._call(self._node, "NodeGetVolumeStats", pb.NodeGetVolumeStatsRequest(
            volume_id=volume_id, volume_path=volume_path, staging_target_path=staging_path))
        units = {value: name for name, value in pb.VolumeUsage.Unit.items()}
        return [Usage(units.get(u.unit, "UNKNOWN"), int(u.available), int(u.total), int(u.used)) for u in answer.usage]

    async def expand(self, volume_id: str, volume_path: str, required_bytes: int, capability: Capability, *,
                     staging_path: str, secrets: Mapping[str, str]) -> int:
        """NodeExpandVolume; the capacity the driver reports (0: it did not say)."""
        answer = await self._call(self._node, "NodeExpandVolume", pb.NodeExpandVolumeRequest(
            volume_id=volume_id, volume_path=volume_path,
            capacity_range=pb.CapacityRange(required_bytes=required_bytes),
            staging_target_path=staging_path, volume_capability=capability.message(), secrets=dict(secrets)))
        return int(answer.capacity_bytes)

    async def close(self) -> None:
        await self._channel.close()


def highest_supported_version(versions: Sequence[str]) -> tuple[int, ...] | None:
    """The kubelet's HighestSupportedVersion: the highest of the parseable versions (two or more
    dot-separated numbers, an optional leading "v") whose major is at most 1; None unless that
    highest one is a 1.x."""
    best: tuple[int, ...] | None = None
    for text in versions:
        parts = text.strip().removeprefix("v").split("-", 1)[0].split("+", 1)[0].split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts) or (len(parts[0]) > 1 and parts[0][0] == "0"):
            continue
        version = tuple(int(p) for p in parts)
        if version[0] > 1:
            continue
        if best is None or version > best:
            best = version
    return best if best is not None and best[0] == 1 else None


__all__ = [
    "ACCESS_MODES",
    "CALL_TIMEOUT_SECONDS",
    "PLUGIN_TYPE",
    "Capability",
    "CsiCallError",
    "CsiClient",
    "DriverNodeInfo",
    "NodeCapability",
    "Usage",
    "highest_supported_version",
]
