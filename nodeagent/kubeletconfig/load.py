"""The kubelet's configuration as the 1.37 kubelet assembles it, with where each value came from.

Order (cmd/kubelet/app/server.go): the defaults (v1beta1's when there is a ``--config``, the
command-line world's otherwise), the ``--config`` file (strictly decoded, defaulted, its
``evictionHard`` filled in), the ``--config-dir`` drop-ins (every ``*.conf`` file below the
directory in lexical walk order, each a KubeletConfiguration applied as a JSON merge patch,
then defaulted again), and last the flags that set configuration fields (feature gates merge
key by key; any other flag replaces the field). Then validation.

kubeadm's ``/var/lib/kubelet/instance-config.yaml`` is not read: kubeadm applies it to
``config.yaml`` itself (phases/kubelet WriteConfigToDisk) and the kubelet never opens it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError as PydanticError

from nodeagent.kubeletconfig import defaults, support
from nodeagent.kubeletconfig.decode import DecodeError, check, decode, load_yaml, merge_patch, type_meta
from nodeagent.kubeletconfig.schema import API_VERSION, KIND, KubeletConfiguration
from nodeagent.kubeletconfig.validation import ValidationError, errors_of

DROPIN_SUFFIX = ".conf"


class ConfigurationError(ValueError):
    """The kubelet would not start with this configuration; the message is the kubelet's."""


@dataclass(frozen=True)
class Origin:
    """Where a field's value was set: ``file``, ``drop-in`` (with the file), ``flag`` (with the
    flag), or nodeagent's own configuration file (``agent-config``). Unset fields are defaults."""

    kind: str
    where: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.where}".strip()


@dataclass
class Assembled:
    config: KubeletConfiguration
    """The effective configuration (defaulted; validated by :func:`validate`)."""
    baseline: KubeletConfiguration
    """Each field's default in this mode (what an untouched field would be)."""
    origins: dict[str, Origin] = field(default_factory=dict)
    """Dotted JSON path -> where it was set; paths not here are defaults."""
    skipped: list[Path] = field(default_factory=list)
    """Files in the drop-in directory that are not ``*.conf`` (the kubelet logs them at V(4))."""

    def unsupported(self) -> dict[str, Any]:
        return support.unsupported(self.config, self.baseline)


def _note(origins: dict[str, Origin], patch: Mapping[str, Any], origin: Origin) -> None:
    for key, value in patch.items():
        for path, _ in support.leaves_of(value, key):
            origins[path] = origin


def read_config_file(path: Path) -> dict[str, Any]:
    """``--config``: the checked document, or the kubelet's start-up error."""
    absolute = Path(os.path.abspath(path))
    prefix = (f"failed to load kubelet config file, path: {path}, error: failed to load Kubelet config file "
              f"{path}, error ")
    try:
        text = absolute.read_text()
    except OSError as exc:
        raise ConfigurationError(f'{prefix}failed to read kubelet config file "{absolute}", error: open {absolute}: '
                                 f"{(exc.strerror or str(exc)).lower()}") from None
    try:
        return decode(text, absolute)
    except DecodeError as exc:
        raise ConfigurationError(prefix + str(exc)) from None


def dropin_files(directory: Path) -> tuple[list[Path], list[Path]]:
    """(``*.conf`` files, other files) below ``directory``, in filepath.WalkDir's lexical order."""
    found: list[Path] = []
    skipped: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        # WalkDir visits a directory's entries in lexical order, files and subdirectories mixed:
        # a subdirectory "b" comes between files "a.conf" and "c.conf".
        entries = sorted([*(("d", d) for d in dirs), *(("f", f) for f in files)], key=lambda e: e[1])
        for kind, name in entries:
            if kind == "f":
                path = Path(root) / name
                (found if path.suffix == DROPIN_SUFFIX else skipped).append(path)
    return _walk_order(directory, found), _walk_order(directory, skipped)


def _walk_order(directory: Path, paths: list[Path]) -> list[Path]:
    return sorted(paths, key=lambda p: p.relative_to(directory).parts)


