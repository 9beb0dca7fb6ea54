"""Who is asking: the kubelet API's authenticator chain (the kubelet's BuildAuthn and the
API server's delegating authenticator).

In order, the first that recognises the request wins:

1. **x509** (``authentication.x509.clientCAFile``): the TLS client certificate. The handshake
   already verified it against the CA (a certificate the CA did not sign never gets a
   request in; the kubelet answers it 401, we refuse the handshake). User = the subject's CN,
   groups = its O values.
2. **Bearer token** (``authentication.webhook.enabled``): ``Authorization: Bearer <token>``,
   then a websocket's ``Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.<token>``
   (browsers cannot set headers on a websocket). Checked with an authentication.k8s.io/v1
   TokenReview through the node's API client, cached for ``cacheTTL``. A token that does not
   check out is an error (401), never "anonymous".
3. Whoever was recognised gets the group ``system:authenticated``.
4. **Anonymous** (``authentication.anonymous.enabled``), only when no authenticator had an
   opinion and none failed: ``system:anonymous`` / ``system:unauthenticated``.

Nothing recognised and no anonymous: 401 ``Unauthorized``. With no authenticator configured
at all the server refuses to start (``no authentication method configured``), as the kubelet
does, rather than serve everyone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.resources.authentication_v1 import TokenReview

from nodeagent.config import AgentConfig, ConfigError
from nodeagent.kubeletserver.review import ReviewCache, with_retry
from nodeagent.kubeletserver.wire import BEARER_PROTOCOL_PREFIX, Request

AUTHENTICATED = "system:authenticated"
ANONYMOUS_USER = "system:anonymous"
UNAUTHENTICATED = "system:unauthenticated"
CLIENT_CA_FILE = "client-ca.crt"
"""Under ``rootDir/pki``: the cluster CA when the kubeconfig embeds it."""


@dataclass(frozen=True)
class UserInfo:
    """user.Info: what authorization and the request log see."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Sorted (key, values) pairs: hashable, so an identity can be part of a cache key."""

    def extra_map(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.extra}


ANONYMOUS = UserInfo(ANONYMOUS_USER, groups=(UNAUTHENTICATED,))


class AuthenticationError(Exception):
    """The request presented credentials that do not check out (401, not anonymous)."""


class Authenticator(Protocol):
    async def authenticate(self, request: Request, peer: Mapping[str, Any] | None) -> UserInfo | None:
        """The identity, None for "no opinion" (no credentials of this kind), or raise
        AuthenticationError for credentials that are wrong."""
        ...


# --- x509 ---------------------------------------------------------------------------------


def certificate_user(peer: Mapping[str, Any]) -> UserInfo:
    """CommonNameUserConversion: CN is the user (the last CN, as Go's pkix.Name keeps it), the
    O values are the groups, in order."""
    cn, orgs = "", []
    for rdn in peer.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                cn = value
            elif key == "organizationName":
                orgs.append(value)
    return UserInfo(cn, groups=tuple(orgs))


class X509Authenticator:
    async def authenticate(self, request: Request, peer: Mapping[str, Any] | None) -> UserInfo | None:
        # A presented certificate was verified by the handshake; an empty one is none at all.
        if not peer:
            return None
        user = certificate_user(peer)
        if not user.name:
            raise AuthenticationError("the client certificate has no common name")
        return user


# --- bearer tokens ------------------------------------------------------------------------


def bearer_token(request: Request) -> str | None:
    """bearertoken.Authenticator: ``Authorization: Bearer <token>`` (scheme case-insensitive);
    anything else, or an empty token, is no opinion."""
    value = (request.header("Authorization") or "").strip()
    parts = value.split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


