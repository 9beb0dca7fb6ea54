"""The agent's configuration: the kubelet's, as the kubelet reads it, and nodeagent's own.

Three parts, each with one home:

* ``kubelet``: the KubeletConfiguration v1beta1 (nodeagent/kubeletconfig), from ``--config``,
  ``--config-dir`` drop-ins and the kubelet's flags, defaulted and validated as the kubelet does.
* ``flags``: the kubelet's command-line-only settings (KubeletFlags: ``--hostname-override``,
  ``--node-ip``, ``--kubeconfig``, ``--bootstrap-kubeconfig``, ``--cert-dir``, ``--root-dir``,
  ``--node-labels``, ...).
* ``agent``: nodeagent's own settings, a ``NodeAgentConfiguration`` document (apiVersion
  ``nodeagent.io/v1alpha1``, ``--agent-config`` or a second document beside the
  KubeletConfiguration): the stage ``profile``, per-plugin sections (each validated by its
  plugin's model), ``logFormat``, ``traceFile``, and optionally the kubelet's command-line
  settings as ``kubeletFlags`` (the command line wins).

nodeagent's earlier single-document format (no apiVersion; KubeletConfiguration names such as
``staticPodPath`` beside ``nodeName``, ``profile``, ``plugins``) still loads: :func:`split_legacy`
sends each field to its new home, including those that moved into a plugin's section
(``cdiSpecDirs`` to dra, ``containerLogsSymlinkDir`` to logs, ``allowPrivileged`` to
podsecurity). In that format, and when the agent is built in Python with the same flat names
(``AgentConfig(node_name=..., max_pods=...)``), three kubelet fields keep nodeagent's
mode-dependent defaults: the kubelet API and its webhook authentication in cluster mode only,
Webhook authorization in cluster mode and AlwaysAllow standalone; and ``clusterDomain`` is
``cluster.local``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from nodeagent.duration import Duration
from nodeagent.kubeletconfig import defaults as kdefaults
from nodeagent.kubeletconfig import support
from nodeagent.kubeletconfig.decode import DecodeError, check, load_yaml, resolve_paths
from nodeagent.kubeletconfig.flags import CommandLine, FlagError, KubeletFlags, validate_node_labels
from nodeagent.kubeletconfig.load import (
    Assembled,
    ConfigurationError,
    Origin,
    assemble,
    format_pydantic,
    read_config_file,
    validate,
)
from nodeagent.kubeletconfig.node import NodeConfig
from nodeagent.kubeletconfig.schema import API_VERSION, KIND, KubeletConfiguration
from nodeagent.registry import CONFIGURABLE, DEFAULT_PROFILE

AGENT_API_VERSION = "nodeagent.io/v1alpha1"
AGENT_KIND = "NodeAgentConfiguration"
DEFAULT_ROOT_DIR = Path("/var/lib/nodeagent")
"""``nodeagent run``'s root directory (``nodeagent kubelet`` uses the kubelet's /var/lib/kubelet)."""


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, the field and why."""


_OWN = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class KubeletFlagsSection(BaseModel):
    """``kubeletFlags``: the kubelet's command-line-only settings, written in a file."""

    model_config = _OWN

    hostname_override: str | None = None
    node_ip: str | None = Field(None, alias="nodeIP")
    kubeconfig: Path | None = None
    bootstrap_kubeconfig: Path | None = None
    cert_dir: Path | None = None
    root_dir: Path | None = None
    node_labels: dict[str, str] | None = None
    minimum_container_ttl_duration: Duration | None = None
    maximum_dead_containers_per_container: int | None = None
    maximum_dead_containers: int | None = None


