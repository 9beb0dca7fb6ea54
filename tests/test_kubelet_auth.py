"""Who may use the kubelet API (nodeagent/kubeletserver/authn.py, authz.py): the kubelet's
authenticator chain and Webhook authorization against the real kube-apiserver.

Units: the request → attributes table of the 1.37 kubelet (every row of the reference's 2.3
table), the verb mapping, the token carriers, the review cache; configuration the kubelet
refuses. Integration: a cluster-mode agent with the secure defaults (x509 against the
kubeconfig's CA, TokenReview, SubjectAccessReview) reached by an anonymous client, another
node's certificate, ServiceAccount tokens with and without RBAC, the API server itself
(`kubectl logs/exec`), the caches counted on the API server's own metrics, and a
SubjectAccessReview that cannot be answered (the API server stopped).
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from controlplane import ControlPlane
from nodeagent.agent import Agent
from nodeagent.config import AgentConfig, ConfigError
from nodeagent.kubeletserver import authn, authz
from nodeagent.kubeletserver.review import ReviewCache
from nodeagent.kubeletserver.wire import parse_head
from tests.agent_helpers import make_config, pod_manifest, running_agent, wait_for
from tests.test_kubelet_server import WEB, _client_context, _connect, _free_port, _get, _read_head

pytestmark = pytest.mark.anyio

# --- units: attributes -------------------------------------------------------------------

# Every row of the 1.37 table (reference §2.3): path → subresources tried in order.
ATTRIBUTE_TABLE = [
    ("/pods", ["pods", "proxy"]),
    ("/runningpods/", ["pods", "proxy"]),
    ("/runningpods", ["pods", "proxy"]),
    ("/allocatedPods", ["pods", "proxy"]),
    ("/allocatedPods/default/web/uid-1", ["pods", "proxy"]),
    ("/healthz", ["healthz", "proxy"]),
    ("/healthz/syncloop", ["healthz", "proxy"]),
    ("/configz", ["configz", "proxy"]),
    ("/stats/summary", ["stats"]),
    ("/stats", ["stats"]),
    ("/metrics", ["metrics"]),
    ("/metrics/cadvisor", ["metrics"]),
    ("/metrics/resource", ["metrics"]),
    ("/metrics/probes", ["metrics"]),
    ("/metrics/slis", ["metrics"]),
    ("/logs/", ["log"]),
    ("/logs/kubelet.log", ["log"]),
    ("/checkpoint/default/web/main", ["checkpoint"]),
    ("/statusz", ["statusz"]),
    ("/flagz", ["configz"]),
    ("/exec/default/web/main", ["proxy"]),
    ("/attach/default/web/main", ["proxy"]),
    ("/portForward/default/web", ["proxy"]),
    ("/run/default/web/main", ["proxy"]),
    ("/containerLogs/default/web/main", ["proxy"]),
    ("/debug/pprof/heap", ["proxy"]),
    ("/debug/flags/v", ["proxy"]),
    ("/nope", ["proxy"]),
    # isSubpath: the registered path itself or below it, never a longer name.
    ("/statsx", ["proxy"]),
    ("/podsx", ["proxy"]),
    ("/healthzz", ["proxy"]),
]


@pytest.mark.parametrize(("path", "subresources"), ATTRIBUTE_TABLE)
def test_attribute_table(path: str, subresources: list[str]) -> None:
    user = authn.UserInfo("u", groups=("g",))
    attrs = authz.attributes(user, "GET", path, "node-1")
    assert [a.subresource for a in attrs] == subresources
    assert all((a.resource, a.name, a.api_version, a.verb, a.user) == ("nodes", "node-1", "v1", "get", user)
               for a in attrs)


@pytest.mark.parametrize(("method", "verb"), [("POST", "create"), ("GET", "get"), ("PUT", "update"),
                                              ("PATCH", "patch"), ("DELETE", "delete"), ("HEAD", ""),
                                              ("OPTIONS", ""), ("CONNECT", "")])
def test_verb_mapping(method: str, verb: str) -> None:
    assert authz.verb(method) == verb


def test_denied_and_error_bodies() -> None:
    user = authn.UserInfo("system:anonymous", groups=("system:unauthenticated",))
    attrs = authz.attributes(user, "GET", "/pods", "n")
    assert authz.forbidden_message(attrs) == (
        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[pods proxy])\n")
    head = authz.attributes(user, "HEAD", "/exec/a/b/c", "n")
    assert authz.forbidden_message(head) == (
        "Forbidden (user=system:anonymous, verb=, resource=nodes, subresource(s)=[proxy])\n")
    assert authz.error_message(attrs[1]) == (
        "Authorization error (user=system:anonymous, verb=get, resource=nodes, subresource=proxy)")


# --- units: where credentials come from ------------------------------------------------------


def _request(*headers: str, target: str = "/pods") -> Any:
    return parse_head((f"GET {target} HTTP/1.1\r\nHost: n\r\n" + "".join(h + "\r\n" for h in headers)
                       + "\r\n").encode())


def _protocol(token: str) -> str:
    return authn.BEARER_PROTOCOL_PREFIX + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def test_bearer_header_and_websocket_protocol() -> None:
    assert authn.bearer_token(_request("Authorization: Bearer abc")) == "abc"
    assert authn.bearer_token(_request("Authorization: bearer abc")) == "abc"
    assert authn.bearer_token(_request("Authorization: Basic abc")) is None
    assert authn.bearer_token(_request("Authorization: Bearer ")) is None
    assert authn.bearer_token(_request()) is None

    upgrade = ("Connection: Upgrade", "Upgrade: websocket")
    both = _request(*upgrade, f"Sec-WebSocket-Protocol: {_protocol('tok.en')}, v4.channel.k8s.io")
    assert authn.websocket_token(both) == "tok.en"
    # Not a websocket: the subprotocol is no credential.
    assert authn.websocket_token(_request(f"Sec-WebSocket-Protocol: {_protocol('x')}, v4.channel.k8s.io")) is None
    for bad, message in (
        (f"Sec-WebSocket-Protocol: {_protocol('x')}", "missing additional subprotocol"),
        (f"Sec-WebSocket-Protocol: {_protocol('x')}, {_protocol('y')}, v4.channel.k8s.io",
         "multiple base64.bearer.authorization tokens specified"),
        (f"Sec-WebSocket-Protocol: {authn.BEARER_PROTOCOL_PREFIX}eA==, v4.channel.k8s.io",
         "invalid base64.bearer.authorization token encoding"),
    ):
        with pytest.raises(authn.AuthenticationError, match=message):
            authn.websocket_token(_request(*upgrade, bad))
    # What goes on to the runtime carries no credential, and keeps the protocol it speaks.
    cleaned = _request(*upgrade, "Authorization: Bearer abc",
                       f"Sec-WebSocket-Protocol: {_protocol('tok')}, v4.channel.k8s.io").without_credentials()
    assert cleaned.header("Authorization") is None
    assert cleaned.header("Sec-WebSocket-Protocol") == "v4.channel.k8s.io"


def test_certificate_identity() -> None:
    peer = {"subject": ((("organizationName", "system:nodes"),), (("organizationName", "extra"),),
                        (("commonName", "system:node:a"),))}
    assert authn.certificate_user(peer) == authn.UserInfo("system:node:a", groups=("system:nodes", "extra"))


async def test_review_cache_ttl_single_flight_and_errors() -> None:
    now = [0.0]
    cache: ReviewCache[str, str] = ReviewCache(entries=2, clock=lambda: now[0])
    calls: list[str] = []
    release = anyio.Event()

    async def fetch(value: str, ttl: float) -> tuple[str, float]:
        calls.append(value)
        await release.wait()
        return value, ttl

    results: list[str] = []
    async with anyio.create_task_group() as tg:
        for _ in range(5):  # five at once: one review
            tg.start_soon(lambda: _append(results, cache.get("a", lambda: fetch("A", 10))))
        await anyio.sleep(0.05)
        release.set()
    assert results == ["A"] * 5 and calls == ["A"]
    assert await cache.get("a", lambda: fetch("again", 10)) == "A"  # within the TTL
    now[0] = 10.0
    assert await cache.get("a", lambda: fetch("B", 0)) == "B"  # expired; a TTL of 0 keeps nothing
    assert await cache.get("a", lambda: fetch("C", 10)) == "C"

    async def failing() -> tuple[str, float]:
        raise RuntimeError("no answer")

    with pytest.raises(RuntimeError):
        await cache.get("b", failing)
    assert await cache.get("b", lambda: fetch("D", 10)) == "D"  # an error is not kept
    await cache.get("c", lambda: fetch("E", 10))  # the bound: the least recently used goes
    assert await cache.get("a", lambda: fetch("F", 10)) == "F"


async def _append(out: list[str], value: Any) -> None:
    out.append(await value)


# --- units: configurations the kubelet refuses ------------------------------------------------


def test_no_authenticator_refuses_to_start(tmp_path: Path) -> None:
    base = make_config(tmp_path, "unix:///nonexistent.sock", enable_server=True)
    with pytest.raises(ConfigError, match="^no authentication method configured"):
        Agent(base)
    # Standalone, a webhook has no API server to ask.
    webhook = base.model_copy(update={"authentication": AgentConfig.model_validate(
        {"authentication": {"webhook": {"enabled": True}}}).authentication})
    with pytest.raises(ConfigError, match="^no client provided, cannot use webhook authentication$"):
        Agent(webhook)
    sar = AgentConfig.model_validate({**base.model_dump(), "authentication": {"anonymous": {"enabled": True}},
                                      "authorization": {"mode": "Webhook"}})
    with pytest.raises(ConfigError, match="^no client provided, cannot use webhook authorization$"):
        Agent(sar)
    # Anonymous must be asked for; then the standalone default is AlwaysAllow.
    anonymous = AgentConfig.model_validate({**base.model_dump(), "authentication": {"anonymous": {"enabled": True}}})
    server = Agent(anonymous).kubelet_server
    assert server is not None and isinstance(server.authorizer, authz.AlwaysAllow)
    # Not serving at all needs nothing.
    assert Agent(base.model_copy(update={"enable_server": None})).kubelet_server is None


def test_kubelet_configuration_fields() -> None:
    config = AgentConfig.model_validate({
        "authentication": {"x509": {"clientCAFile": "/ca.crt"}, "webhook": {"enabled": True, "cacheTTL": "0s"},
                           "anonymous": {"enabled": False}},
        "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "0s", "cacheUnauthorizedTTL": "10s"}},
        "streamingConnectionIdleTimeout": "30m",
    })
    # 0s (what kubeadm writes) means the kubelet's default.
    assert config.authentication.webhook.cache_ttl == 120.0
    assert config.authorization.webhook.cache_authorized_ttl == 300.0
    assert config.authorization.webhook.cache_unauthorized_ttl == 10.0
    assert config.streaming_connection_idle_timeout == 1800.0
    for mode, message in (("", "no authorization mode specified"), ("RBAC", "unknown authorization mode RBAC")):
        with pytest.raises(ValueError, match=message):
            AgentConfig.model_validate({"authorization": {"mode": mode}})


# --- through the real API server ----------------------------------------------------------------


def _reviews(cp: ControlPlane) -> dict[str, float]:
    """TokenReviews and SubjectAccessReviews the API server has answered, from its metrics."""
    text = cp.kubectl("get", "--raw", "/metrics").stdout
    counts = {"tokenreviews": 0.0, "subjectaccessreviews": 0.0}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        resource = re.search(r'resource="([^"]*)"', line)
        if resource and resource.group(1) in counts and 'verb="POST"' in line:
            counts[resource.group(1)] += float(line.rsplit(" ", 1)[1])
    return counts


async def _reviews_now(cp: ControlPlane) -> dict[str, float]:
    return await anyio.to_thread.run_sync(_reviews, cp)


def _service_account(cp: ControlPlane, name: str, *, proxy: bool) -> str:
    """A ServiceAccount's token; with ``proxy``, bound to `get nodes/proxy` (and only that)."""
    cp.kubectl("create", "serviceaccount", name, "-n", "default")
    if proxy:
        cp.kubectl("create", "clusterrole", f"{name}-proxy", "--verb=get", "--resource=nodes/proxy")
        cp.kubectl("create", "clusterrolebinding", f"{name}-proxy", f"--clusterrole={name}-proxy",
                   f"--serviceaccount=default:{name}")
    return cp.kubectl("create", "token", name, "-n", "default").stdout.strip()


