"""Static pods through the whole agent, against the real containerd."""

from __future__ import annotations

import inspect
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
        # topologySpreadConstraints (the scheduler's business): parsed, not acted upon, harmless:
        # reported. (schedulingGates would be too, but a static pod has a nodeName, which the
        # API server's validation forbids beside gates.)
        env.write("good.yaml", pod_manifest("good", topologySpreadConstraints=[
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]))
        # A raw block device from a persistent volume claim: standalone there is no API server to
        # read the claim from, and the pod would run without its device: refused. (The device must
        # name a claim volume of the pod: the API server's validation, which static pods get.)
        env.write("block.yaml", pod_manifest("block", container={"volumeDevices": [{"name": "v", "devicePath": "/dev/xvda"}]},
                                             volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]))
        await env.wait_running("good")
        counters = env.agent.metrics.counters
        await wait_for(lambda: _at_least(counters, "ManifestRejected", 3), what="three ManifestRejected facts")
        chain = env.agent.trace.chain(f"default/good-{env.node}")
        unhonoured = [e for e in chain if e["kind"] == "UnhonouredFieldsFound"]
        assert unhonoured and unhonoured[0]["fields"] == ["spec.topologySpreadConstraints"]
        conditions = {c["type"]: c for c in env.status_of("good")["conditions"]}
        assert conditions["nodeagent.io/UnhonouredFields"]["message"].endswith("spec.topologySpreadConstraints")
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


async def test_a_failing_scan_is_retried_and_does_not_end_the_source(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from nodeagent import events as ev
    from nodeagent.sources import static

    published: list[ev.Event] = []

    async def publish(event: ev.Event) -> None:
        published.append(event)

    source = static.StaticPodSource(tmp_path, "node1", publish, poll_seconds=0.01)
    real = source._reconcile
    calls = 0

    async def fails_once() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("a bug of ours")
        await real()

    monkeypatch.setattr(source, "_reconcile", fails_once)
    (tmp_path / "a.yaml").write_text(json.dumps(pod_manifest("a")))
    async with anyio.create_task_group() as tg:
        await tg.start(source.run)  # the first scan's reconcile raises: logged, the source goes on
        await wait_for(lambda: _published(published), 5, "the pod published by a later scan")
        tg.cancel_scope.cancel()
    assert calls >= 2


async def _published(events: list[Any]) -> bool:
    return any(getattr(e, "kind", "") == "PodSpecObserved" for e in events)


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


async def test_an_image_pull_back_off_says_why_the_pull_failed(containerd: Any, tmp_path: Path) -> None:
    """As the kubelet's image manager (prevPullErrMsg): in ImagePullBackOff the waiting message
    carries the failed pull's reason and message, not only that the pod backs off."""
    image = "registry.invalid/nothing:1"
    async with running_agent(containerd, tmp_path) as env:
        env.write("stuck.yaml", pod_manifest("stuck", container={"image": image}))

        async def backing_off() -> dict[str, Any] | None:
            cs = (env.status_of("stuck").get("containerStatuses") or [{}])[0]
            waiting = cs.get("state", {}).get("waiting", {})
            return waiting if waiting.get("reason") == "ImagePullBackOff" else None

        waiting = await wait_for(backing_off, what="ImagePullBackOff")
        prefix = f'Back-off pulling image "{image}": ErrImagePull: Failed to pull image "{image}": '
        assert waiting["message"].startswith(prefix) and len(waiting["message"]) > len(prefix), waiting


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


KUBECTL_COPY = """\
apiVersion: v1
kind: Pod
metadata:
  creationTimestamp: 2024-05-01T10:00:00Z
  labels: {app: copied}
  name: copied
  namespace: default
  resourceVersion: "123456"
  uid: 0b5d7c3e-1111-4222-8333-944455556666
  managedFields:
  - {manager: kubectl-run, operation: Update, time: 2024-05-01T10:00:00Z, fieldsType: FieldsV1, fieldsV1: {}}
spec:
  containers:
  - command: [sh, -c, "trap 'exit 0' TERM; sleep 3600 & wait"]
    image: IMAGE
    imagePullPolicy: IfNotPresent
    name: main
  nodeName: some-other-node
  terminationGracePeriodSeconds: 2
status:
  conditions:
  - {lastProbeTime: null, lastTransitionTime: 2024-05-01T10:00:00Z, status: "True", type: Ready}
  containerStatuses:
  - {name: main, ready: true, restartCount: 4, state: {running: {startedAt: 2024-05-01T10:00:01Z}}}
  phase: Running
  startTime: 2024-05-01T10:00:00Z
"""
SECRET = "hunter2-not-for-logs"
_LAUGHS = "\n".join(["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
    f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 10)])


def _hostile(name: str, **spec: Any) -> str:
    import json

    return json.dumps(pod_manifest(name, **spec))


