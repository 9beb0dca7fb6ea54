"""The Kubernetes API client for cluster mode: lightkube's async client (httpx under anyio),
built once by the composition root from the node's kubeconfig and handed to stages and cluster
services through the agent handle. Nothing else opens a connection to the API server."""

from __future__ import annotations

from pathlib import Path

import httpx2
from lightkube import AsyncClient, KubeConfig

# The kubelet's client-side rate limit defaults (kubeAPIQPS 50, kubeAPIBurst 100) are applied
# by the writers that need them; the client itself stays unthrottled for watches.
API_TIMEOUT_SECONDS = 30.0


def make_api_client(kubeconfig: Path, field_manager: str = "nodeagent") -> AsyncClient:
    config = KubeConfig.from_file(str(kubeconfig))
    return AsyncClient(config=config, field_manager=field_manager, timeout=httpx2.Timeout(API_TIMEOUT_SECONDS))
