"""The volumes stage on the real containerd: emptyDir (disk and Memory), hostPath with its type
checks, downwardAPI files, volumeMounts (subPath, readOnly), and cleanup after the pod."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest

from conformance.contract import StageContract
from conformance.fakecontext import FakePodContext
from nodeagent.clock import ManualClock
from nodeagent.model import EmptyDirVolumeSource, HostPathVolumeSource, Pod
from nodeagent.mounttable import mounts_under
from nodeagent.volumeutil import SetupError, atomicwriter, ownership, tmpfs
from plugins.volumes import VolumesStage, sources
from tests.agent_helpers import AgentEnv, running_agent, wait_for
from tests.manifest_fuzz import watching_logs
from tests.test_pod_spec import container, output, pod, run_in

pytestmark = pytest.mark.anyio


def volume_dir(env: AgentEnv, name: str, plugin: str, volume: str) -> Path:
    return env.config.root_dir / "pods" / str(env.uid_of(name)) / "volumes" / f"kubernetes.io~{plugin}" / volume


async def _absent(path: Path) -> bool:
    return not path.exists()


async def test_empty_dir_shared_memory_backed_sub_path_and_removed_after_pod(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("e.yaml", pod(
            "share",
            container("writer", "echo hello from the writer > /data/shared.txt; mkdir -p /data/sub; "
                                "echo in-sub > /data/sub/file; echo mine > /by-name/own; exec sleep 3600",
                      env=[{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                      volumeMounts=[{"name": "scratch", "mountPath": "/data"},
                                    {"name": "scratch", "mountPath": "/by-name", "subPathExpr": "$(POD_NAME)"}]),
            container("reader", volumeMounts=[{"name": "scratch", "mountPath": "/shared", "readOnly": True},
                                              {"name": "scratch", "mountPath": "/only-sub", "subPath": "sub"},
                                              {"name": "mem", "mountPath": "/mem"}]),
            volumes=[{"name": "scratch", "emptyDir": {}},
                     {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "10Mi"}},
                     {"name": "config", "configMap": {"name": "nope"}}],
        ))
        scratch = await wait_for(lambda: _exists(volume_dir(env, "share", "empty-dir", "scratch")), 30,
                                 "the emptyDir directory")
        assert stat.S_IMODE(scratch.stat().st_mode) == 0o777  # any container user may write

        async def shared() -> str | None:
            code, out = await run_in(env, "share", "reader", "cat", "/shared/shared.txt")
            return out if code == 0 else None

        assert await wait_for(shared, 30, "the writer's file seen by the reader") == "hello from the writer"
        assert await output(env, "share", "reader", "cat", "/only-sub/file") == "in-sub"
        assert (await run_in(env, "share", "reader", "touch", "/shared/x"))[0] != 0  # readOnly
        assert (await run_in(env, "share", "reader", "touch", "/only-sub/x"))[0] == 0
        # subPathExpr expands against the container's env (the downward API included).
        assert await output(env, "share", "reader", "cat", f"/shared/share-{env.node}/own") == "mine"

        # medium Memory: a tmpfs of sizeLimit (EmptyDir "memory backed volumes of specified size").
        mounts = await output(env, "share", "reader", "cat", "/proc/mounts")
        assert any(line.split()[1] == "/mem" and line.split()[2] == "tmpfs" for line in mounts.splitlines())
        df = await output(env, "share", "reader", "df", "-k", "/mem")
        assert df.splitlines()[-1].split()[1] == "10240"
        mem = volume_dir(env, "share", "empty-dir", "mem")
        assert mounts_under(mem) == [mem.resolve()]

        # The configMap volume is not implemented: reported, and its (absent) mount skipped.
        conditions = {c["type"]: c for c in env.status_of("share")["conditions"]}
        assert "spec.volumes[2].configMap" in conditions["nodeagent.io/UnhonouredFields"]["message"]

        volumes = scratch.parent.parent
        env.remove("e.yaml")
        await wait_for(lambda: _absent(volumes), 30, "the pod's volume directories removed")
        assert not mounts_under(volumes), "the tmpfs must be unmounted"


async def _exists(path: Path) -> Path | None:
    return path if path.exists() else None


async def test_host_path_type_check_fails_then_succeeds(containerd: Any, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "file").write_text("from the host\n")
    (host / "hosts").write_text("10.9.8.7 custom\n")
    wanted = host / "later"
    with watching_logs() as watch:
        async with running_agent(containerd, tmp_path) as env:
            env.write("h.yaml", pod(
                "hostpath",
                container("main", volumeMounts=[
                    {"name": "later", "mountPath": "/later"},
                    {"name": "made", "mountPath": "/made"},
                    {"name": "touched", "mountPath": "/touched"},
                    {"name": "file", "mountPath": "/file", "readOnly": True},
                    {"name": "untyped", "mountPath": "/untyped"},
                    {"name": "hosts", "mountPath": "/etc/hosts"},
                ]),
                volumes=[{"name": "later", "hostPath": {"path": str(wanted), "type": "Directory"}},
                         {"name": "made", "hostPath": {"path": str(host / "made" / "deep"), "type": "DirectoryOrCreate"}},
                         {"name": "touched", "hostPath": {"path": str(host / "touched"), "type": "FileOrCreate"}},
                         {"name": "file", "hostPath": {"path": str(host / "file"), "type": "File"}},
                         {"name": "untyped", "hostPath": {"path": str(host)}},
                         {"name": "hosts", "hostPath": {"path": str(host / "hosts"), "type": "File"}}],
            ))
            # A subPath may not climb out of its volume: the manifest is refused with the API server's
            # words (the kubelet validates what its sources give it: filterInvalidPods).
            env.write("b.yaml", pod("badsub", container("main", volumeMounts=[
                {"name": "v", "mountPath": "/v", "subPath": "../escape"}]), volumes=[{"name": "v", "emptyDir": {}}]))

            async def failed_mount() -> dict[str, Any] | None:
                for e in env.agent.trace.chain(f"default/hostpath-{env.node}"):
                    if e["kind"] == "PodWaiting" and e["reason"] == "FailedMount":
                        return e
                return None

            event = await wait_for(failed_mount, 30, "a FailedMount for the missing directory")
            assert event["message"] == (f'MountVolume.SetUp failed for volume "later" : '
                                        f"hostPath type check failed: {wanted} is not a directory")
            assert not await env.running_containers("hostpath")
            assert env.status_of("hostpath")["phase"] == "Pending"

            wanted.mkdir()
            (wanted / "note").write_text("appeared\n")
            assert await output(env, "hostpath", "main", "cat", "/later/note") == "appeared"
            assert (host / "made" / "deep").is_dir()  # DirectoryOrCreate
            assert (host / "touched").is_file() and stat.S_IMODE((host / "touched").stat().st_mode) == 0o644
            assert await output(env, "hostpath", "main", "cat", "/file") == "from the host"
            await output(env, "hostpath", "main", "sh", "-c", "echo back > /untyped/written")
            assert (host / "written").read_text() == "back\n"
            # The container's own mount at /etc/hosts wins over the kubelet-managed file.
            assert await output(env, "hostpath", "main", "cat", "/etc/hosts") == "10.9.8.7 custom"

            bad = str(env.manifests / "b.yaml")
            async def refused() -> bool:
                return bad in watch.rejected

            await wait_for(refused, 30, "b.yaml refused")
            assert watch.rejected[bad][0] == "ManifestInvalid"
            assert watch.messages[bad][0].endswith(
                "spec.containers[0].volumeMounts.subPath: Invalid value: \"../escape\": must not contain '..'")
            assert env.uid_of("badsub") is None
            # The wrong kind of file fails the check too.
            env.write("w.yaml", pod("wrongkind", container("main", volumeMounts=[{"name": "v", "mountPath": "/v"}]),
                                    volumes=[{"name": "v", "hostPath": {"path": str(host / "file"), "type": "Directory"}}]))

            async def wrong_kind() -> bool:
                return any(e["kind"] == "PodWaiting" and e["message"].endswith(f"{host / 'file'} is not a directory")
                           for e in env.agent.trace.chain(f"default/wrongkind-{env.node}"))

            await wait_for(wrong_kind, 30, "a FailedMount for a file where a directory is wanted")
            env.remove("h.yaml")
            await wait_for(lambda: _absent(env.config.root_dir / "pods" / str(env.uid_of("hostpath"))), 30,
                           "the hostpath pod's directory removed")
            assert (wanted / "note").exists(), "a hostPath belongs to the host: never removed"


async def test_downward_api_volume_files_and_modes(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("d.yaml", pod(
            "downward",
            container("client", volumeMounts=[{"name": "podinfo", "mountPath": "/etc/podinfo"}],
                      resources={"requests": {"cpu": "250m", "memory": "32Mi"},
                                 "limits": {"cpu": "1250m", "memory": "64Mi"}}),
            volumes=[{"name": "podinfo", "downwardAPI": {"defaultMode": 0o644, "items": [
                {"path": "podname", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}, "mode": 0o400},
                {"path": "nested/uid", "fieldRef": {"fieldPath": "metadata.uid"}},
                {"path": "cpu_limit", "resourceFieldRef": {"containerName": "client", "resource": "limits.cpu"}},
                {"path": "memory_request", "resourceFieldRef": {"containerName": "client",
                                                                "resource": "requests.memory"}},
            ]}}],
            # Quotes are escaped (a label value may not hold them; an annotation may).
            metadata={"labels": {"key1": "value1", "key2": "value2"},
                      "annotations": {"builder": "bar", "quoted": 'with "quotes"'}},
        ))
        async def read(path: str) -> str:
            return await output(env, "downward", "client", "cat", f"/etc/podinfo/{path}")

        assert await read("podname") == f"downward-{env.node}"
        assert await read("labels") == 'key1="value1"\nkey2="value2"'
        annotations = (await read("annotations")).splitlines()
        assert 'builder="bar"' in annotations and 'quoted="with \\"quotes\\""' in annotations
        assert await read("nested/uid") == env.uid_of("downward")
        assert await read("cpu_limit") == "2"  # 1250m rounded up
        assert await read("memory_request") == "33554432"
        modes = await output(env, "downward", "client", "stat", "-L", "-c", "%n %a",
                             "/etc/podinfo/podname", "/etc/podinfo/annotations")
        assert modes.splitlines() == ["/etc/podinfo/podname 644", "/etc/podinfo/annotations 400"]
        assert (await run_in(env, "downward", "client", "touch", "/etc/podinfo/x"))[0] != 0  # always read-only

        # The kubelet's atomic-writer layout: ..data points at the payload, names link through it.
        target = volume_dir(env, "downward", "downward-api", "podinfo")
        assert (target / "..data").is_symlink() and os.readlink(target / "..data").startswith("..")
        assert os.readlink(target / "podname") == "..data/podname"
        assert os.readlink(target / "nested") == "..data/nested"


async def test_fs_group_owns_empty_dir_and_downward_api_volumes(containerd: Any, tmp_path: Path) -> None:
    """SetVolumeOwnership: the volumes belong to the fsGroup (group rw, or r for downwardAPI
    content; setgid directories), so that what a container of any user creates belongs to it
    too (EmptyDir "when FSGroup is specified" tests)."""
    async with running_agent(containerd, tmp_path) as env:
        env.write("g.yaml", pod(
            "owned",
            container("user", "echo x > /scratch/by-user; echo y > /mem/by-user; exec sleep 3600",
                      securityContext={"runAsUser": 1001},
                      volumeMounts=[{"name": "scratch", "mountPath": "/scratch"},
                                    {"name": "mem", "mountPath": "/mem"},
                                    {"name": "mem", "mountPath": "/sub", "subPath": "test-sub"},
                                    {"name": "info", "mountPath": "/info"}]),
            container("root", volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}]),
            securityContext={"fsGroup": 123, "fsGroupChangePolicy": "OnRootMismatch"},
            volumes=[{"name": "scratch", "emptyDir": {}}, {"name": "mem", "emptyDir": {"medium": "Memory"}},
                     {"name": "info", "downwardAPI": {"defaultMode": 0o400, "items": [
                         {"path": "dir/name", "fieldRef": {"fieldPath": "metadata.name"}}]}}],
        ))

        async def stat_of(container_name: str, *paths: str) -> list[str]:
            out = await output(env, "owned", container_name, "stat", "-L", "-c", "%A %u %g", *paths)
            return out.splitlines()

        async def created() -> bool:
            return (await run_in(env, "owned", "user", "test", "-f", "/mem/by-user"))[0] == 0

        await wait_for(created, 30, "the non-root container's files")
        # The volume roots: group 123, group rwx, setgid (a tmpfs root keeps its sticky bit).
        assert await stat_of("user", "/scratch", "/mem") == ["drwxrwsrwx 0 123", "drwxrwsrwt 0 123"]
        # A missing subPath is made with the volume's mode, and inherits its group.
        assert await stat_of("user", "/sub") == ["drwxrwsrwt 0 123"]
        # New files belong to the fsGroup, whoever made them.
        await output(env, "owned", "root", "sh", "-c", "echo z > /scratch/by-root")
        assert await stat_of("root", "/scratch/by-user", "/scratch/by-root") == [
            "-rw-r--r-- 1001 123", "-rw-r--r-- 0 123"]
        # downwardAPI content: mode | 0440, so the group (the container's supplemental group)
        # reads a 0400 file it does not own.
        assert await stat_of("user", "/info/dir/name", "/info/dir") == ["-r--r----- 0 123", "drwxr-sr-x 0 123"]
        assert await output(env, "owned", "user", "cat", "/info/dir/name") == f"owned-{env.node}"
        assert "123" in (await output(env, "owned", "user", "id", "-G")).split()
        conditions = {c["type"]: c for c in env.status_of("owned").get("conditions", [])}
        assert "fsGroupChangePolicy" not in conditions.get("nodeagent.io/UnhonouredFields", {}).get("message", "")


class TestVolumesContract(StageContract):
    plugin = "volumes"

    def pods(self, harness: Any) -> list[Pod]:
        # The default pod has no volumes (the stage skips it); this one takes every source.
        base = harness.pod()
        data = base.model_dump(by_alias=True, exclude_none=True)
        data["spec"]["containers"][0]["volumeMounts"] = [
            {"name": "scratch", "mountPath": "/scratch"}, {"name": "mem", "mountPath": "/mem"},
            {"name": "info", "mountPath": "/info"}, {"name": "host", "mountPath": "/host"}]
        data["spec"]["volumes"] = [
            {"name": "scratch", "emptyDir": {}}, {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "info", "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
            # A directory of the harness's own: a bind of /tmp, which holds the agent's rootDir, would
            # show every pod's mounts inside this one's (and block their removal).
            {"name": "host", "hostPath": {"path": str(harness.base / "host"), "type": "DirectoryOrCreate"}}]
        return [base, Pod.model_validate(data)]


# --- without a runtime -------------------------------------------------------------------


def test_tmpfs_size_is_the_smallest_of_allocatable_pod_limit_and_size_limit() -> None:
    def size(limits: list[str | None], size_limit: str | None, allocatable: int) -> int | None:
        containers = [{"name": f"c{i}", "image": "i", "resources": {"limits": {"memory": m}} if m else {}}
                      for i, m in enumerate(limits)]
        p = Pod.model_validate({"metadata": {"name": "p"}, "spec": {"containers": containers}})
        return tmpfs.tmpfs_size(EmptyDirVolumeSource(medium="Memory", size_limit=size_limit), p, allocatable)

    assert size([None], None, 8 * 2**30) == 8 * 2**30
    assert size(["1Gi", "1Gi"], None, 8 * 2**30) == 2 * 2**30  # every container limited: the pod's sum
    assert size(["1Gi", None], None, 8 * 2**30) == 8 * 2**30  # one unlimited container: no pod limit
    assert size(["1Gi"], "10Mi", 8 * 2**30) == 10 * 2**20
    assert size(["1Gi"], "2Gi", 8 * 2**30) == 2**30  # a sizeLimit above what the pod may use is ignored


def test_host_path_checks_name_the_kind(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    for kind, what in (("Socket", "a socket file"), ("CharDevice", "a character device"),
                       ("BlockDevice", "a block device"), ("File", "a file")):
        path = tmp_path if kind == "File" else tmp_path / "f"
        with pytest.raises(SetupError, match=f"hostPath type check failed: {path} is not {what}$"):
            sources.check_host_path(HostPathVolumeSource.model_validate({"path": str(path), "type": kind}))
    sources.check_host_path(HostPathVolumeSource(path="/dev/null", type="CharDevice"))
    with pytest.raises(SetupError):  # FileOrCreate does not create the parent directory
        sources.check_host_path(HostPathVolumeSource(path=str(tmp_path / "no" / "f"), type="FileOrCreate"))


def test_atomic_writer_swaps_the_payload(tmp_path: Path) -> None:
    assert atomicwriter.write_atomically(tmp_path, {"a": ("1", 0o644), "d/b": ("2", 0o400)})
    first = os.readlink(tmp_path / "..data")
    assert not atomicwriter.write_atomically(tmp_path, {"a": ("1", 0o644), "d/b": ("2", 0o400)})  # unchanged
    assert atomicwriter.write_atomically(tmp_path, {"a": ("3", 0o644)})
    assert (tmp_path / "a").read_text() == "3" and not (tmp_path / "d").exists()
    assert not (tmp_path / first).exists(), "the previous payload is removed"
    with pytest.raises(SetupError):
        atomicwriter.write_atomically(tmp_path, {"../escape": ("x", 0o644)})


def test_volume_ownership_groups_everything_and_leaves_symlink_targets_alone(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("x")
    os.chmod(root / "d" / "f", 0o400)
    (root / "link").symlink_to("d/f")
    ownership.set_volume_ownership(root, 4321, read_only=False)
    for path in (root, root / "d", root / "d" / "f"):
        assert path.lstat().st_gid == 4321
    assert (root / "link").lstat().st_gid == 4321  # lchown: the link itself
    assert stat.S_IMODE((root / "d" / "f").stat().st_mode) == 0o660 | 0o400  # rw for the group
    assert stat.S_IMODE((root / "d").stat().st_mode) & 0o2070 == 0o2070  # setgid, group rwx
    ownership.set_volume_ownership(root, 4321, read_only=True)  # again, read-only: nothing narrows
    assert stat.S_IMODE((root / "d" / "f").stat().st_mode) == 0o660


def test_atomic_writer_takes_bytes_and_gives_each_payload_to_the_fs_group(tmp_path: Path) -> None:
    binary = bytes([0xDE, 0xCA, 0xFE, 0xBA, 0xD0, 0xFE, 0xFF])
    assert atomicwriter.write_atomically(tmp_path, {"dump.bin": (binary, 0o400), "t": ("text", 0o644)}, fs_group=4321)
    assert (tmp_path / "dump.bin").read_bytes() == binary
    data = tmp_path / "..data"
    assert stat.S_IMODE((data / "dump.bin").stat().st_mode) == 0o440 and (data / "dump.bin").stat().st_gid == 4321
    assert data.resolve().stat().st_mode & stat.S_ISGID and tmp_path.stat().st_gid == 4321
    # Ownership is part of the payload's identity: the same payload is not rewritten.
    assert not atomicwriter.write_atomically(tmp_path, {"dump.bin": (binary, 0o400), "t": ("text", 0o644)}, fs_group=4321)


async def test_observe_rewrites_downward_api_files_when_a_new_spec_arrives(tmp_path: Path) -> None:
    """No sleeping and no polling: the stage wakes on the pod's change feed (ctx.pod_changed)."""
    def spec(labels: dict[str, str]) -> Pod:
        return Pod.model_validate({
            "metadata": {"name": "p", "uid": "u", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                     "volumes": [{"name": "v", "downwardAPI": {"items": [
                         {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}})

    clock = ManualClock()
    ctx = FakePodContext(spec({"a": "1"}), stage="volumes", clock=clock, pod_dir=tmp_path)
    stage = VolumesStage()
    assert (await stage.prepare(ctx)).verdict.value == "Continue"  # type: ignore[arg-type]
    labels = tmp_path / "volumes" / sources.DOWNWARD_API / "v" / "labels"
    assert labels.read_text() == 'a="1"'

    async def asleep() -> bool:
        await anyio.sleep(0.01)
        return clock.sleepers > 0

    async with anyio.create_task_group() as tg:
        tg.start_soon(stage.observe, ctx)  # type: ignore[arg-type]
        await wait_for(asleep, 5, "observe asleep")
        first = os.readlink(labels.parent / "..data")
        clock.advance(30)
        await wait_for(asleep, 5, "observe asleep again")
        assert os.readlink(labels.parent / "..data") == first  # nothing new: nothing rewritten
        ctx.set_pod(spec({"a": "1", "b": "2"}))  # what the worker does when the source sees an edit
        await wait_for(asleep, 5, "observe asleep after the change")
        assert labels.read_text() == 'a="1"\nb="2"'
        tg.cancel_scope.cancel()


def test_mounts_under_reads_the_table_deepest_first(tmp_path: Path) -> None:
    from nodeagent.mounttable import is_mount_point

    pods = tmp_path / "pods"
    for directory in ("u1/volumes/a/b", "u1/with space", "u10/volumes"):
        (pods / directory).mkdir(parents=True)
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 0:21 / / rw - overlay overlay rw\n"
        f"30 22 0:30 / {pods}/u1/volumes/a rw - tmpfs tmpfs rw\n"
        f"31 30 0:31 / {pods}/u1/volumes/a/b rw - tmpfs tmpfs rw\n"
        f"32 22 0:32 / {pods}/u10/volumes rw - tmpfs tmpfs rw\n"
        f"33 22 0:33 / {pods}/u1/with\\040space rw - tmpfs tmpfs rw\n"
        f"34 22 0:34 / {pods}/u1 rw - tmpfs tmpfs rw\n")
    found = mounts_under(pods / "u1", table)
    assert found[0] == pods / "u1/volumes/a/b" and found[-1] == pods / "u1"
    assert set(found) == {pods / "u1/volumes/a/b", pods / "u1/volumes/a", pods / "u1/with space", pods / "u1"}
    assert pods / "u10/volumes" not in found  # a sibling whose name starts the same is not under it
    assert mounts_under(Path("/"), table)[-1] == Path("/")
    assert is_mount_point(pods / "u1/with space", table) and not is_mount_point(pods / "u2", table)


class _CountedTable:
    """A mount table that counts its reads: each read of the real one has the kernel render
    every mount of the node."""

    def __init__(self, path: Path) -> None:
        self.path, self.reads = path, 0

    def read_text(self) -> str:
        self.reads += 1
        return self.path.read_text()


def test_mounts_under_a_directory_that_is_not_there_does_not_read_the_table(tmp_path: Path) -> None:
    (tmp_path / "u1").mkdir()
    real = tmp_path / "mountinfo"
    real.write_text(f"30 22 0:30 / {tmp_path}/u1 rw - tmpfs tmpfs rw\n")
    table = _CountedTable(real)
    assert mounts_under(tmp_path / "u2" / "volumes" / "kubernetes.io~configmap", table) == []  # type: ignore[arg-type]
    assert table.reads == 0  # a pod without such volumes: no read
    assert mounts_under(tmp_path / "u1", table) == [tmp_path / "u1"]  # type: ignore[arg-type]
    assert table.reads == 1
