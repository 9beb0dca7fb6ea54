"""test/e2e_node/pod_hostnamefqdn_test.go: ``[sig-node] Hostname of Pod [NodeConformance]``.

Every case is TestContainerOutput on pod ``hostfqdn-<n>`` (n < 214748) with container
``test-container`` running ``echo $(hostname)';'$(hostname -f)';'`` (restartPolicy Never).
``hostname -f`` resolves through the agent-managed /etc/hosts.
"""

from __future__ import annotations

import random
from typing import Any

from conformance.standalone.framework import BUSYBOX, POD_START, Framework, case

FILE = "test/e2e_node/pod_hostnamefqdn_test.go"
PREFIX = "[sig-node] Hostname of Pod [NodeConformance]"
FRAMEWORK = "hostfqdn"
COMMAND = ["sh", "-c", "echo $(hostname)';'$(hostname -f)';'"]
CLUSTER_DOMAIN = "cluster.local"  # framework.TestContext.ClusterDNSDomain; the agent's clusterDomain default


def hostname_pod(**spec: Any) -> dict[str, Any]:
    """testPod("hostfqdn") with the command every case sets."""
    pod_name = f"hostfqdn-{random.randrange(214748)}"
    return {"metadata": {"name": pod_name, "labels": {"name": pod_name}, "annotations": {}}, "spec": {
        "containers": [{"name": "test-container", "image": BUSYBOX, "command": COMMAND}],
        "restartPolicy": "Never", **spec,
    }}


def fqdn(f: Framework, pod: dict[str, Any], subdomain: str) -> str:
    return f"{f.pod_name(pod['metadata']['name'])}.{subdomain}.{f.namespace}.svc.{CLUSTER_DOMAIN}"


@case(f"{PREFIX} a pod with subdomain field has FQDN, hostname is shortname",
      key="FQ3", number="35", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def subdomain_fqdn(f: Framework) -> None:
    """Mirrors "a pod with subdomain field has FQDN, hostname is shortname": subdomain ``t``;
    ``hostname`` is the pod name and ``hostname -f`` is ``<pod>.t.<ns>.svc.cluster.local``.
    Port: the pod name is the static pod's (``<manifest name>-<node>``)."""
    pod = hostname_pod(subdomain="t")
    short = f.pod_name(pod["metadata"]["name"])
    await f.container_output(pod, 0, [f"{short};{fqdn(f, pod, 't')};"])


@case(f"{PREFIX} a pod without subdomain field does not have FQDN",
      key="FQ1", number="35a", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def no_subdomain(f: Framework) -> None:
    """Mirrors "a pod without subdomain field does not have FQDN": both commands print the pod
    name. Port: the pod name is the static pod's."""
    pod = hostname_pod()
    short = f.pod_name(pod["metadata"]["name"])
    await f.container_output(pod, 0, [f"{short};{short};"])


@case(f"{PREFIX} a pod without FQDN is not affected by SetHostnameAsFQDN field",
      key="FQ2", number="35b", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def set_hostname_as_fqdn_without_subdomain(f: Framework) -> None:
    """Mirrors "a pod without FQDN is not affected by SetHostnameAsFQDN field":
    setHostnameAsFQDN true without a subdomain changes nothing. Port: the pod name is the static
    pod's."""
    pod = hostname_pod(setHostnameAsFQDN=True)
    short = f.pod_name(pod["metadata"]["name"])
    await f.container_output(pod, 0, [f"{short};{short};"])


@case(f"{PREFIX} a pod with subdomain field has FQDN, when setHostnameAsFQDN is set to true, the FQDN is set as "
      "hostname",
      key="FQ4", number="35c", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def hostname_is_fqdn(f: Framework) -> None:
    """Mirrors "... when setHostnameAsFQDN is set to true, the FQDN is set as hostname": the
    UTS hostname is the FQDN, so both commands print it (the test first requires the FQDN to be
    shorter than 65 bytes). Port: the pod name is the static pod's; the node name is kept short
    so the FQDN still fits."""
    pod = hostname_pod(subdomain="t", setHostnameAsFQDN=True)
    host = fqdn(f, pod, "t")
    if len(host) >= 65:
        raise AssertionError(f"The FQDN of the Pod cannot be longer than 64 characters, requested {host} which is "
                             f"{len(host)} characters long.")
    await f.container_output(pod, 0, [f"{host};{host};"])
