"""ContainerConfig from a pod's container, as the kubelet builds it (kuberuntime_container.go)."""

from __future__ import annotations

import hashlib
import json
import math

from cri import types as t
from nodeagent import labels as L
from nodeagent import quantity
from nodeagent.additions import ContainerAdditions
from nodeagent.model import Container, Pod

# The kubelet's CPU conversion (pkg/kubelet/cm/helpers_linux.go).
CPU_PERIOD_US = 100_000
MIN_SHARES = 2
MIN_QUOTA_US = 1000


def container_hash(container: Container) -> str:
    """A stable hash of what the kubelet hashes (name and image since 1.31). Python cannot
    reproduce Go's DeepHashObject; only our own consistency matters (kubelet.md section 12)."""
    blob = json.dumps({"name": container.name, "image": container.image}, sort_keys=True).encode()
    return format(int.from_bytes(hashlib.sha256(blob).digest()[:4], "big"), "x")


def linux_resources(container: Container) -> t.LinuxContainerResources:
    req, lim = container.resources.requests, container.resources.limits
    cpu_request = req.get("cpu", lim.get("cpu"))
    shares = MIN_SHARES
    if cpu_request is not None:
        shares = max(MIN_SHARES, quantity.milli_cpu(cpu_request) * 1024 // 1000)
    quota = 0
    if "cpu" in lim:
        quota = max(MIN_QUOTA_US, math.ceil(quantity.milli_cpu(lim["cpu"]) * CPU_PERIOD_US / 1000))
    memory = quantity.bytes_(lim["memory"]) if "memory" in lim else 0
    return t.LinuxContainerResources(
        cpu_period=CPU_PERIOD_US if quota else 0,
        cpu_quota=quota,
        cpu_shares=shares,
        memory_limit_in_bytes=memory,
    )


def container_config(pod: Pod, container: Container, attempt: int, image_ref: str, node_name: str,
                     container_type: str = "container",
                     additions: ContainerAdditions | None = None) -> t.ContainerConfig:
    extra = additions or ContainerAdditions()
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
        command=list(container.command),
        args=list(container.args),
        working_dir=container.working_dir,
        envs={**extra.envs, **{e.name: e.value for e in container.env}},
        mounts=list(extra.mounts),
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
        log_path=f"{container.name}/{attempt}.log",
        stdin=container.stdin,
        stdin_once=container.stdin_once,
        tty=container.tty,
        linux=t.LinuxContainerConfig(
            resources=linux_resources(container),
            # Unset, the runtime would put the container in the pod's PID namespace (POD = 0).
            security_context=t.LinuxContainerSecurityContext(
                namespace_options=t.NamespaceOption(network=t.NamespaceMode.POD, pid=t.NamespaceMode.CONTAINER,
                                                    ipc=t.NamespaceMode.POD)),
        ),
    )
