"""``GET /containerLogs/{namespace}/{pod}/{container}``: the kubelet's getContainerLogs.

The files are read by :mod:`nodeagent.logreader` (CRI format, partial lines joined, followed
across rotation); this module turns the query into options, answers with the kubelet's status
codes and messages, and streams the body chunked as the kubelet does.

The file is read by logreader in a worker thread that hands batches (about 64 KiB each) to
the event loop through a small bounded stream, so a request holds a few batches at most,
never a whole file, however slowly its client reads. ``follow`` ends when the container's
instance will write no more, when ``limitBytes`` is reached, or when the client goes away:
the follower's liveness check then answers False, so the thread ends within a second instead
of polling a silent file forever.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import ByteStream
from anyio.streams.memory import MemoryObjectSendStream

from nodeagent import logreader as lr
from nodeagent.kubeletserver.wire import ChunkedBody, respond

STREAMS = {"All": None, "Stdout": "stdout", "Stderr": "stderr"}
FOLLOW_BUFFER = 2
"""Batches a reader may run ahead of a slow client before it waits (each about 64 KiB)."""
FOLLOWERS = 256
"""Log readers at once (each holds a thread while it runs)."""
_CLIENT_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, ssl.SSLError, OSError)


class OptionError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LogOptions:
    """v1.PodLogOptions as the kubelet decodes them from the query."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    since_seconds: int | None = None
    since_time_nanos: int | None = None
    limit_bytes: int | None = None
    stream: str = "All"

    def since_nanos(self, now_nanos: int) -> int | None:
        if self.since_seconds is not None:
            return now_nanos - self.since_seconds * 1_000_000_000
        return self.since_time_nanos


_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


def _bool(query: Mapping[str, list[str]], name: str) -> bool:
    # strconv.ParseBool, and a bare ``?follow`` means true, as the API machinery decodes it.
    value = query.get(name, ["false"])[0]
    if value in _TRUE or value == "":
        return True
    if value in _FALSE:
        return False
    raise OptionError(400, '{"message": "Unable to decode query."}')


def _int(query: Mapping[str, list[str]], name: str) -> int | None:
    if name not in query:
        return None
    try:
        return int(query[name][0])
    except ValueError:
        raise OptionError(400, '{"message": "Unable to decode query."}') from None


def parse_options(query: Mapping[str, list[str]]) -> LogOptions:
    """The query, decoded and validated as the kubelet does (``tail`` is the old name of
    ``tailLines``; ``tail=all`` means no limit)."""
    query = dict(query)
    tail = query.get("tail", [""])[0]
    if tail:
        query.pop("tailLines", None)
        if tail != "all":
            query["tailLines"] = [tail]
    since_time = None
    if "sinceTime" in query:
        since_time = lr.parse_time(query["sinceTime"][0].encode())
        if since_time is None:
            raise OptionError(400, '{"message": "Unable to decode query."}')
    options = LogOptions(
        follow=_bool(query, "follow"), previous=_bool(query, "previous"), timestamps=_bool(query, "timestamps"),
        tail_lines=_int(query, "tailLines"), since_seconds=_int(query, "sinceSeconds"), since_time_nanos=since_time,
        limit_bytes=_int(query, "limitBytes"), stream=query.get("stream", ["All"])[0],
    )
    invalid = (
        (options.tail_lines is not None and options.tail_lines < 0)
        or (options.limit_bytes is not None and options.limit_bytes < 1)
        or (options.since_seconds is not None and since_time is not None)
        or (options.since_seconds is not None and options.since_seconds < 1)
        or options.stream not in STREAMS
        or (options.stream != "All" and options.tail_lines is not None)
    )
    if invalid:
        raise OptionError(422, '{"message": "Invalid request."}')
    return options


@dataclass(frozen=True)
class LogSubject:
    """What the server found for the request: the pod's log directory, its containers in spec
    order and their statuses (for the messages and for knowing when an instance is done)."""

    target: lr.Target
    rows: Callable[[], lr.Rows]
    """The agent's pods as logreader's liveness check reads them (called on the event loop)."""


