"""Containers: what validateContainerCommon, the probe, lifecycle, port, env and security
context rules of the API check, for init, regular and ephemeral containers."""

from __future__ import annotations

from nodeagent.validation import field as f
from nodeagent.validation import names
from nodeagent.validation.decode import INT64, Obj
from nodeagent.validation.resources import Requirements, validate_requirements
from nodeagent.validation.volumes import (
    PULL_POLICIES,
    local_descending_path,
    object_field_selector,
    resource_field_selector,
    validate_mounts,
)

PROTOCOLS = ("SCTP", "TCP", "UDP")
MESSAGE_POLICIES = ("File", "FallbackToLogsOnError")
RESTART_POLICIES = ("Always", "OnFailure", "Never")
RESIZE_RESOURCES = ("cpu", "memory")
RESIZE_POLICIES = ("NotRequired", "RestartContainer")
PROC_MOUNTS = ("Default", "Unmasked")
PROFILE_TYPES = ("Localhost", "RuntimeDefault", "Unconfined")
RULE_ACTIONS = ("Restart", "RestartAllContainers")
RULE_OPERATORS = ("In", "NotIn")
ENV_FIELD_PATHS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
                   "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs")
# Fields an ephemeral container may not set (the API's allow list, inverted).
EPHEMERAL_FORBIDDEN = ("ports", "resources", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle",
                       "resizePolicy", "restartPolicy", "restartPolicyRules")


def validate_common(c: Obj, volumes: dict[str, str], claim_names: set[str], pod_restart: str,
                    host_users: bool) -> Requirements:
    errs = c.errs
    name = c.str("name")
    if not name:
        errs.append(f.required(c.at("name")))
    else:
        errs += names.validate_with(names.is_dns1123_label, c.at("name"), name)
    image = c.str("image")
    if not image:
        errs.append(f.required(c.at("image")))
    elif image != image.strip():
        errs.append(f.invalid(c.at("image"), image, "must not have leading or trailing whitespace"))
    policy = c.str("terminationMessagePolicy", "File")
    if policy not in MESSAGE_POLICIES:
        errs.append(f.not_supported(c.at("terminationMessagePolicy"), policy, MESSAGE_POLICIES))
    message_path = c.str("terminationMessagePath")
    if "\x00" in message_path:
        errs.append(f.invalid(c.at("terminationMessagePath"), f.OMIT, "must not contain a NUL character"))
    c.strs("command")
    c.strs("args")
    working_dir = c.str("workingDir")
    if "\x00" in working_dir:
        errs.append(f.invalid(c.at("workingDir"), f.OMIT, "must not contain a NUL character"))
    for flag in ("stdin", "stdinOnce", "tty"):
        c.opt_bool(flag)
    _ports(c)
    _env(c)
    _env_from(c)
    security = c.obj("securityContext")
    privileged = _security_context(security, host_users) if security is not None else False
    validate_mounts(c, volumes, privileged)
    pull = c.opt_str("imagePullPolicy")
    if pull is not None and pull not in PULL_POLICIES:
        errs.append(f.not_supported(c.at("imagePullPolicy"), pull, PULL_POLICIES))
    requirements = validate_requirements(c.obj("resources"), claim_names)
    _resize_policy(c, pod_restart)
    return requirements


def _ports(c: Obj) -> None:
    errs = c.errs
    seen: set[str] = set()
    for port in c.objs("ports"):
        name = port.str("name")
        if name:
            msgs = names.is_port_name(name)
            if msgs:
                errs += [f.invalid(port.at("name"), name, m) for m in msgs]
            elif name in seen:
                errs.append(f.duplicate(port.at("name"), name))
            else:
                seen.add(name)
        number = port.int("containerPort")
        if number == 0:
            errs.append(f.required(port.at("containerPort")))
        else:
            errs += [f.invalid(port.at("containerPort"), number, m) for m in names.is_port_num(number)]
        host = port.int("hostPort")
        if host != 0:
            errs += [f.invalid(port.at("hostPort"), host, m) for m in names.is_port_num(host)]
        protocol = port.str("protocol", "TCP")
        if not protocol:
            errs.append(f.required(port.at("protocol")))
        elif protocol not in PROTOCOLS:
            errs.append(f.not_supported(port.at("protocol"), protocol, PROTOCOLS))
        host_ip = port.str("hostIP")
        if host_ip:
            errs += names.validate_ip(port.at("hostIP"), host_ip)


