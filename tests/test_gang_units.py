"""The gang stage without a runtime: declarations (every source, table-driven), generations and
the barrier's decisions with an injectable clock. tests/test_gang.py runs it against containerd."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodeagent.clock import ManualClock
from nodeagent.events import Event, PodRef
from nodeagent.model import Pod
from nodeagent.runtimeview import ContainerRecord, PodRuntime
from nodeagent.stages import NodeInfo, NodeView, Verdict
from plugins.gang import GangConfig, GangStage
from plugins.gang.catalog import ManifestCatalog, NoCatalog
from plugins.gang.declaration import DeclarationError, created_at, declaration_of

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

    def container_waiting(self, container: str, reason: str, message: str = "") -> None:
        self.waiting[container] = (reason, message)

    def clear_container_waiting(self, container: str) -> None:
        self.waiting.pop(container, None)

    def set_condition(self, type: str, status: bool, reason: str = "", message: str = "") -> None:
        self.conditions[type] = (status, reason)


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
        self.events.append(event)

    def wake(self) -> None:
        self.woken += 1


@dataclass
class FakeHandle:
    # Wall time 2026-01-02T03:05:00Z, so that the pods' creation times below compare with it.
    clock: ManualClock = field(default_factory=lambda: ManualClock(start=1767323100.0))
    events: list[Event] = field(default_factory=list)

    async def publish(self, event: Event) -> None:
        self.events.append(event)


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
    for m, ctx in zip(members, contexts):
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
    await gang.unreserve(members[2])  # deleted, or its preparation failed
    assert contexts[0].woken == 1
    result = await gang.permit(contexts[0])  # type: ignore[arg-type]
    assert result.verdict is Verdict.REJECT and result.reason == "GangAborted" and "m2" in result.message
    assert (await gang.permit(contexts[1])).reason == "GangAborted"  # type: ignore[arg-type]
    assert [e.kind for e in handle.events] == ["GangAborted"]
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
