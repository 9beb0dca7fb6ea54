"""The apivolumes stage: configMaps, secrets and service-account tokens from the real API server
reach env and files of pods running in the real containerd.

The path is the production one: the agent runs with the node's kubeconfig (it registers its
Node, its API pod source watches the pods bound to it, its status sink writes their status);
each test creates pods with kubectl (admin) bound to the node (``spec.nodeName``), so every read
of the stage passes the Node authorizer and NodeRestriction as the node itself.
"""

from __future__ import annotations

import base64
import json
import stat
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from conformance.contract import StageContract
from conformance.fakecontext import FakeObjects, FakePodContext
from cri import types as t
from nodeagent import labels as L
from nodeagent.additions import ApiEnv
from nodeagent.clock import ManualClock
from nodeagent.kube.configdata import ObjectReader
from nodeagent.kube.env import FieldError, PodFacts, container_env
from nodeagent.model import Pod
from nodeagent.mounttable import mounts_under
from nodeagent.objects import ObjectError, kinds
from nodeagent.stages import Verdict
from plugins.apivolumes import ApiVolumesStage, Settings, api_fields
from plugins.apivolumes.envsources import resolve_env
from plugins.apivolumes.payload import VolumeError, volume_payload
from plugins.apivolumes.tokens import TOKENS, Token
from tests.agent_helpers import BUSYBOX_IMAGE, AgentEnv, running_agent, wait_for

pytestmark = pytest.mark.anyio

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# --- a node of the real control plane ------------------------------------------------------


@dataclass
class Node:
    cp: Any
    env: AgentEnv
    tmp: Path

    @property
    def name(self) -> str:
        return self.env.node

    async def kubectl(self, *args: str, check: bool = True) -> str:
        # In a thread: the agent runs on this event loop and must not stall behind kubectl.
        result = await anyio.to_thread.run_sync(lambda: self.cp.kubectl(*args, check=check))
        return str(result.stdout)

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        path = self.tmp / f"{uuid.uuid4().hex}.json"
        path.write_text(json.dumps(obj))
        return dict(json.loads(await self.kubectl("create", "-f", str(path), "-o", "json")))

    async def run_pod(self, name: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
        """Create the pod bound to this node; the agent's API source picks it up."""
        return await self.create({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": self.name, "terminationGracePeriodSeconds": 1, "containers": list(containers),
                     **spec}})

    async def exec(self, uid: str, container: str, *cmd: str) -> tuple[int, str]:
        cid = await wait_for(lambda: self.running(uid, container), 45, f"container {container} of {uid} running")
        result = await self.env.client.exec_sync(cid, list(cmd), timeout=10)
        return result.exit_code, result.stdout.decode().strip()

    async def output(self, uid: str, container: str, *cmd: str) -> str:
        code, out = await self.exec(uid, container, *cmd)
        assert code == 0, f"{cmd} exited {code}: {out}"
        return out

    async def running(self, uid: str, container: str) -> str | None:
        found = await self.env.client.list_containers(t.ContainerFilter(label_selector={L.POD_UID: uid}))
        for c in found:
            if c.labels.get(L.CONTAINER_NAME) == container and c.state == t.ContainerState.CONTAINER_RUNNING:
                return c.id
        return None

    async def waiting(self, pod: str, container: str) -> dict[str, str]:
        """The container's waiting state as the API shows it (written by the agent's status sink)."""
        obj = json.loads(await self.kubectl("get", "pod", pod, "-o", "json"))
        for cs in obj.get("status", {}).get("containerStatuses", []):
            if cs["name"] == container:
                return dict(cs.get("state", {}).get("waiting", {}))
        return {}

    async def events(self, uid: str, reason: str) -> list[dict[str, Any]]:
        listed = json.loads(await self.kubectl("get", "events", "--field-selector",
                                               f"involvedObject.uid={uid},reason={reason}", "-o", "json"))
        return list(listed["items"])

    async def token_review(self, token: str, *audiences: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"token": token, **({"audiences": list(audiences)} if audiences else {})}
        review = await self.create({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec})
        return dict(review["status"])


