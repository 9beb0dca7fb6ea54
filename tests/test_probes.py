"""The probes stage: the probers against local servers, then every probe behaviour end to end
through the agent and the real containerd (busybox pods, periodSeconds 1)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import grpc
import grpc.aio
import pytest
import structlog
from anyio.abc import SocketStream

from cri import types as t
from nodeagent.clock import ManualClock
from nodeagent.model import Container, Pod, Probe
from nodeagent.runtimeview import ContainerRecord, PodRuntime
from nodeagent.stash import Stash
from nodeagent.status import parse_rfc3339
from plugins.probes import grpchealth
from plugins.probes.http import USER_AGENT, probe_http, probe_tcp
from plugins.probes.prober import ProbeError, expand, resolve_port
from plugins.probes.results import Outcome, ProbeState, ProbeType, Result
from plugins.probes.worker import PodProbes
from tests.agent_helpers import BUSYBOX_IMAGE, pod_manifest, running_agent, wait_for

pytestmark = pytest.mark.anyio


# --- the threshold rule -------------------------------------------------------------------


def _state(kind: ProbeType, **probe: Any) -> ProbeState:
    return ProbeState(kind, Probe.model_validate({"exec": {"command": ["true"]}, **probe}))


def test_initial_results_per_probe_type() -> None:
    assert _state(ProbeType.READINESS).result is Result.FAILURE
    assert _state(ProbeType.LIVENESS).result is Result.SUCCESS
    assert _state(ProbeType.STARTUP).result is Result.UNKNOWN


def test_thresholds_count_consecutive_results() -> None:
    state = _state(ProbeType.READINESS, failureThreshold=3, successThreshold=2)
    assert state.record(Outcome.SUCCESS) is None  # 1 of 2
    assert state.record(Outcome.SUCCESS) is Result.SUCCESS
    assert state.record(Outcome.FAILURE) is None
    assert state.record(Outcome.FAILURE) is None
    assert state.record(Outcome.SUCCESS) is None  # the run of failures is broken
    assert state.record(Outcome.FAILURE) is None
    assert state.record(Outcome.FAILURE) is None
    assert state.record(Outcome.FAILURE) is Result.FAILURE
    assert state.result is Result.FAILURE and not state.on_hold  # readiness never holds
    assert state.record(Outcome.WARNING) is None  # a warning counts as a success
    assert state.record(Outcome.WARNING) is Result.SUCCESS


def test_liveness_failure_puts_the_instance_on_hold_until_reset() -> None:
    state = _state(ProbeType.LIVENESS, failureThreshold=2)
    assert state.record(Outcome.FAILURE) is None and not state.on_hold
    assert state.record(Outcome.FAILURE) is Result.FAILURE
    assert state.on_hold and state.run == 0
    state.reset()  # a new instance
    assert state.result is Result.SUCCESS and not state.on_hold


def test_probe_defaults_and_validation() -> None:
    probe = Probe.model_validate({"tcpSocket": {"port": 80}, "periodSeconds": 0})
    assert (probe.initial_delay_seconds, probe.period_seconds, probe.timeout_seconds,
            probe.success_threshold, probe.failure_threshold) == (0, 10, 1, 1, 3)
    with pytest.raises(ValueError):
        Probe.model_validate({"tcpSocket": {"port": 80}, "exec": {"command": ["true"]}})
    with pytest.raises(ValueError):
        Container.model_validate({"name": "c", "image": "i",
                                  "livenessProbe": {"exec": {"command": ["true"]}, "successThreshold": 2}})


def test_exec_command_expands_literal_env_only() -> None:
    env = {"FILE": "/tmp/ready"}
    assert expand("test -f $(FILE)", env) == "test -f /tmp/ready"
    assert expand("$$(FILE) $(MISSING) $(FILE", env) == "$(FILE) $(MISSING) $(FILE"


def test_named_and_numeric_ports() -> None:
    container = Container.model_validate({"name": "c", "image": "i", "ports": [{"name": "http", "containerPort": 8080}]})
    assert resolve_port("http", container) == 8080
    assert resolve_port("9090", container) == 9090
    assert resolve_port(81, container) == 81
    with pytest.raises(ProbeError):
        resolve_port("nope", container)


# --- the loop's timing, on the injectable clock --------------------------------------------


class _FakeRuntime:
    def __init__(self) -> None:
        self.execs: list[float] = []
        self.clock: ManualClock | None = None

    async def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 0) -> t.ExecSyncResult:
        assert self.clock is not None
        self.execs.append(self.clock.now())
        return t.ExecSyncResult(exit_code=0)


class _FakeReporter:
    def __init__(self) -> None:
        self.results: list[tuple[str, bool | None, bool | None]] = []

    def container_probe_result(self, container: str, *, ready: bool | None = None,
                               started: bool | None = None) -> None:
        self.results.append((container, ready, started))


@dataclass
class _FakeContext:
    """Just what the probe loops touch of a PodContext."""

    pod: Pod
    clock: ManualClock
    runtime: _FakeRuntime
    observed: PodRuntime
    status: _FakeReporter = field(default_factory=_FakeReporter)
    node: Any = None
    log: Any = field(default_factory=lambda: structlog.get_logger("test"))
    published: list[Any] = field(default_factory=list)
    terminating: bool = False
    stash: Stash = field(default_factory=Stash)

    async def runtime_changed(self, timeout: float | None = None) -> None:
        await anyio.sleep_forever()

    async def publish(self, event: Any) -> None:
        self.published.append(event)


async def test_initial_delay_and_period_follow_the_clock() -> None:
    clock = ManualClock()
    runtime = _FakeRuntime()
    runtime.clock = clock
    pod = Pod.model_validate({"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": [{
        "name": "main", "image": "busybox",
        "readinessProbe": {"exec": {"command": ["true"]}, "initialDelaySeconds": 15, "periodSeconds": 10}}]}})
    start = clock.now()
    record = ContainerRecord(id="c1", name="main", pod_uid="u", sandbox_id="s", attempt=0, state="running",
                             created_at=0, started_at=int(start * 1e9))
    ctx = _FakeContext(pod, clock, runtime, PodRuntime(uid="u", containers=(record,)))
    async with anyio.create_task_group() as tg:
        tg.start_soon(PodProbes(ctx).run)  # type: ignore[arg-type]
        for _ in range(30):  # 30 s in 1 s steps
            await anyio.wait_all_tasks_blocked()
            clock.advance(1)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    # Ticks at 0 and 10 fall in the initial delay; then one probe per period.
    assert [round(at - start) for at in runtime.execs] == [20, 30]
    assert ctx.status.results[0] == ("main", False, None)  # not ready until the first success
    assert ctx.status.results[-1] == ("main", True, None)


# --- the probers against local servers ----------------------------------------------------


@asynccontextmanager
async def _http_server(routes: dict[str, Callable[[str], bytes]]) -> AsyncIterator[int]:
    """A tiny HTTP server: each route answers a whole raw response for the request's head."""

    async def serve(stream: SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            text = head.decode()
            path = text.split(" ")[1]
            handler = routes.get(path.split("?")[0])
            if handler is None:
                await stream.send(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                return
            if path == "/slow":
                await anyio.sleep(5)
            await stream.send(handler(text))

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield port
        tg.cancel_scope.cancel()


def _ok(body: str) -> Callable[[str], bytes]:
    return lambda _head: f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()


def _redirect(location: str) -> Callable[[str], bytes]:
    body = f'<a href="{location}">Found</a>.'
    return lambda _head: f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()


async def test_http_prober_codes_redirects_headers_and_timeout() -> None:
    def echo_headers(head: str) -> bytes:
        body = head.split("\r\n", 1)[1]
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + f"{len(body):x}\r\n{body}\r\n0\r\n\r\n".encode()

    routes = {
        "/ok": _ok("fine"),
        "/fail": lambda _h: b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n",
        "/local": _redirect("/ok"),
        "/away": _redirect("http://0.0.0.0/"),
        "/loop": _redirect("/loop"),
        "/headers": echo_headers,
        "/big": lambda _h: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * 50_000,
        "/slow": _ok("late"),
        "/bare-lf": lambda _h: b"HTTP/1.1 302 Found\r\nLocation: http://0.0.0.0/\nX: y\n\nmoved",  # CGI style
    }
    async with _http_server(routes) as port:
        base = f"http://127.0.0.1:{port}"
        assert await probe_http(f"{base}/ok", [], 2) == (Outcome.SUCCESS, "fine")
        assert await probe_http(f"{base}/fail", [], 2) == (Outcome.FAILURE, "HTTP probe failed with statuscode: 500")
        assert await probe_http(f"{base}/local", [], 2) == (Outcome.SUCCESS, "fine")
        assert await probe_http(f"{base}/away", [], 2) == (
            Outcome.WARNING, 'Probe terminated redirects, Response body: <a href="http://0.0.0.0/">Found</a>.')
        assert await probe_http(f"{base}/bare-lf", [], 2) == (
            Outcome.WARNING, "Probe terminated redirects, Response body: moved")
        outcome, output = await probe_http(f"{base}/loop", [], 2)
        assert outcome is Outcome.FAILURE and output.endswith("stopped after 10 redirects")
        outcome, output = await probe_http(f"{base}/headers", [("X-Probe", "yes")], 2)
        assert outcome is Outcome.SUCCESS
        assert f"User-Agent: {USER_AGENT}" in output and "Accept: */*" in output and "X-Probe: yes" in output
        outcome, output = await probe_http(f"{base}/headers", [("User-Agent", "mine")], 2)
        assert "User-Agent: mine" in output and USER_AGENT not in output
        outcome, output = await probe_http(f"{base}/big", [], 2)
        assert outcome is Outcome.SUCCESS and len(output) == 10 * 1024
        begin = time.monotonic()
        outcome, output = await probe_http(f"{base}/slow", [], 1)
        assert outcome is Outcome.FAILURE and "Client.Timeout exceeded" in output
        assert time.monotonic() - begin < 3
        assert (await probe_tcp("127.0.0.1", port, 1)) == (Outcome.SUCCESS, "")
    outcome, output = await probe_http(f"http://127.0.0.1:{port}/ok", [], 1)
    assert outcome is Outcome.FAILURE and output.endswith("connect: connection refused")
    outcome, output = await probe_tcp("127.0.0.1", port, 1)
    assert outcome is Outcome.FAILURE and output == f"dial tcp 127.0.0.1:{port}: connect: connection refused"


@asynccontextmanager
async def _grpc_health_server(host: str = "127.0.0.1") -> AsyncIterator[int]:
    """A grpc.health.v1 server without generated code: the service "sick" is NOT_SERVING."""

    async def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"\x08\x02" if request == grpchealth.encode_request("sick") else b"\x08\x01"

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)})])
    port = server.add_insecure_port(f"{host}:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


async def test_grpc_prober_against_a_local_health_server() -> None:
    assert grpchealth.decode_status(b"\x08\x03\x12\x02ab") == 3  # unknown fields are skipped
    async with _grpc_health_server() as port:
        address = f"127.0.0.1:{port}"
        assert await grpchealth.check(address, "", 2, USER_AGENT) == (True, "service healthy")
        assert await grpchealth.check(address, "sick", 2, USER_AGENT) == (
            False, 'service unhealthy (responded with "NOT_SERVING")')
    healthy, output = await grpchealth.check(address, "", 1, USER_AGENT)
    assert not healthy and output.startswith(f'timeout: failed to connect service "{address}" within 1s')


async def test_grpc_prober_reports_a_server_without_the_health_service() -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        healthy, output = await grpchealth.check(f"127.0.0.1:{port}", "", 2, USER_AGENT)
    finally:
        await server.stop(0)
    assert not healthy
    assert output.startswith("error: this server does not implement the grpc health protocol")


# --- end to end ---------------------------------------------------------------------------


def _probe(handler: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**handler, "periodSeconds": 1, **fields}


def _exec(*cmd: str) -> dict[str, Any]:
    return {"exec": {"command": list(cmd)}}


def _condition(status: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in status.get("conditions", []) if c["type"] == kind), None)


