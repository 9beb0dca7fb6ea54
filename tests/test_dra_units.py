"""The parts of DRA that need no containerd: generated code, wire names, registration against
the fake driver, the checkpoint, CDI resolution, claims from manifests."""

from __future__ import annotations

import json
import shutil
import tempfile
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from cri import types as t
from drivers.fakegpu import DRIVER_NAME, FakeGpuDriver
from nodeagent.events import Event
from nodeagent.model import Pod
from nodeagent.objects import FileObjects, kinds
from nodeagent.pluginwatcher import PluginWatcher
from nodeagent.sources.static import ManifestError, parse_documents
from plugins.dra import api, codegen
from plugins.dra.cdi import CdiError, CdiSpecs
from plugins.dra.claimfetch import FetchedClaims
from plugins.dra.claims import ClaimNotReady, pod_claims
from plugins.dra.registration import DraRegistrations, Drivers
from plugins.dra.resourceclaim import ResourceClaim
from plugins.dra.state import CheckpointError, ClaimCache, ClaimEntry


@pytest.fixture
def short_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="dra-u-", dir="/tmp"))  # unix sockets: paths < 108 bytes
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- generated code and the wire ------------------------------------------------------------


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    fresh = codegen.generate(tmp_path)
    stale = [p.name for p in fresh if not (codegen.OUTPUT_DIR / p.name).exists()
             or (codegen.OUTPUT_DIR / p.name).read_bytes() != p.read_bytes()]
    assert stale == [], f"plugins/dra/_generated is stale ({', '.join(stale)}): run `python -m plugins.dra.codegen`"
    (tmp_path / "dra_v1_pb2.py").write_text("# edited\n")
    assert codegen.main(["--check", "--out", str(tmp_path)]) == 1


def test_the_registration_api_code_is_not_stale(tmp_path: Path) -> None:
    from nodeagent.pluginwatcher import codegen as registration_codegen

    assert registration_codegen.stale_files() == [], "run `python -m nodeagent.pluginwatcher.codegen`"