@asynccontextmanager
async def cluster_node(containerd: Any, control_plane: Any, tmp_path: Path, *, name: str | None = None,
                       **plugin_config: Any) -> AsyncIterator[Node]:
    name = name or f"av{uuid.uuid4().hex[:8]}"
    kubeconfig = await anyio.to_thread.run_sync(control_plane.node_kubeconfig, name)
    plugins = {"apivolumes": plugin_config} if plugin_config else {}
    # enable_server off: the kubelet API (port 10250) has its own tests.
    async with running_agent(containerd, tmp_path, node_name=name, kubeconfig=kubeconfig, plugins=plugins,
                             enable_server=False) as env:
        node = Node(control_plane, env, tmp_path)
        try:
            yield node
        finally:
            with anyio.CancelScope(shield=True):
                # Graceful deletion through the API: the agent stops the pods, then deletes them.
                await node.kubectl("delete", "pods", "-A", "--field-selector", f"spec.nodeName={name}",
                                   "--wait=false", check=False)
                await env.wait_empty(60)
    with anyio.CancelScope(shield=True):
        await node.kubectl("delete", "pods", "-A", "--field-selector", f"spec.nodeName={name}", "--force",
                           "--grace-period=0", "--wait=false", check=False)
        await node.kubectl("delete", "node", name, "--wait=false", check=False)
        await node.kubectl("-n", "kube-node-lease", "delete", "lease", name, "--wait=false", check=False)


def container(name: str, command: str = "exec sleep 3600", **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": BUSYBOX_IMAGE, "command": ["sh", "-c", command], **fields}


def env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


# --- against the real control plane and containerd ----------------------------------------


async def test_config_maps_secrets_and_the_service_account_volume_reach_the_container(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    async with cluster_node(containerd, control_plane, tmp_path) as node:
        cfg, sec = f"cfg-{node.name}", f"sec-{node.name}"
        await node.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cfg},
                           "data": {"greeting": "hello", "colour": "blue"}})
        await node.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": sec},
                           "stringData": {"password": "s3cret", "user": "admin"}})
        pod = await node.run_pod(f"uses-{node.name}", container(
            "main",
            envFrom=[{"prefix": "CFG_", "configMapRef": {"name": cfg}}, {"secretRef": {"name": sec}},
                     {"configMapRef": {"name": "absent", "optional": True}}],
            env=[{"name": "user", "value": "overridden"},
                 {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": cfg, "key": "greeting"}}},
                 {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": sec, "key": "password"}}},
                 {"name": "OPT_OBJECT", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k",
                                                                          "optional": True}}},
                 {"name": "OPT_KEY", "valueFrom": {"secretKeyRef": {"name": sec, "key": "nokey", "optional": True}}},
                 {"name": "COMBINED", "value": "$(CFG_colour)-$(GREETING)"}],
            volumeMounts=[{"name": "items", "mountPath": "/etc/items"},
                          {"name": "whole", "mountPath": "/etc/colour", "subPath": "colour"},
                          {"name": "secret", "mountPath": "/etc/sec"},
                          {"name": "optional", "mountPath": "/etc/opt"}]),
            volumes=[{"name": "items", "configMap": {"name": cfg, "defaultMode": 0o640,
                                                     "items": [{"key": "greeting", "path": "files/greeting.txt",
                                                                "mode": 0o600},
                                                               {"key": "colour", "path": "colour"}]}},
                     {"name": "whole", "configMap": {"name": cfg}},
                     {"name": "secret", "secret": {"secretName": sec}},
                     {"name": "optional", "configMap": {"name": "absent", "optional": True}}])
        uid = pod["metadata"]["uid"]
        # The API's ServiceAccount admission added the default projected volume.
        assert any(v["name"].startswith("kube-api-access-") for v in pod["spec"]["volumes"])

        env = env_of(await node.output(uid, "main", "env"))
        assert env["CFG_greeting"] == "hello" and env["CFG_colour"] == "blue"  # envFrom with prefix
        assert env["password"] == "s3cret"  # envFrom secret
        assert env["user"] == "overridden"  # env overrides envFrom
        assert env["GREETING"] == "hello" and env["PASSWORD"] == "s3cret"
        assert "OPT_OBJECT" not in env and "OPT_KEY" not in env  # optional and missing: not set
        assert env["COMBINED"] == "blue-hello"  # $(VAR) sees envFrom and earlier refs

        assert await node.output(uid, "main", "cat", "/etc/items/files/greeting.txt") == "hello"
        assert await node.output(uid, "main", "stat", "-L", "-c", "%a", "/etc/items/files/greeting.txt") == "600"
        assert await node.output(uid, "main", "stat", "-L", "-c", "%a", "/etc/items/colour") == "640"
        assert await node.output(uid, "main", "ls", "/etc/items") == "colour\nfiles"  # only the items
        assert await node.output(uid, "main", "cat", "/etc/colour") == "blue"  # subPath of a whole configMap
        assert await node.output(uid, "main", "cat", "/etc/sec/password") == "s3cret"
        assert await node.output(uid, "main", "ls", "/etc/opt") == ""  # optional, missing: empty
        assert (await node.exec(uid, "main", "touch", "/etc/items/x"))[0] != 0  # always read-only

        token = await node.output(uid, "main", "cat", f"{SA_DIR}/token")
        review = await node.token_review(token)
        assert review["authenticated"] is True
        assert review["user"]["username"] == "system:serviceaccount:default:default"
        assert review["user"]["extra"]["authentication.kubernetes.io/pod-uid"] == [uid]  # bound to the pod
        ca = await node.output(uid, "main", "cat", f"{SA_DIR}/ca.crt")
        assert ca == Path(control_plane.ca_file).read_text().strip()
        assert await node.output(uid, "main", "cat", f"{SA_DIR}/namespace") == "default"
        unhonoured = [c.get("message", "") for c in node.env.agent.status.get(uid).get("conditions", [])
                      if c["type"] == "nodeagent.io/UnhonouredFields"]
        assert not any(word in m for m in unhonoured
                       for word in ("configMap", "secret", "projected", "envFrom", "KeyRef")), unhonoured

        # The kubelet's layout on the node; secrets and tokens only in memory.
        volumes = node.env.config.root_dir / "pods" / uid / "volumes"
        items = volumes / "kubernetes.io~configmap" / "items"
        assert (items / "..data").is_symlink() and (items / "files").is_symlink()
        assert stat.S_IMODE((items / "..data" / "files" / "greeting.txt").stat().st_mode) == 0o600
        projected = next((volumes / "kubernetes.io~projected").iterdir())
        in_memory = {p for p in mounts_under(volumes)}
        assert projected.resolve() in in_memory and (volumes / "kubernetes.io~secret" / "secret").resolve() in in_memory
        assert items.resolve() not in in_memory

        await node.kubectl("delete", "pod", pod["metadata"]["name"], "--wait=false")
        await wait_for(lambda: _gone(volumes / "kubernetes.io~projected"), 30, "the projected volume removed")
        assert not mounts_under(volumes), "the tmpfs mounts must be unmounted after the pod"


