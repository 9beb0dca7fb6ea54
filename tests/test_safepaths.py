"""Nothing a pod's data or a container can do reaches a host path the pod was not given.

Each integration test performs the attack against the real containerd and checks what the
kubelet does about it: a subPath component turned into a symlink between container starts
(CVE-2017-1002101 / CVE-2021-25741), a hostPath swapped between its type check and its
mount, a termination-message path redirected through a volume, pod names that would climb out
of rootDir or overflow a file name. Below them, the pieces without a runtime: the safe walk,
the binds, the name rules.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cri import types as t
from nodeagent import hostpaths
from nodeagent.additions import VolumeBind
from nodeagent.model import Pod
from nodeagent.mounttable import is_mount_point, mounts_under
from nodeagent.terminationmessage import create_message_file, read_message
from nodeagent.volumebind import (
    EscapeError,
    HostPathTypeError,
    VolumeBindError,
    bind_volume_mounts,
    open_beneath,
    open_host_path,
    unbind_pod,
)
from tests.agent_helpers import AgentEnv, running_agent, wait_for
from tests.test_pod_spec import container, output, pod, run_in

pytestmark = pytest.mark.anyio

SUBPATH_ERROR = 'failed to prepare subPath for volumeMount "data" of container "main"'


def _secret(tmp_path: Path) -> Path:
    """A host directory no pod is given."""
    secret = tmp_path / "host-secret"
    secret.mkdir()
    (secret / "marker").write_text("HOST-ONLY\n")
    (secret / "shadow").write_text("root:$6$SECRET-HASH:19000:0:99999:7:::\n")
    return secret


def _waiting(env: AgentEnv, pod_name: str, container_name: str) -> dict[str, Any]:
    status = env.status_of(pod_name)
    for cs in status.get("containerStatuses", []) + status.get("initContainerStatuses", []):
        if cs["name"] == container_name:
            return dict(cs.get("state", {}).get("waiting", {}))
    return {}


def _logged(env: AgentEnv, pod_name: str, container_name: str) -> str:
    """Everything the container's instances wrote to their CRI logs."""
    uid = env.uid_of(pod_name)
    assert uid is not None
    directory = hostpaths.container_log_dir(
        hostpaths.pod_log_dir(env.config.pod_logs_dir, "default", f"{pod_name}-{env.node}", uid), container_name)
    if not directory.is_dir():
        return ""
    return "".join(p.read_text(errors="replace") for p in sorted(directory.iterdir()) if p.is_file())


# --- (a) a subPath component swapped for a symlink between container starts --------------------


async def test_sub_path_turned_into_a_symlink_is_refused_at_the_next_container_start(containerd: Any,
                                                                                  tmp_path: Path) -> None:
    """The first instance replaces the subPath's directory in the emptyDir with a symlink to a
    host directory and exits; its restart must not get the host directory: the kubelet fails
    the creation (CreateContainerConfigError, "failed to prepare subPath ..."). Likewise when an
    init container makes the swap before the container that mounts the subPath starts. A
    symlink that stays inside the volume keeps working."""
    secret = _secret(tmp_path)
    swap = f"rm -rf /data/sub && ln -s {secret} /data/sub"
    mounts = [{"name": "data", "mountPath": "/data"}, {"name": "data", "mountPath": "/sub", "subPath": "sub"}]
    look = "if [ -e /sub/marker ]; then echo SAW-HOST; cat /sub/marker; exec sleep 3600; fi; "
    async with running_agent(containerd, tmp_path) as env:
        env.write("restart.yaml", pod(
            "restart", container("main", look + f"echo first-start; {swap}; exit 1", volumeMounts=mounts),
            volumes=[{"name": "data", "emptyDir": {}}]))
        env.write("init.yaml", pod(
            "init", container("main", look + "echo volume-content; exec sleep 3600", volumeMounts=mounts),
            initContainers=[container("swap", swap, volumeMounts=mounts[:1])],
            volumes=[{"name": "data", "emptyDir": {}}]))
        env.write("inside.yaml", pod(
            "inside", container("main", volumeMounts=[{"name": "data", "mountPath": "/linked", "subPath": "link"}]),
            initContainers=[container("make", "mkdir -p /data/real && echo in-volume > /data/real/file && "
                                              "ln -s real /data/link", volumeMounts=mounts[:1])],
            volumes=[{"name": "data", "emptyDir": {}}]))

        async def refused(name: str) -> dict[str, Any] | None:
            waiting = _waiting(env, name, "main")
            return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

        for name in ("restart", "init"):
            waiting = await wait_for(lambda name=name: refused(name), 60,  # type: ignore[misc]
                                     f"{name}: the container refused with CreateContainerConfigError")
            assert waiting["message"] == SUBPATH_ERROR  # no host path in what the pod sees
            assert "SAW-HOST" not in _logged(env, name, "main")
        assert "first-start" in _logged(env, "restart", "main")  # the swap did run in the first instance
        assert not await env.running_containers("restart") and not await env.running_containers("init")

        # A symlink inside the volume, to a place inside it, is followed (the kubelet's rule).
        assert await output(env, "inside", "main", "cat", "/linked/file") == "in-volume"
        assert sorted(p.name for p in secret.iterdir()) == ["marker", "shadow"]  # untouched

        # The binds live under the pod directory and go with the pod.
        uid = env.uid_of("inside")
        assert uid is not None
        subpaths = hostpaths.volume_subpaths_dir(hostpaths.pod_dir(env.config.root_dir, uid))
        assert mounts_under(subpaths) == [(subpaths / "data" / "main" / "0").resolve()]
        env.remove("inside.yaml")

        async def unbound() -> bool:
            return not mounts_under(subpaths) and not subpaths.exists()

        await wait_for(unbound, 60, "the subPath bind unmounted with the pod")


