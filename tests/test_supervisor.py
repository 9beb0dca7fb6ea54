"""Nothing stops the agent but a signal (issue 13 §2): the supervisor restarts failed tasks
with back-off, reports each failure once with its traceback, counts it, and lets a start go on
without a task that failed before it was up; subscribers skip the fact they failed on.

The units need no runtime. The integration tests inject a failure into every supervised task
of a real agent — standalone on the session's containerd, and in cluster mode against the real
control plane — and check that the agent and its pods stay up and each task works again.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from nodeagent import events as ev
from nodeagent.backoff import Backoff
from nodeagent.bus import TOPOLOGY, Bus, consume
from nodeagent.clock import ManualClock
from nodeagent.supervisor import STABLE_SECONDS, StrayCancellation, Supervisor
from tests.agent_helpers import BUSYBOX_IMAGE, pod_manifest, running_agent, wait_for

pytestmark = pytest.mark.anyio


class Injected(Exception):
    """The failure the tests inject."""


# --- the supervisor alone --------------------------------------------------------------------


async def _until(predicate: Callable[[], bool], what: str) -> None:
    with anyio.fail_after(5):
        while not predicate():
            await anyio.sleep(0.001)
    assert predicate(), what


async def test_a_failed_task_restarts_with_back_off_and_is_reported_once_with_its_traceback() -> None:
    clock = ManualClock()
    offered: list[ev.Event] = []
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs <= 3:
            raise Injected("boom")
        await anyio.sleep_forever()

    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            sup = Supervisor(tg, offer=lambda e: offered.append(e) or 0, clock=clock,
                             backoff=lambda: Backoff(initial=1.0, maximum=4.0))
            sup.start_soon(flaky, name="flaky")
            await _until(lambda: clock.sleepers == 1, "first back-off")
            assert runs == 1
            clock.advance(0.9)
            await anyio.sleep(0.01)
            assert runs == 1, "restarted before its back-off"
            clock.advance(0.1)
            await _until(lambda: runs == 2 and clock.sleepers == 1, "second run, second back-off")
            clock.advance(1.9)
            await anyio.sleep(0.01)
            assert runs == 2, "the second back-off doubles"
            clock.advance(0.1)
            await _until(lambda: runs == 3 and clock.sleepers == 1, "third run")
            clock.advance(4.0)
            await _until(lambda: runs == 4, "fourth run, which stays up")
            tg.cancel_scope.cancel()

    assert sup.failures == {"flaky": 3}
    assert [(e.task, e.failures, e.restart_in_seconds) for e in offered if isinstance(e, ev.TaskFailed)] == [
        ("flaky", 1, 1.0), ("flaky", 2, 2.0), ("flaky", 3, 4.0)]
    failed = [entry for entry in logs if entry["event"] == "task failed; restarting it"]
    assert len(failed) == 3
    assert "Injected: boom" in failed[0]["traceback"], "the first failure carries its traceback"
    assert all("traceback" not in entry for entry in failed[1:]), "the same error again: one line, no traceback"
    assert 'nodeagent_task_failures_total{task="flaky"} 3' in sup.render_metrics()


async def test_a_task_that_ran_for_a_while_starts_its_back_off_afresh() -> None:
    clock = ManualClock()
    runs = 0

    async def fails_after(seconds: float) -> None:
        nonlocal runs
        runs += 1
        await clock.sleep(seconds)
        raise Injected(f"run {runs}")

    async with anyio.create_task_group() as tg:
        sup = Supervisor(tg, clock=clock, backoff=lambda: Backoff(initial=1.0, maximum=60.0))
        sup.start_soon(fails_after, 0.0, name="quick")
        await _until(lambda: clock.sleepers == 1, "quick failure")
        clock.advance(0)  # the failure itself; back-off 1 s pending
        clock.advance(1.0)
        await _until(lambda: runs == 2, "second run")
        clock.advance(0)
        await _until(lambda: clock.sleepers == 1, "second back-off (2 s)")
        tg.cancel_scope.cancel()

    delays: list[float] = []
    clock = ManualClock()
    runs = 0
    async with anyio.create_task_group() as tg:
        sup = Supervisor(tg, clock=clock, offer=lambda e: delays.append(e.restart_in_seconds) or 0,  # type: ignore
                         backoff=lambda: Backoff(initial=1.0, maximum=60.0))
        sup.start_soon(fails_after, STABLE_SECONDS, name="stable")
        await _until(lambda: clock.sleepers == 1, "running")
        clock.advance(STABLE_SECONDS)
        await _until(lambda: len(delays) == 1, "first failure after a stable minute")
        clock.advance(1.0)
        await _until(lambda: runs == 2 and clock.sleepers == 1, "second run")
        clock.advance(STABLE_SECONDS)
        await _until(lambda: len(delays) == 2, "second failure after a stable minute")
        tg.cancel_scope.cancel()
    assert delays == [1.0, 1.0], "a task that was up for a minute is not in a crash loop"


async def test_start_goes_on_without_a_task_that_failed_before_it_was_up() -> None:
    clock = ManualClock()
    runs = 0

    async def needs_two_tries(*, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise Injected("not yet")
        task_status.started("up")  # after a restart: goes nowhere
        await anyio.sleep_forever()

    async def up_at_once(*, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started("port 1234")
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        sup = Supervisor(tg, clock=clock)
        assert await sup.start(needs_two_tries, name="late") is None
        assert await sup.start(up_at_once, name="ok") == "port 1234"
        clock.advance(2.0)
        await _until(lambda: runs == 2, "restarted in the background")
        tg.cancel_scope.cancel()


async def test_cancellation_is_never_taken_for_a_failure() -> None:
    async def forever() -> None:
        await anyio.sleep_forever()

    with anyio.move_on_after(0.05):
        async with anyio.create_task_group() as tg:
            sup = Supervisor(tg)
            sup.start_soon(forever, name="forever")
    assert sup.failures == {}


async def test_a_stray_cancellation_is_a_failure_and_spares_the_other_tasks() -> None:
    """A CancelledError no cancellation asked for (grpc.aio raises such bare ones) would end the
    task group quietly, every sibling with it; the supervisor takes it for the task's failure."""
    clock = ManualClock()
    runs = 0
    beats = 0

    async def stray() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise asyncio.CancelledError()  # as grpc.aio does when its call is cancelled
        await anyio.sleep_forever()

    async def sibling() -> None:
        nonlocal beats
        while True:
            beats += 1
            await anyio.sleep(0.001)

    async with anyio.create_task_group() as tg:
        sup = Supervisor(tg, clock=clock, backoff=lambda: Backoff(initial=1.0, maximum=1.0))
        sup.start_soon(sibling, name="sibling")
        sup.start_soon(stray, name="stray")
        await _until(lambda: clock.sleepers == 1, "the stray task's back-off")
        clock.advance(1.0)
        await _until(lambda: runs == 2, "the stray task restarted")
        before = beats
        await _until(lambda: beats > before, "the sibling still running")
        tg.cancel_scope.cancel()
    assert sup.failures == {"stray": 1}


