"""The statistics every benchmark here reports with: percentiles as the kubelet's node density
test takes them, and repetitions folded into one record."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def pct(values: Iterable[float], p: float) -> float | None:
    """density_test.go's percentile: element ceil(n*p/100) - 1 of the sorted list."""
    data = sorted(values)
    if not data:
        return None
    return data[max(math.ceil(len(data) * p / 100) - 1, 0)]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are there (the lower one of an even count), None if none."""
    data = sorted(v for v in values if v is not None)
    return data[(len(data) - 1) // 2] if data else None


def merge(reps: Sequence[Any]) -> Any:
    """Repetitions of one size into one record: the median of each number, lists pooled.

    A number some repetitions lack (None: not reached in time) is the median of the others, so
    that a ratio measured in each round folds into the median of the rounds' ratios."""
    first = reps[0]
    if isinstance(first, dict):
        keys = list(first) + [k for r in reps[1:] for k in r if k not in first]
        return {k: merge([r.get(k) for r in reps]) for k in dict.fromkeys(keys)}
    if isinstance(first, list):
        return [v for r in reps if r is not None for v in r]
    if all(r is None or _number(r) for r in reps) and any(r is not None for r in reps):
        return median(reps)
    return first