async def test_containers_see_the_services_of_their_namespace_as_env(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    """Upstream's "Pods should contain environment variables for services": Docker-link style
    variables for each service of the namespace and for default/kubernetes, the lowest
    precedence, usable in $(VAR); enableServiceLinks: false keeps only the master service."""
    async with cluster_node(containerd, control_plane, tmp_path) as node:
        svc = f"svc-{node.name}"
        made = await node.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc},
                                  "spec": {"selector": {"app": "none"},
                                           "ports": [{"name": "http-alt", "port": 8765, "targetPort": 8080},
                                                     {"name": "dns", "port": 53, "protocol": "UDP"}]}})
        ip = made["spec"]["clusterIP"]
        var = svc.upper().replace("-", "_")
        pod = await node.run_pod(f"links-{node.name}", container(
            "main", env=[{"name": "VIA", "value": f"$({var}_SERVICE_HOST)"},
                         {"name": f"{var}_SERVICE_PORT", "value": "mine"}]))
        env = env_of(await node.output(pod["metadata"]["uid"], "main", "env"))
        assert env[f"{var}_SERVICE_HOST"] == ip and env["VIA"] == ip
        assert env[f"{var}_SERVICE_PORT"] == "mine"  # the container's own env wins
        assert env[f"{var}_SERVICE_PORT_HTTP_ALT"] == "8765"
        assert env[f"{var}_PORT"] == f"tcp://{ip}:8765"
        assert env[f"{var}_PORT_8765_TCP"] == f"tcp://{ip}:8765"
        assert (env[f"{var}_PORT_8765_TCP_PROTO"], env[f"{var}_PORT_8765_TCP_PORT"],
                env[f"{var}_PORT_8765_TCP_ADDR"]) == ("tcp", "8765", ip)
        assert env[f"{var}_PORT_53_UDP"] == f"udp://{ip}:53"
        assert env["KUBERNETES_SERVICE_HOST"] and env["KUBERNETES_SERVICE_PORT"] == "443"

        pod = await node.run_pod(f"nolinks-{node.name}", container("main"), enableServiceLinks=False)
        env = env_of(await node.output(pod["metadata"]["uid"], "main", "env"))
        assert f"{var}_SERVICE_HOST" not in env
        assert env["KUBERNETES_SERVICE_HOST"]  # the master service is always there


