"""Pod security semantics shared by the stage that admits pods (podsecurity: privileged
containers, unsafe sysctls) and the one that builds their CRI configs (runtime)."""

from __future__ import annotations

from nodeagent.model import Container


def is_privileged(container: Container) -> bool:
    return bool(container.security_context and container.security_context.privileged)


def normalize_sysctl(name: str) -> str:
    """utilsysctl.NormalizeName: ``kernel/shm_rmid_forced`` → ``kernel.shm_rmid_forced`` (when
    the first separator is a slash, slashes and dots swap)."""
    for ch in name:
        if ch == ".":
            return name
        if ch == "/":
            return name.translate(str.maketrans("/.", "./"))
    return name


__all__ = ["is_privileged", "normalize_sysctl"]
