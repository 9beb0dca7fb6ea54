"""Kubernetes resource quantities ("100m", "64Mi", "1.5", "2Gi") in base units."""

from __future__ import annotations

import math
import re
from decimal import Decimal, DecimalException

_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
MAX_DIGITS = 30
"""Quantities beyond 10^30 base units are refused: no resource is that large, and turning
"1e999999999" into an integer (milli_cpu, bytes_) would build a billion-digit number."""


def parse(value: str | float) -> Decimal:
    if isinstance(value, (int, float)):
        return _bounded(Decimal(str(value)), value)
    m = _RE.match(value.strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"invalid quantity {value!r}")
    try:
        result = Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except DecimalException:  # InvalidOperation, and Overflow for "1e999999999"
        raise ValueError(f"invalid quantity {value!r}") from None
    return _bounded(result, value)


def _bounded(result: Decimal, value: object) -> Decimal:
    if not result.is_finite() or (result and result.adjusted() > MAX_DIGITS):
        raise ValueError(f"quantity out of range {value!r}")
    return result


def milli_cpu(value: str | float) -> int:
    """CPU in millicores, rounded up as the API server does."""
    return math.ceil(parse(value) * 1000)


def bytes_(value: str | float) -> int:
    return math.ceil(parse(value))


def base_units(resource: str, value: str | float) -> int:
    return milli_cpu(value) if resource == "cpu" else bytes_(value)


_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL = ("", "k", "M", "G", "T", "P", "E")


def format_int(value: int, binary: bool = True) -> str:
    """An integer as Go's ``resource.Quantity.String()`` writes it (BinarySI: ``81420Ki``,
    ``100Mi``, ``1536``; DecimalSI: ``5k``, ``1500``): the largest suffix that leaves a whole
    number, none when no suffix does. What the kubelet's messages show of bytes and counts."""
    base, names = (1024, _BINARY) if binary else (1000, _DECIMAL)
    sign, value = ("-", -value) if value < 0 else ("", value)
    index = 0
    while value and value % base == 0 and index < len(names) - 1:
        value //= base
        index += 1
    return f"{sign}{value}{names[index]}"


def is_binary(value: str) -> bool:
    """Whether a quantity is written with a binary suffix (Ki, Mi, ...): Go keeps that format."""
    m = _RE.match(value.strip())
    return m is not None and m.group(2).endswith("i")
