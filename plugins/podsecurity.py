"""The podsecurity stage: the kubelet's security admission for what a node decides alone.

* privileged containers when the node disallows them (``allowPrivileged: false``; the kubelet's
  privilege admit handler): reason ``Forbidden``;
* sysctls outside the safe set and ``allowedUnsafeSysctls``, or a namespaced sysctl whose
  namespace the pod shares with the host (pkg/kubelet/sysctl): reason ``SysctlForbidden``;
* an AppArmor profile (other than Unconfined, in a security context or the deprecated
  annotation) on a host whose kernel does not enforce AppArmor, or a Localhost profile without
  a name (pkg/security/apparmor): reason ``AppArmor``, "Cannot enforce AppArmor: ...". Without
  this the runtime would fail the container later ("apparmor is not supported"), after the
  pod's sandbox and volumes were made for nothing.

Rejecting at admission (rather than when a container is configured) fails the pod before
anything is prepared for it, with the reason the kubelet gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from nodeagent.kube.security import is_privileged, normalize_sysctl
from nodeagent.model import Pod
from nodeagent.pluginconfig import PluginConfig
from nodeagent.stages import Admit, AgentHandle, NodeView, Result

FORBIDDEN = "Forbidden"
SYSCTL_FORBIDDEN = "SysctlForbidden"
APPARMOR = "AppArmor"
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
IPC, NET = "IPC", "Net"

# pkg/kubelet/sysctl/safe_sysctls.go: namespaced, and isolated from the node and other pods.
SAFE_SYSCTLS: Mapping[str, str] = {
    "kernel.shm_rmid_forced": IPC,
    "net.ipv4.ip_local_port_range": NET,
    "net.ipv4.tcp_syncookies": NET,
    "net.ipv4.ping_group_range": NET,
    "net.ipv4.ip_unprivileged_port_start": NET,
    "net.ipv4.ip_local_reserved_ports": NET,
    "net.ipv4.tcp_keepalive_time": NET,
    "net.ipv4.tcp_fin_timeout": NET,
    "net.ipv4.tcp_keepalive_intvl": NET,
    "net.ipv4.tcp_keepalive_probes": NET,
    "net.ipv4.tcp_rmem": NET,
    "net.ipv4.tcp_wmem": NET,
}
# pkg/kubelet/sysctl/namespace.go: which sysctls a pod's own namespaces isolate.
_IPC_SYSCTLS = frozenset({"kernel.sem", "kernel.shmall", "kernel.shmmax", "kernel.shmmni", "kernel.shm_rmid_forced",
                          "kernel.msgmax", "kernel.msgmnb", "kernel.msgmni"})
_PREFIX_NAMESPACES = (("net.", NET), ("fs.mqueue.", IPC))


def namespace_of(sysctl: str) -> str | None:
    if sysctl in _IPC_SYSCTLS:
        return IPC
    for prefix, ns in _PREFIX_NAMESPACES:
        if sysctl.startswith(prefix):
            return ns
    return None


class SysctlAllowlist:
    """The safe set plus the node's allowedUnsafeSysctls (exact names or ``prefix*``)."""

    def __init__(self, unsafe: Sequence[str]) -> None:
        self.exact: dict[str, str] = dict(SAFE_SYSCTLS)
        self.prefixes: dict[str, str] = {}
        for pattern in unsafe:
            name = normalize_sysctl(pattern)
            base = name.removesuffix("*")
            ns = namespace_of(base)
            if ns is None:
                # The kubelet refuses to start with such a list: the sysctl would change the node.
                raise ValueError(f"allowedUnsafeSysctls: {pattern!r} is not a namespaced sysctl")
            (self.prefixes if name.endswith("*") else self.exact)[base] = ns

    def check(self, sysctl: str, host_net: bool, host_ipc: bool) -> str | None:
        """validateSysctl: None when allowed, else the kubelet's error text."""
        name = normalize_sysctl(sysctl)
        ns = self.exact.get(name)
        if ns is None:
            ns = next((n for p, n in self.prefixes.items() if name.startswith(p)), None)
        if ns is None:
            return f'"{name}" not allowlisted'
        if (ns == IPC and host_ipc) or (ns == NET and host_net):
            return f'"{name}" not allowed with host {ns} enabled'
        return None


def apparmor_host_error(sysfs: Path = Path("/sys")) -> str | None:
    """Why this host cannot enforce AppArmor, or None (the kubelet's validateHost, read once at
    start: enabling AppArmor needs a restart anyway)."""
    try:
        enabled = (sysfs / "module/apparmor/parameters/enabled").read_text()
    except OSError:
        enabled = ""
    if not (sysfs / "kernel/security/apparmor").exists() or not enabled.startswith("Y"):
        return "AppArmor is not enabled on the host"
    return None


def apparmor_problem(pod: Pod, host_error: str | None) -> str | None:
    """The kubelet's AppArmor validator: None when the pod needs nothing the host lacks."""
    sc = pod.spec.security_context
    profiles = [sc.app_armor_profile if sc else None,
                *(c.security_context.app_armor_profile if c.security_context else None for c in pod.all_containers())]
    required = any(p is not None and p.type != "Unconfined" for p in profiles) or any(
        key.startswith(APPARMOR_ANNOTATION_PREFIX) and value != "unconfined"
        for key, value in (pod.metadata.annotations or {}).items())
    if not required:
        return None
    if host_error is not None:
        return host_error
    for p in profiles:
        if p is not None and p.type == "Localhost" and not (p.localhost_profile or "").strip():
            return f"invalid empty AppArmor profile name: {p.localhost_profile or ''!r}"
    return None


class PodSecurity(Admit):
    name: ClassVar[str] = "podsecurity"

    def __init__(self, allow_privileged: bool, sysctls: SysctlAllowlist, apparmor_host: str | None = None) -> None:
        self.allow_privileged = allow_privileged
        self.sysctls = sysctls
        self.apparmor_host = apparmor_host
        """Why the host cannot enforce AppArmor (None: it can)."""

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        if not self.allow_privileged:
            regular = {c.name for c in pod.spec.containers}
            for c in pod.all_containers():
                if is_privileged(c):
                    kind = "container" if c.name in regular else "init container"
                    return Result.reject(FORBIDDEN,
                                         f'pod with UID "{pod.uid}" specified privileged {kind}, but is disallowed')
        sc = pod.spec.security_context
        for sysctl in sc.sysctls if sc else []:
            problem = self.sysctls.check(sysctl.name, pod.spec.host_network, pod.spec.host_ipc)
            if problem:
                return Result.reject(SYSCTL_FORBIDDEN, f"forbidden sysctl: {problem}")
        problem = apparmor_problem(pod, self.apparmor_host)
        if problem:
            return Result.reject(APPARMOR, f"Cannot enforce AppArmor: {problem}")
        return Result.ok()


class PodSecurityConfig(PluginConfig):
    allow_privileged: bool = True
    """Whether pods may run privileged containers (the kubelet's old --allow-privileged); a
    privileged pod on a node that disallows them is rejected at admission (reason Forbidden)."""


def plugin(config: PodSecurityConfig, handle: AgentHandle) -> PodSecurity:
    """allowPrivileged is this plugin's own; the unsafe sysctls are the kubelet's
    allowedUnsafeSysctls."""
    return PodSecurity(config.allow_privileged, SysctlAllowlist(handle.settings.unsafe_sysctls), apparmor_host_error())


plugin.stage_class = PodSecurity  # type: ignore[attr-defined]
plugin.config_model = PodSecurityConfig  # type: ignore[attr-defined]
