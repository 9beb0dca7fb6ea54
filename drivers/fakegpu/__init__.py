"""A "fake GPU" DRA driver: a kubelet plugin written in Python, to develop and test DRA on one
node without hardware (``python -m drivers.fakegpu --help``).

It does what a real DRA kubelet plugin does on the node (the part k8s.io/dynamic-resource-
allocation's kubeletplugin helper and the upstream dra-example-driver do):

* serves **plugin registration** on ``<registry-dir>/<driver>-reg.sock`` (GetInfo says: type
  DRAPlugin, this driver's name, the DRA endpoint, services ``v1.DRAPlugin`` and
  ``v1beta1.DRAPlugin``; NotifyRegistrationStatus is logged and recorded);
* serves **DRA v1 and v1beta1** on ``<plugin-dir>/dra.sock``;
* exposes a few fake devices ``gpu0``..``gpuN-1``: each is a character device node it makes
  under ``<plugin-dir>/dev`` (the numbers of /dev/null, 1:3, so a container can open it and
  nothing real is exposed);
* on **NodePrepareResources** finds the devices allocated to the claim (in the ResourceClaim
  manifests of ``--claims-dir``: standalone nodeagent's staticPodPath), writes one CDI spec per
  claim (``<cdi-dir>/nodeagent.example-gpu_<claim uid>.json``, cdiVersion 0.6.0, kind
  ``nodeagent.example/gpu``) whose devices give a container the device node
  (``/dev/fakegpu<N>``), a read-only mount of an info directory (``/var/run/fakegpu/gpu<N>``) and
  environment (``GPU_DEVICE_<N>=gpu<N>``, ``FAKE_GPU_CLAIM=<ns>/<name>``), and answers the CDI
  device ids. Repeated calls answer the same (idempotent);
* on **NodeUnprepareResources** removes the spec and the info directory (idempotent too).

In a cluster (``--kubeconfig``, ``--node-name``; drivers/fakegpu/cluster.py) it also publishes a
ResourceSlice of its devices for the node, so that the real scheduler can allocate them, and
reads each claim's allocation from the API server instead of the manifests.

What is prepared lives on disk (the specs), so a restarted driver answers as before. ``fail``
(``--fail`` or the attribute) makes it misbehave for tests: ``prepare`` (a per-claim error),
``prepare-rpc`` (the whole call fails), ``unprepare`` (a per-claim error on unprepare).
"""

from __future__ import annotations

import json
import os
import stat
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import grpc
import structlog
import yaml

from drivers.fakegpu.cluster import SlicePublisher, allocation
from nodeagent.pluginwatcher._generated import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from plugins.dra._generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)

log = structlog.get_logger("fakegpu")

DRIVER_NAME = "gpu.nodeagent.example"
CDI_KIND = "nodeagent.example/gpu"
CDI_VERSION = "0.6.0"
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
FailMode = Literal["none", "prepare", "prepare-rpc", "unprepare"]


@dataclass
class Call:
    method: Literal["NodePrepareResources", "NodeUnprepareResources"]
    claims: list[str]
    """``namespace/name`` of each claim in the request."""
    uids: list[str]