async def _gone(path: Path) -> bool:
    return not path.exists()


async def test_missing_objects_hold_the_pod_with_the_kubelets_reasons_until_they_exist(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    async with cluster_node(containerd, control_plane, tmp_path, resyncSeconds=2) as node:
        late_env, late_vol = f"late-env-{node.name}", f"late-vol-{node.name}"
        env_pod = await node.run_pod(f"envwait-{node.name}", container(
            "main", env=[{"name": "K", "valueFrom": {"configMapKeyRef": {"name": late_env, "key": "k"}}}]),
            automountServiceAccountToken=False)
        vol_pod = await node.run_pod(f"volwait-{node.name}", container(
            "main", volumeMounts=[{"name": "cfg", "mountPath": "/cfg"}]),
            volumes=[{"name": "cfg", "configMap": {"name": late_vol}}], automountServiceAccountToken=False)
        env_name = env_pod["metadata"]["name"]
        env_uid, vol_uid = env_pod["metadata"]["uid"], vol_pod["metadata"]["uid"]

        async def waiting_with(message: str) -> bool:
            # The sandbox runs; the container waits, as the API shows (the kubelet's status).
            return await node.waiting(env_name, "main") == {"reason": "CreateContainerConfigError",
                                                             "message": message}

        await wait_for(lambda: waiting_with(f'configmap "{late_env}" not found'), 30,
                       "CreateContainerConfigError for the missing configMap in the API's pod status")

        async def failed_mount() -> list[dict[str, Any]]:
            return await node.events(vol_uid, "FailedMount")

        events = await wait_for(failed_mount, 30, "a FailedMount Event for the missing configMap volume")
        assert events[0]["type"] == "Warning"
        assert events[0]["message"] == f'MountVolume.SetUp failed for volume "cfg" : configmap "{late_vol}" not found'
        assert await node.running(vol_uid, "main") is None
        assert not (node.env.config.root_dir / "pods" / vol_uid / "volumes" / "kubernetes.io~configmap" / "cfg"
                    / "..data").exists()

        await node.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": late_env},
                           "data": {"other": "x"}})
        await wait_for(lambda: waiting_with(f"couldn't find key k in ConfigMap default/{late_env}"), 30,
                       "CreateContainerConfigError for the missing key")
        await node.kubectl("patch", "configmap", late_env, "--type=merge", "-p", '{"data": {"k": "at last"}}')
        await node.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": late_vol},
                           "data": {"file": "mounted"}})

        assert env_of(await node.output(env_uid, "main", "env"))["K"] == "at last"
        assert await node.output(vol_uid, "main", "cat", "/cfg/file") == "mounted"

        async def no_longer_waiting() -> bool:
            return await node.waiting(env_name, "main") == {}

        await wait_for(no_longer_waiting, 30, "the API's status to show the container no longer waiting")


async def test_volumes_follow_their_objects_and_tokens_are_refreshed(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    # 0.005 of a 600 s token: refreshed after 3 s instead of 480 s (the timing itself is
    # checked against a manual clock below).
    async with cluster_node(containerd, control_plane, tmp_path, resyncSeconds=1,
                            tokenRefreshFraction=0.005) as node:
        live = f"live-{node.name}"
        await node.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": live},
                           "data": {"value": "one"}})
        pod = await node.run_pod(f"follows-{node.name}", container(
            "main", volumeMounts=[{"name": "mix", "mountPath": "/mix"}]),
            automountServiceAccountToken=False,
            volumes=[{"name": "mix", "projected": {"sources": [
                {"serviceAccountToken": {"path": "tok", "expirationSeconds": 600, "audience": "example.com"}},
                {"configMap": {"name": live}},
                {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}]}}])
        uid = pod["metadata"]["uid"]
        first = await node.output(uid, "main", "cat", "/mix/tok")
        assert await node.output(uid, "main", "cat", "/mix/value") == "one"
        assert await node.output(uid, "main", "cat", "/mix/name") == pod["metadata"]["name"]
        claims = json.loads(base64.urlsafe_b64decode(first.split(".")[1] + "=="))
        assert claims["aud"] == ["example.com"] and claims["exp"] - claims["iat"] == 600

        async def refreshed() -> str | None:
            token = await node.output(uid, "main", "cat", "/mix/tok")
            return token if token != first else None

        second = await wait_for(refreshed, 30, "the token file to hold a refreshed token")
        assert json.loads(base64.urlsafe_b64decode(second.split(".")[1] + "=="))["iat"] > claims["iat"]
        assert (await node.token_review(second, "example.com"))["authenticated"] is True

        await node.kubectl("patch", "configmap", live, "--type=merge", "-p", '{"data": {"value": "two"}}')

        async def updated() -> bool:
            return await node.output(uid, "main", "cat", "/mix/value") == "two"

        await wait_for(updated, 30, "the projected configMap file to follow the object")