async def test_binds_are_found_in_the_mount_table_by_a_restarted_agent(containerd: Any, tmp_path: Path) -> None:
    """Nothing is remembered: an agent that did not make the binds detaches them at the
    container's next start and at the pod's unprepare."""
    from tests.agent_helpers import make_config

    config = make_config(tmp_path, containerd.endpoint)
    command = "echo kept > /sub/file; until [ -e /tmp/exit ]; do sleep 0.2; done; exit 1"
    manifest = pod("binds", container("main", command,
                                      volumeMounts=[{"name": "data", "mountPath": "/sub", "subPath": "sub"}]),
                   volumes=[{"name": "data", "emptyDir": {}}])
    async with running_agent(containerd, tmp_path, config=config, cleanup=False) as env:
        env.write("binds.yaml", manifest)
        first = await env.wait_running("binds", timeout=60)
        uid = env.uid_of("binds")
    assert uid is not None
    subpaths = hostpaths.volume_subpaths_dir(hostpaths.pod_dir(config.root_dir, uid))
    target = (subpaths / "data" / "main" / "0").resolve()
    assert mounts_under(subpaths) == [target] and _mounted_times(target) == 1  # the first agent's bind stays
    async with running_agent(containerd, tmp_path, config=config) as env:
        await output(env, "binds", "main", "touch", "/tmp/exit")

        async def restarted() -> bool:
            return any(c.id != first.id for c in await env.running_containers("binds"))

        await wait_for(restarted, 60, "the container restarted by the second agent")
        assert _mounted_times(target) == 1  # detached and bound again, not stacked on the old one
        assert await output(env, "binds", "main", "cat", "/sub/file") == "kept"
        env.remove("binds.yaml")

        async def unbound() -> bool:
            return not mounts_under(subpaths) and not subpaths.exists()

        await wait_for(unbound, 60, "the binds detached at unprepare")


def _mounted_times(path: Path) -> int:
    return sum(1 for line in Path("/proc/self/mountinfo").read_text().splitlines()
               if line.split()[4] == str(path))


# --- (b) a hostPath swapped between its type check and its mount -------------------------------


