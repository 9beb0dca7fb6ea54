"""The kubelet HTTP API (nodeagent/kubeletserver): TLS, client certificates, /healthz, /pods,
/containerLogs, and exec/attach/portForward handed to containerd's streaming server.

Three levels: requests made by hand against the server (TLS sockets, our own tiny HTTP and
websocket clients, so the wire format itself is checked); exec/attach spoken in the websocket
v4.channel.k8s.io protocol through our splice to containerd; and `kubectl logs/exec/port-forward`
through the real API server, which dials the agent with its kubelet client certificate.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
import pytest
from anyio.abc import ByteStream

from controlplane import ControlPlane
from tests.agent_helpers import (
    BUSYBOX_IMAGE,
    AgentEnv,
    pod_manifest,
    running_agent,
    wait_for,
)

pytestmark = pytest.mark.anyio

# stdout and stderr are separate pipes that containerd reads and stamps independently: the
# pauses keep the order of the lines in the log what it was in the script.
WEB = "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; exec sleep 3600"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _client_context(cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def _server_settings(port: int, **extra: Any) -> dict[str, Any]:
    return {"enable_server": True, "address": "127.0.0.1", "port": port, **extra}


def _open_settings(port: int) -> dict[str, Any]:
    """A standalone kubelet API open to every client, as it must be asked for: anonymous
    authentication, with the standalone default AlwaysAllow (tests of the endpoints)."""
    return _server_settings(port, authentication={"anonymous": {"enabled": True}})


# --- a minimal HTTP/1.1 client -------------------------------------------------------------


async def _connect(port: int, context: ssl.SSLContext) -> ByteStream:
    return await anyio.connect_tcp("127.0.0.1", port, ssl_context=context, tls_standard_compatible=False)


async def _read_head(stream: ByteStream, data: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    while b"\r\n\r\n" not in data:
        data += await stream.receive()
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


def _dechunk(data: bytes) -> tuple[bytes, bool]:
    """The body so far and whether its last chunk arrived."""
    out = b""
    while b"\r\n" in data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out, True
        if len(rest) < size + 2:
            break
        out += rest[:size]
        data = rest[size + 2:]
    return out, False


async def _get(port: int, path: str, context: ssl.SSLContext, method: str = "GET",
               headers: str = "") -> tuple[int, dict[str, str], bytes]:
    async with await _connect(port, context) as stream:
        await stream.send(f"{method} {path} HTTP/1.1\r\nHost: node\r\n{headers}\r\n".encode())
        status, head, body = await _read_head(stream)
        while True:
            try:
                body += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    if head.get("transfer-encoding") == "chunked":
        body, complete = _dechunk(body)
        assert complete, "chunked body ended without its last chunk"
    return status, head, body


async def _text(port: int, path: str, context: ssl.SSLContext) -> str:
    status, _, body = await _get(port, path, context)
    assert status == 200, (path, status, body)
    return body.decode()


# --- a minimal websocket client (RFC 6455), for the channel.k8s.io protocols ---------------


class WebSocket:
    def __init__(self, stream: ByteStream, buffered: bytes) -> None:
        self.stream = stream
        self.buffer = buffered

    async def _need(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self.buffer += await self.stream.receive()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    async def frame(self) -> tuple[int, bytes]:
        b0, b1 = await self._need(2)
        length = b1 & 0x7F
        if length == 126:
            length = int.from_bytes(await self._need(2), "big")
        elif length == 127:
            length = int.from_bytes(await self._need(8), "big")
        mask = await self._need(4) if b1 & 0x80 else b""
        payload = await self._need(length)
        if mask:
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        return b0 & 0x0F, payload

    async def send(self, channel: int, data: bytes) -> None:
        payload = bytes([channel]) + data
        mask = os.urandom(4)
        masked = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        assert len(payload) < 126
        await self.stream.send(bytes([0x82, 0x80 | len(payload)]) + mask + masked)

    async def channels(self, until: bytes | None = None, timeout: float = 30) -> dict[int, bytes]:
        """Data per channel until the server closes (or stdout holds ``until``)."""
        got: dict[int, bytes] = {}
        with anyio.fail_after(timeout):
            while True:
                try:
                    opcode, payload = await self.frame()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return got
                if opcode == 0x8:  # close
                    return got
                if opcode in (0x1, 0x2) and payload:
                    got[payload[0]] = got.get(payload[0], b"") + payload[1:]
                if until is not None and until in got.get(1, b""):
                    return got


@asynccontextmanager
async def _websocket(port: int, path: str, context: ssl.SSLContext,
                     protocol: str = "v4.channel.k8s.io") -> AsyncIterator[WebSocket]:
    key = base64.b64encode(os.urandom(16)).decode()
    async with await _connect(port, context) as stream:
        await stream.send((f"GET {path} HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                           f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
                           f"Sec-WebSocket-Protocol: {protocol}\r\n\r\n").encode())
        status, headers, rest = await _read_head(stream)
        assert status == 101, (status, headers, rest)
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        assert headers["sec-websocket-accept"] == accept.decode()
        assert headers["sec-websocket-protocol"] == protocol
        yield WebSocket(stream, rest)


def _exec_path(env: AgentEnv, pod: str, *command: str, flags: str = "output=1&error=1") -> str:
    args = urlencode([("command", c) for c in command])
    return f"/exec/default/{pod}-{env.node}/main?{args}&{flags}"


# --- TLS, authentication, /healthz, /pods ---------------------------------------------------


async def test_tls_client_certificates_healthz_and_pods(containerd: Any, tmp_path: Path,
                                                        control_plane: ControlPlane) -> None:
    """With clientCAFile, only clients with a certificate of that CA are served (the API
    server's kubelet client certificate is); the self-signed serving certificate names the
    node; /pods is the PodList of what the agent runs."""
    port = _free_port()
    settings = _server_settings(port, authentication={"x509": {"client_ca_file": control_plane.ca_file}})
    async with running_agent(containerd, tmp_path, **settings) as env:
        assert env.agent.kubelet_server is not None and env.agent.kubelet_server.port == port
        env.write("web.yaml", pod_manifest("web", WEB))
        await env.wait_running("web")
        apiserver = control_plane.apiserver_kubelet_client
        trusted = _client_context(apiserver.cert, apiserver.key)

        status, _, body = await _get(port, "/healthz", _client_context())
        assert (status, body) == (401, b"Unauthorized")  # the kubelet's body, exactly
        pki = env.config.root_dir / "pki"
        # A certificate the CA did not sign is refused in the handshake.
        with pytest.raises((ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)):
            await _get(port, "/healthz", _client_context(pki / "kubelet.crt", pki / "kubelet.key"))

        assert await _text(port, "/healthz", trusted) == "ok"
        for name in ("127.0.0.1", env.node):  # the node IP and name are in the certificate
            verify = ssl.create_default_context(cafile=str(pki / "kubelet.crt"))
            verify.load_cert_chain(apiserver.cert, apiserver.key)
            stream = await anyio.connect_tcp("127.0.0.1", port, ssl_context=verify, tls_hostname=name,
                                             tls_standard_compatible=False)
            await stream.aclose()

        async def web_running() -> dict[str, Any] | None:
            pods = json.loads(await _text(port, "/pods", trusted))
            assert pods["kind"] == "PodList" and pods["apiVersion"] == "v1"
            web = [p for p in pods["items"] if p["metadata"]["name"] == f"web-{env.node}"]
            return web[0] if web and web[0]["status"].get("phase") == "Running" else None

        web = await wait_for(web_running, 30, "/pods to show web Running")
        assert web["metadata"]["namespace"] == "default" and web["metadata"]["uid"] == env.uid_of("web")
        assert web["spec"]["containers"][0]["name"] == "main"
        assert web["status"]["containerStatuses"][0]["state"]["running"]

        assert (await _get(port, "/nope", trusted))[0] == 404
        status, headers, _ = await _get(port, "/pods", trusted, method="POST")
        assert (status, headers["allow"]) == (405, "GET")


async def test_a_taken_port_does_not_stop_the_agent(containerd: Any, tmp_path: Path) -> None:
    """The kubelet exits when it cannot listen; the agent keeps its pods and retries."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        async with running_agent(containerd, tmp_path, **_open_settings(port)) as env:
            server = env.agent.kubelet_server
            assert server is not None and server.port is None
            env.write("web.yaml", pod_manifest("web", WEB))
            await env.wait_running("web")
            holder.close()

            async def serving() -> bool:
                try:
                    return await _text(port, "/healthz", _client_context()) == "ok"
                except OSError:
                    return False

            await wait_for(serving, 30, "the kubelet API to listen once the port is free")
            assert server.port == port
    finally:
        holder.close()


# --- /containerLogs --------------------------------------------------------------------------


def _log_followers() -> int:
    """Threads running a log follower (containerlogs' ``pump``) right now."""
    def following(frame: Any) -> bool:
        return any(f.f_code.co_name == "pump" and f.f_code.co_filename.endswith("containerlogs.py")
                   for f, _ in traceback.walk_stack(frame))

    return sum(following(frame) for frame in sys._current_frames().values())


async def _async(value: bool) -> bool:
    return value


async def test_container_logs(containerd: Any, tmp_path: Path) -> None:
    port = _free_port()
    context = _client_context()
    async with running_agent(containerd, tmp_path, **_open_settings(port)) as env:
        env.write("web.yaml", pod_manifest("web", WEB))
        env.write("crash.yaml", pod_manifest("crash", "echo boot-$(cat /proc/sys/kernel/random/uuid); sleep 2; exit 1"))
        web_id = (await env.wait_seen_running("web")).id
        logs = f"/containerLogs/default/web-{env.node}/main"

        async def all_three() -> bool:
            status, _, body = await _get(port, logs, context)
            return status == 200 and body == b"one\ntwo\nthree\n"

        await wait_for(all_three, 30, "the three lines")
        assert await _text(port, f"{logs}?tailLines=1", context) == "three\n"
        assert await _text(port, f"{logs}?tail=all", context) == "one\ntwo\nthree\n"
        assert await _text(port, f"{logs}?limitBytes=6", context) == "one\ntw"
        assert await _text(port, f"{logs}?stream=Stderr", context) == "two\n"
        assert await _text(port, f"{logs}?sinceSeconds=3600", context) == "one\ntwo\nthree\n"
        stamped = (await _text(port, f"{logs}?timestamps=true", context)).splitlines()
        assert [line.split(" ", 1)[1] for line in stamped] == ["one", "two", "three"]
        assert all(len(line.split(" ")[0]) == len("2006-01-02T15:04:05.000000000Z") for line in stamped)

        # The kubelet's answers to wrong requests.
        status, _, body = await _get(port, f"/containerLogs/default/nope-{env.node}/main", context)
        assert (status, body) == (404, f'pod "nope-{env.node}" does not exist'.encode())
        status, _, body = await _get(port, f"/containerLogs/default/web-{env.node}/other", context)
        assert (status, body) == (404, f'container "other" not found in pod "web-{env.node}"'.encode())
        status, _, body = await _get(port, f"{logs}?previous=true", context)
        assert status == 400 and body == f'previous terminated container "main" in pod "web-{env.node}" not found'.encode()
        assert (await _get(port, f"{logs}?tailLines=-1", context))[0] == 422
        assert (await _get(port, f"{logs}?follow=maybe", context))[0] == 400

        # follow: what is there, then a line written later; ends when the client goes.
        marker = f"marker-{uuid.uuid4().hex[:8]}"
        async with await _connect(port, context) as stream:
            await stream.send(f"GET {logs}?follow=true&tailLines=1 HTTP/1.1\r\nHost: node\r\n\r\n".encode())
            status, headers, raw = await _read_head(stream)
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            with anyio.fail_after(30):
                while _dechunk(raw)[0] != b"three\n":
                    raw += await stream.receive()
                await env.client.exec_sync(web_id, ["sh", "-c", f"echo {marker} > /proc/1/fd/1"], timeout=10)
                while _dechunk(raw)[0] != f"three\n{marker}\n".encode():
                    raw += await stream.receive()
            assert _log_followers() == 1
        # The client went away from a container that writes nothing more: its follower ends.
        await wait_for(lambda: _async(_log_followers() == 0), 10, "the follower thread to end")

        # previous: the instance before the restart.
        crash = f"/containerLogs/default/crash-{env.node}/main"

        async def restarted() -> str | None:
            status, _, body = await _get(port, f"{crash}?previous=1", context)
            return body.decode() if status == 200 and body else None

        before = await wait_for(restarted, 60, "the crashed instance's log as previous")
        assert before.startswith("boot-")

        async def current_differs() -> bool:
            status, _, now = await _get(port, crash, context)
            return status == 200 and now.startswith(b"boot-") and now.decode() != before

        await wait_for(current_differs, 30, "the restarted instance's own line")


# --- exec and attach through our splice to containerd's streaming server --------------------


async def test_exec_and_attach_spliced_to_the_runtime(containerd: Any, tmp_path: Path) -> None:
    """The websocket v4.channel.k8s.io protocol, spoken by the test, end to end through
    containerd's streaming server: stdout and stderr, stdin, the exit status, attach."""
    port = _free_port()
    context = _client_context()
    async with running_agent(containerd, tmp_path, **_open_settings(port)) as env:
        env.write("web.yaml", pod_manifest("web", WEB))
        web_id = (await env.wait_seen_running("web")).id

        async with _websocket(port, _exec_path(env, "web", "sh", "-c", "echo out; echo err >&2"), context) as ws:
            got = await ws.channels()
        assert got[1] == b"out\n" and got[2] == b"err\n"
        assert json.loads(got[3])["status"] == "Success"

        async with _websocket(port, _exec_path(env, "web", "sh", "-c", "exit 3"), context) as ws:
            status = json.loads((await ws.channels())[3])
        assert status["status"] == "Failure" and status["reason"] == "NonZeroExitCode"
        assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]

        # stdin: client to runtime through the splice.
        path = _exec_path(env, "web", "head", "-n1", flags="input=1&output=1")
        async with _websocket(port, path, context) as ws:
            await ws.send(0, b"ping\n")
            got = await ws.channels()
        assert got[1] == b"ping\n"

        # attach: the container's own output stream.
        marker = f"attached-{uuid.uuid4().hex[:8]}"
        async def write_until_seen() -> None:
            # The 101 may reach us before the runtime has joined the container's output:
            # write until the line arrives rather than guess how long that takes.
            while True:
                await env.client.exec_sync(web_id, ["sh", "-c", f"echo {marker} > /proc/1/fd/1"], timeout=10)
                await anyio.sleep(0.5)

        path = f"/attach/default/web-{env.node}/main?output=1"
        async with _websocket(port, path, context) as ws, anyio.create_task_group() as tg:
            tg.start_soon(write_until_seen)
            got = await ws.channels(until=marker.encode())
            tg.cancel_scope.cancel()
        assert marker.encode() in got[1]

        # What the kubelet answers before any upgrade.
        status, _, body = await _get(port, _exec_path(env, "web", "true"), context)
        assert (status, body) == (400, b"Upgrade request required")
        status, _, body = await _get(port, f"/exec/default/web-{env.node}/main?command=true", context,
                                     headers="Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n")
        assert (status, body) == (400, b"you must specify at least 1 of stdin, stdout, stderr")
        status, _, body = await _get(port, "/exec/default/nope/main?command=true&output=1", context,
                                     headers="Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n")
        assert (status, body) == (404, b"pod does not exist")
        status, _, body = await _get(port, f"/exec/default/web-{env.node}/wrong-uid/main?command=true&output=1",
                                     context, headers="Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n")
        assert (status, body) == (404, b"pod not found")


