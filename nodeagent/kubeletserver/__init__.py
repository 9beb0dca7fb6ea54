"""The kubelet HTTP API (HTTPS on ``port``, default 10250), so that ``kubectl logs``,
``kubectl exec``, ``attach`` and ``port-forward`` work through the API server.

    server.py         TLS, the auth filter, routing, the request log, pod lookups (the kubelet's server.go)
    authn.py          who is asking: x509 client certificates, TokenReview, anonymous
    authz.py          what they may do: request attributes, SubjectAccessReview, AlwaysAllow
    review.py         the reviews' cache (TTL, bounded, single flight) and retry
    listener.py       the accept loop: a connection cap, accept errors survived
    wire.py           the HTTP/1.1 we need, by hand over anyio streams
    containerlogs.py  /containerLogs, on top of nodeagent.logreader
    streams.py        /exec /attach /portForward: CRI streaming URL, then a byte splice
    certs.py          serving certificate (configured, or self-signed under rootDir/pki) and TLS
    readonly.py       the read-only port (readOnlyPort): plain HTTP, unauthenticated, /healthz /pods
                      /stats /metrics only

The composition root starts it in cluster mode, or whenever ``enableServer`` is true; the
read-only port whenever ``readOnlyPort`` is not 0 (as the kubelet, independently of enableServer).
"""

from nodeagent.kubeletserver.readonly import ReadOnlyServer
from nodeagent.kubeletserver.server import KubeletServer, RequestCounts, enabled, pod_list

__all__ = ["KubeletServer", "ReadOnlyServer", "RequestCounts", "enabled", "pod_list"]
