"""Per-pod causal history: a ring buffer of each pod's facts (and optionally a JSONL file), so
``nodeagent trace POD`` can answer "why is my pod not running?" with the chain of events and the
time each step took."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from nodeagent.bus import Inbox
from nodeagent.events import Event

PER_POD = 500
PODS = 2000


class Trace:
    def __init__(self, file: Path | None = None) -> None:
        self._pods: dict[str, deque[Event]] = {}
        self._names: dict[str, str] = {}
        self._keys: dict[str, set[str]] = {}
        """The names each pod put in ``_names`` (dropped with the pod)."""
        self._file = file

    async def run(self, inbox: Inbox) -> None:
        handle = self._file.open("a") if self._file else None
        try:
            async with inbox:
                async for event in inbox:
                    self.record(event)
                    if handle is not None:
                        handle.write(event.model_dump_json() + "\n")
                        handle.flush()
        finally:
            if handle is not None:
                handle.close()

    def record(self, event: Event) -> None:
        uid = event.pod.uid
        if not uid:
            return
        if uid not in self._pods and len(self._pods) >= PODS:
            oldest = next(iter(self._pods))
            del self._pods[oldest]
            # Its names go with it (the names of thousands of pods come and gone, fuzzing showed,
            # are memory that only grows).
            for key in self._keys.pop(oldest, ()):
                if self._names.get(key) == oldest:
                    del self._names[key]
        self._pods.setdefault(uid, deque(maxlen=PER_POD)).append(event)
        if event.pod.name:
            full = f"{event.pod.namespace}/{event.pod.name}"
            if self._names.get(full) != uid:
                self._names[full] = uid
                self._keys.setdefault(uid, set()).add(full)
            if event.pod.name not in self._names:
                self._names[event.pod.name] = uid
                self._keys.setdefault(uid, set()).add(event.pod.name)

    def resolve(self, key: str) -> str | None:
        if key in self._pods:
            return key
        return self._names.get(key)

    def chain(self, key: str) -> list[dict[str, Any]]:
        """The pod's events in order, each with the seconds since the previous one and since
        its cause."""
        uid = self.resolve(key)
        if uid is None:
            return []
        events = list(self._pods.get(uid, ()))
        at_by_id = {e.id: e.at for e in events}
        out = []
        previous = events[0].at if events else 0.0
        for e in events:
            data = json.loads(e.model_dump_json())
            data["since_previous_seconds"] = round(e.at - previous, 6)
            if e.cause in at_by_id:
                data["since_cause_seconds"] = round(e.at - at_by_id[e.cause], 6)
            previous = e.at
            out.append(data)
        return out
