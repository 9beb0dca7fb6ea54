"""Admission against the Node's NoExecute taints (the kubelet's TaintToleration check).

The kubelet re-checks, for every pod from the API server (static pods are exempt), that the
pod tolerates each ``NoExecute`` taint of its Node; NoSchedule and PreferNoSchedule are the
scheduler's business. A pod bound to the node by a client that set ``spec.nodeName`` itself
skips the scheduler, so without this it would run on a node that evicts it at once. Reason and
message are the kubelet's. Taints come from the Node in the API (nodeagent.cluster.nodewatch,
the kubelet's node informer); standalone there are none.

Toleration matching follows ``Toleration.ToleratesTaint``: an empty effect matches every effect,
an empty key (with ``Exists``) every key, ``Equal`` (or no operator) compares values,
``Exists`` ignores them; ``Lt``/``Gt`` match nothing (their feature gate,
TaintTolerationComparisonOperators, is alpha and off by default). ``tolerationSeconds`` does not
matter at admission: a pod that tolerates a taint for a while is admitted (the taint manager
evicts it later).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import anyio
import anyio.abc
import structlog

from nodeagent import labels as L
from nodeagent.cluster.nodewatch import NodeWatch
from nodeagent.model import Pod
from nodeagent.pluginconfig import NoConfig
from nodeagent.stages import Admit, AgentHandle, NodeView, Result

log = structlog.get_logger("nodeagent.tainttoleration")

REASON = "TaintToleration"
MESSAGE = "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
NO_EXECUTE = "NoExecute"


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return operator == "Exists"


def first_untolerated(taints: Sequence[Mapping[str, Any]],
                      tolerations: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first NoExecute taint no toleration tolerates, or None."""
    for taint in taints:
        if taint.get("effect") == NO_EXECUTE and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


class TaintToleration(Admit):
    name: ClassVar[str] = "tainttoleration"

    def __init__(self, node_watch: NodeWatch | None) -> None:
        self._node = node_watch

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The node-level task: keep the Node current (cluster mode); nothing to do standalone."""
        if self._node is None:
            task_status.started()
            return
        await self._node.run(task_status=task_status)

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        if self._node is None or pod.metadata.annotations.get(L.CONFIG_SOURCE) == "file":
            return Result.ok()
        taint = first_untolerated(self._node.taints(), pod.spec.tolerations)
        if taint is None:
            return Result.ok()
        # The kubelet's message does not say which taint; the log does.
        log.info("pod does not tolerate a NoExecute taint of the Node", pod=f"{pod.metadata.namespace}/{pod.metadata.name}",
                 taint=f"{taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')}")
        return Result.reject(REASON, MESSAGE)

    def describe(self) -> dict[str, Any]:
        """For the agent's /plugins: the taints admission is deciding on."""
        return {"taints": self._node.taints() if self._node is not None else []}


def plugin(config: NoConfig, handle: AgentHandle) -> TaintToleration:
    watch = NodeWatch(handle.api, handle.node.name, handle.clock) if handle.api is not None else None
    return TaintToleration(watch)


plugin.stage_class = TaintToleration  # type: ignore[attr-defined]
plugin.config_model = NoConfig  # type: ignore[attr-defined]