def _can(cp: ControlPlane, who: str) -> bool:
    done = cp.kubectl("auth", "can-i", "get", "nodes", "--subresource=proxy", f"--as={who}", check=False)
    return done.stdout.strip() == "yes"


async def _ws_exec(port: int, path: str, context: ssl.SSLContext, protocols: str) -> tuple[int, dict[str, str], bytes]:
    """A websocket upgrade; returns the status, headers and what followed until the server closed."""
    key = base64.b64encode(os.urandom(16)).decode()
    async with await _connect(port, context) as stream:
        await stream.send((f"GET {path} HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                           f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
                           f"Sec-WebSocket-Protocol: {protocols}\r\n\r\n").encode())
        status, headers, rest = await _read_head(stream)
        with anyio.fail_after(30):
            while True:
                try:
                    rest += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
    return status, headers, rest


async def test_cluster_mode_authentication_and_authorization(containerd: Any, tmp_path: Path,
                                                             control_plane: ControlPlane) -> None:
    """The secure defaults of cluster mode against the real kube-apiserver: anonymous gets
    401, another node's certificate 403 with the kubelet's body, a ServiceAccount token what
    RBAC grants it (also as a websocket subprotocol), the API server itself everything
    (`kubectl logs/exec`); the second request within the TTLs makes no review; a
    SubjectAccessReview that cannot be answered is a 500."""
    cp = control_plane
    node = f"ka{uuid.uuid4().hex[:8]}"
    other = f"other{uuid.uuid4().hex[:6]}"
    port = _free_port()
    kubeconfig = await anyio.to_thread.run_sync(cp.node_kubeconfig, node)
    suffix = uuid.uuid4().hex[:6]
    reader, nobody = f"reader-{suffix}", f"nobody-{suffix}"

    def kubectl(*args: str, **kwargs: Any) -> Any:
        return cp.kubectl(*args, **kwargs)

    try:
        async with running_agent(containerd, tmp_path, node=node, kubeconfig=kubeconfig, address="127.0.0.1",
                                 port=port) as env:
            server = env.agent.kubelet_server
            assert server is not None and server.authenticator.names == ("x509", "webhook")
            assert isinstance(server.authorizer, authz.WebhookAuthorizer)
            # The kubeconfig embeds the CA: written under rootDir, and trusted for client certs.
            written = env.config.root_dir / "pki" / "client-ca.crt"
            assert written.read_bytes() == cp.ca_file.read_bytes()
            assert written.stat().st_mode & 0o777 == 0o600
            env.write("web.yaml", pod_manifest("web", WEB))
            web_id = (await env.wait_seen_running("web")).id
            pod = f"web-{node}"
            paths = {"pods": "/pods", "containerLogs": f"/containerLogs/default/{pod}/main",
                     "exec": f"/exec/default/{pod}/main?command=true&output=1",
                     "attach": f"/attach/default/{pod}/main?output=1",
                     "portForward": f"/portForward/default/{pod}"}

            # Anonymous: 401 everywhere, and each request is logged with its decision.
            with structlog.testing.capture_logs() as logged:
                for path in paths.values():
                    status, _, body = await _get(port, path, _client_context())
                    assert (status, body) == (401, b"Unauthorized"), path
            entries = [e for e in logged if e["event"] == "kubelet API request"]
            assert len(entries) == len(paths)
            assert all(e["decision"] == "unauthenticated" and e["status"] == 401 and e["user"] is None for e in entries)
            assert {e["path"] for e in entries} == {p.split("?")[0] for p in paths.values()}  # no query in the log

            # Another node's certificate (signed by the cluster CA): authenticated, not allowed.
            pair = await anyio.to_thread.run_sync(
                lambda: cp.pki.issue(f"node-{other}", f"system:node:{other}", orgs=("system:nodes",), client=True))
            other_node = _client_context(pair.cert, pair.key)
            for kind, path in paths.items():
                for method in ("GET", "POST"):
                    if kind in ("pods", "containerLogs") and method == "POST":
                        continue
                    status, _, body = await _get(port, path, other_node, method=method,
                                                 headers="Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n")
                    verb = "get" if method == "GET" else "create"
                    subs = "pods proxy" if kind == "pods" else "proxy"
                    expected = (f"Forbidden (user=system:node:{other}, verb={verb}, resource=nodes, "
                                f"subresource(s)=[{subs}])\n")
                    assert (status, body.decode()) == (403, expected), (kind, method)

            # ServiceAccount tokens: RBAC decides.
            token = await anyio.to_thread.run_sync(lambda: _service_account(cp, reader, proxy=True))
            denied_token = await anyio.to_thread.run_sync(lambda: _service_account(cp, nobody, proxy=False))
            await wait_for(lambda: anyio.to_thread.run_sync(_can, cp, f"system:serviceaccount:default:{reader}"), 30,
                           "RBAC to grant the reader nodes/proxy")  # before a deny is cached for 30 s
            bearer = f"Authorization: Bearer {token}\r\n"
            before = await _reviews_now(cp)
            reviewer = authn.token_reviewer(server.authenticator)
            assert reviewer is not None
            sent_before = (server.authorizer.sent, reviewer.sent)
            status, _, body = await _get(port, "/pods", _client_context(), headers=bearer)
            assert status == 200 and json.loads(body)["kind"] == "PodList"
            middle = await _reviews_now(cp)
            assert middle["tokenreviews"] == before["tokenreviews"] + 1
            # [pods proxy]: pods is not granted, proxy is: two reviews.
            assert middle["subjectaccessreviews"] == before["subjectaccessreviews"] + 2
            # Within the TTLs: no review at all.
            status, _, body = await _get(port, "/pods", _client_context(), headers=bearer)
            assert status == 200
            assert await _reviews_now(cp) == middle
            sent_after = (server.authorizer.sent, reviewer.sent)
            assert sent_after == (sent_before[0] + 2, sent_before[1] + 1)

            async def logs_through_token() -> bool:
                status, _, body = await _get(port, paths["containerLogs"], _client_context(), headers=bearer)
                return status == 200 and body == b"one\ntwo\nthree\n"

            await wait_for(logs_through_token, 30, "the pod's log with the reader's token")
            # The websocket form of the token; the runtime sees (and echoes) only v4.
            exec_path = f"/exec/default/{pod}/main?command=echo&command=ws-token&output=1"
            status, headers, rest = await _ws_exec(port, exec_path, _client_context(),
                                                   f"{_protocol(token)}, v4.channel.k8s.io")
            assert status == 101 and headers["sec-websocket-protocol"] == "v4.channel.k8s.io"
            assert b"ws-token" in rest

            # Without the binding: 403; the deny is cached too.
            denied = f"Authorization: Bearer {denied_token}\r\n"
            status, _, body = await _get(port, "/pods", _client_context(), headers=denied)
            assert (status, body.decode()) == (403, f"Forbidden (user=system:serviceaccount:default:{nobody}, "
                                                    "verb=get, resource=nodes, subresource(s)=[pods proxy])\n")
            counted = await _reviews_now(cp)
            status, _, _ = await _get(port, "/pods", _client_context(), headers=denied)
            assert status == 403 and await _reviews_now(cp) == counted
            # A token the API server rejects: 401, and asked about once per TTL.
            for _ in range(2):
                status, _, body = await _get(port, "/pods", _client_context(),
                                             headers="Authorization: Bearer garbage\r\n")
                assert (status, body) == (401, b"Unauthorized")
            assert (await _reviews_now(cp))["tokenreviews"] == counted["tokenreviews"] + 1

            # The API server's own client (kube-apiserver-kubelet-client, no group: allowed
            # through kubeadm's ClusterRoleBinding) reaches the mirror pod's logs and exec.
            async def logged() -> bool:
                got = await anyio.to_thread.run_sync(lambda: kubectl("logs", pod, check=False))
                return got.returncode == 0 and got.stdout == "one\ntwo\nthree\n"

            await wait_for(logged, 60, "kubectl logs through the API server")
            done = await anyio.to_thread.run_sync(lambda: kubectl("exec", pod, "--", "sh", "-c", "echo via-api"))
            assert done.stdout == "via-api\n"
            with structlog.testing.capture_logs() as logged_api:
                await anyio.to_thread.run_sync(lambda: kubectl("logs", pod, "--tail=1"))
            api_entry = next(e for e in logged_api if e["event"] == "kubelet API request")
            assert (api_entry["user"], api_entry["decision"], api_entry["status"], api_entry["verb"]) == (
                "kube-apiserver-kubelet-client", "allowed", 200, "get")
            assert api_entry["groups"] == "system:authenticated"

            # The authorizer cannot answer: 500 with the kubelet's message (a fresh identity,
            # so nothing is cached for it).
            fresh = await anyio.to_thread.run_sync(lambda: cp.pki.issue(f"user-{suffix}", f"someone-{suffix}",
                                                                        client=True))
            await anyio.to_thread.run_sync(cp.stop_component, "kube-apiserver")
            try:
                status, _, body = await _get(port, "/pods", _client_context(fresh.cert, fresh.key))
                assert (status, body.decode()) == (500, f"Authorization error (user=someone-{suffix}, verb=get, "
                                                        "resource=nodes, subresource=pods)")
            finally:
                await anyio.to_thread.run_sync(cp.start_component, "kube-apiserver")
            assert env.agent.ready.is_set()
            _ = web_id
    finally:
        for args in (("delete", "clusterrolebinding", f"{reader}-proxy"), ("delete", "clusterrole", f"{reader}-proxy"),
                     ("delete", "serviceaccount", reader, nobody, "-n", "default"),
                     ("delete", "pod", f"web-{node}", "--grace-period=0", "--force"),
                     ("delete", "node", node, "--wait=false")):
            await anyio.to_thread.run_sync(lambda a=args: kubectl(*a, "--ignore-not-found", check=False))