HOSTILE = {
    "laughs.yaml": _LAUGHS,
    "deep.yaml": "[" * 200_000,
    "python.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: !!python/object/apply:os.system [touch /tmp/x]\n",
    "binary.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: b, labels: {x: !!binary aGVsbG8=}}\nspec: {}\n",
    "set.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: s}\nspec: !!set {a, b}\n",
    "timestamp.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: t}\nspec: {activeDeadlineSeconds: 2024-01-01}\n",
    "keys.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: k, labels: {1: a}}\nspec: {}\n",
    "long.yaml": _hostile("x" * 300),
    "quantity.yaml": _hostile("q", container={"resources": {"limits": {"cpu": "lots"}}}),
    "port.yaml": _hostile("port", container={"ports": [{"containerPort": 70000}]}),
    "secret.yaml": f"apiVersion: v1\nkind: Pod\nmetadata: {{name: sec}}\nspec:\n  containers: [{{name: a, env: "
                   f"[{{name: X, value: {SECRET}\n",
}


async def test_hostile_manifests_are_rejected_and_a_kubectl_copy_runs(containerd: Any, tmp_path: Path) -> None:
    """At 1b354e0 each of these stopped the agent (and left its pods running unmanaged)."""
    from tests.manifest_fuzz import watching_logs

    with watching_logs() as watch:
        async with running_agent(containerd, tmp_path) as env:
            env.write("good.yaml", pod_manifest("good"))
            good = await env.wait_running("good")
            for name, text in HOSTILE.items():
                (env.manifests / name).write_text(text)
            from tests.agent_helpers import BUSYBOX_IMAGE

            (env.manifests / "copy.yaml").write_text(KUBECTL_COPY.replace("IMAGE", BUSYBOX_IMAGE))
            copied = await env.wait_running("copied")
            await wait_for(lambda: _all_rejected(watch, env.manifests, HOSTILE), what="every hostile file rejected")
            reasons = {Path(p).name: r[0] for p, r in watch.rejected.items()}
            assert reasons == {
                "laughs.yaml": "ManifestTooLarge", "deep.yaml": "ManifestTooLarge", "python.yaml": "ManifestInvalid",
                "binary.yaml": "ManifestInvalid", "set.yaml": "ManifestInvalid", "timestamp.yaml": "ManifestInvalid",
                "keys.yaml": "ManifestInvalid", "long.yaml": "ManifestInvalid", "quantity.yaml": "ManifestInvalid",
                "port.yaml": "ManifestInvalid", "secret.yaml": "ManifestMalformed"}
            messages = {Path(p).name: m[0] for p, m in watch.messages.items()}
            assert messages["port.yaml"].endswith("spec.containers[0].ports[0].containerPort: Invalid value: 70000: "
                                                  "must be between 1 and 65535, inclusive")
            assert messages["timestamp.yaml"].endswith('spec.activeDeadlineSeconds: Invalid value: "string": must be '
                                                       "of type integer")
            assert SECRET not in repr(watch.messages) and not watch.leaked and not watch.problems
            # The copy runs as a static pod of this node; its status, UID and resourceVersion are not its own.
            assert env.uid_of("copied") != "0b5d7c3e-1111-4222-8333-944455556666"
            status = await wait_for(lambda: _phase(env, "copied", "Running"), what="copy Running")
            assert status["containerStatuses"][0]["restartCount"] == 0
            assert copied.labels[L.POD_NAME] == f"copied-{env.node}"
            assert [c.id for c in await env.running_containers("good")] == [good.id]


async def _all_rejected(watch: Any, directory: Path, files: dict[str, str]) -> bool:
    return all(str(directory / name) in watch.rejected for name in files)


async def test_the_largest_grace_period_is_honoured_without_overflow(containerd: Any, tmp_path: Path) -> None:
    """terminationGracePeriodSeconds 2^63-1 is a valid int64; it used to overflow the
    StopContainer request (ValueError in the stop phase: the container was never stopped by it)."""
    from tests.manifest_fuzz import SLEEP, watching_logs

    with watching_logs() as watch:
        async with running_agent(containerd, tmp_path) as env:
            env.write("forever.yaml", pod_manifest("forever", SLEEP, terminationGracePeriodSeconds=2**63 - 1,
                                                   container={"lifecycle": {"preStop": {"sleep": {"seconds": 0}}}}))
            await env.wait_running("forever")
            env.remove("forever.yaml")
            await env.wait_empty(30)  # the container traps SIGTERM and exits at once
    assert not watch.problems, watch.problems


