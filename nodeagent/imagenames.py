"""Image names as the kubelet's configuration and image records read them (no registry
normalisation: ``busybox:1.36`` is the repository ``busybox`` here)."""

from __future__ import annotations


def without_tag_or_digest(image: str) -> str:
    """The image as written, its ``@digest`` and ``:tag`` cut (the kubelet's records are keyed
    so, not normalised: ``busybox:1.36`` is ``busybox``)."""
    name = image.partition("@")[0]
    colon, slash = name.rfind(":"), name.rfind("/")
    return name[:colon] if colon > slash else name


def allowlist_pattern(pattern: str) -> tuple[str, bool]:
    """(normalised pattern, is a prefix) of one allowlist entry; ValueError as the kubelet refuses."""
    if pattern != pattern.strip():
        raise ValueError(f"leading/trailing spaces are not allowed: {pattern}")
    prefix = pattern.endswith("/*")
    trimmed = pattern[:-1] if prefix else pattern
    if not trimmed:
        raise ValueError(f"the supplied pattern is too short: {pattern}")
    if "*" in trimmed:
        raise ValueError(f"not a valid wildcard pattern, only patterns ending with '/*' are allowed: {pattern}")
    if prefix and len(trimmed) == 1:
        raise ValueError("at least registry hostname is required")
    if not prefix and without_tag_or_digest(trimmed) != trimmed:
        raise ValueError(f"neither tag nor digest is accepted in an image reference: {pattern}")
    return trimmed, prefix
