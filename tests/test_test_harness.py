"""The test harness's own rules (tests/conftest.py)."""

from __future__ import annotations

import asyncio

from tests.conftest import spurious_grpc_poller_error


class _PollerHandle:
    def __repr__(self) -> str:
        return "<Handle PollerCompletionQueue._handle_events(<_UnixSelectorEventLoop closed=False>)()>"


def test_only_grpc_s_poller_callback_on_a_closed_loop_is_dropped() -> None:
    """The spurious error of grpc.aio's process-wide poller is dropped before a loop's handler
    (anyio's runner, which would fail the test) sees it; every other loop error still arrives."""
    seen: list[dict[str, object]] = []
    loop = asyncio.new_event_loop()
    try:
        loop.set_exception_handler(lambda _loop, context: seen.append(context))
        spurious = {"message": "Exception in callback", "exception": RuntimeError("Event loop is closed"),
                    "handle": _PollerHandle()}
        assert spurious_grpc_poller_error(spurious)
        loop.call_exception_handler(spurious)
        other_callback = {"message": "Exception in callback", "exception": RuntimeError("Event loop is closed"),
                          "handle": "<Handle something_else()>"}
        other_error = {**spurious, "exception": RuntimeError("boom")}
        loop.call_exception_handler(other_callback)
        loop.call_exception_handler(other_error)
        assert seen == [other_callback, other_error]
    finally:
        loop.close()
