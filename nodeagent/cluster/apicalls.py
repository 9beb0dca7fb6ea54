"""Small helpers around lightkube for the cluster services: error classification, API
timestamps, and the one call lightkube does not offer (a delete with preconditions)."""

from __future__ import annotations

from typing import Any

from lightkube import ApiError
from lightkube.resources.core_v1 import Pod


def status_code(exc: BaseException) -> int | None:
    """The HTTP status of an API answer; None for transport errors (no answer at all)."""
    if isinstance(exc, ApiError):
        return exc.status.code
    return None


def is_not_found(exc: BaseException) -> bool:
    return status_code(exc) == 404


def is_conflict(exc: BaseException) -> bool:
    """409: AlreadyExists on create, a stale resourceVersion or a failed UID precondition."""
    return status_code(exc) == 409


def is_gone(exc: BaseException) -> bool:
    """410 Gone: a watch's resourceVersion is too old; only a new list helps."""
    return status_code(exc) == 410


def is_refused(exc: BaseException) -> bool:
    """A 4xx answer that asking again will not change (forbidden, invalid, ...): the request
    is given up. 429 (throttled, or the server shutting down) and 5xx are worth a retry."""
    code = status_code(exc)
    return code is not None and 400 <= code < 500 and code != 429


def describe(exc: BaseException) -> str:
    code = status_code(exc)
    return f"{code}: {exc}" if code is not None else f"{type(exc).__name__}: {exc}"


async def delete_pod(api: Any, namespace: str, name: str, uid: str, grace_period_seconds: int = 0) -> None:
    """DELETE a pod only if it still is the object with ``uid`` (a pod re-created under the same
    name must survive), the kubelet's final delete. lightkube's ``delete`` sends no body, so
    DeleteOptions with preconditions go through its request builder; a 404 or a failed
    precondition (409) raise ApiError like any other call."""
    inner = api._client  # lightkube's GenericAsyncClient: builds URLs, auth and errors for us
    request = inner.prepare_request("delete", res=Pod, name=name, namespace=namespace)
    request.data = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "gracePeriodSeconds": grace_period_seconds,
        "preconditions": {"uid": uid},
    }
    response = await inner.send(inner.build_adapter_request(request))
    inner.raise_for_status(response)
