"""Admission by node fit (the kubelet's predicate admit handler, nodeagent/kube/nodefit.py): the
pod's OS, max pods, CPU / memory / ephemeral-storage requests against allocatable, its
nodeSelector / required node affinity against the Node's labels (those the agent knows and
those the Node object in the API has, which an administrator may have labelled: a view of it
from the object store), and its host ports against those of the pods admitted before.
"""

from __future__ import annotations

from typing import ClassVar

from nodeagent.kube import nodefit
from nodeagent.model import Pod
from nodeagent.objects import View
from nodeagent.objects.ownnode import labels_of, own_node
from nodeagent.pluginconfig import NoConfig
from nodeagent.stages import Admit, AgentHandle, NodeView, Result


class NodeResources(Admit):
    name: ClassVar[str] = "noderesources"

    def __init__(self, node: View | None = None) -> None:
        self._node = node

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        # Labels an administrator added live only in the API: the watched Node has them (the
        # kubelet reads its Node informer again before rejecting on affinity).
        return nodefit.fit(pod, node, labels_of(self._node) if self._node is not None else None)


def plugin(config: NoConfig, handle: AgentHandle) -> NodeResources:
    return NodeResources(own_node(handle.objects, handle.node.name))
