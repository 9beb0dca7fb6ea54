"""Service-account tokens for projected volumes: TokenRequest bound to the pod, cached per
pod and refreshed the way the kubelet's token manager does (pkg/kubelet/token).

A token is refreshed once 80% of its lifetime has passed, or when it is older than 24 hours;
a failed refresh keeps serving the cached token until it expires.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodeagent.model import Pod
from nodeagent.objects import ObjectError, kinds
from nodeagent.stash import StashKey
from nodeagent.status import parse_rfc3339

REFRESH_FRACTION = 0.8
"""The kubelet refreshes within the last 20% of a token's lifetime."""
MAX_TOKEN_AGE_SECONDS = 24 * 3600.0

TokenKey = tuple[str, int]
"""(audience, expirationSeconds): projections that ask the same share one token, as they share
one entry in the kubelet's cache."""


@dataclass(frozen=True)
class Token:
    value: str
    expires_at: float
    """status.expirationTimestamp, seconds since the epoch."""
    lifetime: int
    """spec.expirationSeconds as the API server granted it."""

    @property
    def issued_at(self) -> float:
        # The kubelet derives iat from exp and the granted lifetime too (requiresRefresh).
        return self.expires_at - self.lifetime

    def refresh_at(self, fraction: float = REFRESH_FRACTION) -> float:
        return min(self.issued_at + fraction * self.lifetime, self.issued_at + MAX_TOKEN_AGE_SECONDS)


TOKENS = StashKey[dict[TokenKey, Token]]("apivolumes.tokens")


class TokenUnavailable(Exception):
    pass


async def request_token(objects: Any, pod: Pod, audience: str, expiration_seconds: int) -> Token:
    """TokenRequest for the pod's service account, bound to the pod (the NodeRestriction
    admission plugin refuses a node's request for a token not bound to a pod on it)."""
    spec: dict[str, Any] = {
        "expirationSeconds": expiration_seconds,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.uid},
    }
    if audience:
        spec["audiences"] = [audience]  # none: the API server's own audiences
    account = pod.spec.service_account_name or "default"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    try:
        answer = await objects.create(kinds.SERVICE_ACCOUNT, body, pod.metadata.namespace, name=account,
                                      subresource="token")
    except ObjectError as exc:
        raise TokenUnavailable(exc.detail) from None
    except Exception as exc:  # noqa: BLE001 — anything else: the cached token serves meanwhile
        raise TokenUnavailable(f"cannot request a token for service account "
                               f"{pod.metadata.namespace}/{account}: {exc!r}") from None
    status = answer.get("status") or {}
    expires = parse_rfc3339(status.get("expirationTimestamp"))
    if not status.get("token") or expires is None:
        raise TokenUnavailable(f"the API server's TokenRequest answer for {pod.metadata.namespace}/{account} "
                               "has no token or expiration")
    granted = (answer.get("spec") or {}).get("expirationSeconds") or expiration_seconds
    return Token(value=str(status["token"]), expires_at=expires, lifetime=int(granted))