@dataclass
class FakeGpuDriver:
    registry_dir: Path
    plugin_dir: Path
    cdi_dir: Path
    driver_name: str = DRIVER_NAME
    devices: int = 4
    claims_dir: Path | None = None
    """Where ResourceClaim manifests (with status.allocation) are; without it, or for a claim not
    found there, a claim gets one device chosen from its UID."""
    services: Sequence[str] = SERVICES
    plugin_type: str = "DRAPlugin"
    """What it says it is at registration (tests of the watcher make it say something else)."""
    fail: FailMode = "none"
    calls: list[Call] = field(default_factory=list)
    registrations: list[tuple[bool, str]] = field(default_factory=list)
    """What the kubelet (nodeagent) answered to each registration: (registered, error)."""
    on_unprepare: Callable[[list[str]], Awaitable[None]] | None = None
    """Test hook: awaited with the claim UIDs at the start of each NodeUnprepareResources."""
    call_log: Path | None = None
    """Append each DRA call as a JSON line here (for tests that run the driver as a process)."""
    api: Any = None
    """Cluster mode (a lightkube AsyncClient, e.g. on the node's kubeconfig): publish a
    ResourceSlice for ``node_name`` and read claims' allocations from the API server."""
    node_name: str | None = None
    """The node this driver serves: the ResourceSlice's node and pool (default: the hostname)."""

    def record(self, call: Call) -> None:
        self.calls.append(call)
        if self.call_log is not None:
            with self.call_log.open("a") as f:
                f.write(json.dumps({"method": call.method, "claims": call.claims, "uids": call.uids}) + "\n")

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver_name}-reg.sock"

    @property
    def endpoint(self) -> Path:
        return self.plugin_dir / "dra.sock"

    def count(self, method: str, uid: str | None = None) -> int:
        return sum(1 for c in self.calls if c.method == method and (uid is None or uid in c.uids))

    def prepared(self) -> list[str]:
        """Claim UIDs with a CDI spec on disk (what is prepared now)."""
        prefix = _spec_prefix(CDI_KIND)
        return sorted(p.name[len(prefix):-len(".json")] for p in self.cdi_dir.glob(f"{prefix}*.json"))

    # --- running ----------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; the sockets are removed on the way out (as the kubeletplugin
        helper does), which is how the kubelet notices a plugin that stopped."""
        await anyio.to_thread.run_sync(self.set_up)
        dra_server = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_DraV1(self), dra_server)  # type: ignore[no-untyped-call]
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
            _DraV1beta1(self), dra_server)
        dra_server.add_insecure_port(f"unix:{self.endpoint}")
        registration = grpc.aio.server()
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            _Registration(self), registration)
        registration.add_insecure_port(f"unix:{self.registration_socket}")
        # DRA first: once the registration socket exists the kubelet may call right away.
        await dra_server.start()
        await registration.start()
        log.info("fake GPU driver serving", driver=self.driver_name, registration=str(self.registration_socket),
                 endpoint=str(self.endpoint), devices=self.devices)
        try:
            async with anyio.create_task_group() as tg:
                if self.api is not None:
                    # Not awaited: the Node may not be registered yet; the publisher retries.
                    tg.start_soon(SlicePublisher(self.api, self.driver_name, self.pool, self.devices).run)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await registration.stop(None)
                await dra_server.stop(None)
                self.registration_socket.unlink(missing_ok=True)
                self.endpoint.unlink(missing_ok=True)

    def set_up(self) -> None:
        """Its directories and device nodes (serve does this; the start floor calls it alone)."""
        for directory in (self.registry_dir, self.plugin_dir / "dev", self.plugin_dir / "claims", self.cdi_dir):
            directory.mkdir(parents=True, exist_ok=True)
        for path in (self.registration_socket, self.endpoint):
            path.unlink(missing_ok=True)  # a socket left by a killed process
        for index in range(self.devices):
            node = self.plugin_dir / "dev" / f"gpu{index}"
            if not node.exists():
                try:
                    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                except PermissionError:  # no CAP_MKNOD (rootless): hand out /dev/null itself
                    node.symlink_to("/dev/null")

    # --- DRA ------------------------------------------------------------------------------

    def prepare(self, namespace: str, uid: str, name: str,
                allocated: list[tuple[str, str]] | None = None) -> tuple[list[dict[str, Any]], str]:
        """(devices, error) for one claim; idempotent. ``allocated``: the (device, request) pairs
        read from the API server; None: from the claim manifests."""
        if self.fail == "prepare":
            return [], f"fake failure preparing {namespace}/{name} (fail mode {self.fail})"
        if allocated is None:
            allocated = self._allocation(namespace, name, uid)
        unknown = [d for d, _ in allocated if _device_index(d, self.devices) is None]
        if unknown:
            return [], f"devices {unknown} are not managed by driver {self.driver_name}"
        spec_devices = []
        answer = []
        for device, request in allocated:
            index = _device_index(device, self.devices)
            info = self.plugin_dir / "claims" / uid / device
            info.mkdir(parents=True, exist_ok=True)
            (info / "info").write_text(f"device={device}\nclaim={namespace}/{name}\nclaimUID={uid}\n")
            cdi_name = f"{uid}-{device}"
            spec_devices.append({"name": cdi_name, "containerEdits": {
                "env": [f"GPU_DEVICE_{index}={device}"],
                "deviceNodes": [{"path": f"/dev/fake{device}", "hostPath": str(self.plugin_dir / "dev" / device),
                                 "type": "c", "permissions": "rw"}],
                "mounts": [{"hostPath": str(info), "containerPath": f"/var/run/fakegpu/{device}",
                            "options": ["ro", "bind"]}],
            }})
            answer.append({"request_names": [request] if request else [], "pool_name": self.pool,
                           "device_name": device, "cdi_device_ids": [f"{CDI_KIND}={cdi_name}"]})
        spec = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": spec_devices,
                "containerEdits": {"env": [f"FAKE_GPU_CLAIM={namespace}/{name}"]}}
        _write_atomically(self.cdi_dir / f"{_spec_prefix(CDI_KIND)}{uid}.json", json.dumps(spec, indent=1))
        return answer, ""

    def unprepare(self, namespace: str, uid: str, name: str) -> str:
        if self.fail == "unprepare":
            return f"fake failure unpreparing {namespace}/{name} (fail mode {self.fail})"
        (self.cdi_dir / f"{_spec_prefix(CDI_KIND)}{uid}.json").unlink(missing_ok=True)
        claim_dir = self.plugin_dir / "claims" / uid
        if claim_dir.exists():
            for info in claim_dir.glob("*/info"):
                info.unlink()
            for device in claim_dir.iterdir():
                device.rmdir()
            claim_dir.rmdir()
        return ""

    @property
    def pool(self) -> str:
        return self.node_name or os.uname().nodename

    def _allocation(self, namespace: str, name: str, uid: str) -> list[tuple[str, str]]:
        """(device, request) pairs allocated to the claim for this driver."""
        if self.claims_dir is not None:
            for doc in _claim_documents(self.claims_dir):
                meta = doc.get("metadata") or {}
                if meta.get("name") == name and (meta.get("namespace") or "default") == namespace:
                    results = (((doc.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                        "results") or []
                    return [(r.get("device", ""), r.get("request", "")) for r in results
                            if r.get("driver") == self.driver_name]
        return [(f"gpu{zlib.crc32(uid.encode()) % self.devices}", "")]


def _device_index(device: str, count: int) -> int | None:
    if device.startswith("gpu") and device[3:].isdigit() and int(device[3:]) < count:
        return int(device[3:])
    return None


def _spec_prefix(kind: str) -> str:
    return kind.replace("/", "-") + "_"


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _claim_documents(directory: Path) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        try:
            docs += [d for d in yaml.safe_load_all(path.read_text())
                     if isinstance(d, dict) and d.get("kind") == "ResourceClaim"]
        except (OSError, yaml.YAMLError):
            continue
    return docs


# --- the gRPC services ------------------------------------------------------------------------


class _Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: FakeGpuDriver) -> None:
        self.driver = driver

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(type=self.driver.plugin_type, name=self.driver.driver_name,
                                                    endpoint=str(self.driver.endpoint),
                                                    supported_versions=list(self.driver.services))

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.driver.registrations.append((request.plugin_registered, request.error))
        if request.plugin_registered:
            log.info("registered with the node agent", driver=self.driver.driver_name)
        else:
            log.error("registration refused by the node agent", driver=self.driver.driver_name, error=request.error)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class _Dra:
    pb2: Any

    def __init__(self, driver: FakeGpuDriver) -> None:
        self.driver = driver

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        driver = self.driver
        driver.record(Call("NodePrepareResources", [f"{c.namespace}/{c.name}" for c in request.claims],
                           [c.uid for c in request.claims]))
        if driver.fail == "prepare-rpc":
            await context.abort(grpc.StatusCode.INTERNAL, "fake failure (fail mode prepare-rpc)")
        response = self.pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            allocated: list[tuple[str, str]] | None = None
            if driver.api is not None:
                allocated, error = await allocation(driver.api, claim.namespace, claim.name, claim.uid,
                                                    driver.driver_name, driver.pool)
                if error:
                    response.claims[claim.uid].error = error
                    continue
            devices, error = await anyio.to_thread.run_sync(driver.prepare, claim.namespace, claim.uid, claim.name,
                                                            allocated)
            entry = response.claims[claim.uid]
            entry.error = error
            for d in devices:
                entry.devices.add(**d)
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        driver = self.driver
        driver.record(Call("NodeUnprepareResources", [f"{c.namespace}/{c.name}" for c in request.claims],
                           [c.uid for c in request.claims]))
        if driver.on_unprepare is not None:
            await driver.on_unprepare([c.uid for c in request.claims])
        response = self.pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = await anyio.to_thread.run_sync(
                driver.unprepare, claim.namespace, claim.uid, claim.name)
        return response


class _DraV1(_Dra, dra_v1_pb2_grpc.DRAPluginServicer):
    pb2 = dra_v1_pb2


class _DraV1beta1(_Dra, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    pb2 = dra_v1beta1_pb2


__all__ = ["CDI_KIND", "DRIVER_NAME", "FakeGpuDriver"]