def websocket_token(request: Request) -> str | None:
    """websocket.ProtocolAuthenticator: the token in a websocket request's subprotocols."""
    if not request.is_websocket:
        return None
    token, others = None, 0
    for name, value in request.headers:
        if name.lower() != "sec-websocket-protocol":
            continue
        for protocol in (p.strip() for p in value.split(",")):
            if not protocol.startswith(BEARER_PROTOCOL_PREFIX):
                others += protocol != ""
                continue
            if token is not None:
                raise AuthenticationError("multiple base64.bearer.authorization tokens specified")
            encoded = protocol[len(BEARER_PROTOCOL_PREFIX):]
            try:
                if "=" in encoded:  # RawURLEncoding: no padding
                    raise ValueError
                raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            except (ValueError, binascii.Error):
                raise AuthenticationError("invalid base64.bearer.authorization token encoding") from None
            try:
                token = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise AuthenticationError("invalid base64.bearer.authorization token") from None
    if token and not others:
        # The bearer protocol is removed before the request goes on; one must be left to agree on.
        raise AuthenticationError("missing additional subprotocol")
    return token or None


@dataclass(frozen=True)
class Rejected:
    """A TokenReview's answer that the token does not authenticate (its status.error, if any)."""

    error: str = ""


class TokenReviewer:
    """TokenReview through the node's API client, cached for ``ttl``: an authenticated answer
    and a rejection alike. A review that got no answer (transport error, timeout, 5xx after
    the retries) is not cached.

    The kubelet's cache keeps a rejection only when it came without ``status.error``; the API
    server puts one on every rejection it makes ("invalid bearer token"), so there the
    kubelet asks again for every request with a bad token. We keep the API server's answer
    either way: a flood of bad tokens costs one review per token per ``cacheTTL``."""

    def __init__(self, api: Any, ttl: float, cache: ReviewCache[bytes, UserInfo | Rejected] | None = None) -> None:
        self._api = api
        self._ttl = ttl
        self.cache: ReviewCache[bytes, UserInfo | Rejected] = cache or ReviewCache()
        self.sent = 0
        """TokenReviews posted (every attempt), for the server's metrics."""

    async def review(self, token: str) -> UserInfo:
        """The token's user; AuthenticationError if it does not authenticate or cannot be reviewed."""
        # Keyed by a hash, as the kubelet's cache: no token is kept in memory by the cache.
        key = hashlib.sha256(token.encode()).digest()
        answer = await self.cache.get(key, lambda: self._fetch(token))
        if isinstance(answer, Rejected):
            raise AuthenticationError(answer.error or "invalid bearer token")
        return answer

    async def _fetch(self, token: str) -> tuple[UserInfo | Rejected, float]:
        async def post() -> Any:
            self.sent += 1
            return await self._api.create(TokenReview(spec=TokenReviewSpec(token=token)))

        try:
            review = await with_retry(post)
        except Exception as exc:
            raise AuthenticationError(f"TokenReview failed: {exc}") from exc
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return Rejected((status.error or "") if status is not None else ""), self._ttl
        user = status.user
        extra = tuple(sorted((k, tuple(v)) for k, v in (user.extra or {}).items()))
        return UserInfo(user.username or "", user.uid or "", tuple(user.groups or ()), extra), self._ttl


class TokenAuthenticator:
    """One place a token can come from (``extract``), checked by the shared reviewer: the
    chain has one for the bearer header and one for the websocket protocol, in that order."""

    def __init__(self, reviewer: TokenReviewer, extract: Callable[[Request], str | None]) -> None:
        self.reviewer = reviewer
        self._extract = extract

    async def authenticate(self, request: Request, peer: Mapping[str, Any] | None) -> UserInfo | None:
        token = self._extract(request)
        if token is None:
            return None
        return await self.reviewer.review(token)


# --- the chain ----------------------------------------------------------------------------


@dataclass
class Chain:
    authenticators: Sequence[Authenticator]
    anonymous: bool = False
    names: tuple[str, ...] = field(default=())
    """What is configured, for the start-up log line."""

    async def authenticate(self, request: Request, peer: Mapping[str, Any] | None) -> UserInfo | None:
        """The caller, or None (401). Raises AuthenticationError (401) when credentials were
        presented and none checked out."""
        errors: list[str] = []
        for authenticator in self.authenticators:
            try:
                user = await authenticator.authenticate(request, peer)
            except AuthenticationError as exc:
                errors.append(str(exc))
                continue
            if user is not None:
                return _with_authenticated(user)
        if errors:
            raise AuthenticationError("; ".join(errors))
        return ANONYMOUS if self.anonymous else None


