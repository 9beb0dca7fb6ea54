"""nodeenv: every container gets ``NODE_ZONE=<zone>`` (docs/PLUGINS.md's walkthrough)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from nodeagent.additions import ALL_CONTAINERS, CONTAINER_ADDITIONS, ContainerAdditions
from nodeagent.stages import AgentHandle, PodContext, Prepare, Result

VARIABLE = "NODE_ZONE"


class NodeEnvConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    zone: str = Field(min_length=1)


class NodeEnv(Prepare):
    name: ClassVar[str] = "nodeenv"
    provides = (CONTAINER_ADDITIONS,)  # declared: only then may it set additions

    def __init__(self, config: NodeEnvConfig) -> None:
        self.config = config

    async def prepare(self, ctx: PodContext) -> Result:
        # "*": every container; a retry or a restarted agent sets the same again (idempotent).
        ctx.additions.set(ALL_CONTAINERS, ContainerAdditions(envs={VARIABLE: self.config.zone}))
        return Result.ok()

    async def unprepare(self, ctx: PodContext) -> None:
        ctx.additions.withdraw()  # exactly what this stage added, nobody else's


def plugin(config: Mapping[str, Any], handle: AgentHandle | None) -> NodeEnv:
    return NodeEnv(NodeEnvConfig.model_validate(config))


plugin.stage_class = NodeEnv  # type: ignore[attr-defined]
