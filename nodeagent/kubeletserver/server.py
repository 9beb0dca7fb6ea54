"""The kubelet API server: TLS on ``address:port``, the kubelet's paths (pkg/kubelet/server).

    GET      /healthz                                   "ok" while the runtime relists
    GET      /pods                                      v1.PodList of the pods the agent runs
    GET      /containerLogs/{ns}/{pod}/{container}      follow previous tailLines timestamps
                                                        sinceSeconds sinceTime limitBytes stream
    GET|POST /exec/{ns}/{pod}[/{uid}]/{container}       command=... input output error tty
    GET|POST /attach/{ns}/{pod}[/{uid}]/{container}     input output error tty
    GET|POST /portForward/{ns}/{pod}[/{uid}]            port (websocket only)
    GET|POST /stats/summary, GET /metrics, /metrics/{resource,cadvisor,probes}, /configz
                                                        (nodestats.py)

Every request is authenticated (authn.py: x509, TokenReview, anonymous), then authorized
(authz.py: SubjectAccessReview or AlwaysAllow), then routed: 401 ``Unauthorized``, 403
``Forbidden (user=..., verb=..., resource=nodes, subresource(s)=[...])``, 500 when the
authorizer cannot answer, as the kubelet. Each request is logged once, with the caller, the
decision and the status. Connections are capped and accept errors survived (listener.py);
the server never listens without TLS.
"""

from __future__ import annotations

import json
import resource
import ssl
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from anyio.abc import ByteStream, SocketListener, SocketStream
from anyio.streams.stapled import MultiListener
from anyio.streams.tls import TLSAttribute, TLSStream

from cri import CriError, RuntimeClient
from cri import types as t
from nodeagent import logreader as lr
from nodeagent.config import AgentConfig
from nodeagent.events import PodRef
from nodeagent.kubeletserver import authn, authz, containerlogs, nodestats, streams
from nodeagent.kubeletserver.certs import server_context, serving_pair
from nodeagent.kubeletserver.wire import Request, StatusRecorder, respond, serve_one
from nodeagent.lifecycle import PodState
from nodeagent.listener import MAX_CONNECTIONS, ConnectionLimit, Slot, accept_loop
from nodeagent.model import Pod
from nodeagent.pleg import Relister
from nodeagent.stages import NodeInfo
from nodeagent.status import StatusWriter

if TYPE_CHECKING:  # only their types: `cryptography` is imported when a certificate is managed
    from nodeagent.certificates.manager import CertificateManager
    from nodeagent.certificates.store import Pair

log = structlog.get_logger("nodeagent.kubeletserver")

HANDSHAKE_TIMEOUT_SECONDS = 10.0
REQUEST_HEAD_TIMEOUT_SECONDS = 30.0
BIND_RETRY_MAX_SECONDS = 60.0
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, ssl.SSLError, OSError)
_ENDED = (PodState.TERMINATING, PodState.TERMINATED)

PodEntry = tuple[PodRef, Pod, dict[str, Any], PodState]


