"""The trace's bounds: a pod's causal chain and the names it is found by go together."""

from __future__ import annotations

from nodeagent import events as ev
from nodeagent import trace


def test_names_are_forgotten_with_their_pods() -> None:
    t = trace.Trace()
    for i in range(trace.PODS + 500):  # pods come and go, each with a name of its own
        t.record(ev.PodAdmitted(source="worker", pod=ev.PodRef(uid=f"u{i}", namespace="ns", name=f"p{i}")))
    assert len(t._pods) == trace.PODS
    assert len(t._names) == 2 * trace.PODS  # "ns/name" and "name" of the pods kept, no more
    assert t.resolve("ns/p0") is None and t.resolve(f"ns/p{trace.PODS + 499}") == f"u{trace.PODS + 499}"
    # A name taken over by a newer pod stays the newer pod's when the older one goes.
    t = trace.Trace()
    t.record(ev.PodAdmitted(source="worker", pod=ev.PodRef(uid="old", namespace="ns", name="web")))
    t.record(ev.PodAdmitted(source="worker", pod=ev.PodRef(uid="new", namespace="ns", name="web")))
    for i in range(trace.PODS - 1):  # the oldest pod ("old") goes, "new" stays
        t.record(ev.PodAdmitted(source="worker", pod=ev.PodRef(uid=f"u{i}", namespace="ns", name=f"p{i}")))
    assert "old" not in t._pods and t.resolve("ns/web") == "new"