def test_wire_names_are_the_kubelets() -> None:
    from nodeagent.pluginwatcher._generated import pluginregistration_v1_pb2
    from plugins.dra._generated import dra_v1_pb2, dra_v1beta1_pb2

    assert pluginregistration_v1_pb2.DESCRIPTOR.services_by_name["Registration"].full_name == \
        "pluginregistration.Registration"
    for module, package in ((dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1"),
                            (dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1")):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"{package}.DRAPlugin"
        assert sorted(m.name for m in service.methods) == ["NodePrepareResources", "NodeUnprepareResources"]
        device = module.Device.DESCRIPTOR
        assert {f.name: f.number for f in device.fields if f.name != "share_id"} == {
            "request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
        assert {f.name: f.number for f in module.Claim.DESCRIPTOR.fields} == {"namespace": 1, "uid": 2, "name": 3}
    assert dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"].number == 5
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    info = pluginregistration_v1_pb2.PluginInfo.DESCRIPTOR
    assert {f.name: f.number for f in info.fields} == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}


# --- registration ---------------------------------------------------------------------------


@asynccontextmanager
async def watched(base: Path, **driver_options: Any) -> AsyncIterator[tuple[FakeGpuDriver, Drivers, list[Event]]]:
    events: list[Event] = []

    async def publish(event: Event) -> None:
        events.append(event)

    driver = FakeGpuDriver(registry_dir=base / "reg", plugin_dir=base / "plugin", cdi_dir=base / "cdi",
                           **driver_options)
    drivers = Drivers()
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        handler = DraRegistrations(drivers, publish)
        await tg.start(PluginWatcher(base / "reg", {handler.plugin_type: handler}, publish, poll_seconds=0.05).run)
        yield driver, drivers, events
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_v1beta1_only_driver_registers_and_is_spoken_to_in_v1beta1(short_dir: Path) -> None:
    async with watched(short_dir, services=["v1alpha4.DRAPlugin", "v1beta1.DRAPlugin"]) as (fake, drivers, events):
        driver = drivers.get(DRIVER_NAME)
        assert driver is not None and driver.service == "v1beta1.DRAPlugin"
        assert driver.endpoint == str(fake.endpoint) and fake.registrations == [(True, "")]
        answer = await driver.client.prepare([api.Claim("ns", "u1", "c")])
        [device] = answer["u1"].devices
        assert device.cdi_device_ids == ("nodeagent.example/gpu=u1-" + device.device_name,)
        assert await driver.client.unprepare([api.Claim("ns", "u1", "c")]) == {"u1": ""}
        assert [e.kind for e in events] == ["DraDriverRegistered"]


@pytest.mark.anyio
async def test_a_plugin_whose_services_we_do_not_speak_is_told_why(short_dir: Path) -> None:
    async with watched(short_dir, services=["v1alpha3.NodeService"]) as (fake, drivers, events):
        await _until(lambda: bool(fake.registrations))
        assert drivers.all() == []
        [(registered, error)] = fake.registrations[:1]
        assert not registered
        assert error == ("none of services supported by the plugin (['v1alpha3.NodeService']) are supported by "
                         "nodeagent (['v1.DRAPlugin', 'v1beta1.DRAPlugin'])")
        assert [e.kind for e in events][:1] == ["DraPluginRejected"]


@pytest.mark.anyio
async def test_socket_removal_deregisters_and_a_new_socket_registers_again(short_dir: Path) -> None:
    async with watched(short_dir) as (fake, drivers, events):
        fake.registration_socket.unlink()
        await _until(lambda: drivers.get(DRIVER_NAME) is None)
        assert events[-1].kind == "DraDriverDeregistered"
        # The plugin "restarts": a new registration socket at the same path.
        async with anyio.create_task_group() as tg:
            again = FakeGpuDriver(registry_dir=short_dir / "reg", plugin_dir=short_dir / "plugin2",
                                  cdi_dir=short_dir / "cdi")
            await tg.start(again.run)
            await _until(lambda: drivers.get(DRIVER_NAME) is not None)
            assert drivers.get(DRIVER_NAME).endpoint == str(again.endpoint)  # type: ignore[union-attr]
            await _until(lambda: bool(again.registrations))  # told right after the agent registered it
            assert again.registrations == [(True, "")]
            tg.cancel_scope.cancel()


async def _until(condition: Any, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


# --- the checkpoint -------------------------------------------------------------------------


def test_checkpoint_round_trip_in_the_kubelets_shape(tmp_path: Path) -> None:
    cache = ClaimCache(tmp_path / "dra_manager_state")
    cache.entries["u1"] = ClaimEntry("u1", "c", "ns", {"p1", "p2"}, {"gpu.example": [
        api.Device("pool", "gpu0", ("req",), ("example.com/gpu=0",))]}, prepared=True)
    cache.save()
    outer = json.loads(cache.path.read_text())
    assert outer["Checksum"] == zlib.crc32(outer["Data"].encode())
    data = json.loads(outer["Data"])
    assert (data["kind"], data["apiVersion"]) == ("DRACheckpoint", "checkpoint.dra.kubelet.k8s.io/v1")
    assert data["Entries"][0]["DriverState"]["gpu.example"]["Devices"][0]["CDIDeviceIDs"] == ["example.com/gpu=0"]
    again = ClaimCache(cache.path)
    again.load()
    entry = again.entries["u1"]
    assert (entry.pod_uids, entry.prepared, entry.restored) == ({"p1", "p2"}, True, True)
    assert entry.devices() == cache.entries["u1"].devices()
    assert [p.name for p in tmp_path.iterdir()] == ["dra_manager_state"], "temporary files left behind"

    cache.path.write_text(cache.path.read_text().replace("p1", "p9"))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        ClaimCache(cache.path).load()


# --- CDI ------------------------------------------------------------------------------------


def _spec(directory: Path, name: str, spec: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(spec))


def test_cdi_edits_become_cri_devices_mounts_and_env_and_the_rest_is_reported(tmp_path: Path) -> None:
    _spec(tmp_path / "etc", "a.json", {
        "cdiVersion": "0.6.0", "kind": "example.com/gpu",
        "containerEdits": {"env": ["SPEC=1"], "hooks": [{"hookName": "createContainer", "path": "/bin/hook"}]},
        "devices": [{"name": "0", "containerEdits": {
            "env": ["DEV=0"],
            "deviceNodes": [{"path": "/dev/gpu0", "hostPath": "/dev/null"}],
            "mounts": [{"hostPath": "/opt", "containerPath": "/opt/gpu", "options": ["ro", "rbind", "nosuid"]},
                       {"hostPath": "tmpfs", "containerPath": "/scratch", "type": "tmpfs"}]}}]})
    specs = CdiSpecs([tmp_path / "etc", tmp_path / "run"])
    specs.refresh()
    edits = specs.resolve(["example.com/gpu=0"])
    assert edits.envs == {"SPEC": "1", "DEV": "0"}
    assert edits.devices == [t.Device(container_path="/dev/gpu0", host_path="/dev/null", permissions="rwm")]
    assert edits.mounts == [t.Mount(container_path="/opt/gpu", host_path="/opt", readonly=True)]
    assert any("hook createContainer /bin/hook" in s for s in edits.skipped)
    assert any("/scratch of type tmpfs" in s for s in edits.skipped)
    assert any("options nosuid" in s for s in edits.skipped)

    # A later directory overrides; the same device twice in one directory is unusable.
    _spec(tmp_path / "run", "b.json", {"cdiVersion": "0.6.0", "kind": "example.com/gpu",
                                            "devices": [{"name": "0", "containerEdits": {"env": ["DEV=run"]}}]})
    specs.refresh()
    assert specs.resolve(["example.com/gpu=0"]).envs == {"DEV": "run"}  # and a.json's spec-wide edits are not used
    _spec(tmp_path / "run", "c.json", {"cdiVersion": "0.6.0", "kind": "example.com/gpu",
                                       "devices": [{"name": "0"}]})
    specs.refresh()
    with pytest.raises(CdiError, match="defined in several specs"):
        specs.resolve(["example.com/gpu=0"])
    with pytest.raises(CdiError, match="example.com/gpu=9 is in no CDI spec"):
        specs.resolve(["example.com/gpu=9"])
    with pytest.raises(CdiError, match="not a qualified CDI device name"):
        specs.resolve(["gpu0"])


def test_a_device_node_that_is_not_one_is_an_error(tmp_path: Path) -> None:
    _spec(tmp_path, "a.json", {"cdiVersion": "0.6.0", "kind": "example.com/gpu", "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": str(tmp_path)}]}}]})
    specs = CdiSpecs([tmp_path])
    specs.refresh()
    with pytest.raises(CdiError, match="is not a device node"):
        specs.resolve(["example.com/gpu=0"])


