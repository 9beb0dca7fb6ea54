"""Cluster mode, the node's pods (issue 5 §2): pods created with kubectl are scheduled by the
real scheduler onto nodeagent, run in containerd, show their status through the API and are
deleted gracefully; the kubelet's Events; mirror pods for static pods; an agent restart and an
API server outage leave running pods alone.

Against the real control plane (`control_plane`) and containerd (`containerd`).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from lightkube.resources.core_v1 import Pod as ApiPodObject

from controlplane import ControlPlane
from cri import RuntimeClient
from cri import types as t
from nodeagent import events as ev
from nodeagent import labels as L
from nodeagent.clock import ManualClock
from nodeagent.cluster.kubeevents import KubeEvents
from plugins.runtime.events import ContainerFailed, PullSecretsUnavailable
from plugins.runtime.pullsecrets import missing_message
from tests.agent_helpers import (
    BUSYBOX_IMAGE,
    AgentEnv,
    pod_manifest,
    runtime_objects,
    wait_for,
)
from tests.test_cluster_node import (
    cleanup_node,
    cluster_agent,
    cluster_config,
    delete_node,
    get_json,
    kubectl,
    ready_cluster_node,
    wait_node_ready,
)

pytestmark = pytest.mark.anyio

# Exits at once on SIGTERM: a graceful stop takes about a second, a SIGKILL after the grace
# period would take 30.
GRACEFUL = "trap 'exit 0' TERM; while true; do sleep 1; done"


def api_pod(name: str, node: str, command: str = GRACEFUL, grace: int = 30) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            # Until the projected service-account volume is served by the node (another part of
            # issue 5), pods opt out of the token.
            "automountServiceAccountToken": False,
            # Pin to this test's node (still placed by the scheduler): other tests' stopped nodes
            # may look Ready for a while.
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", command]}],
        },
    }


async def create_pod(cp: ControlPlane, manifest: dict[str, Any]) -> None:
    await kubectl(cp, "create", "-f", "-", input=json.dumps(manifest))


async def wait_running(cp: ControlPlane, name: str, timeout: float = 60.0) -> dict[str, Any]:
    async def running() -> dict[str, Any] | None:
        pod = await get_json(cp, "pod", name)
        status = (pod or {}).get("status") or {}
        return pod if status.get("phase") == "Running" and status.get("podIP") else None

    found: dict[str, Any] = await wait_for(running, timeout, f"pod {name} Running with a podIP in the API")
    return found


async def running_container(env: AgentEnv, uid: str) -> t.Container | None:
    _, containers = await runtime_objects(env.client, env.node)
    found = [c for c in containers if c.labels.get(L.POD_UID) == uid and c.state == t.ContainerState.CONTAINER_RUNNING]
    return found[0] if found else None


async def event_reasons(cp: ControlPlane, uid: str) -> dict[str, dict[str, Any]]:
    events = await get_json(cp, "events", "--field-selector", f"involvedObject.uid={uid}")
    return {e["reason"]: e for e in (events or {}).get("items", [])}


async def test_api_pod_is_scheduled_runs_and_is_deleted_gracefully(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    cp = control_plane
    config = await cluster_config(cp, containerd, tmp_path)
    node = config.node_name
    name = f"web-{uuid.uuid4().hex[:6]}"
    async with ready_cluster_node(cp, containerd, config) as env:
        await create_pod(cp, api_pod(name, node))
        pod = await wait_running(cp, name)
        uid = pod["metadata"]["uid"]
        assert pod["spec"]["nodeName"] == node  # bound by the real scheduler
        status = pod["status"]
        assert status["hostIP"] == config.node_ip
        (cs,) = status["containerStatuses"]
        assert cs["ready"] is True and "running" in cs["state"]
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        container = await running_container(env, uid)
        assert container is not None
        assert cs["containerID"] == f"containerd://{container.id}"

        async def created_and_started() -> dict[str, dict[str, Any]] | None:
            reasons = await event_reasons(cp, uid)
            return reasons if {"Pulled", "Created", "Started"} <= set(reasons) else None

        reasons = await wait_for(created_and_started, 30, "Pulled/Created/Started events")
        assert reasons["Created"]["message"] == "Created container: main"
        assert reasons["Started"]["message"] == "Started container main"
        assert reasons["Pulled"]["message"] == f'Container image "{BUSYBOX_IMAGE}" already present on machine and can be accessed by the pod'
        started = reasons["Started"]
        assert started["source"] == {"component": "kubelet", "host": node}
        assert started["involvedObject"]["fieldPath"] == "spec.containers{main}"

        # kubectl delete: graceful (SIGTERM; the container exits long before its 30 s), and
        # the object goes only once no container of the pod runs.
        begin = time.monotonic()
        await kubectl(cp, "delete", "pod", name, "--wait=false")

        async def gone() -> bool:
            if await get_json(cp, "pod", name) is not None:
                return False
            assert await running_container(env, uid) is None, "pod object deleted while a container runs"
            return True

        await wait_for(gone, 30, f"pod {name} gone from the API")
        assert time.monotonic() - begin < 20, "not graceful: the container was killed after its grace"
        await env.wait_empty(30)
        killing = await wait_for(lambda: _reason(cp, uid, "Killing"), 30, "the Killing event")
        assert killing["message"] == "Stopping container main"


async def _reason(cp: ControlPlane, uid: str, reason: str) -> dict[str, Any] | None:
    return (await event_reasons(cp, uid)).get(reason)


async def test_static_pod_gets_a_mirror_pod(control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    cp = control_plane
    config = await cluster_config(cp, containerd, tmp_path)
    node = config.node_name
    mirror_name = f"static-{node}"
    try:
        async with cluster_agent(cp, containerd, config) as env:
            try:
                node_obj = await wait_node_ready(cp, node)
                env.write("static.json", pod_manifest("static", GRACEFUL, labels={"app": "static"}))

                async def mirrored() -> dict[str, Any] | None:
                    pod = await get_json(cp, "pod", mirror_name)
                    return pod if ((pod or {}).get("status") or {}).get("phase") == "Running" else None

                mirror = await wait_for(mirrored, 60, "the mirror pod, Running")
                static_uid = env.uid_of("static")
                meta = mirror["metadata"]
                assert meta["annotations"][L.CONFIG_MIRROR] == static_uid == meta["annotations"][L.CONFIG_HASH]
                assert meta["uid"] != static_uid
                assert meta["labels"] == {"app": "static"}
                assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": node,
                                                    "uid": node_obj["metadata"]["uid"], "controller": True}]
                container = await env.wait_running("static")
                assert mirror["status"]["containerStatuses"][0]["containerID"] == f"containerd://{container.id}"

                # Deleting the mirror does not touch the static pod; the mirror comes back.
                await kubectl(cp, "delete", "pod", mirror_name, "--wait=false")

                async def recreated() -> dict[str, Any] | None:
                    pod = await get_json(cp, "pod", mirror_name)
                    fresh = pod and pod["metadata"]["uid"] != meta["uid"] and not pod["metadata"].get(
                        "deletionTimestamp")
                    return pod if fresh else None

                await wait_for(recreated, 30, "the mirror pod re-created")
                assert (await env.wait_running("static")).id == container.id

                # The manifest goes: the pod is torn down and its mirror deleted.
                env.remove("static.json")
                await wait_for(lambda: _absent(cp, mirror_name), 30, "the mirror pod deleted")
                await env.wait_empty(30)
            finally:
                await cleanup_node(cp, env)
    finally:
        await delete_node(cp, node)


async def _absent(cp: ControlPlane, name: str) -> bool:
    return await get_json(cp, "pod", name) is None


async def test_restart_and_api_server_outage_leave_pods_running(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    cp = control_plane
    config = await cluster_config(cp, containerd, tmp_path)
    node = config.node_name
    first, second = f"keep-{uuid.uuid4().hex[:6]}", f"late-{uuid.uuid4().hex[:6]}"
    try:
        async with cluster_agent(cp, containerd, config) as env:
            await wait_node_ready(cp, node)
            await create_pod(cp, api_pod(first, node))
            uid = (await wait_running(cp, first))["metadata"]["uid"]
            container = await running_container(env, uid)
            assert container is not None
        # The agent is gone (as after SIGTERM); its pod keeps running.
        async with RuntimeClient(containerd.endpoint) as client:
            _, containers = await runtime_objects(client, node)
            assert container.id in {c.id for c in containers if c.state == t.ContainerState.CONTAINER_RUNNING}

        async with cluster_agent(cp, containerd, config) as env:
            try:
                await wait_node_ready(cp, node)
                cluster = env.agent.cluster
                assert cluster is not None
                # Adopted, not restarted: same container, and the API still says Running.
                await wait_for(lambda: _uid_known(env, uid), 30, "the pod adopted by the new agent")
                assert (await running_container(env, uid)).id == container.id  # type: ignore[union-attr]
                pod = await wait_running(cp, first)
                assert pod["status"]["containerStatuses"][0]["restartCount"] == 0

                # The API server goes away for a while: the pod is not disturbed.
                await anyio.to_thread.run_sync(cp.stop_component, "kube-apiserver")
                await wait_for(lambda: _disconnected(env), 30, "the agent noticing the API server is gone")
                with anyio.move_on_after(6):
                    while True:
                        running = await running_container(env, uid)
                        assert running is not None and running.id == container.id
                        await anyio.sleep(0.5)
                await anyio.to_thread.run_sync(cp.start_component, "kube-apiserver")

                # The agent catches up: a pod created after the API server returned runs.
                await wait_node_ready(cp, node)
                await create_pod(cp, api_pod(second, node))
                await wait_running(cp, second, timeout=60)
                assert (await running_container(env, uid)).id == container.id  # type: ignore[union-attr]
                assert cluster.lease.renewals > 0
            finally:
                await cleanup_node(cp, env)
    finally:
        await delete_node(cp, node)


async def _uid_known(env: AgentEnv, uid: str) -> bool:
    return uid in env.agent.status.all()


async def _disconnected(env: AgentEnv) -> bool:
    return env.agent.cluster is not None and not env.agent.cluster.source.connected


# --- the Event translation (no API needed) --------------------------------------------------


def test_facts_become_the_kubelets_events() -> None:
    events = KubeEvents(api=None, node_name="n1")
    ref = ev.PodRef(uid="u1", name="p", namespace="ns")
    spec = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"initContainers": [{"name": "init", "image": "img:1"}],
                     "containers": [{"name": "main", "image": "img:1"}]}}
    events.translate(ev.PodSpecObserved(pod=ref, origin="api", pod_spec=spec))
    events.translate(ev.ImagePulled(pod=ref, image="img:1", image_ref="sha", already_present=True))
    events.translate(ev.ContainerCreated(pod=ref, container="main", container_id="c1", attempt=0))
    events.translate(ev.ContainerStarted(pod=ref, container="main", container_id="c1"))
    # Found running after a restart: not started by this agent, no Started event.
    events.translate(ev.ContainerStarted(pod=ref, container="main", container_id="old"))
    events.translate(ev.PodWaiting(pod=ref, phase="prepare", reason="FailedMount", message="MountVolume.SetUp failed"))
    events.translate(ev.PodWaiting(pod=ref, phase="permit", reason="GangWaiting"))  # not a kubelet event
    events.translate(ContainerFailed(pod=ref, container="main", reason="CreateContainerConfigError",
                                     message="container has runAsNonRoot and image will run as root"))
    events.translate(PullSecretsUnavailable(pod=ref, container="main", secrets=["regcred"],
                                            message=missing_message(["regcred"])))
    events.translate(ev.PodForgotten(pod=ref))
    events.translate(ev.ContainerCreated(pod=ref, container="main", container_id="c2", attempt=1))  # forgotten pod
    got = [(e.involved.field_path, e.type, e.reason, e.message) for e in events._queue]
    assert got == [
        ("spec.initContainers{init}", "Normal", "Pulled", 'Container image "img:1" already present on machine and can be accessed by the pod'),
        ("spec.containers{main}", "Normal", "Created", "Created container: main"),
        ("spec.containers{main}", "Normal", "Started", "Started container main"),
        ("", "Warning", "FailedMount", "MountVolume.SetUp failed"),
        ("spec.containers{main}", "Warning", "Failed", "Error: container has runAsNonRoot and image will run as root"),
        ("", "Warning", "FailedToRetrieveImagePullSecret",
         "Unable to retrieve some image pull secrets (regcred); attempting to pull the image may not succeed."),
    ]
    assert all(e.involved.uid == "u1" and e.involved.namespace == "ns" for e in events._queue)


class _EventsApi:
    """create() as the API server answers it: 403 in a namespace being deleted."""

    def __init__(self) -> None:
        self.created: list[str] = []

    async def create(self, obj: Any) -> Any:
        if obj.metadata.namespace == "gone":
            raise ApiError(status=Status(code=403, reason="Forbidden", message="namespace gone is being terminated"))
        self.created.append(obj.reason)
        return obj


async def test_a_refused_event_does_not_hold_back_the_others() -> None:
    # Killing events of pods whose namespace is being deleted are refused; retrying them (with
    # waits) in the single sender queue delayed every later Event by minutes in long e2e runs.
    clock = ManualClock()
    api = _EventsApi()
    events = KubeEvents(api=api, node_name="n1", clock=clock)
    doomed = ev.PodRef(uid="u1", name="p", namespace="gone")
    alive = ev.PodRef(uid="u2", name="q", namespace="ns")
    for ref in (doomed, alive):
        events.translate(ev.PodSpecObserved(pod=ref, origin="api", pod_spec={
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "spec": {"containers": [{"name": "main", "image": "img:1"}]}}))
    events.translate(ev.ContainerCreated(pod=doomed, container="main", container_id="c1", attempt=0))
    events.translate(ev.ContainerCreated(pod=alive, container="main", container_id="c2", attempt=0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(events._send_forever)  # record() woke it already
        with anyio.fail_after(5):  # the manual clock never moves: no retry wait may be needed
            while not api.created:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert api.created == ["Created"] and events.dropped == 1


# --- the API pod source against a scripted API (no server needed) ------------------------------


class _Listing:
    def __init__(self, objects: list[Any], version: str) -> None:
        self._objects, self.resourceVersion = objects, version

    async def __aiter__(self) -> Any:
        for obj in self._objects:
            yield obj


class _ScriptedApi:
    """Answers list and watch from scripts; a watch whose script ran out waits forever."""

    def __init__(self, lists: list[tuple[list[dict[str, Any]], str]], watches: list[list[Any]]) -> None:
        self._lists, self._watches = lists, watches
        self.watched_from: list[str | None] = []
        self.go = anyio.Event()
        """Watches answer once the test has looked at the first listing."""

    def list(self, res: Any, **kwargs: Any) -> _Listing:
        objects, version = self._lists.pop(0)
        return _Listing([ApiPodObject.from_dict(o) for o in objects], version)

    async def watch(self, res: Any, *, resource_version: str | None = None, **kwargs: Any) -> Any:
        self.watched_from.append(resource_version)
        await self.go.wait()
        for item in self._watches.pop(0) if self._watches else []:
            if isinstance(item, BaseException):
                raise item
            kind, obj = item
            yield kind, ApiPodObject.from_dict(obj)
        await anyio.sleep_forever()


def _pod(name: str, version: str, *, phase: str = "Running", mirror: bool = False, **meta: Any) -> dict[str, Any]:
    annotations = {L.CONFIG_MIRROR: "hash"} if mirror else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": version,
                         "annotations": annotations, **meta},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": BUSYBOX_IMAGE}]},
            "status": {"phase": phase}}


async def test_api_source_publishes_wanted_pods_deletions_and_relists_on_410() -> None:
    from lightkube import ApiError
    from lightkube.models.meta_v1 import Status

    from nodeagent.cluster.source import ApiPodSource

    web, done, mirror = _pod("web", "5"), _pod("done", "6", phase="Succeeded"), _pod("m", "7", mirror=True)
    status_only = {**web, "metadata": {**web["metadata"], "resourceVersion": "11"},
                   "status": {"phase": "Running", "podIP": "10.0.0.9"}}
    deleting = {**status_only, "metadata": {**status_only["metadata"], "resourceVersion": "12",
                                            "deletionTimestamp": "2030-01-01T00:00:00Z",
                                            "deletionGracePeriodSeconds": 5}}
    done_deleting = {**done, "metadata": {**done["metadata"], "resourceVersion": "13",
                                          "deletionTimestamp": "2030-01-01T00:00:00Z"}}
    gone = ApiError(status=Status(code=410, message="too old resource version"))
    api = _ScriptedApi(
        lists=[([web, done, mirror], "10"), ([], "20")],
        watches=[[("MODIFIED", status_only), ("MODIFIED", deleting), ("MODIFIED", done_deleting), gone]],
    )
    published: list[ev.Event] = []
    finished: list[ev.PodRef] = []

    class Mirrors:
        def __init__(self) -> None:
            self.listed: list[list[dict[str, Any]]] = []

        def mirrors_listed(self, pods: list[dict[str, Any]]) -> None:
            self.listed.append(pods)

        def mirror_seen(self, pod: dict[str, Any]) -> None: ...

        def mirror_gone(self, pod: dict[str, Any]) -> None: ...

    async def publish(event: ev.Event) -> None:
        published.append(event)

    mirrors = Mirrors()
    source = ApiPodSource(api, "n1", publish, mirrors=mirrors, on_finished_deletion=finished.append)
    async with anyio.create_task_group() as tg:
        await tg.start(source.run)
        # After the first listing: only the running pod is wanted; the finished one is not run
        # again; the mirror pod goes to the mirror manager.
        assert source.wanted() == {"uid-web"}
        assert [(type(e).__name__, e.pod.uid) for e in published] == [("PodSpecObserved", "uid-web")]
        assert [[p["metadata"]["name"] for p in pods] for pods in mirrors.listed] == [["m"]]
        api.go.set()
        await wait_for(lambda: _true(api.watched_from == ["10", "20"]), 10, "a relist after 410, then a watch")
        tg.cancel_scope.cancel()
    kinds = [(type(e).__name__, e.pod.uid, getattr(e, "grace_period_seconds", None)) for e in published]
    # A status-only change is not news; the deletion is, with its grace; after the relist the pod
    # is gone from the API, which repeats nothing already requested.
    assert kinds == [("PodSpecObserved", "uid-web", None), ("PodDeletionRequested", "uid-web", 5)]
    assert [r.uid for r in finished] == ["uid-done"]  # deleted by the sink once nothing of it runs
    assert source.resource_version == "20"


async def _true(value: bool) -> bool:
    return value


async def test_status_sink_patches_only_changes_and_deletes_after_a_requested_deletion(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from nodeagent.cluster import statussink
    from nodeagent.cluster.ratelimit import TokenBucket
    from nodeagent.cluster.source import ApiPod, ApiPodSource

    class Api:
        def __init__(self) -> None:
            self.patches: list[tuple[str, str, dict[str, Any]]] = []

        async def patch(self, res: Any, name: str, body: dict[str, Any], *, namespace: str, patch_type: Any) -> None:
            self.patches.append((namespace, name, body))

    deleted: list[tuple[str, str, str, int]] = []

    async def delete_pod(api: Any, namespace: str, name: str, uid: str, grace: int = 0) -> None:
        deleted.append((namespace, name, uid, grace))

    monkeypatch.setattr(statussink, "delete_pod", delete_pod)
    api = Api()
    source = ApiPodSource(api, "n1", publish=lambda e: anyio.lowlevel.checkpoint())
    ref = ev.PodRef(uid="u1", name="web", namespace="ns")
    record = ApiPod(ref=ref, obj={"metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
                                 "status": {"phase": "Pending", "nominatedNodeName": "x"}},
                    fingerprint="", published=True)
    source._pods["u1"] = record
    sink = statussink.ApiStatusSink(api, source, None, TokenBucket(100, 100), is_stopped=lambda uid: True)

    ready = {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": "T1"}
    await sink.write(ref, {"phase": "Pending", "reason": "X", "conditions": [ready]})
    await sink.sync()
    # First write: only what differs from the API's copy; other writers' fields left alone.
    assert api.patches == [("ns", "web", {"metadata": {"uid": "u1"},
                                          "status": {"reason": "X", "conditions": [ready]}})]
    await sink.write(ref, {"phase": "Pending", "reason": "X", "conditions": [{**ready, "lastTransitionTime": "T2"}]})
    await sink.sync()
    assert len(api.patches) == 1  # only a re-stamped time: nothing to write
    await sink.write(ref, {"phase": "Running", "conditions": [{**ready, "status": "True", "lastTransitionTime": "T3"}]})
    await sink.sync()
    # A strategic merge patch: the changed condition by type, with only what changed.
    assert api.patches[-1][2]["status"] == {"phase": "Running", "reason": None, "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "T3"}]}

    # A pod no source runs (an orphan) is not written; forgetting a pod that is not being
    # deleted deletes nothing.
    await sink.write(ev.PodRef(uid="orphan"), {"phase": "Running"})
    await sink.forget(ref)
    await sink.sync()
    assert len(api.patches) == 2 and deleted == [] and sink.idle()

    # Deletion requested through the API: once the worker forgets the pod, it goes, by UID.
    record.deletion_requested = True
    await sink.forget(ref)
    await sink.sync()
    assert deleted == [("ns", "web", "u1", 0)]


# --- ephemeral containers ----------------------------------------------------------------------


async def test_ephemeral_containers_start_once_in_the_running_pod(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    """Upstream's "Ephemeral Containers will start an ephemeral container in an existing pod":
    one added through the ephemeralcontainers subresource runs in the pod, shows in
    ephemeralContainerStatuses, and is never restarted once it exits. One that mounts a volume
    is not started without it (the volume stages mount at prepare, before it existed)."""
    from tests.test_apivolumes import cluster_node, container

    async with cluster_node(containerd, control_plane, tmp_path) as node:
        name = f"eph-{node.name}"
        pod = await node.run_pod(name, container("main"), volumes=[{"name": "scratch", "emptyDir": {}}])
        uid = pod["metadata"]["uid"]
        await wait_for(lambda: node.running(uid, "main"), 60, "main running")
        patch = {"spec": {"ephemeralContainers": [
            {"name": "debugger", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", "echo polo; sleep 3600"],
             "stdin": True, "tty": True},
            {"name": "once", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", "exit 3"]},
            {"name": "mounting", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
             "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}}
        await node.kubectl("patch", "pod", name, "--subresource", "ephemeralcontainers", "--type", "strategic",
                           "-p", json.dumps(patch))
        assert await node.output(uid, "debugger", "echo", "marco") == "marco"

        async def statuses() -> dict[str, dict[str, Any]] | None:
            obj = await get_json(control_plane, "pod", name)
            found = {cs["name"]: cs for cs in (obj or {}).get("status", {}).get("ephemeralContainerStatuses", [])}
            ok = "running" in found.get("debugger", {}).get("state", {}) and \
                 "terminated" in found.get("once", {}).get("state", {}) and \
                 found.get("mounting", {}).get("state", {}).get("waiting", {}).get("reason") == \
                 "CreateContainerConfigError"
            return found if ok else None

        found = await wait_for(statuses, 60, "ephemeralContainerStatuses: debugger running, once terminated, "
                                             "mounting refused")
        assert found["once"]["state"]["terminated"]["exitCode"] == 3
        assert found["mounting"]["state"]["waiting"]["message"] == (
            "volumeMounts of ephemeral container 'mounting' are not supported by nodeagent: scratch at /scratch")
        assert not await node.running(uid, "mounting")
        await anyio.sleep(3)
        _, containers = await runtime_objects(node.env.client, node.env.node)
        onces = [c for c in containers if c.labels.get(L.POD_UID) == uid and c.labels.get(L.CONTAINER_NAME) == "once"]
        assert len(onces) == 1  # never restarted
        status = (await get_json(control_plane, "pod", name))["status"]
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"  # not counted


# --- readiness gates -----------------------------------------------------------------------------


async def test_readiness_gates_hold_ready_until_their_conditions_are_true(
        control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    """Upstream's "should support pod readiness gates": Ready follows the gates' conditions that
    another writer patches into status, and our own status writes never undo those conditions."""
    from tests.test_apivolumes import cluster_node, container

    gates = ["k8s.io/test-condition1", "k8s.io/test-condition2"]
    async with cluster_node(containerd, control_plane, tmp_path) as node:
        name = f"gated-{node.name}"
        pod = await node.run_pod(name, container("main"),
                                 readinessGates=[{"conditionType": g} for g in gates])
        uid = pod["metadata"]["uid"]
        await wait_for(lambda: node.running(uid, "main"), 60, "main running")

        async def ready_condition(expect: str, reason: str | None = None) -> dict[str, Any] | None:
            obj = await get_json(control_plane, "pod", name)
            status = (obj or {}).get("status", {})
            ready = {c["type"]: c for c in status.get("conditions", [])}.get("Ready")
            containers = {c["type"]: c for c in status.get("conditions", [])}.get("ContainersReady")
            if ready is None or containers is None or containers["status"] != "True":
                return None
            if ready["status"] != expect or ready.get("reason") != reason:
                return None
            return ready

        unready = await wait_for(lambda: ready_condition("False", "ReadinessGatesNotReady"), 60,
                                 "containers ready, pod not Ready for its gates")
        assert unready["message"] == ('corresponding condition of pod readiness gate "k8s.io/test-condition1" '
                                      'does not exist., corresponding condition of pod readiness gate '
                                      '"k8s.io/test-condition2" does not exist.')

        async def set_gate(gate: str, value: str) -> None:
            patch = {"status": {"conditions": [{"type": gate, "status": value}]}}
            await node.kubectl("patch", "pod", name, "--subresource", "status", "--type", "strategic",
                               "-p", json.dumps(patch))

        await set_gate(gates[0], "True")
        one = await wait_for(lambda: ready_condition("False", "ReadinessGatesNotReady"), 30, "one gate left")
        await wait_for(lambda: _message_is(control_plane, name, 'corresponding condition of pod readiness gate '
                                           '"k8s.io/test-condition2" does not exist.'), 30, "only gate 2 missing")
        assert one["status"] == "False"
        await set_gate(gates[1], "True")
        await wait_for(lambda: ready_condition("True"), 30, "Ready once both gates are True")
        await set_gate(gates[0], "False")
        unready = await wait_for(lambda: ready_condition("False", "ReadinessGatesNotReady"), 30,
                                 "not Ready once a gate turns False")
        assert unready["message"] == 'the status of pod readiness gate "k8s.io/test-condition1" is not "True", but False'
        # The gates' conditions are the other writer's: ours never removed or reverted them.
        obj = await get_json(control_plane, "pod", name)
        by_type = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
        assert by_type[gates[0]] == "False" and by_type[gates[1]] == "True"


async def _message_is(cp: ControlPlane, name: str, message: str) -> bool:
    obj = await get_json(cp, "pod", name)
    ready = {c["type"]: c for c in (obj or {}).get("status", {}).get("conditions", [])}.get("Ready", {})
    return ready.get("message") == message
