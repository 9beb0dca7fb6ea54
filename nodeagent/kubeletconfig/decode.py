"""Decoding a KubeletConfiguration file as the kubelet's strict decoder does.

The kubelet turns YAML into JSON and decodes it into the Go struct: a value of the wrong JSON
type is ``json: cannot unmarshal string into Go struct field KubeletConfiguration.port of type
int32``; a duration that is not a Go duration string is ``time: invalid duration "2 minutes"``
(a bare number too: durations are strings); a field the struct lacks, or a key given twice, is
a *strict decoding error* (``strict decoding error: unknown field "maxpods"``). The 1.37
kubelet then retries leniently and runs without the unknown field; nodeagent stops instead,
naming it (a misspelt field is a setting silently lost; every real field is known here).

:func:`decode` returns the document as checked JSON (a dict): which keys it sets is what
``nodeagent config explain`` attributes to the file.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from nodeagent import duration as godur
from nodeagent import quantity
from nodeagent.kubeletconfig.schema import API_VERSION, KIND, Go, KubeletConfiguration

GROUP = API_VERSION.split("/")[0]
_INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1), "uint32": (0, 2**32 - 1)}
# KubeletConfigurationPathRefs: the paths resolved against the file's directory.
PATH_FIELDS = ("staticPodPath", "authentication.x509.clientCAFile", "tlsCertFile", "tlsPrivateKeyFile",
               "resolvConf", "volumePluginDir", "podLogsDir")


class DecodeError(ValueError):
    """The document cannot be decoded (``failed to decode: ...``); the kubelet does not start."""


class StrictDecodingError(DecodeError):
    """Unknown or duplicate fields (``strict decoding error: ...``)."""


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no types here
    """YAML as sigs.k8s.io/yaml reads it: a key given twice is an error, timestamps are strings."""


def _mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise StrictDecodingError(
                f"strict decoding error: yaml: unmarshal errors:\n  line {key_node.start_mark.line + 1}: "
                f'key "{key}" already set in map')
        seen[key] = key_node.start_mark.line
    return dict(loader.construct_mapping(node, deep=deep))


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(text: str) -> list[Any]:
    """Every document of a YAML (or JSON) text, strictly."""
    try:
        return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]  # noqa: S506 - SafeLoader
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise DecodeError(f"failed to decode: error converting YAML to JSON: yaml: line {line}: "
                          f"{exc.problem}") from None
    except yaml.YAMLError as exc:
        raise DecodeError(f"failed to decode: error converting YAML to JSON: yaml: {exc}") from None


# --- the type check ------------------------------------------------------------------------

def _go_of(field: Any) -> str | None:
    found = [m for m in field.metadata if isinstance(m, Go)]
    return found[-1].type if found else None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (directly, optionally, or as list items)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return f"number {json.dumps(value)}" if isinstance(value, float) or value else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class _Checker:
    def __init__(self) -> None:
        self.unknown: list[str] = []
        self.type_error: str | None = None

    def mismatch(self, value: Any, struct: str, path: str, go: str) -> None:
        if self.type_error is None:
            what = _kind(value)
            if what.startswith("number ") and go not in _INT_RANGES and go != "float64":
                what = "number"
            self.type_error = f"json: cannot unmarshal {what} into Go struct field {struct}.{path} of type {go}"

    def struct(self, raw: Any, model: type[BaseModel], path: str) -> None:
        struct = model.__name__
        if not isinstance(raw, dict):
            self.mismatch(raw, struct, path, f"v1beta1.{struct}")
            return
        fields = {(f.alias or name): f for name, f in model.model_fields.items()}
        for key, value in raw.items():
            where = f"{path}.{key}" if path else str(key)
            field = fields.get(key)
            if field is None:
                self.unknown.append(f'unknown field "{where}"')
                continue
            if value is None:
                continue  # JSON null leaves the Go field as it was
            self.value(value, _go_of(field) or "object", _model_of(field.annotation), struct, where)

    def value(self, value: Any, go: str, model: type[BaseModel] | None, struct: str, path: str) -> None:
        if go == "object" and model is not None:
            self.struct(value, model, path)
        elif go == "[]object" and model is not None:
            if not isinstance(value, list):
                self.mismatch(value, struct, path, f"[]v1beta1.{model.__name__}")
                return
            for i, item in enumerate(value):
                self.struct(item, model, f"{path}[{i}]")
        elif go == "bool":
            if not isinstance(value, bool):
                self.mismatch(value, struct, path, "bool")
        elif go in _INT_RANGES:
            low, high = _INT_RANGES[go]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.mismatch(value, struct, path, go)
            elif isinstance(value, float) and not value.is_integer() or not low <= value <= high:
                self.mismatch(value, struct, path, go)
        elif go == "float64":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.mismatch(value, struct, path, go)
        elif go in ("string", "Time"):
            if not isinstance(value, str):
                self.mismatch(value, struct, path, "string")
        elif go in ("Duration", "TimeOrMetaDuration"):
            if go == "TimeOrMetaDuration" and isinstance(value, int) and not isinstance(value, bool):
                return
            if not isinstance(value, str):
                self.mismatch(value, struct, path, "string")
                return
            try:
                godur.parse(value)
            except ValueError as exc:
                if self.type_error is None:
                    self.type_error = str(exc)
        elif go == "Quantity":
            self.quantity(value, struct, path)
        elif go.startswith("[]"):
            if not isinstance(value, list):
                self.mismatch(value, struct, path, go)
                return
            for i, item in enumerate(value):
                self.value(item, go[2:], None, struct, f"{path}[{i}]")
        elif go.startswith("map[") or go == "ResourceList":
            if not isinstance(value, dict):
                self.mismatch(value, struct, path, go if go != "ResourceList" else "v1.ResourceList")
                return
            inner = "Quantity" if go == "ResourceList" else go.split("]", 1)[1]
            for key, item in value.items():
                if item is not None:
                    self.value(item, inner, None, struct, f"{path}.{key}")

    def quantity(self, value: Any, struct: str, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.mismatch(value, struct, path, "resource.Quantity")
            return
        try:
            quantity.parse(str(value))
        except ValueError:
            if self.type_error is None:
                self.type_error = ("quantities must match the regular expression "
                                   "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")


def check(raw: Mapping[str, Any], model: type[BaseModel] = KubeletConfiguration) -> None:
    """Raise what the kubelet's decoder raises for ``raw`` (apiVersion and kind excluded)."""
    checker = _Checker()
    checker.struct({k: v for k, v in raw.items() if k not in ("apiVersion", "kind")}, model, "")
    if checker.type_error is not None:
        raise DecodeError(f"failed to decode: {checker.type_error}")
    if checker.unknown:
        raise StrictDecodingError("strict decoding error: " + ", ".join(checker.unknown))