async def test_host_path_swapped_after_its_check_still_mounts_what_was_checked(containerd: Any,
                                                                               tmp_path: Path) -> None:
    """A File hostPath passes its check; then, deterministically just before CreateContainer
    (a hook on the agent's runtime client), the file is replaced by a symlink to a host
    directory. The container must get the checked file, never the directory; its next start
    checks again and refuses what is there now."""
    secret = _secret(tmp_path)
    host = tmp_path / "host"
    host.mkdir()
    checked = host / "file"
    checked.write_text("checked-file\n")
    async with running_agent(containerd, tmp_path) as env:
        runtime = env.agent.runtime
        real_create = runtime.create_container
        swapped: list[str] = []

        async def create_after_a_swap(sandbox_id: str, config: t.ContainerConfig,
                                      sandbox_config: t.PodSandboxConfig) -> str:
            if config.metadata.name == "main" and not swapped:
                # Moved away, not deleted: the kernel refuses to mount a deleted file at all
                # (which is as safe, the start fails); moved, it shows the bind pins it.
                checked.rename(host / "moved")
                checked.symlink_to(secret)
                swapped.append(config.metadata.name)
            return await real_create(sandbox_id, config, sandbox_config)

        runtime.create_container = create_after_a_swap  # type: ignore[method-assign]
        env.write("swap.yaml", pod(
            "swap", container("main", "until [ -e /tmp/exit ]; do sleep 0.2; done; exit 1",
                              volumeMounts=[{"name": "f", "mountPath": "/checked"}]),
            volumes=[{"name": "f", "hostPath": {"path": str(checked), "type": "File"}}]))
        await env.wait_running("swap", timeout=60)
        assert swapped and checked.is_symlink()
        assert await output(env, "swap", "main", "cat", "/checked") == "checked-file"
        assert (await run_in(env, "swap", "main", "test", "-d", "/checked"))[0] != 0
        assert (await run_in(env, "swap", "main", "cat", "/checked/marker"))[0] != 0

        # The next start checks again, on what it mounts: a symlink to a directory is no File.
        env.agent.runtime.create_container = real_create  # type: ignore[method-assign]
        await output(env, "swap", "main", "touch", "/tmp/exit")

        async def refused() -> dict[str, Any] | None:
            waiting = _waiting(env, "swap", "main")
            return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

        waiting = await wait_for(refused, 60, "the restart refused: the hostPath is no file any more")
        assert waiting["message"] == f"hostPath type check failed: {checked} is not a file"


# --- (c) the termination message read through a redirected path --------------------------------


async def test_termination_message_is_read_from_the_containers_own_file_only(containerd: Any,
                                                                            tmp_path: Path) -> None:
    """The container has a file of a volume mounted at /dev/termination-log as well (a subPath
    of its emptyDir; a file of a hostPath directory it is given), turns that file into a
    symlink to host content it was not given, and exits. The message is what it wrote to its
    own message file, never the host file the symlink names."""
    secret = _secret(tmp_path)
    shared = tmp_path / "shared"
    (shared / "d").mkdir(parents=True)
    (shared / "d" / "msg").write_text("placeholder\n")
    # The file is a mount point in the container (its message file is mounted over it), so it
    # cannot be removed; its directory can be moved away and replaced.
    attack = (f"mv /data/d /data/old && mkdir /data/d && ln -s {secret / 'shadow'} /data/d/msg && "
              "echo -n mine > /dev/termination-log; exit 1")
    data = [{"name": "data", "mountPath": "/data"}]
    async with running_agent(containerd, tmp_path) as env:
        env.write("msg.yaml", pod(
            "msg",
            container("main", attack, volumeMounts=[
                *data, {"name": "data", "mountPath": "/dev/termination-log", "subPath": "d/msg"}]),
            # A file where the subPath will be (a directory made at prepare is removed first).
            initContainers=[container("file", "mkdir -p /data/d; rmdir /data/d/msg 2>/dev/null; "
                                              "echo placeholder > /data/d/msg", volumeMounts=data)],
            restartPolicy="Never", volumes=[{"name": "data", "emptyDir": {}}]))
        # An untyped hostPath is mounted by path (nothing to check): the read must still not
        # take that mount for the message file.
        env.write("host.yaml", pod(
            "host",
            container("main", attack, volumeMounts=[
                *data, {"name": "msg", "mountPath": "/dev/termination-log"}]),
            restartPolicy="Never", volumes=[{"name": "data", "hostPath": {"path": str(shared)}},
                                            {"name": "msg", "hostPath": {"path": str(shared / "d" / "msg")}}]))

        async def terminated(name: str) -> dict[str, Any] | None:
            for cs in env.status_of(name).get("containerStatuses", []):
                if cs["name"] == "main" and "terminated" in cs.get("state", {}):
                    return dict(cs["state"]["terminated"])
            return None

        for name in ("msg", "host"):
            state = await wait_for(lambda name=name: terminated(name), 60,  # type: ignore[misc]
                                   f"{name}: the container terminated")
            assert "SECRET" not in state.get("message", "")
            assert state["exitCode"] == 1 and state.get("message") == "mine"
        assert (shared / "d" / "msg").is_symlink()  # the attack did run


# --- (d) names that would leave rootDir, or overflow a file name ----------------------------------