def _main(status: dict[str, Any]) -> dict[str, Any]:
    statuses = status.get("containerStatuses") or [{}]
    return statuses[0]


def _running(status: dict[str, Any]) -> bool:
    return "running" in _main(status).get("state", {})


def _facts(env: Any, name: str, kind: str, **match: Any) -> list[dict[str, Any]]:
    chain = env.agent.trace.chain(f"default/{name}-{env.node}")
    return [e for e in chain if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


AWAY_CGI = """mkdir -p /www/cgi-bin && cat > /www/cgi-bin/away <<'END'
#!/bin/sh
echo "Status: 302 Found"
echo "Location: http://0.0.0.0/"
echo
printf '<a href="http://0.0.0.0/">Found</a>.'
END
chmod +x /www/cgi-bin/away && """


async def test_readiness_probes_drive_ready_for_exec_http_and_tcp(containerd: Any, tmp_path: Path) -> None:
    httpd = "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"
    pods = {
        # Not ready until the file exists; the container creates it after a few seconds.
        "exec-later": pod_manifest("exec-later", command="sleep 3; touch /tmp/ready; sleep 3600",
                                   container={"readinessProbe": _probe(_exec("test", "-f", "/tmp/ready"))}),
        "http-ok": pod_manifest("http-ok", command=httpd, container={
            "ports": [{"name": "web", "containerPort": 8080}],
            "readinessProbe": _probe({"httpGet": {"path": "/index.html", "port": "web"}})}),
        "http-closed": pod_manifest("http-closed", command=httpd, container={
            "readinessProbe": _probe({"httpGet": {"path": "/", "port": 81}})}),
        "tcp-ok": pod_manifest("tcp-ok", command="exec nc -ll -p 9000 -e true", container={
            "readinessProbe": _probe({"tcpSocket": {"port": 9000}})}),
        "tcp-closed": pod_manifest("tcp-closed", command="sleep 3600", container={
            "readinessProbe": _probe({"tcpSocket": {"port": 9001}})}),
        # A redirect to another host is not followed: a success with one warning (busybox CGI).
        "http-away": pod_manifest("http-away", command=AWAY_CGI + httpd, container={
            "readinessProbe": _probe({"httpGet": {"path": "/cgi-bin/away", "port": 8080}})}),
        # The exec timeout is enforced: a command slower than timeoutSeconds fails.
        "exec-slow": pod_manifest("exec-slow", command="sleep 3600", container={
            "readinessProbe": _probe(_exec("sleep", "5"), timeoutSeconds=1, failureThreshold=1)}),
    }
    async with running_agent(containerd, tmp_path) as env:
        for name, manifest in pods.items():
            env.write(f"{name}.yaml", manifest)

        # Running but not ready: the initial readiness result is Failure.
        status = await wait_for(lambda: _when(env, "exec-later", _running), 60, "exec-later running")
        assert _condition(status, "Ready") == "False" and _condition(status, "ContainersReady") == "False"
        assert _main(status)["ready"] is False and _main(status)["started"] is True
        assert next(c["message"] for c in status["conditions"] if c["type"] == "Ready") == (
            "containers with unready status: [main]")

        for name in ("exec-later", "http-ok", "tcp-ok", "http-away"):
            status = await wait_for(lambda n=name: _when(env, n, lambda s: _condition(s, "Ready") == "True"),
                                    60, f"{name} Ready")
            assert _main(status)["ready"] is True and _main(status)["restartCount"] == 0
            if name == "exec-later":
                # Ready's lastTransitionTime is when the probe succeeded, not when the container
                # started (upstream's "not ready before initial delay" compares the two).
                became_ready = _rfc3339(next(c for c in status["conditions"] if c["type"] == "Ready")
                                        ["lastTransitionTime"])
                started = _rfc3339(_main(status)["state"]["running"]["startedAt"])
                assert became_ready - started >= 3
        assert _facts(env, "exec-later", "ProbeResultChanged", probe="Readiness", result="Success")
        assert _facts(env, "exec-later", "ProbeFailed", probe="Readiness")

        # The failing ones have been probed (and failed) a few times by now, and stay unready.
        failed = await wait_for(lambda: _when_facts(env, "http-closed", "ProbeFailed", 3), 30, "http-closed failing")
        assert failed[0]["message"].startswith("Readiness probe failed: Get \"http://")
        assert failed[0]["message"].endswith(":81/\": dial tcp " + failed[0]["message"].split("//")[1].split("/")[0]
                                             + ": connect: connection refused")
        tcp = await wait_for(lambda: _when_facts(env, "tcp-closed", "ProbeFailed", 3), 30, "tcp-closed failing")
        assert tcp[0]["message"].endswith(":9001: connect: connection refused")
        slow = await wait_for(lambda: _when_facts(env, "exec-slow", "ProbeFailed", 1), 30, "exec-slow timing out")
        assert slow[0]["message"] == 'Readiness probe failed: command "sleep 5" timed out'
        # A run of failures is told up to the threshold (3), not once a second forever; a
        # warning that stays is told once.
        await anyio.sleep(2)
        assert len(_facts(env, "tcp-closed", "ProbeFailed")) == 3
        assert [e["message"] for e in _facts(env, "http-away", "ProbeWarned")] == [
            'Readiness probe warning: Probe terminated redirects, Response body: <a href="http://0.0.0.0/">Found</a>.']
        for name in ("http-closed", "tcp-closed", "exec-slow"):
            status = env.status_of(name)
            assert _running(status) and _main(status)["ready"] is False, name
            assert _condition(status, "Ready") == "False" and _main(status)["restartCount"] == 0, name


async def _when(env: Any, name: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    status = env.status_of(name)
    return status if status and check(status) else None


async def _when_facts(env: Any, name: str, kind: str, n: int) -> list[dict[str, Any]] | None:
    found = _facts(env, name, kind)
    return found if len(found) >= n else None


async def test_liveness_failure_restarts_the_container_with_the_probe_grace(containerd: Any, tmp_path: Path) -> None:
    # sh as PID 1 ignores SIGTERM, so only the SIGKILL after the grace period ends it: the
    # probe's 2 s must be used, not the pod's 30 s.
    manifest = pod_manifest(
        "unhealthy", command="echo ok > /tmp/health; sleep 2; rm /tmp/health; sleep 3600",
        terminationGracePeriodSeconds=30,
        container={"livenessProbe": _probe(_exec("cat", "/tmp/health"), failureThreshold=2,
                                           terminationGracePeriodSeconds=2)})
    async with running_agent(containerd, tmp_path) as env:
        env.write("unhealthy.yaml", manifest)
        first = await env.wait_running("unhealthy", timeout=60)
        status = await wait_for(lambda: _when(env, "unhealthy", lambda s: _main(s).get("restartCount", 0) >= 1),
                                45, "a restart after the liveness failure")
        assert status["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
        killed = _facts(env, "unhealthy", "UnhealthyContainerKilled")
        assert len(killed) >= 1
        assert killed[0]["container_id"] == first.id and killed[0]["probe"] == "Liveness"
        assert killed[0]["grace_period_seconds"] == 2
        assert killed[0]["message"] == "Container main failed liveness probe, will be restarted"
        failed = [e for e in _facts(env, "unhealthy", "ProbeFailed") if e["container_id"] == first.id]
        assert [e["consecutive_failures"] for e in failed] == [1, 2]  # the threshold, then the instance is on hold
        assert failed[0]["message"].startswith("Liveness probe failed: cat: can't open '/tmp/health'")
        assert killed[0]["at"] - failed[-1]["at"] < 15  # about 2 s: far from the pod's 30 s
        # The new instance is probed afresh (and fails again in its turn).
        new = await wait_for(lambda: _new_instance_failed(env, first.id), 30, "the new instance probed")
        assert new["consecutive_failures"] == 1
        # Kill what runs now: the next restart waits out a 10 s back-off, so the pod's removal
        # does not have to sit through the pod's 30 s grace period.
        for container in await env.running_containers("unhealthy"):
            await env.client.stop_container(container.id, 0)


async def _new_instance_failed(env: Any, old: str) -> dict[str, Any] | None:
    return next((e for e in _facts(env, "unhealthy", "ProbeFailed") if e["container_id"] != old), None)


async def test_startup_probe_gates_liveness_and_readiness(containerd: Any, tmp_path: Path) -> None:
    failing_liveness = _probe(_exec("false"), failureThreshold=1)
    pods = {
        # The startup probe never succeeds in this test: liveness never runs, so no restart.
        "never-started": pod_manifest("never-started", container={
            "startupProbe": _probe(_exec("false"), failureThreshold=60),
            "livenessProbe": failing_liveness,
            "readinessProbe": _probe(_exec("true"))}),
        # Started after ~3 s: then readiness turns it Ready and liveness kills it.
        "started-later": pod_manifest("started-later", command="sleep 3; touch /tmp/started; sleep 3600", container={
            "startupProbe": _probe(_exec("test", "-f", "/tmp/started"), failureThreshold=60),
            "readinessProbe": _probe(_exec("true")),
            "livenessProbe": _probe(_exec("false"), failureThreshold=3)}),
    }
    async with running_agent(containerd, tmp_path) as env:
        for name, manifest in pods.items():
            env.write(f"{name}.yaml", manifest)
        status = await wait_for(lambda: _when(env, "started-later", _running), 60, "started-later running")
        assert _main(status)["started"] is False and _main(status)["ready"] is False

        ready = await wait_for(lambda: _when(env, "started-later", lambda s: _main(s)["ready"] is True),
                               30, "started-later ready after its startup probe")
        assert _main(ready)["started"] is True and _condition(ready, "Ready") == "True"
        await wait_for(lambda: _when(env, "started-later", lambda s: _main(s)["restartCount"] >= 1),
                       45, "started-later killed by liveness once started")
        chain = [e for e in env.agent.trace.chain(f"default/started-later-{env.node}")
                 if e["kind"] in ("ProbeResultChanged", "ProbeFailed")]
        started = next(i for i, e in enumerate(chain) if e["kind"] == "ProbeResultChanged")
        assert (chain[started]["probe"], chain[started]["result"]) == ("Startup", "Success")
        assert chain[0]["probe"] == "Startup"  # failed until the file existed
        assert all(e["probe"] == "Startup" for e in chain[:started])  # nothing else ran before

        status = env.status_of("never-started")
        assert _running(status), status
        assert _main(status)["started"] is False and _main(status)["ready"] is False
        assert _main(status)["restartCount"] == 0
        assert _facts(env, "never-started", "ProbeFailed", probe="Startup")
        assert not _facts(env, "never-started", "ProbeFailed", probe="Liveness")
        assert not _facts(env, "never-started", "ProbeResultChanged", probe="Readiness")


async def test_a_terminating_pod_keeps_readiness_probes_and_stops_liveness(containerd: Any, tmp_path: Path) -> None:
    # Upstream's "should mark readiness on pods to false while pod is in progress of terminating":
    # on SIGTERM the container removes its readiness file and lingers; the pod must turn unready
    # while it still runs. The liveness probe fails from then on too, yet kills nothing.
    script = ("trap 'rm -f /tmp/ready; sleep 8; exit 0' TERM; touch /tmp/ready; "
              "while true; do sleep 1; done")
    manifest = pod_manifest("linger", command=script, terminationGracePeriodSeconds=30, container={
        "readinessProbe": _probe(_exec("cat", "/tmp/ready"), failureThreshold=1),
        "livenessProbe": _probe(_exec("cat", "/tmp/ready"), failureThreshold=1)})
    async with running_agent(containerd, tmp_path) as env:
        env.write("linger.yaml", manifest)
        await wait_for(lambda: _when(env, "linger", lambda s: _condition(s, "Ready") == "True"), 60, "linger Ready")
        uid = env.uid_of("linger")
        env.remove("linger.yaml")
        status = await wait_for(lambda: _when(env, "linger", lambda s: _condition(s, "Ready") == "False"),
                                30, "unready while terminating")
        assert "running" in _main(status)["state"]  # still in its grace period
        assert env.agent.status.all()[uid][3].value == "Terminating"
        # Gone in the end, and never killed by the liveness probe on the way.
        await wait_for(lambda: _gone(env, uid), 60, "linger torn down")
        kills = [e for e in env.agent.trace.chain(f"default/linger-{env.node}") if e["kind"] == "UnhealthyContainerKilled"]
        assert kills == []


async def _gone(env: Any, uid: str | None) -> bool:
    return uid not in env.agent.status.all()


def _sidecar(command: str, **probes: Any) -> dict[str, Any]:
    return {"name": "side", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", command], "restartPolicy": "Always",
            **probes}


async def test_sidecars_are_probed_too(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("side-ready.yaml", pod_manifest("side-ready", initContainers=[_sidecar(
            "sleep 3; touch /tmp/ready; sleep 3600", readinessProbe=_probe(_exec("test", "-f", "/tmp/ready")))]))
        env.write("side-unhealthy.yaml", pod_manifest("side-unhealthy", initContainers=[_sidecar(
            "sleep 3600", livenessProbe=_probe(_exec("false"), failureThreshold=1))]))

        def side(status: dict[str, Any]) -> dict[str, Any]:
            return (status.get("initContainerStatuses") or [{}])[0]

        status = await wait_for(lambda: _when(env, "side-ready", _running), 60, "side-ready's main container running")
        assert "running" in side(status)["state"] and side(status)["ready"] is False
        assert next(c["message"] for c in status["conditions"] if c["type"] == "ContainersReady") == (
            "containers with unready status: [side]")
        status = await wait_for(lambda: _when(env, "side-ready", lambda s: _condition(s, "Ready") == "True"),
                                30, "side-ready Ready once its sidecar is")
        assert side(status)["ready"] is True

        await wait_for(lambda: _when(env, "side-unhealthy", lambda s: side(s).get("restartCount", 0) >= 1),
                       45, "the unhealthy sidecar restarted")
        killed = _facts(env, "side-unhealthy", "UnhealthyContainerKilled")
        assert killed and killed[0]["container"] == "side"


async def test_a_sidecar_with_a_startup_probe_holds_back_the_next_containers(
        containerd: Any, tmp_path: Path) -> None:
    # The kubelet starts what follows a sidecar only once the sidecar has started, which with a
    # startup probe means: once that probe passed (upstream's "should be ready immediately after
    # startupProbe succeeds" depends on it).
    async with running_agent(containerd, tmp_path) as env:
        env.write("gated.yaml", pod_manifest("gated", initContainers=[_sidecar(
            "sleep 4; touch /tmp/started; sleep 3600",
            startupProbe=_probe(_exec("test", "-f", "/tmp/started"), failureThreshold=30))]))
        status = await wait_for(lambda: _when(env, "gated", _running), 60, "gated's main container running")
        (passed,) = _facts(env, "gated", "ProbeResultChanged", probe="Startup", result="Success")
        (started,) = [e for e in _facts(env, "gated", "ContainerStarted") if e["container"] == "main"]
        assert started["at"] >= passed["at"]
        assert status["initContainerStatuses"][0]["started"] is True


async def test_grpc_probes_host_network_and_pod_ip(containerd: Any, tmp_path: Path) -> None:
    """The gRPC prober end to end: no busybox gRPC server exists, so the healthy case is a Python
    grpc.health.v1 server on the host, probed through a hostNetwork pod (the node's IP); the
    failing case is a regular pod whose IP has nothing listening on the port."""
    async with _grpc_health_server("0.0.0.0") as port, running_agent(containerd, tmp_path) as env:
        env.write("grpc-host.yaml", pod_manifest("grpc-host", hostNetwork=True, container={
            "readinessProbe": _probe({"grpc": {"port": port}})}))
        env.write("grpc-sick.yaml", pod_manifest("grpc-sick", hostNetwork=True, container={
            "readinessProbe": _probe({"grpc": {"port": port, "service": "sick"}})}))
        env.write("grpc-closed.yaml", pod_manifest("grpc-closed", container={
            "readinessProbe": _probe({"grpc": {"port": 2333}})}))
        await wait_for(lambda: _when(env, "grpc-host", lambda s: _condition(s, "Ready") == "True"), 60, "grpc-host Ready")
        sick = await wait_for(lambda: _when_facts(env, "grpc-sick", "ProbeFailed", 1), 30, "grpc-sick failing")
        assert sick[0]["message"] == 'Readiness probe failed: service unhealthy (responded with "NOT_SERVING")'
        assert env.status_of("grpc-sick")["containerStatuses"][0]["ready"] is False
        # Nothing listening on the pod IP's port: a failure after the timeout, not an error (P14).
        closed = await wait_for(lambda: _when_facts(env, "grpc-closed", "ProbeFailed", 1), 45, "grpc-closed failing")
        assert closed[0]["message"].startswith('Readiness probe failed: timeout: failed to connect service "')
        assert closed[0]["message"].endswith(':2333" within 1s')
        assert env.status_of("grpc-closed")["containerStatuses"][0]["ready"] is False


# The stage contract for probes runs in tests/test_contract.py (TestProbesContract).


def _rfc3339(value: str) -> float:
    parsed = parse_rfc3339(value)
    assert parsed is not None, value
    return parsed