async def test_binary_data_fs_group_ownership_and_env_names_that_are_not_identifiers(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    async with cluster_node(containerd, control_plane, tmp_path) as node:
        cfg, sec = f"bin-{node.name}", f"grp-{node.name}"
        binary = bytes([0xDE, 0xCA, 0xFE, 0xBA, 0xD0, 0xFE, 0xFF])
        await node.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cfg},
                           "data": {"data-1": "value-1"},
                           "binaryData": {"dump.bin": base64.b64encode(binary).decode()}})
        await node.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": sec},
                           "stringData": {"data-1": "secret-1"}})
        pod = await node.run_pod(f"owned-{node.name}", container(
            "main",
            envFrom=[{"configMapRef": {"name": cfg}}, {"prefix": "p-", "configMapRef": {"name": cfg}}],
            volumeMounts=[{"name": "cfg", "mountPath": "/etc/cfg"}, {"name": "sec", "mountPath": "/etc/sec"},
                          {"name": "proj", "mountPath": "/etc/proj"}]),
            securityContext={"runAsUser": 1000, "fsGroup": 1001},
            volumes=[{"name": "cfg", "configMap": {"name": cfg, "defaultMode": 0o440}},
                     {"name": "sec", "secret": {"secretName": sec, "defaultMode": 0o400}},
                     {"name": "proj", "projected": {"sources": [{"configMap": {"name": cfg}},
                                                                {"secret": {"name": sec,
                                                                            "items": [{"key": "data-1",
                                                                                       "path": "s"}]}}]}}])
        uid = pod["metadata"]["uid"]
        # binaryData keys are files with their exact bytes, in configMap and projected volumes.
        for path in ("/etc/cfg/dump.bin", "/etc/proj/dump.bin"):
            assert "de ca fe ba d0 fe ff" in await node.output(uid, "main", "hexdump", "-C", path)
        # fsGroup: the read-only content is mode | 0440 and the group's, so user 1000 reads
        # files it does not own through its supplemental group 1001.
        modes = await node.output(uid, "main", "stat", "-L", "-c", "%A %u %g", "/etc/cfg/data-1", "/etc/sec/data-1",
                                  "/etc/proj/s", f"{SA_DIR}/token")
        assert modes.splitlines() == ["-r--r----- 0 1001", "-r--r----- 0 1001", "-rw-r--r-- 0 1001",
                                      "-rw-r----- 0 1001"]  # the token: 0600 | 0440
        assert await node.output(uid, "main", "cat", "/etc/sec/data-1") == "secret-1"
        assert (await node.output(uid, "main", "head", "-c", "20", f"{SA_DIR}/token")).startswith("ey")
        # envFrom keys that are no shell identifiers reach the container (busybox `env`, no
        # shell in between: an old ash drops such names from what it passes on).
        env = env_of(await node.output(uid, "main", "env"))
        assert env["data-1"] == "value-1" and env["p-data-1"] == "value-1"


