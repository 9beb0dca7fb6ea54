"""The node configuration stages read: the effective KubeletConfiguration, read-only, with the
two things about the node it does not hold (its name and the kubelet's root directory).

Stages get it as ``handle.settings`` and ``ctx.settings``: typed, so a stage reads
``settings.cluster_dns`` or ``settings.seccomp_default`` without a default of its own, and
frozen, so no stage can change what another sees. nodeagent's own settings for a stage are in
the stage's own configuration model (its section of the NodeAgentConfiguration), not here.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict

from nodeagent.kubeletconfig.schema import KubeletConfiguration


class NodeConfig(KubeletConfiguration):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    root_dir: Path = Path("/var/lib/kubelet")
    """The kubelet's ``--root-dir``: pod directories, plugin state, certificates."""
    node_name: str = ""

    @classmethod
    def of(cls, kubelet: KubeletConfiguration, *, root_dir: Path, node_name: str) -> NodeConfig:
        values = {name: getattr(kubelet, name) for name in KubeletConfiguration.model_fields}
        return cls.model_construct(**values, root_dir=root_dir, node_name=node_name)

    @property
    def cluster_dns_servers(self) -> list[str]:
        return list(self.cluster_dns or [])

    @property
    def unsafe_sysctls(self) -> list[str]:
        return list(self.allowed_unsafe_sysctls or [])


__all__ = ["NodeConfig"]
