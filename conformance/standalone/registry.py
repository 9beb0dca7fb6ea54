"""The registry of ported cases: each is an upstream test under its upstream full name.

A case module registers its tests with :func:`case`; :func:`all_cases` imports every case module
and returns them in the order of conformance.md section 16.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conformance.standalone.framework import Framework


class Skipped(Exception):
    """The case cannot run here (say why); counted as skip, not as failure."""


CaseFn = Callable[["Framework"], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    """One ported upstream test."""

    name: str
    """The upstream full test name (Describe + Context + It, with tags): the case's id."""
    key: str
    """The catalogue's short id (conformance.md): RT1, K2a, CL8, ... (pytest ids, ``-k``)."""
    number: str
    """The row in conformance.md section 16 ("1".."40"; siblings a row names: "35a", ...)."""
    upstream: str
    """The upstream file, relative to kubernetes/kubernetes."""
    framework: str
    """The upstream ``NewDefaultFramework`` base name: the namespace prefix."""
    timeout: float
    """Seconds: what the upstream It may take at most (its waits added up), plus a margin."""
    run: CaseFn

    @property
    def doc(self) -> str:
        return (self.run.__doc__ or "").strip()

    @property
    def sort_key(self) -> tuple[int, str]:
        digits = re.match(r"\d+", self.number)
        return (int(digits.group()) if digits else 0, self.number)


REGISTRY: list[Case] = []


def case(name: str, *, key: str, number: str, upstream: str, framework: str,
         timeout: float) -> Callable[[CaseFn], CaseFn]:
    """Register a ported test. Its docstring must say what it mirrors and what the port changed."""

    def register(fn: CaseFn) -> CaseFn:
        if not (fn.__doc__ or "").strip():
            raise ValueError(f"case {key} has no docstring")
        if any(c.name == name or c.key == key for c in REGISTRY):
            raise ValueError(f"case {key} ({name}) registered twice")
        REGISTRY.append(Case(name, key, number, upstream, framework, timeout, fn))
        return fn

    return register


def all_cases() -> list[Case]:
    import conformance.standalone.cases  # noqa: F401  (registers every case)

    return sorted(REGISTRY, key=lambda c: c.sort_key)


__all__ = ["REGISTRY", "Case", "CaseFn", "Skipped", "all_cases", "case"]