class _Limit:
    """limitBytes: the kubelet stops writing (mid-line if need be) once it is reached."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit

    def take(self, data: bytes) -> bytes:
        if self.left is None:
            return data
        data = data[: self.left]
        self.left -= len(data)
        return data

    @property
    def reached(self) -> bool:
        return self.left is not None and self.left <= 0


def _render(lines: Iterable[lr.Line], options: LogOptions) -> bytes:
    wanted = STREAMS[options.stream]
    return b"".join(line.render(options.timestamps) for line in lines if wanted is None or line.stream == wanted)


async def serve_logs(client: ByteStream, subject: LogSubject, container: str, options: LogOptions,
                     client_gone: Callable[[], Any], now_nanos: int) -> None:
    """Answer one log request. ``client_gone`` is awaited beside the reader and returns when the
    client closes its side."""
    try:
        path, attempt = lr.log_file(subject.target, container, previous=options.previous)
    except lr.LogsError as exc:
        await respond(client, 400, str(exc))
        return
    since = options.since_nanos(now_nanos)
    follow = options.follow and not options.previous

    def batches(alive: Callable[[], bool]) -> Iterator[list[lr.Line]]:
        if not follow:
            yield from lr.stream(path, options.tail_lines, since)
            return
        written = lr.writer_alive(subject.target, container, attempt, lambda: _rows_from_loop(subject.rows))
        for lines, _initial in lr.follow(path, lambda: alive() and written(), tail=options.tail_lines,
                                         since_nanos=since):
            yield lines

    body = ChunkedBody(client)
    await body.start()
    await _pump(body, batches, options, _Limit(options.limit_bytes), client_gone)
    await body.end()


_followers: anyio.CapacityLimiter | None = None


def _follower_limiter() -> anyio.CapacityLimiter:
    # Its own limiter: long-lived followers must not take the default pool's threads, which
    # the rest of the agent uses for short blocking calls.
    global _followers
    if _followers is None:
        _followers = anyio.CapacityLimiter(FOLLOWERS)
    return _followers


async def _pump(body: ChunkedBody, batches: Callable[[Callable[[], bool]], Iterator[list[lr.Line]]],
                options: LogOptions, limit: _Limit, client_gone: Callable[[], Any]) -> None:
    """Run ``batches`` in a worker thread and write what it yields, until it ends, the limit is
    reached or the client goes."""
    stop = threading.Event()
    send, receive = anyio.create_memory_object_stream[bytes](FOLLOW_BUFFER)

    def pump(out: MemoryObjectSendStream[bytes]) -> None:
        try:
            for lines in batches(lambda: not stop.is_set()):
                if stop.is_set():
                    return
                data = _render(lines, options)
                if data:
                    anyio.from_thread.run(out.send, data)
        except FileNotFoundError:
            return  # rotated away between the listing and the open
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
            return  # the request is over (client gone, limit reached, agent stopping)

    async def run_pump() -> None:
        with send:
            await anyio.to_thread.run_sync(pump, send, abandon_on_cancel=True, limiter=_follower_limiter())

    async def watch_client() -> None:
        await client_gone()
        tg.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_pump)
            tg.start_soon(watch_client)
            async with receive:
                async for data in receive:
                    try:
                        await body.write(limit.take(data))
                    except _CLIENT_GONE:
                        break  # inside the task group: raising would come out as an ExceptionGroup
                    if limit.reached:
                        break
            tg.cancel_scope.cancel()
    finally:
        stop.set()


def _rows_from_loop(rows: Callable[[], lr.Rows]) -> lr.Rows | None:
    """The agent's pods, read on the event loop (the status writer is not thread-safe)."""
    try:
        return anyio.from_thread.run_sync(rows)
    except RuntimeError:  # the loop is gone: the agent stopped
        return None
