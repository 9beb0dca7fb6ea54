"""The node configuration stages read: the effective KubeletConfiguration, read-only, with what
of the node it does not hold (its name, the kubelet's root directory and the container GC
policy, which the kubelet takes from deprecated flags only).

Stages get it as ``handle.settings`` and ``ctx.settings``: typed, so a stage reads
``settings.cluster_dns`` or ``settings.seccomp_default`` without a default of its own, and
frozen, so no stage can change what another sees. nodeagent's own settings for a stage are in
the stage's own configuration model (its section of the NodeAgentConfiguration), not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from nodeagent.kubeletconfig.flags import KubeletFlags
from nodeagent.kubeletconfig.schema import KubeletConfiguration


class NodeConfig(KubeletConfiguration):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    root_dir: Path = Path("/var/lib/kubelet")
    """The kubelet's ``--root-dir``: pod directories, plugin state, certificates."""
    node_name: str = ""
    minimum_container_ttl_duration: float = 0.0
    """``--minimum-container-ttl-duration``: a dead container younger than this is kept."""
    maximum_dead_containers_per_container: int = 1
    """``--maximum-dead-containers-per-container`` (negative: no limit)."""
    maximum_dead_containers: int = -1
    """``--maximum-dead-containers`` (negative: no limit)."""

    @classmethod
    def of(cls, kubelet: KubeletConfiguration, *, root_dir: Path, node_name: str,
           flags: KubeletFlags | None = None) -> NodeConfig:
        values = {name: getattr(kubelet, name) for name in KubeletConfiguration.model_fields}
        gc: dict[str, Any] = {} if flags is None else {
            "minimum_container_ttl_duration": flags.minimum_container_ttl_duration,
            "maximum_dead_containers_per_container": flags.maximum_dead_containers_per_container,
            "maximum_dead_containers": flags.maximum_dead_containers}
        return cls.model_construct(**values, root_dir=root_dir, node_name=node_name, **gc)

    @property
    def cluster_dns_servers(self) -> list[str]:
        return list(self.cluster_dns or [])

    @property
    def unsafe_sysctls(self) -> list[str]:
        return list(self.allowed_unsafe_sysctls or [])


__all__ = ["NodeConfig"]
