"""cri.types against the schema, the generic converter, errors, endpoints."""

from __future__ import annotations

import ast
import dataclasses
import enum
import pickle
from pathlib import Path
from typing import Any

import grpc
import pytest

from cri import errors
from cri import types as t
from cri._generated import api_pb2 as api
from cri.client import grpc_target
from cri.convert import from_proto, to_proto

REPO = Path(__file__).resolve().parents[1]

# Dataclasses whose name differs from their message.
RENAMED = {"VersionInfo": "VersionResponse", "ExecSyncResult": "ExecSyncResponse",
           "ContainerEvent": "ContainerEventResponse"}
# Dataclasses that read part of a message on purpose (cheaper to convert on a hot path): every
# field of theirs is in the message; the message's others are skipped.
PARTIAL = {"ContainerEventSummary": "ContainerEventResponse", "PodSandboxIdentity": "PodSandboxStatus"}
# Messages with no dataclass on purpose: requests/responses the client unpacks,
# presence wrappers (unwrapped to `X | None`), KeyValue (envs is a dict),
# Windows-only messages, and the pieces of update_runtime_config / status
# that the client flattens.
UNEXPOSED_PREFIXES = ("Windows",)
UNEXPOSED = {"Int64Value", "UInt64Value", "PodSandboxStateValue", "ContainerStateValue", "KeyValue",
             "RuntimeConfig", "NetworkConfig", "PodSandboxStatusResponse"}


def dataclasses_in_types() -> dict[str, type]:
    return {name: obj for name, obj in vars(t).items()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == t.__name__}


def message_of(name: str) -> Any:
    return getattr(api, PARTIAL.get(name) or RENAMED.get(name, name))


@pytest.mark.parametrize("name", sorted(dataclasses_in_types()))
def test_dataclass_matches_its_message(name: str) -> None:
    cls = dataclasses_in_types()[name]
    descriptor = message_of(name).DESCRIPTOR
    assert dataclasses.fields(cls), name
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen and hasattr(cls, "__slots__"), f"{name} must be a frozen, slotted dataclass"
    ours = {f.name.replace("_", "").lower() for f in dataclasses.fields(cls)}
    theirs = {f.name.replace("_", "").lower(): f.name for f in descriptor.fields}
    assert ours <= set(theirs), f"{name}: fields the schema lacks: {ours - set(theirs)}"
    missing = {theirs[n] for n in set(theirs) - ours}
    if name not in PARTIAL:
        assert missing <= {"windows"}, f"{name}: schema fields without a dataclass field: {missing}"
    for f in dataclasses.fields(cls):
        assert f.name == f.name.lower(), f"{name}.{f.name} is not snake_case"


def test_every_message_reachable_from_the_client_has_a_dataclass() -> None:
    covered = {RENAMED.get(n, n) for n in dataclasses_in_types()}
    for name in api.DESCRIPTOR.message_types_by_name:
        if name.endswith(("Request", "Response")) or name.startswith(UNEXPOSED_PREFIXES) or name in UNEXPOSED:
            continue
        assert name in covered, f"no dataclass for message {name}"


def python_enums() -> dict[str, type[enum.IntEnum]]:
    return {name: obj for name, obj in vars(t).items()
            if isinstance(obj, type) and issubclass(obj, t.ProtoEnum) and obj is not t.ProtoEnum}


def test_enums_match_the_schema() -> None:
    schema: dict[str, Any] = dict(api.DESCRIPTOR.enum_types_by_name)
    schema["ProfileType"] = api.SecurityProfile.DESCRIPTOR.enum_types_by_name["ProfileType"]
    assert set(python_enums()) == set(schema)
    for name, cls in python_enums().items():
        assert [(m.name, m.value) for m in cls] == [(v.name, v.number) for v in schema[name].values], name


def test_unknown_enum_values_survive() -> None:
    status = from_proto(api.ContainerStatus(state=42), t.ContainerStatus)  # type: ignore[arg-type]
    assert status.state == 42 and status.state.name == "UNKNOWN_42"
    assert isinstance(status.state, t.ContainerState)


