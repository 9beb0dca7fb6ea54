"""Host paths built from pod data: the one place that turns names into path components.

A pod's UID, name and namespace, its container and volume names reach host paths — the pod
directory ``<rootDir>/pods/<uid>``, its volume, container and subPath directories, the log
directory ``<podLogsDir>/<namespace>_<name>_<uid>``, container log files, the status file,
the pod cgroup, the /var/log/containers links. The API server validates these names (DNS
labels and subdomains, UUIDs); a static manifest is validated by its source; this module is
the defence in depth for every source: a name that would take a path anywhere else is
refused here, whoever built the pod.

* A component must be one non-empty path element: not ``.`` or ``..``, without ``/`` or NUL
  (:class:`UnsafeName` otherwise). The worker refuses such a pod before any stage runs
  (:func:`pod_problem`); the builders refuse again, for data that comes another way (a
  runtime orphan's labels).
* A component longer than a file name may be (255 bytes on ext4, xfs, tmpfs) is hashed: a
  readable prefix, ``~`` and the SHA-256 of the whole name, cut to fit. The same name always
  gives the same component, so every reader and writer agree. The kubelet has no such rule
  (its names are short enough once the API server validated them, except the log directory
  and the status file's, which a 253-character pod name overflows).
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from nodeagent.model import Pod

MAX_NAME_BYTES = 255
"""NAME_MAX of the file systems a node's directories live on."""
HASH_MARK = "~"
PODS = "pods"
CONTAINERS = "containers"
VOLUMES = "volumes"
VOLUME_SUBPATHS = "volume-subpaths"  # the kubelet's containerSubPathDirectoryName
ETC_HOSTS = "etc-hosts"
SECCOMP = "seccomp"
CGROUP_PREFIX = "pod"


class UnsafeName(ValueError):
    """A name from pod data that cannot be a host path component."""


def check(name: str, what: str) -> None:
    """Refuse ``name`` unless it is exactly one path element."""
    if not name:
        raise UnsafeName(f"{what} must not be empty")
    if name in (".", ".."):
        raise UnsafeName(f"{what} {name!r} must not be '.' or '..'")
    if "/" in name or "\0" in name:
        raise UnsafeName(f"{what} {name!r} must not contain '/' or NUL")
    try:
        name.encode()
    except UnicodeEncodeError:
        raise UnsafeName(f"{what} {name!r} is not valid UTF-8") from None


def fit(name: str, suffix: str = "") -> str:
    """``name + suffix`` when it fits in a file name, else a readable prefix of ``name``,
    ``~`` and its digest, then ``suffix``."""
    whole = name + suffix
    if len(whole.encode()) <= MAX_NAME_BYTES:
        return whole
    digest = hashlib.sha256(name.encode()).hexdigest()
    room = MAX_NAME_BYTES - len(suffix.encode()) - len(HASH_MARK) - len(digest)
    prefix = name.encode()[:room].decode(errors="ignore")  # never half a character
    return f"{prefix}{HASH_MARK}{digest}{suffix}"


def component(name: str, what: str, suffix: str = "") -> str:
    check(name, what)
    return fit(name, suffix)


def joined(parts: dict[str, str], suffix: str = "") -> str:
    """Several names in one component (``<namespace>_<name>_<uid>``), each checked."""
    for what, name in parts.items():
        check(name, what)
    return fit("_".join(parts.values()), suffix)


# --- under rootDir ---------------------------------------------------------------------------


def pod_dir(root_dir: Path, uid: str) -> Path:
    """``<rootDir>/pods/<uid>``."""
    return root_dir / PODS / component(uid, "pod uid")


def container_dir(pod_dir: Path, container: str) -> Path:
    """``<pod dir>/containers/<container>``: the termination message files."""
    return pod_dir / CONTAINERS / component(container, "container name")


def volume_dir(pod_dir: Path, plugin: str, volume: str) -> Path:
    """``<pod dir>/volumes/<plugin>/<volume>`` (plugin: ``kubernetes.io~empty-dir``, ...)."""
    return pod_dir / VOLUMES / plugin / component(volume, "volume name")


def volume_subpaths_dir(pod_dir: Path) -> Path:
    return pod_dir / VOLUME_SUBPATHS


def subpath_target(pod_dir: Path, volume: str, container: str, index: int) -> Path:
    """``<pod dir>/volume-subpaths/<volume>/<container>/<index>`` (getSubpathBindTarget): where
    one volumeMount of one container is bind-mounted for the runtime."""
    return (volume_subpaths_dir(pod_dir) / component(volume, "volume name")
            / component(container, "container name") / str(int(index)))


