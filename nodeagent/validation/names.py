"""String formats of the API (apimachinery ``util/validation`` and ``meta/v1/validation``).

Each ``is_*`` function returns the list of the API's messages for what is wrong (empty when
the value is valid); the ``validate_*`` functions turn them into field errors at a path.
"""

from __future__ import annotations

import ipaddress
import re

from nodeagent.validation import field as f
from nodeagent.validation.field import ErrorList, Path

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
CONFIG_KEY_MAX = 253
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024
UID_MAX = 64

_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_FMT = _LABEL_FMT + "(\\." + _LABEL_FMT + ")*"
_SUBDOMAIN_UNDERSCORE_LABEL = "_?[a-z0-9]([-_a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_UNDERSCORE_FMT = _SUBDOMAIN_UNDERSCORE_LABEL + "(\\." + _SUBDOMAIN_UNDERSCORE_LABEL + ")*"
_QUALIFIED_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = "(" + _QUALIFIED_FMT + ")?"
_CONFIG_KEY_FMT = "[-._a-zA-Z0-9]+"
_HTTP_HEADER_FMT = "[-A-Za-z0-9]+"
_UID_FMT = "[A-Za-z0-9-]+"

# fullmatch, not match: Go's ^...$ with a non-multiline regexp (Python's $ also accepts "\n").
_LABEL = re.compile(_LABEL_FMT)
_SUBDOMAIN = re.compile(_SUBDOMAIN_FMT)
_SUBDOMAIN_UNDERSCORE = re.compile(_SUBDOMAIN_UNDERSCORE_FMT)
_QUALIFIED = re.compile(_QUALIFIED_FMT)
_LABEL_VALUE = re.compile(_LABEL_VALUE_FMT)
_CONFIG_KEY = re.compile(_CONFIG_KEY_FMT)
_HTTP_HEADER = re.compile(_HTTP_HEADER_FMT)
_PORT_NAME_CHARS = re.compile("[-a-z0-9]+")
_UID = re.compile(_UID_FMT)


def regex_error(message: str, fmt: str, *examples: str) -> str:
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def max_len_error(n: int) -> str:
    return f"must be no more than {n} characters"


def inclusive_range_error(lo: int, hi: int) -> str:
    return f"must be between {lo} and {hi}, inclusive"


def is_dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_LABEL_MAX:
        errs.append(max_len_error(DNS1123_LABEL_MAX))
    if not _LABEL.fullmatch(value):
        if _SUBDOMAIN.fullmatch(value):
            errs.append("must not contain dots")
        else:
            errs.append(regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                "start and end with an alphanumeric character", _LABEL_FMT, "my-name", "123-abc"))
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _SUBDOMAIN.fullmatch(value):
        errs.append(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
            "must start and end with an alphanumeric character", _SUBDOMAIN_FMT, "example.com"))
    return errs


def is_dns1123_subdomain_with_underscore(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _SUBDOMAIN_UNDERSCORE.fullmatch(value):
        errs.append(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '_', '-' or '.', "
            "and must start and end with an alphanumeric character", _SUBDOMAIN_UNDERSCORE_FMT, "example.com"))
    return errs


_QUALIFIED_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                  "alphanumeric character")


