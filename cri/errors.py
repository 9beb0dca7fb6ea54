"""Typed CRI errors, made from gRPC status codes in one place (`from_rpc_error`).

Every RPC of cri.client goes through `RuntimeClient._boundary`, the only
caller of `from_rpc_error`: nothing above cri/ ever sees a grpc exception.
`retryable` tells the caller whether the same request may succeed later
without any change (the runtime was down, slow or overloaded).
"""

from __future__ import annotations

import os
from typing import ClassVar

import grpc


class CriError(Exception):
    """A CRI call failed. Subclasses name the gRPC status."""

    retryable: ClassVar[bool] = False

    def __init__(self, method: str, endpoint: str, code: grpc.StatusCode | None, details: str) -> None:
        self.method = method
        self.endpoint = endpoint
        self.code = code
        self.details = details
        super().__init__(self._message())

    def _message(self) -> str:
        code = self.code.name if self.code is not None else "ERROR"
        return f"CRI {self.method} at {self.endpoint} failed: {code}: {self.details}"

    def __reduce__(self) -> tuple[object, ...]:  # keep picklable despite the custom __init__
        return (type(self), (self.method, self.endpoint, self.code, self.details))


class NotFound(CriError):
    pass


class AlreadyExists(CriError):
    pass


class InvalidArgument(CriError):
    pass


class FailedPrecondition(CriError):
    pass


class PermissionDenied(CriError):
    pass


class Unimplemented(CriError):
    pass


class Internal(CriError):
    pass


class Unknown(CriError):
    pass


class ResourceExhausted(CriError):
    retryable = True


class DeadlineExceeded(CriError):
    retryable = True


class Unavailable(CriError):
    """The runtime cannot be reached (not running, socket missing, restarting)."""

    retryable = True

    def _message(self) -> str:
        path = socket_path(self.endpoint)
        if path is None:
            hint = "is the runtime running?"
        else:
            exists = "exists" if os.path.exists(path) else "does not exist"
            hint = f"is containerd running? socket {path} {exists}"
        return f"CRI runtime at {self.endpoint} is unavailable: {self.details} ({hint}; in {self.method})"


class RuntimeVersionError(CriError):
    """The runtime does not serve CRI v1."""

    def __init__(self, endpoint: str, answered: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__("Version", endpoint, code, answered)

    def _message(self) -> str:
        return (f"CRI runtime at {self.endpoint} does not speak CRI v1 "
                f"(runtime.v1.RuntimeService): {self.details}")


_BY_CODE: dict[grpc.StatusCode, type[CriError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNKNOWN: Unknown,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
}


def error_class(code: grpc.StatusCode) -> type[CriError]:
    """The CriError subclass for a status code (CriError itself for the rest)."""
    return _BY_CODE.get(code, CriError)


NOT_INITIALIZED = "server is not initialized yet"
"""containerd's CRI answers every call with this (as UNKNOWN) between opening its socket and
finishing its own start: the runtime is not there yet, as when the socket is missing."""


def from_rpc_error(method: str, endpoint: str, code: grpc.StatusCode, details: str) -> CriError:
    if code == grpc.StatusCode.UNKNOWN and NOT_INITIALIZED in details:
        return Unavailable(method, endpoint, code, details)
    return error_class(code)(method, endpoint, code, details)


def socket_path(endpoint: str) -> str | None:
    """The filesystem path of a unix endpoint ("unix:///run/x.sock" or a bare path)."""
    if endpoint.startswith("unix://"):
        return endpoint[len("unix://"):]
    if endpoint.startswith("unix:"):
        return endpoint[len("unix:"):]
    if "://" not in endpoint:
        return endpoint
    return None
