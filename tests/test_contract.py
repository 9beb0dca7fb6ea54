"""The stage contract (conformance.contract) for all thirteen built-in stages and the example
plugin, each in a real agent, on the in-memory CRI runtime (no root, no containerd: run these
alone with ``-m "not containerd"``) and on the real containerd.

volumes and apivolumes run here on the memory runtime only: their own modules (test_volumes,
test_apivolumes) run the contract on both runtimes with their own pods.

What standalone cannot cover is said where it applies: tainttoleration decides on the Node's
NoExecute taints, which only the API has (static pods are exempt anyway); apivolumes reads
configMaps, secrets and tokens from the API (standalone it skips and reports the fields).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from conformance.contract import StageContract, copy_pod
from conformance.harness import UNTIL_TERM, Harness, RuntimeKind
from devenv.images import BUSYBOX_IMAGE
from nodeagent.model import Pod

GANG = "gang.nodeagent.io/name"
BOTH: tuple[RuntimeKind, ...] = ("memory", "containerd")
MEMORY: tuple[RuntimeKind, ...] = ("memory",)
ROOT = os.geteuid() == 0


def _container(name: str = "main", command: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": BUSYBOX_IMAGE, "command": command or UNTIL_TERM, **fields}


class TestRuntimeContract(StageContract):
    plugin = "runtime"
    runtimes = BOTH

    def pods(self, harness: Harness) -> list[Pod]:
        # Two containers and an init container: every start path of the sync loop.
        return [harness.pod(), harness.pod(
            containers=[_container("a"), _container("b")],
            initContainers=[_container("init", ["sh", "-c", "exit 0"])])]


class TestNodeResourcesContract(StageContract):
    plugin = "noderesources"
    runtimes = BOTH

    def pods(self, harness: Harness) -> list[Pod]:
        # Fits; does not fit (OutOfcpu); asks for a node label this node lacks (NodeAffinity).
        return [harness.pod(),
                harness.pod(containers=[_container(resources={"requests": {"cpu": "100000"}})]),
                harness.pod(nodeSelector={"contract.nodeagent.io/absent": "yes"})]


class TestStatusContract(StageContract):
    plugin = "status"
    runtimes = BOTH

    def pods(self, harness: Harness) -> list[Pod]:
        # Running; and one whose container fails and is not restarted (phase Failed).
        return [harness.pod(), harness.pod(containers=[_container(command=["sh", "-c", "exit 3"])],
                                           restartPolicy="Never")]


class TestTaintTolerationContract(StageContract):
    """Standalone there is no Node with taints and static pods are exempt: the stage admits.
    Its NoExecute decisions need the API (tests/test_admission_predicates.py)."""

    plugin = "tainttoleration"
    runtimes = BOTH

    def pods(self, harness: Harness) -> list[Pod]:
        return [harness.pod(tolerations=[{"key": "k", "operator": "Exists", "effect": "NoExecute"}])]


class TestActiveDeadlineContract(StageContract):
    plugin = "activedeadline"
    runtimes = BOTH

    def pods(self, harness: Harness) -> list[Pod]:
        # No deadline; and one that passes it while observed (failed as a whole: DeadlineExceeded).
        return [harness.pod(), harness.pod(activeDeadlineSeconds=1)]


class TestPodSecurityContract(StageContract):
    plugin = "podsecurity"
    runtimes = BOTH
    settings: ClassVar[Mapping[str, Any]] = {"allow_privileged": False}

    def pods(self, harness: Harness) -> list[Pod]:
        # Allowed; privileged on a node that forbids it; an unsafe sysctl.
        return [harness.pod(),
                harness.pod(containers=[_container(securityContext={"privileged": True})]),
                harness.pod(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]})]


class TestVolumesContract(StageContract):
    """tmpfs (emptyDir medium Memory) needs mount(2): only as root."""

    plugin = "volumes"
    runtimes = MEMORY

    def pods(self, harness: Harness) -> list[Pod]:
        host = harness.base / "host"
        host.mkdir(exist_ok=True)
        mounts = [{"name": "scratch", "mountPath": "/scratch"}, {"name": "info", "mountPath": "/info"},
                  {"name": "host", "mountPath": "/host"}, {"name": "scratch", "mountPath": "/sub", "subPath": "a/b"}]
        volumes: list[dict[str, Any]] = [
            {"name": "scratch", "emptyDir": {}},
            {"name": "info", "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
            {"name": "host", "hostPath": {"path": str(host), "type": "Directory"}}]
        if ROOT:
            mounts.append({"name": "mem", "mountPath": "/mem"})
            volumes.append({"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
        return [harness.pod(),
                harness.pod(containers=[_container(volumeMounts=mounts)], volumes=volumes),
                # a hostPath that is not there: FailedMount, retried
                harness.pod(containers=[_container(volumeMounts=[{"name": "gone", "mountPath": "/gone"}])],
                            volumes=[{"name": "gone", "hostPath": {"path": str(harness.base / "absent"),
                                                                    "type": "Directory"}}])]


class TestApiVolumesContract(StageContract):
    """Standalone the stage has no API to read from: it skips (the fields are reported
    unhonoured). Reading objects and tokens is covered with the real API server in
    tests/test_apivolumes.py."""

    plugin = "apivolumes"
    runtimes = MEMORY

    def pods(self, harness: Harness) -> list[Pod]:
        return [harness.pod(), harness.pod(
            containers=[_container(volumeMounts=[{"name": "cfg", "mountPath": "/cfg"}],
                                   envFrom=[{"secretRef": {"name": "s"}}])],
            volumes=[{"name": "cfg", "configMap": {"name": "c"}}])]


class TestProbesContract(StageContract):
    plugin = "probes"
    runtimes = BOTH

    def pods(self, harness: Harness) -> list[Pod]:
        def probe(action: dict[str, Any]) -> dict[str, Any]:
            return {**action, "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2}

        exec_true = {"exec": {"command": ["true"]}}
        probed = _container(startupProbe=probe(exec_true), livenessProbe=probe(exec_true),
                            readinessProbe=probe({"exec": {"command": ["sh", "-c", "test -e /ready"]}}))
        return [harness.pod(), harness.pod(containers=[probed])]


class TestLogsContract(StageContract):
    plugin = "logs"
    runtimes = BOTH

    def pods(self, harness: Harness) -> list[Pod]:
        talking = ["sh", "-c", "echo hello; echo oops >&2; trap 'exit 0' TERM; sleep 3600 & wait"]
        return [harness.pod(containers=[_container(command=talking), _container("second")])]


class TestGangContract(StageContract):
    plugin = "gang"
    runtimes = BOTH

    def pods(self, harness: Harness) -> list[Pod]:
        # No gang (skipped), a gang of one (commits at once), a member of a gang of two (waits).
        return [harness.pod()] + [
            harness.pod(annotations={GANG: f"g{n}-{uuid.uuid4().hex[:8]}", "gang.nodeagent.io/min-member": str(n)})
            for n in (1, 2)]

    def variant(self, harness: Harness, pod: Pod, tag: str) -> Pod:
        # A gang whose member was deleted before it committed is aborted: each copy its own gang.
        copy = copy_pod(harness, pod, tag)
        if GANG in copy.metadata.annotations:
            copy.metadata.annotations[GANG] = f"{copy.metadata.annotations[GANG]}-{tag}"
        return copy

    def leaks(self, harness: Harness, uid: str) -> list[str]:
        assert harness.agent is not None and harness.agent.pipeline is not None
        gang = harness.agent.pipeline.stages["gang"]
        member = gang.gangs.member_of(uid)  # type: ignore[attr-defined]
        return [f"the gang stage still counts the pod as a member of {member.key}"] if member is not None else []


class TestDraContract(StageContract):
    """With the fake GPU driver (plugins/fakegpu) registered through the plugin registry and a
    ResourceClaim manifest beside the pods, as standalone DRA works. Claims from the API server
    (cluster mode) are covered in tests/test_dra_cluster.py."""

    plugin = "dra"
    runtimes = BOTH
    config: ClassVar[Mapping[str, Any]] = {"pollSeconds": 0.1, "healthCheckSeconds": 1.0}

    def manifests(self, harness: Harness) -> list[dict[str, Any]]:
        from drivers.fakegpu import DRIVER_NAME

        return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "gpu", "namespace": "conformance"},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}},
                 "status": {"allocation": {"devices": {"results": [
                     {"request": "gpu", "driver": DRIVER_NAME, "pool": "node", "device": "gpu0"}]}}}}]

    @asynccontextmanager
    async def environment(self, harness: Harness) -> AsyncIterator[None]:
        import anyio

        from drivers.fakegpu import FakeGpuDriver

        self.driver = FakeGpuDriver(registry_dir=harness.config.plugins_registry_dir,
                                    plugin_dir=harness.base / "fakegpu", cdi_dir=harness.config.cdi_spec_dirs[0],
                                    claims_dir=harness.manifests)
        async with anyio.create_task_group() as tg:
            await tg.start(self.driver.run)
            yield
            tg.cancel_scope.cancel()

    def pods(self, harness: Harness) -> list[Pod]:
        claimed = _container(resources={"claims": [{"name": "gpu"}]})
        return [harness.pod(),
                harness.pod(containers=[claimed], resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu"}]),
                # a claim nobody wrote: FailedPrepareDynamicResources, retried
                harness.pod(containers=[claimed], resourceClaims=[{"name": "gpu", "resourceClaimName": "absent"}])]

    def leaks(self, harness: Harness, uid: str) -> list[str]:
        busy = harness.agent is not None and harness.agent.dispatcher is not None and harness.agent.dispatcher.workers
        prepared = self.driver.prepared()
        return [f"the driver still has claims prepared: {prepared}"] if prepared and not busy else []


class TestCsiContract(StageContract):
    """Standalone, with the hostpath CSI test driver (drivers/csihostpath) registered through the
    plugin registry: a pod without claims, a claim (refused: no API server to read it from) and
    a CSI inline volume (no CSIDriver object standalone, so it waits: FailedMount, retried).
    Claims, attachments and publishing in a cluster: tests/test_csi_cluster.py."""

    plugin = "csi"
    runtimes = MEMORY
    config: ClassVar[Mapping[str, Any]] = {"waitSeconds": 0.5, "pollSeconds": 0.1, "reconcilePeriodSeconds": 1}

    @asynccontextmanager
    async def environment(self, harness: Harness) -> AsyncIterator[None]:
        import anyio

        from drivers.csihostpath import HostPathDriver

        self.driver = HostPathDriver(registry_dir=harness.config.plugins_registry_dir,
                                     plugin_dir=harness.base / "csihostpath", state_dir=harness.base / "csi-state",
                                     node_id="contract")
        async with anyio.create_task_group() as tg:
            await tg.start(self.driver.run)
            yield
            tg.cancel_scope.cancel()

    def pods(self, harness: Harness) -> list[Pod]:
        from drivers.csihostpath import DRIVER_NAME

        mounted = _container(volumeMounts=[{"name": "data", "mountPath": "/data"}])
        return [harness.pod(),
                harness.pod(containers=[mounted],
                            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]),
                harness.pod(containers=[mounted], volumes=[{"name": "data", "csi": {"driver": DRIVER_NAME}}])]

    def leaks(self, harness: Harness, uid: str) -> list[str]:
        published = [c for c in self.driver.calls if c.method == "NodePublishVolume"
                     and not any(u.method == "NodeUnpublishVolume" and u.path == c.path for u in self.driver.calls)]
        return [f"the driver still has volumes published: {published}"] if published else []


class TestRequiredLabelContract(StageContract):
    """The out-of-tree example (examples/required-label), installed as its own distribution."""

    plugin = "requiredlabel"
    runtimes = BOTH
    config: ClassVar[Mapping[str, Any]] = {"label": "team"}

    def pods(self, harness: Harness) -> list[Pod]:
        return [harness.pod(labels={"team": "storage"}), harness.pod()]  # CONTINUE and REJECT


class TestNodeEnvContract(StageContract):
    """The walkthrough's example (examples/node-env): a prepare stage that gives every container
    an env var through ``ctx.additions`` and withdraws it; the suite checks nothing of it is left
    after unprepare."""

    plugin = "nodeenv"
    runtimes = MEMORY
    config: ClassVar[Mapping[str, Any]] = {"zone": "eu-1"}

    def pods(self, harness: Harness) -> list[Pod]:
        return [harness.pod(containers=[_container("a"), _container("b")],
                            initContainers=[_container("init", ["sh", "-c", "exit 0"])])]
