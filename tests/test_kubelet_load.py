"""The kubelet API under load and abuse (nodeagent/kubeletserver/listener.py, containerlogs.py,
streams.py): bounded memory for /containerLogs, an accept loop that outlives EMFILE, the
connection cap, the streaming idle timeout, and a running agent with a pod logging
continuously that keeps serving through 5,000 idle connections and 200 `follow=true` streams.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import ByteStream, SocketStream

from controlplane.pki import PKI
from cri import types as t
from nodeagent import logreader as lr
from nodeagent.kubeletserver import containerlogs as cl
from nodeagent.listener import ConnectionLimit, Slot, accept_loop
from tests.agent_helpers import pod_manifest, running_agent, wait_for
from tests.test_kubelet_server import _client_context, _exec_path, _free_port, _get, _log_followers, _websocket

# serial: each test loads the agent on purpose (thousands of connections, hundreds of log
# followers) and asserts that it still serves; beside another worker's tests the two loads add
# up, and a fresh client once waited 30 s for its TLS handshake. `make test` runs these alone.
pytestmark = [pytest.mark.anyio, pytest.mark.serial]

REPO = Path(__file__).resolve().parent.parent


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# --- /containerLogs never holds a whole file -------------------------------------------------


class _Sink(ByteStream):
    """A client that reads everything at once and keeps only the count."""

    def __init__(self) -> None:
        self.received = 0

    async def receive(self, max_bytes: int = 65536) -> bytes:
        raise anyio.EndOfStream

    async def send(self, item: bytes) -> None:
        self.received += len(item)

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def test_container_logs_serve_a_large_file_in_bounded_memory(tmp_path: Path) -> None:
    """16 MiB of log (with a 2 MiB line in partial records) through /containerLogs' handler:
    the peak of what Python allocates stays a few batches, whatever the file size (it was
    the whole file, several times over, before)."""
    directory = tmp_path / "main"
    directory.mkdir()
    line = b"2024-01-01T00:00:00.123456789Z stdout F " + b"x" * 60 + b"\n"
    with open(directory / "0.log", "wb") as f:
        for _ in range(16 * 2**20 // (len(line) * 10_000)):
            f.write(line * 10_000)
        for _ in range(128):
            f.write(b"2024-01-01T00:00:01Z stdout P " + b"y" * 16384 + b"\n")
        f.write(b"2024-01-01T00:00:01Z stdout F end\n")
    size = (directory / "0.log").stat().st_size
    subject = cl.LogSubject(lr.Target(lr.PodDir("default", "p", "u", tmp_path), ("main",)), lambda: [])
    for options in (cl.LogOptions(), cl.LogOptions(tail_lines=3), cl.LogOptions(limit_bytes=5 * 2**20)):
        sink = _Sink()
        gc.collect()
        tracemalloc.start()
        try:
            await cl.serve_logs(sink, subject, "main", options, anyio.sleep_forever, time.time_ns())
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert sink.received > (2 * 2**20 if options.limit_bytes is None else options.limit_bytes), options
        assert peak < 4 * 2**20, (options, peak, size)


# --- the accept loop ---------------------------------------------------------------------------

_CLIENTS = """
import socket, sys
sys.stdin.readline()
got = []
for _ in range(3):
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30) as s:
        got.append(s.recv(16).decode())