# --- claims from manifests ------------------------------------------------------------------

CLAIM = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
         "status": {"allocation": {"devices": {"results": [
             {"request": "gpu", "driver": "gpu.example", "pool": "p", "device": "gpu0"}]}}}}
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
    "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
    "containers": [{"name": "m", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]}}


def found(*claims: ResourceClaim) -> FetchedClaims:
    return FetchedClaims({c.key: c for c in claims})


def test_static_manifests_carry_resource_claims_beside_pods(tmp_path: Path) -> None:
    """Standalone, claims are documents beside the pods; the dra stage's check refuses one it
    cannot read when the file is read; cluster mode takes no object documents at all."""
    objects = FileObjects()
    objects.declare(kinds.RESOURCE_CLAIM, ResourceClaim.check)
    text = "\n---\n".join(json.dumps(d) for d in (CLAIM, POD))
    pods, documents = parse_documents(tmp_path / "f.yaml", text, "node1", 0.0, objects)
    assert [p["metadata"]["name"] for p in pods] == ["p-node1"]
    [(kind, document)] = documents
    claim = ResourceClaim.model_validate(document)
    assert kind == kinds.RESOURCE_CLAIM
    assert claim.metadata.namespace == "default" and len(claim.metadata.uid) == 32
    assert claim.drivers() == ["gpu.example"]
    with pytest.raises(ManifestError, match=r"f\.yaml: line 1, column \d+: status\.allocation\.devices\.results\[0\]\.driver"):
        parse_documents(tmp_path / "f.yaml", json.dumps({**CLAIM, "status": {"allocation": {"devices": {
            "results": [{"request": "gpu"}]}}}}), "node1", 0.0, objects)
    with pytest.raises(ManifestError, match="not supported in a static pod directory .accepted: v1 Pod; other "
                                            "objects come from the API server"):
        parse_documents(tmp_path / "f.yaml", text, "node1", 0.0)
    with pytest.raises(ManifestError, match=r"metadata\.namespace: Forbidden: not allowed on this type"):
        parse_documents(tmp_path / "f.yaml", json.dumps({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                         "metadata": {"name": "crun", "namespace": "x"},
                                                         "handler": "crun"}), "node1", 0.0, objects)


