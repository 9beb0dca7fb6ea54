"""The API server's validation, in one place: field errors worded and located as the API server
words and locates them (``spec.containers[0].ports[1].containerPort: Invalid value: 70000: must
be between 1 and 65535, inclusive``).

The static source applies :func:`validate_pod_create` to every manifest, as the kubelet does
with the API server's ValidatePodCreate; other sources can use it the same way.
"""

from nodeagent.validation.field import ErrorList, FieldError, Path
from nodeagent.validation.pod import validate_pod_create

__all__ = ["ErrorList", "FieldError", "Path", "validate_pod_create"]