class RequestCounts:
    """kubelet_http_requests_total for both of the kubelet's servers: (server_type, method,
    path label, long_running) -> count; server_type ``readwrite`` (this API) or ``readonly``
    (readonly.py), one family rendered once."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str, str], int] = {}

    def add(self, server_type: str, request: Request) -> None:
        key = (server_type, request.method, path_label(request), _long_running(request))
        self.counts[key] = self.counts.get(key, 0) + 1

    def render(self) -> str:
        if not self.counts:
            return ""
        lines = ["# HELP kubelet_http_requests_total [ALPHA] Number of the http requests received since the "
                 "server started", "# TYPE kubelet_http_requests_total counter"]
        for (server_type, method, path, long_running), count in sorted(self.counts.items()):
            lines.append(f'kubelet_http_requests_total{{long_running="{long_running}",method="{method}",'
                         f'path="{path}",server_type="{server_type}"}} {count}')
        return "\n".join(lines) + "\n"


def enabled(config: AgentConfig) -> bool:
    """``enableServer``, defaulting to cluster mode (a kubeconfig is configured)."""
    if config.kubelet.enable_server is not None:
        return config.kubelet.enable_server
    return config.kubeconfig is not None


class SerialSend(ByteStream):
    """A socket whose sends are serialised. TLSStream flushes TLS records to its transport from
    both ``send`` and ``receive`` (a read can produce a record to write); with one task copying
    in each direction, two flushes could otherwise meet on the socket (BusyResourceError)."""

    def __init__(self, stream: SocketStream) -> None:
        self._stream = stream
        self._lock = anyio.Lock()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._stream.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        async with self._lock:
            await self._stream.send(item)

    async def send_eof(self) -> None:
        async with self._lock:
            await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()

    @property
    def extra_attributes(self) -> Any:
        return self._stream.extra_attributes


class KubeletServer:
    """Reads the agent's state (status writer, relister's runtime cache) and calls the runtime;
    it changes nothing in the agent. ``api`` is the node's API client (cluster mode), used
    for TokenReviews and SubjectAccessReviews only.

    Raises ConfigError when the configuration gives no way to authenticate or names a
    webhook without an API client: the kubelet refuses to start then, and so do we."""

    def __init__(self, config: AgentConfig, *, status: StatusWriter, relister: Relister, runtime: RuntimeClient,
                 healthz: Callable[[], tuple[bool, str]], api: Any = None,
                 max_connections: int | None = None, node: NodeInfo | None = None,
                 serving: CertificateManager | None = None, reads: nodestats.NodeReads | None = None,
                 requests: RequestCounts | None = None) -> None:
        """``serving``: the serverTLSBootstrap certificate manager; the API serves once it holds
        a certificate and loads each renewal in place (no restart, connections stay)."""
        self._config = config
        self._node = node
        self._serving = serving
        self._status = status
        self._relister = relister
        self._runtime = runtime
        self._healthz = healthz
        self._reads = reads
        """The node's stats and metrics (None: those endpoints answer 404)."""
        self.requests = requests if requests is not None else RequestCounts()
        """kubelet_http_requests_total (rendered by whoever owns it: the agent, for both servers)."""
        self._context: ssl.SSLContext | None = None
        self._client_ca = authn.client_ca(config)
        self.authenticator = authn.build(config, api, self._client_ca)
        self.authorizer = authz.build(config, api)
        self.connections = ConnectionLimit(max_connections or _default_max_connections())
        self.decisions: dict[str, int] = {}
        """Requests by decision (allowed, denied, unauthenticated, error), for the metrics."""
        self.port: int | None = None
        """The bound port (the configured one, or the kernel's choice for port 0) once listening."""

    async def run(self, *, task_status: anyio.abc.TaskStatus[int | None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled. Reports the bound port once listening, or None if the port is
        taken: then it keeps trying (the kubelet exits instead; pods matter more than logs)."""
        ca = await anyio.to_thread.run_sync(authn.write_client_ca, self._client_ca) if self._client_ca else None
        if self._serving is not None:
            # Until the cluster signs a serving certificate there is nothing to serve with (the
            # kubelet fails its handshakes meanwhile): report started, listen once one is here.
            task_status.started(None)
            task_status = anyio.TASK_STATUS_IGNORED
            while self._serving.current is None:
                await anyio.sleep(0.5)
            pair = self._serving.current
            cert, key = pair.cert_file, pair.key_file
        else:
            ips = list(self._node.ips or (self._node.ip,)) if self._node is not None else []
            cert, key = await anyio.to_thread.run_sync(lambda: serving_pair(self._config, ips))
        self._context = server_context(cert, key, ca, min_version=self._config.kubelet.tls_min_version)
        if self._serving is not None:
            self._serving.on_rotated(self._reload)
        mode = authz.mode(self._config)
        log.info("kubelet API authentication and authorization", authentication=",".join(self.authenticator.names),
                 client_ca=str(ca) if ca else None, authorization=mode, max_connections=self.connections.limit)
        if self.authenticator.anonymous and mode == "AlwaysAllow":
            log.warning("kubelet API serves every client: authentication.anonymous.enabled with AlwaysAllow")
        listener = await self._listen()
        task_status.started(self.port)
        delay = 1.0
        while listener is None:
            await anyio.sleep(delay)
            delay = min(delay * 2, BIND_RETRY_MAX_SECONDS)
            listener = await self._listen()
        async with listener, anyio.create_task_group() as tg:
            for one in listener.listeners:
                assert isinstance(one, SocketListener)  # what create_tcp_listener makes
                tg.start_soon(accept_loop, one, self._connection, self.connections, tg)

    def _reload(self, pair: Pair) -> None:
        """A renewed serving pair: handshakes from now on present it."""
        assert self._context is not None
        self._context.load_cert_chain(str(pair.cert_file), str(pair.key_file))
        log.info("kubelet API serving certificate reloaded", cert=str(pair.cert_file),
                 not_after=pair.certificate.not_after)

    async def _listen(self) -> MultiListener[SocketStream] | None:
        address, port = self._config.kubelet.address, self._config.kubelet.port
        try:
            listener = await anyio.create_tcp_listener(local_host=address, local_port=port)
        except OSError as exc:
            log.error("kubelet API cannot listen; logs, exec and port-forward fail until it can (retrying)",
                      address=address, port=port, error=str(exc))
            return None
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        log.info("kubelet API listening", url=f"https://{address}:{self.port}")
        return listener

    def render_metrics(self) -> str:
        """nodeagent_kubelet_api_* series, for the agent's /metrics."""
        c = self.connections.counters
        reviewer = authn.token_reviewer(self.authenticator)
        lines = ["# TYPE nodeagent_kubelet_api_connections gauge",
                 f"nodeagent_kubelet_api_connections {self.connections.open}",
                 "# TYPE nodeagent_kubelet_api_connections_total counter"]
        for outcome, count in (("accepted", c.accepted), ("refused", c.refused), ("evicted", c.evicted),
                               ("accept_error", c.accept_errors)):
            lines.append(f'nodeagent_kubelet_api_connections_total{{outcome="{outcome}"}} {count}')
        lines.append("# TYPE nodeagent_kubelet_api_requests_total counter")
        for decision, count in sorted(self.decisions.items()):
            lines.append(f'nodeagent_kubelet_api_requests_total{{decision="{decision}"}} {count}')
        lines.append("# TYPE nodeagent_kubelet_api_reviews_total counter")
        if reviewer is not None:
            lines.append(f'nodeagent_kubelet_api_reviews_total{{kind="TokenReview"}} {reviewer.sent}')
        if isinstance(self.authorizer, authz.WebhookAuthorizer):
            lines.append(f'nodeagent_kubelet_api_reviews_total{{kind="SubjectAccessReview"}} {self.authorizer.sent}')
        return "\n".join(lines) + "\n"

    # --- connections ----------------------------------------------------------------

    async def _connection(self, raw: SocketStream, slot: Slot) -> None:
        assert self._context is not None
        async with raw:
            try:
                with anyio.fail_after(HANDSHAKE_TIMEOUT_SECONDS):
                    tls = await TLSStream.wrap(SerialSend(raw), server_side=True, ssl_context=self._context,
                                               standard_compatible=False)
            except (*_GONE, TimeoutError) as exc:
                log.debug("TLS handshake failed", error=str(exc) or type(exc).__name__)
                return
            client = StatusRecorder(tls)

            async def handle(request: Request) -> None:
                started = time.monotonic()
                outcome = _Outcome()
                try:
                    passed = await self._authorized(client, request, tls.extra(TLSAttribute.peer_certificate, None),
                                                    outcome)
                    if passed is not None:
                        self.connections.activate(slot)
                        await self._route(client, raw, passed)
                finally:
                    self._log_request(request, outcome, client.status, time.monotonic() - started)

            await serve_one(client, handle, head_timeout=REQUEST_HEAD_TIMEOUT_SECONDS, gone=_GONE, log=log,
                            what="kubelet API")

    async def _authorized(self, client: StatusRecorder, request: Request, peer: Mapping[str, Any] | None,
                          outcome: _Outcome) -> Request | None:
        """The request with its credentials removed when it may go on; else the answer is
        sent (401, 403, 500) and None returned. The kubelet's InstallAuthFilter."""
        try:
            user = await self.authenticator.authenticate(request, peer)
        except authn.AuthenticationError as exc:
            log.debug("kubelet API: authentication failed", error=str(exc))
            user = None
        if user is None:
            outcome.decision = "unauthenticated"
            await respond(client, 401, "Unauthorized")
            return None
        outcome.user = user
        attrs = authz.attributes(user, request.method, request.decoded_path, self._config.node_name)
        outcome.verb = attrs[0].verb
        try:
            allowed = await authz.authorize(self.authorizer, attrs)
        except authz.AuthorizationError as exc:
            outcome.decision = "error"
            failed = exc.attributes
            log.error("kubelet API: authorization error", error=str(exc), user=user.name, verb=failed.verb,
                      resource=failed.resource, subresource=failed.subresource)
            await respond(client, 500, authz.error_message(failed))
            return None
        if not allowed:
            outcome.decision = "denied"
            await respond(client, 403, authz.forbidden_message(attrs))
            return None
        outcome.decision = "allowed"
        return request.without_credentials()

    def _log_request(self, request: Request, outcome: _Outcome, status: int | None, seconds: float) -> None:
        # The path only: queries carry exec commands; headers carry tokens.
        self.decisions[outcome.decision] = self.decisions.get(outcome.decision, 0) + 1
        self.requests.add("readwrite", request)
        user = outcome.user
        log.info("kubelet API request", user=user.name if user else None,
                 groups=",".join(user.groups) if user else None, verb=outcome.verb, method=request.method,
                 path=request.path, decision=outcome.decision, status=status, seconds=round(seconds, 3))

    async def _route(self, client: ByteStream, raw: SocketStream, request: Request) -> None:
        parts = request.segments()
        head = parts[0] if parts else ""
        streaming = head in ("exec", "attach", "portForward")
        allowed: tuple[str, ...] = ("GET", "POST") if streaming else ("GET",)
        node_path = request.path.rstrip("/") or "/"
        if self._reads is not None and node_path in nodestats.PATHS:
            allowed = nodestats.PATHS[node_path]
            if request.method not in allowed:
                await respond(client, 405, "Method Not Allowed", extra=[("Allow", ", ".join(allowed))])
                return
            await nodestats.serve(client, request, self._reads)
            return
        known = request.path in ("/healthz", "/pods") or head in ("containerLogs", "exec", "attach", "portForward")
        if not known:
            await respond(client, 404, "404 page not found\n")
            return
        if request.method not in allowed:
            await respond(client, 405, "Method Not Allowed", extra=[("Allow", ", ".join(allowed))])
            return
        if request.path == "/healthz":
            ok, why = self._healthz()
            await respond(client, 200 if ok else 500, "ok" if ok else why)
        elif request.path == "/pods":
            await respond(client, 200, json.dumps(self.pod_list()), "application/json")
        elif head == "containerLogs":
            await self._logs(client, raw, request, parts[1:])
        else:
            try:
                await self._stream(client, request, head, parts[1:])
            except streams.StreamError as exc:
                await respond(client, exc.status, str(exc))

    # --- what the agent runs ---------------------------------------------------------

    def find_pod(self, namespace: str, name: str) -> PodEntry | None:
        """GetPodByName: a pod the agent tracks; a live one wins over a terminating one with the
        same name (an edited static manifest)."""
        found = [e for e in self._status.all().values() if e[0].namespace == namespace and e[0].name == name]
        found.sort(key=lambda e: e[3] in _ENDED)
        return found[0] if found else None

    def pod_list(self) -> dict[str, Any]:
        return pod_list(self._status)

    def _rows(self) -> lr.Rows:
        return [{"uid": uid, "status": status} for uid, (_r, _p, status, _s) in self._status.all().items()]

    # --- /containerLogs ---------------------------------------------------------------

    async def _logs(self, client: ByteStream, raw: SocketStream, request: Request, parts: list[str]) -> None:
        if len(parts) != 3 or not all(parts):
            await respond(client, 404, "404 page not found\n")
            return
        namespace, name, container = parts
        try:
            options = containerlogs.parse_options(request.query)
        except containerlogs.OptionError as exc:
            await respond(client, exc.status, str(exc))
            return
        entry = self.find_pod(namespace, name)
        if entry is None:
            await respond(client, 404, f'pod "{name}" does not exist')
            return
        ref, pod, status, _state = entry
        containers = tuple(c.name for c in (*pod.spec.containers, *pod.spec.ephemeral_containers))
        init = tuple(c.name for c in pod.spec.init_containers)
        if container not in containers + init:
            await respond(client, 404, f'container "{container}" not found in pod "{name}"')
            return
        statuses = {cs["name"]: cs for key in ("containerStatuses", "initContainerStatuses")
                    for cs in status.get(key, [])}
        try:
            directory = lr.pod_log_dir(Path(self._config.kubelet.pod_logs_dir), ref.namespace, ref.name, ref.uid)
        except ValueError as exc:  # hostpaths.UnsafeName: a rejected pod has no log directory
            await respond(client, 404, f'pod "{name}" has no logs: {exc}')
            return
        target = lr.Target(lr.PodDir(ref.namespace, ref.name, ref.uid, directory), containers, init, statuses,
                           from_agent=True)
        subject = containerlogs.LogSubject(target, self._rows)
        await containerlogs.serve_logs(client, subject, container, options, lambda: _closed_by_peer(raw),
                                       time.time_ns())

    # --- /exec /attach /portForward ----------------------------------------------------

    async def _stream(self, client: ByteStream, request: Request, kind: str, parts: list[str]) -> None:
        websocket = request.is_websocket
        if kind == "portForward":
            if len(parts) not in (2, 3):
                raise streams.StreamError(404, "404 page not found")
            namespace, name, uid = parts[0], parts[1], parts[2] if len(parts) == 3 else ""
            ports = streams.forward_ports(request.query, websocket)
            options = None
        else:
            if len(parts) not in (3, 4):
                raise streams.StreamError(404, "404 page not found")
            namespace, name, uid, container = parts[0], parts[1], parts[2] if len(parts) == 4 else "", parts[-1]
            options = streams.stream_options(request.query)
        entry = self.find_pod(namespace, name)
        if entry is None:
            raise streams.StreamError(404, "pod does not exist")
        ref, pod = entry[0], entry[1]
        if uid and uid != ref.uid:
            raise streams.StreamError(404, "pod not found")
        if not request.is_upgrade:
            # The kubelet asks the runtime first; we refuse first, so a plain GET does not
            # leave an unused session token in the runtime.
            raise streams.StreamError(400, "Upgrade request required")
        runtime_pod = self._relister.pod(ref.uid)
        try:
            if kind == "portForward":
                sandbox = runtime_pod.ready_sandbox()
                if sandbox is None:
                    raise streams.StreamError(500, f'pod not found ("{ref.name}_{ref.namespace}")')
                url = await self._runtime.port_forward(sandbox.id, ports)
            else:
                assert options is not None
                record = runtime_pod.latest(container)
                if record is None or not record.running:
                    raise streams.StreamError(500, f'container not found ("{container}")')
                if kind == "exec":
                    url = await self._runtime.exec(t.ExecRequest(
                        container_id=record.id, cmd=request.query.get("command", []), tty=options.tty,
                        stdin=options.stdin, stdout=options.stdout, stderr=options.stderr))
                else:
                    # A process's terminal cannot change after it started: attach uses the
                    # container's own tty setting, as the kubelet does.
                    spec = next((c for c in (*pod.all_containers(), *pod.spec.ephemeral_containers)
                                 if c.name == container), None)
                    tty = spec.tty if spec is not None else options.tty
                    url = await self._runtime.attach(t.AttachRequest(
                        container_id=record.id, stdin=options.stdin, tty=tty, stdout=options.stdout,
                        stderr=options.stderr and not tty))
        except CriError as exc:
            code = exc.code.name if exc.code is not None else ""
            raise streams.StreamError({"NOT_FOUND": 404, "RESOURCE_EXHAUSTED": 429}.get(code, 500), str(exc)) from exc
        log.info("streaming session", kind=kind, pod=f"{ref.namespace}/{ref.name}",
                 protocol=request.header("Upgrade") or "", websocket=websocket)
        await streams.splice(client, request, url,
                             idle_timeout=self._config.kubelet.streaming_connection_idle_timeout)


def pod_list(status: StatusWriter) -> dict[str, Any]:
    """/pods: a v1.PodList of the pods the agent runs, each with the status it reports."""
    items = []
    for ref, pod, current, _state in status.all().values():
        item = pod.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"api_version", "kind"})
        item.setdefault("metadata", {}).update(name=ref.name, namespace=ref.namespace, uid=ref.uid)
        item["status"] = current
        items.append(item)
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


