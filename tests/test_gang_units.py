"""The gang stage without a runtime: declarations (every source, table-driven), generations and
the barrier's decisions with an injectable clock. tests/test_gang.py runs it against containerd."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from nodeagent.clock import ManualClock
from nodeagent.events import Event, PodRef
from nodeagent.model import Pod
from nodeagent.runtimeview import ContainerRecord, PodRuntime
from nodeagent.stages import NodeInfo, NodeView, Verdict
from nodeagent.status import rfc3339
from plugins.gang import GangConfig, GangStage
from plugins.gang.catalog import ManifestCatalog, NoCatalog
from plugins.gang.declaration import DeclarationError, GangKey, created_at, declaration_of

pytestmark = pytest.mark.anyio


def pod(name: str = "p", *, labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None,
        uid: str | None = None, created: str | None = None, cpu: str | None = None, **spec: Any) -> Pod:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}}
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}",
                                "labels": dict(labels or {}), "annotations": dict(annotations or {})}
    if created:
        metadata["creationTimestamp"] = created
    return Pod.model_validate({"metadata": metadata, "spec": {"containers": [container], **spec}})


def ours(gang: str = "g", min_member: int | str = 2, timeout: float | None = None) -> dict[str, str]:
    annotations = {"gang.nodeagent.io/name": gang, "gang.nodeagent.io/min-member": str(min_member)}
    if timeout is not None:
        annotations["gang.nodeagent.io/timeout-seconds"] = str(timeout)
    return annotations


class Catalog:
    def __init__(self, *objects: Mapping[str, Any]) -> None:
        self.objects = {}
        for obj in objects:
            group = obj["apiVersion"].rpartition("/")[0]
            self.objects[(group, obj["kind"], obj["metadata"].get("namespace", "ns"), obj["metadata"]["name"])] = obj

    def get(self, api_group: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objects.get((api_group, kind, namespace, name))


def podgroup(api_version: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "PodGroup", "metadata": {"name": name, "namespace": "ns"}, "spec": spec}


# --- declarations ---------------------------------------------------------------------------

CATALOG = Catalog(
    podgroup("scheduling.k8s.io/v1beta1", "core", {"schedulingPolicy": {"gang": {"minCount": 8}}}),
    podgroup("scheduling.k8s.io/v1beta1", "plain", {"schedulingPolicy": {"basic": {}}}),
    {"apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload", "metadata": {"name": "job", "namespace": "ns"},
     "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 4}}}]}},
    podgroup("scheduling.x-k8s.io/v1alpha1", "cosched", {"minMember": 3, "scheduleTimeoutSeconds": 30}),
    podgroup("scheduling.x-k8s.io/v1alpha1", "cosched-default", {"minMember": 3}),
    podgroup("scheduling.volcano.sh/v1beta1", "vc", {"minMember": 5}),
    podgroup("scheduling.run.ai/v2alpha2", "kai", {"minMember": 6}),
)


@pytest.mark.parametrize(
    ("case", "kwargs", "source", "name", "min_member", "timeout"),
    [
        ("core PodGroup", {"schedulingGroup": {"podGroupName": "core"}}, "schedulingGroup", "core", 8, None),
        ("core Workload 1.35", {"workloadRef": {"name": "job", "podGroup": "workers", "podGroupReplicaKey": "1"}},
         "workloadRef", "job/workers/1", 4, None),
        ("coscheduling", {"labels": {"scheduling.x-k8s.io/pod-group": "cosched"}}, "coscheduling", "cosched", 3, 30.0),
        ("coscheduling default timeout", {"labels": {"scheduling.x-k8s.io/pod-group": "cosched-default"}},
         "coscheduling", "cosched-default", 3, 60.0),
        ("coscheduling legacy", {"labels": {"pod-group.scheduling.sigs.k8s.io/name": "old",
                                            "pod-group.scheduling.sigs.k8s.io/min-available": "2"}},
         "coscheduling", "old", 2, 60.0),
        ("volcano", {"annotations": {"scheduling.k8s.io/group-name": "vc"}}, "volcano", "vc", 5, None),
        ("volcano own key", {"annotations": {"scheduling.volcano.sh/group-name": "vc"}}, "volcano", "vc", 5, None),
        ("kai", {"annotations": {"pod-group-name": "kai"}}, "kai", "kai", 6, None),
        ("kueue", {"labels": {"kueue.x-k8s.io/pod-group-name": "q"},
                   "annotations": {"kueue.x-k8s.io/pod-group-total-count": "7"}}, "kueue", "q", 7, None),
        ("koordinator", {"annotations": {"gang.scheduling.koordinator.sh/name": "k",
                                         "gang.scheduling.koordinator.sh/min-available": "2"}},
         "koordinator", "k", 2, None),
        ("nodeagent", {"annotations": ours("mine", 4, 9)}, "nodeagent", "mine", 4, 9.0),
        ("object missing, our min-member", {"annotations": {"scheduling.k8s.io/group-name": "absent",
                                                            "gang.nodeagent.io/min-member": "3"}},
         "volcano", "absent", 3, None),
        ("object missing", {"labels": {"scheduling.x-k8s.io/pod-group": "absent"}},
         "coscheduling", "absent", None, 60.0),
        ("our timeout overrides", {"labels": {"scheduling.x-k8s.io/pod-group": "cosched"},
                                   "annotations": {"gang.nodeagent.io/timeout-seconds": "5"}},
         "coscheduling", "cosched", 3, 5.0),
        ("first source wins", {"schedulingGroup": {"podGroupName": "core"}, "annotations": ours("mine", 2)},
         "schedulingGroup", "core", 8, None),
    ],
)
def test_declarations_are_recognised(case: str, kwargs: dict[str, Any], source: str, name: str,
                                     min_member: int | None, timeout: float | None) -> None:
    decl = declaration_of(pod(**kwargs), CATALOG)
    assert decl is not None, case
    assert (decl.key.namespace, decl.key.source, decl.key.name) == ("ns", source, name), case
    assert decl.min_member == min_member, case
    assert decl.timeout_seconds == timeout, case


@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("no declaration", {"labels": {"app": "x", "leaderworkerset.sigs.k8s.io/size": "4"},
                            "annotations": {"leaderworkerset.sigs.k8s.io/size": "4"}}),
        ("basic policy", {"schedulingGroup": {"podGroupName": "plain"}}),
        # Kueue stamps total-count = LWS size on LWS pods; LeaderReady would deadlock a barrier.
        ("kueue on LWS", {"labels": {"kueue.x-k8s.io/pod-group-name": "q", "leaderworkerset.sigs.k8s.io/name": "l"},
                          "annotations": {"kueue.x-k8s.io/pod-group-total-count": "4"}}),
    ],
)
def test_not_a_gang(case: str, kwargs: dict[str, Any]) -> None:
    assert declaration_of(pod(**kwargs), CATALOG) is None, case


@pytest.mark.parametrize("annotations", [ours(min_member="four"), ours(min_member=0), ours(timeout=-1),
                                         {**ours(), "gang.nodeagent.io/timeout-seconds": "soon"}])
def test_unusable_declarations_are_errors(annotations: dict[str, str]) -> None:
    with pytest.raises(DeclarationError):
        declaration_of(pod(annotations=annotations), NoCatalog())


def test_group_objects_from_a_manifest_directory(tmp_path: Path) -> None:
    (tmp_path / "groups.yaml").write_text(
        "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\nmetadata: {name: a, namespace: ns}\n"
        "spec: {minMember: 2}\n---\nnot: a group\n")
    (tmp_path / "broken.yaml").write_text("{: nope")
    catalog = ManifestCatalog(tmp_path)
    member = pod(labels={"scheduling.x-k8s.io/pod-group": "a"})
    assert declaration_of(member, catalog).min_member == 2  # type: ignore[union-attr]
    (tmp_path / "groups.yaml").write_text(
        "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\nmetadata: {name: a, namespace: ns}\n"
        "spec: {minMember: 5}\n")
    assert declaration_of(member, catalog).min_member == 5  # type: ignore[union-attr]


def test_the_view_reads_a_members_declaration_again_only_when_what_it_is_read_from_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A member's every status write reaches the views of every node: only a change of its labels,
    annotations, schedulingGroup or workloadRef builds its Pod model again; the group objects are
    read at each event, so a PodGroup that changes (or appears) changes the answer at once."""
    from plugins.gang import view as view_module

    built: list[str] = []

    class CountingPod:
        @staticmethod
        def model_validate(obj: Mapping[str, Any]) -> Pod:
            built.append(obj["metadata"]["uid"])
            return Pod.model_validate(obj)

    monkeypatch.setattr(view_module, "Pod", CountingPod)
    catalog = Catalog(podgroup("scheduling.k8s.io/v1beta1", "core", {"schedulingPolicy": {"basic": {}}}))
    classify = view_module.Classifier(catalog)
    def api_pod(name: str, annotations: Mapping[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                             "annotations": dict(annotations or {})},
                "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec}}

    member = api_pod("m", ours("g", 2))
    assert classify(member) == GangKey("ns", "nodeagent", "g")
    member["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert classify(member) == GangKey("ns", "nodeagent", "g")
    assert built == ["uid-m"]
    member["metadata"]["annotations"] = ours("h", 2)
    assert classify(member) == GangKey("ns", "nodeagent", "h")
    assert built == ["uid-m", "uid-m"]

    grouped = api_pod("s", schedulingGroup={"podGroupName": "core"})
    assert classify(grouped) is None  # a basic policy groups the pods; it is no gang
    catalog.objects[("scheduling.k8s.io", "PodGroup", "ns", "core")] = podgroup(
        "scheduling.k8s.io/v1beta1", "core", {"schedulingPolicy": {"gang": {"minCount": 2}}})
    assert classify(grouped) == GangKey("ns", "schedulingGroup", "core")
    assert built.count("uid-s") == 1

    classify.forget("uid-m")
    classify(member)
    assert built.count("uid-m") == 3  # a deleted pod's model is not kept


def test_creation_time_from_the_api_or_the_static_source() -> None:
    assert created_at(pod(created="2026-01-02T03:04:05Z")) == 1767323045.0
    assert created_at(pod(annotations={"kubernetes.io/config.seen": "2026-01-02T03:04:05.000000000Z"})) == 1767323045.0
    assert created_at(pod()) is None


# --- the stage, with a fake pod context ---------------------------------------------------------

NODE = NodeInfo(name="n1", ip="10.0.0.1", allocatable={"cpu": 4000, "memory": 8 * 2**30, "pods": 110})


@dataclass
class FakeStatus:
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    conditions: dict[str, tuple[bool, str]] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)

    def container_waiting(self, container: str, reason: str, message: str = "") -> None:
        self.waiting[container] = (reason, message)

    def clear_container_waiting(self, container: str) -> None:
        self.waiting.pop(container, None)

    def set_condition(self, type: str, status: bool, reason: str = "", message: str = "") -> None:
        self.conditions[type] = (status, reason)
        self.messages[type] = message


@dataclass
class FakeContext:
    pod: Pod
    status: FakeStatus = field(default_factory=FakeStatus)
    observed: PodRuntime = field(default_factory=lambda: PodRuntime(uid=""))
    events: list[Event] = field(default_factory=list)
    woken: int = 0

    @property
    def ref(self) -> PodRef:
        return PodRef(uid=self.pod.uid, namespace=self.pod.metadata.namespace, name=self.pod.metadata.name)

    async def publish(self, event: Event) -> None:
        # As the worker's context does: the fact is about this pod, from this stage.
        self.events.append(event.model_copy(update={"pod": self.ref, "source": "gang"}))

    def wake(self) -> None:
        self.woken += 1


@dataclass
class FakeHandle:
    # Wall time 2026-01-02T03:05:00Z, so that the pods' creation times below compare with it.
    clock: ManualClock = field(default_factory=lambda: ManualClock(start=1767323100.0))
    events: list[Event] = field(default_factory=list)
    node: NodeInfo = NODE

    evicted: dict[str, str] = field(default_factory=dict)
    """uid -> reason of every pod the stage failed through the handle (AgentHandle.evict)."""
    gone: set[str] = field(default_factory=set)
    """Pods not active on the node (evict answers None for them)."""

    async def publish(self, event: Event) -> None:
        self.events.append(event)

    def evict(self, uid: str, *, reason: str, message: str, grace_seconds: int,
              condition: object = None) -> anyio.Event | None:
        if uid in self.gone or uid in self.evicted:
            return None
        self.evicted[uid] = reason
        return anyio.Event()


def stage(**config: Any) -> tuple[GangStage, FakeHandle]:
    handle = FakeHandle()
    return GangStage(GangConfig.model_validate(config), handle), handle  # type: ignore[arg-type]


async def admitted(gang: GangStage, member: Pod, admitted: list[Pod] | None = None) -> Verdict:
    view = NodeView(NODE, admitted or [])
    result = await gang.admit(member, view)
    if result.verdict is Verdict.REJECT:
        return result.verdict
    return (await gang.reserve(member, view)).verdict


async def test_a_gang_commits_when_min_member_are_prepared_and_wakes_the_waiting() -> None:
    gang, _ = stage()
    members = [pod(f"m{i}", annotations=ours("g", 3)) for i in range(3)]
    contexts = [FakeContext(m) for m in members]
    for m in members:
        assert await admitted(gang, m) is Verdict.CONTINUE
    for ctx in contexts[:2]:
        result = await gang.permit(ctx)  # type: ignore[arg-type]
        assert result.verdict is Verdict.WAIT and result.reason == "WaitingForGang"
        assert ctx.status.waiting["main"][0] == "WaitingForGang"
    assert (await gang.permit(contexts[2])).verdict is Verdict.CONTINUE  # type: ignore[arg-type]
    assert [c.woken for c in contexts[:2]] == [1, 1]
    for ctx in contexts[:2]:  # woken, they are asked again and pass
        assert (await gang.permit(ctx)).verdict is Verdict.CONTINUE  # type: ignore[arg-type]
        assert ctx.status.waiting == {}
        assert ctx.status.conditions["gang.nodeagent.io/StartCommitted"] == (True, "GangCommitted")
    assert gang.metrics.decisions == {"commit": 1}
    # Once satisfied: a member created later passes at once.
    late = pod("late", annotations=ours("g", 3))
    assert await admitted(gang, late) is Verdict.CONTINUE
    ctx = FakeContext(late)
    assert (await gang.permit(ctx)).verdict is Verdict.CONTINUE  # type: ignore[arg-type]
    assert [e.joined_after_commit for e in ctx.events if e.kind == "GangCommitted"] == [True]  # type: ignore[attr-defined]


async def test_pods_of_no_gang_are_skipped_everywhere() -> None:
    gang, _ = stage()
    plain = pod("plain")
    assert (await gang.admit(plain, NodeView(NODE, []))).verdict is Verdict.SKIP
    assert (await gang.reserve(plain, NodeView(NODE, []))).verdict is Verdict.SKIP
    assert (await gang.permit(FakeContext(plain))).verdict is Verdict.SKIP  # type: ignore[arg-type]
    await gang.unreserve(plain)


async def test_the_timeout_fails_every_member_by_the_injected_clock() -> None:
    gang, handle = stage(timeoutSeconds=30)
    members = [pod(f"m{i}", annotations=ours("g", 3)) for i in range(2)]
    contexts = [FakeContext(m) for m in members]
    for m, ctx in zip(members, contexts, strict=True):
        await admitted(gang, m)
        result = await gang.permit(ctx)  # type: ignore[arg-type]
        assert result.verdict is Verdict.WAIT and result.retry_after == 5.0
    handle.clock.advance(29)
    assert (await gang.permit(contexts[0])).verdict is Verdict.WAIT  # type: ignore[arg-type]
    handle.clock.advance(1)
    result = await gang.permit(contexts[0])  # type: ignore[arg-type]
    assert result.verdict is Verdict.REJECT and result.reason == "GangAdmissionTimeout"
    assert "2 of 3" in result.message
    assert contexts[1].woken == 1
    assert (await gang.permit(contexts[1])).reason == "GangAdmissionTimeout"  # type: ignore[arg-type]
    assert gang.metrics.decisions == {"timeout": 1}


async def test_a_member_released_before_the_commit_aborts_the_others() -> None:
    gang, handle = stage()
    members = [pod(f"m{i}", annotations=ours("g", 3)) for i in range(3)]
    contexts = [FakeContext(m) for m in members]
    for m in members:
        await admitted(gang, m)
    await gang.permit(contexts[0])  # type: ignore[arg-type]
    handle.gone.add(members[2].uid)  # being torn down: the worker refuses an eviction
    await gang.unreserve(members[2])  # deleted, or its preparation failed
    assert contexts[0].woken == 1
    # m1 had not reached the barrier (still preparing): the abort fails it through its worker at
    # once, instead of letting it hold its reservation and devices until its preparation ends.
    assert handle.evicted == {members[1].uid: "GangAborted"}
    result = await gang.permit(contexts[0])  # type: ignore[arg-type]
    assert result.verdict is Verdict.REJECT and result.reason == "GangAborted" and "m2" in result.message
    assert (await gang.permit(contexts[1])).reason == "GangAborted"  # type: ignore[arg-type]
    assert [(e.kind, e.pod.name) for e in handle.events] == [("GangAborted", "m2"), ("GangAborted", "m1")]
    # Releasing members of a decided gang changes nothing, twice over.
    for m in members:
        await gang.unreserve(m)
        await gang.unreserve(m)
    assert gang.metrics.decisions == {"abort": 1}


async def test_a_member_that_does_not_fit_aborts_its_gang_whatever_the_order() -> None:
    gang, _ = stage()
    created = "2026-01-02T03:04:05Z"
    big = pod("big", annotations=ours("g", 3), cpu="100", created=created)
    # The member that does not fit is admitted first: the others, created before the abort,
    # belong to the aborted attempt and fail at admission.
    result = await gang.admit(big, NodeView(NODE, []))
    assert result.verdict is Verdict.REJECT and result.reason == "GangLocalAdmissionFailed"
    assert "OutOfcpu" in result.message
    other = pod("other", annotations=ours("g", 3), created=created)
    result = await gang.admit(other, NodeView(NODE, []))
    assert result.verdict is Verdict.REJECT and result.reason == "GangAborted" and "big" in result.message
    # A pod created after the abort starts a new attempt.
    again = pod("again", annotations=ours("g", 3), created="2026-01-02T04:00:00Z")
    assert await admitted(gang, again) is Verdict.CONTINUE
    assert gang.gangs.member_of(again.uid).number == 2  # type: ignore[union-attr]


async def test_a_member_that_does_not_fit_after_the_commit_fails_alone() -> None:
    gang, _ = stage()
    first = pod("first", annotations=ours("g", 1))
    await admitted(gang, first)
    assert (await gang.permit(FakeContext(first))).verdict is Verdict.CONTINUE  # type: ignore[arg-type]
    big = pod("big", annotations=ours("g", 1), cpu="100")
    result = await gang.admit(big, NodeView(NODE, [first]))
    assert result.reason == "GangLocalAdmissionFailed" and "started without it" in result.message
    assert gang.metrics.decisions == {"commit": 1}


async def test_a_restarted_agent_recovers_the_commit_from_the_runtime() -> None:
    gang, _ = stage()
    members = [pod(f"m{i}", annotations=ours("g", 3)) for i in range(3)]
    for m in members:
        await admitted(gang, m)
    running = ContainerRecord(id="c1", name="main", pod_uid=members[0].uid, sandbox_id="s", attempt=0,
                              state="running", created_at=1, started_at=2)
    ctx = FakeContext(members[0], observed=PodRuntime(uid=members[0].uid, containers=(running,)))
    result = await gang.permit(ctx)  # type: ignore[arg-type]
    assert result.verdict is Verdict.CONTINUE
    assert [e.recovered for e in ctx.events if e.kind == "GangCommitted"] == [True]  # type: ignore[attr-defined]
    assert (await gang.permit(FakeContext(members[1]))).verdict is Verdict.CONTINUE  # type: ignore[arg-type]


async def test_containers_created_ahead_are_no_commit_and_no_partial_start() -> None:
    """A member's containers are created while it waits (Start.create_ahead): after an agent
    restart, CREATED is not the commit's record, and an abort finding them is no partial start."""
    gang, _ = stage()
    members = [pod(f"m{i}", annotations=ours("g", 3)) for i in range(2)]
    for m in members:
        await admitted(gang, m)
    ahead = ContainerRecord(id="c1", name="main", pod_uid=members[0].uid, sandbox_id="s", attempt=0,
                            state="created", created_at=1)
    ctx = FakeContext(members[0], observed=PodRuntime(uid=members[0].uid, containers=(ahead,)))
    assert (await gang.permit(ctx)).verdict is Verdict.WAIT  # type: ignore[arg-type]
    assert not [e for e in ctx.events if e.kind == "GangCommitted"]
    await gang.unreserve(members[1])  # a member leaves: the gang aborts
    assert (await gang.permit(ctx)).verdict is Verdict.REJECT  # type: ignore[arg-type]
    assert gang.metrics.partial_starts == 0


async def test_unknown_min_member_starts_alone_unless_strict() -> None:
    member = pod(labels={"scheduling.x-k8s.io/pod-group": "absent"})
    lenient, _ = stage()
    assert (await lenient.admit(member, NodeView(NODE, []))).verdict is Verdict.SKIP
    assert (await lenient.permit(FakeContext(member))).verdict is Verdict.SKIP  # type: ignore[arg-type]
    strict, _ = stage(strict=True)
    result = await strict.admit(member, NodeView(NODE, []))
    assert result.verdict is Verdict.REJECT and result.reason == "GangPolicyUnavailable"


async def test_an_unusable_declaration_is_rejected_at_admission() -> None:
    gang, _ = stage()
    result = await gang.admit(pod(annotations=ours(min_member="lots")), NodeView(NODE, []))
    assert result.verdict is Verdict.REJECT and result.reason == "GangDeclarationInvalid"


async def test_a_partial_start_is_counted_from_runtime_evidence() -> None:
    gang, _ = stage()
    members = [pod(f"m{i}", annotations=ours("g", 3)) for i in range(2)]
    for m in members:
        await admitted(gang, m)
    await gang.permit(FakeContext(members[0]))  # type: ignore[arg-type]
    await gang.unreserve(pod("m9", annotations=ours("g", 3)))  # never a member: nothing happens
    await gang.unreserve(members[1])
    # A container of an aborted gang's member (started by something that ignored permit).
    stray = ContainerRecord(id="c1", name="main", pod_uid=members[0].uid, sandbox_id="s", attempt=0,
                            state="running", created_at=1, started_at=2)
    ctx = FakeContext(members[0], observed=PodRuntime(uid=members[0].uid, containers=(stray,)))
    assert (await gang.permit(ctx)).verdict is Verdict.REJECT  # type: ignore[arg-type]
    assert gang.metrics.partial_starts == 1
    assert "nodeagent_gang_partial_start_total 1" in gang.metrics.render()


# --- across nodes: the coordinator protocol over a simulated API --------------------------------
#
# Several stages (one per node), each with its own ClusterView, share one simulated API: `sync()`
# turns each pod's reported conditions (FakeStatus) and phase into an API object and feeds every
# view, as the status sink and the watches do. Nothing reaches a view before sync(): a write is
# visible only once it went through the API.

T0 = "2026-01-02T03:04:05Z"  # the members' creation time (before the handles' clock)


@dataclass
class Member:
    pod: Pod
    node: str
    ctx: FakeContext
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    deleting: bool = False


class Cluster:
    def __init__(self, *nodes: str, **config: Any) -> None:
        from plugins.gang.view import ClusterView

        self.clock = ManualClock(start=1767323100.0)
        self.stages: dict[str, GangStage] = {}
        self.handles: dict[str, FakeHandle] = {}
        for node in nodes:
            handle = FakeHandle(clock=self.clock, node=NodeInfo(name=node, ip="10.0.0.1",
                                                                allocatable=NODE.allocatable))
            view = ClusterView(None, NoCatalog())
            self.stages[node] = GangStage(GangConfig.model_validate({"graceSeconds": 10, **config}), handle,  # type: ignore[arg-type]
                                          view=view)
            self.handles[node] = handle
        self.members: dict[str, Member] = {}
        self.gone: set[str] = set()

    def pod(self, name: str, node: str, min_member: int, created: str = T0, **kwargs: Any) -> Member:
        member = Member(pod(name, annotations=ours("g", min_member, kwargs.pop("timeout", 60)), created=created,
                            **kwargs), node, FakeContext(pod(name)))
        member.ctx = FakeContext(member.pod)
        self.members[name] = member
        return member

    def obj(self, m: Member) -> dict[str, Any]:
        conditions = [{"type": t, "status": "True" if v else "False", "reason": r,
                       "message": m.ctx.status.messages.get(t, ""), "lastTransitionTime": _stamp(self.clock.now())}
                      for t, (v, r) in m.ctx.status.conditions.items()]
        data = m.pod.model_dump(by_alias=True, exclude_none=True)
        data["spec"]["nodeName"] = m.node
        if m.deleting:
            data["metadata"]["deletionTimestamp"] = _stamp(self.clock.now())
        data["status"] = {"phase": m.phase, "reason": m.reason, "message": m.message, "conditions": conditions}
        return data

    async def sync(self) -> None:
        for stage in self.stages.values():
            assert stage.view is not None
            for name, m in self.members.items():
                await stage.view.apply("ns", self.obj(m), deleted=name in self.gone)

    async def admit(self, name: str) -> Verdict:
        m = self.members[name]
        stage = self.stages[m.node]
        result = await stage.admit(m.pod, NodeView(NODE, []))
        if result.verdict is Verdict.REJECT:
            m.phase, m.reason, m.message = "Failed", result.reason, f"Pod was rejected: {result.message}"
            return result.verdict
        return (await stage.reserve(m.pod, NodeView(NODE, []))).verdict

    async def permit(self, name: str) -> Any:
        m = self.members[name]
        result = await self.stages[m.node].permit(m.ctx)  # type: ignore[arg-type]
        if result.verdict is Verdict.REJECT:
            m.phase, m.reason, m.message = "Failed", result.reason, result.message
        return result

    def committed_on(self) -> dict[str, tuple[bool, str]]:
        return {n: m.ctx.status.conditions["gang.nodeagent.io/StartCommitted"] for n, m in self.members.items()
                if "gang.nodeagent.io/StartCommitted" in m.ctx.status.conditions}


def _stamp(seconds: float) -> str:
    return rfc3339(seconds)


async def test_across_nodes_the_coordinator_commits_when_it_sees_every_vote_and_all_follow_its_record() -> None:
    c = Cluster("a", "b")
    for name, node in (("m0", "a"), ("m1", "a"), ("m2", "b")):
        c.pod(name, node, 3)
        assert await c.admit(name) is Verdict.CONTINUE
    await c.sync()
    for name in ("m0", "m1"):
        result = await c.permit(name)
        assert result.verdict is Verdict.WAIT and result.reason == "WaitingForGang"
    await c.sync()
    assert c.committed_on() == {}
    # The last vote: only written, not seen yet; nobody decides on what it cannot see.
    assert (await c.permit("m2")).verdict is Verdict.WAIT
    assert c.committed_on() == {}
    vote = c.members["m2"].ctx.status
    assert vote.conditions["gang.nodeagent.io/Prepared"] == (True, "WaitingForGang")
    assert "counts until 2026-01-02T03:06:00Z" in vote.messages["gang.nodeagent.io/Prepared"]
    await c.sync()
    # The coordinator (smallest name, m0, on node a) wrote the record on its own pod; it starts
    # nothing until the API shows the record.
    assert c.committed_on() == {"m0": (True, "GangQuorumReached")}
    assert "3 of 3 members prepared (m0, m1, m2)" in c.members["m0"].ctx.status.messages[
        "gang.nodeagent.io/StartCommitted"]
    assert (await c.permit("m0")).verdict is Verdict.WAIT
    assert c.stages["a"].metrics.records == {"commit": 1}
    await c.sync()
    for name in ("m0", "m1", "m2"):
        assert c.members[name].ctx.woken >= 1
        assert (await c.permit(name)).verdict is Verdict.CONTINUE
    assert c.committed_on() == {"m0": (True, "GangQuorumReached")}  # the one record
    assert c.members["m2"].ctx.status.conditions["gang.nodeagent.io/Prepared"] == (True, "GangCommitted")
    assert c.stages["b"].metrics.decisions == {"commit": 1} and c.stages["b"].metrics.records == {}
    recorded = [e for e in c.handles["a"].events if e.kind == "GangDecisionRecorded"]
    assert [(e.committed, e.votes) for e in recorded] == [(True, 3)]  # type: ignore[attr-defined]
    # Once satisfied: a member created later, on a third node, joins at once.
    late = c.pod("m9", "b", 3, created="2026-01-02T03:04:50Z")
    await c.sync()
    assert await c.admit("m9") is Verdict.CONTINUE
    assert (await c.permit("m9")).verdict is Verdict.CONTINUE
    assert [e.joined_after_commit for e in late.ctx.events if e.kind == "GangCommitted"] == [True]  # type: ignore[attr-defined]


async def _two_waiting_on_a_and_one_that_cannot_fit_on_b() -> Cluster:
    """m0 and m1 prepared and waiting on node a; m2 (node b) not admitted yet, and too big for it."""
    c = Cluster("a", "b")
    c.pod("m0", "a", 3)
    c.pod("m1", "a", 3)
    c.pod("m2", "b", 3, cpu="100")
    for name in ("m0", "m1"):
        assert await c.admit(name) is Verdict.CONTINUE
    await c.sync()
    for name in ("m0", "m1"):
        assert (await c.permit(name)).verdict is Verdict.WAIT
    return c


async def test_across_nodes_a_member_that_fails_on_its_node_makes_the_coordinator_abort_for_all() -> None:
    c = await _two_waiting_on_a_and_one_that_cannot_fit_on_b()
    # Node b cannot admit m2. It fails m2 only: it cannot know whether a commit already counted
    # its other members; the coordinator decides.
    assert await c.admit("m2") is Verdict.REJECT
    assert c.members["m2"].reason == "GangLocalAdmissionFailed" and "OutOfcpu" in c.members["m2"].message
    await c.sync()
    assert c.committed_on() == {"m0": (False, "GangAborted")}
    message = c.members["m0"].ctx.status.messages["gang.nodeagent.io/StartCommitted"]
    assert "member ns/m2 failed on node b" in message and "OutOfcpu" in message
    for name in ("m0", "m1"):
        result = await c.permit(name)
        assert result.verdict is Verdict.REJECT and result.reason == "GangAborted" and "m2" in result.message
    assert c.members["m1"].ctx.status.conditions["gang.nodeagent.io/Prepared"] == (False, "GangAborted")
    assert c.stages["a"].metrics.records == {"abort": 1}
    # A straggler of the aborted generation on node b fails at admission, from the record.
    c.pod("m3", "b", 3)
    await c.sync()
    assert await c.admit("m3") is Verdict.REJECT and c.members["m3"].reason == "GangAborted"
    # A replacement created after the abort starts a new generation.
    c.pod("r0", "b", 3, created="2026-01-02T03:10:00Z")
    await c.sync()
    assert await c.admit("r0") is Verdict.CONTINUE


async def test_across_nodes_a_replacement_created_in_the_abort_s_second_starts_the_next_attempt() -> None:
    """Creation times have one-second resolution: a controller that recreates the gang at once
    creates it in the abort's second. The record names its attempt's last creation second, so
    the replacements form the new quorum on every node (the coordinator's, with its local
    tombstone, too) while a straggler created with the old members still fails."""
    c = Cluster("a", "b")
    c.pod("m0", "a", 2)
    c.pod("m1", "b", 2, cpu="100")
    assert await c.admit("m0") is Verdict.CONTINUE
    await c.sync()
    assert (await c.permit("m0")).verdict is Verdict.WAIT
    assert await c.admit("m1") is Verdict.REJECT
    await c.sync()
    assert c.committed_on() == {"m0": (False, "GangAborted")}
    message = c.members["m0"].ctx.status.messages["gang.nodeagent.io/StartCommitted"]
    assert message.endswith(f"(members created until {T0} were of this attempt)"), message
    assert (await c.permit("m0")).verdict is Verdict.REJECT
    now = _stamp(c.clock.now())  # the abort's own second
    assert now != T0
    c.pod("r0", "a", 2, created=now)
    c.pod("r1", "b", 2, created=now)
    c.pod("m3", "b", 2)  # created with the old members: of the aborted attempt
    await c.sync()
    assert await c.admit("m3") is Verdict.REJECT and c.members["m3"].reason == "GangAborted"
    for name in ("r0", "r1"):
        assert await c.admit(name) is Verdict.CONTINUE, c.members[name].message


async def test_across_nodes_a_coordinator_deleted_before_deciding_is_replaced_by_the_next_member() -> None:
    c = Cluster("a", "b")
    c.pod("m0", "a", 3)
    c.pod("m1", "b", 3)
    for name in ("m0", "m1"):
        await c.admit(name)
    await c.sync()
    for name in ("m0", "m1"):
        assert (await c.permit(name)).verdict is Verdict.WAIT
    await c.sync()
    assert c.stages["b"].gangs.member_of(c.members["m1"].pod.uid).coordinator == "ns/m0"  # type: ignore[union-attr]
    # m0 is deleted: it leaves, and the gang is not aborted (a controller may replace it).
    c.members["m0"].deleting = True
    await c.sync()
    await c.stages["a"].unreserve(c.members["m0"].pod)
    c.gone.add("m0")
    await c.sync()
    assert c.stages["a"].metrics.decisions == {} and c.committed_on() == {}
    for name in ("m2", "m3"):
        c.pod(name, "b", 3)
        await c.admit(name)
        await c.sync()
        assert (await c.permit(name)).verdict is Verdict.WAIT
    await c.sync()
    assert c.committed_on() == {"m1": (True, "GangQuorumReached")}  # the next member decided
    await c.sync()
    for name in ("m1", "m2", "m3"):
        assert (await c.permit(name)).verdict is Verdict.CONTINUE


async def test_across_nodes_the_coordinator_times_out_and_a_silent_coordinator_is_outlived() -> None:
    c = Cluster("a", "b")
    c.pod("m0", "a", 3, timeout=30)
    c.pod("m1", "b", 3, timeout=30)
    for name in ("m0", "m1"):
        await c.admit(name)
    await c.sync()
    for name in ("m0", "m1"):
        await c.permit(name)
    await c.sync()
    c.clock.advance(29)
    await c.sync()
    assert c.committed_on() == {}
    c.clock.advance(1)
    result = await c.permit("m0")  # the coordinator, at its vote's expiry
    assert result.verdict is Verdict.REJECT and result.reason == "GangAdmissionTimeout"
    assert c.committed_on() == {"m0": (False, "GangAdmissionTimeout")}
    await c.sync()
    result = await c.permit("m1")
    assert result.reason == "GangAdmissionTimeout" and "did not commit within 30s" in result.message
    assert "2 of 3 members were prepared (m0, m1)" in result.message

    # A coordinator that never decides (its agent is down): each other member waits out its
    # vote's expiry plus grace, then releases itself; never sooner.
    d = Cluster("a", "b")
    d.pod("m0", "a", 3, timeout=30)
    d.pod("m1", "b", 3, timeout=30)
    await d.admit("m1")
    await d.sync()
    result = await d.permit("m1")
    assert result.verdict is Verdict.WAIT
    await d.sync()
    d.clock.advance(30 + 9)
    result = await d.permit("m1")
    assert result.verdict is Verdict.WAIT and result.retry_after == pytest.approx(1.0)
    d.clock.advance(1)
    result = await d.permit("m1")
    assert result.verdict is Verdict.REJECT and result.reason == "GangAdmissionTimeout"
    assert "released without starting" in result.message
    assert d.members["m1"].ctx.status.conditions["gang.nodeagent.io/Prepared"] == (False, "GangAdmissionTimeout")
    assert d.committed_on() == {}


async def test_across_nodes_a_commit_written_but_not_yet_seen_holds_the_coordinators_members() -> None:
    """The coordinator counted its node's members; none may release itself before the record is
    seen, even past its vote's expiry plus grace (the record is on its way through the API)."""
    c = Cluster("a", graceSeconds=0)
    c.pod("m0", "a", 2, timeout=30)
    c.pod("m1", "a", 2, timeout=30)
    for name in ("m0", "m1"):
        await c.admit(name)
    await c.sync()
    for name in ("m0", "m1"):
        await c.permit(name)
    await c.sync()
    assert c.committed_on() == {"m0": (True, "GangQuorumReached")}
    c.clock.advance(60)
    assert (await c.permit("m1")).verdict is Verdict.WAIT
    assert (await c.permit("m0")).verdict is Verdict.WAIT
    await c.sync()
    assert (await c.permit("m1")).verdict is Verdict.CONTINUE


async def test_across_nodes_a_restarted_agent_follows_the_record_it_finds() -> None:
    c = Cluster("a", "b")
    for name, node in (("m0", "a"), ("m1", "b")):
        c.pod(name, node, 2)
        await c.admit(name)
    await c.sync()
    for name in ("m0", "m1"):
        await c.permit(name)
    await c.sync()
    assert c.committed_on() == {"m0": (True, "GangQuorumReached")}
    # Node b's agent restarts before it saw the record: a fresh stage, the same pods.
    from plugins.gang.view import ClusterView

    fresh = GangStage(GangConfig(), c.handles["b"], view=ClusterView(None, NoCatalog()))  # type: ignore[arg-type]
    c.stages["b"] = fresh
    c.members["m1"].ctx = FakeContext(c.members["m1"].pod)
    await c.sync()
    assert await c.admit("m1") is Verdict.CONTINUE
    assert (await c.permit("m1")).verdict is Verdict.CONTINUE
    assert fresh.metrics.records == {}


def test_assessment_coordinator_votes_and_generations() -> None:
    from plugins.gang.coordinator import assess, pod_info, vote_message

    now = 1767323100.0

    def info(name: str, created: str = T0, **status: Any) -> Any:
        labels = status.pop("labels", {})
        deleted = {"deletionTimestamp": status.pop("deleted")} if "deleted" in status else {}
        obj = {"metadata": {"name": name, "namespace": "ns", "uid": name, "creationTimestamp": created,
                            "labels": labels, **deleted},
               "spec": {"nodeName": status.pop("node", "n")}, "status": status}
        return pod_info(obj)

    def vote(expires: float) -> list[dict[str, str]]:
        return [{"type": "gang.nodeagent.io/Prepared", "status": "True", "reason": "WaitingForGang",
                 "message": vote_message(expires)}]

    pods = [info("b", conditions=vote(now + 10)), info("a", conditions=vote(now - 1)),
            info("z", labels={"batch.kubernetes.io/job-completion-index": "0"}), info("c", node="")]
    found = assess(pods, 2, now)
    assert found.coordinator is not None and found.coordinator.name == "z"  # index 0 wins over names
    assert [p.name for p in found.current] == ["z", "a", "b"]  # c is not bound
    assert [p.name for p in found.votes] == ["b"]  # a's vote expired
    assert found.commit is None and found.failed == ()
    # An abort record ends the generation of every pod created no later than it.
    record = [{"type": "gang.nodeagent.io/StartCommitted", "status": "False", "reason": "GangAborted",
               "message": "x", "lastTransitionTime": "2026-01-02T03:04:30Z"}]
    pods = [info("a", phase="Failed", conditions=record), info("b"), info("n", created="2026-01-02T03:04:31Z"),
            info("f", created="2026-01-02T03:04:40Z", phase="Failed", reason="OutOfcpu")]
    found = assess(pods, 2, now)
    assert [p.name for p in found.current] == ["n"]
    assert [p.name for p in found.failed] == ["f"]
    # A member deleted from the API ends Failed as well (its agent writes the terminal phase): it
    # was withdrawn, not failed, and does not abort the gang its replacement may complete.
    withdrawn = info("d", created="2026-01-02T03:04:41Z", phase="Failed", deleted="2026-01-02T03:04:50Z")
    assert [p.name for p in assess([*pods, withdrawn], 2, now).failed] == ["f"]
    assert found.abort_for(created_at(pod(created=T0))) is not None
    assert found.abort_for(created_at(pod(created="2026-01-02T03:04:31Z"))) is None
    # Evidence of a commit: the record, a member that followed it, or minMember started.
    followed = [{"type": "gang.nodeagent.io/Prepared", "status": "True", "reason": "GangCommitted"}]
    assert assess([info("a", conditions=followed)], 2, now).commit is not None
    running = {"containerStatuses": [{"state": {"running": {}}}]}
    assert assess([info("a", **running), info("b", **running)], 2, now).commit == "2 members started"
    assert assess([info("a", **running)], 2, now).commit is None


# --- the gang facts as Kubernetes Events ---------------------------------------------------------


def _kube_events(pods: list[Pod], facts: list[Event]) -> list[tuple[str, str, str, str]]:
    """What the agent's Event recorder (nodeagent/cluster/kubeevents.py) queues for these facts,
    in the order they were published: (pod, type, reason, message)."""
    from nodeagent.cluster.kubeevents import KubeEvents
    from nodeagent.events import PodSpecObserved

    recorder = KubeEvents(api=None, node_name="n1")
    for p in pods:
        ref = PodRef(uid=p.uid, namespace=p.metadata.namespace, name=p.metadata.name)
        recorder.translate(PodSpecObserved(pod=ref, origin="api", pod_spec=p.model_dump(by_alias=True,
                                                                                        exclude_none=True)))
    for fact in sorted(facts, key=lambda e: e.id):
        recorder.translate(fact)
    return [(e.involved.name, e.type, e.reason, e.message) for e in recorder._queue]


def _facts(c: Cluster) -> list[Event]:
    return [*(e for m in c.members.values() for e in m.ctx.events), *(e for h in c.handles.values() for e in h.events)]


def test_each_gang_fact_says_its_event() -> None:
    from plugins.gang.events import (
        GangAborted,
        GangCommitted,
        GangDecisionRecorded,
        GangMemberPrepared,
        GangPartialStartDetected,
    )

    def said(fact: Event) -> tuple[str, str, str] | None:
        event = fact.kube_event()
        return None if event is None else (event.type, event.reason, event.message)

    assert said(GangMemberPrepared(gang="ns/g", generation=2, prepared=3, min_member=4)) == (
        "Normal", "WaitingForGang", "Prepared; waiting for gang ns/g (generation 2): 3 of 4 members prepared")
    # The member that completes the quorum on one node does not wait: its GangCommitted follows.
    assert said(GangMemberPrepared(gang="ns/g", generation=2, prepared=4, min_member=4)) is None
    assert said(GangMemberPrepared(gang="ns/g", generation=1, prepared=1, min_member=8, across_nodes=True)) == (
        "Normal", "WaitingForGang", "Prepared; waiting for gang ns/g (generation 1): 1 of 8 members prepared on "
        "this node; its coordinator decides from every member's vote")
    assert said(GangCommitted(gang="ns/g", generation=1, prepared=8, min_member=8, waited_seconds=1.25)) == (
        "Normal", "GangCommitted", "Gang ns/g committed (generation 1): 8 of 8 members were prepared; starting "
        "containers after 1.2s at the barrier")
    assert said(GangCommitted(gang="ns/g", generation=1, prepared=8, min_member=8, waited_seconds=0,
                              joined_after_commit=True))[2].endswith("joined after the commit; starting containers")
    assert said(GangCommitted(gang="ns/g", generation=1, prepared=2, min_member=2, waited_seconds=0,
                              recovered=True))[2].endswith("recovered from the runtime after an agent restart")
    assert said(GangAborted(gang="ns/g", generation=3, reason="GangAdmissionTimeout", message="gang ns/g did not "
                            "commit within 8s", prepared=1, min_member=2, across_nodes=True)) == (
        "Warning", "GangAdmissionTimeout", "Released without starting (generation 3, 1 of 2 members prepared on "
        "this node): gang ns/g did not commit within 8s")
    assert said(GangAborted(gang="ns/g", generation=1, reason="GangAborted", message="gang ns/g aborted: x")) == (
        "Warning", "GangAborted", "Released without starting (generation 1): gang ns/g aborted: x")
    # Decided in this pod's own admission: its rejection is already the pod's Event.
    assert said(GangAborted(gang="ns/g", generation=1, reason="GangLocalAdmissionFailed", message="m")) is None
    assert said(GangPartialStartDetected(gang="ns/g", generation=1, containers=["main"])) == (
        "Warning", "GangPartialStart", "Gang ns/g (generation 1) aborted while containers main of this member "
        "had started")
    assert said(GangDecisionRecorded(gang="ns/g", generation=1, committed=True, reason="GangQuorumReached",
                                     message="gang ns/g: 2 of 2 members prepared (a, b)", votes=2, min_member=2)) == (
        "Normal", "GangQuorumReached", "Recorded the gang's commit as its coordinator (generation 1, 2 of 2 "
        "votes): gang ns/g: 2 of 2 members prepared (a, b)")
    assert said(GangDecisionRecorded(gang="ns/g", generation=1, committed=False, reason="GangAdmissionTimeout",
                                     message="gang ns/g did not commit", votes=1, min_member=2))[:2] == (
        "Warning", "GangAdmissionTimeout")


async def test_across_nodes_a_committed_gang_gives_each_member_one_event_per_fact() -> None:
    c = Cluster("a", "b")
    for name, node in (("m0", "a"), ("m1", "a"), ("m2", "b")):
        c.pod(name, node, 3)
        assert await c.admit(name) is Verdict.CONTINUE
    await c.sync()
    for _ in range(2):  # asked again while waiting: no new fact, no new Event
        for name in ("m0", "m1"):
            assert (await c.permit(name)).verdict is Verdict.WAIT
    await c.sync()
    assert (await c.permit("m2")).verdict is Verdict.WAIT
    await c.sync()  # the coordinator writes its record
    await c.sync()  # every node sees it
    for name in ("m0", "m1", "m2"):
        assert (await c.permit(name)).verdict is Verdict.CONTINUE
    waiting = "; its coordinator decides from every member's vote"
    assert _kube_events([m.pod for m in c.members.values()], _facts(c)) == [
        ("m0", "Normal", "WaitingForGang", f"Prepared; waiting for gang ns/g (generation 1): 1 of 3 members prepared "
                                           f"on this node{waiting}"),
        ("m1", "Normal", "WaitingForGang", f"Prepared; waiting for gang ns/g (generation 1): 2 of 3 members prepared "
                                           f"on this node{waiting}"),
        ("m2", "Normal", "WaitingForGang", f"Prepared; waiting for gang ns/g (generation 1): 1 of 3 members prepared "
                                           f"on this node{waiting}"),
        ("m0", "Normal", "GangQuorumReached", "Recorded the gang's commit as its coordinator (generation 1, 3 of 3 "
                                              "votes): gang ns/g: 3 of 3 members prepared (m0, m1, m2); decided by "
                                              "ns/m0 on node a"),
        *((m, "Normal", "GangCommitted", "Gang ns/g committed (generation 1): 3 of 3 members were prepared; starting "
                                         "containers after 0.0s at the barrier") for m in ("m0", "m1", "m2")),
    ]


async def test_across_nodes_an_aborted_gang_gives_each_member_one_warning() -> None:
    from nodeagent.events import PodRejected

    c = await _two_waiting_on_a_and_one_that_cannot_fit_on_b()
    assert await c.admit("m2") is Verdict.REJECT
    m2 = c.members["m2"]
    # What the worker publishes for a rejected pod (the kubelet's admission Event).
    rejected = PodRejected(pod=m2.ctx.ref, reason=m2.reason, message=m2.message)
    await c.sync()
    for name in ("m0", "m1"):
        assert (await c.permit(name)).verdict is Verdict.REJECT
    got = _kube_events([m.pod for m in c.members.values()], [*_facts(c), rejected])
    assert [(pod, type_, reason) for pod, type_, reason, _ in got] == [
        ("m0", "Normal", "WaitingForGang"), ("m1", "Normal", "WaitingForGang"),
        ("m2", "Warning", "GangLocalAdmissionFailed"),
        ("m0", "Warning", "GangAborted"), ("m0", "Warning", "GangAborted"), ("m1", "Warning", "GangAborted")]
    record, released = got[3][3], got[4][3]
    assert record.startswith("Recorded the gang's abort as its coordinator (generation 1, 2 of 3 votes): gang ns/g "
                             "aborted: member ns/m2 failed on node b"), record
    assert released.startswith("Released without starting (generation 1, 2 of 3 members prepared on this node): "
                               "gang ns/g aborted: member ns/m2 failed on node b"), released
    assert got[5][3] == released


async def test_on_one_node_commit_timeout_and_a_member_that_does_not_fit_are_one_event_each() -> None:
    gang, handle = stage(timeoutSeconds=30)
    members = [pod(f"m{i}", annotations=ours("g", 2)) for i in range(2)]
    contexts = [FakeContext(m) for m in members]
    for m, ctx in zip(members, contexts, strict=True):
        await admitted(gang, m)
        await gang.permit(ctx)  # type: ignore[arg-type]
    await gang.permit(contexts[0])  # type: ignore[arg-type]
    got = _kube_events(members, [e for ctx in contexts for e in ctx.events])
    assert [(p, r) for p, _, r, _ in got] == [("m0", "WaitingForGang"), ("m1", "GangCommitted"),
                                              ("m0", "GangCommitted")]
    assert got[0][3] == "Prepared; waiting for gang ns/g (generation 1): 1 of 2 members prepared"

    gang, handle = stage(timeoutSeconds=30)
    lone = [pod("t0", annotations=ours("t", 2))]
    ctx = FakeContext(lone[0])
    await admitted(gang, lone[0])
    await gang.permit(ctx)  # type: ignore[arg-type]
    handle.clock.advance(30)
    assert (await gang.permit(ctx)).reason == "GangAdmissionTimeout"  # type: ignore[arg-type]
    got = _kube_events(lone, ctx.events)
    assert [(t, r) for _, t, r, _ in got] == [("Normal", "WaitingForGang"), ("Warning", "GangAdmissionTimeout")]
    assert got[1][3].startswith("Released without starting (generation 1, 1 of 2 members prepared): gang ns/t did "
                                "not commit within 30s")

    # A member that does not fit: its own rejection is its Event; the others' abort is theirs.
    from nodeagent.events import PodRejected

    gang, handle = stage()
    small, big = pod("s0", annotations=ours("b", 2)), pod("s1", annotations=ours("b", 2), cpu="100")
    ctx = FakeContext(small)
    await admitted(gang, small)
    await gang.permit(ctx)  # type: ignore[arg-type]
    result = await gang.admit(big, NodeView(NODE, [small]))
    assert result.reason == "GangLocalAdmissionFailed"
    rejected = PodRejected(pod=PodRef(uid=big.uid, namespace="ns", name="s1"), reason=result.reason,
                           message=result.message)  # what the worker publishes for it
    assert (await gang.permit(ctx)).reason == "GangAborted"  # type: ignore[arg-type]
    got = _kube_events([small, big], [*ctx.events, *handle.events, rejected])
    assert [(p, t, r) for p, t, r, _ in got] == [("s0", "Normal", "WaitingForGang"),
                                                 ("s1", "Warning", "GangLocalAdmissionFailed"),
                                                 ("s0", "Warning", "GangAborted")]
