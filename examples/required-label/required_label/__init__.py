"""Admission by a required pod label: a pod without the configured label does not run here.

A template for out-of-tree stage plugins. It shows the whole shape in one file:

- a configuration model (pydantic, frozen, unknown keys are errors) for the plugin's section of
  the NodeAgentConfiguration (``plugins: {requiredlabel: {label: team}}``), declared on the
  factory as ``config_model``: the agent validates the section with it when it loads (an error
  names ``plugins.requiredlabel.<field>``) and ``nodeagent plugins`` shows it;
- a class that inherits the phase it joins (:class:`nodeagent.stages.Admit`) and whose ``name``
  is its entry-point name, its configuration section and its log field ``stage=``;
- the factory ``plugin(config, handle)`` that the entry point names.

It imports nothing from nodeagent but the public contract: ``nodeagent.stages`` and
``nodeagent.model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from nodeagent.model import Pod
from nodeagent.stages import Admit, AgentHandle, NodeView, Result

REASON = "MissingRequiredLabel"
"""The pod status reason of a rejected pod (CamelCase, like the kubelet's reasons)."""


class RequiredLabelConfig(BaseModel):
    """The ``requiredlabel`` section of the agent configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str = Field(min_length=1)
    """The label key every pod must carry (any value, even an empty one, will do)."""


class RequiredLabel(Admit):
    name: ClassVar[str] = "requiredlabel"

    def __init__(self, config: RequiredLabelConfig) -> None:
        self.config = config

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        # A pure decision on the pod alone: no state, nothing to undo, safe to ask again
        # after an agent restart (the Admit contract).
        label = self.config.label
        if label in pod.metadata.labels:
            return Result.ok()
        return Result.reject(
            REASON,
            f"pod {pod.metadata.namespace}/{pod.metadata.name} has no label {label!r}, which node "
            f"{node.node.name} requires of every pod (set metadata.labels.{label})",
        )


def plugin(config: RequiredLabelConfig | Mapping[str, Any], handle: AgentHandle) -> RequiredLabel:
    """The factory the entry point names. The agent hands it the validated model; a mapping (a
    test calling it directly) is validated here, so a bad configuration fails either way."""
    return RequiredLabel(RequiredLabelConfig.model_validate(config))


# Lets `nodeagent plugins` show the phases this plugin joins without creating it, and the agent
# validate its section before the factory runs.
plugin.stage_class = RequiredLabel  # type: ignore[attr-defined]
plugin.config_model = RequiredLabelConfig  # type: ignore[attr-defined]

__all__ = ["REASON", "RequiredLabel", "RequiredLabelConfig", "plugin"]