# --- through the real API server -------------------------------------------------------------


def _register_node(control_plane: ControlPlane, node: str, port: int) -> None:
    """The Node object as the node-registration code would publish it: InternalIP and the
    kubelet port are all the API server needs to dial us. Made with admin credentials so this
    test stands on the kubelet API alone."""
    manifest = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    control_plane.kubectl("create", "-f", "-", input=json.dumps(manifest))
    status = {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                       {"type": "Hostname", "address": node}],
                         "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}}
    control_plane.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(status))


def _api_pod(name: str, node: str, command: str) -> dict[str, Any]:
    """The pod the API server checks exec/logs requests against: the mirror of our static pod."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-{node}", "namespace": "default"},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", command]}]}}


async def test_kubectl_logs_exec_and_port_forward_through_the_api_server(
        containerd: Any, tmp_path: Path, control_plane: ControlPlane) -> None:
    port = _free_port()
    settings = _server_settings(port, authentication={"x509": {"client_ca_file": control_plane.ca_file}})
    pf = "mkdir -p /www; echo hello-through-the-api > /www/index.html; exec httpd -f -p 8080 -h /www"
    async with running_agent(containerd, tmp_path, **settings) as env:
        node = env.node

        def kubectl(*args: str, **kwargs: Any) -> Any:
            return control_plane.kubectl(*args, **kwargs)

        await anyio.to_thread.run_sync(_register_node, control_plane, node, port)
        try:
            env.write("web.yaml", pod_manifest("web", WEB))
            env.write("pf.yaml", pod_manifest("pf", pf))
            web_id = (await env.wait_seen_running("web")).id
            await env.wait_running("pf")
            for name, command in (("web", WEB), ("pf", pf)):
                await anyio.to_thread.run_sync(
                    lambda n=name, c=command: kubectl("create", "-f", "-", input=json.dumps(_api_pod(n, node, c))))
            # kubectl port-forward refuses a pod whose phase is not Running; with no pod status
            # writer in this standalone agent, say so by hand (the API server does not look).
            running = json.dumps({"status": {"phase": "Running"}})
            await anyio.to_thread.run_sync(lambda: kubectl("patch", "pod", f"pf-{node}", "--subresource=status",
                                                           "--type=merge", "-p", running))

            async def logged() -> bool:
                got = await anyio.to_thread.run_sync(lambda: kubectl("logs", f"web-{node}", check=False))
                return got.returncode == 0 and got.stdout == "one\ntwo\nthree\n"

            await wait_for(logged, 30, "kubectl logs through the API server")
            tail = await anyio.to_thread.run_sync(lambda: kubectl("logs", f"web-{node}", "--tail=1"))
            assert tail.stdout == "three\n"

            done = await anyio.to_thread.run_sync(lambda: kubectl("exec", f"web-{node}", "--", "sh", "-c",
                                                                  "echo from-exec; echo to-stderr >&2"))
            assert (done.stdout, done.stderr) == ("from-exec\n", "to-stderr\n")
            failed = await anyio.to_thread.run_sync(lambda: kubectl("exec", f"web-{node}", "--", "sh", "-c", "exit 7",
                                                                    check=False))
            assert failed.returncode == 7
            echoed = await anyio.to_thread.run_sync(lambda: kubectl("exec", "-i", f"web-{node}", "--", "head", "-n1",
                                                                    input="typed-in\n"))
            assert echoed.stdout == "typed-in\n"

            await _follow_with_kubectl(control_plane, env, node, web_id)
            await _port_forward_with_kubectl(control_plane, node)
        finally:
            await anyio.to_thread.run_sync(lambda: kubectl("delete", "pod", f"web-{node}", f"pf-{node}",
                                                           "--grace-period=0", "--force", check=False))
            await anyio.to_thread.run_sync(lambda: kubectl("delete", "node", node, "--wait=false", check=False))


async def _follow_with_kubectl(control_plane: ControlPlane, env: AgentEnv, node: str, web_id: str) -> None:
    marker = f"followed-{uuid.uuid4().hex[:8]}"
    command = [str(control_plane.binary("kubectl")), "--kubeconfig", str(control_plane.kubeconfig_admin),
               "logs", "-f", "--tail=1", f"web-{node}"]
    async with await anyio.open_process(command) as process:
        assert process.stdout is not None
        seen = b""
        try:
            with anyio.fail_after(30):
                while b"three\n" not in seen:
                    seen += await process.stdout.receive()
                await env.client.exec_sync(web_id, ["sh", "-c", f"echo {marker} > /proc/1/fd/1"], timeout=10)
                while marker.encode() not in seen:
                    seen += await process.stdout.receive()
        finally:
            process.terminate()
    assert seen == f"three\n{marker}\n".encode()


async def _port_forward_with_kubectl(control_plane: ControlPlane, node: str) -> None:
    local = _free_port()
    command = [str(control_plane.binary("kubectl")), "--kubeconfig", str(control_plane.kubeconfig_admin),
               "port-forward", f"pod/pf-{node}", f"{local}:8080"]
    async with await anyio.open_process(command) as process:
        assert process.stdout is not None
        try:
            seen = b""
            with anyio.fail_after(30):
                while b"Forwarding from" not in seen:
                    try:
                        seen += await process.stdout.receive()
                    except anyio.EndOfStream:
                        assert process.stderr is not None
                        ended = await process.stderr.receive()
                        raise AssertionError(f"kubectl port-forward ended: {ended!r}") from None

            async def fetched() -> bytes:
                try:
                    async with await anyio.connect_tcp("127.0.0.1", local) as stream:
                        await stream.send(b"GET / HTTP/1.0\r\n\r\n")
                        body = b""
                        with anyio.fail_after(10):
                            while True:
                                try:
                                    body += await stream.receive()
                                except (anyio.EndOfStream, anyio.BrokenResourceError):
                                    return body
                except OSError:
                    return b""

            body = await wait_for(fetched, 30, "a page through kubectl port-forward")
            assert body.startswith(b"HTTP/1.") and body.endswith(b"hello-through-the-api\n")
        finally:
            process.terminate()


async def test_cluster_mode_kubectl_logs_and_exec(containerd: Any, tmp_path: Path,
                                                  control_plane: ControlPlane) -> None:
    """The whole path of issue 5: the agent registers its Node (advertising the kubelet port),
    the scheduler places a pod created with kubectl on it, and `kubectl logs` / `kubectl exec`
    reach the pod through the API server and this server (served by default in cluster mode)."""
    node = f"k{uuid.uuid4().hex[:8]}"
    port = _free_port()
    settings = {"address": "127.0.0.1", "port": port, "kubeconfig": control_plane.node_kubeconfig(node),
                "authentication": {"x509": {"client_ca_file": control_plane.ca_file}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"web-{node}", "namespace": "default"},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", WEB]}]}}

    def kubectl(*args: str, **kwargs: Any) -> Any:
        return control_plane.kubectl(*args, **kwargs)

    try:
        async with running_agent(containerd, tmp_path, node=node, **settings):
            await anyio.to_thread.run_sync(lambda: kubectl("create", "-f", "-", input=json.dumps(pod)))

            async def logged() -> bool:
                got = await anyio.to_thread.run_sync(lambda: kubectl("logs", f"web-{node}", check=False))
                return got.returncode == 0 and got.stdout == "one\ntwo\nthree\n"

            await wait_for(logged, 60, "kubectl logs of a scheduled pod")
            done = await anyio.to_thread.run_sync(lambda: kubectl("exec", f"web-{node}", "--", "cat", "/etc/hostname"))
            assert done.stdout == f"web-{node}\n"
            await anyio.to_thread.run_sync(lambda: kubectl("delete", "pod", f"web-{node}", "--wait=true"))
    finally:
        await anyio.to_thread.run_sync(lambda: kubectl("delete", "pod", f"web-{node}", "--grace-period=0", "--force",
                                                       "--ignore-not-found", check=False))
        await anyio.to_thread.run_sync(lambda: kubectl("delete", "node", node, "--wait=false", check=False))


def test_self_signed_certificate_is_made_once(tmp_path: Path) -> None:
    from nodeagent.config import AgentConfig
    from nodeagent.kubeletserver.certs import serving_pair

    config = AgentConfig(node_name="n1", node_ip="10.1.2.3", root_dir=tmp_path)
    cert, key = serving_pair(config)
    assert (cert, key) == (tmp_path / "pki" / "kubelet.crt", tmp_path / "pki" / "kubelet.key")
    assert key.stat().st_mode & 0o777 == 0o600
    made = cert.stat().st_mtime_ns
    time.sleep(0.01)
    assert serving_pair(config) == (cert, key) and cert.stat().st_mtime_ns == made
    given = AgentConfig(root_dir=tmp_path, tls_cert_file=tmp_path / "c", tls_private_key_file=tmp_path / "k")
    assert serving_pair(given) == (tmp_path / "c", tmp_path / "k")
