"""nodeagent: a node agent that runs Kubernetes pods on a CRI runtime.

The core holds the bus, the phase contracts, the pod workers and the lifecycle; every
concern that touches pods (admission, the runtime, status, devices, gangs) is a stage plugin.
"""

import os

# Every process of ours forks only to exec (mount, ip, runc, the control plane's binaries).
# grpcio's core installs fork handlers by default; a child forked while another thread was
# inside gRPC ran them and aborted before its exec (seen: a test's etcd "exited (-6)" with
# "epoll_wait error: Bad file descriptor"). Read by gRPC when it initializes, so set before
# anything here imports it; children inherit it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
