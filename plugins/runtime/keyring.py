"""Which registry credentials of a pod's image pull secrets apply to an image.

Pure functions with the kubelet's semantics (its credential keyring): a docker config key is
read as a URL (``https://`` assumed), its ``/v1/`` or ``/v2/`` path prefix dropped; a key matches
an image when the ports are equal, the hosts have as many dot-separated labels and each image
label matches the key's label as a glob (``*.example.com``), and the key's path is a prefix of
the image's path. Every matching key contributes, keys tried in reverse lexical order (so a
longer path comes before its prefix); when none matches, an image of Docker Hub takes the
``index.docker.io`` entry (``https://index.docker.io/v1/`` is that key too).

Credentials never reach a log line or an exception message: :class:`Credential` hides its
password from ``repr``, and parse errors name the secret and the key, never a value.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DOCKER_CONFIG_JSON = "kubernetes.io/dockerconfigjson"
DOCKER_CONFIG_JSON_KEY = ".dockerconfigjson"
DOCKERCFG = "kubernetes.io/dockercfg"
DOCKERCFG_KEY = ".dockercfg"

DEFAULT_DOMAIN = "docker.io"
LEGACY_DEFAULT_DOMAIN = "index.docker.io"
OFFICIAL_REPOSITORY_PREFIX = "library/"


class KeyringError(Exception):
    """A pull secret's docker config cannot be read (the kubelet fails the pull then)."""


@dataclass(frozen=True)
class Credential:
    username: str
    password: str = field(repr=False)
    secret: str = ""
    """The secret it came from (a name, safe to log); for the node's own, its file."""
    namespace: str = ""
    uid: str = ""
    """The secret's namespace and UID (what the image pull records keep)."""
    node: bool = False
    """The node's own credential (plugins/runtime/nodekeyring.py), not a pod's secret."""


def _field(entry: Mapping[str, Any], name: str) -> Any:
    # Go's encoding/json matches struct fields case-insensitively, preferring an exact match.
    if name in entry:
        return entry[name]
    for key, value in entry.items():
        if key.lower() == name:
            return value
    return None


