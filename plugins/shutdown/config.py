"""The shutdown stage's configuration: the kubelet's graceful node shutdown fields
(KubeletConfiguration), same names, defaults and rules, read from the top level of the
KubeletConfiguration (``handle.settings``); the plugin's own section (:class:`ShutdownOptions`)
holds how the shutdown is learnt, which is not a kubelet field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from nodeagent.duration import Duration
from nodeagent.kubeletconfig.node import NodeConfig

CRITICAL_PRIORITY = 2_000_000_000
"""scheduling.SystemCriticalPriority: the group shutdownGracePeriodCriticalPods applies to."""


class PriorityGracePeriod(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    priority: int
    shutdown_grace_period_seconds: int = Field(ge=0)


class ShutdownOptions(BaseModel):
    """``plugins.shutdown``: nodeagent's own knobs of the shutdown stage."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              use_attribute_docstrings=True)

    shutdown_trigger: Literal["auto", "logind", "request-file"] = "auto"
    """How the node's shutdown is learnt (not a kubelet field): ``auto`` — systemd-logind where
    it runs (/run/systemd/system and the system bus), else the request file; ``logind`` —
    logind on the system bus (``DBUS_SYSTEM_BUS_ADDRESS`` is honoured), whether or not this
    looks like a systemd machine; ``request-file`` — only ``nodeagent shutdown``."""
    shutdown_request_file: str = "graceful_node_shutdown_request"
    """Where there is no systemd-logind (these machines, containers): ``nodeagent shutdown``
    writes this file under rootDir and the stage shuts the node's pods down as on logind's
    PrepareForShutdown; removing it (``nodeagent shutdown --cancel``) cancels. Not a kubelet
    field."""


class ShutdownConfig(ShutdownOptions):
    """What the stage acts on: the kubelet's fields and the plugin's own options."""

    shutdown_grace_period: Duration = Field(default=0.0, ge=0)
    """How long the node's shutdown is delayed for its pods, in all (0: graceful shutdown off)."""
    shutdown_grace_period_critical_pods: Duration = Field(default=0.0, ge=0)
    """The part of shutdownGracePeriod kept for critical pods, which are stopped last."""
    shutdown_grace_period_by_pod_priority: list[PriorityGracePeriod] = Field(default_factory=list)
    """Grace periods by pod priority instead of the two above: a pod gets the group of the
    highest priority not above its own; groups stop lowest priority first."""

    @classmethod
    def of(cls, settings: NodeConfig, options: ShutdownOptions) -> ShutdownConfig:
        """The node's graceful shutdown fields with the plugin's options."""
        return cls.model_validate({
            **options.model_dump(),
            "shutdown_grace_period": settings.shutdown_grace_period,
            "shutdown_grace_period_critical_pods": settings.shutdown_grace_period_critical_pods,
            "shutdown_grace_period_by_pod_priority": [
                {"priority": g.priority, "shutdown_grace_period_seconds": g.shutdown_grace_period_seconds}
                for g in settings.shutdown_grace_period_by_pod_priority or ()],
        })

    @model_validator(mode="after")
    def _one_way(self) -> ShutdownConfig:
        # The kubelet's ValidateKubeletConfiguration.
        if self.shutdown_grace_period_by_pod_priority and (self.shutdown_grace_period
                                                            or self.shutdown_grace_period_critical_pods):
            raise ValueError("Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the "
                             "same time")
        if self.shutdown_grace_period_critical_pods > self.shutdown_grace_period:
            raise ValueError(f"shutdownGracePeriodCriticalPods {self.shutdown_grace_period_critical_pods:g}s must be "
                             f"<= shutdownGracePeriod {self.shutdown_grace_period:g}s")
        return self

    def groups(self) -> list[PriorityGracePeriod]:
        """The priority groups, lowest priority first; empty: the feature is off."""
        if self.shutdown_grace_period_by_pod_priority:
            return sorted(self.shutdown_grace_period_by_pod_priority, key=lambda g: g.priority)
        if self.shutdown_grace_period == 0:
            return []
        critical = int(self.shutdown_grace_period_critical_pods)
        return [PriorityGracePeriod(priority=0,
                                    shutdown_grace_period_seconds=int(self.shutdown_grace_period) - critical),
                PriorityGracePeriod(priority=CRITICAL_PRIORITY, shutdown_grace_period_seconds=critical)]


__all__ = ["CRITICAL_PRIORITY", "PriorityGracePeriod", "ShutdownConfig", "ShutdownOptions"]
