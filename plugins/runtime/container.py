"""ContainerConfig from a pod's container, as the kubelet builds it (kuberuntime_container.go
generateContainerConfig, kubelet_pods.go GenerateRunContainerOptions).

The pieces live in their own modules: env.py (environment, ``$(VAR)`` expansion, downward API),
resources.py (CPU, memory, OOM score), security.py (security contexts), hosts.py (/etc/hosts).
Mounts, devices and extra env that prepare stages (volumes, devices) contribute arrive in
``additions``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cri import types as t
from nodeagent import hostpaths
from nodeagent import labels as L
from nodeagent.additions import ContainerAdditions
from nodeagent.errors import Retryable
from nodeagent.kube.env import FieldError, PodFacts, container_env, expand_command
from nodeagent.kube.resources import (
    CPU_PERIOD_US,
    MIN_QUOTA_US,
    MIN_SHARES,
    linux_resources,
)
from nodeagent.kubeletconfig.node import NodeConfig
from nodeagent.model import Container, Pod
from nodeagent.stages import NodeInfo, PodContext
from plugins.runtime import hosts, security, seen

__all__ = ["CPU_PERIOD_US", "MIN_QUOTA_US", "MIN_SHARES", "ContainerConfigError", "container_config",
           "container_hash", "linux_resources", "pod_facts", "runtime_inputs"]

DEFAULT_CLUSTER_DOMAIN = "cluster.local"
PATH_MAX = 4096  # Linux's, the terminating NUL included


class ContainerConfigError(Retryable):
    """The container cannot be configured as the spec asks (runAsNonRoot with a root image, a
    downward-API reference that cannot be resolved). The kubelet shows the container waiting
    with this reason and tries again on the next sync; so does the runtime stage."""

    reason = "CreateContainerConfigError"


def container_hash(container: Container) -> str:
    """A stable hash of what the kubelet hashes (name and image since 1.31). Python cannot
    reproduce Go's DeepHashObject; only our own consistency matters (kubelet.md section 12)."""
    blob = json.dumps({"name": container.name, "image": container.image}, sort_keys=True).encode()
    return format(int.from_bytes(hashlib.sha256(blob).digest()[:4], "big"), "x")


def pod_facts(pod: Pod, pod_ip: str = "", pod_ips: Sequence[str] = (), node: NodeInfo | None = None) -> PodFacts:
    ips = list(pod_ips) or ([pod_ip] if pod_ip else [])
    host_ips = [node.ip] if node is not None and node.ip else []
    if pod.spec.host_network and not ips:
        ips = host_ips  # the runtime reports no IP for a host-network sandbox; the pod has the node's
    return PodFacts(pod_ips=tuple(ips), host_ips=tuple(host_ips),
                    allocatable=dict(node.allocatable) if node is not None else {})


async def runtime_inputs(ctx: PodContext, sandbox_id: str, image_ref: str) -> dict[str, Any]:
    """The keyword inputs of :func:`container_config` that come from the runtime and the agent:
    the sandbox's IPs (PodSandboxStatus) and the image's user (ImageStatus), each read once
    (plugins/runtime/seen.py)."""
    ips = await seen.sandbox_ips(ctx, sandbox_id)
    image = await seen.image(ctx, image_ref) if image_ref else None
    return {"pod_ips": list(ips), "node": ctx.node, "image": image, "settings": ctx.settings}


def _hosts_mount(pod: Pod, facts: PodFacts, settings: NodeConfig | None,
                 mounts: Sequence[t.Mount]) -> t.Mount | None:
    """makeHostsMount: the kubelet-managed /etc/hosts, unless the container mounts its own."""
    if settings is None or any(m.container_path == hosts.ETC_HOSTS for m in mounts):
        return None
    root_dir = settings.root_dir
    content = hosts.hosts_content(pod, facts.pod_ips, settings.cluster_domain)
    if content is None:
        return None
    path = hostpaths.etc_hosts(hostpaths.pod_dir(Path(root_dir), pod.uid))
    try:
        hosts.ensure_hosts_file(path, content)
    except OSError as exc:
        raise ContainerConfigError(f"cannot write the pod's hosts file {path}: {exc.strerror}") from None
    return t.Mount(container_path=hosts.ETC_HOSTS, host_path=str(path))


