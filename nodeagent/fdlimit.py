"""The open-file limit, raised as the Go runtime raises it for the kubelet.

Since Go 1.19 every Go program on Linux sets its soft RLIMIT_NOFILE to the hard limit at
start (os package init), so the kubelet, its API server connections, log followers and
watches never meet the 1024 soft default. Python keeps whatever it inherited: the agent
raises it itself when it starts.
"""

from __future__ import annotations

import resource

import structlog

log = structlog.get_logger("nodeagent")


def raise_to_hard_limit() -> int:
    """Soft RLIMIT_NOFILE = hard; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # a hard limit the kernel caps lower (nr_open)
        log.warning("cannot raise the open-file limit", soft=soft, hard=hard, error=str(exc))
        return soft
    log.info("open-file limit raised", soft=hard, was=soft)
    return hard


__all__ = ["raise_to_hard_limit"]