async def test_downward_api_volumes_follow_the_pods_labels_and_annotations(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    async with cluster_node(containerd, control_plane, tmp_path) as node:
        items = [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                 {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
        name = f"meta-{node.name}"
        pod = await node.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"key1": "value1"}, "annotations": {"builder": "bar"}},
            "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
                     "containers": [container("main", volumeMounts=[{"name": "info", "mountPath": "/info"},
                                                                     {"name": "proj", "mountPath": "/proj"}])],
                     "volumes": [{"name": "info", "downwardAPI": {"items": items}},
                                 {"name": "proj", "projected": {"sources": [{"downwardAPI": {"items": items}}]}}]}})
        uid = pod["metadata"]["uid"]
        assert await node.output(uid, "main", "cat", "/info/labels") == 'key1="value1"'
        assert await node.output(uid, "main", "cat", "/proj/annotations") == 'builder="bar"'
        volume = node.env.config.root_dir / "pods" / uid / "volumes" / "kubernetes.io~downward-api" / "info"
        before = (volume / "..data").readlink()

        await node.kubectl("label", "pod", name, "key3=value3")
        await node.kubectl("annotate", "pod", name, "--overwrite", "builder=foo")

        async def follows(path: str, text: str) -> bool:
            return await node.output(uid, "main", "cat", path) == text

        # Within seconds of the change, not at the next one-minute resync.
        for directory in ("/info", "/proj"):
            await wait_for(lambda d=directory: follows(f"{d}/labels", 'key1="value1"\nkey3="value3"'), 20,
                           f"{directory}/labels to follow the pod's labels")
            await wait_for(lambda d=directory: follows(f"{d}/annotations", 'builder="foo"'), 20,
                           f"{directory}/annotations to follow the pod's annotations")
        assert (volume / "..data").readlink() != before  # a new payload, swapped in atomically
        assert not (volume / before).exists()


async def test_standalone_refuses_a_pod_that_needs_the_api_and_runs_one_that_only_pulls_with_it(
        containerd: Any, tmp_path: Path) -> None:
    """Refuse, never ignore: without an API server a configMap volume or configMap env cannot be
    filled, so the pod is refused (it would run without them); imagePullSecrets only change how
    a pull is made, so that pod runs, with the field reported."""
    async with running_agent(containerd, tmp_path) as env:
        env.write("p.yaml", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "noapi"},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [container(
                "main", volumeMounts=[{"name": "cfg", "mountPath": "/cfg"}])],
                "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}]}})
        env.write("e.yaml", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "noenv"},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "containers": [container("main", envFrom=[{"configMapRef": {"name": "cfg"}}])]}})
        env.write("s.yaml", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pullsecret"},
            "spec": {"terminationGracePeriodSeconds": 1, "imagePullSecrets": [{"name": "regcred"}],
                     "containers": [container("main")]}})

        async def failed(name: str) -> dict[str, Any] | None:
            status = env.status_of(name)
            return status if status.get("phase") == "Failed" else None

        volume = await wait_for(lambda: failed("noapi"), 30, "the pod with a configMap volume refused")
        assert volume["reason"] == "UnsupportedVolume"
        assert volume["message"] == ('volume "cfg" is a configMap volume, which needs the API server, and this node '
                                     "runs standalone: the pod would run without it")
        envfrom = await wait_for(lambda: failed("noenv"), 30, "the pod with configMap env refused")
        assert envfrom["reason"] == "UnsupportedPodField" and "'main' takes env from configMaps" in envfrom["message"]
        assert not await env.running_containers("noapi") and not await env.running_containers("noenv")
        await env.wait_running("pullsecret")

        async def condition() -> str | None:
            for c in env.status_of("pullsecret").get("conditions", []):
                if c["type"] == "nodeagent.io/UnhonouredFields":
                    return str(c["message"])
            return None

        assert "spec.imagePullSecrets[0]" in await wait_for(condition, 30, "the unhonoured-fields condition")


# --- without a control plane ----------------------------------------------------------------


def FakeApi(clock: ManualClock | None = None, **objects: dict[str, Any]) -> FakeObjects:  # noqa: N802
    """The shared fake store (conformance/fakecontext.py) holding ``"Kind/name"`` objects of namespace ns."""
    store = FakeObjects(clock)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for key, fields in objects.items():
        kind, name = key.split("/", 1)
        by_kind.setdefault(kind, []).append({"metadata": {"name": name, "namespace": "ns",
                                                           "uid": fields.get("uid", f"uid-{name}")}, **fields})
    for kind, found in by_kind.items():
        store.put(kinds.CONFIG_MAP if kind == "ConfigMap" else kinds.SECRET, *found)
    return store


