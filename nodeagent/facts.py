"""Per-pod facts that stages share, declared instead of left on a blackboard.

A stage that learns something about a pod that another stage needs (the runtime stage's
sandbox and pod IP, the probes stage's passed startup probes) publishes it as a :class:`Fact`
it declares in ``provides``; a stage that reads one declares it in ``requires`` (it cannot work
without a producer) or ``uses`` (it reads it when it is there). The registry checks the graph
when the agent loads — a required fact without a producer in the profile is a load error, like
a missing undo half — and ``nodeagent wiring`` prints it. Access is checked too: a stage reads
and writes only what it declared, so the graph is the truth.

What a stage keeps for itself stays in its private stash (``ctx.stash``); the fact types are
data only and live here, so no stage imports another stage's module to read them.

Container additions (mounts, devices, env a prepare stage gives a container) are a fact of
their own kind, kept per stage and container: see :mod:`nodeagent.additions`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


class Fact(Generic[T]):
    """The name and meaning of one per-pod fact; its type parameter is its value's type."""

    __slots__ = ("doc", "name")

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.doc = doc

    def __repr__(self) -> str:
        return f"Fact({self.name!r})"


class UndeclaredFact(Exception):
    """A stage read or wrote a fact it did not declare (a bug of that stage)."""


@dataclass
class PodFacts:
    """The facts of one pod (the worker keeps one per pod)."""

    _values: dict[Fact[Any], object] = field(default_factory=dict)

    def access(self, stage: str, provides: Iterable[Fact[Any]], reads: Iterable[Fact[Any]]) -> FactAccess:
        return FactAccess(self, stage, frozenset(provides), frozenset(reads))


class FactAccess:
    """What one stage may do with its pod's facts: ``ctx.facts``."""

    def __init__(self, facts: PodFacts, stage: str, provides: frozenset[Fact[Any]],
                 reads: frozenset[Fact[Any]]) -> None:
        self._facts = facts
        self._stage = stage
        self._provides = provides
        self._reads = reads | provides

    def get(self, fact: Fact[T], default: T | None = None) -> T | None:
        if fact not in self._reads:
            raise UndeclaredFact(f"stage {self._stage!r} reads fact {fact.name!r} without declaring it "
                                 "(add it to the stage's requires or uses)")
        return cast("T | None", self._facts._values.get(fact, default))

    def set(self, fact: Fact[T], value: T) -> None:
        self._check_provides(fact)
        self._facts._values[fact] = value

    def clear(self, fact: Fact[Any]) -> None:
        self._check_provides(fact)
        self._facts._values.pop(fact, None)

    def _check_provides(self, fact: Fact[Any]) -> None:
        if fact not in self._provides:
            raise UndeclaredFact(f"stage {self._stage!r} writes fact {fact.name!r} without declaring it "
                                 "(add it to the stage's provides)")


@dataclass(frozen=True)
class FactEdge:
    fact: Fact[Any]
    providers: tuple[str, ...]
    requirers: tuple[str, ...]
    users: tuple[str, ...]


def graph(stages: Mapping[str, Any]) -> list[FactEdge]:
    """Every fact the stages declare, with who provides, requires and uses it."""
    facts: dict[str, Fact[Any]] = {}
    roles: dict[str, tuple[list[str], list[str], list[str]]] = {}
    for name, stage in sorted(stages.items()):
        for index, attr in enumerate(("provides", "requires", "uses")):
            for fact in getattr(stage, attr, ()):
                facts[fact.name] = fact
                roles.setdefault(fact.name, ([], [], []))[index].append(name)
    return [FactEdge(facts[n], tuple(p), tuple(r), tuple(u)) for n, (p, r, u) in sorted(roles.items())]


def missing_providers(stages: Mapping[str, Any]) -> list[str]:
    """Problems with the graph: a fact some stage requires that no stage provides."""
    return [f"stage(s) {', '.join(edge.requirers)} require fact {edge.fact.name!r}, which no stage in the "
            f"profile provides" for edge in graph(stages) if edge.requirers and not edge.providers]


def render(stages: Mapping[str, Any]) -> str:
    lines = ["per-pod facts:"]
    for edge in graph(stages):
        readers = [*edge.requirers, *(f"({u})" for u in edge.users)]
        lines.append(f"  {edge.fact.name:<24} {', '.join(edge.providers) or '-':<24} -> "
                     f"{', '.join(readers) or '-'}")
    lines.append("  (stage) uses the fact when it is there; the others require it")
    return "\n".join(lines)


__all__ = ["Fact", "FactAccess", "FactEdge", "PodFacts", "UndeclaredFact", "graph", "missing_providers", "render"]
