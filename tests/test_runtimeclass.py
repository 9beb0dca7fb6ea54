"""RuntimeClass and user namespaces (issue 15 §3, §4) against the real containerd: a pod of a
class runs under that class's handler (crun, seen in crun's own state, not in ours), unknown
classes and handlers fail the sandbox with the kubelet's reasons, the class's overhead reaches
the pod cgroup and admission, its scheduling is respected; ``hostUsers: false`` gets a user
namespace of its own (its uid_map is not the host's) or, where the runtime cannot, the
kubelet's refusal."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from cri import types as t
from devenv.packages import CRUN
from devenv.runtime import CONTAINERD16
from nodeagent import hostpaths
from nodeagent import labels as L
from nodeagent.kube import resources, runtimeclass
from nodeagent.model import Pod
from nodeagent.objects.filestore import FileObjects
from nodeagent.sources.static import StaticPodSource
from nodeagent.validation import validate_pod_create
from plugins.runtime import podcgroup
from plugins.runtime.userns import IDS_PER_POD, RangeError, UserNamespaces, kubelet_range, unsupported_message
from tests.agent_helpers import BUSYBOX_IMAGE, AgentEnv, make_config, pod_manifest, running_agent, wait_for
from tests.test_apivolumes import cluster_node

pytestmark = pytest.mark.anyio


def runtime_class(name: str, handler: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
            "handler": handler, **spec}


def oci_listed(binary: str, root: Path) -> str:
    """What the OCI runtime itself has under its state root (the shim passes ROOT/k8s.io)."""
    return subprocess.run([binary, "--root", str(root / "k8s.io"), "list"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=False).stdout


async def sandbox_of(env: AgentEnv, name: str) -> t.PodSandbox:
    async def found() -> t.PodSandbox | None:
        for s in await env.client.list_pod_sandbox():
            if s.labels.get(L.POD_NAME) == f"{name}-{env.node}" and s.state == t.PodSandboxState.SANDBOX_READY:
                return s
        return None

    sandbox: t.PodSandbox = await wait_for(found, 45, f"the sandbox of {name}")
    return sandbox


async def waiting_on(env: AgentEnv, name: str, reason: str) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        for e in env.agent.trace.chain(f"default/{name}-{env.node}"):
            if e["kind"] == "PodWaiting" and e["reason"] == reason:
                return e
        return None

    event: dict[str, Any] = await wait_for(found, 45, f"{reason} for {name}")
    return event


async def exec_out(env: AgentEnv, container_id: str, *cmd: str) -> str:
    result = await env.client.exec_sync(container_id, list(cmd), timeout=10)
    assert result.exit_code == 0, (cmd, result)
    return result.stdout.decode().strip()


# --- the handler -----------------------------------------------------------------------------


async def test_a_pod_of_a_runtime_class_runs_under_its_handler(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("class.yaml", runtime_class("fast", "crun"))
        env.write("on-crun.yaml", pod_manifest("on-crun", runtimeClassName="fast"))
        env.write("on-runc.yaml", pod_manifest("on-runc"))
        crun_main = await env.wait_running("on-crun")
        runc_main = await env.wait_running("on-runc")
        crun_pod, runc_pod = await sandbox_of(env, "on-crun"), await sandbox_of(env, "on-runc")
        # containerd's record of the handler, then crun's own state: the sandbox and the
        # container are crun's, running, and unknown to runc (and the other way round).
        assert crun_pod.runtime_handler == "crun" and runc_pod.runtime_handler == ""
        crun_state = oci_listed(CRUN.probe, containerd.crun_root)
        runc_state = oci_listed(str(containerd.runtime.runc or "runc"), containerd.runc_root)
        assert crun_pod.id in crun_state and crun_pod.id not in runc_state
        assert any(line.startswith(crun_main.id) and " running " in line for line in crun_state.splitlines()), \
            crun_state
        assert crun_main.id not in runc_state
        assert runc_main.id in runc_state and runc_main.id not in crun_state
        # The pod's own status follows the runtime by up to a relist (it was still Pending once,
        # in a loaded CI run, right after containerd showed the container running).
        await env.wait_seen_running("on-crun")
        assert env.status_of("on-crun")["phase"] == "Running"


async def test_an_unknown_class_or_handler_fails_the_sandbox_as_the_kubelet_does(containerd: Any,
                                                                                tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("nope.yaml", pod_manifest("nope", runtimeClassName="nope"))
        env.write("class.yaml", runtime_class("ghost", "no-such-handler"))
        env.write("ghost.yaml", pod_manifest("ghost", runtimeClassName="ghost"))
        missing = await waiting_on(env, "nope", "FailedCreatePodSandBox")
        assert missing["message"] == 'Failed to create pod sandbox: runtimeclass.node.k8s.io "nope" not found'
        unknown = await waiting_on(env, "ghost", "FailedCreatePodSandBox")
        assert unknown["message"].startswith("Failed to create pod sandbox: rpc error: code = ")
        assert 'no runtime for "no-such-handler" is configured' in unknown["message"], unknown
        for name in ("nope", "ghost"):
            assert env.status_of(name)["phase"] == "Pending"  # retried, as the kubelet does
        sandboxes = [s for s in await env.client.list_pod_sandbox() if s.labels.get(L.MANAGED_BY) == env.node]
        assert not sandboxes
        # The class appears: the pod's next attempt finds it and runs (crun, the default here).
        env.write("nope-class.yaml", runtime_class("nope", "crun"))
        await env.wait_running("nope", timeout=60)
        assert (await sandbox_of(env, "nope")).runtime_handler == "crun"


# --- overhead and scheduling -----------------------------------------------------------------


async def test_the_class_overhead_reaches_the_pod_cgroup(containerd: Any, tmp_path: Path) -> None:
    limits = {"limits": {"cpu": "200m", "memory": "64Mi"}, "requests": {"cpu": "200m", "memory": "64Mi"}}
    async with running_agent(containerd, tmp_path) as env:
        env.write("class.yaml", runtime_class("heavy", "runc", overhead={"podFixed": {"cpu": "100m",
                                                                                      "memory": "32Mi"}}))
        env.write("heavy.yaml", pod_manifest("heavy", runtimeClassName="heavy", container={"resources": limits}))
        main = await env.wait_running("heavy")
        # The static source applied the API server's RuntimeClass admission: spec.overhead.
        uid = env.uid_of("heavy")
        assert uid is not None
        # cgroup v1: the container's memory cgroup is <pod cgroup>/<container>; the pod's is its
        # parent, with the containers' limits plus the overhead (the kubelet's ResourceConfigForPod).
        line = next(ln for ln in (await exec_out(env, main.id, "cat", "/proc/self/cgroup")).splitlines()
                    if ln.split(":")[1] == "memory")
        pod_cgroup = Path("/sys/fs/cgroup/memory") / line.split(":", 2)[2].lstrip("/")
        pod_cgroup = pod_cgroup.parent
        assert pod_cgroup.name == f"pod{uid}"
        assert int((pod_cgroup / "memory.limit_in_bytes").read_text()) == (64 + 32) * 2**20
        cpu = Path("/sys/fs/cgroup/cpu") / pod_cgroup.relative_to("/sys/fs/cgroup/memory")
        assert int((cpu / "cpu.cfs_quota_us").read_text()) == 30000  # 300m of a 100 ms period


async def test_the_class_scheduling_is_respected_and_its_conflicts_refused(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("classes.yaml", runtime_class("elsewhere", "runc", scheduling={
            "nodeSelector": {"example.com/pool": "gpu"}}))
        env.write("away.yaml", pod_manifest("away", runtimeClassName="elsewhere"))

        async def rejected() -> dict[str, Any] | None:
            status = env.status_of("away")
            return status if status.get("phase") == "Failed" else None

        status = await wait_for(rejected, 30, "the pod refused by the class's nodeSelector")
        assert status["reason"] == "NodeAffinity"
        before = env.agent.metrics.counters.get("ManifestRejected", 0)
        env.write("conflict.yaml", pod_manifest("conflict", runtimeClassName="elsewhere",
                                                nodeSelector={"example.com/pool": "cpu"}))

        async def refused() -> bool:
            return env.agent.metrics.counters.get("ManifestRejected", 0) > before

        await wait_for(refused, 30, "the conflicting pod's manifest rejected")
        assert env.uid_of("conflict") is None


def test_the_runtime_class_admission_of_static_pods() -> None:
    """The API server's RuntimeClass admission, as the static source applies it."""
    pod = {"metadata": {"name": "p"}, "spec": {"runtimeClassName": "c", "nodeSelector": {"a": "1"},
                                               "tolerations": [{"key": "k", "operator": "Exists"}],
                                               "containers": [{"name": "m", "image": "i"}]}}
    rc = runtime_class("c", "crun", overhead={"podFixed": {"cpu": "250m"}},
                       scheduling={"nodeSelector": {"b": "2"}, "tolerations": [{"key": "t", "operator": "Exists"}]})
    admitted = runtimeclass.admit(pod, rc)
    assert admitted["spec"]["overhead"] == {"cpu": "250m"}
    assert admitted["spec"]["nodeSelector"] == {"a": "1", "b": "2"}
    assert [x["key"] for x in admitted["spec"]["tolerations"]] == ["k", "t"]
    assert "overhead" not in pod["spec"]  # the input is not changed
    same = runtimeclass.admit({**pod, "spec": {**pod["spec"], "overhead": {"cpu": "0.25"}}}, rc)
    assert same["spec"]["overhead"] == {"cpu": "250m"}
    with pytest.raises(runtimeclass.RuntimeClassRejected, match="^pod rejected: Pod's Overhead doesn't match"):
        runtimeclass.admit({**pod, "spec": {**pod["spec"], "overhead": {"cpu": "1"}}}, rc)
    with pytest.raises(runtimeclass.RuntimeClassRejected, match="^pod rejected: Pod Overhead set without"):
        runtimeclass.admit({**pod, "spec": {**pod["spec"], "overhead": {"cpu": "1"}}}, runtime_class("c", "crun"))
    conflict = r"^conflict: runtimeClass.scheduling.nodeSelector\[a\] = 9; pod.spec.nodeSelector\[a\] = 1$"
    with pytest.raises(runtimeclass.RuntimeClassRejected, match=conflict):
        runtimeclass.admit(pod, runtime_class("c", "crun", scheduling={"nodeSelector": {"a": "9"}}))
    with pytest.raises(ValueError, match="handler"):
        runtimeclass.check(runtime_class("c", "Not_A_Label"))