def _pod(*containers: dict[str, Any], **spec: Any) -> Pod:
    return Pod.model_validate({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
                               "spec": {"containers": list(containers) or [{"name": "c", "image": "i"}], **spec}})


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def test_env_from_the_api_follows_the_kubelets_precedence_and_messages() -> None:
    api = FakeApi(**{"ConfigMap/cfg": {"data": {"a": "1", "b": "2"}, "binaryData": {"bin": _b64("x")}},
                     "Secret/sec": {"data": {"a": _b64("secret-a"), "s": _b64("S")}}})
    pod = _pod({"name": "c", "image": "i",
                "envFrom": [{"configMapRef": {"name": "cfg"}}, {"prefix": "S_", "secretRef": {"name": "sec"}},
                            {"secretRef": {"name": "gone", "optional": True}}],
                "env": [{"name": "b", "value": "$(a)+"},
                        {"name": "K", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "s"}}},
                        {"name": "BIN", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "bin",
                                                                          "optional": True}}}]})
    c = pod.spec.containers[0]
    api_env = await resolve_env(c, ObjectReader(api, "ns"), "ns")
    assert api_env.error == ""
    env = container_env(pod, c, PodFacts(), api_env)
    # binaryData never reaches env; an optional key that is missing leaves the variable unset.
    assert env == {"a": "1", "b": "1+", "S_a": "secret-a", "S_s": "S", "K": "S"}
    assert container_env(pod, c, PodFacts(), None) == {"b": "$(a)+"}  # standalone: unset

    for ref, message in (({"configMapKeyRef": {"name": "none", "key": "k"}}, 'configmap "none" not found'),
                         ({"secretKeyRef": {"name": "none", "key": "k"}}, 'secret "none" not found'),
                         ({"configMapKeyRef": {"name": "cfg", "key": "k"}}, "couldn't find key k in ConfigMap ns/cfg"),
                         ({"secretKeyRef": {"name": "sec", "key": "k"}}, "couldn't find key k in Secret ns/sec")):
        bad = _pod({"name": "c", "image": "i", "env": [{"name": "X", "valueFrom": ref}]}).spec.containers[0]
        result = await resolve_env(bad, ObjectReader(api, "ns"), "ns")
        assert result.error == message
        with pytest.raises(FieldError, match=message):
            container_env(pod, bad, PodFacts(), result)


async def test_volume_payloads_take_items_modes_and_optional_sources() -> None:
    api = FakeApi(**{"ConfigMap/cfg": {"data": {"a": "A", "b": "B"}},
                     "Secret/sec": {"data": {"s": _b64("S"), "raw": base64.b64encode(b"\xff\x00").decode()}}})
    pod = _pod(volumes=[
        {"name": "all", "configMap": {"name": "cfg"}},
        {"name": "items", "configMap": {"name": "cfg", "defaultMode": 0o600,
                                        "items": [{"key": "a", "path": "x/a"}, {"key": "b", "path": "b", "mode": 0o400}]}},
        {"name": "badkey", "secret": {"secretName": "sec", "items": [{"key": "nope", "path": "n"}]}},
        {"name": "optkey", "secret": {"secretName": "sec", "optional": True, "items": [{"key": "nope", "path": "n"}]}},
        {"name": "missing", "secret": {"secretName": "gone"}},
        {"name": "optional", "configMap": {"name": "gone", "optional": True}},
        {"name": "binary", "secret": {"secretName": "sec"}},
        {"name": "projected", "projected": {"defaultMode": 0o444, "sources": [
            {"configMap": {"name": "gone"}}, {"secret": {"name": "sec", "items": [{"key": "zz", "path": "z"}]}}]}},
    ])
    reader = ObjectReader(api, "ns")

    async def payload(name: str) -> Any:
        volume = next(v for v in pod.spec.volumes if v.name == name)
        return await volume_payload(volume, pod, reader, _no_token, PodFacts())

    assert await payload("all") == {"a": (b"A", 0o644), "b": (b"B", 0o644)}
    assert await payload("items") == {"x/a": (b"A", 0o600), "b": (b"B", 0o400)}
    assert await payload("optkey") == {} and await payload("optional") == {}
    for name, message in (("badkey", "references non-existent secret key: nope"),
                          ("missing", 'secret "gone" not found'),
                          ("projected", '[configmap "gone" not found, references non-existent secret key: zz]')):
        with pytest.raises(VolumeError) as caught:
            await payload(name)
        assert str(caught.value) == message
    # Bytes that are no UTF-8 are files like any other (binaryData, binary secrets).
    assert await payload("binary") == {"s": (b"S", 0o644), "raw": (b"\xff\x00", 0o644)}


async def _no_token(audience: str, seconds: int) -> str:
    raise AssertionError("no token expected")


def test_tokens_refresh_at_80_percent_of_their_lifetime_or_after_a_day() -> None:
    hour = Token("t", expires_at=10_000.0 + 3600, lifetime=3600)
    assert hour.issued_at == 10_000.0 and hour.refresh_at() == 10_000.0 + 2880
    year = Token("t", expires_at=10_000.0 + 365 * 86400, lifetime=365 * 86400)
    assert year.refresh_at() == 10_000.0 + 86400


