"""The facts the gang stage publishes. Each names the member pod it is about; ``gang`` is
``namespace/name`` and ``generation`` counts the gang's attempts on this agent, so a member's
trace tells which attempt it belonged to.

In cluster mode each fact is also a core/v1 Event on its member pod (:meth:`kube_event`, sent by
nodeagent/cluster/kubeevents.py with ``source.component: kubelet``), so that ``kubectl describe
pod`` and ``kubectl get events`` tell a member's gang story: Normal ``WaitingForGang`` when it
reached the barrier, Normal ``GangCommitted`` when it passed it, Warning with the abort's reason
when it was released, and on the coordinator's pod the record its agent wrote
(``GangQuorumReached``, or the abort). Each fact is published once per member and generation, so
each is one Event; the messages say the gang, the generation and the counts.
"""

from __future__ import annotations

from typing import Literal

from nodeagent.events import Event, KubeEvent
from plugins.gang.names import COMMITTED, LOCAL_ADMISSION_FAILED, PARTIAL_START, WAITING


def _prepared(prepared: int, min_member: int, across_nodes: bool) -> str:
    # Across nodes an agent counts only its own node's members; the others' votes are in the API.
    return f"{prepared} of {min_member} members prepared" + (" on this node" if across_nodes else "")


class GangMemberPrepared(Event):
    """The member finished local preparation (images, sandbox, devices) and reached the barrier:
    its vote for the gang to start."""

    kind: Literal["GangMemberPrepared"] = "GangMemberPrepared"
    gang: str
    generation: int
    prepared: int
    """Members prepared so far, this one included (across nodes: of this node's members)."""
    min_member: int
    across_nodes: bool = False
    """The gang may span nodes: its coordinator decides from every member's vote in the API."""

    def kube_event(self) -> KubeEvent | None:
        if not self.across_nodes and self.prepared >= self.min_member:
            return None  # it completed the quorum on this node: its GangCommitted follows at once
        then = "; its coordinator decides from every member's vote" if self.across_nodes else ""
        return KubeEvent("Normal", WAITING,
                         f"Prepared; waiting for gang {self.gang} (generation {self.generation}): "
                         f"{_prepared(self.prepared, self.min_member, self.across_nodes)}{then}")


class GangCommitted(Event):
    """The gang committed and this member may start its containers (published once per member,
    when it passes the barrier)."""

    kind: Literal["GangCommitted"] = "GangCommitted"
    gang: str
    generation: int
    prepared: int
    """Members that were prepared when the gang committed."""
    min_member: int
    waited_seconds: float
    """This member's time at the barrier (0 for a member that joined after the commit)."""
    joined_after_commit: bool = False
    recovered: bool = False
    """The commit was recovered from the runtime after an agent restart: a member's containers
    exist, and containers are created only after a commit."""

    def kube_event(self) -> KubeEvent:
        if self.recovered:
            how = "recovered from the runtime after an agent restart"
        elif self.joined_after_commit:
            how = "joined after the commit; starting containers"
        else:
            how = f"starting containers after {self.waited_seconds:.1f}s at the barrier"
        return KubeEvent("Normal", COMMITTED,
                         f"Gang {self.gang} committed (generation {self.generation}): {self.prepared} of "
                         f"{self.min_member} members were prepared; {how}")


class GangAborted(Event):
    """The gang will not start: published for each member that fails because of it, and for the
    pod whose failure or departure decided it."""

    kind: Literal["GangAborted"] = "GangAborted"
    gang: str
    generation: int
    reason: str
    """GangAborted, GangAdmissionTimeout or GangLocalAdmissionFailed."""
    message: str
    prepared: int | None = None
    """Members prepared when the member was released (across nodes: of this node's members);
    None: not counted."""
    min_member: int | None = None
    across_nodes: bool = False

    def kube_event(self) -> KubeEvent | None:
        if self.reason == LOCAL_ADMISSION_FAILED:
            # Decided in admission: the pod's admission rejection is already its Event, with the
            # same reason (the kubelet's rejected-pod Event); a second would say it again.
            return None
        counts = ""
        if self.prepared is not None and self.min_member is not None:
            counts = f", {_prepared(self.prepared, self.min_member, self.across_nodes)}"
        return KubeEvent("Warning", self.reason,
                         f"Released without starting (generation {self.generation}{counts}): {self.message}")


class GangPartialStartDetected(Event):
    """A gang aborted after containers of one of its members had started: the invariant the
    stage exists for was broken (by another stage starting containers without permit, for
    example). Its count must stay 0."""

    kind: Literal["GangPartialStartDetected"] = "GangPartialStartDetected"
    gang: str
    generation: int
    containers: list[str]

    def kube_event(self) -> KubeEvent:
        return KubeEvent("Warning", PARTIAL_START,
                         f"Gang {self.gang} (generation {self.generation}) aborted while containers "
                         f"{', '.join(self.containers)} of this member had started")


class GangDecisionRecorded(Event):
    """(cluster) This agent, as the gang's coordinator, wrote the gang's decision on its
    coordinator pod (condition gang.nodeagent.io/StartCommitted). Every member's agent, this one
    included, follows it once the API shows it."""

    kind: Literal["GangDecisionRecorded"] = "GangDecisionRecorded"
    gang: str
    generation: int
    committed: bool
    reason: str
    """GangQuorumReached, GangAborted or GangAdmissionTimeout."""
    message: str
    votes: int
    """Unexpired votes the coordinator saw."""
    min_member: int = 0

    def kube_event(self) -> KubeEvent:
        what = "commit" if self.committed else "abort"
        return KubeEvent("Normal" if self.committed else "Warning", self.reason,
                         f"Recorded the gang's {what} as its coordinator (generation {self.generation}, "
                         f"{self.votes} of {self.min_member} votes): {self.message}")
