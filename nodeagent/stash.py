"""Per-pod, per-plugin state: a typed stash (the pytest ``Stash`` idea).

A stage keeps what it learned about a pod (the sandbox id, prepared devices) under a
module-level ``StashKey[T]``; nobody else can read it by accident and nothing forces setter
methods onto plugins.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast, overload

T = TypeVar("T")
D = TypeVar("D")


class StashKey(Generic[T]):
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StashKey({self.name!r})"


class Stash:
    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[StashKey[Any], object] = {}

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        self._items[key] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        return cast(T, self._items[key])

    @overload
    def get(self, key: StashKey[T]) -> T | None: ...
    @overload
    def get(self, key: StashKey[T], default: D) -> T | D: ...
    def get(self, key: StashKey[T], default: object = None) -> object:
        return self._items.get(key, default)

    def setdefault(self, key: StashKey[T], default: T) -> T:
        return cast(T, self._items.setdefault(key, default))

    def pop(self, key: StashKey[T], default: T | None = None) -> T | None:
        return cast("T | None", self._items.pop(key, default))

    def __contains__(self, key: StashKey[Any]) -> bool:
        return key in self._items
