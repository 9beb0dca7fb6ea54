"""metrics-server (sigs.k8s.io/metrics-server), built from the Go module proxy and run as a
process behind the test API server's aggregation layer: the real consumer of the kubelet API's
/metrics/resource, what ``kubectl top`` and the HorizontalPodAutoscaler read.

``build()`` runs ``go install sigs.k8s.io/metrics-server/cmd/metrics-server@<version>`` into
``<cache>/metrics-server/<version>/bin`` (the module's own go.mod and go.sum pin everything; a
cold build took 7.5 minutes on a loaded 2-core machine, seconds once Go's build cache has it).
It is not part of the control plane's default build: only the test that needs it builds it.

``MetricsServer`` starts it on the host's address with the admin credentials (it reads the
front-proxy settings from ``kube-system/extension-apiserver-authentication`` and scrapes
kubelets with the same client certificate, ``--kubelet-insecure-tls``), and registers it with
the aggregator: a Service without selector in kube-system, its Endpoints and EndpointSlice (the
host's address: the API server refuses loopback endpoints) and the APIService
``v1beta1.metrics.k8s.io``. The API server runs with ``--enable-aggregator-routing`` so it
reaches the endpoint directly (there is no kube-proxy).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from controlplane.build import BuildError, cache_root, go_env
from controlplane.cluster import ControlPlane, free_port

VERSION = "v0.8.0"
MODULE = "sigs.k8s.io/metrics-server/cmd/metrics-server"
NAMESPACE = "kube-system"
SERVICE = "metrics-server"
API_SERVICE = "v1beta1.metrics.k8s.io"


def binary(version: str = VERSION) -> Path:
    return cache_root().parent / "metrics-server" / version / "bin" / "metrics-server"


def is_built(version: str = VERSION) -> bool:
    return os.access(binary(version), os.X_OK)


def build(version: str = VERSION) -> Path:
    """The binary, built when missing."""
    target = binary(version)
    if is_built(version):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    env = {**go_env(), "GOBIN": str(target.parent)}
    env["GOFLAGS"] = env["GOFLAGS"].replace("-mod=readonly", "").strip()  # `go install pkg@v` has no module here
    proc = subprocess.run(["go", "install", "-trimpath", "-ldflags", "-s -w", f"{MODULE}@{version}"],
                          env=env, cwd=target.parent, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not is_built(version):
        raise BuildError(f"go install {MODULE}@{version} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return target


def host_address() -> str:
    """A non-loopback address of this host (the one its default route leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, only the route is looked up
        return str(s.getsockname()[0])


class MetricsServer:
    def __init__(self, cp: ControlPlane, base_dir: Path, *, resolution_seconds: int = 10) -> None:
        self.cp = cp
        self.base_dir = base_dir
        self.resolution = resolution_seconds
        self.port = free_port()
        self.address = host_address()
        self.log_path = base_dir / "metrics-server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        kubeconfig = str(self.cp.kubeconfig_admin)
        args = [str(build()), f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", f"--secure-port={self.port}", "--bind-address=0.0.0.0",
                f"--cert-dir={self.base_dir / 'certs'}", "--kubelet-insecure-tls",
                "--kubelet-preferred-address-types=InternalIP,Hostname", "--kubelet-use-node-status-port",
                f"--metric-resolution={self.resolution}s", "--kubelet-request-timeout=5s"]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._register()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"metrics-server exited ({self._proc.returncode}); log {self.log_path}:\n"
                                   f"{self.log_path.read_text()[-3000:]}")
            proc = self.cp.kubectl("get", "apiservice", API_SERVICE, "-o", "json", check=False)
            if proc.returncode == 0:
                conditions = json.loads(proc.stdout).get("status", {}).get("conditions", [])
                if any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
                    return
            time.sleep(1)
        raise TimeoutError(f"APIService {API_SERVICE} not Available within {timeout:.0f}s; log {self.log_path}")

    def _register(self) -> None:
        objects = [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
             "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.port, "protocol": "TCP"}]}},
            {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
             "subsets": [{"addresses": [{"ip": self.address}],
                          "ports": [{"name": "https", "port": self.port, "protocol": "TCP"}]}]},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": SERVICE, "namespace": NAMESPACE,
                          "labels": {"kubernetes.io/service-name": SERVICE}},
             "addressType": "IPv4", "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}],
             "ports": [{"name": "https", "port": self.port, "protocol": "TCP"}]},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
             "spec": {"service": {"name": SERVICE, "namespace": NAMESPACE, "port": 443},
                      "group": "metrics.k8s.io", "version": "v1beta1", "insecureSkipTLSVerify": True,
                      "groupPriorityMinimum": 100, "versionPriority": 100}},
        ]
        self.cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def stop(self) -> None:
        self.cp.kubectl("delete", "apiservice", API_SERVICE, "--wait=false", check=False)
        self.cp.kubectl("-n", NAMESPACE, "delete", "service,endpoints,endpointslice", SERVICE, "--wait=false",
                        check=False)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


__all__ = ["VERSION", "MetricsServer", "binary", "build", "host_address", "is_built"]

if __name__ == "__main__":  # python -m controlplane.metricsserver: build it ahead of the test
    began = time.monotonic()
    print(f"{build()} ({time.monotonic() - began:.0f}s)")