def host_port_conflicts(containers: list[Obj], errs: list[f.FieldError]) -> None:
    """AccumulateUniqueHostPorts over ``containers``."""
    seen: set[str] = set()
    for c in containers:
        for port in c.objs("ports"):  # (a type error found here again is deduplicated)
            number = port.int("hostPort")
            if number == 0:
                continue
            key = f"{port.str('protocol', 'TCP')}/{port.str('hostIP')}/{number}"
            if key in seen:
                errs.append(f.duplicate(port.at("hostPort"), key))
            seen.add(key)


def _env(c: Obj) -> None:
    errs = c.errs
    for var in c.objs("env"):
        name = var.str("name")
        if not name:
            errs.append(f.required(var.at("name")))
        else:
            errs += names.validate_with(names.is_relaxed_env_var_name, var.at("name"), name)
        value = var.str("value")  # never shown: env values are where secrets live
        source = var.obj("valueFrom")
        if source is None:
            continue
        kinds = [k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef", "fileKeyRef")
                 if source.has(k)]
        for kind in kinds:
            sel = source.obj(kind)
            if sel is None:
                continue
            if kind == "fieldRef":
                object_field_selector(sel, ENV_FIELD_PATHS)
            elif kind == "resourceFieldRef":
                resource_field_selector(sel, volume=False)
            elif kind in ("configMapKeyRef", "secretKeyRef"):
                _key_selector(sel)
        path = var.at("valueFrom")
        if not kinds:
            errs.append(f.invalid(path, "", "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` "
                                  "or `secretKeyRef`"))
        elif value:
            errs.append(f.invalid(path, "", "may not be specified when `value` is not empty"))
        elif len(kinds) > 1:
            errs.append(f.invalid(path, "", "may not have more than one field specified at a time"))


def _key_selector(sel: Obj) -> None:
    errs = sel.errs
    name, key = sel.str("name"), sel.str("key")
    errs += names.validate_with(names.is_dns1123_subdomain, sel.at("name"), name)
    if not key:
        errs.append(f.required(sel.at("key")))
    else:
        errs += names.validate_with(names.is_config_map_key, sel.at("key"), key)
    sel.opt_bool("optional")


def _env_from(c: Obj) -> None:
    errs = c.errs
    for source in c.objs("envFrom"):
        prefix = source.str("prefix")
        if prefix:
            errs += names.validate_with(names.is_relaxed_env_var_name, source.at("prefix"), prefix)
        kinds = [k for k in ("configMapRef", "secretRef") if source.has(k)]
        for kind in kinds:
            ref = source.obj(kind)
            if ref is None:
                continue
            name = ref.str("name")
            if not name:
                errs.append(f.required(ref.at("name")))
            else:
                errs += names.validate_with(names.is_dns1123_subdomain, ref.at("name"), name)
            ref.opt_bool("optional")
        if not kinds:
            errs.append(f.invalid(c.at("envFrom"), "", "must specify one of: `configMapRef` or `secretRef`"))
        elif len(kinds) > 1:
            errs.append(f.invalid(c.at("envFrom"), "", "may not have more than one field specified at a time"))


def _resize_policy(c: Obj, pod_restart: str) -> None:
    errs = c.errs
    seen: set[str] = set()
    path = c.at("resizePolicy")
    for i, p in enumerate(c.objs("resizePolicy")):
        resource, policy = p.str("resourceName"), p.str("restartPolicy", "NotRequired")
        if resource in seen:
            errs.append(f.duplicate(path.index(i), resource))
        seen.add(resource)
        if not resource:
            errs.append(f.required(path))
        elif resource not in RESIZE_RESOURCES:
            errs.append(f.not_supported(path, resource, RESIZE_RESOURCES))
        if not policy:
            errs.append(f.required(path))
        elif policy not in RESIZE_POLICIES:
            errs.append(f.not_supported(path, policy, RESIZE_POLICIES))
        if pod_restart == "Never" and policy != "NotRequired":
            errs.append(f.invalid(path, policy, "must be 'NotRequired' when `restartPolicy` is 'Never'"))


