"""Pod and container security contexts to CRI, the kubelet's way (pkg/securitycontext,
kuberuntime/security_context*.go, kuberuntime_sandbox.go, util/namespaces).

The container's own securityContext wins field by field over the pod's; the pod's adds what
only it has (supplemental groups, fsGroup, sysctls, namespaces).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cri import types as t
from nodeagent import hostpaths
from nodeagent.kube.security import is_privileged, normalize_sysctl
from nodeagent.model import Container, Pod, SecurityContext, SecurityProfile

# securitycontext/util.go: what a non-privileged container cannot see or change in /proc and
# /sys unless procMount is Unmasked.
DEFAULT_MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


class NonRootError(ValueError):
    """runAsNonRoot cannot be honoured: the kubelet's CreateContainerConfigError."""


@dataclass(frozen=True)
class ImageUser:
    """The image's USER as CRI ImageStatus reports it: a numeric uid, or a name."""

    uid: int | None = None
    username: str = ""

    @staticmethod
    def of(image: t.Image) -> ImageUser:
        # getImageUser: an image that states no user runs as root.
        if image.uid is not None:
            return ImageUser(uid=image.uid)
        if image.username:
            return ImageUser(username=image.username)
        return ImageUser(uid=0)


def effective(pod: Pod, container: Container) -> SecurityContext:
    """DetermineEffectiveSecurityContext: pod-level run-as settings under the container's."""
    own = container.security_context or SecurityContext()
    pod_sc = pod.spec.security_context
    if pod_sc is None:
        return own
    inherited = {
        "run_as_user": pod_sc.run_as_user,
        "run_as_group": pod_sc.run_as_group,
        "run_as_non_root": pod_sc.run_as_non_root,
    }
    return own.model_copy(update={k: v for k, v in inherited.items() if getattr(own, k) is None and v is not None})


def verify_run_as_non_root(pod: Pod, container: Container, user: ImageUser | None) -> None:
    """verifyRunAsNonRoot, with the kubelet's messages. An unknown image user counts as root,
    as the kubelet counts an image whose status says nothing."""
    user = user or ImageUser(uid=0)
    sc = effective(pod, container)
    if not sc.run_as_non_root:
        return
    who = f"pod: \"{pod.metadata.name}_{pod.metadata.namespace}({pod.uid})\", container: {container.name}"
    if sc.run_as_user is not None:
        if sc.run_as_user == 0:
            raise NonRootError(f"container's runAsUser breaks non-root policy ({who})")
        return
    if user.uid == 0:
        raise NonRootError(f"container has runAsNonRoot and image will run as root ({who})")
    if user.uid is None and user.username:
        raise NonRootError(f"container has runAsNonRoot and image has non-numeric user ({user.username}), "
                           f"cannot verify user is non-root ({who})")


def _seccomp(profile: SecurityProfile | None, root: Path | None, default_runtime: bool) -> t.SecurityProfile:
    """fieldSeccompProfile: Localhost profiles live under ``<rootDir>/seccomp``."""
    if profile is None:
        kind = t.ProfileType.RuntimeDefault if default_runtime else t.ProfileType.Unconfined
        return t.SecurityProfile(profile_type=kind)
    if profile.type == "RuntimeDefault":
        return t.SecurityProfile(profile_type=t.ProfileType.RuntimeDefault)
    if profile.type == "Localhost":
        ref = str(hostpaths.seccomp_profile(root or Path("/"), profile.localhost_profile or ""))
        return t.SecurityProfile(profile_type=t.ProfileType.Localhost, localhost_ref=ref)
    return t.SecurityProfile(profile_type=t.ProfileType.Unconfined)


def seccomp_for(pod: Pod, container: Container | None, root: Path | None, default_runtime: bool) -> t.SecurityProfile:
    """getSeccompProfile: the container's profile, else the pod's, else RuntimeDefault when
    the node's seccompDefault is on, else Unconfined."""
    own = container.security_context.seccomp_profile if container and container.security_context else None
    pod_level = pod.spec.security_context.seccomp_profile if pod.spec.security_context else None
    return _seccomp(own or pod_level, root, default_runtime)


def apparmor_for(pod: Pod, container: Container) -> tuple[t.SecurityProfile | None, str]:
    """getAppArmorProfile: the structured profile and the deprecated string form that
    containerd 1.6 reads. Nothing set: nothing sent, the runtime's default applies."""
    own = container.security_context.app_armor_profile if container.security_context else None
    pod_level = pod.spec.security_context.app_armor_profile if pod.spec.security_context else None
    profile = own or pod_level
    if profile is None:
        return None, ""
    if profile.type == "RuntimeDefault":
        return t.SecurityProfile(profile_type=t.ProfileType.RuntimeDefault), "runtime/default"
    if profile.type == "Localhost":
        name = profile.localhost_profile or ""
        return t.SecurityProfile(profile_type=t.ProfileType.Localhost, localhost_ref=name), f"localhost/{name}"
    return t.SecurityProfile(profile_type=t.ProfileType.Unconfined), "unconfined"


