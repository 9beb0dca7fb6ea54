"""Admission re-checks what the scheduler checked (the kubelet's GeneralPredicates), for pods
no scheduler placed: nodeSelector and required node affinity against the Node's labels (pure
matching, a static pod, an API pod bound straight to a node before and after an administrator
labels the Node), and host ports against the pods already admitted."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from nodeagent.kube import nodeports
from nodeagent.kube.nodeaffinity import MESSAGE, REASON, matches
from nodeagent.kube.taints import first_untolerated, tolerates
from nodeagent.model import Pod
from nodeagent.stages import NodeInfo, NodeView, Verdict
from plugins.tainttoleration import MESSAGE as TAINT_MESSAGE
from plugins.tainttoleration import REASON as TAINT_REASON
from tests.agent_helpers import pod_manifest, running_agent, runtime_objects, wait_for

pytestmark = pytest.mark.anyio

LABELS = {"kubernetes.io/hostname": "n1", "kubernetes.io/os": "linux", "zone": "a", "gpus": "8"}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_node_selector_needs_every_label() -> None:
    assert matches("n1", LABELS, {}, None)
    assert matches("n1", LABELS, {"zone": "a", "kubernetes.io/os": "linux"}, None)
    assert not matches("n1", LABELS, {"zone": "a", "disk": "ssd"}, None)
    assert not matches("n1", LABELS, {"zone": "b"}, None)


def test_required_terms_are_ored_and_their_expressions_anded() -> None:
    def expr(key: str, op: str, *values: str) -> dict[str, Any]:
        return {"key": key, "operator": op, **({"values": list(values)} if values else {})}

    assert matches("n1", LABELS, {}, required({"matchExpressions": [expr("zone", "In", "a", "b")]}))
    assert not matches("n1", LABELS, {}, required({"matchExpressions": [expr("zone", "NotIn", "a")]}))
    assert matches("n1", LABELS, {}, required({"matchExpressions": [expr("disk", "NotIn", "ssd")]}))
    assert matches("n1", LABELS, {}, required({"matchExpressions": [expr("gpus", "Gt", "4"), expr("zone", "Exists")]}))
    assert not matches("n1", LABELS, {}, required({"matchExpressions": [expr("gpus", "Lt", "4")]}))
    assert not matches("n1", LABELS, {}, required({"matchExpressions": [expr("zone", "Gt", "4")]}))  # not an integer
    assert not matches("n1", LABELS, {}, required({"matchExpressions": [expr("zone", "DoesNotExist")]}))
    # Terms are ORed; an empty term matches nothing.
    assert matches("n1", LABELS, {}, required({"matchExpressions": [expr("zone", "In", "b")]},
                                               {"matchFields": [expr("metadata.name", "In", "n1")]}))
    assert not matches("n1", LABELS, {}, required({}))
    assert not matches("n2", LABELS, {}, required({"matchFields": [expr("metadata.name", "In", "n1")]}))
    # Both the selector and the affinity must hold; preferred terms are the scheduler's.
    preferred = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [expr("zone", "In", "z")]}}]}}
    assert matches("n1", LABELS, {}, preferred)
    assert not matches("n1", LABELS, {"zone": "b"}, required({"matchExpressions": [expr("zone", "Exists")]}))


async def test_static_pods_are_admitted_by_the_nodes_labels(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("here.yaml", pod_manifest("here", nodeSelector={"kubernetes.io/os": "linux"},
                                            affinity=required({"matchFields": [
                                                {"key": "metadata.name", "operator": "In", "values": [env.node]}]})))
        env.write("elsewhere.yaml", pod_manifest("elsewhere", nodeSelector={"disktype": "ssd"}))
        await env.wait_running("here")

        async def rejected() -> dict[str, Any] | None:
            status = env.status_of("elsewhere")
            return status if status.get("phase") == "Failed" else None

        status = await wait_for(rejected, what="the pod whose nodeSelector the node lacks rejected")
        assert status["reason"] == REASON
        assert status["message"] == f"Pod was rejected: {MESSAGE}"
        sandboxes, _ = await runtime_objects(env.client, env.node)
        assert len(sandboxes) == 1  # nothing was set up for the rejected pod


async def test_api_pod_bound_to_a_node_it_does_not_match_is_rejected_until_the_node_is_labelled(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    from tests.test_apivolumes import cluster_node, container

    async with cluster_node(containerd, control_plane, tmp_path) as node:
        # Bound by its creator (spec.nodeName): no scheduler checked the selector.
        first = await node.run_pod(f"ssd1-{node.name}", container("main"), nodeSelector={"disktype": "ssd"})

        async def failed(name: str) -> dict[str, Any] | None:
            obj = json.loads(await node.kubectl("get", "pod", name, "-o", "json"))
            return obj["status"] if obj.get("status", {}).get("phase") == "Failed" else None

        status = await wait_for(lambda: failed(first["metadata"]["name"]), 60, "the unmatched pod rejected")
        assert status["reason"] == REASON and status["message"] == f"Pod was rejected: {MESSAGE}"
        # An administrator labels the Node: the agent reads the Node before rejecting again.
        await node.kubectl("label", "node", node.name, "disktype=ssd")
        second = await node.run_pod(f"ssd2-{node.name}", container("main"), nodeSelector={"disktype": "ssd"})
        uid = second["metadata"]["uid"]
        await wait_for(lambda: node.running(uid, "main"), 60, "the pod runs once the Node has the label")


def _ports_pod(*ports: dict[str, Any], host_network: bool = False, sidecar: bool = False) -> Pod:
    container = {"name": "c", "image": "i", "ports": list(ports)}
    spec: dict[str, Any] = {"containers": [container], "hostNetwork": host_network}
    if sidecar:
        spec = {"containers": [{"name": "main", "image": "i"}],
                "initContainers": [{**container, "restartPolicy": "Always"}]}
    return Pod.model_validate({"metadata": {"name": "p", "uid": "u"}, "spec": spec})


def test_host_ports_conflict_by_protocol_port_and_address() -> None:
    web = _ports_pod({"containerPort": 80, "hostPort": 8080})
    assert nodeports.conflicts(_ports_pod({"containerPort": 81, "hostPort": 8080}), [web])
    assert not nodeports.conflicts(_ports_pod({"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}), [web])
    assert not nodeports.conflicts(_ports_pod({"containerPort": 80}), [web])  # no host port
    one = _ports_pod({"containerPort": 80, "hostPort": 9000, "hostIP": "10.0.0.1"})
    assert not nodeports.conflicts(_ports_pod({"containerPort": 80, "hostPort": 9000, "hostIP": "10.0.0.2"}), [one])
    assert nodeports.conflicts(_ports_pod({"containerPort": 80, "hostPort": 9000, "hostIP": "10.0.0.1"}), [one])
    assert nodeports.conflicts(_ports_pod({"containerPort": 80, "hostPort": 9000}), [one])  # 0.0.0.0: every address
    # Under hostNetwork a container port is a host port; a sidecar's ports are held too.
    assert nodeports.conflicts(_ports_pod({"containerPort": 8080}, host_network=True), [web])
    assert nodeports.conflicts(_ports_pod({"containerPort": 81, "hostPort": 8080}, sidecar=True), [web])


async def test_a_static_pod_asking_for_a_held_host_port_is_rejected(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("first.yaml", pod_manifest("first", container={"ports": [{"containerPort": 80, "hostPort": 18080}]}))
        await env.wait_running("first")
        env.write("second.yaml", pod_manifest("second", container={"ports": [{"containerPort": 81, "hostPort": 18080}]}))

        async def rejected() -> dict[str, Any] | None:
            status = env.status_of("second")
            return status if status.get("phase") == "Failed" else None

        status = await wait_for(rejected, what="the pod asking for a held host port rejected")
        assert status["reason"] == nodeports.REASON
        assert status["message"] == f"Pod was rejected: {nodeports.MESSAGE}"


# --- NoExecute taints ---------------------------------------------------------------------------

GPU_TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoExecute"}
KEEP = "nodeagent.test/keep"


def test_only_noexecute_taints_need_tolerating() -> None:
    assert first_untolerated([GPU_TAINT], []) == GPU_TAINT
    assert first_untolerated([{**GPU_TAINT, "effect": "NoSchedule"}], []) is None
    assert first_untolerated([{**GPU_TAINT, "effect": "PreferNoSchedule"}], []) is None


@pytest.mark.parametrize(("toleration", "tolerated"), [
    ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}, True),
    ({"key": "dedicated", "value": "gpu"}, True),  # no operator is Equal; no effect matches every effect
    ({"key": "dedicated", "operator": "Exists"}, True),
    ({"operator": "Exists"}, True),  # an empty key with Exists tolerates everything
    ({"key": "dedicated", "value": "cpu"}, False),
    ({"key": "other", "operator": "Exists"}, False),
    ({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}, False),
    ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0}, True),
    ({"key": "dedicated", "operator": "Gt", "value": "1"}, False),  # comparison operators: alpha, off
])
def test_tolerations_match_as_the_api_defines(toleration: dict[str, Any], tolerated: bool) -> None:
    assert tolerates(toleration, GPU_TAINT) is tolerated
    assert (first_untolerated([GPU_TAINT], [toleration]) is None) is tolerated


async def test_api_pods_must_tolerate_the_nodes_noexecute_taints(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    from tests.test_apivolumes import cluster_node, container

    async with cluster_node(containerd, control_plane, tmp_path) as node:
        await node.kubectl("taint", "node", node.name, "dedicated=gpu:NoExecute")
        stage = node.env.agent.pipeline.stages["tainttoleration"]

        async def taint_seen() -> bool:
            return any(t.get("key") == "dedicated" for t in stage.describe()["taints"])

        await wait_for(taint_seen, 30, "the agent's Node watch showing the taint")

        async def phase(name: str) -> dict[str, Any] | None:
            obj = json.loads(await node.kubectl("get", "pod", name, "-o", "json"))
            return obj["status"] if obj.get("status", {}).get("phase") in ("Failed", "Running") else None

        # Bound by its creator: no scheduler kept it off the node. The controller-manager's taint
        # eviction deletes it at once too; a finalizer keeps the object so its status can be read.
        plain = await node.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"plain-{node.name}", "namespace": "default", "finalizers": [KEEP]},
            "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 1, "containers": [container("main")]}})
        try:
            status = await wait_for(lambda: phase(plain["metadata"]["name"]), 60, "the intolerant pod decided")
            assert status["phase"] == "Failed"
            assert status["reason"] == TAINT_REASON and status["message"] == f"Pod was rejected: {TAINT_MESSAGE}"
            assert not await node.running(plain["metadata"]["uid"], "main")
        finally:
            await node.kubectl("patch", "pod", plain["metadata"]["name"], "--type=json",
                               "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]', check=False)

        tolerant = await node.run_pod(f"tolerant-{node.name}", container("main"),
                                      tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}])
        await wait_for(lambda: node.running(tolerant["metadata"]["uid"], "main"), 60, "the tolerant pod running")

        # The taint removed: the watch follows, and a plain pod is admitted again.
        await node.kubectl("taint", "node", node.name, "dedicated=gpu:NoExecute-")
        await wait_for(lambda: _not(taint_seen), 30, "the agent's Node watch without the taint")
        again = await node.run_pod(f"again-{node.name}", container("main"))
        await wait_for(lambda: node.running(again["metadata"]["uid"], "main"), 60, "a plain pod running again")


async def test_a_pod_already_being_deleted_is_still_admitted_or_refused_as_the_kubelet_does(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    """The kubelet admits a pod it first sees with a deletionTimestamp (HandlePodAdditions runs
    admission before the pod worker learns of the deletion): one that does not fit ends Failed
    with the refusal's reason, never Pending. Here the pod is bound, deleted (a finalizer keeps
    it) and only then does the node's agent start and list it."""
    from tests.test_apivolumes import cluster_node, container

    name = f"av{uuid.uuid4().hex[:8]}"
    pod = f"late-{name}"
    manifest = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": "default", "finalizers": [KEEP]},
                "spec": {"nodeName": name, "terminationGracePeriodSeconds": 1,
                         "containers": [container("main", resources={"requests": {"cpu": "1000"}})]}}
    path = tmp_path / "late.json"
    path.write_text(json.dumps(manifest))
    await anyio.to_thread.run_sync(lambda: control_plane.kubectl("create", "-f", str(path)))
    await anyio.to_thread.run_sync(lambda: control_plane.kubectl("delete", "pod", pod, "--wait=false"))
    try:
        async with cluster_node(containerd, control_plane, tmp_path, name=name) as node:
            async def decided() -> dict[str, Any] | None:
                obj = json.loads(await node.kubectl("get", "pod", pod, "-o", "json"))
                return obj["status"] if obj["status"].get("phase") == "Failed" else None

            status = await wait_for(decided, 60, "the deleted pod refused")
            assert status["reason"] == "OutOfcpu", status
            assert status["message"].startswith("Pod was rejected: "), status
    finally:
        await anyio.to_thread.run_sync(lambda: control_plane.kubectl(
            "patch", "pod", pod, "--type=json", "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
            check=False))


async def _not(predicate: Any) -> bool:
    return not await predicate()


async def test_static_pods_are_exempt_from_the_taint_check() -> None:
    from nodeagent.objects import FileObjects, kinds
    from plugins.tainttoleration import TaintToleration

    objects = FileObjects([kinds.NODE])  # the store's view of the Node, holding one NoExecute taint
    objects.replace(kinds.NODE, [{"metadata": {"name": "n1"}, "spec": {"taints": [GPU_TAINT]}}])
    stage = TaintToleration(objects.view(kinds.NODE, fields={"metadata.name": "n1"}))
    static = Pod.model_validate({"metadata": {"name": "s", "uid": "u1",
                                              "annotations": {"kubernetes.io/config.source": "file"}},
                                 "spec": {"containers": [{"name": "c", "image": "i"}]}})
    from_api = static.model_copy(update={"metadata": static.metadata.model_copy(update={"annotations": {}})})
    view = NodeView(NodeInfo("n1", "10.0.0.1", {}), [])
    assert (await stage.admit(static, view)).verdict is Verdict.CONTINUE
    rejected = await stage.admit(from_api, view)
    assert rejected.reason == TAINT_REASON and rejected.message == TAINT_MESSAGE