def full_container_config() -> t.ContainerConfig:
    resources = t.LinuxContainerResources(
        cpu_period=100000, cpu_quota=50000, cpu_shares=512, memory_limit_in_bytes=1 << 30, oom_score_adj=-997,
        cpuset_cpus="0-1", cpuset_mems="0", hugepage_limits=[t.HugepageLimit(page_size="2MB", limit=0)],
        unified={"memory.high": "1"}, memory_swap_limit_in_bytes=1 << 30)
    return t.ContainerConfig(
        metadata=t.ContainerMetadata(name="app", attempt=3),
        image=t.ImageSpec(image="sha256:abc", annotations={"a": "b"}, user_specified_image="busybox",
                          runtime_handler="crun", image_ref="sha256:abc"),
        command=["sh"], args=["-c", "true"], working_dir="/w",
        envs={"Z": "1", "A": "2"},
        mounts=[t.Mount(container_path="/data", host_path="/h", readonly=True, selinux_relabel=True,
                        propagation=t.MountPropagation.PROPAGATION_HOST_TO_CONTAINER,
                        uid_mappings=[t.IDMapping(host_id=1000, container_id=0, length=1)],
                        gid_mappings=[t.IDMapping(host_id=1000, container_id=0, length=1)],
                        recursive_read_only=True, image=t.ImageSpec(image="img"), image_sub_path="sub")],
        devices=[t.Device(container_path="/dev/x", host_path="/dev/y", permissions="rw")],
        labels={"l": "1"}, annotations={"an": "2"}, log_path="app/3.log",
        stdin=True, stdin_once=True, tty=True,
        linux=t.LinuxContainerConfig(
            resources=resources,
            security_context=t.LinuxContainerSecurityContext(
                capabilities=t.Capability(add_capabilities=["NET_ADMIN"], drop_capabilities=["ALL"],
                                          add_ambient_capabilities=["NET_RAW"]),
                privileged=True,
                namespace_options=t.NamespaceOption(
                    network=t.NamespaceMode.NODE, pid=t.NamespaceMode.TARGET, ipc=t.NamespaceMode.CONTAINER,
                    target_id="other", userns_options=t.UserNamespace(
                        mode=t.NamespaceMode.POD, uids=[t.IDMapping(host_id=1, length=2)])),
                selinux_options=t.SELinuxOption(user="u", role="r", type="t", level="s0"),
                run_as_user=0, run_as_group=0, run_as_username="", readonly_rootfs=True,
                supplemental_groups=[1, 2], supplemental_groups_policy=t.SupplementalGroupsPolicy.Strict,
                no_new_privs=True, masked_paths=["/proc/kcore"], readonly_paths=["/proc/sys"],
                seccomp=t.SecurityProfile(profile_type=t.ProfileType.Localhost, localhost_ref="/p.json"),
                apparmor=t.SecurityProfile(profile_type=t.ProfileType.Unconfined),
                apparmor_profile="x", seccomp_profile_path="y"),
        ),
        cdi_devices=[t.CDIDevice(name="vendor.com/gpu=0")],
        stop_signal=t.Signal.SIGRTMAX,
    )


def test_round_trip_through_the_wire() -> None:
    config = full_container_config()
    wire = to_proto(config, api.ContainerConfig).SerializeToString()
    parsed = api.ContainerConfig.FromString(wire)
    assert parsed.CDI_devices[0].name == "vendor.com/gpu=0"
    assert parsed.mounts[0].uidMappings[0].host_id == 1000
    assert from_proto(parsed, t.ContainerConfig) == config


