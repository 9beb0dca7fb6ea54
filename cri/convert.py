"""One generic converter between cri.types dataclasses and protobuf messages.

Fields are matched by name (ignoring case and underscores, so ``uid_mappings``
meets ``uidMappings``). What to do with a field is decided once per
(dataclass, message type) pair from the proto field descriptor and the
dataclass annotation, then cached as a plan:

  proto field                       dataclass annotation     mapping
  scalar / enum                     int, str, IntEnum, ...   copied (enum via its IntEnum)
  message                           SomeDataclass | None     recursion; None = unset
  message                           SomeDataclass            recursion; always present
  single-field message (wrapper)    int | None, Enum | None  unwrapped; None = unset
  repeated scalar / enum            list[...]                element-wise
  repeated message                  list[SomeDataclass]      element-wise recursion
  repeated KeyValue-like message    dict[str, str]           ordered key/value pairs
  map<string, scalar>               dict[str, ...]           copied

Proto fields without a dataclass field (the Windows ones) are left unset when
sending and ignored when receiving; a dataclass field without a proto field is
a programming error and raises at plan time.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
M = TypeVar("M", bound=Message)


def to_proto(value: DataclassInstance, message_type: type[M]) -> M:
    """Build a message of message_type from a dataclass instance."""
    message: M = message_type()
    _fill(message, value)
    return message


def from_proto(message: Message, cls: type[T]) -> T:
    """Build a cls instance from a message (fields missing from cls are dropped)."""
    plan = _plan(cls, message.DESCRIPTOR)
    return cls(**{step.attr: step.read(message) for step in plan})


def _fill(message: Message, value: Any) -> None:
    for step in _plan(type(value), message.DESCRIPTOR):
        item = getattr(value, step.attr)
        if item is not None:
            step.write(message, item)


@dataclasses.dataclass(frozen=True, slots=True)
class _Step:
    attr: str  # dataclass field name
    read: Callable[[Message], Any]  # message -> python value
    write: Callable[[Message, Any], None]  # set python value (never None) on message


_PLANS: dict[tuple[type, str], tuple[_Step, ...]] = {}


def _plan(cls: type, descriptor: Any) -> tuple[_Step, ...]:  # Any: upb and python Descriptors
    key = (cls, descriptor.full_name)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _make_plan(cls, descriptor)
    return plan


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def _make_plan(cls: type, descriptor: Any) -> tuple[_Step, ...]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    by_name = {_norm(f.name): f for f in descriptor.fields}
    hints = typing.get_type_hints(cls)
    steps = []
    for dc_field in dataclasses.fields(cls):
        fd = by_name.get(_norm(dc_field.name))
        if fd is None:
            raise TypeError(f"{cls.__name__}.{dc_field.name} has no field in {descriptor.full_name}")
        steps.append(_step(dc_field.name, fd, hints[dc_field.name], f"{cls.__name__}.{dc_field.name}"))
    return tuple(steps)


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.IntEnum)


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _scalar_reader(tp: Any) -> Callable[[Any], Any]:
    """How to turn a raw proto scalar into the annotated python type."""
    if _is_enum(tp):
        enum_type: type[enum.IntEnum] = tp
        return enum_type
    return lambda raw: raw


def _step(attr: str, fd: FieldDescriptor, annotation: Any, where: str) -> _Step:
    name = fd.name
    origin = typing.get_origin(annotation)
    inner = _strip_optional(annotation)

    if _is_map(fd):
        if origin is not dict:
            raise TypeError(f"{where}: map field {fd.full_name} needs a dict annotation")
        value_type = typing.get_args(annotation)[1]
        convert = _scalar_reader(value_type)

        def read_map(m: Message) -> Any:
            if not _is_enum(value_type):
                return dict(getattr(m, name))  # in C: a listing converts many of these
            return {k: convert(v) for k, v in getattr(m, name).items()}

        def write_map(m: Message, v: Any) -> None:
            getattr(m, name).update(v)

        return _Step(attr, read_map, write_map)

    if fd.is_repeated and fd.message_type is not None:
        if origin is dict:  # repeated KeyValue -> ordered dict
            key_name, value_name = (f.name for f in fd.message_type.fields)

            def read_pairs(m: Message) -> Any:
                return {getattr(kv, key_name): getattr(kv, value_name) for kv in getattr(m, name)}

            def write_pairs(m: Message, v: Any) -> None:
                target = getattr(m, name)
                for k, val in v.items():
                    target.add(**{key_name: k, value_name: val})

            return _Step(attr, read_pairs, write_pairs)
        (element,) = typing.get_args(annotation)

        def read_messages(m: Message) -> Any:
            return [from_proto(item, element) for item in getattr(m, name)]

        def write_messages(m: Message, v: Any) -> None:
            target = getattr(m, name)
            for item in v:
                _fill(target.add(), item)

        return _Step(attr, read_messages, write_messages)

    if fd.is_repeated:
        (element,) = typing.get_args(annotation)
        convert = _scalar_reader(element)

        def read_list(m: Message) -> Any:
            return [convert(x) for x in getattr(m, name)]

        def write_list(m: Message, v: Any) -> None:
            getattr(m, name).extend(int(x) if _is_enum(element) else x for x in v)

        return _Step(attr, read_list, write_list)

    if fd.message_type is not None and dataclasses.is_dataclass(inner):
        nested: type = inner  # type: ignore[assignment]
        optional = inner is not annotation  # `X | None`; a plain `X` is always present

        def read_message(m: Message) -> Any:
            if optional and not m.HasField(name):
                return None
            return from_proto(getattr(m, name), nested)

        def write_message(m: Message, v: Any) -> None:
            sub = getattr(m, name)
            sub.SetInParent()  # present even when every field has its default
            _fill(sub, v)

        return _Step(attr, read_message, write_message)

    if fd.message_type is not None:  # presence wrapper such as Int64Value
        if len(fd.message_type.fields) != 1:
            raise TypeError(f"{where}: {fd.message_type.full_name} is not a one-field wrapper")
        wrapped = fd.message_type.fields[0].name
        convert = _scalar_reader(inner)

        def read_wrapper(m: Message) -> Any:
            return convert(getattr(getattr(m, name), wrapped)) if m.HasField(name) else None

        def write_wrapper(m: Message, v: Any) -> None:
            sub = getattr(m, name)
            sub.SetInParent()  # 0 is a value here, not "unset"
            setattr(sub, wrapped, v)

        return _Step(attr, read_wrapper, write_wrapper)

    convert = _scalar_reader(inner)
    read_scalar: Callable[[Message], Any] = operator.attrgetter(name)  # in C: most fields are these
    if _is_enum(inner):
        def read_scalar(m: Message) -> Any:
            return convert(getattr(m, name))

    def write_scalar(m: Message, v: Any) -> None:
        setattr(m, name, v)

    return _Step(attr, read_scalar, write_scalar)
