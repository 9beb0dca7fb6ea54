"""Per-pod causal history, so ``nodeagent trace POD`` can answer "why is my pod not running?"
with the chain of events and the time each step took (optionally also a JSONL file).

Bounded in bytes, not only in events: each fact is kept as a summary — one compact JSON line,
the pod's spec reduced to its containers and images (a spec can be megabytes, and its inline
env values are nobody's business in a trace), long strings cut — within a budget per pod and
one for all pods; the pods touched least recently go first.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from nodeagent.events import Event, PodSpecObserved

PER_POD = 500
"""Facts kept per pod (the oldest go first)."""
PER_POD_BYTES = 64 * 1024
PODS = 2000
TOTAL_BYTES = 16 * 1024 * 1024
"""All pods' summaries together; a pod past this is forgotten, least recently updated first."""
MAX_STRING = 1024
"""Longer strings in a fact (a message, an error) are cut to this many characters."""


def summarize(event: Event) -> dict[str, Any]:
    """The fact as the trace keeps it: data fields, strings bounded, a pod spec summarised."""
    if isinstance(event, PodSpecObserved):
        data = event.model_dump(mode="json", exclude={"pod_spec"})
        data["pod_spec"] = _spec_summary(event.pod_spec)
    else:
        data = event.model_dump(mode="json")
    bounded: dict[str, Any] = _bounded(data)
    return bounded


def _spec_summary(pod: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = pod["spec"] if isinstance(pod.get("spec"), dict) else {}
    meta: dict[str, Any] = pod["metadata"] if isinstance(pod.get("metadata"), dict) else {}
    out: dict[str, Any] = {}
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if isinstance(items, list) and items:
            out[key] = [{"name": c.get("name"), "image": c.get("image")} for c in items if isinstance(c, dict)]
    for key in ("generation", "resourceVersion"):
        if key in meta:
            out[key] = meta[key]
    return out


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING else value[:MAX_STRING] + f"... ({len(value)} characters)"
    if isinstance(value, dict):
        return {k: _bounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bounded(v) for v in value]
    return value


@dataclass
class _Entry:
    id: int
    at: float
    cause: int | None
    line: str


@dataclass
class _PodHistory:
    entries: deque[_Entry] = field(default_factory=deque)
    size: int = 0
    names: set[str] = field(default_factory=set)


class Trace:
    def __init__(self, file: Path | None = None, *, per_pod: int = PER_POD, per_pod_bytes: int = PER_POD_BYTES,
                 total_bytes: int = TOTAL_BYTES) -> None:
        self._pods: OrderedDict[str, _PodHistory] = OrderedDict()
        self._names: dict[str, str] = {}
        self._file = file
        self._handle: IO[str] | None = None
        self._per_pod = per_pod
        self._per_pod_bytes = per_pod_bytes
        self._total_bytes = total_bytes
        self.size = 0
        """Bytes of summaries held, all pods together."""

    def record(self, event: Event) -> None:
        uid = event.pod.uid
        if not uid and self._file is None:
            return
        line = json.dumps(summarize(event), separators=(",", ":"))
        if self._file is not None:
            if self._handle is None:
                self._handle = self._file.open("a")
            self._handle.write(line + "\n")
            self._handle.flush()
        if not uid:
            return
        history = self._pods.get(uid)
        if history is None:
            history = self._pods[uid] = _PodHistory()
        else:
            self._pods.move_to_end(uid)
        if event.pod.name:
            for key in (f"{event.pod.namespace}/{event.pod.name}", event.pod.name):
                if key not in history.names:
                    history.names.add(key)
                    self._names.setdefault(key, uid)
            self._names[f"{event.pod.namespace}/{event.pod.name}"] = uid
        history.entries.append(_Entry(event.id, event.at, event.cause, line))
        history.size += len(line)
        self.size += len(line)
        while len(history.entries) > 1 and (len(history.entries) > self._per_pod
                                            or history.size > self._per_pod_bytes):
            gone = history.entries.popleft()
            history.size -= len(gone.line)
            self.size -= len(gone.line)
        while (self.size > self._total_bytes or len(self._pods) > PODS) and len(self._pods) > 1:
            self._evict(next(iter(self._pods)))

    def _evict(self, uid: str) -> None:
        history = self._pods.pop(uid)
        self.size -= history.size
        for key in history.names:
            if self._names.get(key) == uid:
                del self._names[key]

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def resolve(self, key: str) -> str | None:
        if key in self._pods:
            return key
        return self._names.get(key)

    def chain(self, key: str) -> list[dict[str, Any]]:
        """The pod's facts in order, each with the seconds since the previous one and since
        its cause."""
        uid = self.resolve(key)
        history = self._pods.get(uid) if uid is not None else None
        if history is None:
            return []
        at_by_id = {e.id: e.at for e in history.entries}
        out = []
        previous = history.entries[0].at if history.entries else 0.0
        for e in history.entries:
            data = json.loads(e.line)
            data["since_previous_seconds"] = round(e.at - previous, 6)
            if e.cause in at_by_id:
                data["since_cause_seconds"] = round(e.at - at_by_id[e.cause], 6)
            previous = e.at
            out.append(data)
        return out
