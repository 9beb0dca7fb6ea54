"""Durations as the kubelet's configuration writes them: Go's ``time.ParseDuration`` syntax
(metav1.Duration: ``"20s"``, ``"2m0s"``, ``"1h30m"``, ``"300ms"``, ``"-1.5h"``), and plain
numbers of seconds, which nodeagent's own configuration has always accepted.

``Duration`` is the pydantic field type: it validates either form into float seconds and
names the bad value the way Go does (``time: invalid duration "2 minutes"``).
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

# Go's units (time/format.go): both spellings of the microsecond sign are accepted.
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = re.compile(r"\d+\.?\d*|\.\d+")
_UNIT = re.compile(r"[^\d.]*")


def parse(text: str) -> float:
    """Seconds in a Go duration string; ValueError with Go's message otherwise."""
    original = text
    sign = -1.0 if text.startswith("-") else 1.0
    text = text[1:] if text[:1] in "+-" else text
    if text == "0":
        return 0.0
    if not text:
        raise ValueError(f'time: invalid duration "{original}"')
    seconds = 0.0
    position = 0
    while position < len(text):
        number = _NUMBER.match(text, position)
        if number is None:
            raise ValueError(f'time: invalid duration "{original}"')
        unit = _UNIT.match(text, number.end())
        assert unit is not None  # the pattern matches the empty string
        if not unit.group(0):
            raise ValueError(f'time: missing unit in duration "{original}"')
        if unit.group(0) not in _UNITS:
            raise ValueError(f'time: unknown unit "{unit.group(0)}" in duration "{original}"')
        seconds += float(number.group(0)) * _UNITS[unit.group(0)]
        position = unit.end()
    return sign * seconds


def format(seconds: float) -> str:
    """Go's ``Duration.String()`` for whole milliseconds and up: ``2m0s``, ``1h30m0s``, ``500ms``."""
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{sign}{_trim(seconds * 1000)}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = sign
    if hours:
        out += f"{int(hours)}h"
    if hours or minutes:
        out += f"{int(minutes)}m"
    return out + f"{_trim(secs)}s"


def _trim(value: float) -> str:
    text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text or "0"


def _seconds(value: object) -> object:
    if isinstance(value, bool):
        return value  # pydantic rejects it with its own message
    if isinstance(value, str):
        return parse(value.strip())
    if isinstance(value, (int, float)) and not math.isfinite(value):
        raise ValueError(f"duration must be finite, got {value}")
    return value


Duration = Annotated[float, BeforeValidator(_seconds)]
"""Float seconds in a config model; accepts ``"2m0s"`` as well as ``120``."""

__all__ = ["Duration", "format", "parse"]
