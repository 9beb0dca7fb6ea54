"""Load on a kubelet API, from a process of its own (so that what the agent's process holds
is the agent's): idle TCP connections and concurrent ``follow=true`` log streams.

    python -m tests.kubelet_load --port P --idle 5000 --follow 200 --path /containerLogs/... \\
        --cert c.crt --key c.key

Prints one JSON line when everything is open ({"idle": connections opened, "follow": streams
that got their 200, "idle_errors"/"follow_errors": by kind}), then keeps it all open, reading
the streams, until stdin closes; then a last JSON line with the bytes read.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import ssl
import sys
from typing import Any

import anyio
from anyio.abc import ByteStream


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(cert, key)
    return context


async def _idle(port: int, count: int, sockets: list[socket.socket], errors: dict[str, int]) -> None:
    # Plain non-blocking connects: an idle client never sends a byte (not even a ClientHello).
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        except OSError as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            s.close()
            continue
        sockets.append(s)
        if len(sockets) % 200 == 0:
            await anyio.sleep(0)  # let the event loop breathe; connects complete in the kernel


async def _follow(port: int, path: str, context: ssl.SSLContext, opened: list[int], read: list[int],
                  errors: dict[str, int]) -> None:
    try:
        with anyio.fail_after(60):
            stream: ByteStream = await anyio.connect_tcp("127.0.0.1", port, ssl_context=context,
                                                         tls_standard_compatible=False)
            await stream.send(f"GET {path} HTTP/1.1\r\nHost: node\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
    except Exception as exc:  # noqa: BLE001 - counted, the others go on
        errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
        return
    if not head.startswith(b"HTTP/1.1 200"):
        errors[head.split(b"\r\n", 1)[0].decode()] = errors.get(head.split(b"\r\n", 1)[0].decode(), 0) + 1
        return
    opened.append(1)
    read.append(len(head))
    try:
        async with stream:
            while True:
                data = await stream.receive()
                read.append(len(data))
    except Exception:  # noqa: BLE001 - the server closed it, or we are stopping
        return


async def main(args: Any) -> None:
    _raise_nofile()
    context = _context(args.cert, args.key)
    sockets: list[socket.socket] = []
    idle_errors: dict[str, int] = {}
    follow_errors: dict[str, int] = {}
    opened: list[int] = []
    read: list[int] = []
    async with anyio.create_task_group() as tg:
        await _idle(args.port, args.idle, sockets, idle_errors)
        for _ in range(args.follow):
            tg.start_soon(_follow, args.port, args.path, context, opened, read, follow_errors)
        with anyio.move_on_after(90):
            while len(opened) + sum(follow_errors.values()) < args.follow:
                await anyio.sleep(0.2)
        print(json.dumps({"idle": len(sockets), "follow": len(opened), "idle_errors": idle_errors,
                          "follow_errors": follow_errors}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin
        print(json.dumps({"read_bytes": sum(read), "follow": len(opened)}), flush=True)
        tg.cancel_scope.cancel()
    for s in sockets:
        s.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle", type=int, default=5000)
    parser.add_argument("--follow", type=int, default=200)
    parser.add_argument("--path", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    anyio.run(main, parser.parse_args())