def read_dropin(path: Path) -> dict[str, Any]:
    prefix = "failed to merge kubelet configs: failed to walk through kubelet dropin directory "
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigurationError(f"failed to merge kubelet configs: failed to load kubelet dropin file, path: {path}, "
                                 f"error: {exc.strerror}") from None
    where = f"failed to load kubelet dropin file, path: {path}"
    try:
        if not text.strip():
            raise DecodeError(f'kubelet config file "{path}" was empty')
        docs = load_yaml(text)
        doc = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else {}
        if not doc.get("apiVersion") and not doc.get("kind"):
            raise ConfigurationError(f"{prefix}{path.parent}: {where}, no apiVersion/kind")
        version, kind = type_meta(doc)
        if (version, kind) != (API_VERSION, KIND):
            raise ConfigurationError(f"{prefix}{path.parent}: {where}, unknown apiVersion/kind: {version}, Kind={kind}")
        check(doc)
    except DecodeError as exc:
        raise ConfigurationError(f"{prefix}{path.parent}: {where}, error: {exc}") from None
    return {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}


def _validated(data: Mapping[str, Any], origin: str) -> KubeletConfiguration:
    try:
        return KubeletConfiguration.model_validate(data)
    except PydanticError as exc:
        raise ConfigurationError(format_pydantic(exc, origin)) from None


def format_pydantic(exc: PydanticError, origin: str) -> str:
    lines = [f"invalid configuration in {origin}:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value


def assemble(*, config_body: Mapping[str, Any] | None = None, config_origin: str = "",
             config_dir: Path | None = None,
             flag_config: Mapping[str, Any] | None = None, flag_origins: Mapping[str, str] | None = None,
             own: Mapping[str, Any] | None = None, own_origin: str = "", own_format: bool = False) -> Assembled:
    """The effective KubeletConfiguration of a command line.

    ``config_body``: the ``--config`` document (:func:`read_config_file`), from ``config_origin``;
    ``own``: KubeletConfiguration fields from nodeagent's own configuration format (applied
    after the file and drop-ins, before the flags); ``own_format``: nodeagent's defaults for the
    three fields it decides by mode (see defaults.apply), used when no ``--config`` is given."""
    origins: dict[str, Origin] = {}
    base = defaults.apply(KubeletConfiguration(), own_format=own_format)
    if config_body is None and not own_format:
        base = defaults.legacy(base)  # the kubelet without --config starts from its flags' defaults
    baseline = base
    current = base
    if config_body is not None:
        current = defaults.eviction_hard(defaults.apply(_validated(config_body, config_origin)))
        baseline = defaults.eviction_hard(defaults.apply(KubeletConfiguration()))
        _note(origins, config_body, Origin("file", config_origin))
    elif own_format:
        # evictionHard's defaults only where nodeagent's format names none (below): set there, it
        # replaces them, as in a kubelet file, rather than being merged into them.
        baseline = defaults.eviction_hard(current)
    skipped: list[Path] = []
    if config_dir is not None:
        files, skipped = dropin_files(config_dir)
        merged = current.to_json()
        for path in files:
            patch = read_dropin(path)
            merged = merge_patch(merged, patch)
            _note(origins, patch, Origin("drop-in", str(path)))
        if files:
            current = defaults.apply(_validated(merged, str(config_dir)), own_format=own_format)
    if own:
        merged = merge_patch(current.to_json(), dict(own))
        current = defaults.apply(_validated(merged, own_origin or "the agent configuration"), own_format=own_format)
        _note(origins, own, Origin("agent-config", own_origin))
    if config_body is None and own_format:
        current = defaults.eviction_hard(current)
    if flag_config:
        data = current.to_json()
        for key, value in flag_config.items():
            if key == "featureGates":
                data["featureGates"] = {**(data.get("featureGates") or {}), **value}
            else:
                for dotted, leaf in support.leaves_of(value, key) if key in ("authentication", "authorization",
                                                                             "logging") else [(key, value)]:
                    set_path(data, dotted, leaf)
        current = _validated(data, "flags")
        for dotted, flag in (flag_origins or {}).items():
            origins[dotted] = Origin("flag", flag)
    return Assembled(current, baseline, origins, skipped)


def validate(config: KubeletConfiguration) -> None:
    """The kubelet's validation, with its start-up wording."""
    try:
        problems = errors_of(config)
    except ValidationError as exc:  # pragma: no cover - errors_of returns, validate raises
        problems = exc.errors
    if problems:
        raise ConfigurationError(f"failed to validate kubelet configuration, error: {ValidationError(problems)}")


__all__ = ["Assembled", "ConfigurationError", "Origin", "assemble", "dropin_files", "read_config_file",
           "validate"]
