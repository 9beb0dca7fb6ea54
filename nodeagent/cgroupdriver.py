"""The cgroup driver the node uses: the runtime's own, from CRI RuntimeConfig (containerd 2.x
answers it), else the configuration's ``cgroupDriver`` — the kubelet's getCgroupDriverFromCRI
(KubeletCgroupDriverFromCRI, GA), whose fallback for runtimes without RuntimeConfig
(containerd 1.6) the kubelet keeps until v1.38 and counts in ``kubelet_cri_losing_support``.

nodeagent makes pod cgroups as cgroupfs paths (plugins/runtime/podcgroup.py): on a runtime
that uses the systemd driver a sandbox under such a parent fails in runc, so pods are refused
at admission with a reason saying so (nodeagent/unsupported.py) instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio
import structlog

from cri import CriError, Unimplemented
from cri import types as t

log = structlog.get_logger("nodeagent.cgroupdriver")

Driver = Literal["cgroupfs", "systemd"]
CGROUPFS: Driver = "cgroupfs"
SYSTEMD: Driver = "systemd"


def configured(value: str) -> Driver:
    """The KubeletConfiguration's cgroupDriver (validated there: cgroupfs or systemd; empty
    before defaulting means cgroupfs)."""
    return SYSTEMD if value == SYSTEMD else CGROUPFS
LOSING_SUPPORT_VERSION = "1.38.0"
"""The kubelet's label on kubelet_cri_losing_support: the release dropping the fallback."""
ATTEMPTS = 3
RETRY_SECONDS = 2.0


class _Runtime(Protocol):
    async def runtime_config(self) -> t.LinuxRuntimeConfiguration | None: ...


@dataclass(frozen=True)
class CgroupDriver:
    driver: Driver
    from_runtime: bool
    """False: the configuration's (the runtime has no RuntimeConfig, or said nothing)."""
    losing_support: bool = False
    """The runtime lacks RuntimeConfig (Unimplemented): kubelet_cri_losing_support."""

    def render_metrics(self) -> str:
        if not self.losing_support:
            return ""
        return ("# HELP kubelet_cri_losing_support [ALPHA] the Kubernetes version that the currently running "
                "CRI implementation will lose support on if not upgraded.\n"
                "# TYPE kubelet_cri_losing_support gauge\n"
                f'kubelet_cri_losing_support{{version="{LOSING_SUPPORT_VERSION}"}} 1\n')


async def resolve(runtime: _Runtime, configured: Driver,
                  sleep: Callable[[float], Awaitable[None]] = anyio.sleep) -> CgroupDriver:
    """Ask the runtime (a few times: it may still be starting); Unimplemented falls back at once.
    Unlike the kubelet, which fails its start, a runtime that keeps failing the call falls back
    too (logged): the agent stays up."""
    error: CriError | None = None
    for attempt in range(ATTEMPTS):
        if attempt:
            await sleep(RETRY_SECONDS)
        try:
            linux = await runtime.runtime_config()
        except Unimplemented:
            log.info("CRI implementation should be updated to support RuntimeConfig. "
                     "Falling back to using cgroupDriver from kubelet config.", cgroup_driver=configured)
            return CgroupDriver(configured, from_runtime=False, losing_support=True)
        except CriError as exc:
            error = exc
            continue
        if linux is None:  # no Linux section: nothing said (GetCgroupDriver would default to systemd)
            return CgroupDriver(configured, from_runtime=False)
        driver = SYSTEMD if linux.cgroup_driver == t.CgroupDriver.SYSTEMD else CGROUPFS
        if driver != configured:
            log.info("using the runtime's cgroup driver instead of the configured one", runtime=driver,
                     configured=configured)
        return CgroupDriver(driver, from_runtime=True)
    log.warning("RuntimeConfig failed; using cgroupDriver from the configuration", error=str(error),
                cgroup_driver=configured)
    return CgroupDriver(configured, from_runtime=False)


__all__ = ["CGROUPFS", "SYSTEMD", "CgroupDriver", "Driver", "resolve"]