def test_container_claims_must_name_a_pod_claim() -> None:
    bad = json.loads(json.dumps(POD))
    bad["spec"]["containers"][0]["resources"]["claims"] = [{"name": "nope"}]
    with pytest.raises(ValidationError, match="resources.claims"):
        Pod.model_validate(bad)


def test_claims_must_be_allocated_and_reserved_for_the_pod() -> None:
    store = found()
    pod = Pod.model_validate({**POD, "metadata": {"name": "p-node1", "uid": "pod-uid"}})
    with pytest.raises(ClaimNotReady, match="failed to fetch ResourceClaim default/c: not found"):
        pod_claims(pod, store, "node1")
    unallocated = ResourceClaim.model_validate({**CLAIM, "status": {}, "metadata": {"name": "c", "uid": "cu"}})
    store = found(unallocated)
    with pytest.raises(ClaimNotReady, match="claim default/c: not allocated"):
        pod_claims(pod, store, "node1")
    other = {**CLAIM["status"], "reservedFor": [{"resource": "pods", "name": "someone-else"}]}  # type: ignore[dict-item]
    store = found(ResourceClaim.model_validate({**CLAIM, "status": other, "metadata": {"name": "c", "uid": "cu"}}))
    with pytest.raises(ClaimNotReady, match=r"pod p-node1 \(pod-uid\) is not allowed to use ResourceClaim default/c"):
        pod_claims(pod, store, "node1")
    mine = {**CLAIM["status"], "reservedFor": [{"resource": "pods", "name": "p"}]}  # type: ignore[dict-item]
    store = found(ResourceClaim.model_validate({**CLAIM, "status": mine, "metadata": {"name": "c", "uid": "cu"}}))
    assert [c.uid for c in pod_claims(pod, store, "node1")] == ["cu"]


def test_template_claims_are_found_through_the_pod_status() -> None:
    spec = {**POD["spec"], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tpl"}]}  # type: ignore[dict-item]
    pod = Pod.model_validate({**POD, "spec": spec})
    store = found(ResourceClaim.model_validate({**CLAIM, "metadata": {"name": "p-gpu-x1", "uid": "g"}}))
    with pytest.raises(ClaimNotReady, match="status.resourceClaimStatuses has no entry"):
        pod_claims(pod, store, "node1")
    made = pod.model_copy(update={"status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]}})
    assert [c.uid for c in pod_claims(made, store, "node1")] == ["g"]
    none_needed = pod.model_copy(update={"status": {"resourceClaimStatuses": [{"name": "gpu"}]}})
    assert pod_claims(none_needed, store, "node1") == []


def test_claims_from_the_api_follow_the_kubelets_strict_rules() -> None:
    """A pod from the API server: the claim must be reserved for the pod's UID (a name is not
    enough, nor is an empty reservedFor), and a claim made from a template must be the pod's."""
    pod = Pod.model_validate({**POD, "metadata": {"name": "p", "uid": "pod-uid"}})

    def claim(reserved: list[dict[str, str]], **meta: Any) -> FetchedClaims:
        status = {**CLAIM["status"], "reservedFor": reserved}  # type: ignore[dict-item]
        return found(ResourceClaim.model_validate({**CLAIM, "status": status,
                                                   "metadata": {"name": "c", "uid": "cu", **meta}}))

    for reserved in ([], [{"resource": "pods", "name": "p"}], [{"resource": "pods", "name": "p", "uid": "other"}]):
        with pytest.raises(ClaimNotReady, match=r"pod p \(pod-uid\) is not allowed to use ResourceClaim default/c"):
            pod_claims(pod, claim(reserved), "node1", from_api=True)
    store = claim([{"resource": "pods", "name": "p", "uid": "pod-uid"}])
    assert [c.uid for c in pod_claims(pod, store, "node1", from_api=True)] == ["cu"]

    spec = {**POD["spec"], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tpl"}]}  # type: ignore[dict-item]
    made = Pod.model_validate({**POD, "spec": spec, "metadata": {"name": "p", "uid": "pod-uid"},
                               "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c"}]}})
    with pytest.raises(ClaimNotReady, match=r"ResourceClaim default/c \(cu\) was not created for pod p \(pod-uid\)"):
        pod_claims(made, store, "node1", from_api=True)
    store = claim([{"resource": "pods", "name": "p", "uid": "pod-uid"}],
                  ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid",
                                    "controller": True}])
    assert [c.uid for c in pod_claims(made, store, "node1", from_api=True)] == ["cu"]