async def test_observe_refreshes_the_token_file_when_80_percent_of_its_lifetime_passed(tmp_path: Path) -> None:
    clock = ManualClock(start=1_800_000_000.0)
    api = FakeApi(clock)
    pod = _pod({"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
               volumes=[{"name": "v", "projected": {"sources": [
                   {"serviceAccountToken": {"path": "token", "expirationSeconds": 1000}}]}}])
    ctx = _FakeContext(pod, api, clock, tmp_path)
    stage = ApiVolumesStage(Settings())
    assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE  # type: ignore[arg-type]
    token_file = tmp_path / "volumes" / "kubernetes.io~projected" / "v" / "token"
    assert token_file.read_text() == "token-1" and api.token_requests == 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(stage.observe, ctx)  # type: ignore[arg-type]
        await wait_for(_sleeping(clock), 5, "observe asleep")
        clock.advance(799)
        await wait_for(_sleeping(clock), 5, "observe asleep again")
        assert api.token_requests == 1, "not before 80% of the lifetime"
        clock.advance(1)
        await wait_for(_sleeping(clock), 5, "observe asleep after the refresh")
        assert api.token_requests == 2 and token_file.read_text() == "token-2"
        assert ctx.stash[TOKENS][("", 1000)].expires_at == clock.now() + 1000
        tg.cancel_scope.cancel()
    await stage.unprepare(ctx)  # type: ignore[arg-type]
    assert not (tmp_path / "volumes" / "kubernetes.io~projected").exists() and not mounts_under(tmp_path)


def _sleeping(clock: ManualClock) -> Any:
    async def check() -> bool:
        await anyio.sleep(0.01)
        return clock.sleepers > 0

    return check


def _FakeContext(pod: Pod, api: FakeObjects, clock: ManualClock, pod_dir: Path) -> FakePodContext:  # noqa: N802
    return FakePodContext(pod, stage="apivolumes", clock=clock, objects=api, pod_dir=pod_dir)


async def test_env_read_before_survives_an_unreachable_api_but_not_a_deleted_object(tmp_path: Path) -> None:
    api = FakeApi(**{"ConfigMap/cfg": {"data": {"k": "v"}}})
    pod = _pod({"name": "c", "image": "i", "envFrom": [{"configMapRef": {"name": "cfg"}}]})
    ctx = _FakeContext(pod, api, ManualClock(), tmp_path)
    stage = ApiVolumesStage(Settings())
    assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE  # type: ignore[arg-type]
    assert ctx.additions.merged("c").api_env == ApiEnv(env_from={"k": "v"})

    api.failure = ObjectError("GET /api/v1/namespaces/ns/configmaps/cfg: ConnectError: connection refused", None)
    found = await stage._resolve(ctx)  # type: ignore[arg-type]
    assert found.env["c"] == ApiEnv(env_from={"k": "v"}) and not found.complete
    api.failure = None
    api.put(kinds.CONFIG_MAP)  # now the API says: deleted
    stage._contribute(ctx, await stage._resolve(ctx))  # type: ignore[arg-type]
    assert ctx.additions.merged("c").api_env == ApiEnv(error='configmap "cfg" not found')


def test_api_fields_name_every_reference_as_the_model_would() -> None:
    pod = _pod({"name": "c", "image": "i", "envFrom": [{"configMapRef": {"name": "x"}}],
                "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
               volumes=[{"name": "e", "emptyDir": {}}, {"name": "s", "secret": {"secretName": "s"}}])
    assert api_fields(pod) == ["spec.volumes[1].secret", "spec.containers[0].envFrom",
                               "spec.containers[0].env[0].valueFrom.secretKeyRef"]
    assert ApiEnv().error == ""


class TestApiVolumesContract(StageContract):
    """The stage contract, standalone (the harness has no API client): every phase answers with
    documented verdicts and every undo is idempotent for pods that use API objects."""

    plugin = "apivolumes"

    def pods(self, harness: Any) -> list[Pod]:
        base = harness.pod()
        data = base.model_dump(by_alias=True, exclude_none=True)
        data["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/cfg"},
                                                         {"name": "token", "mountPath": SA_DIR}]
        data["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "s"}}]
        data["spec"]["volumes"] = [
            {"name": "cfg", "configMap": {"name": "c"}},
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]
        return [base, Pod.model_validate(data)]
