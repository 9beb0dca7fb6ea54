"""Nothing a pod's data can do reaches a host path the pod was not given: pod names that would
climb out of rootDir are refused, names that overflow a file name are hashed (against the real
containerd), and below, the name rules without a runtime.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent import hostpaths
from nodeagent.model import Pod
from tests.agent_helpers import running_agent, wait_for
from tests.test_pod_spec import container, pod

pytestmark = pytest.mark.anyio


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


# --- without a runtime: the names -------------------------------------------


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
