"""The Kubernetes API client for cluster mode: lightkube's async client (httpx under anyio),
built once by the composition root from the node's kubeconfig and handed to stages and cluster
services through the agent handle. Nothing else opens a connection to the API server (the TLS
bootstrap, before the agent exists, builds its short-lived one here too)."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx2
from lightkube import AsyncClient, KubeConfig

# The kubelet's client-side rate limit defaults (kubeAPIQPS 50, kubeAPIBurst 100) are applied
# by the writers that need them; the client itself stays unthrottled for watches.
API_TIMEOUT_SECONDS = 30.0


def make_api_client(kubeconfig: Path, field_manager: str = "nodeagent", *,
                    ssl_context: ssl.SSLContext | None = None) -> AsyncClient:
    """``ssl_context``: present the node's rotating client certificate from this context
    (nodeagent/certificates) instead of the one the kubeconfig names; it is reloaded in place
    on rotation, so every new connection presents the current certificate."""
    config = KubeConfig.from_file(str(kubeconfig))
    transport = httpx2.AsyncHTTPTransport(verify=ssl_context) if ssl_context is not None else None
    return AsyncClient(config=config, field_manager=field_manager, timeout=httpx2.Timeout(API_TIMEOUT_SECONDS),
                       transport=transport)