class NodeAgentConfiguration(BaseModel):
    """nodeagent's own settings (``apiVersion: nodeagent.io/v1alpha1``, ``kind: NodeAgentConfiguration``)."""

    model_config = _OWN

    profile: dict[str, list[str]] = Field(default_factory=lambda: {k: list(v) for k, v in DEFAULT_PROFILE.items()})
    """Which stages run in each phase, in order; undo phases run the reverse (nodeagent plugins)."""
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """One section per plugin, validated by the plugin's configuration model when it loads."""
    log_format: Literal["console", "json"] | None = None
    """console or json lines; unset: the KubeletConfiguration's logging.format (text: console)."""
    trace_file: Path | None = None
    """Append every fact to this JSONL file (``nodeagent trace POD`` reads the in-memory ring)."""
    plugins_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    """Where kubelet plugins (DRA drivers) put their registration sockets: the kubelet's path
    (``<rootDir>/plugins_registry`` with its default root), watched by the core."""
    evented_relist_period: Duration = Field(default=10.0, gt=0)
    """Seconds between full relists of the runtime while it streams container events (each
    event triggers a relist; this is the safety net for an event lost without the stream
    breaking). Without the stream, and from the moment it breaks until it is back, the relist
    runs every second, as the kubelet's. 10 s: at 110 pods it saves about a quarter of the
    agent's idle CPU against 1 s, and longer saves nothing measurable (benchmarks/RESULTS.md,
    exit latency); the kubelet's evented PLEG relists every 300 s. Not a kubelet field."""
    kubelet_flags: KubeletFlagsSection = Field(default_factory=lambda: KubeletFlagsSection())

    @field_validator("profile")
    @classmethod
    def _known_phases(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        unknown = set(value) - set(CONFIGURABLE)
        if unknown:
            raise ValueError(f"unknown phase(s) {sorted(unknown)}; configurable phases are {list(CONFIGURABLE)}")
        return value


# --- the earlier single-document format -------------------------------------------------------

_KUBELET_NAMES = {name for name in KubeletConfiguration.model_fields} | {
    f.alias for f in KubeletConfiguration.model_fields.values() if f.alias}
_FLAG_NAMES = {  # legacy name -> KubeletFlags field
    "node_name": "hostname_override", "nodeName": "hostname_override",
    "hostname_override": "hostname_override", "hostnameOverride": "hostname_override",
    "node_ip": "node_ip", "nodeIP": "node_ip", "nodeIp": "node_ip",
    "kubeconfig": "kubeconfig", "bootstrap_kubeconfig": "bootstrap_kubeconfig",
    "bootstrapKubeconfig": "bootstrap_kubeconfig", "root_dir": "root_dir", "rootDir": "root_dir",
    "cert_dir": "cert_dir", "certDir": "cert_dir", "node_labels": "node_labels", "nodeLabels": "node_labels",
    **{name: name for name in ("minimum_container_ttl_duration", "maximum_dead_containers_per_container",
                               "maximum_dead_containers")},
    "minimumContainerTTLDuration": "minimum_container_ttl_duration",
    "maximumDeadContainersPerContainer": "maximum_dead_containers_per_container",
    "maximumDeadContainers": "maximum_dead_containers",
}
HOISTED_FROM_PLUGINS = ("eviction", "gc", "shutdown")
"""Plugins whose sections held KubeletConfiguration fields (and the container GC flags) in
the earlier format: there those names go to the KubeletConfiguration (and KubeletFlags)."""
_AGENT_NAMES = {"profile": "profile", "plugins": "plugins", "log_format": "log_format", "logFormat": "log_format",
                "trace_file": "trace_file", "traceFile": "trace_file",
                "plugins_registry_dir": "plugins_registry_dir", "pluginsRegistryDir": "plugins_registry_dir",
                "evented_relist_period": "evented_relist_period", "eventedRelistPeriod": "evented_relist_period"}
MOVED_TO_PLUGINS = {  # legacy name -> (plugin, its field)
    "container_logs_symlink_dir": ("logs", "containerLogsSymlinkDir"),
    "containerLogsSymlinkDir": ("logs", "containerLogsSymlinkDir"),
    "cdi_spec_dirs": ("dra", "cdiSpecDirs"), "cdiSpecDirs": ("dra", "cdiSpecDirs"),
    "dra_checkpoint_file": ("dra", "checkpointFile"), "draCheckpointFile": ("dra", "checkpointFile"),
    "allow_privileged": ("podsecurity", "allowPrivileged"), "allowPrivileged": ("podsecurity", "allowPrivileged"),
}


def _json_ready(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def _merge(model: type[BaseModel], base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` (JSON or Python names) over ``base`` (Python names): sub-structs merge field
    by field, everything else is replaced. Names the model lacks are kept for it to refuse."""
    names = {**{name: name for name in model.model_fields},
             **{f.alias: name for name, f in model.model_fields.items() if f.alias}}
    out = dict(base)
    for key, value in changes.items():
        name = names.get(key, key)
        field = model.model_fields.get(name)
        inner = field.annotation if field is not None else None
        if isinstance(inner, type) and issubclass(inner, BaseModel) and isinstance(value, Mapping):
            current = out.get(name)
            current = current.model_dump() if isinstance(current, BaseModel) else dict(current or {})
            out[name] = _merge(inner, current, value)
        else:
            out[name] = value
    return out


def _hoist(plugins: Mapping[str, Any], kubelet: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The plugin sections without the kubelet's names the node-level managers took in the
    earlier format; those go into ``kubelet`` and ``flags`` (unless given there too)."""
    out = {}
    for name, section in plugins.items():
        if name not in HOISTED_FROM_PLUGINS or not isinstance(section, Mapping):
            out[name] = section
            continue
        own = {}
        for key, value in section.items():
            if key in _FLAG_NAMES and key not in ("node_name", "nodeName"):
                flags.setdefault(_FLAG_NAMES[key], value)
            elif key in _KUBELET_NAMES:
                kubelet.setdefault(key, value)
            else:
                own[key] = value
        out[name] = own
    return out


def split_legacy(flat: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(kubelet fields, KubeletFlags fields, NodeAgentConfiguration fields) of a flat mapping in
    nodeagent's earlier format. Names nobody knows stay with the kubelet part, whose model
    refuses them with their path."""
    kubelet: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    agent: dict[str, Any] = {}
    moved: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if key in ("plugins",) and isinstance(value, Mapping):
            value = _hoist(value, kubelet, flags)
        if key in _FLAG_NAMES:
            flags[_FLAG_NAMES[key]] = value
        elif key in _AGENT_NAMES:
            agent[_AGENT_NAMES[key]] = value
        elif key in MOVED_TO_PLUGINS:
            plugin, name = MOVED_TO_PLUGINS[key]
            moved.setdefault(plugin, {})[name] = _json_ready(value)
            if plugin == "logs":
                # The gc stage removes the dangling links of the same directory.
                moved.setdefault("gc", {})[name] = _json_ready(value)
        else:
            kubelet[key] = value
    if moved:
        # A plugin's own section wins over the earlier top-level names it replaces.
        given = agent.get("plugins") if isinstance(agent.get("plugins"), Mapping) else {}
        merged = {name: dict(section) for name, section in (given or {}).items()}
        for name, section in moved.items():
            merged[name] = {**section, **merged.get(name, {})}
        agent["plugins"] = merged
    return kubelet, flags, agent


class AgentConfig(BaseModel):
    """The effective configuration the composition root builds the agent from."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    kubelet: KubeletConfiguration = Field(default_factory=lambda: kdefaults.defaulted(own_format=True))
    flags: KubeletFlags = Field(default_factory=lambda: KubeletFlags(root_dir=DEFAULT_ROOT_DIR))
    agent: NodeAgentConfiguration = Field(default_factory=lambda: NodeAgentConfiguration())
    _assembled: Assembled | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """``AgentConfig(node_name=..., static_pod_path=..., max_pods=...)``: the flat names of
        nodeagent's earlier format (tests and embedders build the agent this way); given beside
        the sections (``{**config.model_dump(), "maxPods": 3}``), they change those sections."""
        if not isinstance(data, Mapping) or not data:
            return data
        sections = {k: data[k] for k in ("kubelet", "flags", "agent") if k in data}
        flat = {k: v for k, v in data.items() if k not in sections}
        if not flat:
            return data
        kubelet, flags, agent = split_legacy(flat)
        authorization = kubelet.get("authorization")
        if isinstance(authorization, Mapping) and authorization.get("mode") == "":
            # nodeagent's format does not default the mode: "" is the kubelet's BuildAuthz refusal.
            raise ValueError("no authorization mode specified")
        base = sections.get("kubelet")
        if isinstance(base, BaseModel):
            base = base.model_dump()
        merged_kubelet = _merge(KubeletConfiguration, dict(base or {}), _json_ready(kubelet))
        config = kdefaults.eviction_hard(kdefaults.apply(KubeletConfiguration.model_validate(merged_kubelet),
                                                         own_format=True))
        base_flags = sections.get("flags")
        base_flags = base_flags.model_dump() if isinstance(base_flags, BaseModel) else dict(
            base_flags or {"root_dir": DEFAULT_ROOT_DIR})
        base_agent = sections.get("agent")
        base_agent = base_agent.model_dump() if isinstance(base_agent, BaseModel) else dict(base_agent or {})
        if "plugins" in agent:
            plugins = {name: dict(section) for name, section in (base_agent.get("plugins") or {}).items()}
            for name, section in agent.pop("plugins").items():
                plugins[name] = {**plugins.get(name, {}), **section}
            base_agent["plugins"] = plugins
        return {"kubelet": config, "flags": {**base_flags, **flags},
                "agent": NodeAgentConfiguration.model_validate({**base_agent, **agent})}

    def to_yaml(self) -> str:
        """This configuration as a file: a KubeletConfiguration document and a
        NodeAgentConfiguration one (the command-line settings in its ``kubeletFlags``), which
        ``nodeagent run --config`` reads back to the same configuration (what a test or a
        benchmark hands an agent it starts as a process). Fields nodeagent's own format leaves to
        the mode (enableServer, webhook authentication, the authorization mode) take a
        KubeletConfiguration file's defaults (on, Webhook): the same as cluster mode's."""
        import yaml  # only here: the agent itself reads YAML through its own bounded loader

        kubelet = self.kubelet.model_dump(mode="json", by_alias=True, exclude_none=True)
        agent = self.agent.model_dump(mode="json", by_alias=True, exclude_none=True)
        given = {name: getattr(self.flags, name) for name in KubeletFlagsSection.model_fields}
        defaults = KubeletFlags(root_dir=DEFAULT_ROOT_DIR)
        flags = KubeletFlagsSection.model_validate(
            {k: v for k, v in given.items() if v != getattr(defaults, k) or k == "root_dir"})
        agent["kubeletFlags"] = flags.model_dump(mode="json", by_alias=True, exclude_none=True)
        text: str = yaml.safe_dump_all([{"apiVersion": API_VERSION, "kind": KIND, **kubelet},
                                        {"apiVersion": AGENT_API_VERSION, "kind": AGENT_KIND, **agent}],
                                       sort_keys=False)
        return text

    def replace(self, **changes: Any) -> AgentConfig:
        """A copy with fields changed, by the flat names (``replace(max_pods=3,
        authentication={"anonymous": {"enabled": True}})``)."""
        return AgentConfig.model_validate({**self.model_dump(), **changes})

    # --- who the node is --------------------------------------------------------------

    @property
    def node_name(self) -> str:
        """The kubelet's node name: ``--hostname-override``, else the host name, lower-cased."""
        return node_name(self.flags.hostname_override)

    @property
    def root_dir(self) -> Path:
        return self.flags.root_dir

    @property
    def kubeconfig(self) -> Path | None:
        return self.flags.kubeconfig

    @property
    def node_ips(self) -> list[str]:
        """``--node-ip`` as given (detection happens when the agent starts: nodeagent/nodeip.py)."""
        return [ip.strip() for ip in self.flags.node_ip.split(",") if ip.strip()]

    @property
    def static_pod_path(self) -> Path | None:
        """staticPodPath as a path (None: no static pods)."""
        return Path(self.kubelet.static_pod_path) if self.kubelet.static_pod_path else None

    @property
    def pod_logs_dir(self) -> Path:
        return Path(self.kubelet.pod_logs_dir)

    @property
    def node_ip(self) -> str:
        """The primary ``--node-ip``, or "" when it is to be detected."""
        return self.node_ips[0] if self.node_ips else ""

    @property
    def profile(self) -> dict[str, list[str]]:
        return self.agent.profile

    @property
    def plugins(self) -> dict[str, dict[str, Any]]:
        return self.agent.plugins

    @property
    def log_format(self) -> str:
        if self.agent.log_format is not None:
            return self.agent.log_format
        return "json" if self.kubelet.logging.format == "json" else "console"

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.kubelet.healthz_bind_address}:{self.kubelet.healthz_port}"

    @property
    def assembled(self) -> Assembled | None:
        """Where each kubelet field came from (set when loaded from files and flags)."""
        return self._assembled

    def unsupported_fields(self) -> dict[str, Any]:
        """KubeletConfiguration fields nodeagent does not honour, set to something other than
        their default (dotted JSON path -> value): what the agent reports at start."""
        if self._assembled is not None:
            return self._assembled.unsupported()
        return support.unsupported(self.kubelet, kdefaults.defaulted(own_format=True))

    def node_config(self) -> NodeConfig:
        """The read-only node configuration stages get (handle.settings, ctx.settings)."""
        return NodeConfig.of(self.kubelet, root_dir=self.root_dir, node_name=self.node_name, flags=self.flags)


def node_name(override: str) -> str:
    """nodeutil.GetHostname: the override (trimmed) or the host name, lower-cased."""
    name = override.strip() or socket.gethostname()
    return name.strip().lower()


# --- loading from files and flags -------------------------------------------------------------

def _documents(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from None
    try:
        docs = load_yaml(text)
    except DecodeError as exc:
        raise ConfigError(f"configuration {path} is not valid YAML: {exc}") from None
    for doc in docs:
        if not isinstance(doc, dict):
            raise ConfigError(f"configuration {path} must be a mapping, not {type(doc).__name__}")
    return docs


def _kind(doc: Mapping[str, Any]) -> str:
    version, kind = doc.get("apiVersion"), doc.get("kind")
    if (version, kind) == (API_VERSION, KIND):
        return "kubelet"
    if (version, kind) == (AGENT_API_VERSION, AGENT_KIND):
        return "agent"
    if version is None and kind is None:
        return "legacy"
    return f"{version}/{kind}"


class Sources(BaseModel):
    """What the configuration files say, sorted into their parts."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    kubelet_body: dict[str, Any] | None = None
    kubelet_origin: str = ""
    agent: dict[str, Any] = Field(default_factory=dict)
    agent_origin: str = ""
    own_kubelet: dict[str, Any] = Field(default_factory=dict)
    """KubeletConfiguration fields given in nodeagent's earlier format."""
    own_flags: dict[str, Any] = Field(default_factory=dict)


def read_sources(config: Path | None, agent_config: Path | None, *, strict_config: bool) -> Sources:
    """``--config`` (strictly a KubeletConfiguration when ``strict_config``, as for the kubelet;
    otherwise any of nodeagent's documents, several in one file) and ``--agent-config``."""
    out = Sources()
    if config is not None:
        if strict_config:
            try:
                out.kubelet_body, out.kubelet_origin = read_config_file(config), str(config)
            except ConfigurationError as exc:
                raise ConfigError(str(exc)) from None
        else:
            _sort(out, config, allow_kubelet=True)
    if agent_config is not None:
        _sort(out, agent_config, allow_kubelet=False)
    return out


def _sort(out: Sources, path: Path, *, allow_kubelet: bool) -> None:
    seen: set[str] = set()
    for doc in _documents(path):
        kind = _kind(doc)
        if kind in seen:
            raise ConfigError(f"configuration {path} has two {kind} documents")
        seen.add(kind)
        if kind == "kubelet" and allow_kubelet:
            if out.kubelet_body is not None:
                raise ConfigError(f"configuration {path}: a KubeletConfiguration is already given")
            try:
                check(doc)
            except DecodeError as exc:
                raise ConfigError(f"failed to load kubelet config file, path: {path}, error: failed to load Kubelet "
                                  f"config file {path}, error {exc}") from None
            body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
            resolve_paths(body, Path(path).absolute().parent)
            out.kubelet_body, out.kubelet_origin = body, str(path)
        elif kind == "agent":
            out.agent = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
            out.agent_origin = str(path)
        elif kind == "legacy":
            kubelet, flags, agent = split_legacy(doc)
            out.own_kubelet = _json_ready(kubelet)
            out.own_flags = flags
            out.agent = agent
            out.agent_origin = str(path)
        else:
            expected = (f"{API_VERSION} {KIND} or " if allow_kubelet else "") + f"{AGENT_API_VERSION} {AGENT_KIND}"
            raise ConfigError(f"configuration {path}: unknown document {kind} (expected {expected}, or nodeagent's "
                              "earlier format without apiVersion)")


def build(command: CommandLine, sources: Sources, *, kubelet_defaults: bool = False) -> AgentConfig:
    """The effective configuration of a command line and its files, validated as the kubelet
    validates it; :class:`ConfigError` with the kubelet's words otherwise.

    Without a KubeletConfiguration, ``kubelet_defaults`` (``nodeagent kubelet``) starts from the
    kubelet's command-line defaults (anonymous requests, AlwaysAllow), otherwise from
    nodeagent's (decided by mode; see the module docstring)."""
    try:
        agent = NodeAgentConfiguration.model_validate(sources.agent)
    except ValidationError as exc:
        raise ConfigError(format_pydantic(exc, sources.agent_origin or "the agent configuration")) from None
    own_format = sources.kubelet_body is None and not kubelet_defaults
    try:
        assembled = assemble(config_body=sources.kubelet_body, config_origin=sources.kubelet_origin,
                             config_dir=command.flags.config_dir, flag_config=command.config,
                             flag_origins=command.config_flags, own=sources.own_kubelet,
                             own_origin=sources.agent_origin, own_format=own_format)
        validate(assembled.config)
    except ConfigurationError as exc:
        raise ConfigError(str(exc)) from None
    flags = _flags(command, agent, sources)
    try:
        validate_node_labels(flags.node_labels)
    except FlagError as exc:
        raise ConfigError(f"failed to validate kubelet flags: {exc}") from None
    config = AgentConfig(kubelet=assembled.config, flags=flags, agent=agent)
    config._assembled = assembled
    for name in command.given & {"hostname_override", "node_ip", "root_dir", "kubeconfig", "bootstrap_kubeconfig",
                                 "cert_dir", "node_labels"}:
        assembled.origins[f"flags.{name}"] = Origin("flag", f"--{name.replace('_', '-')}")
    return config


def _flags(command: CommandLine, agent: NodeAgentConfiguration, sources: Sources) -> KubeletFlags:
    """The command line's KubeletFlags over those the files give."""
    from_file = {**agent.kubelet_flags.model_dump(exclude_none=True), **sources.own_flags}
    given = command.flags.model_dump()
    merged = {**given, **{k: v for k, v in from_file.items() if k not in command.given}}
    return KubeletFlags(**merged)


def load(path: Path | None) -> AgentConfig:
    """The configuration ``nodeagent run --config PATH`` reads, without further flags."""
    from nodeagent.kubeletconfig.flags import parse

    return build(parse([], defaults={"root_dir": DEFAULT_ROOT_DIR}), read_sources(path, None, strict_config=False))


def flag_names(fields: Sequence[str]) -> dict[str, str]:
    """``--static-pod-path`` style flag for each camelCase field."""
    out = {}
    for name in fields:
        camel = to_camel(name)
        out[name] = "--" + "".join("-" + ch.lower() if ch.isupper() else ch for ch in camel)
    return out


__all__ = ["AGENT_API_VERSION", "AGENT_KIND", "AgentConfig", "ConfigError", "NodeAgentConfiguration", "Sources",
           "build", "load", "node_name", "read_sources", "split_legacy"]
