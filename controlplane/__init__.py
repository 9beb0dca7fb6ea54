"""A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl) built from the Go module proxy and run on loopback.

    python -m controlplane build      # idempotent; binaries in ~/.cache/nodeagent/k8s/<ver>/bin
    python -m controlplane up         # prints the admin kubeconfig path
    python -m controlplane down

See docs/cluster-mode.md.
"""

from controlplane.build import K8S_VERSION, bin_dir, ensure_built
from controlplane.cluster import ControlPlane, ControlPlaneError, free_port

__all__ = ["K8S_VERSION", "ControlPlane", "ControlPlaneError", "bin_dir", "ensure_built",
           "free_port"]