def etc_hosts(pod_dir: Path) -> Path:
    return pod_dir / ETC_HOSTS


def seccomp_profile(root_dir: Path, profile: str) -> Path:
    """``<rootDir>/seccomp/<localhostProfile>``: a relative path that only descends (the API
    server's validateLocalDescendingPath)."""
    if not profile:
        raise UnsafeName("seccomp localhostProfile must not be empty")
    if "\0" in profile:
        raise UnsafeName(f"seccomp localhostProfile {profile!r} must not contain NUL")
    path = PurePosixPath(profile)
    if path.is_absolute():
        raise UnsafeName(f"seccomp localhostProfile {profile!r} must be a relative path")
    if ".." in path.parts:
        raise UnsafeName(f"seccomp localhostProfile {profile!r} must not contain '..'")
    return root_dir / SECCOMP / Path(*(fit(part) for part in path.parts))


def status_file(directory: Path, namespace: str, name: str, uid: str) -> Path:
    """Standalone status: ``<rootDir>/pod-status/<namespace>_<name>_<uid>.json``."""
    return directory / joined({"namespace": namespace, "pod name": name, "pod uid": uid}, ".json")


# --- logs ------------------------------------------------------------------------------------


def pod_log_dir(pod_logs_dir: Path, namespace: str, name: str, uid: str) -> Path:
    """``<podLogsDir>/<namespace>_<name>_<uid>``: the kubelet's BuildPodLogsDirectory."""
    return pod_logs_dir / joined({"namespace": namespace, "pod name": name, "pod uid": uid})


def container_log_dir(pod_log_dir: Path, container: str) -> Path:
    return pod_log_dir / component(container, "container name")


def container_log_path(container: str, attempt: int) -> str:
    """The CRI ``log_path`` of an instance, relative to the sandbox's log directory:
    ``<container>/<restartCount>.log``."""
    return f"{component(container, 'container name')}/{int(attempt)}.log"


def log_symlink_name(pod: str, namespace: str, container: str, container_id: str, suffix: str) -> str:
    """``<pod>_<namespace>_<container>-<containerID><suffix>`` for /var/log/containers, cut (not
    hashed) to a file name as the kubelet's logSymlink cuts it: log shippers parse it."""
    for what, name in (("pod name", pod), ("namespace", namespace), ("container name", container),
                       ("container id", container_id)):
        check(name, what)
    stem = f"{pod}_{namespace}_{container}-{container_id}"
    room = MAX_NAME_BYTES - len(suffix.encode())
    return stem.encode()[:room].decode(errors="ignore") + suffix


# --- cgroups ---------------------------------------------------------------------------------


def pod_cgroup_name(uid: str) -> str:
    """``pod<uid>``: the pod's cgroup directory name."""
    check(uid, "pod uid")
    return fit(CGROUP_PREFIX + uid)


# --- the whole pod, once, before any stage ---------------------------------------------------


def pod_problem(pod: Pod) -> str | None:
    """Why ``pod`` cannot be given host paths, or None. Every name the builders above take from
    a pod is checked here, so that a pod whose names are refused never reaches a stage."""
    meta = pod.metadata
    try:
        check(meta.uid, "metadata.uid")
        check(meta.name, "metadata.name")
        check(meta.namespace, "metadata.namespace")
        for c in (*pod.spec.init_containers, *pod.spec.containers, *pod.spec.ephemeral_containers):
            check(c.name, "container name")
            profile = c.security_context.seccomp_profile if c.security_context else None
            if profile is not None and profile.type == "Localhost":
                seccomp_profile(Path("/"), profile.localhost_profile or "")
        for v in pod.spec.volumes:
            check(v.name, "volume name")
        pod_sc = pod.spec.security_context
        if pod_sc is not None and pod_sc.seccomp_profile is not None and pod_sc.seccomp_profile.type == "Localhost":
            seccomp_profile(Path("/"), pod_sc.seccomp_profile.localhost_profile or "")
    except UnsafeName as exc:
        return str(exc)
    return None


__all__ = ["MAX_NAME_BYTES", "UnsafeName", "check", "component", "container_dir", "container_log_dir",
           "container_log_path", "etc_hosts", "fit", "joined", "log_symlink_name", "pod_cgroup_name", "pod_dir",
           "pod_log_dir", "pod_problem", "seccomp_profile", "status_file", "subpath_target", "volume_dir",
           "volume_subpaths_dir"]