async def test_no_start_is_in_flight_when_the_teardown_lists_the_pod(containerd: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A StartContainer cut off on our side by a kill still completes in containerd. If the stop
    phase lists the pod's containers meanwhile, it sees this one merely created and does not
    stop it; containerd's StopPodSandbox skips a starting container too, and the container runs
    on past the teardown (found by the manifest fuzzer: cleanup's RemoveContainer failed with
    "cannot delete running task"). So a start, once asked for, is waited for: when the teardown
    lists the pod, no start of ours is unanswered. Here the runtime takes a second to answer."""
    from cri import CriError, RuntimeClient
    from cri import types as ct
    from tests.manifest_fuzz import SLEEP

    real_start, real_list = RuntimeClient.start_container, RuntimeClient.list_containers
    in_flight: list[str] = []
    seen_in_flight: list[list[str]] = []
    asked, killed = anyio.Event(), anyio.Event()

    async with anyio.create_task_group() as runtime_side:
        async def slow_start(self: RuntimeClient, container_id: str) -> None:
            done = anyio.Event()

            async def runtime() -> None:  # the runtime's side: not cancelled by our caller
                in_flight.append(container_id)
                try:
                    await anyio.sleep(1)
                    await real_start(self, container_id)
                except (CriError, RuntimeError):  # the sandbox, or the agent's client, is gone by now
                    pass
                finally:
                    in_flight.remove(container_id)
                    done.set()

            runtime_side.start_soon(runtime)
            asked.set()
            await done.wait()

        async def listing(self: RuntimeClient, filter: ct.ContainerFilter | None = None) -> list[Any]:
            # The teardown's own listing of the pod (the relister lists single pods too, and may
            # while a start is in flight: that one is not the teardown's).
            teardown = any(f.function == "_containers" and f.filename.endswith("plugins/runtime/__init__.py")
                           for f in inspect.stack(context=0))
            if killed.is_set() and teardown and filter is not None and L.POD_UID in (filter.label_selector or {}):
                seen_in_flight.append(list(in_flight))
            return await real_list(self, filter)

        monkeypatch.setattr(RuntimeClient, "start_container", slow_start)
        monkeypatch.setattr(RuntimeClient, "list_containers", listing)
        async with running_agent(containerd, tmp_path) as env:
            env.write("late.yaml", pod_manifest("late", SLEEP))
            await asked.wait()
            killed.set()
            env.remove("late.yaml")  # the kill arrives while the start is in flight
            await env.wait_empty(30)
    assert seen_in_flight and all(not ids for ids in seen_in_flight), seen_in_flight


async def test_the_longest_valid_names_neither_stop_the_agent_nor_loop_on_exceptions(containerd: Any,
                                                                                    tmp_path: Path) -> None:
    """A 253-character pod name in a 63-character namespace is valid, yet "<ns>_<name>_<uid>"
    is longer than a file name may be. The status file used it (ENAMETOOLONG stopped the status
    writer, and the agent). Host path names that do not fit are shortened with a digest
    (nodeagent/hostpaths.fit): the status file and the pod's log directory (where the kubelet
    would fail the pod's sandbox for ever), so the pod runs, and nothing raises."""
    import json

    from nodeagent.hostpaths import HASH_MARK, MAX_NAME_BYTES
    from tests.manifest_fuzz import SLEEP, watching_logs

    with watching_logs() as watch:
        async with running_agent(containerd, tmp_path) as env:
            name = "a" * (253 - len(env.node) - 1)
            long = pod_manifest(name, SLEEP, container_name="c" * 63)
            long["metadata"]["namespace"] = "n" * 63
            env.write("long.yaml", long)
            env.write("short.yaml", pod_manifest("short"))
            await env.wait_running("short")
            await env.wait_running(name)
            uid = next(u for u, (ref, *_rest) in env.agent.status.all().items() if ref.namespace == "n" * 63)
            [status_file] = [p for p in (env.config.root_dir / "pod-status").iterdir() if p.name.startswith("n" * 63)]
            assert len(status_file.name) == MAX_NAME_BYTES and HASH_MARK in status_file.name
            assert status_file.name.endswith(".json")

            async def running() -> dict[str, Any] | None:
                # The runtime shows the container running a relist before the status file does.
                status = json.loads(status_file.read_text())
                return status if status["status"]["phase"] == "Running" else None

            status = await wait_for(running, what="the long-named pod's status file saying Running")
            assert status["pod"]["uid"] == uid
            [log_dir] = [p for p in env.config.pod_logs_dir.iterdir() if p.name.startswith("n" * 63)]
            assert len(log_dir.name) == MAX_NAME_BYTES and HASH_MARK in log_dir.name
            assert list(log_dir.iterdir()), "the container logs where the sandbox's log directory says"
    assert not watch.problems, watch.problems


async def test_an_executable_name_no_file_can_have_waits_with_a_config_error(containerd: Any, tmp_path: Path) -> None:
    """containerd 2.4 never answers the StartContainer of a 100 kB executable name (found by the
    manifest fuzzer): the container waits with CreateContainerConfigError and says why, no
    runtime call is made for it, and deleting the pod removes it at once."""
    async with running_agent(containerd, tmp_path) as env:
        doc = pod_manifest("long", restartPolicy="Never")
        doc["spec"]["containers"][0]["command"] = ["y" * 100_000]
        env.write("long.yaml", doc)

        async def config_error() -> dict[str, Any] | None:
            statuses = env.status_of("long").get("containerStatuses") or [{}]
            waiting = statuses[0].get("state", {}).get("waiting", {})
            return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

        waiting = await wait_for(config_error, 30, "CreateContainerConfigError")
        assert "100000 bytes long" in waiting["message"] and "cannot be started" in waiting["message"]
        _, containers = await runtime_objects(env.client, env.node)
        assert not containers  # nothing created: the runtime was never asked
        env.remove("long.yaml")
        await env.wait_empty(20)