def namespace_options(pod: Pod, userns: t.UserNamespace | None = None) -> t.NamespaceOption:
    """NamespacesForPod: host namespaces when asked, one PID namespace for the pod when it
    shares its process namespace, else one per container; the pod's user namespace
    (plugins/runtime/userns.py) for the sandbox and each container alike."""
    spec = pod.spec
    if spec.host_pid:
        pid = t.NamespaceMode.NODE
    elif spec.share_process_namespace:
        pid = t.NamespaceMode.POD
    else:
        pid = t.NamespaceMode.CONTAINER
    return t.NamespaceOption(
        network=t.NamespaceMode.NODE if spec.host_network else t.NamespaceMode.POD,
        pid=pid,
        ipc=t.NamespaceMode.NODE if spec.host_ipc else t.NamespaceMode.POD,
        userns_options=userns,
    )


def supplemental_groups(pod: Pod) -> list[int]:
    """fsGroup first, then supplementalGroups."""
    sc = pod.spec.security_context
    if sc is None:
        return []
    return ([sc.fs_group] if sc.fs_group is not None else []) + list(sc.supplemental_groups)


def container_security(pod: Pod, container: Container, user: ImageUser | None, *, root_dir: Path | None = None,
                       seccomp_default: bool = False,
                       userns: t.UserNamespace | None = None) -> t.LinuxContainerSecurityContext:
    """determineEffectiveSecurityContext: what CRI gets for one container."""
    sc = effective(pod, container)
    caps = None
    if sc.capabilities is not None:
        caps = t.Capability(add_capabilities=list(sc.capabilities.add), drop_capabilities=list(sc.capabilities.drop))
    apparmor, apparmor_name = apparmor_for(pod, container)
    seccomp = seccomp_for(pod, container, root_dir, seccomp_default)
    unmasked = sc.proc_mount == "Unmasked"
    run_as_user = sc.run_as_user
    run_as_username = ""
    if run_as_user is None and user is not None:
        # The kubelet passes the image's user on: a numeric one as run_as_user. Unknown: the
        # runtime applies the image's USER itself.
        run_as_user, run_as_username = user.uid, user.username
    return t.LinuxContainerSecurityContext(
        capabilities=caps,
        privileged=bool(sc.privileged),
        namespace_options=namespace_options(pod, userns),
        run_as_user=run_as_user,
        run_as_group=sc.run_as_group,
        run_as_username=run_as_username if run_as_user is None else "",
        readonly_rootfs=bool(sc.read_only_root_filesystem),
        supplemental_groups=supplemental_groups(pod),
        # AddNoNewPrivileges: only an explicit allowPrivilegeEscalation: false sets it.
        no_new_privs=sc.allow_privilege_escalation is False,
        masked_paths=[] if unmasked else list(DEFAULT_MASKED_PATHS),
        readonly_paths=[] if unmasked else list(DEFAULT_READONLY_PATHS),
        seccomp=seccomp,
        seccomp_profile_path=_legacy_seccomp(seccomp),
        apparmor=apparmor,
        apparmor_profile=apparmor_name,
    )


def _legacy_seccomp(profile: t.SecurityProfile) -> str:
    """The deprecated string form, for runtimes that predate the structured field."""
    if profile.profile_type == t.ProfileType.RuntimeDefault:
        return "runtime/default"
    if profile.profile_type == t.ProfileType.Localhost:
        return "localhost/" + profile.localhost_ref
    return "unconfined"


def sandbox_security(pod: Pod, *, root_dir: Path | None = None, seccomp_default: bool = False,
                     userns: t.UserNamespace | None = None) -> t.LinuxSandboxSecurityContext:
    """The sandbox's: namespaces, pod-level run-as and groups, privileged when any container
    is (the pause container must be able to host it)."""
    sc = pod.spec.security_context
    # The kubelet sends RuntimeDefault for the sandbox unless the pod names a profile.
    seccomp = seccomp_for(pod, None, root_dir, True) if sc and sc.seccomp_profile else \
        t.SecurityProfile(profile_type=t.ProfileType.RuntimeDefault)
    return t.LinuxSandboxSecurityContext(
        namespace_options=namespace_options(pod, userns),
        run_as_user=sc.run_as_user if sc else None,
        run_as_group=sc.run_as_group if sc else None,
        supplemental_groups=supplemental_groups(pod),
        privileged=any(is_privileged(c) for c in pod.all_containers()),
        seccomp=seccomp,
    )


def sysctls(pod: Pod) -> dict[str, str]:
    sc = pod.spec.security_context
    return {normalize_sysctl(s.name): s.value for s in sc.sysctls} if sc else {}
