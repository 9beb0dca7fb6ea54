"""Stage plugin discovery, validation and ordering.

Built-in stages and third-party ones are found the same way: entry points in the group
``nodeagent.plugins``. Everything wrong with a plugin or a profile is reported when the agent
loads, before any pod is touched (pluggy's and the scheduler's fail-fast rule).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from nodeagent import facts
from nodeagent.errors import PluginError
from nodeagent.stages import PHASE_BASES, PHASE_SPECS, AgentHandle, Phase, Stage, phases_of

GROUP = "nodeagent.plugins"

# The default profile: which stages run in each setup phase, in order. Undo phases run the
# reverse. The empty places are where later stages go: devices ("dra") before the sandbox in
# prepare, the gang barrier in permit.
DEFAULT_PROFILE: Mapping[str, Sequence[str]] = {
    # the kubelet checks sysctls before resources; the gang checks its members' fit before
    # noderesources, so that a member that does not fit aborts its gang (docs/GANG.md); the
    # NoExecute taints last, as the kubelet's generalFilter checks them after the node fit
    # eviction first and shutdown last, as the kubelet adds its eviction admit handler before
    # every other and its shutdown manager after them (pkg/kubelet/kubelet.go)
    "admit": ["eviction", "podsecurity", "gang", "noderesources", "tainttoleration", "shutdown"],
    "reserve": ["gang"],
    # devices first: the kubelet prepares claims before the sandbox; API-backed volumes
    # (configMap, secret, projected) and env next, so that a FailedMount holds the sandbox back;
    # persistent and CSI volumes last before the sandbox (their wait is the longest)
    "prepare": ["dra", "volumes", "apivolumes", "csi", "runtime"],
    "permit": ["gang"],  # the gang barrier: after local preparation, before any container
    "start": ["runtime"],
    # volumes, apivolumes: files follow the pod's metadata and their objects; token refresh;
    # csi: node expansion of resized claims
    "observe": ["status", "runtime", "probes", "logs", "volumes", "apivolumes", "csi", "activedeadline"],
    "cleanup": ["logs", "runtime"],
    # node-wide managers (their admit halves are in "admit" above): node-pressure eviction,
    # image and container garbage collection, graceful node shutdown
    "node": ["eviction", "gc", "shutdown"],
}

# Which configurable phase decides the order of each phase.
ORDER_SOURCE: Mapping[Phase, tuple[Phase, bool]] = {
    Phase.ADMIT: (Phase.ADMIT, False),
    Phase.RESERVE: (Phase.RESERVE, False),
    Phase.PREPARE: (Phase.PREPARE, False),
    Phase.PERMIT: (Phase.PERMIT, False),
    Phase.START: (Phase.START, False),
    Phase.OBSERVE: (Phase.OBSERVE, False),
    Phase.STOP: (Phase.START, True),
    Phase.UNPREPARE: (Phase.PREPARE, True),
    Phase.CLEANUP: (Phase.CLEANUP, True),
    Phase.UNRESERVE: (Phase.RESERVE, True),
    Phase.NODE: (Phase.NODE, False),
}
CONFIGURABLE = ("admit", "reserve", "prepare", "permit", "start", "observe", "cleanup", "node")


@dataclass(frozen=True)
class Pipeline:
    """The resolved order: for each phase, the stage instances that run, in order."""

    stages: Mapping[str, Stage]
    order: Mapping[Phase, tuple[Stage, ...]]

    def __getitem__(self, phase: Phase) -> tuple[Stage, ...]:
        return self.order.get(phase, ())

    def render(self) -> str:
        lines = []
        for phase in Phase:
            names = ", ".join(s.name for s in self[phase]) or "-"
            spec = PHASE_SPECS[phase]
            lines.append(f"{phase.value:<10} {spec.cycle:<10} {names}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, list[str]]:
        return {phase.value: [s.name for s in self[phase]] for phase in Phase}


def discover(group: str = GROUP) -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        if ep.name in found and found[ep.name].value != ep.value:
            raise PluginError(
                f"two plugins are named {ep.name!r}: {found[ep.name].value} and {ep.value}"
            )
        found[ep.name] = ep
    return found


# A node task's method is ``run``, not ``node``.
_PHASE_METHODS = {p.value for p in Phase if p is not Phase.NODE}


def validate_stage(name: str, stage: Any) -> Stage:
    """Fail fast on a plugin object that cannot work; returns it typed."""
    if not isinstance(stage, Stage):
        raise PluginError(f"plugin {name!r}: factory returned {type(stage).__name__}, not a Stage")
    if getattr(stage, "name", None) != name:
        raise PluginError(
            f"plugin {name!r}: its class says name={getattr(stage, 'name', None)!r}; "
            "the entry-point name, the class name attribute and the config section must agree"
        )
    joined = phases_of(stage)
    if not joined:
        raise PluginError(f"plugin {name!r} implements no phase (inherit e.g. nodeagent.stages.Admit)")
    for attr in _PHASE_METHODS:
        method = getattr(type(stage), attr, None)
        if method is None:
            continue
        phase = Phase(attr)
        if phase not in joined:
            raise PluginError(
                f"plugin {name!r} defines {attr}() but does not inherit "
                f"{PHASE_BASES[phase].__name__}: the method would never be called"
            )
        if not inspect.iscoroutinefunction(method):
            raise PluginError(f"plugin {name!r}: {attr}() must be 'async def'")
        expected = inspect.signature(getattr(PHASE_BASES[phase], attr))
        got = inspect.signature(method)
        if [p.name for p in got.parameters.values()] != [p.name for p in expected.parameters.values()]:
            raise PluginError(
                f"plugin {name!r}: {attr}{got} does not match the contract {attr}{expected}"
            )
    return stage


def resolve(
    profile: Mapping[str, Sequence[str]],
    available: Mapping[str, Stage],
) -> Pipeline:
    """Order the stages per phase as ``profile`` says; reject names that cannot work."""
    unknown_phases = set(profile) - set(CONFIGURABLE)
    if unknown_phases:
        raise PluginError(
            f"profile names unknown phase(s) {sorted(unknown_phases)}; phases are {list(CONFIGURABLE)}"
            " (undo phases follow their partner in reverse)"
        )
    configured: dict[Phase, list[Stage]] = {}
    for phase_name in CONFIGURABLE:
        phase = Phase(phase_name)
        stages: list[Stage] = []
        for name in profile.get(phase_name, []):
            if name not in available:
                raise PluginError(
                    f"profile phase {phase_name!r} names plugin {name!r}, which is not installed "
                    f"(installed: {sorted(available)})"
                )
            stage = available[name]
            if phase not in phases_of(stage):
                raise PluginError(
                    f"profile phase {phase_name!r} names plugin {name!r}, which does not implement it "
                    f"(it implements {sorted(p.value for p in phases_of(stage))})"
                )
            if stage in stages:
                raise PluginError(f"profile phase {phase_name!r} lists {name!r} twice")
            stages.append(stage)
        configured[phase] = stages
    order: dict[Phase, tuple[Stage, ...]] = {}
    for phase, (source, reverse) in ORDER_SOURCE.items():
        chain = configured[source]
        order[phase] = tuple(reversed(chain)) if reverse else tuple(chain)
    used = {s.name for chain in order.values() for s in chain}
    in_profile = {n: s for n, s in available.items() if n in used}
    problems = facts.missing_providers(in_profile)
    if problems:
        raise PluginError("; ".join(problems) + f" (stages in the profile: {sorted(in_profile)})")
    return Pipeline(stages=in_profile, order=order)


def load(
    profile: Mapping[str, Sequence[str]],
    plugin_config: Mapping[str, Mapping[str, Any]],
    handle: AgentHandle,
    *,
    entry: Mapping[str, EntryPoint] | None = None,
) -> tuple[Pipeline, list[str]]:
    """Discover, instantiate, validate and order the plugins the profile names.

    Returns the pipeline and warnings (installed plugins that no profile phase uses).
    """
    eps = dict(entry if entry is not None else discover())
    wanted = {name for names in profile.values() for name in names}
    unknown_sections = set(plugin_config) - set(eps)
    if unknown_sections:
        raise PluginError(
            f"configuration has sections for unknown plugin(s) {sorted(unknown_sections)}; "
            f"installed: {sorted(eps)}"
        )
    instances: dict[str, Stage] = {}
    for name in sorted(wanted):
        if name not in eps:
            raise PluginError(f"profile names plugin {name!r}, which is not installed (installed: {sorted(eps)})")
        try:
            factory = eps[name].load()
        except Exception as exc:  # a broken third-party package must not look like our bug
            raise PluginError(f"plugin {name!r} ({eps[name].value}) failed to import: {exc!r}") from exc
        try:
            stage = factory(plugin_config.get(name, {}), handle)
        except (TypeError, ValueError) as exc:  # ValueError covers pydantic's ValidationError
            raise PluginError(f"plugin {name!r} could not be created from its configuration: {exc}") from exc
        instances[name] = validate_stage(name, stage)
    warnings = [
        f"plugin {name!r} is installed but no profile phase uses it" for name in sorted(set(eps) - wanted)
    ]
    return resolve(profile, instances), warnings


def stage_classes(profile: Mapping[str, Sequence[str]], eps: Mapping[str, EntryPoint] | None = None
                  ) -> dict[str, type[Stage]]:
    """The classes of the installed stages the profile names, without making them (for
    ``nodeagent wiring``: the fact graph is declared on the classes)."""
    eps = dict(eps if eps is not None else discover())
    out: dict[str, type[Stage]] = {}
    for name in sorted({n for names in profile.values() for n in names}):
        if name not in eps:
            continue
        try:
            factory = eps[name].load()
        except Exception:  # noqa: BLE001 - `nodeagent plugins` reports broken plugins
            continue
        cls = getattr(factory, "stage_class", None) or factory
        if isinstance(cls, type) and issubclass(cls, Stage):
            out[name] = cls
    return out


def installed_phases(eps: Iterable[EntryPoint]) -> dict[str, list[str]]:
    """For ``nodeagent plugins``: the phases each installed plugin's class joins (no instances)."""
    out: dict[str, list[str]] = {}
    for ep in eps:
        try:
            factory = ep.load()
            cls = getattr(factory, "stage_class", None) or factory
            out[ep.name] = sorted(p.value for p in phases_of(cls)) if isinstance(cls, type) else ["?"]
        except Exception as exc:
            out[ep.name] = [f"failed to import: {exc!r}"]
    return out
