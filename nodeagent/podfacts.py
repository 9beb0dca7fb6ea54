"""The per-pod facts the built-in stages share (nodeagent.facts), and the data they carry.

Each is provided by one stage and read by others, as their ``provides`` / ``requires`` /
``uses`` declare; ``nodeagent wiring`` prints who is who. Data only: no stage needs another
stage's module to read a fact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from nodeagent.facts import Fact, FactAccess
from nodeagent.kube.resize import ResizeState


@dataclass
class RuntimeNotes:
    """What the runtime stage knows about a pod that the runtime does not show: which
    containers are still inside their postStart hook (the kubelet does not report a container
    started until its postStart returned)."""

    post_start_running: set[str] = field(default_factory=set)
    """Container ids whose postStart hook has not returned yet."""
    recursive_read_only: dict[str, frozenset[str]] = field(default_factory=dict)
    """Container name -> the mount paths its latest instance got recursively read-only (what
    its status.volumeMounts report as recursiveReadOnly: Enabled)."""
    changed: anyio.Event = field(default_factory=anyio.Event)
    """Set (and replaced) whenever a note changes, so the status stage looks again."""

    def touch(self) -> None:
        changed, self.changed = self.changed, anyio.Event()
        changed.set()


RUNTIME_NOTES = Fact[RuntimeNotes]("runtime.notes", "postStart hooks still running, and a change signal "
                                   "(runtime → status)")
RESIZE = Fact[ResizeState]("runtime.resize", "allocated resources and the state of an in-place resize "
                           "(runtime → status)")
RESTART_ALL_AT = Fact[int]("runtime.restartAllAt", "when the pod was last restarted as a whole by a "
                           "RestartAllContainers rule, ns (runtime → status)")
STARTUP_PASSED = Fact[set[str]]("probes.startupPassed", "container instances whose startup probe succeeded "
                                "(probes → runtime: a sidecar with a startup probe counts as started only then)")


def notes_of(facts: FactAccess) -> RuntimeNotes:
    """The pod's runtime notes, made by their provider on first use."""
    notes = facts.get(RUNTIME_NOTES)
    if notes is None:
        notes = RuntimeNotes()
        facts.set(RUNTIME_NOTES, notes)
    return notes


__all__ = ["RESIZE", "RESTART_ALL_AT", "RUNTIME_NOTES", "RuntimeNotes", "STARTUP_PASSED", "notes_of"]
