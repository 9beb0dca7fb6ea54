"""What the runtime stage knows about a pod that the runtime does not show, for the status
stage: which containers are still inside their postStart hook (the kubelet does not report
a container started until its postStart returned)."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from nodeagent.stash import Stash, StashKey


@dataclass
class RuntimeNotes:
    post_start_running: set[str] = field(default_factory=set)
    """Container ids whose postStart hook has not returned yet."""
    changed: anyio.Event = field(default_factory=anyio.Event)
    """Set (and replaced) whenever a note changes, so the status stage looks again."""

    def touch(self) -> None:
        changed, self.changed = self.changed, anyio.Event()
        changed.set()


NOTES = StashKey[RuntimeNotes]("runtime.notes")


def notes_of(stash: Stash) -> RuntimeNotes:
    return stash.setdefault(NOTES, RuntimeNotes())
