"""Static pods through the whole agent, against the real containerd."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from cri import types as t
from nodeagent import labels as L
from nodeagent.lifecycle import PodState
from tests.agent_helpers import pod_manifest, running_agent, runtime_objects, wait_for

pytestmark = pytest.mark.anyio


async def test_manifest_added_runs_pod_with_kubelet_labels(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("web.yaml", pod_manifest("web", labels={"app": "web"}))
        container = await env.wait_running("web")
        uid = env.uid_of("web")
        assert uid and len(uid) == 32
        assert container.labels[L.POD_NAME] == f"web-{env.node}"
        assert container.labels[L.POD_NAMESPACE] == "default"
        assert container.labels[L.POD_UID] == uid
        assert container.labels[L.CONTAINER_NAME] == "main"
        assert container.annotations[L.CONTAINER_RESTART_COUNT] == "0"
        assert container.annotations[L.CONTAINER_TYPE] == "container"
        sandboxes, _ = await runtime_objects(env.client, env.node)
        assert len(sandboxes) == 1
        assert sandboxes[0].labels["app"] == "web"
        assert sandboxes[0].metadata is not None and sandboxes[0].metadata.uid == uid

        status = await wait_for(lambda: _phase(env, "web", "Running"), what="status Running")
        assert status["podIP"]
        ready = {c["type"]: c["status"] for c in status["conditions"]}
        assert ready["Ready"] == "True" and ready["PodReadyToStartContainers"] == "True"
        assert status["containerStatuses"][0]["state"]["running"]["startedAt"]
        assert status["qosClass"] == "BestEffort"
        # The CRI log file is where the kubelet would put it.
        log_dir = env.config.pod_logs_dir / f"default_web-{env.node}_{uid}" / "main"
        await wait_for(lambda: _exists(log_dir / "0.log"), what="container log file")


async def _exists(path: Path) -> bool:
    return path.exists()


async def _phase(env: Any, name: str, phase: str) -> dict[str, Any] | None:
    status = env.status_of(name)
    return status if status.get("phase") == phase else None


async def test_manifest_edited_replaces_pod(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("web.yaml", pod_manifest("web", command="sleep 3600"))
        first = await env.wait_running("web")
        env.write("web.yaml", pod_manifest("web", command="sleep 3601"))

        async def replaced() -> bool:
            sandboxes, containers = await runtime_objects(env.client, env.node)
            running = [c for c in containers if c.state == t.ContainerState.CONTAINER_RUNNING]
            return (len(sandboxes) == 1 and len(running) == 1 and running[0].id != first.id
                    and running[0].labels[L.POD_UID] != first.labels[L.POD_UID])

        await wait_for(replaced, what="the edited pod replacing the old one (one sandbox, one new container)")


async def test_manifest_removed_stops_containers_and_removes_sandbox(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("a.yaml", pod_manifest("a"), pod_manifest("b"))  # two documents in one file
        await env.wait_running("a")
        await env.wait_running("b")
        uid_a = env.uid_of("a")
        env.write("a.yaml", pod_manifest("b"))
        await wait_for(lambda: _gone(env, uid_a), what="pod a torn down")
        assert await env.running_containers("b")

        # Forgotten (status dropped) once the teardown's last stages are done, which follows
        # the sandbox's removal: awaited, not read at the instant the runtime is empty.
        async def forgotten() -> bool:
            return env.uid_of("a") is None

        await wait_for(forgotten, what="pod a forgotten")
        assert not (env.config.root_dir / "pods" / str(uid_a)).exists()


async def _gone(env: Any, uid: str | None) -> bool:
    sandboxes, containers = await runtime_objects(env.client, env.node)
    return not any(s.metadata and s.metadata.uid == uid for s in sandboxes) and not any(
        c.labels.get(L.POD_UID) == uid for c in containers
    )


async def test_job_completes_and_releases_sandbox(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("job.yaml", pod_manifest("job", command="echo done; exit 0", restartPolicy="Never"))
        env.write("fail.yaml", pod_manifest("fail", command="exit 3", restartPolicy="Never"))
        status = await wait_for(lambda: _phase(env, "job", "Succeeded"), what="job Succeeded")
        assert status["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
        failed = await wait_for(lambda: _phase(env, "fail", "Failed"), what="failing job Failed")
        terminated = failed["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"

        async def sandboxes_stopped() -> bool:
            sandboxes, _ = await runtime_objects(env.client, env.node)
            return len(sandboxes) == 2 and all(s.state == t.PodSandboxState.SANDBOX_NOTREADY for s in sandboxes)

        await wait_for(sandboxes_stopped, what="completed pods' sandboxes stopped")


async def test_restart_policy_always_restarts_with_backoff(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("crash.yaml", pod_manifest("crash", command="exit 1"))

        async def restarted_then_backing_off() -> dict[str, Any] | None:
            status = env.status_of("crash")
            cs = (status.get("containerStatuses") or [{}])[0]
            waiting = cs.get("state", {}).get("waiting", {})
            if cs.get("restartCount", 0) >= 1 and waiting.get("reason") == "CrashLoopBackOff":
                return cs
            return None

        cs = await wait_for(restarted_then_backing_off, timeout=40, what="a restart and then CrashLoopBackOff")
        # The kubelet restarts the first failure at once and backs off 10 s after the second.
        assert cs["restartCount"] == 1
        assert cs["state"]["waiting"]["message"].startswith("back-off 10s restarting failed container=main")
        assert cs["lastState"]["terminated"]["exitCode"] == 1


async def test_malformed_manifests_do_not_disturb_good_ones(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        (env.manifests / "broken.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x\n")
        (env.manifests / "deploy.yaml").write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n")
        (env.manifests / "nocontainers.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: n}\nspec: {}\n")
        # schedulingGates (the scheduler's business): parsed, not acted upon, harmless: reported.
        env.write("good.yaml", pod_manifest("good", schedulingGates=[{"name": "example.com/gate"}]))
        # A raw block device from a persistent volume claim: standalone there is no API server to
        # read the claim from, and the pod would run without its device: refused.
        env.write("block.yaml", pod_manifest("block", volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}],
                                             container={"volumeDevices": [{"name": "v", "devicePath": "/dev/xvda"}]}))
        await env.wait_running("good")
        counters = env.agent.metrics.counters
        await wait_for(lambda: _at_least(counters, "ManifestRejected", 3), what="three ManifestRejected facts")
        chain = env.agent.trace.chain(f"default/good-{env.node}")
        unhonoured = [e for e in chain if e["kind"] == "UnhonouredFieldsFound"]
        assert unhonoured and unhonoured[0]["fields"] == ["spec.schedulingGates"]
        conditions = {c["type"]: c for c in env.status_of("good")["conditions"]}
        assert conditions["nodeagent.io/UnhonouredFields"]["message"].endswith("spec.schedulingGates")
        block = await wait_for(lambda: _phase(env, "block", "Failed"), what="the pod with a block device refused")
        assert block["reason"] == "UnsupportedVolume"
        assert block["message"] == ('volume "v" is a persistentVolumeClaim volume, which needs the API server, and '
                                    "this node runs standalone: the pod would run without it")
        assert not await env.running_containers("block")

        # A good manifest turning bad keeps its last valid pod running.
        uid = env.uid_of("good")
        (env.manifests / "good.yaml").write_text("{not yaml")
        await wait_for(lambda: _at_least(counters, "ManifestRejected", 4), what="the edit rejected")
        await anyio.sleep(1.5)
        assert env.uid_of("good") == uid and await env.running_containers("good")


async def _at_least(counters: dict[str, int], kind: str, n: int) -> bool:
    return counters.get(kind, 0) >= n


async def test_an_unlistable_manifest_directory_keeps_its_pods_and_recovers(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("keep.yaml", pod_manifest("keep"))
        await env.wait_running("keep")
        uid = env.uid_of("keep")
        # The directory cannot be listed (here: a file in its place, NotADirectoryError). That is
        # not "no manifests": the pod keeps running, the agent keeps going.
        aside = tmp_path / "manifests-aside"
        env.manifests.rename(aside)
        env.manifests.write_text("not a directory")
        await anyio.sleep(1.5)  # several polls and a forced rescan's worth
        assert env.uid_of("keep") == uid and await env.running_containers("keep")
        # Listable again: new manifests are picked up.
        env.manifests.unlink()
        aside.rename(env.manifests)
        env.write("later.yaml", pod_manifest("later"))
        await env.wait_running("later")
        assert env.uid_of("keep") == uid


def test_a_manifest_removed_between_listing_and_stat_is_not_listed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from nodeagent.sources import static

    (tmp_path / "kept.yaml").write_text("{}")
    (tmp_path / "gone.yaml").write_text("{}")
    real_scandir = os.scandir

    def scandir_then_remove(path: Any) -> list[os.DirEntry[str]]:
        entries = list(real_scandir(path))
        (tmp_path / "gone.yaml").unlink()  # the race: listed, then removed before its stat
        return entries

    monkeypatch.setattr(static.os, "scandir", scandir_then_remove)

    async def publish(_: Any) -> None:
        pass

    source = static.StaticPodSource(tmp_path, "node", publish)
    assert [p.name for p in source._list()] == ["kept.yaml"]


async def test_admission_rejects_with_kubelet_reason(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path, max_pods=2) as env:
        env.write("big.yaml", pod_manifest("big", container={"resources": {"requests": {"cpu": "100"}}}))
        status = await wait_for(lambda: _phase(env, "big", "Failed"), what="big pod rejected")
        assert status["reason"] == "OutOfcpu"
        assert status["message"].startswith("Pod was rejected: Node didn't have enough resource: cpu, requested: 100000")
        env.write("p1.yaml", pod_manifest("p1"))
        env.write("p2.yaml", pod_manifest("p2"))
        await env.wait_running("p1")
        await env.wait_running("p2")
        env.write("p3.yaml", pod_manifest("p3"))
        status = await wait_for(lambda: _phase(env, "p3", "Failed"), what="third pod rejected by maxPods")
        assert status["reason"] == "OutOfpods"
        # The pod's OS (spec.os.name, or the kubernetes.io/os label) must be the node's.
        env.write("win.yaml", pod_manifest("win", os={"name": "windows"}))
        status = await wait_for(lambda: _phase(env, "win", "Failed"), what="windows pod rejected")
        assert status["reason"] == "PodOSNotSupported"
        assert status["message"] == "Pod was rejected: Failed to admit pod as the OS field doesn't match node OS"
        win_label = pod_manifest("winlabel")
        win_label["metadata"]["labels"] = {"kubernetes.io/os": "windows"}
        env.write("winlabel.yaml", win_label)
        status = await wait_for(lambda: _phase(env, "winlabel", "Failed"), what="windows-labelled pod rejected")
        assert status["reason"] == "PodOSSelectorNodeLabelDoesNotMatch"
        sandboxes, _ = await runtime_objects(env.client, env.node)
        assert len(sandboxes) == 2  # nothing was set up for rejected pods


async def test_deletion_during_setup_cancels_it_and_tears_down(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        # The image cannot be pulled, so setup is stuck retrying in prepare when we delete it.
        env.write("stuck.yaml", pod_manifest("stuck", container={"image": "registry.invalid/nothing:1"}))

        async def pulling_failed() -> dict[str, Any] | None:
            cs = (env.status_of("stuck").get("containerStatuses") or [{}])[0]
            reason = cs.get("state", {}).get("waiting", {}).get("reason")
            return cs if reason in ("ErrImagePull", "ImagePullBackOff") else None

        await wait_for(pulling_failed, what="ErrImagePull / ImagePullBackOff")
        uid = env.uid_of("stuck")
        env.remove("stuck.yaml")
        await wait_for(lambda: _forgotten(env, uid), what="stuck pod forgotten")

        # Deleting right after adding races setup at every step; the runtime must end empty.
        for i in range(3):
            env.write(f"r{i}.yaml", pod_manifest(f"r{i}"))
            await anyio.sleep(0.05 * i)
            env.remove(f"r{i}.yaml")
        await env.wait_empty()


async def _forgotten(env: Any, uid: str | None) -> bool:
    return env.uid_of("stuck") is None and uid not in env.agent.dispatcher.workers


async def test_agent_restart_adopts_pods_and_removes_orphans(containerd: Any, tmp_path: Path) -> None:
    from tests.agent_helpers import make_config

    config = make_config(tmp_path, containerd.endpoint)
    async with running_agent(containerd, tmp_path, config=config, cleanup=False) as env:
        env.write("keep.yaml", pod_manifest("keep"))
        env.write("drop.yaml", pod_manifest("drop"))
        kept = await env.wait_running("keep")
        await env.wait_running("drop")
    # The agent stopped; its pods keep running. Remove one manifest while it is down.
    (config.static_pod_path / "drop.yaml").unlink()  # type: ignore[operator]
    async with running_agent(containerd, tmp_path, config=config) as env:
        await wait_for(lambda: _only_keep(env, kept.id), what="keep adopted, drop removed as an orphan")
        assert env.agent.status.all()[kept.labels[L.POD_UID]][3] is PodState.RUNNING


async def _only_keep(env: Any, container_id: str) -> bool:
    sandboxes, containers = await runtime_objects(env.client, env.node)
    return [c.id for c in containers] == [container_id] and len(sandboxes) == 1 and bool(
        env.uid_of("keep") and env.agent.status.all()[env.uid_of("keep")][3] is PodState.RUNNING
    )


async def test_dead_runtime_socket_is_reported_and_retried(tmp_path: Path) -> None:
    from nodeagent.agent import Agent
    from tests.agent_helpers import make_config

    socket = tmp_path / "no-such.sock"
    agent = Agent(make_config(tmp_path, f"unix://{socket}"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.run)
        await wait_for(lambda: _at_least(agent.metrics.counters, "RuntimeUnavailable", 2), timeout=15,
                       what="repeated RuntimeUnavailable facts")
        assert not agent.ready.is_set()
        tg.cancel_scope.cancel()


async def test_runtime_outage_is_reported_and_the_agent_recovers(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("before.yaml", pod_manifest("before"))
        before = await env.wait_running("before")
        await anyio.to_thread.run_sync(containerd.stop_daemon)
        try:
            await wait_for(lambda: _at_least(env.agent.metrics.counters, "RuntimeUnavailable", 1),
                           what="RuntimeUnavailable while containerd is down")
            assert env.agent.healthz()[0] is False
            env.write("during.yaml", pod_manifest("during"))  # arrives while the runtime is away
            await anyio.sleep(1)
        finally:
            await anyio.to_thread.run_sync(containerd.start)
        await wait_for(lambda: _at_least(env.agent.metrics.counters, "RuntimeAvailable", 1),
                       what="RuntimeAvailable after containerd is back")
        await env.wait_running("during", timeout=60)
        assert [c.id for c in await env.running_containers("before")] == [before.id]  # untouched
        assert env.agent.healthz()[0] is True


async def test_each_pods_status_is_a_json_file_under_the_root_dir(containerd: Any, tmp_path: Path) -> None:
    import json

    async with running_agent(containerd, tmp_path) as env:
        env.write("filed.yaml", pod_manifest("filed"))
        await env.wait_seen_running("filed")
        uid = env.uid_of("filed")
        path = env.config.root_dir / "pod-status" / f"default_filed-{env.node}_{uid}.json"

        async def running_on_file() -> bool:
            return path.exists() and json.loads(path.read_text())["status"].get("phase") == "Running"

        await wait_for(running_on_file, 30, "the status file showing the pod Running")
        data = json.loads(path.read_text())
        assert data["pod"]["uid"] == uid and data["status"]["containerStatuses"][0]["ready"] is True
        env.remove("filed.yaml")
        await wait_for(lambda: _file_missing(path), 60, "the status file removed with the pod")


async def _file_missing(path: Path) -> bool:
    return not path.exists()
