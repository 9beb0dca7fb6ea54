"""``grpc.health.v1.Health/Check`` without generated code: the two messages have one field each,
so they are encoded by hand and sent through grpcio's generic unary call (pkg/probe/grpc)."""

from __future__ import annotations

import time

import anyio
import grpc
import grpc.aio

CHECK_METHOD = "/grpc.health.v1.Health/Check"
# HealthCheckResponse.ServingStatus
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
SERVING = 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_request(service: str) -> bytes:
    """HealthCheckRequest{service = 1 (string)}; an empty service is the default field value,
    which proto3 leaves out."""
    if not service:
        return b""
    data = service.encode()
    return b"\x0a" + _varint(len(data)) + data


def decode_status(data: bytes) -> int:
    """HealthCheckResponse{status = 1 (enum)}; unknown fields are skipped as proto3 requires."""
    status = 0
    i = 0

    def read_varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            if i >= len(data):
                raise ValueError("truncated HealthCheckResponse")
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while i < len(data):
        key = read_varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            value = read_varint()
            if number == 1:
                status = value
        elif wire == 1:
            i += 8
        elif wire == 2:
            length = read_varint()  # read first: the call moves i
            i += length
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wire} in HealthCheckResponse")
    return status


async def check(address: str, service: str, timeout: float, user_agent: str) -> tuple[bool, str]:
    """(healthy, output) in the kubelet's words. Connecting and the call share one deadline, as
    the kubelet's single context does."""
    deadline = time.monotonic() + timeout
    options = [("grpc.primary_user_agent", user_agent)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        with anyio.move_on_after(timeout) as scope:
            await channel.channel_ready()
        if scope.cancelled_caught:
            return False, f'timeout: failed to connect service "{address}" within {timeout:g}s'
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(CHECK_METHOD)
        try:
            response: bytes = await call(encode_request(service), timeout=max(deadline - time.monotonic(), 0.001))
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code is grpc.StatusCode.UNIMPLEMENTED:
                return False, ("error: this server does not implement the grpc health protocol "
                               f"(grpc.health.v1.Health): {exc.details()}")
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                return False, f"timeout: health rpc did not complete within {timeout:g}s"
            return False, f"error: health rpc probe failed: rpc error: code = {code.name} desc = {exc.details()}"
    status = decode_status(response)
    if status != SERVING:
        return False, f'service unhealthy (responded with "{STATUS_NAMES.get(status, str(status))}")'
    return True, "service healthy"
