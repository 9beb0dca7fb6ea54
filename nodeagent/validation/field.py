"""Field paths and field errors, rendered the way the API server renders them.

The counterpart of apimachinery's ``util/validation/field``: a :class:`Path` prints as
``spec.containers[0].ports[1].containerPort`` (map keys in brackets too:
``metadata.labels[app]``), and a :class:`FieldError` prints as the API server's message,
``spec.containers[0].ports[1].containerPort: Invalid value: 70000: must be between 1 and 65535,
inclusive``.

Values in messages: only the values of fields that have a format (names, numbers, enums,
quantities) are ever given to an error, never free text such as env values, annotation values,
commands or unknown fields, so a secret cannot reach a log line, an event or a status through a
validation message. Strings are escaped to ASCII (no control characters, no bidi overrides in a
log) and cut at :data:`MAX_VALUE_CHARS`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

MAX_VALUE_CHARS = 128
"""Longer strings are cut (the API quotes them whole; a log line should not carry 10 MiB)."""


@dataclass(frozen=True, slots=True)
class Key:
    """A map key as a path segment (``labels[app]``), as opposed to a field name (``.name``)."""

    key: str


@dataclass(frozen=True, slots=True)
class Path:
    parts: tuple[str | int | Key, ...] = ()

    def child(self, *names: str) -> Path:
        return Path(self.parts + names)

    def index(self, i: int) -> Path:
        return Path((*self.parts, i))

    def key(self, k: str) -> Path:
        return Path((*self.parts, Key(k)))

    def json(self) -> tuple[str | int, ...]:
        """The path as keys and indexes into the decoded document (for source positions)."""
        return tuple(p.key if isinstance(p, Key) else p for p in self.parts)

    def __str__(self) -> str:
        out: list[str] = []
        for p in self.parts:
            if isinstance(p, int):
                out.append(f"[{p}]")
            elif isinstance(p, Key):
                out.append(f"[{_cut(p.key)}]")
            else:
                out.append(f".{p}" if out else p)
        return "".join(out) or "<root>"


ROOT = Path()


class ErrorType(Enum):
    NOT_FOUND = "Not found"
    REQUIRED = "Required value"
    DUPLICATE = "Duplicate value"
    INVALID = "Invalid value"
    NOT_SUPPORTED = "Unsupported value"
    FORBIDDEN = "Forbidden"
    TOO_LONG = "Too long"
    TOO_MANY = "Too many"


OMIT: Any = object()
"""The value is left out of the message (as apimachinery's omitValue)."""
_OMIT = OMIT

# These types print no value, whatever the error carries (apimachinery's ErrorBody).
_VALUELESS = frozenset({ErrorType.REQUIRED, ErrorType.FORBIDDEN, ErrorType.TOO_LONG})


@dataclass(frozen=True, slots=True)
class FieldError:
    type: ErrorType
    path: Path
    value: Any = _OMIT
    detail: str = ""

    def body(self) -> str:
        """The message without the field path."""
        text = self.type.value
        if self.type not in _VALUELESS and self.value is not _OMIT:
            text += f": {render(self.value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.path}: {self.body()}"


ErrorList = list[FieldError]


def render(value: Any) -> str:
    """A value as Go's ``%v`` / ``%q`` would print it: numbers and booleans bare, strings quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(_cut(value))
    return "<" + type(value).__name__ + ">"  # never a composite's content


def _cut(text: str) -> str:
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + f"...({len(text)} characters)"


def required(path: Path, detail: str = "") -> FieldError:
    return FieldError(ErrorType.REQUIRED, path, detail=detail)


def invalid(path: Path, value: Any, detail: str) -> FieldError:
    return FieldError(ErrorType.INVALID, path, value, detail)


def forbidden(path: Path, detail: str) -> FieldError:
    return FieldError(ErrorType.FORBIDDEN, path, detail=detail)


def duplicate(path: Path, value: Any) -> FieldError:
    return FieldError(ErrorType.DUPLICATE, path, value)


def not_found(path: Path, value: Any, detail: str = "") -> FieldError:
    return FieldError(ErrorType.NOT_FOUND, path, value, detail)


def not_supported(path: Path, value: Any, supported: list[str] | tuple[str, ...]) -> FieldError:
    detail = "supported values: " + ", ".join(json.dumps(v) for v in supported) if supported else ""
    return FieldError(ErrorType.NOT_SUPPORTED, path, value, detail)


def too_long(path: Path, max_bytes: int) -> FieldError:
    return FieldError(ErrorType.TOO_LONG, path, detail=f"may not be more than {max_bytes} bytes")


def too_many(path: Path, actual: int, maximum: int) -> FieldError:
    return FieldError(ErrorType.TOO_MANY, path, actual, f"must have at most {maximum} items")


def type_invalid(path: Path, found: str, expected: str) -> FieldError:
    """A value of the wrong JSON type: the type is named, the value never shown."""
    return FieldError(ErrorType.INVALID, path, found, f"must be of type {expected}")


def dedupe(errors: ErrorList) -> ErrorList:
    """Drop repeated messages, as ErrorList.ToAggregate does."""
    seen: set[str] = set()
    out: ErrorList = []
    for e in errors:
        text = str(e)
        if text not in seen:
            seen.add(text)
            out.append(e)
    return out