def is_qualified_name(value: str) -> list[str]:
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return ["a qualified name " + regex_error(_QUALIFIED_MSG, _QUALIFIED_FMT, "MyName", "my.name", "123-abc")
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errs.append("name part " + max_len_error(QUALIFIED_NAME_MAX))
    if not _QUALIFIED.fullmatch(name):
        errs.append("name part " + regex_error(_QUALIFIED_MSG, _QUALIFIED_FMT, "MyName", "my.name", "123-abc"))
    return errs


def is_label_value(value: str) -> list[str]:
    errs = []
    if len(value) > LABEL_VALUE_MAX:
        errs.append(max_len_error(LABEL_VALUE_MAX))
    if not _LABEL_VALUE.fullmatch(value):
        errs.append(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
            "must start and end with an alphanumeric character", _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def is_port_num(port: int) -> list[str]:
    return [] if 1 <= port <= 65535 else [inclusive_range_error(1, 65535)]


def is_port_name(port: str) -> list[str]:
    errs = []
    if len(port) > 15:
        errs.append(max_len_error(15))
    if not _PORT_NAME_CHARS.fullmatch(port):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search("[a-z]", port):
        errs.append("must contain at least one letter (a-z)")
    if "--" in port:
        errs.append("must not contain consecutive hyphens")
    if port and (port[0] == "-" or port[-1] == "-"):
        errs.append("must not begin or end with a hyphen")
    return errs


def is_user_id(uid: int) -> list[str]:
    return [] if 0 <= uid <= 0xFFFFFFFF else [inclusive_range_error(0, 0xFFFFFFFF)]


is_group_id = is_user_id


def is_relaxed_env_var_name(value: str) -> list[str]:
    """RelaxedEnvironmentVariableValidation (GA): printable ASCII other than '='."""
    errs = []
    if not value:
        errs.append("environment variable name must be non-empty")
    if any(not (0x20 <= ord(c) < 0x7F) or c == "=" for c in value):
        errs.append("a valid environment variable name must consist only of printable ASCII characters other "
                    "than '='")
    return errs


def _chdir_prefix(value: str) -> list[str]:
    if value == ".":
        return ["must not be '.'"]
    if value == "..":
        return ["must not be '..'"]
    if value.startswith(".."):
        return ["must not start with '..'"]
    return []


def is_config_map_key(value: str) -> list[str]:
    errs = []
    if len(value) > CONFIG_KEY_MAX:
        errs.append(max_len_error(CONFIG_KEY_MAX))
    if not _CONFIG_KEY.fullmatch(value):
        errs.append(regex_error("a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                                _CONFIG_KEY_FMT, "key.name", "KEY_NAME", "key-name"))
    errs.extend(_chdir_prefix(value))
    return errs


def is_http_header_name(value: str) -> list[str]:
    if _HTTP_HEADER.fullmatch(value):
        return []
    return [regex_error("a valid HTTP header must consist of alphanumeric characters or '-'", _HTTP_HEADER_FMT,
                        "X-Header-Name")]


def is_uid(value: str) -> list[str]:
    """Not an API rule (the API server makes UIDs): a UID names directories on the host, so one
    given in a manifest must be a plain token."""
    errs = []
    if len(value) > UID_MAX:
        errs.append(max_len_error(UID_MAX))
    if not _UID.fullmatch(value):
        errs.append(regex_error("a uid must consist of alphanumeric characters or '-'", _UID_FMT,
                                "3f2a8c1e-0b6d-4c1a-9a57-2d1f0e6b7c44"))
    return errs


def validate_ip(path: Path, value: str) -> ErrorList:
    """IsValidIP: the API's message for an address Go's net.ParseIP rejects."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return [f.invalid(path, value, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)")]
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return [f.invalid(path, value, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)")]
    return []


def validate_with(check: object, path: Path, value: str) -> ErrorList:
    """Every message of ``check(value)`` as an Invalid error at ``path``."""
    return [f.invalid(path, value, m) for m in check(value)]  # type: ignore[operator]


def validate_labels(labels: dict[str, str], path: Path) -> ErrorList:
    errs: ErrorList = []
    for k, v in labels.items():
        errs += validate_with(is_qualified_name, path, k)
        errs += validate_with(is_label_value, path, v)
    return errs


def validate_annotations(annotations: dict[str, str], path: Path) -> ErrorList:
    errs: ErrorList = []
    for k in annotations:
        # QualifiedName, except that case does not matter.
        errs += [f.invalid(path, k, m) for m in is_qualified_name(k.lower())]
    if sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) > TOTAL_ANNOTATION_SIZE_LIMIT:
        errs.append(f.too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT))
    return errs
