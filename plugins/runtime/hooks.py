"""Lifecycle hooks, the kubelet's way (pkg/kubelet/lifecycle/handlers.go).

* exec runs through CRI ExecSync with no timeout (the kubelet passes 0); a non-zero exit fails.
* httpGet is sent from the node to the handler's host, else the pod IP. Any HTTP answer counts
  as success: only failing to get one fails the hook. An HTTPS hook answered in plain HTTP is
  retried as HTTP, as the kubelet does. Certificates are not verified.
* sleep sleeps (in real time: it races the runtime's real stop timeout).
* tcpSocket is accepted by the API but the kubelet cannot run it: the hook fails.

A failure raises :class:`HookError` carrying the kubelet's message, which becomes the waiting
message of a container whose postStart failed.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
from anyio.abc import ByteStream

from cri import CriError, RuntimeClient
from nodeagent.model import ContainerPort, HTTPGetAction, LifecycleHandler, Pod

USER_AGENT = "kube-lifecycle/1.37"
MAX_BODY = 10 * 1024  # the kubelet reads at most 10 KiB of a hook's answer


class HookError(Exception):
    """The hook failed; ``str()`` is the kubelet's message."""


@dataclass(frozen=True)
class HookTarget:
    pod: str
    """The pod as the kubelet names it in messages (:func:`format_pod`)."""
    container: str
    container_id: str
    pod_ip: str
    ports: tuple[ContainerPort, ...] = ()
    """The container's ports, for an httpGet hook that names its port."""


def format_pod(pod: Pod) -> str:
    """The kubelet's format.Pod: ``name_namespace(uid)``."""
    return f"{pod.metadata.name}_{pod.metadata.namespace}({pod.uid})"


def go_list(items: list[str]) -> str:
    return "[" + " ".join(items) + "]"


async def run_hook(runtime: RuntimeClient, handler: LifecycleHandler, target: HookTarget) -> None:
    if handler.exec is not None:
        await _exec(runtime, handler.exec.command, target)
    elif handler.http_get is not None:
        await _http(handler.http_get, target)
    elif handler.sleep is not None:
        await anyio.sleep(handler.sleep.seconds)
    else:
        raise HookError("Cannot run handler: invalid handler: tcpSocket is not supported as a lifecycle handler")


async def _exec(runtime: RuntimeClient, command: list[str], target: HookTarget) -> None:
    output = ""
    try:
        result = await runtime.exec_sync(target.container_id, command, timeout=0)
    except CriError as exc:
        error = str(exc.details or exc)
    else:
        output = (result.stdout + result.stderr).decode(errors="replace")
        if result.exit_code == 0:
            return
        error = (f"command '{' '.join(command)}' exited with {result.exit_code}: "
                 f"{result.stderr.decode(errors='replace')}")
    raise HookError(f"Exec lifecycle hook ({go_list(command)}) for Container {json.dumps(target.container)} "
                    f"in Pod {json.dumps(target.pod)} failed - error: {error}, "
                    f"message: {json.dumps(output)}")


async def _http(action: HTTPGetAction, target: HookTarget) -> None:
    try:
        host = action.host or target.pod_ip
        if not host:
            raise OSError("the pod has no IP address yet")
        port = _port(action.port, target)
        path = action.path if action.path.startswith("/") else "/" + action.path
        if action.scheme == "HTTPS":
            try:
                await _get(host, port, path, action, tls=True)
                return
            except (ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass  # a plain-HTTP server: the kubelet retries without TLS
        await _get(host, port, path, action, tls=False)
    except (OSError, ValueError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
        raise HookError(f"HTTP lifecycle hook ({action.path}) for Container {json.dumps(target.container)} "
                        f"in Pod {json.dumps(target.pod)} failed - error: {exc}") from None


def _port(port: int | str, target: HookTarget) -> int:
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for p in target.ports:
        if p.name == port:
            return p.container_port
    raise ValueError(f"couldn't find port: {port} in {target.container}")


async def _get(host: str, port: int, path: str, action: HTTPGetAction, *, tls: bool) -> None:
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    headers = {"Host": netloc, "User-Agent": USER_AGENT, "Accept": "*/*"}
    for h in action.http_headers:
        headers[h.name.title() if h.name.lower() in ("host", "user-agent", "accept") else h.name] = h.value
    url = urlsplit(path)
    request = f"GET {url.path or '/'}{'?' + url.query if url.query else ''} HTTP/1.1\r\n"
    request += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "Connection: close\r\n\r\n"
    stream: ByteStream
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        stream = await anyio.connect_tcp(host, port, ssl_context=context, tls_standard_compatible=False)
    else:
        stream = await anyio.connect_tcp(host, port)
    async with stream:
        await stream.send(request.encode("latin-1"))
        received = b""
        while b"\r\n" not in received and len(received) < MAX_BODY:
            received += await stream.receive()
    if not received.startswith(b"HTTP/"):
        raise OSError(f"malformed HTTP response {received[:40]!r}")