def container_config(pod: Pod, container: Container, attempt: int, image_ref: str, node_name: str,
                     container_type: str = "container",
                     additions: ContainerAdditions | None = None, *,
                     pod_ip: str = "", pod_ips: Sequence[str] = (), node: NodeInfo | None = None,
                     image: t.Image | None = None, settings: NodeConfig | None = None,
                     userns: t.UserNamespace | None = None) -> t.ContainerConfig:
    """Build the CRI config of one container instance.

    Keyword inputs the kubelet also uses, each optional so that callers without them still get
    a valid config: ``pod_ip``/``pod_ips`` (the sandbox's, for status.podIP and /etc/hosts),
    ``node`` (status.hostIP, allocatable as the default resource limits), ``image`` (CRI
    ImageStatus of ``image_ref``: the image user for runAsNonRoot), ``settings`` (the agent's
    configuration: rootDir for /etc/hosts, clusterDomain, seccompDefault), ``userns`` (the
    sandbox's user namespace options: a container joins the pod's).

    Raises :class:`ContainerConfigError` when the spec cannot be honoured.
    """
    extra = additions or ContainerAdditions()
    facts = pod_facts(pod, pod_ip, pod_ips, node)
    user = security.ImageUser.of(image) if image is not None else None
    try:
        security.verify_run_as_non_root(pod, container, user)
        env = {**extra.envs, **container_env(pod, container, facts, extra.api_env)}
    except (security.NonRootError, FieldError) as exc:
        raise ContainerConfigError(str(exc)) from None
    # Command and args expand against the final environment; an empty command or args leaves
    # the image's ENTRYPOINT or CMD in place (the runtime merges them, as for the kubelet).
    command, args = expand_command(container, env)
    name_bytes = len(command[0].encode()) if command else 0
    if name_bytes >= PATH_MAX:
        # execve refuses such a name (ENAMETOOLONG), so no runtime could start it, and
        # containerd 2.4 never answers the StartContainer of one of 100 kB: the pod would hold
        # its worker for the whole runtimeRequestTimeout on every attempt.
        raise ContainerConfigError(f"the command's executable name is {name_bytes} bytes long: "
                                   f"a file name has fewer than {PATH_MAX} (PATH_MAX), so it cannot be started")
    mounts = list(extra.mounts)
    etc_hosts = _hosts_mount(pod, facts, settings, mounts)
    if etc_hosts is not None:
        mounts.append(etc_hosts)
    if userns is not None and userns.uids:
        # The kubelet asks for every mount to be idmapped with the pod's mappings (the runtime
        # makes the idmapped mounts): files the pod's root writes are root's on the host too.
        mounts = [dataclasses.replace(m, uid_mappings=list(userns.uids), gid_mappings=list(userns.gids))
                  for m in mounts]

    annotations = {
        L.CONTAINER_HASH: container_hash(container),
        L.CONTAINER_RESTART_COUNT: str(attempt),
        L.CONTAINER_TERMINATION_MESSAGE_PATH: container.termination_message_path,
        L.CONTAINER_TERMINATION_MESSAGE_POLICY: container.termination_message_policy,
        L.POD_TERMINATION_GRACE_PERIOD: str(pod.spec.termination_grace_period_seconds),
        L.CONTAINER_TYPE: container_type,
    }
    if pod.metadata.deletion_grace_period_seconds is not None:
        annotations[L.POD_DELETION_GRACE_PERIOD] = str(pod.metadata.deletion_grace_period_seconds)
    if container.ports:
        annotations[L.CONTAINER_PORTS] = json.dumps(
            [p.model_dump(by_alias=True, exclude_defaults=True) for p in container.ports]
        )
    return t.ContainerConfig(
        metadata=t.ContainerMetadata(name=container.name, attempt=attempt),
        image=t.ImageSpec(image=image_ref or container.image, user_specified_image=container.image),
        command=command,
        args=args,
        working_dir=container.working_dir,
        envs=env,
        mounts=mounts,
        devices=list(extra.devices),
        cdi_devices=list(extra.cdi_devices),
        labels={
            L.POD_NAME: pod.metadata.name,
            L.POD_NAMESPACE: pod.metadata.namespace,
            L.POD_UID: pod.uid,
            L.CONTAINER_NAME: container.name,
            L.MANAGED_BY: node_name,
        },
        annotations={**extra.annotations, **annotations},
        log_path=hostpaths.container_log_path(container.name, attempt),
        stdin=container.stdin,
        stdin_once=container.stdin_once,
        tty=container.tty,
        linux=t.LinuxContainerConfig(
            resources=linux_resources(container, pod),
            security_context=security.container_security(
                pod, container, user, root_dir=settings.root_dir if settings is not None else None,
                seccomp_default=bool(settings is not None and settings.seccomp_default), userns=userns),
        ),
    )
