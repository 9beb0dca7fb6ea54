"""grpc.aio's cancellations under anyio: one rule for every gRPC client of the project (the CRI
client here, the DRA and CSI drivers' clients, plugin registration).

grpc.aio answers the cancellation of a call in flight by raising a bare ``CancelledError`` of its
own: when the caller's cancel scope was cancelled, and also when nobody cancelled the caller (the
channel was closed under the call). anyio recognises a scope's cancellation by its message, so
that bare error is nobody's: it escapes the very scope that caused it (``move_on_after``, a pod
worker's setup scope) and, reaching a task group, cancels every task in it without a word — the
wedged agents of the gang chaos runs: a pod deleted while NodePrepareResources was in flight
(benchmarks/RESULTS.md, 2026-12-02).
"""

from __future__ import annotations

import asyncio

import anyio


async def caller_cancelled() -> bool:
    """Call in ``except asyncio.CancelledError`` around a grpc.aio call. When a cancel scope of
    the caller was cancelled, this raises that scope's own cancellation (which the scope then
    recognises and stops). Returns True when the caller's task was cancelled otherwise (natively:
    re-raise), False when nobody cancelled the caller: grpc cancelled the call itself, which is
    the call's failure, not a cancellation."""
    await anyio.lowlevel.checkpoint_if_cancelled()
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


__all__ = ["caller_cancelled"]
