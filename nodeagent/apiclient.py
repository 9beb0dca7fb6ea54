"""The Kubernetes API client for cluster mode: lightkube's async client (httpx under anyio),
built once by the composition root from the node's kubeconfig and handed to stages and cluster
services through the agent handle. Nothing else opens a connection to the API server (the TLS
bootstrap, before the agent exists, builds its short-lived one here too)."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import httpx2
from lightkube import AsyncClient, KubeConfig

# The kubelet's client-side rate limit defaults (kubeAPIQPS 50, kubeAPIBurst 100) are applied
# by the writers that need them; the client itself stays unthrottled for watches.
API_TIMEOUT_SECONDS = 30.0


RequestObserver = Callable[[str, str, int], None]
"""Told of every answered request: (HTTP method, host:port, status code)."""


def make_api_client(kubeconfig: Path, field_manager: str = "nodeagent", *,
                    ssl_context: ssl.SSLContext | None = None, observer: RequestObserver | None = None) -> AsyncClient:
    """``ssl_context``: present the node's rotating client certificate from this context
    (nodeagent/certificates) instead of the one the kubeconfig names; it is reloaded in place
    on rotation, so every new connection presents the current certificate. ``observer``: told
    of every request the server answered (a watch when its headers arrive), for the kubelet's
    rest_client_requests_total."""
    config = KubeConfig.from_file(str(kubeconfig))
    transport = httpx2.AsyncHTTPTransport(verify=ssl_context) if ssl_context is not None else None
    client = AsyncClient(config=config, field_manager=field_manager, timeout=httpx2.Timeout(API_TIMEOUT_SECONDS),
                         transport=transport)
    if observer is not None:
        async def answered(response: httpx2.Response) -> None:
            url = response.request.url
            observer(response.request.method, f"{url.host}:{url.port}" if url.port else url.host,
                     response.status_code)

        # lightkube offers no hook of its own: its httpx client's (two levels in, as in
        # nodeagent.cluster.apicalls.delete_pod).
        client._client._client.event_hooks["response"].append(answered)
    return client