@pytest.mark.anyio
async def test_a_template_claim_missing_from_our_copy_of_the_pod_is_looked_up_in_its_status() -> None:
    """The API source publishes spec changes only: when the agent's copy of the pod does not name
    the claim made from a template, the pod's status is read again (and only then)."""
    from nodeagent.objects import FileObjects, kinds
    from plugins.dra.claimfetch import with_claim_statuses

    spec = {**POD["spec"], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tpl"}]}  # type: ignore[dict-item]
    pod = Pod.model_validate({**POD, "spec": spec, "metadata": {"name": "p", "uid": "pod-uid"}})
    reads: list[str] = []

    class Objects(FileObjects):  # the standalone store as the stand-in API, counting reads
        async def get(self, kind: Any, name: str, namespace: str | None = None, *,
                      max_age: float | None = None) -> Any:
            reads.append(f"{namespace}/{name}")
            return await super().get(kind, name, namespace, max_age=max_age)

    def api_pod(uid: str) -> dict[str, Any]:
        return {"metadata": {"name": "p", "namespace": "default", "uid": uid},
                "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}}

    api = Objects([kinds.POD])
    api.replace(kinds.POD, [api_pod("pod-uid")])
    updated = await with_claim_statuses(api, pod)
    assert reads == ["default/p"]
    assert updated.status["resourceClaimStatuses"] == [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]
    assert await with_claim_statuses(api, updated) is updated and reads == ["default/p"]  # named: no read
    api.replace(kinds.POD, [api_pod("someone-else")])  # re-created under the same name: not this pod's claims
    assert await with_claim_statuses(api, pod) is pod


@pytest.mark.anyio
async def test_a_plugin_of_a_type_no_stage_handles_is_refused_by_the_core_watcher(short_dir: Path) -> None:
    """The agent's one watcher hands plugins to the stage of their type; a CSI plugin on a node
    whose stages handle only DRA is told the kubelet's "no handler" message."""
    events: list[Event] = []

    async def publish(event: Event) -> None:
        events.append(event)

    driver = FakeGpuDriver(registry_dir=short_dir / "reg", plugin_dir=short_dir / "plugin", cdi_dir=short_dir / "cdi",
                           plugin_type="CSIPlugin")
    drivers = Drivers()
    handler = DraRegistrations(drivers, publish)
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        await tg.start(PluginWatcher(short_dir / "reg", {handler.plugin_type: handler}, publish, poll_seconds=0.05).run)
        await _until(lambda: bool(driver.registrations))
        tg.cancel_scope.cancel()
    [(registered, error)] = driver.registrations[:1]
    assert not registered and drivers.all() == []
    assert error == f"RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket " \
                    f"{driver.registration_socket}"
    assert [e.kind for e in events][:1] == ["PluginRejected"]