async def test_unsafe_names_are_refused_long_ones_hashed_and_nothing_escapes(containerd: Any, tmp_path: Path) -> None:
    """A static pod whose UID climbs out of rootDir never gets a directory (or a log
    directory, or a status file) anywhere; a pod whose name and namespace make names longer
    than 255 bytes runs, with its log directory and status file hashed to fit."""
    long_name, long_namespace = "l" * 200, "n" * 63
    async with running_agent(containerd, tmp_path) as env:
        evil = pod("evil", container("main"), metadata={"uid": "../../escape-uid"})
        env.write("evil.yaml", evil)
        env.write("long.yaml", pod(long_name, container("main"), metadata={"namespace": long_namespace}))
        await env.wait_seen_running(long_name, timeout=60)
        uid = env.uid_of(long_name)
        assert uid is not None
        full = f"{long_name}-{env.node}"
        status_file = hostpaths.status_file(env.config.root_dir / "pod-status", long_namespace, full, uid)

        async def on_file() -> bool:
            return status_file.exists() and json.loads(status_file.read_text())["status"].get("phase") == "Running"

        await wait_for(on_file, 30, "the long-named pod's status file")
        assert len(status_file.name.encode()) <= 255 and status_file.name.startswith(f"{long_namespace}_l")
        log_dir = hostpaths.pod_log_dir(env.config.pod_logs_dir, long_namespace, full, uid)
        assert log_dir.is_dir() and len(log_dir.name.encode()) <= 255 and hostpaths.HASH_MARK in log_dir.name
        assert (log_dir / "main" / "0.log").is_file()

        async def refused() -> str | None:
            # Refused by the agent before any stage (a source that validates names may refuse
            # the manifest first: then no pod exists at all, which is as safe).
            rejected = [e for e in env.agent.trace.chain(f"default/evil-{env.node}") if e["kind"] == "PodRejected"]
            if rejected:
                return str(rejected[0]["reason"])
            return "ManifestRejected" if env.agent.metrics.counters.get("ManifestRejected", 0) else None

        assert await wait_for(refused, 30, "the pod with a climbing UID refused") in ("UnsafePodNames",
                                                                                     "ManifestRejected")
        assert not await env.running_containers("evil")
        escaped = [p for p in tmp_path.rglob("*escape*") if env.manifests not in p.parents]
        assert escaped == [], "nothing is made outside rootDir"
        assert {p.name for p in tmp_path.iterdir()} <= {"containers", "logs", "manifests", "root"}
        env.remove("long.yaml")
        await wait_for(lambda: _gone(status_file), 60, "the long-named pod's status file removed")


async def _gone(path: Path) -> bool:
    return not path.exists()


# --- without a runtime: the walk, the binds, the names -------------------------------------------


def _volume(tmp_path: Path) -> Path:
    volume = tmp_path / "volume"
    (volume / "dir" / "deeper").mkdir(parents=True)
    (volume / "dir" / "file").write_text("inside\n")
    os.chmod(volume, 0o2775)
    return volume


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_PATH | os.O_DIRECTORY)