@pytest.mark.parametrize("failure", [Injected("poison"), asyncio.CancelledError()], ids=["error", "stray-cancel"])
async def test_a_subscriber_skips_the_fact_it_failed_on_and_keeps_its_queue(failure: BaseException) -> None:
    """An exception, or a CancelledError no cancellation asked for (grpc.aio raises such bare
    ones: it would end the subscriber and quietly cancel its task group), skips that one fact."""
    bus = Bus(TOPOLOGY)
    seen: list[str] = []
    contained: list[Exception] = []

    async def handle(event: ev.Event) -> None:
        if isinstance(event, ev.ManifestRejected) and event.reason == "poison":
            raise failure
        seen.append(getattr(event, "reason", ""))

    for reason in ("a", "poison", "b"):
        await bus.publish(ev.ManifestRejected(path="/x", reason=reason, message=""))
    async with anyio.create_task_group() as tg:
        tg.start_soon(consume, bus.stream("trace"), handle, contained.append)
        await _until(lambda: len(seen) == 2, "the facts after the poison one")
        tg.cancel_scope.cancel()
    assert seen == ["a", "b"] and len(contained) == 1
    expected = Injected if isinstance(failure, Injected) else StrayCancellation
    assert isinstance(contained[0], expected), contained


async def test_a_restarted_subscriber_reads_on_from_the_same_stream() -> None:
    """A subscriber whose loop itself failed is restarted on its stream: what was queued for
    it is still there (closing the stream would lose it and block nothing but itself)."""
    bus = Bus(TOPOLOGY)
    got: list[str] = []
    runs = 0

    async def subscriber() -> None:
        nonlocal runs
        runs += 1
        async with bus.stream("metrics") as inbox:
            async for event in inbox:
                if runs == 1:
                    raise Injected("the loop itself")
                got.append(getattr(event, "reason", ""))

    for reason in ("first", "second"):
        await bus.publish(ev.ManifestRejected(path="/x", reason=reason, message=""))
    clock = ManualClock()
    async with anyio.create_task_group() as tg:
        sup = Supervisor(tg, clock=clock)
        sup.start_soon(subscriber, name="metrics")
        await _until(lambda: clock.sleepers == 1, "failed")
        clock.advance(2.0)
        await _until(lambda: got == ["second"], "the queued fact after the restart")
        await bus.publish(ev.ManifestRejected(path="/x", reason="third", message=""))
        await _until(lambda: got == ["second", "third"], "later facts too")
        tg.cancel_scope.cancel()


