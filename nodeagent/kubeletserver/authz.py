"""What the caller may do: the kubelet API's authorization (the kubelet's
GetRequestAttributes, BuildAuthz and InstallAuthFilter).

A request becomes one or more attribute sets on the node's object — verb from the HTTP
method, resource ``nodes``, name = this node, a subresource from the path — tried in order;
the first one allowed wins. ``Webhook`` asks the API server with an authorization.k8s.io/v1
SubjectAccessReview per set (allow cached ``cacheAuthorizedTTL``, deny
``cacheUnauthorizedTTL``); ``AlwaysAllow`` allows every authenticated request.

Path → subresources (1.37, KubeletFineGrainedAuthz locked on): a fine-grained one first when
the path is /pods, /runningpods, /allocatedPods (``pods``), /healthz (``healthz``) or /configz
(``configz``), then always exactly one of /stats → ``stats``, /metrics → ``metrics``, /logs →
``log``, /checkpoint → ``checkpoint``, /statusz → ``statusz``, /flagz → ``configz``, anything
else → ``proxy``. So /containerLogs, /exec, /attach and /portForward need ``nodes/proxy``, and
``get nodes/proxy`` is not read-only: a websocket exec is a GET.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SubjectAccessReview

from nodeagent.config import AgentConfig, ConfigError
from nodeagent.kubeletserver.authn import UserInfo
from nodeagent.kubeletserver.review import ReviewCache, with_retry

VERBS = {"POST": "create", "GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}

# (registered path, subresource): isSubpath matches the path itself or anything below it.
FINE_GRAINED = (("/allocatedPods", "pods"), ("/pods", "pods"), ("/healthz", "healthz"), ("/configz", "configz"),
                ("/runningpods/", "pods"))
COARSE = (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"), ("/checkpoint", "checkpoint"),
          ("/statusz", "statusz"), ("/flagz", "configz"))
DEFAULT_SUBRESOURCE = "proxy"


def verb(method: str) -> str:
    """The API verb of an HTTP method; any other method (HEAD, OPTIONS, ...) is the empty
    verb, which only a ``*`` rule allows (the 1.37 code, not the docs' HEAD → get)."""
    return VERBS.get(method, "")


def is_subpath(path: str, registered: str) -> bool:
    registered = registered.removesuffix("/")
    return path == registered or (path.startswith(registered) and path[len(registered)] == "/")


def subresources(path: str) -> list[str]:
    found = [sub for prefix, sub in FINE_GRAINED if is_subpath(path, prefix)][:1]
    found += [next((sub for prefix, sub in COARSE if is_subpath(path, prefix)), DEFAULT_SUBRESOURCE)]
    return found


@dataclass(frozen=True)
class Attributes:
    """One authorizer.AttributesRecord (resource request on the node object)."""

    user: UserInfo
    verb: str
    subresource: str
    name: str
    path: str
    resource: str = "nodes"
    api_version: str = "v1"


def attributes(user: UserInfo, method: str, path: str, node_name: str) -> list[Attributes]:
    """``path`` is the decoded URL path (Go's URL.Path), the one the router sees."""
    api_verb = verb(method)
    return [Attributes(user, api_verb, sub, node_name, path) for sub in subresources(path)]


class AuthorizationError(Exception):
    """The authorizer could not answer (500); ``attributes`` is the set it failed on."""

    def __init__(self, attributes: Attributes, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.attributes = attributes


class Authorizer(Protocol):
    async def allowed(self, attrs: Attributes) -> bool:
        """True to allow; False for deny or no opinion; raise for "cannot tell"."""
        ...


class AlwaysAllow:
    async def allowed(self, attrs: Attributes) -> bool:
        return True


class WebhookAuthorizer:
    """SubjectAccessReview through the node's API client, cached by the whole review spec."""

    def __init__(self, api: Any, allowed_ttl: float, denied_ttl: float,
                 cache: ReviewCache[Attributes, bool] | None = None) -> None:
        self._api = api
        self._allowed_ttl = allowed_ttl
        self._denied_ttl = denied_ttl
        self.cache: ReviewCache[Attributes, bool] = cache or ReviewCache()
        self.sent = 0
        """SubjectAccessReviews posted (every attempt), for the server's metrics."""

    async def allowed(self, attrs: Attributes) -> bool:
        # The path is not part of a SubjectAccessReview: one answer serves every path that
        # maps to the same subresource.
        key = Attributes(attrs.user, attrs.verb, attrs.subresource, attrs.name, "")
        return await self.cache.get(key, lambda: self._review(attrs))

    async def _review(self, attrs: Attributes) -> tuple[bool, float]:
        spec = SubjectAccessReviewSpec(
            user=attrs.user.name, groups=list(attrs.user.groups), uid=attrs.user.uid or None,
            extra=attrs.user.extra_map() or None,
            resourceAttributes=ResourceAttributes(namespace="", verb=attrs.verb, group="", version=attrs.api_version,
                                                  resource=attrs.resource, subresource=attrs.subresource,
                                                  name=attrs.name))

        async def post() -> Any:
            self.sent += 1
            return await self._api.create(SubjectAccessReview(spec=spec))

        review = await with_retry(post)
        allowed = bool(review.status is not None and review.status.allowed)
        return allowed, self._allowed_ttl if allowed else self._denied_ttl


async def authorize(authorizer: Authorizer, attrs: Sequence[Attributes]) -> bool:
    """First allow wins; an authorizer error aborts (AuthorizationError, a 500)."""
    for one in attrs:
        try:
            if await authorizer.allowed(one):
                return True
        except Exception as exc:
            raise AuthorizationError(one, exc) from exc
    return False


def forbidden_message(attrs: Sequence[Attributes]) -> str:
    """The kubelet's 403 body: user, verb and resource of the first set, every subresource
    (Go's %v of a string slice: ``[pods proxy]``), and a newline."""
    first = attrs[0]
    subs = " ".join(a.subresource for a in attrs)
    return (f"Forbidden (user={first.user.name}, verb={first.verb}, resource={first.resource}, "
            f"subresource(s)=[{subs}])\n")


def error_message(attrs: Attributes) -> str:
    """The kubelet's 500 body for the set the authorizer failed on."""
    return (f"Authorization error (user={attrs.user.name}, verb={attrs.verb}, resource={attrs.resource}, "
            f"subresource={attrs.subresource})")


def mode(config: AgentConfig) -> str:
    if config.authorization.mode is not None:
        return config.authorization.mode
    return "Webhook" if config.kubeconfig is not None else "AlwaysAllow"


def build(config: AgentConfig, api: Any) -> Authorizer:
    chosen = mode(config)
    if chosen == "AlwaysAllow":
        return AlwaysAllow()
    if api is None:
        raise ConfigError("no client provided, cannot use webhook authorization")
    webhook = config.authorization.webhook
    return WebhookAuthorizer(api, webhook.cache_authorized_ttl, webhook.cache_unauthorized_ttl)


__all__ = ["AlwaysAllow", "Attributes", "AuthorizationError", "Authorizer", "WebhookAuthorizer", "attributes",
           "authorize", "build", "error_message", "forbidden_message", "mode", "subresources", "verb"]
