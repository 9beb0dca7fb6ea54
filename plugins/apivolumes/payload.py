"""The files of configMap, secret and projected volumes (pkg/volume/configmap, secret and
projected MakePayload / collectData): relative path → (content, mode). Content is bytes:
configMap binaryData and secrets need not be text.

Errors carry the kubelet's messages; the stage prefixes them with ``MountVolume.SetUp failed
for volume "<name>" :`` (the FailedMount event).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from nodeagent.kube.configdata import Kind, ObjectData, ObjectReader, ObjectUnavailable
from nodeagent.kube.downward import downward_payload
from nodeagent.kube.env import FieldError, PodFacts
from nodeagent.model import (
    DownwardAPIVolumeSource,
    KeyToPath,
    Pod,
    ProjectedVolumeSource,
    Volume,
)
from nodeagent.volumeutil.ownership import fs_group_of
from plugins.apivolumes.tokens import TokenUnavailable

Payload = dict[str, tuple[bytes, int]]
TokenSource = Callable[[str, int], Awaitable[str]]
"""(audience, expirationSeconds) → the pod's current token (cached, refreshed when due)."""

CONFIG_MAP = "kubernetes.io~configmap"
SECRET = "kubernetes.io~secret"
PROJECTED = "kubernetes.io~projected"

_MISSING_KEY = {"ConfigMap": "configmap references non-existent config key: {}",
                "Secret": "references non-existent secret key: {}"}


class VolumeError(Exception):
    """The volume cannot be set up now (FailedMount); setup is retried."""


def plugin_dir(volume: Volume) -> str | None:
    """The kubelet's volume plugin directory for the sources this stage sets up."""
    if volume.config_map is not None:
        return CONFIG_MAP
    if volume.secret is not None:
        return SECRET
    if volume.projected is not None:
        return PROJECTED
    return None


def in_memory(volume: Volume) -> bool:
    """Secrets and tokens never touch the node's disk: the kubelet puts secret and projected
    volumes on a tmpfs (an emptyDir of medium Memory)."""
    return volume.secret is not None or volume.projected is not None


def _keys(kind: Kind, obj: ObjectData | None, items: Sequence[KeyToPath], default_mode: int,
          optional: bool) -> Payload:
    """MakePayload: every key under its own name, or only the listed items under their paths."""
    payload: Payload = {}
    if obj is None:
        return payload  # optional and missing: an empty volume
    if not items:
        for key in obj.file_keys():
            content = obj.file_content(key)
            assert content is not None
            payload[key] = (content, default_mode)
        return payload
    for item in items:
        content = obj.file_content(item.key)
        if content is None:
            if optional:
                continue
            raise VolumeError(_MISSING_KEY[kind].format(item.key))
        payload[item.path] = (content, item.mode if item.mode is not None else default_mode)
    return payload


async def _object(reader: ObjectReader, kind: Kind, name: str, optional: bool) -> ObjectData | None:
    try:
        return await reader.get(kind, name)
    except ObjectUnavailable as exc:
        if exc.not_found and optional:
            return None
        raise VolumeError(str(exc)) from None


async def volume_payload(volume: Volume, pod: Pod, reader: ObjectReader, token: TokenSource,
                         facts: PodFacts) -> Payload:
    if volume.config_map is not None:
        cm = volume.config_map
        obj = await _object(reader, "ConfigMap", cm.name, cm.optional)
        return _keys("ConfigMap", obj, cm.items, cm.default_mode, cm.optional)
    if volume.secret is not None:
        sec = volume.secret
        obj = await _object(reader, "Secret", sec.secret_name, sec.optional)
        return _keys("Secret", obj, sec.items, sec.default_mode, sec.optional)
    if volume.projected is not None:
        return await _projected(volume.projected, pod, reader, token, facts)
    raise VolumeError(f"volume {volume.name!r} is not a configMap, secret or projected volume")


async def _projected(source: ProjectedVolumeSource, pod: Pod, reader: ObjectReader, token: TokenSource,
                     facts: PodFacts) -> Payload:
    """collectData: the sources in order (a later one wins a path); every failing source is
    reported, as the kubelet's aggregate error does."""
    payload: Payload = {}
    errors: list[str] = []
    mode = source.default_mode
    for projection in source.sources:
        try:
            if projection.config_map is not None:
                cm = projection.config_map
                obj = await _object(reader, "ConfigMap", cm.name, cm.optional)
                payload.update(_keys("ConfigMap", obj, cm.items, mode, cm.optional))
            elif projection.secret is not None:
                sec = projection.secret
                obj = await _object(reader, "Secret", sec.name, sec.optional)
                payload.update(_keys("Secret", obj, sec.items, mode, sec.optional))
            elif projection.downward_api is not None:
                downward = DownwardAPIVolumeSource(items=projection.downward_api.items, default_mode=mode)
                for path, (text, file_mode) in downward_payload(downward, pod, facts).items():
                    payload[path] = (text.encode(), file_mode)
            elif projection.service_account_token is not None:
                sat = projection.service_account_token
                value = await token(sat.audience, sat.expiration_seconds)
                # With an fsGroup the kubelet writes the token 0600 and lets ownership open it
                # to the group (0640): the pod's users read it, others on the node do not.
                payload[sat.path] = (value.encode(), 0o600 if fs_group_of(pod) is not None else mode)
        except (VolumeError, TokenUnavailable, FieldError) as exc:
            errors.append(str(exc))
    if errors:
        raise VolumeError(errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")
    return payload
