"""Container additions per stage and container (issue 14 §2): a stage replaces and withdraws
exactly its own, the merge for one container takes every stage's (and the "*" ones), two stages
contradicting each other is an error naming both, and only declared stages may set or read."""

from __future__ import annotations

import pytest

from cri import types as t
from nodeagent.additions import (
    ALL_CONTAINERS,
    AdditionConflict,
    AdditionsAccess,
    ContainerAdditions,
    PodAdditions,
)
from nodeagent.facts import UndeclaredFact


def _mount(path: str, host: str) -> t.Mount:
    return t.Mount(container_path=path, host_path=host)


def test_each_stage_keeps_and_withdraws_only_its_own() -> None:
    pod = PodAdditions()
    volumes = AdditionsAccess(pod, "volumes", provides=True, uses=False)
    dra = AdditionsAccess(pod, "dra", provides=True, uses=False)
    runtime = AdditionsAccess(pod, "runtime", provides=False, uses=True)
    volumes.set("main", ContainerAdditions(mounts=[_mount("/data", "/v/data")]))
    dra.set("main", ContainerAdditions(envs={"GPU": "0"}, cdi_devices=[t.CDIDevice(name="x/gpu=0")]))
    dra.set(ALL_CONTAINERS, ContainerAdditions(envs={"DRIVER": "fake"}))
    merged = runtime.merged("main")
    assert [m.container_path for m in merged.mounts] == ["/data"]
    assert merged.envs == {"GPU": "0", "DRIVER": "fake"} and merged.contributed_by == {"volumes", "dra"}
    assert runtime.merged("sidecar").envs == {"DRIVER": "fake"}, "the '*' entries reach every container"
    volumes.set("main", ContainerAdditions(mounts=[_mount("/cache", "/v/cache")]))  # a retry replaces
    assert [m.container_path for m in runtime.merged("main").mounts] == ["/cache"]
    dra.withdraw()
    assert runtime.merged("main").envs == {} and pod.stages() == {"volumes"}
    volumes.withdraw("main")
    assert pod.stages() == set()


def test_contradicting_additions_name_both_stages() -> None:
    pod = PodAdditions()
    AdditionsAccess(pod, "volumes", True, False).set("main", ContainerAdditions(mounts=[_mount("/data", "/a")]))
    AdditionsAccess(pod, "csi", True, False).set("main", ContainerAdditions(mounts=[_mount("/data", "/b")]))
    with pytest.raises(AdditionConflict, match="mount path '/data' of container 'main' is given by stages "
                                               "'volumes' and 'csi' differently"):
        pod.merged("main")
    AdditionsAccess(pod, "csi", True, False).set("main", ContainerAdditions(envs={"A": "1"}))
    AdditionsAccess(pod, "dra", True, False).set(ALL_CONTAINERS, ContainerAdditions(envs={"A": "2"}))
    with pytest.raises(AdditionConflict, match="env 'A'"):
        pod.merged("main")
    AdditionsAccess(pod, "dra", True, False).set(ALL_CONTAINERS, ContainerAdditions(envs={"A": "1"}))
    assert pod.merged("main").envs == {"A": "1"}, "the same value from two stages is no contradiction"


def test_only_declared_stages_set_or_read_additions() -> None:
    pod = PodAdditions()
    with pytest.raises(UndeclaredFact, match="sets container additions without declaring"):
        AdditionsAccess(pod, "probes", provides=False, uses=False).set("main", ContainerAdditions())
    with pytest.raises(UndeclaredFact, match="reads container additions without declaring"):
        AdditionsAccess(pod, "volumes", provides=True, uses=False).merged("main")