def profile(p: Obj | None, kind: str) -> None:
    """A seccompProfile or appArmorProfile."""
    if p is None:
        return
    errs = p.errs
    type_ = p.str("type")
    localhost = p.opt_str("localhostProfile")
    if not type_:
        errs.append(f.required(p.at("type"), f"type is required when {kind}Profile is set"))
    elif type_ not in PROFILE_TYPES:
        errs.append(f.not_supported(p.at("type"), type_, PROFILE_TYPES))
    if type_ == "Localhost":
        if localhost is None or (kind == "appArmor" and not localhost.strip()):
            errs.append(f.required(p.at("localhostProfile"), f"must be set when {_title(kind)} type is Localhost"))
        elif kind == "seccomp":
            # A path under the node's seccomp directory: never an escape from it.
            errs += local_descending_path(localhost, p.at("localhostProfile"))
            if "\x00" in localhost:
                errs.append(f.invalid(p.at("localhostProfile"), f.OMIT, "must not contain a NUL character"))
        else:
            if localhost != localhost.strip():
                errs.append(f.invalid(p.at("localhostProfile"), localhost, "must not be padded with whitespace"))
            if len(localhost) > 4095:
                errs.append(f.too_long(p.at("localhostProfile"), 4095))
    elif localhost is not None:
        detail = f"can only be set when {_title(kind)} type is Localhost"
        errs.append(f.invalid(p.at("localhostProfile"), f.OMIT, detail))


def _title(kind: str) -> str:
    return "seccomp" if kind == "seccomp" else "AppArmor"


def _security_context(sc: Obj, host_users: bool) -> bool:
    """The container's securityContext; returns whether it is privileged."""
    errs = sc.errs
    privileged = sc.bool("privileged")
    for key in ("runAsUser", "runAsGroup"):
        value = sc.opt_int(key, INT64)
        if value is not None:
            errs += [f.invalid(sc.at(key), value, m) for m in names.is_user_id(value)]
    sc.opt_bool("runAsNonRoot")
    sc.opt_bool("readOnlyRootFilesystem")
    escalation = sc.opt_bool("allowPrivilegeEscalation")
    proc_mount = sc.opt_str("procMount")
    if proc_mount is not None:
        if proc_mount not in PROC_MOUNTS:
            errs.append(f.not_supported(sc.at("procMount"), proc_mount, PROC_MOUNTS))
        elif host_users and proc_mount == "Unmasked":
            errs.append(f.forbidden(sc.at("procMount"), "`hostUsers` must be false to use `Unmasked`"))
    caps = sc.obj("capabilities")
    added: list[str] = []
    if caps is not None:
        added = caps.strs("add")
        caps.strs("drop")
    if escalation is False:
        if privileged:
            errs.append(f.invalid(sc.path, f.OMIT, "cannot set `allowPrivilegeEscalation` to false and `privileged` "
                                  "to true"))
        if "CAP_SYS_ADMIN" in added:
            errs.append(f.invalid(sc.path, f.OMIT, "cannot set `allowPrivilegeEscalation` to false and "
                                  "`capabilities.Add` CAP_SYS_ADMIN"))
    profile(sc.obj("seccompProfile"), "seccomp")
    profile(sc.obj("appArmorProfile"), "appArmor")
    se_linux = sc.obj("seLinuxOptions")
    if se_linux is not None:
        for key in ("user", "role", "type", "level"):
            se_linux.str(key)
    return privileged


def _handler(h: Obj, kinds: tuple[str, ...], grace: int | None) -> None:
    errs = h.errs
    count = 0
    for kind in kinds:
        if not h.has(kind):
            continue
        if count:
            errs.append(f.forbidden(h.at(kind), "may not specify more than 1 handler type"))
            continue
        count += 1
        action = h.obj(kind)
        if action is None:
            continue
        if kind == "exec":
            if not action.strs("command"):
                errs.append(f.required(action.at("command")))
        elif kind == "httpGet":
            action.str("path", "/")
            action.str("host")
            _port_num_or_name(action)
            scheme = action.str("scheme", "HTTP")
            if scheme not in ("HTTP", "HTTPS"):
                errs.append(f.not_supported(action.at("scheme"), scheme, ["HTTP", "HTTPS"]))
            for header in action.objs("httpHeaders"):
                header_name = header.str("name")
                header.str("value")  # a header value may be a credential: never shown
                errs += [f.invalid(action.at("httpHeaders"), header_name, m)
                         for m in names.is_http_header_name(header_name)]
        elif kind == "tcpSocket":
            action.str("host")
            _port_num_or_name(action)
        elif kind == "grpc":
            port = action.int("port")
            errs += [f.invalid(action.at("port"), port, m) for m in names.is_port_num(port)]
            action.str("service")
        elif kind == "sleep":
            seconds = action.int("seconds", bits=INT64)
            if grace is not None and not 0 <= seconds <= grace:
                errs.append(f.invalid(h.at("sleep"), seconds, "must be non-negative and less than "
                                      f"terminationGracePeriodSeconds ({grace})"))
    if count == 0:
        errs.append(f.required(h.path, "must specify a handler type"))


