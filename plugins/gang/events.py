"""The facts the gang stage publishes. Each names the member pod it is about; ``gang`` is
``namespace/name`` and ``generation`` counts the gang's attempts on this agent, so a member's
trace tells which attempt it belonged to."""

from __future__ import annotations

from typing import Literal

from nodeagent.events import Event


class GangMemberPrepared(Event):
    """The member finished local preparation (images, sandbox, devices) and reached the barrier:
    its vote for the gang to start."""

    kind: Literal["GangMemberPrepared"] = "GangMemberPrepared"
    gang: str
    generation: int
    prepared: int
    """Members prepared so far, this one included."""
    min_member: int


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


class GangAborted(Event):
    """The gang will not start: published for each member that fails because of it, and for the
    pod whose failure or departure decided it."""

    kind: Literal["GangAborted"] = "GangAborted"
    gang: str
    generation: int
    reason: str
    """GangAborted, GangAdmissionTimeout or GangLocalAdmissionFailed."""
    message: str


class GangPartialStartDetected(Event):
    """A gang aborted while one of its members had containers in the runtime: the invariant the
    stage exists for was broken (by another stage starting containers without permit, for
    example). Its count must stay 0."""

    kind: Literal["GangPartialStartDetected"] = "GangPartialStartDetected"
    gang: str
    generation: int
    containers: list[str]


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
