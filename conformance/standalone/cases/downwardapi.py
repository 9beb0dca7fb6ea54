"""test/e2e/common/node/downwardapi.go: ``[sig-node] Downward API`` (environment variables).

Every case is TestContainerOutputRegexp on pod ``downward-api-<uuid>`` with container
``dapi-container`` running ``sh -c env`` (restartPolicy Never); ``testDownwardAPI`` adds
requests cpu 250m / memory 32Mi and limits cpu 1250m / memory 64Mi.
"""

from __future__ import annotations

import uuid
from typing import Any

from conformance.standalone.framework import BUSYBOX, POD_START, Framework, case

FILE = "test/e2e/common/node/downwardapi.go"
PREFIX = "[sig-node] Downward API"
FRAMEWORK = "downward-api"
# e2enetwork.RegexIPv4 / RegexIPv6.
REGEX_IPV4 = r"(?:\d+)\.(?:\d+)\.(?:\d+)\.(?:\d+)"
REGEX_IPV6 = r"(?:(?:(?:[0-9a-fA-F]{1,4}:){7}(?:[0-9a-fA-F]{1,4}|:))|(?:(?:[0-9a-fA-F]{1,4}:){1,7}:))"
RESOURCES = {"requests": {"cpu": "250m", "memory": "32Mi"}, "limits": {"cpu": "1250m", "memory": "64Mi"}}


def field_ref(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def resource_ref(name: str, resource: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"resourceFieldRef": {"resource": resource}}}


def downward_pod(pod_name: str, env: list[dict[str, Any]], resources: dict[str, Any] | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "dapi-container", "image": BUSYBOX, "command": ["sh", "-c", "env"], "env": env}
    if resources is not None:
        container["resources"] = resources
    return {"metadata": {"name": pod_name, "labels": {"name": pod_name}},
            "spec": {"containers": [container], "restartPolicy": "Never"}}


@case(f"{PREFIX} should provide pod name, namespace and IP address as env vars [NodeConformance] [Conformance]",
      key="D1", number="21", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def name_namespace_ip(f: Framework) -> None:
    """Mirrors downwardapi.go "should provide pod name, namespace and IP address as env vars":
    fieldRefs metadata.name, metadata.namespace and status.podIP; the output must match
    ``POD_NAME=<pod>``, ``POD_NAMESPACE=<ns>`` and an IPv4 or IPv6 ``POD_IP``. Port: the pod's
    name is the static pod's name, ``<manifest name>-<node>``."""
    pod_name = f"downward-api-{uuid.uuid4()}"
    env = [field_ref("POD_NAME", "metadata.name"), field_ref("POD_NAMESPACE", "metadata.namespace"),
           field_ref("POD_IP", "status.podIP")]
    await f.container_output(downward_pod(pod_name, env, RESOURCES), 0, [
        f"POD_NAME={f.pod_name(pod_name)}", f"POD_NAMESPACE={f.namespace}", f"POD_IP={REGEX_IPV4}|{REGEX_IPV6}",
    ], regexp=True)


@case(f"{PREFIX} should provide container's limits.cpu/memory and requests.cpu/memory as env vars "
      "[NodeConformance] [Conformance]",
      key="D4", number="22", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def limits_and_requests(f: Framework) -> None:
    """Mirrors downwardapi.go "should provide container's limits.cpu/memory and
    requests.cpu/memory as env vars": resourceFieldRefs with divisor 1 round up, so 1250m -> 2,
    64Mi -> 67108864, 250m -> 1, 32Mi -> 33554432. Port: as upstream."""
    pod_name = f"downward-api-{uuid.uuid4()}"
    env = [resource_ref("CPU_LIMIT", "limits.cpu"), resource_ref("MEMORY_LIMIT", "limits.memory"),
           resource_ref("CPU_REQUEST", "requests.cpu"), resource_ref("MEMORY_REQUEST", "requests.memory")]
    await f.container_output(downward_pod(pod_name, env, RESOURCES), 0, [
        "CPU_LIMIT=2", "MEMORY_LIMIT=67108864", "CPU_REQUEST=1", "MEMORY_REQUEST=33554432",
    ], regexp=True)


@case(f"{PREFIX} should provide host IP as an env var [NodeConformance] [Conformance]",
      key="D2", number="23", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def host_ip(f: Framework) -> None:
    """Mirrors downwardapi.go "should provide host IP as an env var": fieldRef status.hostIP
    must give an IPv4 or IPv6 ``HOST_IP``. Port: the host IP is the agent's nodeIP setting."""
    pod_name = f"downward-api-{uuid.uuid4()}"
    await f.container_output(downward_pod(pod_name, [field_ref("HOST_IP", "status.hostIP")], RESOURCES), 0, [
        f"HOST_IP={REGEX_IPV4}|{REGEX_IPV6}",
    ], regexp=True)


@case(f"{PREFIX} should provide default limits.cpu/memory from node allocatable [NodeConformance] [Conformance]",
      key="D5", number="24", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def default_limits_from_allocatable(f: Framework) -> None:
    """Mirrors downwardapi.go "should provide default limits.cpu/memory from node allocatable":
    no resources, so limits.cpu and limits.memory fall back to the node's allocatable
    (``CPU_LIMIT=[1-9]``, ``MEMORY_LIMIT=[1-9]``). Port: allocatable is the agent's own."""
    pod_name = f"downward-api-{uuid.uuid4()}"
    env = [resource_ref("CPU_LIMIT", "limits.cpu"), resource_ref("MEMORY_LIMIT", "limits.memory")]
    await f.container_output(downward_pod(pod_name, env, None), 0, ["CPU_LIMIT=[1-9]", "MEMORY_LIMIT=[1-9]"],
                             regexp=True)