# --- failures injected into a real agent -------------------------------------------------------


class Crasher:
    """Wraps a task so that its first run fails when the test says so; later runs are the real
    thing. Installed before the agent starts (the supervisor takes the task when it starts)."""

    def __init__(self, name: str, run: Callable[..., Awaitable[Any]], reports_started: bool = True) -> None:
        self.name = name
        self._run = run
        self._reports_started = reports_started
        self.trigger = anyio.Event()
        self.runs = 0

    async def __call__(self, *args: Any, task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
        self.runs += 1
        if self.runs > 1:
            await (self._run(*args, task_status=task_status) if self._reports_started else self._run(*args))
            return
        async with anyio.create_task_group() as tg:
            if self._reports_started:
                task_status.started(await tg.start(functools.partial(self._run, *args)))
            else:
                tg.start_soon(functools.partial(self._run, *args))
            await self.trigger.wait()
            tg.cancel_scope.cancel()
        raise Injected(f"injected into {self.name}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.containerd
async def test_every_supervised_task_of_a_standalone_agent_survives_an_injected_failure(
        containerd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodeagent import worker as worker_module
    from nodeagent.agent import Agent

    crashers: dict[str, Crasher] = {}
    original_init = Agent.__init__

    def init_with_crashers(self: Agent, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        for name, owner in (("pleg", self.relister), ("status", self.status)):
            crashers[name] = owner.run = Crasher(name, owner.run)  # type: ignore[method-assign]
        crashers["endpoint"] = self._serve = Crasher("endpoint", self._serve)  # type: ignore[method-assign]
        load = self.load_pipeline

        def load_with_crasher() -> Any:
            pipeline = load()
            dra = pipeline.stages["dra"]
            crashers["stage:dra"] = dra.run = Crasher("stage:dra", dra.run)  # type: ignore[attr-defined]
            return pipeline

        self.load_pipeline = load_with_crasher  # type: ignore[method-assign]

    monkeypatch.setattr(Agent, "__init__", init_with_crashers)
    from nodeagent.sources import static
    source_run = static.StaticPodSource.run

    async def source_run_with_crasher(self: static.StaticPodSource, **kwargs: Any) -> None:
        crasher = crashers.setdefault("source:file", Crasher("source:file", functools.partial(source_run, self)))
        await crasher(**kwargs)

    monkeypatch.setattr(static.StaticPodSource, "run", source_run_with_crasher)

    async with running_agent(containerd, tmp_path, enable_server=False, healthz_port=_free_port()) as env:
        agent, sup = env.agent, env.agent.supervisor
        assert sup is not None
        env.write("steady.yaml", pod_manifest("steady"))
        steady = await env.wait_seen_running("steady")

        # Tasks restarted after a failure: each one fails once, is restarted, works again.
        for name in ("pleg", "status", "endpoint", "stage:dra", "source:file"):
            crasher = crashers[name]
            crasher.trigger.set()
            await wait_for(lambda c=crasher: anyio.to_thread.run_sync(lambda: c.runs == 2), 15, f"{name} restarted")
            assert sup.failures.get(name) == 1, sup.failures
        last = agent.relister.last_relist
        await wait_for(lambda: anyio.to_thread.run_sync(lambda: agent.relister.last_relist > last), 10,
                       "the relister relisting again")
        assert agent.endpoint_port is not None
        status, body = await anyio.to_thread.run_sync(_get, agent.endpoint_port, "/healthz")
        assert (status, body) == (200, "ok\n"), "the restarted endpoint answers"

        # Facts a subscriber fails on: contained, the subscriber goes on with the next one.
        from nodeagent import agent as agent_module
        from nodeagent import trace as trace_module

        def poison(event: ev.Event) -> bool:
            return "poison" in (getattr(event, "path", "") + event.pod.uid)

        summarize = trace_module.summarize
        monkeypatch.setattr(trace_module, "summarize",
                            lambda e: (_ for _ in ()).throw(Injected("trace")) if poison(e) else summarize(e))
        event_log = agent_module._EVENT_LOG

        class PoisonedLog:
            def debug(self, kind: str, **fields: Any) -> None:
                if fields.get("path") == "/poison":
                    raise Injected("eventlog")
                event_log.debug(kind, **fields)

        monkeypatch.setattr(agent_module, "_EVENT_LOG", PoisonedLog())

        class PoisonedCounters(dict):  # type: ignore[type-arg]
            def __missing__(self, kind: str) -> int:
                if kind == "ManifestRejected":
                    raise Injected("metrics")
                return 0

        monkeypatch.setattr(agent.metrics, "counters", PoisonedCounters(agent.metrics.counters))
        assert agent.dispatcher is not None
        orphan = agent.dispatcher._orphan
        monkeypatch.setattr(agent.dispatcher, "_orphan",
                            lambda e: (_ for _ in ()).throw(Injected("dispatcher")) if poison(e) else orphan(e))
        await agent.bus.publish(ev.ManifestRejected(path="/poison", reason="Injected", message=""))
        await agent.bus.publish(ev.OrphanFound(pod=ev.PodRef(uid="poison")))
        for name in ("trace", "eventlog", "metrics", "dispatcher"):
            await wait_for(lambda n=name: anyio.to_thread.run_sync(lambda: sup.failures.get(n) == 1), 10,
                           f"{name} contained the fact it failed on")

        # A pod worker that raises: a new worker takes the pod over.
        live = worker_module.unhonoured_fields
        crashed: list[str] = []

        def crash_once(pod: Any) -> list[str]:
            if pod.metadata.name.startswith("crashworker") and not crashed:
                crashed.append(pod.metadata.name)
                raise Injected("injected into a pod worker")
            return live(pod)

        monkeypatch.setattr(worker_module, "unhonoured_fields", crash_once)
        env.write("crashworker.yaml", pod_manifest("crashworker"))
        await env.wait_seen_running("crashworker", timeout=60)
        assert crashed and sup.failures.get("pod-worker") == 1, sup.failures

        # Every task after its failure: a new manifest is read (source), dispatched, run
        # (worker, relister) and its status reaches its file (status writer), traced and counted.
        env.write("after.yaml", pod_manifest("after"))
        await env.wait_seen_running("after")

        async def status_file_running() -> bool:
            files = list((env.config.root_dir / "pod-status").glob(f"default_after-{env.node}_*.json"))
            return bool(files) and json.loads(files[0].read_text())["status"].get("phase") == "Running"

        await wait_for(status_file_running, 15, "the status file of the pod started after the restarts")
        assert [e["kind"] for e in agent.trace.chain(f"default/after-{env.node}")][:1] == ["PodSpecObserved"]
        assert agent.metrics.counters["PodStarted"] >= 3

        # The steady pod never noticed.
        running = await env.running_containers("steady")
        assert [c.id for c in running] == [steady.id]
        assert env.status_of("steady")["containerStatuses"][0]["restartCount"] == 0
        assert agent.ready.is_set()
        metrics = (await anyio.to_thread.run_sync(_get, agent.endpoint_port, "/metrics"))[1]
        for name in ("pleg", "status", "endpoint", "stage:dra", "source:file", "pod-worker", "trace", "eventlog",
                     "metrics", "dispatcher"):
            assert f'nodeagent_task_failures_total{{task="{name}"}} 1' in metrics, name


@pytest.mark.containerd
async def test_every_supervised_cluster_task_survives_an_injected_failure(
        control_plane: Any, containerd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodeagent.agent import Agent
    from tests.test_cluster_node import cluster_config, get_json, kubectl, ready_cluster_node

    names = ("cluster:events", "cluster:mirrors", "cluster:node", "cluster:lease", "cluster:status", "source:api")
    crashers: dict[str, Crasher] = {}
    original_init = Agent.__init__

    def init_with_crashers(self: Agent, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        cluster = self.cluster
        assert cluster is not None
        for name, owner in zip(names, (cluster.events, cluster.mirrors, cluster.node, cluster.lease,
                                       cluster.status_sink, cluster.source), strict=True):
            crashers[name] = owner.run = Crasher(name, owner.run)  # type: ignore[method-assign]

    monkeypatch.setattr(Agent, "__init__", init_with_crashers)
    # An unchanged node status is written every 2 s, so the restarted node task is seen writing.
    config = await cluster_config(control_plane, containerd, tmp_path, node_status_report_frequency=2.0)
    async with ready_cluster_node(control_plane, containerd, config) as env:
        sup, cluster = env.agent.supervisor, env.agent.cluster
        assert sup is not None and cluster is not None
        env.write("static.yaml", pod_manifest("static"))
        steady = await env.wait_seen_running("static")
        for name in names:
            crasher = crashers[name]
            crasher.trigger.set()
            await wait_for(lambda c=crasher: anyio.to_thread.run_sync(lambda: c.runs == 2), 20, f"{name} restarted")
            assert sup.failures.get(name) == 1, sup.failures

        # Each works again: the Lease is renewed, the Node written and Ready, an API pod runs and
        # its status reaches the API, a new static pod gets its mirror, the failures are Events.
        renewals, writes = cluster.lease.renewals, cluster.node.writes
        await wait_for(lambda: anyio.to_thread.run_sync(lambda: cluster.lease.renewals > renewals), 20, "lease renewed")
        await wait_for(lambda: anyio.to_thread.run_sync(lambda: cluster.node.writes > writes), 30, "node status written")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "after", "namespace": "default"},
               "spec": {"nodeName": env.node, "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}]}}
        await kubectl(control_plane, "create", "-f", "-", input=json.dumps(pod))

        async def api_pod_running() -> bool:
            obj = await get_json(control_plane, "pod", "after")
            return bool(obj) and obj.get("status", {}).get("phase") == "Running"

        await wait_for(api_pod_running, 60, "the API pod Running in the API after the restarts")
        env.write("static2.yaml", pod_manifest("static2"))
        await wait_for(lambda: get_json(control_plane, "pod", f"static2-{env.node}"), 60, "the new static pod's mirror")

        async def failure_events() -> list[str]:
            listed = await get_json(control_plane, "events", "--field-selector",
                                    f"involvedObject.kind=Node,involvedObject.name={env.node},reason=NodeAgentTaskFailed")
            return [e["message"] for e in (listed or {}).get("items", [])]

        messages = await wait_for(failure_events, 30, "NodeAgentTaskFailed Events on the Node")
        assert any(m.startswith("cluster:lease failed (1 times): Injected: injected into cluster:lease") for m in
                   await failure_events()), messages
        assert [c.id for c in await env.running_containers("static")] == [steady.id]
        await kubectl(control_plane, "delete", "pod", "after", "--wait=false")