def _resolved(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def test_open_beneath_follows_links_inside_the_volume_and_refuses_the_way_out(tmp_path: Path) -> None:
    volume = _volume(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (volume / "rel").symlink_to("dir/deeper/..")
    (volume / "dir" / "up").symlink_to("../dir/file")
    (volume / "abs-in").symlink_to(volume / "dir")
    (volume / "abs-out").symlink_to(outside)
    (volume / "climb").symlink_to("../outside")
    (volume / "dir" / "climb2").symlink_to("../../outside")
    (volume / "loop").symlink_to("loop")
    base = _open_dir(volume)
    try:
        assert _resolved(open_beneath(base, "dir/file")) == str(volume / "dir" / "file")
        assert _resolved(open_beneath(base, "rel/file")) == str(volume / "dir" / "file")
        assert _resolved(open_beneath(base, "dir/up")) == str(volume / "dir" / "file")
        assert _resolved(open_beneath(base, "abs-in/file")) == str(volume / "dir" / "file")
        for way_out in ("abs-out", "climb", "dir/climb2", "abs-out/x"):
            with pytest.raises(EscapeError):
                open_beneath(base, way_out, 0o755)
        with pytest.raises(OSError, match="too many symlinks"):
            open_beneath(base, "loop")
        with pytest.raises(NotADirectoryError):
            open_beneath(base, "dir/file/x")
        with pytest.raises(FileNotFoundError):
            open_beneath(base, "missing")  # without a mode nothing is made
        # Missing directories are made with the volume's mode, setgid included, whatever the umask.
        made = _resolved(open_beneath(base, "new/one", 0o2775))
        assert made == str(volume / "new" / "one")
        assert stat.S_IMODE(os.stat(volume / "new").st_mode) == 0o2775
        assert stat.S_IMODE(os.stat(volume / "new" / "one").st_mode) == 0o2775
        assert not (outside / "x").exists() and list(outside.iterdir()) == []
    finally:
        os.close(base)


def test_bind_volume_mounts_pins_what_was_opened_and_unbinds_from_the_mount_table(tmp_path: Path) -> None:
    volume = _volume(tmp_path)
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "marker").write_text("host\n")
    binds = [VolumeBind(volume="v", index=0, volume_path=str(volume), sub_path="dir", container_path="/d"),
             VolumeBind(volume="v", index=1, volume_path=str(volume), sub_path="dir/file", container_path="/f",
                        readonly=True)]
    mounts = bind_volume_mounts(pod_dir, "c", binds)
    try:
        target = pod_dir / "volume-subpaths" / "v" / "c"
        assert [m.host_path for m in mounts] == [str(target / "0"), str(target / "1")]
        assert mounts[1].readonly and mounts[0].container_path == "/d"
        assert (target / "0" / "file").read_text() == "inside\n" and (target / "1").read_text() == "inside\n"
        # What the container does to the volume afterwards does not move the binds.
        os.rename(volume / "dir", volume / "moved")
        (volume / "dir").symlink_to(secret)
        assert (target / "0" / "file").read_text() == "inside\n"
        assert not (target / "0" / "marker").exists()
        # The next start detaches the old binds and opens again: now the symlink leads out.
        with pytest.raises(VolumeBindError, match='failed to prepare subPath for volumeMount "v" of container "c"'):
            bind_volume_mounts(pod_dir, "c", binds)
        assert not is_mount_point(target / "0") and not is_mount_point(target / "1")
    finally:
        assert unbind_pod(pod_dir) == []
    assert not (pod_dir / "volume-subpaths").exists() and not mounts_under(pod_dir)
    assert (secret / "marker").exists()


def test_unbinding_a_host_path_leaves_the_hosts_files(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "sub").mkdir(parents=True)
    (host / "keep").write_text("host's\n")
    (host / "sub" / "keep").write_text("host's\n")
    pod_dir = tmp_path / "pod"
    binds = [VolumeBind(volume="h", index=0, volume_path=str(host), host_path_type="Directory", container_path="/h"),
             VolumeBind(volume="h", index=1, volume_path=str(host), host_path_type="", sub_path="sub",
                        container_path="/s")]
    mounts = bind_volume_mounts(pod_dir, "c", binds)
    assert (Path(mounts[0].host_path) / "keep").exists() and (Path(mounts[1].host_path) / "keep").exists()
    assert unbind_pod(pod_dir) == []
    assert (host / "keep").read_text() == "host's\n" and (host / "sub" / "keep").read_text() == "host's\n"
    assert not (pod_dir / "volume-subpaths").exists()
    # A type that does not match fails the bind with the kubelet's message, and binds nothing.
    with pytest.raises(VolumeBindError, match=f"hostPath type check failed: {host} is not a socket file"):
        bind_volume_mounts(pod_dir, "c", [VolumeBind(volume="h", index=0, volume_path=str(host),
                                                     host_path_type="Socket", container_path="/h")])
    assert not mounts_under(pod_dir)


def test_host_path_types_are_checked_on_the_opened_object(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "link-to-file").symlink_to(tmp_path / "file")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.close(open_host_path(str(tmp_path / "link-to-file"), "File"))  # the kubelet's stat follows links
    with pytest.raises(HostPathTypeError, match="is not a directory"):
        open_host_path(str(tmp_path / "file"), "Directory")
    # FileOrCreate never creates through a symlink (the kubelet's create would follow this one).
    with pytest.raises(HostPathTypeError, match="is not a file"):
        open_host_path(str(tmp_path / "dangling"), "FileOrCreate")
    assert not (tmp_path / "nowhere").exists()
    os.close(open_host_path(str(tmp_path / "new"), "FileOrCreate"))
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o644 & ~_umask()
    os.close(open_host_path(str(tmp_path / "a" / "b"), "DirectoryOrCreate"))
    assert (tmp_path / "a" / "b").is_dir()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_termination_message_never_follows_another_mount_or_a_symlink(tmp_path: Path) -> None:
    pod_dir = tmp_path / "pod"
    own = create_message_file(pod_dir, "main")
    own.write_text("own message")
    secret = tmp_path / "shadow"
    secret.write_text("SECRET")
    volume_file = tmp_path / "volume-file"
    volume_file.symlink_to(secret)

    def status(*host_paths: Path) -> t.ContainerStatus:
        return t.ContainerStatus(
            state=t.ContainerState.CONTAINER_EXITED, exit_code=1, metadata=t.ContainerMetadata(name="main"),
            annotations={}, mounts=[t.Mount(container_path="/dev/termination-log", host_path=str(p))
                                    for p in host_paths])

    # A volume's file at the same path comes first in the mounts: it is not the message file.
    assert read_message(status(volume_file, own), pod_dir) == "own message"
    assert read_message(status(volume_file), pod_dir) == ""
    # Another container's file is not this one's.
    other = create_message_file(pod_dir, "other")
    other.write_text("other's")
    assert read_message(status(other), pod_dir) == ""
    # The own file replaced by a symlink is not followed.
    own.unlink()
    own.symlink_to(secret)
    assert "SECRET" not in read_message(status(own), pod_dir)


def test_names_are_refused_or_hashed_never_a_path_elsewhere(tmp_path: Path) -> None:
    for bad in ("", ".", "..", "a/b", "../x", "a\0b"):
        with pytest.raises(hostpaths.UnsafeName):
            hostpaths.pod_dir(tmp_path, bad)
        with pytest.raises(hostpaths.UnsafeName):
            hostpaths.pod_log_dir(tmp_path, "default", bad, "uid")
        with pytest.raises(hostpaths.UnsafeName):
            hostpaths.status_file(tmp_path, bad, "name", "uid")
        with pytest.raises(hostpaths.UnsafeName):
            hostpaths.container_log_path(bad, 0)
    long_uid = "u" * 300
    one, two = hostpaths.pod_dir(tmp_path, long_uid), hostpaths.pod_dir(tmp_path, long_uid[:-1] + "v")
    assert one.parent == tmp_path / "pods" and len(one.name.encode()) == 255 and one != two
    assert one.name.startswith("u" * 100) and one == hostpaths.pod_dir(tmp_path, long_uid)  # stable
    assert hostpaths.pod_dir(tmp_path, "u" * 255).name == "u" * 255  # what fits is kept as it is
    status = hostpaths.status_file(tmp_path, "n" * 63, "p" * 253, "0123-uid")
    assert status.name.endswith(".json") and len(status.name.encode()) == 255
    assert hostpaths.status_file(tmp_path, "default", "p", "u").name == "default_p_u.json"
    wide = hostpaths.fit("é" * 200)  # cut on a character boundary
    assert len(wide.encode()) <= 255 and wide.encode().decode() == wide
    assert hostpaths.pod_cgroup_name("u" * 300) != hostpaths.pod_cgroup_name("u" * 299 + "v")
    with pytest.raises(hostpaths.UnsafeName):
        hostpaths.seccomp_profile(tmp_path, "../../etc/profile.json")
    assert hostpaths.seccomp_profile(tmp_path, "team/p.json") == tmp_path / "seccomp" / "team" / "p.json"


def test_pod_problem_names_every_name_a_host_path_takes() -> None:
    def problem(**changes: Any) -> str | None:
        data: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                                "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": []}}
        for key, value in changes.items():
            section, field = key.split("__")
            if section == "spec" and field == "volumes":
                data["spec"]["volumes"] = value
            elif section == "spec":
                data["spec"][field][0]["name"] = value
            else:
                data[section][field] = value
        return hostpaths.pod_problem(Pod.model_validate(data))

    assert problem() is None
    assert problem(metadata__uid="../../x") == "metadata.uid '../../x' must not contain '/' or NUL"
    assert problem(metadata__name="..") == "metadata.name '..' must not be '.' or '..'"
    assert problem(metadata__namespace="") == "metadata.namespace must not be empty"
    assert problem(spec__containers="a/b") == "container name 'a/b' must not contain '/' or NUL"
    assert problem(spec__volumes=[{"name": "..", "emptyDir": {}}]) == "volume name '..' must not be '.' or '..'"
