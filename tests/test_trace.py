"""The trace keeps each pod's story within bounds: summaries instead of whole objects (no
inline env value of a pod spec in it), a byte budget per pod and for all pods."""

from __future__ import annotations

import json
from pathlib import Path

from nodeagent import events as ev
from nodeagent.trace import MAX_STRING, PODS, Trace


def _spec(name: str, secret: str = "", padding: int = 0) -> ev.PodSpecObserved:
    pod = {"metadata": {"name": name, "uid": name, "resourceVersion": "7", "annotations": {"big": "x" * padding}},
           "spec": {"containers": [{"name": "main", "image": "busybox", "env": [{"name": "TOKEN", "value": secret}]}]}}
    return ev.PodSpecObserved(pod=ev.PodRef(uid=name, namespace="default", name=name), origin="file", pod_spec=pod)


def test_a_pod_spec_is_kept_as_a_summary_without_its_values(tmp_path: Path) -> None:
    file = tmp_path / "trace.jsonl"
    trace = Trace(file)
    trace.record(_spec("web", secret="hunter2", padding=100_000))
    trace.close()
    chain = trace.chain("default/web")
    assert chain[0]["pod_spec"] == {"containers": [{"name": "main", "image": "busybox"}], "resourceVersion": "7"}
    assert "hunter2" not in file.read_text() and "hunter2" not in json.dumps(chain)
    assert trace.size < 1000, "a 100 kB spec costs the trace a few hundred bytes"


def test_long_strings_are_cut() -> None:
    trace = Trace()
    trace.record(ev.StageFailed(pod=ev.PodRef(uid="u", name="p"), phase="prepare", error="e" * 50_000,
                                retryable=True, duration_seconds=0.1))
    error = trace.chain("u")[0]["error"]
    assert error.startswith("e" * MAX_STRING) and error.endswith("(50000 characters)")


def test_each_pod_and_all_pods_stay_within_their_byte_budgets() -> None:
    trace = Trace(per_pod_bytes=4096, total_bytes=64 * 1024)
    for i in range(1000):
        trace.record(ev.PodWaiting(pod=ev.PodRef(uid="busy", name="busy"), phase="prepare", reason="R",
                                   message=f"attempt {i}"))
    chain = trace.chain("busy")
    assert sum(len(json.dumps(e)) for e in chain) < 2 * 4096
    assert chain[-1]["message"] == "attempt 999", "the newest facts are kept"
    for i in range(2000):
        trace.record(_spec(f"pod{i}"))
    assert trace.size <= 64 * 1024
    assert trace.chain("pod1999") and not trace.chain("pod0"), "the least recently updated pods go first"
    assert trace.resolve("default/pod0") is None, "their names go with them"


def test_a_name_taken_over_by_a_newer_pod_stays_the_newer_pods() -> None:
    trace = Trace()
    trace.record(ev.PodAdmitted(source="worker", pod=ev.PodRef(uid="old", namespace="ns", name="web")))
    trace.record(ev.PodAdmitted(source="worker", pod=ev.PodRef(uid="new", namespace="ns", name="web")))
    for i in range(PODS - 1):  # the least recently updated pod ("old") goes, "new" stays
        trace.record(ev.PodAdmitted(source="worker", pod=ev.PodRef(uid=f"u{i}", namespace="ns", name=f"p{i}")))
    assert trace.chain("new") and not trace.chain("old")
    assert trace.resolve("ns/web") == "new"
