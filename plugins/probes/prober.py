"""Running one probe against one container instance (pkg/kubelet/prober/prober.go runProbe).

A probe either answers (an Outcome and its output, the text the kubelet puts in its Unhealthy
event) or cannot be run at all (no pod IP, an unknown port name, a runtime error): that is a
ProbeError, retried a few times and then thrown away without counting towards a threshold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cri import CriError, DeadlineExceeded
from nodeagent.model import Container, Probe
from plugins.probes import grpchealth
from plugins.probes.http import USER_AGENT, format_url, host_port, probe_http, probe_tcp
from plugins.probes.results import Outcome

if TYPE_CHECKING:
    from cri import RuntimeClient

MAX_PROBE_RETRIES = 3  # maxProbeRetries: only errors are retried, never failures
MAX_EXEC_OUTPUT = 10 * 1024  # maxReadLength of the exec prober


class ProbeError(Exception):
    """The probe could not be run; its result is thrown away."""


@dataclass(frozen=True)
class Target:
    container: Container
    container_id: str
    pod_ip: str
    """The pod's IP, or the node's for a hostNetwork pod: the default host of network probes."""


async def run_probe(runtime: RuntimeClient, probe: Probe, target: Target) -> tuple[Outcome, str]:
    error = ProbeError("probe not run")
    for _ in range(MAX_PROBE_RETRIES):
        try:
            return await _run_once(runtime, probe, target)
        except ProbeError as exc:
            error = exc
    raise error


async def _run_once(runtime: RuntimeClient, probe: Probe, target: Target) -> tuple[Outcome, str]:
    timeout = probe.timeout_seconds
    if probe.exec is not None:
        env = {e.name: e.value for e in target.container.env}
        return await _exec(runtime, target.container_id, [expand(arg, env) for arg in probe.exec.command], timeout)
    if probe.http_get is not None:
        action = probe.http_get
        host = action.host or _pod_ip(target)
        url = format_url(action.scheme, host, resolve_port(action.port, target.container), action.path)
        headers = [(h.name, h.value) for h in action.http_headers]
        return await probe_http(url, headers, timeout)
    if probe.tcp_socket is not None:
        action_tcp = probe.tcp_socket
        host = action_tcp.host or _pod_ip(target)
        return await probe_tcp(host, resolve_port(action_tcp.port, target.container), timeout)
    if probe.grpc is not None:
        address = host_port(_pod_ip(target), probe.grpc.port)
        healthy, output = await grpchealth.check(address, probe.grpc.service, timeout, USER_AGENT)
        return (Outcome.SUCCESS if healthy else Outcome.FAILURE), output
    raise ProbeError("probe has no handler")  # the model forbids it; kept for safety


async def _exec(runtime: RuntimeClient, container_id: str, cmd: list[str], timeout: int) -> tuple[Outcome, str]:
    try:
        result = await runtime.exec_sync(container_id, cmd, timeout)
    except DeadlineExceeded:
        # The runtime killed the command at the probe's timeout (ExecProbeTimeout): a failure.
        return Outcome.FAILURE, f'command "{" ".join(cmd)}" timed out'
    except CriError as exc:
        raise ProbeError(str(exc)) from exc
    output = (result.stdout + result.stderr)[:MAX_EXEC_OUTPUT].decode(errors="replace")
    return (Outcome.SUCCESS if result.exit_code == 0 else Outcome.FAILURE), output


def _pod_ip(target: Target) -> str:
    if not target.pod_ip:
        raise ProbeError("the pod has no IP address yet")
    return target.pod_ip


def resolve_port(port: int | str, container: Container) -> int:
    """A port number, a named container port, or a number written as a string (extractPort)."""
    number = port
    if isinstance(port, str):
        named = [p.container_port for p in container.ports if p.name == port]
        if named:
            number = named[0]
        elif port.isdigit():
            number = int(port)
        else:
            raise ProbeError(f"couldn't find port: {port} in {container.name}")
    assert isinstance(number, int)
    if not 0 < number < 65536:
        raise ProbeError(f"invalid port number: {number}")
    return number


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` from the container's literal env (ExpandContainerCommandOnlyStatic): ``$$`` is
    a literal ``$``, an undefined or unterminated reference stays as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append("$(")
                i += 2
                continue
            name = text[i + 2:close]
            out.append(env.get(name, f"$({name})"))
            i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)