class _Outcome:
    """What the auth filter decided, for the request's log line."""

    def __init__(self) -> None:
        self.decision = "error"
        self.user: authn.UserInfo | None = None
        self.verb: str | None = None


def path_label(request: Request) -> str:
    """The kubelet's ``path`` label: the first segment, ``metrics/<x>`` for metrics, else other."""
    parts = [p for p in request.path.split("/") if p]
    if not parts:
        return "other"
    if parts[0] == "metrics" and len(parts) > 1:
        return f"metrics/{parts[1]}"
    known = ("pods", "stats", "metrics", "logs", "healthz", "configz", "containerLogs", "exec", "attach",
             "portForward", "run", "runningpods", "checkpoint")
    return parts[0] if parts[0] in known else "other"


def _long_running(request: Request) -> str:
    """Streams and followed logs are long running (the kubelet's isLongRunningRequest)."""
    head = request.segments()[0] if request.segments() else ""
    follow = head == "containerLogs" and request.param("follow") in ("true", "1")
    return "true" if head in ("exec", "attach", "portForward") or follow else "false"


def _default_max_connections() -> int:
    """MAX_CONNECTIONS, but never more than a quarter of the open-file limit: the rest of the
    agent (runtime, API, log files) needs descriptors too."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft // 4))


async def _closed_by_peer(raw: SocketStream) -> None:
    """Returns once the client has closed its side. Reads the raw socket under TLS: after the
    request nothing but a close_notify alert and the FIN may arrive, and neither is needed."""
    try:
        while True:
            await raw.receive()
    except _GONE:
        return
