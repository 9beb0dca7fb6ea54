"""The kubelet's labels and annotations on CRI objects (pkg/kubelet/kuberuntime/labels.go).

Using the same keys makes nodeagent's pods recognisable to tools that know the kubelet's (crictl,
log collectors) and lets a restarted agent recover its pods from the runtime alone.
"""

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"

CONTAINER_HASH = "io.kubernetes.container.hash"
CONTAINER_RESTART_COUNT = "io.kubernetes.container.restartCount"
CONTAINER_TERMINATION_MESSAGE_PATH = "io.kubernetes.container.terminationMessagePath"
CONTAINER_TERMINATION_MESSAGE_POLICY = "io.kubernetes.container.terminationMessagePolicy"
POD_DELETION_GRACE_PERIOD = "io.kubernetes.pod.deletionGracePeriod"
POD_TERMINATION_GRACE_PERIOD = "io.kubernetes.pod.terminationGracePeriod"
CONTAINER_PRESTOP_HANDLER = "io.kubernetes.container.preStopHandler"
CONTAINER_PORTS = "io.kubernetes.container.ports"
CONTAINER_TYPE = "io.kubernetes.container.type"

CONFIG_SOURCE = "kubernetes.io/config.source"
CONFIG_SEEN = "kubernetes.io/config.seen"
CONFIG_HASH = "kubernetes.io/config.hash"
CONFIG_MIRROR = "kubernetes.io/config.mirror"

# nodeagent's own: which agent instance created an object, so two agents sharing one runtime
# (the multi-node tests) never adopt or remove each other's pods.
MANAGED_BY = "nodeagent.io/node"