def _port_num_or_name(action: Obj) -> None:
    port = action.int_or_str("port")
    if port is None:
        if not action.has("port"):
            action.errs.append(f.invalid(action.at("port"), 0, names.inclusive_range_error(1, 65535)))
        return
    msgs = names.is_port_num(port) if isinstance(port, int) else names.is_port_name(port)
    action.errs.extend(f.invalid(action.at("port"), port, m) for m in msgs)


def probe(p: Obj | None, grace: int | None, kind: str) -> None:
    if p is None:
        return
    errs = p.errs
    _handler(p, ("exec", "httpGet", "tcpSocket", "grpc"), grace)
    for key in ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold"):
        value = p.int(key)
        if value < 0:
            errs.append(f.invalid(p.at(key), value, "must be greater than or equal to 0"))
    success = p.int("successThreshold") or 1  # defaulted from 0
    if kind in ("liveness", "startup") and success != 1:
        errs.append(f.invalid(p.at("successThreshold"), success, "must be 1"))
    probe_grace = p.opt_int("terminationGracePeriodSeconds", INT64)
    if probe_grace is not None and probe_grace <= 0:
        errs.append(f.invalid(p.at("terminationGracePeriodSeconds"), probe_grace, "must be greater than 0"))
    if kind == "readiness" and probe_grace is not None:
        errs.append(f.invalid(p.at("terminationGracePeriodSeconds"), probe_grace, "must not be set for "
                              "readinessProbes"))


def lifecycle(c: Obj, grace: int | None) -> None:
    lc = c.obj("lifecycle")
    if lc is None:
        return
    for hook in ("postStart", "preStop"):
        h = lc.obj(hook)
        if h is not None:
            _handler(h, ("exec", "httpGet", "tcpSocket", "sleep"), grace)
    lc.opt_str("stopSignal")


def probes_and_hooks(c: Obj, grace: int | None) -> None:
    lifecycle(c, grace)
    probe(c.obj("livenessProbe"), grace, "liveness")
    probe(c.obj("readinessProbe"), grace, "readiness")
    probe(c.obj("startupProbe"), grace, "startup")


def restart_rules(c: Obj) -> str | None:
    """The container's restartPolicy and restartPolicyRules (ContainerRestartRules); returns the
    policy."""
    errs = c.errs
    policy = c.opt_str("restartPolicy")
    if policy is not None and policy not in RESTART_POLICIES:
        errs.append(f.not_supported(c.at("restartPolicy"), policy, RESTART_POLICIES))
    rules = c.objs("restartPolicyRules")
    if rules and policy is None:
        errs.append(f.forbidden(c.at("restartPolicyRules"), "may only be set when the container sets restartPolicy"))
    for rule in rules:
        action = rule.str("action")
        if not action:
            errs.append(f.required(rule.at("action")))
        elif action not in RULE_ACTIONS:
            errs.append(f.not_supported(rule.at("action"), action, RULE_ACTIONS))
        codes = rule.obj("exitCodes")
        if codes is None:
            errs.append(f.required(rule.at("exitCodes")))
            continue
        operator = codes.str("operator")
        if operator not in RULE_OPERATORS:
            errs.append(f.not_supported(codes.at("operator"), operator, RULE_OPERATORS))
        values = codes.ints("values")
        if len(values) > 255:
            errs.append(f.too_many(codes.at("values"), len(values), 255))
        for i, v in enumerate(values):
            if not 0 <= v <= 255:
                errs.append(f.invalid(codes.at("values").index(i), v, names.inclusive_range_error(0, 255)))
    return policy