def _with_authenticated(user: UserInfo) -> UserInfo:
    """AuthenticatedGroupAdder: system:authenticated once, unless the user is anonymous."""
    if AUTHENTICATED in user.groups or user.name == ANONYMOUS_USER or UNAUTHENTICATED in user.groups:
        return user
    return UserInfo(user.name, user.uid, (*user.groups, AUTHENTICATED), user.extra)


# --- configuration ------------------------------------------------------------------------


def webhook_enabled(config: AgentConfig) -> bool:
    enabled = config.authentication.webhook.enabled
    return enabled if enabled is not None else config.kubeconfig is not None


@dataclass(frozen=True)
class ClientCA:
    """Where the client CA comes from: a file, or PEM data to write under rootDir."""

    path: Path
    data: bytes | None = None
    """PEM to write to ``path`` at start (a kubeconfig's certificate-authority-data)."""


def client_ca(config: AgentConfig) -> ClientCA | None:
    """``clientCAFile``, or in cluster mode the cluster CA of the node's kubeconfig."""
    if config.authentication.x509.client_ca_file is not None:
        return ClientCA(config.authentication.x509.client_ca_file)
    if config.kubeconfig is None:
        return None
    from lightkube import KubeConfig
    from lightkube.core.exceptions import ConfigError as KubeConfigError

    try:
        single = KubeConfig.from_file(str(config.kubeconfig)).get()
    except (KubeConfigError, OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the cluster CA from kubeconfig {config.kubeconfig}: {exc}") from exc
    assert single is not None
    cluster = single.cluster
    if cluster.certificate_auth_data:
        try:
            data = base64.b64decode(cluster.certificate_auth_data, validate=True)
        except (ValueError, binascii.Error) as exc:
            raise ConfigError(f"kubeconfig {config.kubeconfig}: certificate-authority-data is not base64") from exc
        return ClientCA(config.root_dir / "pki" / CLIENT_CA_FILE, data)
    if cluster.certificate_auth:
        return ClientCA(Path(single.abs_file(cluster.certificate_auth)))
    return None  # insecure-skip-tls-verify: there is no cluster CA to trust


def write_client_ca(ca: ClientCA) -> Path:
    """Write embedded CA data (private directory, atomic rename, only when it changed)."""
    if ca.data is not None:
        ca.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            same = ca.path.read_bytes() == ca.data
        except FileNotFoundError:
            same = False
        if not same:
            tmp = ca.path.with_name(ca.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(ca.data)
            os.replace(tmp, ca.path)
    return ca.path


def build(config: AgentConfig, api: Any, ca: ClientCA | None) -> Chain:
    """The chain the configuration asks for; ConfigError with the kubelet's message if it
    cannot be built."""
    authenticators: list[Authenticator] = []
    names: list[str] = []
    if ca is not None:
        authenticators.append(X509Authenticator())
        names.append("x509")
    if webhook_enabled(config):
        if api is None:
            raise ConfigError("no client provided, cannot use webhook authentication")
        reviewer = TokenReviewer(api, config.authentication.webhook.cache_ttl)
        authenticators += [TokenAuthenticator(reviewer, bearer_token), TokenAuthenticator(reviewer, websocket_token)]
        names.append("webhook")
    anonymous = config.authentication.anonymous.enabled
    if anonymous:
        names.append("anonymous")
    if not names:
        raise ConfigError("no authentication method configured (kubelet API: set authentication.x509.clientCAFile, "
                          "or authentication.anonymous.enabled to serve every client)")
    return Chain(authenticators, anonymous=anonymous, names=tuple(names))


def token_reviewer(chain: Chain) -> TokenReviewer | None:
    return next((a.reviewer for a in chain.authenticators if isinstance(a, TokenAuthenticator)), None)


__all__ = ["ANONYMOUS", "AuthenticationError", "Chain", "ClientCA", "TokenReviewer", "UserInfo", "bearer_token",
           "build", "certificate_user", "client_ca", "webhook_enabled", "websocket_token", "write_client_ca"]
