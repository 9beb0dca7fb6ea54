"""The DRA gRPC API a driver serves, as typed calls: DRA v1 / v1beta1 (NodePrepareResources,
NodeUnprepareResources). Its registration (GetInfo, NotifyRegistrationStatus) is the core's
plugin watcher's (nodeagent/pluginwatcher).

The generated stubs stay behind this module; gRPC failures become :class:`DriverCallError` here,
once. The kubelet's timeouts are the defaults.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

from cri.grpcaio import caller_cancelled
from nodeagent.pluginwatcher import target
from plugins.dra._generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)

PLUGIN_TYPE = "DRAPlugin"
SERVICES: Mapping[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
"""What the agent speaks, as plugins advertise it in PluginInfo.supported_versions (the
kubelet's servicesSupportedByKubelet); the plugin's own order decides which one is used."""

CALL_TIMEOUT_SECONDS = 45.0  # the kubelet's defaultClientCallTimeout for DRA calls


class DriverCallError(Exception):
    """A gRPC call to a plugin failed as a whole (transport, deadline, or the plugin's error)."""

    def __init__(self, method: str, error: grpc.aio.AioRpcError | grpc.aio.UsageError | asyncio.CancelledError) -> None:
        if isinstance(error, grpc.aio.AioRpcError):
            code = error.code()
            super().__init__(f"{method}: {code.name if code else 'UNKNOWN'}: {error.details() or ''}".rstrip(": "))
            self.code: grpc.StatusCode | None = code
        else:  # the channel was closed under the call: the plugin was deregistered meanwhile
            super().__init__(f"{method}: the plugin was deregistered during the call ({error})")
            self.code = None


@dataclass(frozen=True)
class Claim:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class Device:
    pool_name: str
    device_name: str
    request_names: tuple[str, ...] = ()
    """Empty: the device serves every request of the claim."""
    cdi_device_ids: tuple[str, ...] = ()
    share_id: str | None = None

    def serves(self, request: str) -> bool:
        """Whether a container asking for ``request`` of the claim (empty: all) gets this device.
        A device allocated for subrequest ``req/sub`` serves ``req``, as the kubelet matches."""
        if not request or not self.request_names:
            return True
        return any(name == request or name.split("/", 1)[0] == request for name in self.request_names)


@dataclass(frozen=True)
class Prepared:
    """One claim's answer to NodePrepareResources: devices, or an error (devices ignored)."""

    devices: tuple[Device, ...] = ()
    error: str = ""


# --- DRA -----------------------------------------------------------------------------------


class DraClient:
    """NodePrepareResources / NodeUnprepareResources on one plugin endpoint, in the service
    version chosen at registration. Both calls are idempotent on the driver's side."""

    def __init__(self, endpoint: str, service: str, timeout: float = CALL_TIMEOUT_SECONDS) -> None:
        self.endpoint = endpoint
        self.service = service
        self.timeout = timeout
        self._pb2, grpc_module = SERVICES[service]
        self._channel = grpc.aio.insecure_channel(target(endpoint))
        self._stub: Any = grpc_module.DRAPluginStub(self._channel)
        self._closed = False

    async def _call(self, method: str, request: Any) -> Any:
        """One call; every failure is a DriverCallError. Closing the channel (the plugin was
        deregistered) cancels the calls in flight with asyncio.CancelledError: that is the
        call's failure, not the caller's cancellation, and must not travel up as one (under
        anyio a stray CancelledError ends the task group it reaches, quietly: the whole agent
        stopped). A real cancellation of the caller is delivered again by its cancel scope."""
        try:
            return await getattr(self._stub, method)(request, timeout=self.timeout)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
            raise DriverCallError(method, exc) from None
        except asyncio.CancelledError as exc:
            # Bare, from grpc.aio (cri/grpcaio.py): the caller's scope's own cancellation is
            # raised again as the scope's, so the scope stops it (a pod deleted with the call
            # in flight); otherwise the call failed.
            if await caller_cancelled() and not self._closed:
                raise
            raise DriverCallError(method, exc) from None

    def _claims(self, claims: Sequence[Claim]) -> list[Any]:
        return [self._pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    async def prepare(self, claims: Sequence[Claim]) -> dict[str, Prepared]:
        """Claim UID → outcome. A claim missing from the answer is reported as an error here,
        so the caller never takes silence for success."""
        response = await self._call("NodePrepareResources",
                                    self._pb2.NodePrepareResourcesRequest(claims=self._claims(claims)))
        out: dict[str, Prepared] = {}
        for claim in claims:
            if claim.uid not in response.claims:
                out[claim.uid] = Prepared(error="the driver's answer skipped this ResourceClaim")
                continue
            answer = response.claims[claim.uid]
            devices = tuple(
                Device(pool_name=d.pool_name, device_name=d.device_name, request_names=tuple(d.request_names),
                       cdi_device_ids=tuple(d.cdi_device_ids),
                       share_id=d.share_id if "share_id" in d.DESCRIPTOR.fields_by_name and d.HasField("share_id")
                       else None)
                for d in answer.devices)
            out[claim.uid] = Prepared(devices=devices, error=answer.error)
        return out

    async def unprepare(self, claims: Sequence[Claim]) -> dict[str, str]:
        """Claim UID → error ("" when unprepared)."""
        response = await self._call("NodeUnprepareResources",
                                    self._pb2.NodeUnprepareResourcesRequest(claims=self._claims(claims)))
        return {c.uid: (response.claims[c.uid].error if c.uid in response.claims
                        else "the driver's answer skipped this ResourceClaim") for c in claims}

    async def close(self) -> None:
        self._closed = True
        await self._channel.close()
