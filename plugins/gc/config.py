"""The gc stage's configuration: the kubelet's image GC fields (KubeletConfiguration) and its
container GC policy (the deprecated flags' names), with the kubelet's defaults and rules, read
from the node's configuration (``handle.settings``: the KubeletConfiguration's top level and
the kubelet's flags); the plugin's own section (:class:`GcOptions`) holds only the periods,
which the kubelet hard-codes, and the log link directory."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from nodeagent.duration import Duration
from nodeagent.kubeletconfig.node import NodeConfig

IMAGE_MINIMUM_GC_AGE_DEFAULT = 120.0


class GcOptions(BaseModel):
    """``plugins.gc``: nodeagent's own knobs of the gc stage."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              use_attribute_docstrings=True)

    image_gc_period: Duration = Field(default=300.0, gt=0, alias="imageGCPeriod")
    """Seconds between image GC runs: the kubelet's constant ImageGCPeriod (5m), configurable
    here (not a KubeletConfiguration field) so tests need not wait."""
    container_gc_period: Duration = Field(default=60.0, gt=0, alias="containerGCPeriod")
    """Seconds between container GC runs (the kubelet's ContainerGCPeriod, 1m); not a
    KubeletConfiguration field."""
    container_logs_symlink_dir: Path | None = Path("/var/log/containers")
    """Where dangling ``<pod>_<ns>_<container>-<id>.log`` links are removed (the logs stage's
    containerLogsSymlinkDir, the kubelet's fixed /var/log/containers); None: nowhere."""


class GcConfig(GcOptions):
    """What the stage acts on: the kubelet's fields and flags and the plugin's own options."""

    image_gc_high_threshold_percent: int = Field(default=85, ge=0, le=100, alias="imageGCHighThresholdPercent")
    """Image filesystem usage (percent) at which image GC starts freeing space."""
    image_gc_low_threshold_percent: int = Field(default=80, ge=0, le=100, alias="imageGCLowThresholdPercent")
    """The usage image GC frees down to; never above the high threshold."""
    image_minimum_gc_age: Duration = Field(default=IMAGE_MINIMUM_GC_AGE_DEFAULT, alias="imageMinimumGCAge")
    """An image first seen less than this long ago is never removed (0: the default 2m0s)."""
    image_maximum_gc_age: Duration = Field(default=0.0, ge=0, alias="imageMaximumGCAge")
    """An unused image is removed once unused this long, whatever the disk (0: never)."""
    minimum_container_ttl_duration: Duration = Field(default=0.0, ge=0, alias="minimumContainerTTLDuration")
    """A dead container younger than this is kept (the kubelet's --minimum-container-ttl-duration)."""
    maximum_dead_containers_per_container: int = 1
    """Dead instances kept per (pod, container); negative: no limit
    (--maximum-dead-containers-per-container)."""
    maximum_dead_containers: int = -1
    """Dead containers kept on the node in all; negative: no limit (--maximum-dead-containers)."""

    @classmethod
    def of(cls, settings: NodeConfig, options: GcOptions) -> GcConfig:
        """The node's image GC fields and container GC flags with the plugin's options."""
        values = {**options.model_dump(),
                  "image_minimum_gc_age": settings.image_minimum_gc_age,
                  "image_maximum_gc_age": settings.image_maximum_gc_age,
                  "minimum_container_ttl_duration": settings.minimum_container_ttl_duration,
                  "maximum_dead_containers_per_container": settings.maximum_dead_containers_per_container,
                  "maximum_dead_containers": settings.maximum_dead_containers}
        if settings.image_gc_high_threshold_percent is not None:
            values["image_gc_high_threshold_percent"] = settings.image_gc_high_threshold_percent
        if settings.image_gc_low_threshold_percent is not None:
            values["image_gc_low_threshold_percent"] = settings.image_gc_low_threshold_percent
        return cls.model_validate(values)

    @field_validator("image_minimum_gc_age")
    @classmethod
    def _default_zero(cls, value: float) -> float:
        return IMAGE_MINIMUM_GC_AGE_DEFAULT if value == 0 else value

    @model_validator(mode="after")
    def _low_below_high(self) -> GcConfig:
        if self.image_gc_low_threshold_percent > self.image_gc_high_threshold_percent:
            raise ValueError(f"imageGCLowThresholdPercent ({self.image_gc_low_threshold_percent}) must be less than "
                             f"imageGCHighThresholdPercent ({self.image_gc_high_threshold_percent})")
        return self

    @property
    def image_gc_enabled(self) -> bool:
        """The kubelet switches image GC off when the high threshold is 100 and there is no maximum age."""
        return not (self.image_gc_high_threshold_percent == 100 and self.image_maximum_gc_age == 0)


__all__ = ["GcConfig", "GcOptions"]
