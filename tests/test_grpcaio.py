"""cri/grpcaio.py against a real grpc.aio server: a cancel scope around a call in flight stops at
its scope (grpc.aio's bare CancelledError, left alone, escapes it), and a call cancelled by its
channel's close is the call's failure, not a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import grpc
import grpc.aio
import pytest

from cri.grpcaio import caller_cancelled

pytestmark = pytest.mark.anyio


class CallFailed(Exception):
    pass


@asynccontextmanager
async def slow_server() -> AsyncIterator[grpc.aio.Channel]:
    async def slow(request: bytes, context: Any) -> bytes:
        await asyncio.sleep(30)
        return b""

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Slow", {"Call": grpc.unary_unary_rpc_method_handler(slow)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(0)


async def _call(channel: grpc.aio.Channel, *, handled: bool) -> None:
    try:
        await channel.unary_unary("/test.Slow/Call")(b"x", timeout=60)
    except asyncio.CancelledError:
        if not handled or await caller_cancelled():
            raise
        raise CallFailed("cancelled by grpc") from None


@pytest.mark.parametrize("handled", [True, False], ids=["handled", "bare"])
async def test_a_cancel_scope_around_a_call_stops_at_that_scope(handled: bool) -> None:
    escaped = False
    async with slow_server() as channel:
        try:
            with anyio.move_on_after(0.3) as scope:
                await _call(channel, handled=handled)
        except asyncio.CancelledError:
            escaped = True  # would go on to cancel whatever task group it reaches, quietly
    if handled:
        assert not escaped and scope.cancelled_caught
    else:
        assert escaped, "grpc.aio's bare CancelledError no longer escapes a scope: cri/grpcaio.py may be moot"


async def test_a_call_cancelled_by_its_channel_closing_is_the_calls_failure() -> None:
    async with slow_server() as channel:
        failure: list[BaseException] = []

        async def call() -> None:
            try:
                await _call(channel, handled=True)
            except CallFailed as exc:
                failure.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.sleep(0.3)
            await channel.close()
        assert [type(f) for f in failure] == [CallFailed]
