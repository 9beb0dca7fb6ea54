"""Volume mechanics shared by the stages that make volumes (plugins/volumes: emptyDir, hostPath,
downwardAPI; plugins/apivolumes: configMap, secret, projected) — the kubelet's pkg/volume/util:
the atomic writer, fsGroup ownership, tmpfs mounts, a container's volumeMounts as CRI mounts.
A library, not a stage, so that neither stage imports the other's modules.
"""


class SetupError(ValueError):
    """The volume cannot be set up now (the kubelet's FailedMount); setup is retried."""
