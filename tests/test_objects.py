"""The object store (issue 14 §1): views kept current by list and watch with the node's
credentials, reads by name through a cache, the writes stages make, versions found by
discovery, and the standalone backend from manifests — against the real API server."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from nodeagent.apiclient import make_api_client
from nodeagent.clock import ManualClock
from nodeagent.objects import ADDED, DELETED, MODIFIED, ApiObjects, FileObjects, ObjectError
from nodeagent.objects import kinds as k

pytestmark = pytest.mark.anyio


async def _kubectl(cp: Any, *args: str, input: str | None = None) -> str:
    return str((await anyio.to_thread.run_sync(lambda: cp.kubectl(*args, input=input))).stdout)


async def test_a_view_follows_the_api_and_a_get_is_cached(control_plane: Any, tmp_path: Path) -> None:
    node = f"obj{uuid.uuid4().hex[:6]}"
    ns = f"objects-{uuid.uuid4().hex[:6]}"
    await _kubectl(control_plane, "create", "namespace", ns)
    # The pod created below needs the namespace's default ServiceAccount (a miss seen with two
    # test workers, the controller-manager busy).
    await anyio.to_thread.run_sync(control_plane.wait_namespace_ready, ns)
    api = make_api_client(await anyio.to_thread.run_sync(control_plane.node_kubeconfig, node))
    clock = ManualClock()
    store = ApiObjects(api, clock)
    changes: list[tuple[str, str]] = []
    try:
        services = store.view(k.SERVICE, namespace=ns)  # before run: started when the store runs
        services.on_change(lambda change, old, new: changes.append((change, ((new or old) or {})["metadata"]["name"])))
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            assert await services.wait_synced(20) and len(services) == 0
            svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
                   "spec": {"ports": [{"port": 80}]}}
            await _kubectl(control_plane, "create", "-f", "-", input=json.dumps(svc))
            seen = await services.changed(services.generation, timeout=20)
            assert services.get("web") is not None and seen == services.generation
            await _kubectl(control_plane, "-n", ns, "label", "service", "web", "tier=front")
            while (services.get("web") or {}).get("metadata", {}).get("labels", {}).get("tier") != "front":
                await services.changed(services.generation, timeout=20)
            await _kubectl(control_plane, "-n", ns, "delete", "service", "web")
            while services.get("web") is not None:
                await services.changed(services.generation, timeout=20)
            assert changes == [(ADDED, "web"), (MODIFIED, "web"), (DELETED, "web")]

            # A view made while the store runs starts at once; the node's own Node by field.
            nodes = store.view(k.NODE, fields={"metadata.name": node})
            assert await nodes.wait_synced(20) and nodes.items() == []

            # A read by name, as the node reads what its pods use (the Node authorizer relates a
            # pod bound to the node to the configMaps it names): cached, a missing object
            # remembered for a shorter time.
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "user", "namespace": ns},
                   "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
                            "volumes": [{"name": "a", "configMap": {"name": "absent"}},
                                        {"name": "p", "configMap": {"name": "present"}}]}}
            await _kubectl(control_plane, "create", "-f", "-", input=json.dumps(pod))
            await _kubectl(control_plane, "-n", ns, "create", "configmap", "present", "--from-literal=k=v")
            with anyio.fail_after(20):
                while True:  # the authorizer's graph follows the pod within moments
                    try:
                        present = await store.get(k.CONFIG_MAP, "present", ns, max_age=0)
                        break
                    except ObjectError:
                        await anyio.sleep(0.2)
            assert present is not None and present["data"] == {"k": "v"}
            assert await store.get(k.CONFIG_MAP, "absent", ns) is None
            sent = store.requests
            assert await store.get(k.CONFIG_MAP, "absent", ns) is None and store.requests == sent
            clock.advance(6)
            assert await store.get(k.CONFIG_MAP, "absent", ns) is None and store.requests == sent + 1
            # The node's credentials: a configMap no pod of this node uses is forbidden.
            await _kubectl(control_plane, "-n", ns, "create", "configmap", "other", "--from-literal=a=b")
            with pytest.raises(ObjectError) as refused:
                await store.get(k.CONFIG_MAP, "other", ns)
            assert refused.value.forbidden

            # A group found by discovery: resource.k8s.io serves v1 in 1.37.
            slices = store.view(k.RESOURCE_SLICE, fields={"spec.nodeName": node})
            assert await slices.wait_synced(20), slices.error
            tg.cancel_scope.cancel()
    finally:
        await api.close()
        await _kubectl(control_plane, "delete", "namespace", ns, "--wait=false")


async def test_a_refused_watch_is_reported_in_the_view_and_retried(control_plane: Any) -> None:
    """Nodes may not list secrets: the view stays unsynced with the 403 in its error."""
    api = make_api_client(await anyio.to_thread.run_sync(control_plane.node_kubeconfig, "objrefused"))
    store = ApiObjects(api)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            secrets = store.view(k.SECRET, namespace="default")
            with anyio.fail_after(20):
                while not secrets.error:
                    await anyio.sleep(0.05)
            assert secrets.error.startswith("403") and not secrets.synced
            store.release(secrets)
            tg.cancel_scope.cancel()
    finally:
        await api.close()


async def test_standalone_views_come_from_manifests() -> None:
    store = FileObjects()
    claims = store.view(k.RESOURCE_CLAIM, namespace="default")
    assert claims.synced and len(claims) == 0
    assert store.kind_of("resource.k8s.io/v1", "ResourceClaim") is k.RESOURCE_CLAIM
    assert store.kind_of("resource.k8s.io/v9", "ResourceClaim") is None
    assert store.kind_of("apps/v1", "Deployment") is None
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu"}}
    store.replace(k.RESOURCE_CLAIM, [claim])
    assert claims.get("gpu") is not None, "namespace defaulted, the view updated"
    assert await store.get(k.RESOURCE_CLAIM, "gpu", "default") is not None
    rc = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "crun"}, "handler": "crun"}
    store.replace(k.RUNTIME_CLASS, [rc])
    assert store.view(k.RUNTIME_CLASS).get("crun") == rc
    with pytest.raises(ObjectError):
        await store.delete(k.RESOURCE_SLICE, "x")