def _text(entry: Mapping[str, Any], name: str, where: str) -> str:
    value = _field(entry, name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise KeyringError(f"{where}: {name} is not a string")
    return value


def decode_auth(auth: str, where: str = "auth") -> tuple[str, str]:
    """``auth`` is base64 of ``user:password``, padded or not; split at the first colon."""
    padded = auth if auth.strip().endswith("=") else auth + "=" * (-len(auth) % 4)
    try:
        decoded = base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        raise KeyringError(f"{where}: auth is not valid base64") from None
    user, colon, password = decoded.decode("utf-8", errors="replace").partition(":")
    if not colon:
        raise KeyringError(f"{where}: unable to parse auth field, must be formatted as base64(username:password)")
    return user, password


def auths_of(secret_type: str, data: Mapping[str, bytes], secret: str = "") -> dict[str, Credential] | None:
    """The registry entries of one secret: ``.dockerconfigjson`` (``{"auths": {...}}``) of a
    ``kubernetes.io/dockerconfigjson`` secret, ``.dockercfg`` (the entries directly) of a
    ``kubernetes.io/dockercfg`` one. None for any other secret (the kubelet skips it)."""
    if secret_type == DOCKER_CONFIG_JSON and data.get(DOCKER_CONFIG_JSON_KEY):
        document = _load(data[DOCKER_CONFIG_JSON_KEY], secret)
        if not isinstance(document, dict):
            raise KeyringError(f'secret "{secret}": the docker config is not an object')
        entries = _field(document, "auths")
    elif secret_type == DOCKERCFG and data.get(DOCKERCFG_KEY):
        entries = _load(data[DOCKERCFG_KEY], secret)
    else:
        return None
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        raise KeyringError(f'secret "{secret}": the docker config entries are not an object')
    found: dict[str, Credential] = {}
    for key, entry in entries.items():
        where = f'secret "{secret}", registry "{key}"'
        if entry is None:
            entry = {}
        if not isinstance(entry, dict):
            raise KeyringError(f"{where}: not an object")
        user, password = _text(entry, "username", where), _text(entry, "password", where)
        auth = _text(entry, "auth", where)
        if auth:
            user, password = decode_auth(auth, where)
        found[key] = Credential(user, password, secret)
    return found


def _load(raw: bytes, secret: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        # json's messages give positions, never content.
        raise KeyringError(f'secret "{secret}": the docker config is not JSON: {exc}') from None


def _parse(url: str) -> tuple[str, str] | None:
    """(host with port, path) of an ``http(s)://`` URL as Go's net/url reads it, or None where
    Go refuses it: ``?`` and ``#`` end the path, a host in brackets is an IPv6 literal, a port
    must be digits."""
    rest = url.partition("://")[2]
    rest = re.split(r"[?#]", rest, maxsplit=1)[0]
    authority, slash, path = rest.partition("/")
    host = authority.rpartition("@")[2]
    if host.startswith("["):
        end = host.find("]")
        if end == -1:
            return None
        port = host[end + 1:]
        if port and not port.startswith(":"):
            return None
        port = port[1:]
    else:
        port = host.rpartition(":")[2] if ":" in host else ""
    if port and not port.isdigit():
        return None
    return host, slash + path


def keyring_key(registry: str) -> str | None:
    """The key an entry of a docker config is filed under (the kubelet's BasicDockerKeyring.Add)."""
    url = registry if registry.startswith(("https://", "http://")) else "https://" + registry
    parsed = _parse(url)
    if parsed is None:
        return None
    host, path = parsed
    if path.startswith(("/v2/", "/v1/")):
        path = path[3:]
    return host + path if path and path != "/" else host


def _split_host(host: str) -> tuple[list[str], str]:
    # Go's net.SplitHostPort; on error the whole host and no port.
    if host.startswith("["):
        end = host.find("]")
        if end != -1 and host[end + 1:end + 2] == ":" and ":" not in host[end + 2:]:
            return host[1:end].split("."), host[end + 2:]
        return host.split("."), ""
    name, colon, port = host.rpartition(":")
    if colon and ":" not in name:
        return name.split("."), port
    return host.split("."), ""


def _glob(pattern: str) -> re.Pattern[str] | None:
    """Go's path/filepath.Match pattern (``*``, ``?``, ``[a-z]``, ``[^...]``, ``\\`` escapes) as a
    regex for one host label; None for a malformed pattern (the kubelet: no match)."""

    def escaped(j: int) -> tuple[str, int] | None:
        if j >= len(pattern) or pattern[j] in "-]":
            return None
        if pattern[j] == "\\":
            j += 1
            if j >= len(pattern):
                return None
        return pattern[j], j + 1

    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            negate = pattern[j:j + 1] == "^"
            j += negate
            ranges: list[str] = []
            while not (pattern[j:j + 1] == "]" and ranges):
                lo = escaped(j)
                if lo is None:
                    return None
                (low, j), high = lo, lo[0]
                if pattern[j:j + 1] == "-":
                    hi = escaped(j + 1)
                    if hi is None:
                        return None
                    high, j = hi
                ranges.append(f"{re.escape(low)}-{re.escape(high)}")
            out.append("[" + ("^" if negate else "") + "".join(ranges) + "]")
            i = j
        else:
            if c == "\\":
                i += 1
                if i == len(pattern):
                    return None
                c = pattern[i]
            out.append(re.escape(c))
        i += 1
    try:
        return re.compile("".join(out))
    except re.error:  # a range lo > hi matches nothing in Go
        return None


def urls_match(glob: str, target: str) -> bool:
    """Whether keyring key ``glob`` applies to repository ``target`` (both without scheme)."""
    parsed_glob, parsed_target = _parse("https://" + glob), _parse("https://" + target)
    if parsed_glob is None or parsed_target is None:
        return False
    (glob_host, glob_path), (target_host, target_path) = parsed_glob, parsed_target
    glob_labels, glob_port = _split_host(glob_host)
    target_labels, target_port = _split_host(target_host)
    if glob_port != target_port or len(glob_labels) != len(target_labels):
        return False
    if not target_path.startswith(glob_path):
        return False
    for pattern, label in zip(glob_labels, target_labels, strict=True):
        compiled = _glob(pattern)
        if compiled is None or not compiled.fullmatch(label):
            return False
    return True


def repository(image: str) -> str:
    """The image's repository as the kubelet looks it up: normalised (``busybox`` is
    ``docker.io/library/busybox``), without tag or digest."""
    name = image.partition("@")[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name = name[:colon]
    first, sep, rest = name.partition("/")
    if not sep or ("." not in first and ":" not in first and first != "localhost" and first.lower() == first):
        domain, remainder = DEFAULT_DOMAIN, name
    else:
        domain, remainder = first, rest
    if domain == LEGACY_DEFAULT_DOMAIN:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in remainder:
        remainder = OFFICIAL_REPOSITORY_PREFIX + remainder
    return f"{domain}/{remainder}"


def _is_default_registry(repo: str) -> bool:
    first, sep, _ = repo.partition("/")
    if not first:
        return False
    if not sep or first in (DEFAULT_DOMAIN, LEGACY_DEFAULT_DOMAIN):
        return True
    return "." not in first and ":" not in first


class Keyring:
    """The credentials of a pod's pull secrets, filed by registry key."""

    def __init__(self) -> None:
        self._creds: dict[str, list[Credential]] = {}

    def add(self, auths: Mapping[str, Credential]) -> None:
        for registry, credential in auths.items():
            key = keyring_key(registry)
            if key is not None:  # the kubelet ignores (and logs) an entry that is no URL
                self._creds.setdefault(key, []).append(credential)

    def __bool__(self) -> bool:
        return bool(self._creds)

    def lookup(self, image: str) -> list[Credential]:
        """The credentials to try for ``image``, in the kubelet's order; empty: pull anonymously."""
        repo = repository(image)
        found = [c for key in sorted(self._creds, reverse=True) if urls_match(key, repo) for c in self._creds[key]]
        if not found and _is_default_registry(repo):
            found = list(self._creds.get(LEGACY_DEFAULT_DOMAIN, []))
        return found
