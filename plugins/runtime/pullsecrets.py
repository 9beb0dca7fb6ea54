"""A pod's image pull secrets (``spec.imagePullSecrets``), read from the API when a pull needs them.

Each secret is read with the node's credentials through plugins/apivolumes' reader (the Node
authorizer lets a node read the secrets its pods name, imagePullSecrets among them). As with the
kubelet, a secret that cannot be read is not an error: it is logged and the pull goes on
without it ("the image pull may not succeed"); if the pull then fails, the pod gets the
kubelet's FailedToRetrieveImagePullSecret warning (:class:`PullSecretsUnavailable`). A secret
whose docker config cannot be parsed fails the pull, as it fails the kubelet's keyring.

Static pods: in cluster mode they are read like any pod, and the read is refused (a mirror pod
may not name secrets, so the Node authorizer grants none), which is what happens to the kubelet:
a warning, then an anonymous pull. Standalone there is no API to read from; the kubelet cannot
read them either (it has no secret manager without a client), so the field is reported as
unhonoured (plugins/apivolumes/references.py lists it with the other fields that need the API).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nodeagent.kube.configdata import ObjectReader, ObjectUnavailable
from nodeagent.stages import PodContext
from plugins.runtime.keyring import Keyring, KeyringError, auths_of


@dataclass
class PullCredentials:
    keyring: Keyring = field(default_factory=Keyring)
    missing: list[str] = field(default_factory=list)
    """Names of the secrets that could not be read."""
    error: KeyringError | None = None
    """A secret's docker config is malformed: no pull is attempted."""


def missing_message(missing: list[str]) -> str:
    """The kubelet's FailedToRetrieveImagePullSecret event message."""
    return (f"Unable to retrieve some image pull secrets ({', '.join(missing)}); "
            "attempting to pull the image may not succeed.")


class PullSecrets:
    """One prepare pass's view of the pod's pull secrets: read at most once, and only when an
    image is actually pulled (an image present under IfNotPresent needs none)."""

    def __init__(self, ctx: PodContext) -> None:
        self._ctx = ctx
        self._read: PullCredentials | None = None

    async def get(self) -> PullCredentials:
        if self._read is None:
            self._read = await self._fetch()
        return self._read

    async def _fetch(self) -> PullCredentials:
        ctx = self._ctx
        names = [ref.name for ref in ctx.pod.spec.image_pull_secrets if ref.name]  # empty names: ignored
        found = PullCredentials()
        if not names or not ctx.objects.cluster:
            return found
        namespace = ctx.pod.metadata.namespace
        reader = ObjectReader(ctx.objects, namespace)
        for name in names:
            try:
                secret = await reader.get("Secret", name)
            except ObjectUnavailable as exc:
                ctx.log.warning("Unable to retrieve pull secret, the image pull may not succeed.",
                                secret=f"{namespace}/{name}", error=str(exc))
                found.missing.append(name)
                continue
            try:
                auths = auths_of(secret.type, secret.binary, name)
            except KeyringError as exc:
                found.error = exc
                return found
            if auths is not None:
                found.keyring.add({registry: replace(c, namespace=namespace, uid=secret.uid)
                                   for registry, c in auths.items()})
        return found