print(",".join(got), flush=True)
"""


async def test_accept_loop_survives_running_out_of_file_descriptors() -> None:
    """EMFILE on accept: anyio's Listener.serve raises (and took the kubelet API and the agent
    with it); ours backs off and serves the waiting connections once descriptors are back."""
    served: list[int] = []

    async def handler(raw: SocketStream, slot: Slot) -> None:
        await raw.send(b"hi")
        served.append(1)

    limit = ConnectionLimit(limit=16)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    # Started before descriptors run out: the clients live in their own process.
    clients = await anyio.open_process([sys.executable, "-c", _CLIENTS, str(port)])
    assert clients.stdin is not None and clients.stdout is not None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    async with listener, clients, anyio.create_task_group() as tg:
        tg.start_soon(accept_loop, listener.listeners[0], handler, limit, tg)  # type: ignore[arg-type]
        lowest = os.dup(0)
        os.close(lowest)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))  # no new descriptor from here
            await clients.stdin.send(b"go\n")
            with anyio.fail_after(20):
                while limit.counters.accept_errors < 3:
                    await anyio.sleep(0.02)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert served == []
        with anyio.fail_after(30):
            out = b""
            while b"\n" not in out:
                out += await clients.stdout.receive()
        assert out == b"hi,hi,hi\n" and len(served) == 3
        tg.cancel_scope.cancel()


def test_connection_cap_closes_the_oldest_pending_then_refuses() -> None:
    async def run() -> None:
        limit = ConnectionLimit(limit=3)
        a, b, c = limit.admit(), limit.admit(), limit.admit()
        assert a and b and c and limit.open == 3
        limit.activate(b)
        d = limit.admit()  # full: the oldest pending (a) makes room
        assert d is not None and a.scope.cancel_called and not b.scope.cancel_called
        limit.activate(c)
        limit.activate(d)
        assert limit.admit() is None  # every one active: the new one is refused
        assert (limit.counters.evicted, limit.counters.refused, limit.open) == (1, 1, 3)
        limit.release(a)  # an evicted one's end changes nothing
        limit.release(b)
        assert limit.open == 2 and limit.admit() is not None

    anyio.run(run)


# --- streamingConnectionIdleTimeout --------------------------------------------------------------


async def test_idle_exec_sessions_are_closed(containerd: Any, tmp_path: Path) -> None:
    port = _free_port()
    settings = {"enable_server": True, "address": "127.0.0.1", "port": port,
                "authentication": {"anonymous": {"enabled": True}}, "streaming_connection_idle_timeout": 2.0}
    async with running_agent(containerd, tmp_path, **settings) as env:
        env.write("web.yaml", pod_manifest("web", "exec sleep 3600"))
        await env.wait_seen_running("web")
        # Talking: never idle for 2 s, so it runs to its end.
        path = _exec_path(env, "web", "sh", "-c", "for i in 1 2 3 4 5 6; do echo $i; sleep 0.8; done")
        async with _websocket(port, path, _client_context()) as ws:
            got = await ws.channels(timeout=30)
        assert got[1] == b"1\n2\n3\n4\n5\n6\n" and json.loads(got[3])["status"] == "Success"
        # Silent: closed after about 2 s, long before the command ends.
        started = time.monotonic()
        async with _websocket(port, _exec_path(env, "web", "sleep", "120"), _client_context()) as ws:
            got = await ws.channels(timeout=30)
        assert 3 not in got and time.monotonic() - started < 30


# --- a running agent under load -------------------------------------------------------------------

LOGGER = "i=0; while true; do i=$((i+1)); echo \"log line $i of a pod that never stops talking\"; sleep 0.05; done"


async def test_agent_keeps_serving_through_idle_connections_and_log_followers(containerd: Any,
                                                                              tmp_path: Path) -> None:
    """5,000 idle TCP connections and 200 `follow=true` streams on a pod that logs
    continuously: a fresh authenticated /healthz and /containerLogs still succeed, the pod keeps
    running, the agent is alive, its memory and descriptors stay bounded; and afterwards
    everything the load held is given back."""
    pki = PKI(tmp_path / "client-pki")
    client = pki.issue("load-client", "load-client", client=True)
    port = _free_port()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))  # the agent raises it itself
    try:
        settings = {"enable_server": True, "address": "127.0.0.1", "port": port,
                    "authentication": {"x509": {"client_ca_file": pki.ca.cert}}}
        async with running_agent(containerd, tmp_path, **settings) as env:
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
            server = env.agent.kubelet_server
            assert server is not None
            env.write("talker.yaml", pod_manifest("talker", LOGGER))
            talker = await env.wait_seen_running("talker")
            trusted = _client_context(client.cert, client.key)
            logs = f"/containerLogs/default/talker-{env.node}/main"

            async def talking() -> bool:
                status, _, body = await _get(port, f"{logs}?tailLines=1", trusted)
                return status == 200 and body.startswith(b"log line ")

            await wait_for(talking, 30, "the pod's log through the kubelet API")
            status, _, body = await _get(port, "/healthz", _client_context())
            assert (status, body) == (401, b"Unauthorized")
            gc.collect()
            rss_before, fds_before = _rss_bytes(), _open_fds()

            command = [sys.executable, "-m", "tests.kubelet_load", "--port", str(port), "--idle", "5000",
                       "--follow", "200", "--path", f"{logs}?follow=true&tailLines=10", "--cert", str(client.cert),
                       "--key", str(client.key)]
            async with await anyio.open_process(command, cwd=REPO) as load:
                assert load.stdin is not None and load.stdout is not None
                out = b""
                with anyio.fail_after(180):
                    while b"\n" not in out:
                        out += await load.stdout.receive()
                opened = json.loads(out)
                assert opened["idle"] == 5000 and opened["idle_errors"] == {}, opened
                assert opened["follow"] == 200 and opened["follow_errors"] == {}, opened

                # Under the load: a new client is served, the pod runs, the agent lives.
                for _ in range(3):
                    with anyio.fail_after(30):
                        assert (await _get(port, "/healthz", trusted))[:3:2] == (200, b"ok")
                        status, _, body = await _get(port, f"{logs}?tailLines=2", trusted)
                    assert status == 200 and body.count(b"log line ") == 2
                    await anyio.sleep(1)
                containers = await env.client.list_containers(t.ContainerFilter(id=talker.id))
                assert containers and containers[0].state == t.ContainerState.CONTAINER_RUNNING
                assert env.agent.ready.is_set() and server.port == port
                counters = server.connections.counters
                # Every connection was taken (none refused: the idle ones made room, being
                # closed oldest first or at their handshake timeout), never more than the cap.
                assert counters.accepted >= 5200 and counters.refused == 0 and counters.evicted > 0, counters
                assert server.connections.open <= server.connections.limit
                assert _log_followers() == 200
                gc.collect()
                rss_load, fds_load = _rss_bytes(), _open_fds()
                print(f"\nload: rss {rss_before / 2**20:.0f} -> {rss_load / 2**20:.0f} MiB, fds {fds_before} -> "
                      f"{fds_load}, connections open {server.connections.open}, {counters}")
                assert rss_load - rss_before < 200 * 2**20
                # The cap, each follower's log file, and sockets closed a turn of the loop ago.
                assert fds_load - fds_before < server.connections.limit + 200 + 300

                await load.stdin.aclose()
                with anyio.fail_after(60):
                    while out.count(b"\n") < 2:
                        out += await load.stdout.receive()
                assert json.loads(out.splitlines()[1])["read_bytes"] > 200 * 1000

            # Given back: the followers end, connections close.
            await wait_for(lambda: _async(_log_followers() == 0 and server.connections.open == 0), 30,
                           "the followers and connections to end")
            assert (await _get(port, "/healthz", trusted))[:3:2] == (200, b"ok")
            print(f"after: rss {_rss_bytes() / 2**20:.0f} MiB, fds {_open_fds()}")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _async(value: bool) -> bool:
    return value


