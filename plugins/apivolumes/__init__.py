"""The apivolumes stage: what pods need from the API server.

prepare (after the volumes stage, before the runtime stage creates the sandbox) reads the
configMaps and secrets the pod refers to, requests its service-account tokens (TokenRequest,
bound to the pod), and

* writes configMap, secret and projected volumes (serviceAccountToken, configMap, secret,
  downwardAPI sources: the default ``kube-api-access-*`` volume is one) under
  ``<rootDir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`` with plugins/volumes' atomic
  writer (the kubelet's ``..data`` layout); secret and projected volumes on a tmpfs;
* contributes each container's volumeMounts of them (read-only, subPath) and the values its
  envFrom / configMapKeyRef / secretKeyRef take (:class:`nodeagent.additions.ApiEnv`, read by
  nodeagent/kube/env.py) through :mod:`nodeagent.additions`.

A required configMap or secret that is missing makes a volume fail (RETRY, ``FailedMount``,
the kubelet's ``MountVolume.SetUp failed for volume "v" : configmap "x" not found``); for env
it makes the container wait with ``CreateContainerConfigError`` once the sandbox runs, as with
the kubelet. observe re-reads everything every ``resyncSeconds`` (sooner while something is
missing) so that volumes follow their objects and containers that (re)start get current env,
and refreshes each token at 80% of its lifetime; a changed pod (labels, annotations) is
resolved at once, so that projected downwardAPI files follow it. With ``securityContext.fsGroup``
every volume is given to that group (:mod:`nodeagent.volumeutil.ownership`). unprepare unmounts and
removes the volumes.

Standalone (no API client) the stage does nothing and reports these fields as unhonoured.
Configuration (section ``apivolumes``): ``resyncSeconds`` (60), ``tokenRefreshFraction`` (0.8).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import anyio
from pydantic import Field

from cri import types as t
from nodeagent import events as ev
from nodeagent import hostpaths
from nodeagent.additions import CONTAINER_ADDITIONS, ApiEnv, ContainerAdditions, VolumeBind, add_mounts
from nodeagent.kube.configdata import ObjectReader, ObjectUnavailable
from nodeagent.kube.env import FieldError, PodFacts, container_env
from nodeagent.model import EmptyDirVolumeSource, Volume, unhonoured_fields
from nodeagent.mounttable import is_mount_point
from nodeagent.objects import View, kinds
from nodeagent.pluginconfig import PluginConfig
from nodeagent.stages import AgentHandle, Observe, PodContext, Prepare, Result
from nodeagent.stash import StashKey
from nodeagent.unsupported import UNSUPPORTED_FIELD, UNSUPPORTED_VOLUME
from nodeagent.volumeutil import SetupError
from nodeagent.volumeutil.atomicwriter import DATA_DIR, write_atomically
from nodeagent.volumeutil.mounts import MountConfigError, PreparedVolume, container_mounts
from nodeagent.volumeutil.ownership import fs_group_of
from nodeagent.volumeutil.tmpfs import MountError, mount_tmpfs, remove_unmounted, tmpfs_size
from plugins.apivolumes.envsources import resolve_env, uses_api
from plugins.apivolumes.payload import (
    CONFIG_MAP,
    PROJECTED,
    SECRET,
    Payload,
    VolumeError,
    in_memory,
    plugin_dir,
    volume_payload,
)
from plugins.apivolumes.references import api_fields, api_volumes, needs_api
from plugins.apivolumes.services import ServicesUnavailable, service_env
from plugins.apivolumes.tokens import (
    REFRESH_FRACTION,
    TOKENS,
    Token,
    TokenUnavailable,
    request_token,
)

FAILED_MOUNT = "FailedMount"
CONFIG_ERROR = "CreateContainerConfigError"
UNHONOURED_CONDITION = "nodeagent.io/UnhonouredFields"  # the worker's condition, completed here
FIRST_RETRY_SECONDS = 2.0
"""observe re-reads this soon after a failed pass (doubling up to resyncSeconds): a pod waiting
for a configMap starts soon after it is created."""

"""Container name → the mounts this stage added, so that a later pass replaces them."""
"""Containers whose ApiEnv this stage set."""
REPORTED = StashKey[bool]("apivolumes.reported")
"""Standalone: the unhonoured fields were reported (once per pod, not once per prepare)."""


class Settings(PluginConfig):
    resync_seconds: float | None = Field(default=None, gt=0)
    """How often objects are re-read; default the kubelet's syncFrequency (1m0s)."""
    token_refresh_fraction: float = Field(default=REFRESH_FRACTION, gt=0, lt=1)
    """A projected service account token is requested again after this fraction of its lifetime."""


