"""Per-plugin typed configuration: the base of every plugin's configuration model.

A plugin declares the model of its section of the NodeAgentConfiguration (``plugins.<name>``)
on its factory, ``plugin.config_model = MyConfig``; the registry validates the section against
it when the agent loads (an error names ``plugins.<name>.<field>``) and hands the factory the
validated, frozen model. ``nodeagent plugins`` prints every plugin's model: field, type,
default and the field's docstring. A plugin without configuration declares :class:`NoConfig`,
so that a section given to it is an error rather than ignored. (A third-party factory that
declares no model still gets the raw mapping.)

What the kubelet's configuration says (clusterDNS, seccompDefault, containerLog*, ...) is not
repeated here: stages read it from ``handle.settings`` (nodeagent/kubeletconfig/node.py).
"""

from __future__ import annotations

import typing
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticUndefined


class PluginConfig(BaseModel):
    """camelCase fields, unknown fields refused, frozen, docstrings as descriptions."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              use_attribute_docstrings=True)


class NoConfig(PluginConfig):
    """This plugin takes no configuration of its own."""


def validate_section(name: str, model: type[BaseModel], section: Any) -> BaseModel:
    """The section as ``model``; ValueError naming ``plugins.<name>.<field>`` otherwise."""
    try:
        return model.model_validate(section if section is not None else {})
    except ValidationError as exc:
        lines = [f"invalid configuration for plugin {name!r}:"]
        for err in exc.errors():
            where = ".".join(str(p) for p in ("plugins", name, *err["loc"]))
            message = err["msg"]
            if err["type"] == "extra_forbidden" and len(err["loc"]) == 1 and _kubelet_field(str(err["loc"][0])):
                # nodeagent's earlier format took eviction/gc/shutdown's kubelet fields here.
                message = "a KubeletConfiguration field: set it at the top level of the KubeletConfiguration"
            lines.append(f"  {where}: {message}")
        raise ValueError("\n".join(lines)) from None


def _kubelet_field(key: str) -> bool:
    from nodeagent.kubeletconfig.schema import KubeletConfiguration

    return any(key == field.alias for field in KubeletConfiguration.model_fields.values())


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    text = repr(annotation).replace("typing.", "").replace("pathlib.", "")
    return text.replace("NoneType", "None")


def _show(value: Any) -> str:
    if isinstance(value, PurePath):
        return repr(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return repr(value)


def describe(model: type[BaseModel]) -> list[str]:
    """One line per field: ``name: type = default  docstring`` (for ``nodeagent plugins``)."""
    if not model.model_fields:
        return [(model.__doc__ or "no configuration").strip().splitlines()[0]]
    lines = []
    for name, field in model.model_fields.items():
        if field.default is not PydanticUndefined:
            default = _show(field.default)
        elif field.default_factory is not None:
            default = _show(field.default_factory())  # type: ignore[call-arg]
        else:
            default = "(required)"
        doc = " ".join((field.description or "").split())
        lines.append(f"{field.alias or name}: {_type_name(field.annotation)} = {default}" + (f"  # {doc}" if doc
                                                                                            else ""))
    return lines


__all__ = ["NoConfig", "PluginConfig", "describe", "validate_section"]