def test_overhead_counts_in_admission_requests_and_pod_limits() -> None:
    spec = {"overhead": {"cpu": "100m", "memory": "32Mi"},
            "containers": [{"name": "m", "image": "i",
                            "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}}}]}
    pod = Pod.model_validate({"metadata": {"name": "p"}, "spec": spec})
    assert resources.pod_requests(pod) == {"cpu": 300, "memory": 96 * 2**20}
    values = podcgroup.pod_values(pod)
    assert values.memory_limit == 0 and values.cpu_limit == 0  # no limit stays no limit


# --- user namespaces -------------------------------------------------------------------------


async def _userns_supported(env: AgentEnv, handler: str) -> str | None:
    return unsupported_message(handler, await env.client.capabilities())


def _sample(env: AgentEnv, name: str) -> float:
    """One unlabelled series of the agent's /metrics text."""
    for line in env.agent.metrics.render().splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


async def test_host_users_false_gets_its_own_user_namespace_or_the_kubelets_refusal(containerd: Any,
                                                                                   tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("isolated.yaml", pod_manifest(
            "isolated", "touch /data/made-inside && exec sleep 3600", hostUsers=False,
            volumes=[{"name": "data", "emptyDir": {}}],
            container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]}))
        env.write("shared.yaml", pod_manifest("shared", hostUsers=True))
        shared = await env.wait_running("shared")
        host_map = await exec_out(env, shared.id, "cat", "/proc/self/uid_map")
        assert host_map.split() == ["0", "0", "4294967295"]  # the host's user namespace
        why = await _userns_supported(env, "")
        if containerd.runtime.name == CONTAINERD16:
            # containerd 1.6 reports no runtime handlers: it would run the pod in the host's
            # user namespace, so the pod is refused, with the kubelet's message.
            assert why == "can't set `spec.hostUsers: false`, runtime does not support user namespaces"
            event = await waiting_on(env, "isolated", "FailedCreatePodSandBox")
            assert event["message"] == f"Failed to create pod sandbox: {why}"
            # The kubelet's counters: each attempt started, each failed.
            assert _sample(env, "kubelet_started_user_namespaced_pods_total") >= 1
            assert _sample(env, "kubelet_started_user_namespaced_pods_errors_total") == \
                _sample(env, "kubelet_started_user_namespaced_pods_total")
            return
        assert why is None  # containerd 2.x with our runc 1.5: idmapped mounts
        isolated = await env.wait_running("isolated", timeout=60)
        # The kubelet's counters (the upstream UserNamespacesSupport metrics test reads them):
        # the shared pod is no user-namespaced pod; the isolated one started without error.
        assert _sample(env, "kubelet_started_pods_total") == 2
        assert _sample(env, "kubelet_started_user_namespaced_pods_total") == 1
        assert _sample(env, "kubelet_started_user_namespaced_pods_errors_total") == 0
        uid = env.uid_of("isolated")
        assert uid is not None
        # The runtime's own view: inside, root is a host ID of the pod's 65536-ID slot.
        fields = (await exec_out(env, isolated.id, "cat", "/proc/self/uid_map")).split()
        gid_fields = (await exec_out(env, isolated.id, "cat", "/proc/self/gid_map")).split()
        assert fields[0] == "0" and fields[2] == str(IDS_PER_POD) and int(fields[1]) >= IDS_PER_POD
        assert gid_fields == fields
        assert await exec_out(env, isolated.id, "id", "-u") == "0"
        # Volumes are idmapped mounts (the runtime's job): what the pod's root wrote is owned by
        # root on the host, not by the host ID the pod's root is.
        made = hostpaths.volume_dir(hostpaths.pod_dir(env.config.root_dir, uid), "kubernetes.io~empty-dir",
                                    "data") / "made-inside"
        assert made.stat().st_uid == 0 and made.stat().st_gid == 0
        # The allocation is the kubelet's file in the pod directory.
        mapping = json.loads((hostpaths.pod_dir(env.config.root_dir, uid) / "userns").read_text())
        assert mapping == {"uidMappings": [{"hostId": int(fields[1]), "containerId": 0, "length": IDS_PER_POD}],
                           "gidMappings": [{"hostId": int(fields[1]), "containerId": 0, "length": IDS_PER_POD}]}
        # The pod goes: its slot is released (file gone), the next pod may take it.
        env.remove("isolated.yaml")

        async def released() -> bool:
            return not (hostpaths.pod_dir(env.config.root_dir, uid) / "userns").exists()

        await wait_for(released, 45, "the user namespace released")
        # A user-namespaced pod whose container cannot start counts as an error (the kubelet
        # counts every failure of the sync pass that created the sandbox).
        env.write("bogus.yaml", pod_manifest("bogus", hostUsers=False, container={"command": ["bogus"]}))

        async def start_failed() -> bool:
            return any(e["kind"] == "ContainerFailed" and e["reason"] == "RunContainerError"
                       for e in env.agent.trace.chain(f"default/bogus-{env.node}"))

        await wait_for(start_failed, 45, "bogus's container failed to start")
        assert _sample(env, "kubelet_started_user_namespaced_pods_total") == 2
        assert _sample(env, "kubelet_started_user_namespaced_pods_errors_total") == 1


async def test_a_handler_without_user_namespaces_refuses_the_pod(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("class.yaml", runtime_class("fast", "crun"))
        env.write("p.yaml", pod_manifest("p", runtimeClassName="fast", hostUsers=False))
        event = await waiting_on(env, "p", "FailedCreatePodSandBox")
        # 1.6 reports no handlers; on 2.x crun 1.8.1 (Debian) predates crun's idmapped mounts (1.9)
        why = 'can\'t set `spec.hostUsers: false`, RuntimeClass handler "crun" does not support user namespaces'
        assert event["message"] == f"Failed to create pod sandbox: {why}"
        assert env.status_of("p")["phase"] == "Pending"
        assert not [s for s in await env.client.list_pod_sandbox() if s.labels.get(L.MANAGED_BY) == env.node]


def test_the_id_allocator_follows_the_kubelet(tmp_path: Path) -> None:
    """65536 IDs per pod from 65536 on, first free slot, persisted and read back after a
    restart, released when the pod goes, and a full range refused with the kubelet's text."""
    ids = UserNamespaces(tmp_path)
    assert ids.allocate("a") == 65536 and ids.allocate("b") == 2 * 65536 and ids.allocate("a") == 65536
    again = UserNamespaces(tmp_path)  # a restarted agent
    assert again.allocate("c") == 3 * 65536  # a and b are taken, from their files
    again.release("a")
    assert not (tmp_path / "pods" / "a" / "userns").exists()
    assert again.allocate("d") == 65536
    small = UserNamespaces(tmp_path / "small", length=2 * IDS_PER_POD)
    small.allocate("x"), small.allocate("y")
    with pytest.raises(ValueError, match="^could not find an empty slot to allocate a user namespace$"):
        small.allocate("z")


def test_the_node_range_is_the_kubelet_user_s_subordinate_ids(tmp_path: Path) -> None:
    """getKubeletMappings and the manager's checks: the ``kubelet`` OS user's subordinate range
    from getsubids when both exist (here the user is root, which exists, and getsubids is a
    test double: a script printing what shadow-utils' tool prints), else every ID from
    idsPerPod up; a range the kubelet would not start with is refused with its words."""
    def tool(uids: str, gids: str | None = None) -> str:
        script = tmp_path / f"getsubids-{uuid.uuid4().hex[:6]}"
        script.write_text(f'#!/bin/sh\nif [ "$1" = -g ]; then echo "{gids or uids}"; else echo "{uids}"; fi\n')
        script.chmod(0o755)
        return str(script)

    assert kubelet_range(IDS_PER_POD, 110, user="no-such-user-here") == (65536, (1 << 32) - 65536)
    assert kubelet_range(IDS_PER_POD, 110, user="root", getsubids=None) == (65536, (1 << 32) - 65536)
    assert kubelet_range(IDS_PER_POD, 110, user="root", getsubids=str(tmp_path / "missing")) == \
        (65536, (1 << 32) - 65536)
    assert kubelet_range(IDS_PER_POD, 110, user="root",
                         getsubids=tool(f"0: root 65536 {110 * 65536}")) == (65536, 110 * 65536)
    assert kubelet_range(2 * IDS_PER_POD, 2, user="root",
                         getsubids=tool("0: root 131072 262144")) == (131072, 262144)
    refusals = {
        tool("0: root 65536 65536", "0: root 131072 65536"): "mismatched subuids and subgids for user 'root'",
        tool("0: root 65536 100000"): "kubelet user assigned IDs length 100000 is not a multiple of 65536",
        tool("0: root 65537 65536"): "kubelet user assigned ID 65537 is not a multiple of 65536",
        tool("0: root 0 655360"): "kubelet user assigned ID 0 must be greater or equal to 65536",
        tool("0: root 65536 655360"): "kubelet user assigned IDs are not enough to support 110 pods",
        tool("0: root 65536"): "invalid line",
    }
    for script, why in refusals.items():
        with pytest.raises(RangeError, match=why):
            kubelet_range(IDS_PER_POD, 110, user="root", getsubids=script)
    # The default range with an idsPerPod that does not divide it: the kubelet stops there too.
    with pytest.raises(RangeError, match="is not a multiple of 196608"):
        kubelet_range(3 * IDS_PER_POD, 110, user="no-such-user-here")


async def test_ids_per_pod_is_honoured_and_an_unusable_range_refuses_only_user_namespaced_pods(
        containerd: Any, tmp_path: Path) -> None:
    """userNamespaces.idsPerPod: each pod gets that many IDs (the runtime's uid_map says so); a
    value the node's range cannot hold refuses the pods that need it, with the kubelet's
    reason, while other pods run."""
    if containerd.runtime.name == CONTAINERD16:
        pytest.skip("containerd 1.6 runs no user-namespaced pod (the refusal is tested above)")
    async with running_agent(containerd, tmp_path / "a", user_namespaces={"idsPerPod": 2 * IDS_PER_POD}) as env:
        env.write("wide.yaml", pod_manifest("wide", hostUsers=False))
        wide = await env.wait_running("wide", timeout=60)
        fields = (await exec_out(env, wide.id, "cat", "/proc/self/uid_map")).split()
        assert fields[0] == "0" and fields[2] == str(2 * IDS_PER_POD) and int(fields[1]) % (2 * IDS_PER_POD) == 0
    async with running_agent(containerd, tmp_path / "b", user_namespaces={"idsPerPod": 3 * IDS_PER_POD}) as env:
        env.write("isolated.yaml", pod_manifest("isolated", hostUsers=False))
        env.write("shared.yaml", pod_manifest("shared"))
        await env.wait_running("shared")
        event = await waiting_on(env, "isolated", "FailedCreatePodSandBox")
        assert event["message"] == ("Failed to create pod sandbox: kubelet user assigned IDs length "
                                    f"{(1 << 32) - 3 * IDS_PER_POD} is not a multiple of {3 * IDS_PER_POD}")


def test_the_refusals_name_the_handler() -> None:
    none = t.RuntimeCapabilities([], None)
    yes = t.RuntimeHandlerFeatures(user_namespaces=True)
    caps = t.RuntimeCapabilities([t.RuntimeHandler(name="", features=yes),
                                  t.RuntimeHandler(name="crun", features=t.RuntimeHandlerFeatures())], None)
    prefix = "can't set `spec.hostUsers: false`, "
    assert unsupported_message("", none) == prefix + "runtime does not support user namespaces"
    assert unsupported_message("crun", none) == prefix + 'RuntimeClass handler "crun" does not support user namespaces'
    assert unsupported_message("", t.RuntimeCapabilities(caps.runtime_handlers[1:], None)) == (
        prefix + 'runtime does not support user namespaces: the handler "" is not known')
    assert unsupported_message("", caps) is None
    assert unsupported_message("crun", caps) == prefix + 'RuntimeClass handler "crun" does not support user namespaces'
    assert unsupported_message("kata", caps) == (prefix + 'RuntimeClass handler "kata" does not support user '
                                                 'namespaces: the handler "kata" is not known')


async def test_static_source_applies_the_class_once(tmp_path: Path) -> None:
    """A static pod is admitted by its class when it first appears; a refused one is reported once."""
    published: list[Any] = []

    async def publish(event: Any) -> None:
        published.append(event)

    objects = FileObjects()
    source = StaticPodSource(tmp_path, "n", publish, objects=objects)
    (tmp_path / "c.json").write_text(json.dumps(runtime_class("c", "crun", overhead={"podFixed": {"cpu": "1"}})))
    (tmp_path / "p.json").write_text(json.dumps(pod_manifest("p", runtimeClassName="c")))
    (tmp_path / "q.json").write_text(json.dumps(pod_manifest("q", runtimeClassName="c", overhead={"cpu": "2"})))
    await source.scan()
    observed = [e for e in published if e.kind == "PodSpecObserved"]
    rejected = [e for e in published if e.kind == "ManifestRejected"]
    assert [e.pod.name for e in observed] == ["p-n"] and observed[0].pod_spec["spec"]["overhead"] == {"cpu": "1"}
    assert len(rejected) == 1 and rejected[0].reason == "Forbidden"
    assert rejected[0].message.endswith("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead")
    (tmp_path / "other.json").write_text(json.dumps(pod_manifest("other")))
    await source.scan()
    assert len([e for e in published if e.kind == "ManifestRejected"]) == 1


def test_validation_reads_host_users_where_v1_has_it() -> None:
    """spec.hostUsers (v1 keeps it in the spec): false forbids the host namespaces and allows an
    Unmasked procMount, as the API server's validation says."""
    def errors(**spec: Any) -> list[str]:
        doc = pod_manifest("p", **spec)
        doc["metadata"]["namespace"] = "default"
        return [str(e) for e in validate_pod_create(doc)]

    assert any("spec.hostNetwork" in e and "when `pod.Spec.HostUsers` is false" in e
               for e in errors(hostUsers=False, hostNetwork=True))
    assert not errors(hostUsers=False)
    unmasked = {"securityContext": {"procMount": "Unmasked"}}
    assert not errors(hostUsers=False, container=unmasked)
    assert any("`hostUsers` must be false to use `Unmasked`" in e for e in errors(container=unmasked))


async def test_cluster_mode_reads_the_class_from_the_api(containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    """With an API server: the class is the API's (read with the node's credentials), its
    overhead is the API server's admission's doing (spec.overhead), and the pod runs under crun."""
    async with cluster_node(containerd, control_plane, tmp_path) as node:
        name = f"crun-{node.name}"
        await node.create(runtime_class(name, "crun", overhead={"podFixed": {"memory": "16Mi"}}))
        try:
            pod = await node.run_pod(f"rc-{node.name}", {"name": "main", "image": BUSYBOX_IMAGE,
                                                         "command": ["sleep", "3600"]}, runtimeClassName=name)
            assert pod["spec"]["overhead"] == {"memory": "16Mi"}  # the API server's RuntimeClass admission
            uid = pod["metadata"]["uid"]
            main = await wait_for(lambda: node.running(uid, "main"), 60, "the pod's container running")
            sandboxes = await node.env.client.list_pod_sandbox(t.PodSandboxFilter(label_selector={L.POD_UID: uid}))
            assert [s.runtime_handler for s in sandboxes] == ["crun"]
            assert main in oci_listed(CRUN.probe, containerd.crun_root)
        finally:
            await node.kubectl("delete", "pods", "-A", "--field-selector", f"spec.nodeName={node.name}",
                               "--wait=false", check=False)
            await node.env.wait_empty(60)
            await node.kubectl("delete", "runtimeclass", name, "--wait=false", check=False)


async def test_a_restarted_agent_adopts_a_pod_whose_class_is_gone(containerd: Any, tmp_path: Path) -> None:
    """The running sandbox keeps its handler: a restart does not fail the pod for a class deleted
    meanwhile (the kubelet looks the class up only to create a sandbox)."""
    config = make_config(tmp_path, containerd.endpoint)
    async with running_agent(containerd, tmp_path, config=config, cleanup=False) as env:
        env.write("class.yaml", runtime_class("fast", "crun"))
        env.write("p.yaml", pod_manifest("p", runtimeClassName="fast"))
        first = await env.wait_running("p")
        sandbox = await sandbox_of(env, "p")
    (config.static_pod_path / "class.yaml").unlink()  # type: ignore[operator]
    async with running_agent(containerd, tmp_path, config=config) as env:
        await env.wait_seen_running("p")
        assert (await sandbox_of(env, "p")).id == sandbox.id
        assert [c.id for c in await env.running_containers("p")] == [first.id]
        assert not [e for e in env.agent.trace.chain(f"default/p-{env.node}") if e["kind"] == "PodWaiting"]


async def test_cluster_mode_an_unconfigured_handler_fails_the_sandbox_with_its_event(
        containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    """The upstream [Feature:RuntimeHandler] test: a class whose handler the runtime does not
    have leaves the pod Pending with a FailedCreatePodSandBox Event that names the handler."""
    async with cluster_node(containerd, control_plane, tmp_path) as node:
        name = f"unconfigured-{node.name}"
        await node.create(runtime_class(name, f"{name}-handler"))
        try:
            pod = await node.run_pod(f"rc-{node.name}", {"name": "main", "image": BUSYBOX_IMAGE,
                                                         "command": ["true"]},
                                     runtimeClassName=name, restartPolicy="Never")
            uid = pod["metadata"]["uid"]

            async def failed() -> list[dict[str, Any]]:
                return [e for e in await node.events(uid, "FailedCreatePodSandBox")
                        if f"{name}-handler" in e.get("message", "")]

            events = await wait_for(failed, 60, "a FailedCreatePodSandBox Event naming the handler")
            assert events[0]["type"] == "Warning", events
            phase = json.loads(await node.kubectl("get", "pod", pod["metadata"]["name"], "-o", "json"))
            assert phase["status"]["phase"] == "Pending"
        finally:
            await node.kubectl("delete", "pods", "-A", "--field-selector", f"spec.nodeName={node.name}",
                               "--wait=false", check=False)
            await node.env.wait_empty(60)
            await node.kubectl("delete", "runtimeclass", name, "--wait=false", check=False)