def test_defaults_send_nothing_and_none_means_unset() -> None:
    assert to_proto(t.LinuxContainerConfig(), api.LinuxContainerConfig).SerializeToString() == b""
    # metadata is required by CRI: a plain field, always sent, never None.
    assert to_proto(t.ContainerConfig(), api.ContainerConfig) == api.ContainerConfig(metadata=api.ContainerMetadata())
    assert from_proto(api.Container(), t.Container).metadata == t.ContainerMetadata()
    context = to_proto(t.LinuxContainerSecurityContext(run_as_user=0), api.LinuxContainerSecurityContext)
    assert context.HasField("run_as_user") and not context.HasField("run_as_group")
    # An all-default nested message is still sent (presence matters, e.g. metadata).
    config = to_proto(t.PodSandboxConfig(metadata=t.PodSandboxMetadata()), api.PodSandboxConfig)
    assert config.HasField("metadata") and not config.HasField("linux")
    back = from_proto(config, t.PodSandboxConfig)
    assert back.metadata == t.PodSandboxMetadata() and back.linux is None


def test_state_filters_use_the_wrapper() -> None:
    empty = to_proto(t.ContainerFilter(), api.ContainerFilter)
    assert not empty.HasField("state")
    created = to_proto(t.ContainerFilter(state=t.ContainerState.CONTAINER_CREATED), api.ContainerFilter)
    assert created.HasField("state") and created.state.state == api.CONTAINER_CREATED


def test_stats_wrappers_unwrap() -> None:
    message = api.ContainerStats(cpu=api.CpuUsage(timestamp=5, usage_core_nano_seconds=api.UInt64Value(value=0)),
                                 memory=api.MemoryUsage(psi=api.PsiStats(Full=api.PsiData(Total=7, Avg10=0.5))))
    stats = from_proto(message, t.ContainerStats)
    assert stats.cpu == t.CpuUsage(timestamp=5, usage_core_nano_seconds=0, usage_nano_cores=None)
    assert stats.memory is not None and stats.memory.psi == t.PsiStats(full=t.PsiData(total=7, avg10=0.5))


# ------------------------------------------------------------------ errors and endpoints


def test_error_classes() -> None:
    assert errors.error_class(grpc.StatusCode.NOT_FOUND) is errors.NotFound
    assert errors.error_class(grpc.StatusCode.ABORTED) is errors.CriError
    retryable = {cls for cls in vars(errors).values()
                 if isinstance(cls, type) and issubclass(cls, errors.CriError) and cls.retryable}
    assert retryable == {errors.Unavailable, errors.DeadlineExceeded, errors.ResourceExhausted}
    error = errors.from_rpc_error("StartContainer", "unix:///x.sock", grpc.StatusCode.NOT_FOUND, "no such container")
    assert str(error) == "CRI StartContainer at unix:///x.sock failed: NOT_FOUND: no such container"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is errors.NotFound and str(copy) == str(error)


def test_unavailable_message_names_the_socket(tmp_path: Path) -> None:
    socket = tmp_path / "c.sock"
    error = errors.from_rpc_error("Version", f"unix://{socket}", grpc.StatusCode.UNAVAILABLE, "connection refused")
    assert str(error) == (f"CRI runtime at unix://{socket} is unavailable: connection refused "
                          f"(is containerd running? socket {socket} does not exist; in Version)")


def test_endpoints() -> None:
    assert grpc_target("unix:///run/containerd/containerd.sock") == "unix:///run/containerd/containerd.sock"
    assert grpc_target("/run/containerd/containerd.sock") == "unix:///run/containerd/containerd.sock"
    assert grpc_target("rel.sock").startswith("unix:///") and grpc_target("rel.sock").endswith("/rel.sock")
    with pytest.raises(ValueError):
        grpc_target("tcp://127.0.0.1:1")
    assert errors.socket_path("unix:///a/b.sock") == "/a/b.sock"


def test_nothing_outside_cri_imports_generated_code() -> None:
    offenders = []
    for path in REPO.rglob("*.py"):
        relative = path.relative_to(REPO)
        if relative.parts[0] in {"cri", ".git", "build"} or relative.name.startswith("test_cri"):
            continue
        if relative.parts[:2] == ("conformance", "memruntime"):
            continue  # the in-memory runtime is a CRI server: it serves the generated service itself
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.startswith(("cri._generated", "cri.convert")) for n in names):
                offenders.append(str(relative))
    assert offenders == []
