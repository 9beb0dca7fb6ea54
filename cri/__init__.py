"""nodeagent's CRI v1 client: typed values (cri.types), typed errors (cri.errors)
and the async RuntimeClient. Nothing outside this package touches protobuf or gRPC."""

from cri import types
from cri.client import DEFAULT_TIMEOUT, RuntimeClient
from cri.errors import (
    AlreadyExists,
    CriError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    RuntimeVersionError,
    Unavailable,
    Unimplemented,
    Unknown,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "AlreadyExists",
    "CriError",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "RuntimeClient",
    "RuntimeVersionError",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "types",
]