@dataclass
class Pass:
    """What one resolution pass found."""

    volume_errors: dict[str, str] = field(default_factory=dict)
    """Volume name → why it could not be (re)written (the kubelet's message)."""
    env: dict[str, ApiEnv] = field(default_factory=dict)
    mounts: dict[str, list[t.Mount | VolumeBind]] = field(default_factory=dict)
    mount_error: tuple[str, str] | None = None
    """(container, message) when a container's mounts cannot be made."""
    token_errors: list[str] = field(default_factory=list)
    """Refreshes that failed while a cached token still serves."""
    unreadable: list[str] = field(default_factory=list)
    """Objects env needs that could not be read (forbidden, API server down)."""

    @property
    def complete(self) -> bool:
        return not (self.volume_errors or self.mount_error or self.token_errors or self.unreadable
                    or any(e.error for e in self.env.values()))


class ApiVolumesStage(Prepare, Observe):
    name: ClassVar[str] = "apivolumes"
    provides = (CONTAINER_ADDITIONS,)

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._resync = settings.resync_seconds or 60.0
        self._services: View | None = None
        """Every namespace's services (the kubelet's service informer), asked for at first use."""

    def describe(self) -> dict[str, Any]:
        return self.settings.model_dump(by_alias=True)

    # --- prepare ---------------------------------------------------------------------------

    async def prepare(self, ctx: PodContext) -> Result:
        if not ctx.objects.cluster:
            refused = _standalone_refusal(ctx.pod)
            if refused is not None:
                return refused  # refuse, never ignore: the pod would run without its volume or env
            await self._report_unhonoured(ctx)
            return Result.skip()
        # Every API pod: at least its containers' service variables come from the API.
        found = await self._resolve(ctx)
        if found.volume_errors:
            name, message = next(iter(found.volume_errors.items()))
            ctx.log.warning("volume setup failed", volume=name, error=message)
            return Result.retry(FAILED_MOUNT, f'MountVolume.SetUp failed for volume "{name}" : {message}')
        if found.mount_error is not None:
            container, message = found.mount_error
            ctx.status.container_waiting(container, CONFIG_ERROR, message)
            return Result.retry(CONFIG_ERROR, f"container {container}: {message}")
        self._contribute(ctx, found)
        # A missing env object is not a prepare failure: the sandbox runs and the container
        # waits with CreateContainerConfigError (the runtime stage reports it), as with the
        # kubelet; observe keeps reading until the object appears.
        for container, api_env in found.env.items():
            if api_env.error:
                ctx.log.info("container env waits for the API", container=container, error=api_env.error)
        return Result.ok()

    async def _report_unhonoured(self, ctx: PodContext) -> None:
        """Standalone: these fields cannot be honoured. The worker's condition lists only the
        fields the model does not know; it is completed with ours."""
        ours = api_fields(ctx.pod)
        if not ours or ctx.stash.get(REPORTED):
            return
        ctx.stash[REPORTED] = True
        ctx.log.warning("no API server: configMap/secret/projected volumes and env are not honoured", fields=ours)
        await ctx.publish(ev.UnhonouredFieldsFound(fields=ours))
        every = sorted({*unhonoured_fields(ctx.pod), *ours})
        ctx.status.set_condition(UNHONOURED_CONDITION, True, "FieldsNotHonoured",
                                 "nodeagent does not act on: " + ", ".join(every))

    # --- one pass: read, write, resolve ----------------------------------------------------

    async def _resolve(self, ctx: PodContext) -> Pass:
        pod = ctx.pod
        namespace = pod.metadata.namespace
        reader = ObjectReader(ctx.objects, namespace)
        facts = PodFacts(host_ips=(ctx.node.ip,) if ctx.node.ip else (), allocatable=dict(ctx.node.allocatable))
        found = Pass()
        tokens = ctx.stash.setdefault(TOKENS, {})

        async def token(audience: str, seconds: int) -> str:
            key = (audience, seconds)
            cached = tokens.get(key)
            now = ctx.clock.now()
            if cached is not None and now < cached.refresh_at(self.settings.token_refresh_fraction):
                return cached.value
            try:
                fresh = await request_token(ctx.objects, pod, audience, seconds)
            except TokenUnavailable as exc:
                if cached is not None and now < cached.expires_at:
                    # The kubelet's token manager too serves the cached token until it expires.
                    ctx.log.warning("token refresh failed; the cached token still serves", error=str(exc))
                    found.token_errors.append(str(exc))
                    return cached.value
                raise
            tokens[key] = fresh
            return fresh.value

        prepared: dict[str, PreparedVolume | None] = {v.name: None for v in pod.spec.volumes}
        for volume in api_volumes(pod):
            plugin = plugin_dir(volume)
            assert plugin is not None
            path = hostpaths.volume_dir(ctx.pod_dir, plugin, volume.name)
            try:
                payload = await volume_payload(volume, pod, reader, token, facts)
                await self._write(ctx, volume, path, payload)
            except (VolumeError, SetupError, MountError, OSError) as exc:
                found.volume_errors[volume.name] = str(exc)
            if (path / DATA_DIR).is_dir():
                # Written now or by an earlier pass: after a failed re-read the old content
                # stays mounted, as the kubelet keeps it.
                prepared[volume.name] = PreparedVolume(path, read_only=True)  # always read-only (kubelet)

        def given(container: str) -> ApiEnv | None:
            entry = ctx.additions.get(container)
            return entry.api_env if entry is not None else None

        links = pod.spec.enable_service_links is not False
        try:
            if self._services is None:
                self._services = ctx.objects.view(kinds.SERVICE)
            services = await service_env(self._services, namespace, links)
        except ServicesUnavailable as exc:
            found.unreadable.append(str(exc))
            services = next((env.services for c in pod.all_containers() if (env := given(c.name)) is not None), {})
        for container in pod.all_containers():
            if not uses_api(container):
                found.env[container.name] = ApiEnv(services=services)
                continue
            try:
                found.env[container.name] = replace(await resolve_env(container, reader, namespace),
                                                    services=services)
            except ObjectUnavailable as exc:
                # Unreadable is not missing: a container that restarts while the API server is
                # away keeps the env read before (the kubelet's caches serve it likewise).
                found.unreadable.append(str(exc))
                before = given(container.name)
                found.env[container.name] = before if before is not None and not before.error \
                    else ApiEnv(error=str(exc))

        mine = {v.name for v in api_volumes(pod)}
        for container in pod.all_containers():
            own = [m for m in container.volume_mounts if m.name in mine]
            if not own:
                continue
            try:
                env: Mapping[str, str] = {}
                if any(m.sub_path_expr for m in own):
                    env = container_env(pod, container, facts, found.env.get(container.name))
                # The whole container: the other volumes map to None (not ours, skipped), and
                # each subPath keeps its index among the container's volumeMounts.
                found.mounts[container.name] = container_mounts(container, prepared, env)
            except (MountConfigError, FieldError, OSError) as exc:
                found.mount_error = (container.name, str(exc))
                break
        return found

    async def _write(self, ctx: PodContext, volume: Volume, path: Path, payload: Payload) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if in_memory(volume) and not is_mount_point(path):
            size = tmpfs_size(EmptyDirVolumeSource(medium="Memory"), ctx.pod,
                                      ctx.node.allocatable.get("memory", 0))
            # Not the tmpfs default 1777: nobody but the agent writes into a secret volume.
            await mount_tmpfs(path, size, mode=0o755)
        # fsGroup: the writer gives each new payload to the group before it becomes visible.
        if await anyio.to_thread.run_sync(write_atomically, path, payload, fs_group_of(ctx.pod)):
            ctx.log.debug("volume written", volume=volume.name, files=sorted(payload))

    # --- contributions -------------------------------------------------------------------

    def _contribute(self, ctx: PodContext, found: Pass) -> None:
        """Replace what an earlier pass contributed (a retry, a resync, an agent restart)."""
        ctx.additions.withdraw()
        for container in {*found.mounts, *found.env}:
            entry = ContainerAdditions(api_env=found.env.get(container))
            add_mounts(entry, found.mounts.get(container, []))
            ctx.additions.set(container, entry)

    # --- observe: resync and token refresh -------------------------------------------------

    async def observe(self, ctx: PodContext) -> None:
        if not ctx.objects.cluster or not needs_api(ctx.pod):
            return
        retry = FIRST_RETRY_SECONDS
        complete = True
        seen = ctx.pod
        while True:
            now = ctx.clock.now()
            if complete:
                wake = min([now + self._resync,
                            *(tok.refresh_at(self.settings.token_refresh_fraction)
                              for tok in ctx.stash.get(TOKENS, {}).values())])
            else:
                wake = now + retry
                retry = min(retry * 2, self._resync)
            # A changed pod (labels, annotations) is resolved at once: projected downwardAPI
            # files follow it as the kubelet's pod sync makes them.
            await ctx.pod_changed(seen, max(wake - now, 0.0))
            seen = ctx.pod
            found = await self._resolve(ctx)
            if found.mount_error is None:
                self._contribute(ctx, found)
            complete = found.complete
            if complete:
                retry = FIRST_RETRY_SECONDS
            else:
                ctx.log.info("resync incomplete; retrying", volumes=found.volume_errors,
                             env={c: e.error for c, e in found.env.items() if e.error},
                             mounts=found.mount_error, tokens=found.token_errors, unreadable=found.unreadable)

    # --- unprepare -----------------------------------------------------------------------

    async def unprepare(self, ctx: PodContext) -> None:
        # Found on disk and in the mount table, not remembered: this may be a restarted agent.
        for plugin in (CONFIG_MAP, SECRET, PROJECTED):
            left = await remove_unmounted(ctx.pod_dir / hostpaths.VOLUMES / plugin)
            if left:
                ctx.log.warning("volumes still mounted; directories kept", mounts=[str(p) for p in left])
        ctx.additions.withdraw()
        ctx.stash.pop(TOKENS)


