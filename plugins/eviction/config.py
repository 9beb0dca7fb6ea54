"""The eviction stage's configuration: the kubelet's KubeletConfiguration fields, same names,
same defaults, same rules (so that the kubelet's file can feed it unchanged)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from nodeagent.duration import Duration
from plugins.eviction import signals as S

PRESSURE_TRANSITION_DEFAULT = 300.0


class EvictionConfig(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    eviction_hard: dict[str, str] | None = None
    """Hard thresholds (``signal: quantity`` or ``signal: percent``). Unset: the kubelet's Linux
    defaults (memory.available 100Mi, nodefs.available 10%, nodefs.inodesFree 5%,
    imagefs.available 15%, imagefs.inodesFree 5%); set: only these (``"0%"`` switches one off),
    unless mergeDefaultEvictionSettings fills in the missing ones."""
    eviction_soft: dict[str, str] = Field(default_factory=dict)
    """Soft thresholds; each needs a grace period in evictionSoftGracePeriod."""
    eviction_soft_grace_period: dict[str, str] = Field(default_factory=dict)
    """How long a soft threshold must stay met before a pod is evicted (Go durations)."""
    eviction_max_pod_grace_period: int = 0
    """Seconds a pod evicted for a soft threshold gets to stop, capped by its own
    terminationGracePeriodSeconds (hard thresholds: 1 s)."""
    eviction_minimum_reclaim: dict[str, str] = Field(default_factory=dict)
    """How far above a met threshold the node must get before it counts as resolved."""
    eviction_pressure_transition_period: Duration = PRESSURE_TRANSITION_DEFAULT
    """How long a pressure condition stays True after its threshold was last met (0: 5m)."""
    merge_default_eviction_settings: bool = False
    """With evictionHard set: fill the signals it leaves out from the defaults."""
    local_storage_capacity_isolation: bool = True
    """Evict pods over their emptyDir sizeLimit or ephemeral-storage limits."""
    eviction_monitoring_period: Duration = Field(default=10.0, gt=0)
    """Seconds between eviction cycles: the kubelet's constant evictionMonitoringPeriod (10 s),
    configurable here (not a KubeletConfiguration field) so tests need not wait."""

    @field_validator("eviction_pressure_transition_period")
    @classmethod
    def _default_zero(cls, value: float) -> float:
        return PRESSURE_TRANSITION_DEFAULT if value == 0 else value

    @model_validator(mode="after")
    def _parses(self) -> EvictionConfig:
        self.thresholds()  # ThresholdError (a ValueError) with the kubelet's message
        return self

    def hard(self) -> dict[str, str]:
        if self.eviction_hard is None:
            return dict(S.DEFAULT_EVICTION_HARD)
        if self.merge_default_eviction_settings:
            return {**S.DEFAULT_EVICTION_HARD, **self.eviction_hard}
        return dict(self.eviction_hard)

    def thresholds(self) -> list[S.Threshold]:
        return S.parse_thresholds(self.hard(), self.eviction_soft, self.eviction_soft_grace_period,
                                  self.eviction_minimum_reclaim)


__all__ = ["EvictionConfig"]
