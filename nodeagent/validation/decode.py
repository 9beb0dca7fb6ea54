"""Typed reads of a decoded (JSON-compatible) object: the decoding half of the API's validation.

The API server decodes JSON into typed Go structs before it validates them, so a number where a
string belongs fails at decoding, and ``null`` means "not set". :class:`Obj` does the same over
the plain dicts a manifest decodes to: each read names the field, checks its JSON type (and
integer width) and returns a typed value, recording a field error instead of raising. Fields
that are absent or ``null`` read as their zero value, like Go's.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, TypeAlias

from nodeagent import quantity
from nodeagent.validation import field as f
from nodeagent.validation.field import ErrorList, Path

# The reads are named after what they return (``obj.str("name")``); inside the class those names
# shadow the builtins, so the annotations there use these.
Str: TypeAlias = str
Int: TypeAlias = int
Bool: TypeAlias = bool

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

QUANTITY_REGEX = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
QUANTITY_ERROR = f"quantities must match the regular expression '{QUANTITY_REGEX}'"


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class Obj:
    """One JSON object at ``path``; reads collect their errors in ``errs``."""

    __slots__ = ("data", "errs", "path")

    def __init__(self, data: dict[Str, Any], path: Path, errs: ErrorList) -> None:
        self.data = data
        self.path = path
        self.errs = errs

    @classmethod
    def of(cls, value: Any, path: Path, errs: ErrorList) -> Obj | None:
        """``value`` as an object, None when it is null, a type error when it is something else."""
        if value is None:
            return None
        if not isinstance(value, dict):
            errs.append(f.type_invalid(path, json_type(value), "object"))
            return None
        return cls(value, path, errs)

    def at(self, name: Str) -> Path:
        return self.path.child(name)

    def has(self, name: Str) -> Bool:
        return self.data.get(name) is not None

    def keys(self) -> list[Str]:
        return [k for k, v in self.data.items() if v is not None]

    def _typed(self, name: Str, types: tuple[type, ...], expected: Str) -> Any:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) and bool not in types:
            self.errs.append(f.type_invalid(self.at(name), "boolean", expected))
            return None
        if not isinstance(value, types):
            self.errs.append(f.type_invalid(self.at(name), json_type(value), expected))
            return None
        return value

    def str(self, name: Str, default: Str = "") -> Str:
        value = self._typed(name, (str,), "string")
        return default if value is None else value

    def opt_str(self, name: Str) -> Str | None:
        value: str | None = self._typed(name, (str,), "string")
        return value

    def opt_int(self, name: Str, bits: tuple[Int, Int] = INT32) -> Int | None:
        value = self._typed(name, (int,), "integer")
        if value is None:
            return None
        if not bits[0] <= value <= bits[1]:
            width = 32 if bits == INT32 else 64
            self.errs.append(f.invalid(self.at(name), value, f"must fit in a {width}-bit integer"))
            return None
        return int(value)

    def int(self, name: Str, default: Int = 0,
            bits: tuple[Int, Int] = INT32) -> Int:
        value = self.opt_int(name, bits)
        return default if value is None else value

    def opt_bool(self, name: Str) -> Bool | None:
        value: bool | None = self._typed(name, (bool,), "boolean")
        return value

    def bool(self, name: Str, default: Bool = False) -> Bool:
        value = self.opt_bool(name)
        return default if value is None else value

    def obj(self, name: Str) -> Obj | None:
        return Obj.of(self.data.get(name), self.at(name), self.errs)

    def items(self, name: Str) -> list[tuple[Path, Any]]:
        """A list's elements with their paths (null elements included, for the caller to judge)."""
        value = self._typed(name, (list,), "array")
        if value is None:
            return []
        path = self.at(name)
        return [(path.index(i), item) for i, item in enumerate(value)]

    def objs(self, name: Str) -> list[Obj]:
        out = []
        for path, item in self.items(name):
            if not isinstance(item, dict):
                self.errs.append(f.type_invalid(path, json_type(item), "object"))
                continue
            out.append(Obj(item, path, self.errs))
        return out

    def strs(self, name: Str) -> list[Str]:
        out = []
        for path, item in self.items(name):
            if not isinstance(item, str):
                self.errs.append(f.type_invalid(path, json_type(item), "string"))
                continue
            out.append(item)
        return out

    def ints(self, name: Str, bits: tuple[Int, Int] = INT32) -> list[Int]:
        out = []
        for path, item in self.items(name):
            if isinstance(item, bool) or not isinstance(item, int):
                self.errs.append(f.type_invalid(path, json_type(item), "integer"))
            elif not bits[0] <= item <= bits[1]:
                self.errs.append(f.invalid(path, item, f"must fit in a {32 if bits == INT32 else 64}-bit integer"))
            else:
                out.append(item)
        return out

    def str_map(self, name: Str) -> dict[Str, Str]:
        value = self._typed(name, (dict,), "object")
        if value is None:
            return {}
        path = self.at(name)
        out = {}
        for k, v in value.items():
            if v is None:
                out[k] = ""  # Go decodes a null map value as the zero value
            elif not isinstance(v, str):
                self.errs.append(f.type_invalid(path.key(k), json_type(v), "string"))
            else:
                out[k] = v
        return out

    def int_or_str(self, name: Str) -> Int | Str | None:
        """An IntOrString (a port number or a port name)."""
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            self.errs.append(f.type_invalid(self.at(name), json_type(value), "integer or string"))
            return None
        if isinstance(value, int) and not INT32[0] <= value <= INT32[1]:
            self.errs.append(f.invalid(self.at(name), value, "must fit in a 32-bit integer"))
            return None
        return value

    def quantity(self, name: Str) -> Decimal | None:
        return decode_quantity(self.data.get(name), self.at(name), self.errs)


def decode_quantity(value: Any, path: Path, errs: ErrorList) -> Decimal | None:
    """A quantity from its JSON form (a string, or a bare number as Go's Quantity accepts)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        errs.append(f.type_invalid(path, json_type(value), "string"))
        return None
    text = value if isinstance(value, str) else repr(value)
    if text != text.strip():
        errs.append(f.invalid(path, f.OMIT, QUANTITY_ERROR))
        return None
    try:
        return quantity.parse(text)
    except ValueError:
        # The text is not shown: a quantity field is where a misplaced secret could land.
        errs.append(f.invalid(path, f.OMIT, QUANTITY_ERROR))
        return None