def type_meta(doc: Mapping[str, Any]) -> tuple[str, str]:
    """(apiVersion, kind) of a document; the kubelet's errors when either is missing."""
    text = json.dumps(doc, separators=(",", ":"))
    kind, version = doc.get("kind"), doc.get("apiVersion")
    if not kind:
        raise DecodeError(f"failed to decode: Object 'Kind' is missing in '{text}'")
    if not version:
        raise DecodeError(f"failed to decode: Object 'apiVersion' is missing in '{text}'")
    return str(version), str(kind)


def decode(text: str, path: Path | None = None) -> dict[str, Any]:
    """One KubeletConfiguration document, checked; relative paths resolved against ``path``'s
    directory, as the kubelet's file loader resolves them."""
    if not text.strip():
        raise DecodeError(f'kubelet config file "{path}" was empty')
    docs = load_yaml(text)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise DecodeError("failed to decode: couldn't get version/kind; json parse error: the document is not "
                          "one JSON object")
    doc: dict[str, Any] = docs[0]
    version, kind = type_meta(doc)
    if (version, kind) != (API_VERSION, KIND):
        raise DecodeError(f'failed to decode: no kind "{kind}" is registered for version "{version}" in scheme '
                          '"pkg/kubelet/apis/config/scheme/scheme.go:34"')
    check(doc)
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
    if path is not None:
        resolve_paths(body, path.parent)
    return body


def resolve_paths(body: dict[str, Any], root: Path) -> None:
    for dotted in PATH_FIELDS:
        *parents, leaf = dotted.split(".")
        holder: Any = body
        for part in parents:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and isinstance(holder.get(leaf), str) and holder[leaf] \
                and not holder[leaf].startswith("/"):
            holder[leaf] = str(root / holder[leaf])


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: how the kubelet applies a ``--config-dir`` drop-in."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out