def _standalone_refusal(pod: Any) -> Result | None:
    """Without an API server there is nothing to fill a configMap, secret or projected volume
    (or env) with: the pod is refused rather than run without them. imagePullSecrets only
    change how an image is pulled, and a pull that needs them fails on its own."""
    for volume in api_volumes(pod):
        source = next(k for k, v in (("configMap", volume.config_map), ("secret", volume.secret),
                                     ("projected", volume.projected)) if v is not None)
        return Result.reject(UNSUPPORTED_VOLUME, f'volume "{volume.name}" is a {source} volume, which needs the API '
                                                 "server, and this node runs standalone: the pod would run without it")
    for container in pod.all_containers():
        if uses_api(container):
            return Result.reject(UNSUPPORTED_FIELD, f"container {container.name!r} takes env from configMaps or "
                                                    "secrets, which need the API server, and this node runs "
                                                    "standalone: it would run without them")
    return None


def plugin(config: Settings, handle: AgentHandle) -> ApiVolumesStage:
    if config.resync_seconds is None:  # the kubelet's pod sync period
        config = config.model_copy(update={"resync_seconds": handle.settings.sync_frequency or 60.0})
    return ApiVolumesStage(config)


plugin.stage_class = ApiVolumesStage  # type: ignore[attr-defined]
plugin.config_model = Settings  # type: ignore[attr-defined]
__all__ = ["ApiVolumesStage", "Settings", "Token", "api_fields", "plugin"]
