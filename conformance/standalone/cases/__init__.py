"""The ported cases, one module per upstream file. Importing this package registers them all
(in :data:`conformance.standalone.framework.REGISTRY`)."""

from conformance.standalone.cases import (  # noqa: F401
    container_lifecycle,
    container_probe,
    downwardapi,
    empty_dir,
    expansion,
    host_path,
    hostname,
    init_container,
    kubelet,
    log_path,
    oomkiller,
    runtime,
    security_context,
    sysctl,
)
