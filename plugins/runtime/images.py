"""Ensure a container's image (or an image volume's) per its pull policy, with the kubelet's pull back-off.

Reasons shown to users are the kubelet's: ErrImagePull after a failed pull, ImagePullBackOff
while waiting to try again, ErrImageNeverPull for policy Never and an absent image.

Pulls use the pod's imagePullSecrets (plugins/runtime/pullsecrets.py), then the node's docker
config (plugins/runtime/nodekeyring.py), as the kubelet does: the credentials whose registry
matches the image are tried in turn until one pull succeeds (the error of a failed image says
what each attempt answered); with none matching, the pull is anonymous. An anonymous attempt
never follows failed credentials.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cri import CriError
from cri import types as t
from nodeagent.events import ImagePulled
from nodeagent.model import Container
from nodeagent.stages import PodContext, Result
from plugins.runtime import seen
from plugins.runtime.backoff import Backoff
from plugins.runtime.events import PullSecretsUnavailable
from plugins.runtime.keyring import Credential, Keyring
from plugins.runtime.nodekeyring import NodeKeyring
from plugins.runtime.pullrecords import PullRecords
from plugins.runtime.pullsecrets import PullCredentials, PullSecrets, missing_message

IMAGE_BACKOFF_INITIAL = 10.0  # the kubelet's imageBackOffPeriod
IMAGE_BACKOFF_MAX = 300.0  # MaxImageBackOff


@dataclass
class ImagePuller:
    backoff: Backoff
    _last_failure: dict[str, float]
    node_keyring: NodeKeyring | None = None
    records: PullRecords | None = None
    """Which credentials pulled each image (plugins/runtime/pullrecords.py); None: never verified."""
    _last_error: dict[str, str] = field(default_factory=dict)
    """Pod UID + image → the failed pull's reason and message, which the back-off message
    carries (the kubelet's prevPullErrMsg: the pod shows why it backs off, not only that it does)."""

    @classmethod
    def new(cls, node_keyring: NodeKeyring | None = None, records: PullRecords | None = None) -> ImagePuller:
        return cls(Backoff(IMAGE_BACKOFF_INITIAL, IMAGE_BACKOFF_MAX), {}, node_keyring, records)

    async def ensure(self, ctx: PodContext, container: Container,
                     secrets: PullSecrets | None = None) -> tuple[str, Result | None]:
        """Returns the image reference to run, or a RETRY result that says why not. ``secrets``
        gives the pod's pull credentials (read once per pass, when a pull needs them)."""
        return await self.ensure_image(ctx, container.image, container.pull_policy, (container.name,), secrets)

    async def ensure_image(self, ctx: PodContext, image: str, policy: str, containers: Sequence[str],
                           secrets: PullSecrets | None = None) -> tuple[str, Result | None]:
        """:meth:`ensure` for any image the pod needs (a container's, an image volume's: the
        kubelet's EnsureImageExists serves both); what goes wrong is shown as the waiting
        reason of ``containers``, the ones that need the image."""
        secrets = secrets or PullSecrets(ctx)

        def waiting(reason: str, message: str) -> None:
            for name in containers:
                ctx.status.container_waiting(name, reason, message)

        present = await ctx.runtime.image_status(image)
        never_pull = f'Container image "{image}" is not present with pull policy of Never'
        if policy == "Never" and present is None:
            waiting("ErrImageNeverPull", never_pull)
            return "", Result.retry("ErrImageNeverPull", never_pull, retry_after=IMAGE_BACKOFF_INITIAL)
        if policy in ("Never", "IfNotPresent") and present is not None:
            if not await self._must_pull(image, present.id, secrets):
                seen.note_image(ctx, present)
                await ctx.publish(ImagePulled(image=image, image_ref=present.id, already_present=True))
                return present.id, None
            ctx.log.info("image present but pulled with credentials this pod lacks; pulling with the pod's",
                         image=image)
            if policy == "Never":  # the kubelet's answer: present, but not for this pod
                waiting("ErrImageNeverPull", never_pull)
                return "", Result.retry("ErrImageNeverPull", never_pull, retry_after=IMAGE_BACKOFF_INITIAL)

        key = f"{ctx.ref.uid}_{image}"
        now = ctx.clock.monotonic()
        wait = self.backoff.remaining(key, self._last_failure.get(key, now), now)
        if wait > 0:
            message = f'Back-off pulling image "{image}"'
            if key in self._last_error:
                message = f"{message}: {self._last_error[key]}"
            waiting("ImagePullBackOff", message)
            return "", Result.retry("ImagePullBackOff", message, retry_after=wait)
        self._last_error.pop(key, None)  # a new pull: its outcome is what counts now
        credentials = await secrets.get()
        node = await self.node_keyring.get() if self.node_keyring is not None else Keyring()
        try:
            ref, used = await self._recorded_pull(ctx, image, credentials, node)
        except PullFailed as exc:
            self._last_failure[key] = now
            self.backoff.next(key, now)
            message = f'Failed to pull image "{image}": {exc}'
            self._last_error[key] = f"ErrImagePull: {message}"
            waiting("ErrImagePull", message)
            ctx.log.warning("image pull failed", image=image, error=str(exc))
            if credentials.missing:
                # One event per failed pull (on the pod), whoever needed the image.
                await ctx.publish(PullSecretsUnavailable(container=containers[0] if containers else "",
                                                         secrets=credentials.missing,
                                                         message=missing_message(credentials.missing)))
            # Come back soon: the next call finds the image in back-off and says so.
            return "", Result.retry("ErrImagePull", message, retry_after=1.0)
        self.backoff.reset(key)
        await ctx.publish(ImagePulled(image=image, image_ref=ref, already_present=False))
        return ref, None

    def forget(self, uid: str) -> None:
        """The pod is gone: its pulls' back-off entries and last errors go with it (without
        this, every pod that ever failed a pull would stay here for the agent's lifetime)."""
        prefix = f"{uid}_"
        for key in [k for k in (*self._last_failure, *self._last_error) if k.startswith(prefix)]:
            self._last_failure.pop(key, None)
            self._last_error.pop(key, None)
            self.backoff.reset(key)

    async def _recorded_pull(self, ctx: PodContext, image: str, credentials: PullCredentials,
                             node: Keyring) -> tuple[str, Credential | None]:
        """``_pull``, between an intent and its outcome in the pull records (a pull cut short,
        by a failure or by the pod going away, ends as failed)."""
        if self.records is None:
            return await _pull(ctx, image, credentials, node)
        self.records.intend(image)
        outcome: tuple[str, Credential | None] | None = None
        try:
            outcome = await _pull(ctx, image, credentials, node)
            return outcome
        finally:
            if outcome is None:
                self.records.failed(image)
            else:
                self.records.pulled(image, *outcome)

    async def _must_pull(self, image: str, image_ref: str, secrets: PullSecrets) -> bool:
        if self.records is None:
            return False

        async def pod_credentials() -> list[Credential]:
            credentials = await secrets.get()
            return [] if credentials.error is not None else credentials.keyring.lookup(image)

        return await self.records.must_pull(image, image_ref, pod_credentials)


class PullFailed(Exception):
    """What the runtime answered (each attempt's answer, for several credentials)."""


async def _pull(ctx: PodContext, image: str, credentials: PullCredentials,
                node: Keyring) -> tuple[str, Credential | None]:
    """The image reference and the credential that pulled it (None: anonymously)."""
    if credentials.error is not None:
        raise PullFailed(str(credentials.error))
    # The kubelet's union keyring: the pod's secrets first, then the node's own.
    matching = credentials.keyring.lookup(image) + node.lookup(image)
    if not matching:
        try:
            return await ctx.runtime.pull_image(image), None
        except CriError as exc:
            raise PullFailed(exc.details or str(exc)) from None
    errors: list[str] = []
    for credential in matching:
        # Only the user and password go to the runtime (the kubelet's AuthConfig from a secret).
        auth = t.AuthConfig(username=credential.username, password=credential.password)
        try:
            return await ctx.runtime.pull_image(image, auth=auth), credential
        except CriError as exc:
            errors.append(exc.details or str(exc))
            ctx.log.info("image pull with a pull secret failed", image=image, secret=credential.secret)
    # Go's error aggregate: one error as it is, several as a list.
    raise PullFailed(errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")
