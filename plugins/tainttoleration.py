"""Admission against the Node's NoExecute taints (the kubelet's TaintToleration check).

The kubelet re-checks, for every pod from the API server (static pods are exempt), that the
pod tolerates each ``NoExecute`` taint of its Node; NoSchedule and PreferNoSchedule are the
scheduler's business. A pod bound to the node by a client that set ``spec.nodeName`` itself
skips the scheduler, so without this it would run on a node that evicts it at once. Reason and
message are the kubelet's. Taints come from the Node in the API (the object store's view of the
agent's own Node, the kubelet's node informer); standalone there are none. The matching
itself is nodeagent/kube/taints.py.
"""

from __future__ import annotations

from typing import Any, ClassVar

import structlog

from nodeagent import labels as L
from nodeagent.kube.taints import first_untolerated
from nodeagent.model import Pod
from nodeagent.objects import View
from nodeagent.objects.ownnode import own_node, taints_of
from nodeagent.pluginconfig import NoConfig
from nodeagent.stages import Admit, AgentHandle, NodeView, Result

log = structlog.get_logger("nodeagent.tainttoleration")

REASON = "TaintToleration"
MESSAGE = "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"


class TaintToleration(Admit):
    name: ClassVar[str] = "tainttoleration"

    def __init__(self, node: View | None) -> None:
        self._node = node

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        if self._node is None or pod.metadata.annotations.get(L.CONFIG_SOURCE) == "file":
            return Result.ok()
        taint = first_untolerated(taints_of(self._node), pod.spec.tolerations)
        if taint is None:
            return Result.ok()
        # The kubelet's message does not say which taint; the log does.
        log.info("pod does not tolerate a NoExecute taint of the Node",
                 pod=f"{pod.metadata.namespace}/{pod.metadata.name}",
                 taint=f"{taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')}")
        return Result.reject(REASON, MESSAGE)

    def describe(self) -> dict[str, Any]:
        """For the agent's /plugins: the taints admission is deciding on."""
        return {"taints": taints_of(self._node) if self._node is not None else []}


def plugin(config: NoConfig, handle: AgentHandle) -> TaintToleration:
    return TaintToleration(own_node(handle.objects, handle.node.name))


plugin.stage_class = TaintToleration  # type: ignore[attr-defined]
plugin.config_model = NoConfig  # type: ignore[attr-defined]
