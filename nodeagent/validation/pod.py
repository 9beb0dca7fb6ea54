"""ValidatePodCreate: the API server's validation of a new pod, which the kubelet also applies to
static pods (pkg/kubelet/config/common.go, tryDecodeSinglePod).

It works on the decoded JSON object (camelCase, as the API and manifests spell it) rather than
on :class:`nodeagent.model.Pod`, so that wrong types are reported with the same paths as wrong
values, and so that fields nodeagent does not model are checked too; any source (static files
today, the API source if it ever needs to) can use it. Defaults the API would apply
(terminationGracePeriodSeconds 30, restartPolicy Always, probe thresholds, ...) are assumed for
absent fields.
"""

from __future__ import annotations

import re
from typing import Any

from nodeagent.validation import containers as ctr
from nodeagent.validation import field as f
from nodeagent.validation import names
from nodeagent.validation.decode import INT32, INT64, Obj
from nodeagent.validation.field import ROOT, ErrorList
from nodeagent.validation.meta import validate_object_meta
from nodeagent.validation.resources import (
    Requirements,
    validate_pod_consistency,
    validate_requirements,
)
from nodeagent.validation.volumes import validate_volumes

DEFAULT_GRACE_SECONDS = 30
DNS_POLICIES = ("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None")
OS_NAMES = ("linux", "windows")
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "PreferNoSchedule")
TOLERATION_OPERATORS = ("Equal", "Exists")
SELECTOR_OPERATORS = ("DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn")
FS_GROUP_POLICIES = ("Always", "OnRootMismatch")
SUPPLEMENTAL_GROUPS_POLICIES = ("Merge", "Strict")
SE_LINUX_CHANGE_POLICIES = ("MountOption", "Recursive")
PREEMPTION_POLICIES = ("Never", "PreemptLowerPriority")
MAX_DNS_NAMESERVERS = 3
MAX_DNS_SEARCH_PATHS = 32
MAX_DNS_SEARCH_CHARS = 2048
SYSCTL_MAX = 253
_SYSCTL_SEGMENT = "[a-z0-9]([-_a-z0-9]*[a-z0-9])?"
SYSCTL_REGEX = f"^({_SYSCTL_SEGMENT}[\\./])*{_SYSCTL_SEGMENT}$"
_SYSCTL = re.compile(SYSCTL_REGEX)
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MIRROR = "kubernetes.io/config.mirror"


def validate_pod_create(doc: dict[str, Any]) -> ErrorList:
    """Every field error of ``doc`` as a new pod, in the API's order and wording (deduplicated)."""
    errs: ErrorList = []
    pod = Obj(doc, ROOT, errs)
    meta = pod.obj("metadata") or Obj({}, ROOT.child("metadata"), errs)
    validate_object_meta(meta)
    spec = pod.obj("spec") or Obj({}, ROOT.child("spec"), errs)
    annotations = meta.str_map("annotations")
    _pod_annotations(annotations, meta, spec)
    _spec(spec)
    if spec.items("ephemeralContainers"):
        errs.append(f.forbidden(spec.at("ephemeralContainers"), "cannot be set on create"))
    if spec.str("nodeName") and spec.items("schedulingGates"):
        errs.append(f.forbidden(spec.at("nodeName"), "cannot be set until all schedulingGates have been cleared"))
    return f.dedupe(errs)


def _pod_annotations(annotations: dict[str, str], meta: Obj, spec: Obj) -> None:
    path = meta.at("annotations")
    if MIRROR in annotations and not spec.str("nodeName"):
        meta.errs.append(f.invalid(path.key(MIRROR), annotations[MIRROR],
                                   "must set spec.nodeName if mirror pod annotation is set"))
    cost = annotations.get(DELETION_COST)
    if cost is not None:
        try:
            ok = INT32[0] <= int(cost, 10) <= INT32[1] and cost.strip() == cost
        except ValueError:
            ok = False
        if not ok:
            meta.errs.append(f.invalid(path.key(DELETION_COST), cost, "must be a 32bit integer"))


def _spec(spec: Obj) -> None:
    errs = spec.errs
    grace = spec.opt_int("terminationGracePeriodSeconds", INT64)
    if grace is not None and grace < 0:
        errs.append(f.invalid(spec.at("terminationGracePeriodSeconds"), grace, "must be greater than or equal to 0"))
    grace = DEFAULT_GRACE_SECONDS if grace is None else grace
    security = spec.obj("securityContext")
    # v1 has hostUsers in the spec (the API server's internal type moves it into the pod's
    # securityContext, which is where its validation reads it).
    host_users = spec.bool("hostUsers", True)
    restart = spec.str("restartPolicy", "Always")
    volumes = validate_volumes(spec)
    claim_names = _resource_claims(spec)

    containers = spec.objs("containers")
    if not spec.items("containers"):
        errs.append(f.required(spec.at("containers")))
    regular: list[Requirements] = []
    seen: set[str] = set()
    for c in containers:
        regular.append(ctr.validate_common(c, volumes, claim_names, restart, host_users))
        name = c.str("name")
        if name in seen:
            errs.append(f.duplicate(c.at("name"), name))
        seen.add(name)
        ctr.probes_and_hooks(c, grace)
        ctr.restart_rules(c)
    ctr.host_port_conflicts(containers, errs)

    init: list[tuple[Requirements, bool]] = []
    init_names = set(seen)
    for c in spec.objs("initContainers"):
        requirements = ctr.validate_common(c, volumes, claim_names, restart, host_users)
        policy = ctr.restart_rules(c)
        sidecar = policy == "Always"
        init.append((requirements, sidecar))
        name = c.str("name")
        if name in init_names:
            errs.append(f.duplicate(c.at("name"), name))
        elif name:
            init_names.add(name)
        ctr.host_port_conflicts([c], errs)
        if sidecar:
            ctr.probes_and_hooks(c, grace)
        else:
            for key in ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe"):
                if c.has(key):
                    errs.append(f.forbidden(c.at(key), "may not be set for init containers without "
                                            "restartPolicy=Always"))
            if c.items("resizePolicy"):
                errs.append(f.invalid(c.at("resizePolicy"), f.OMIT, "must not be set for init containers"))
    _ephemeral(spec, volumes, claim_names, restart, host_users, init_names)

    pod_res = spec.obj("resources")
    if pod_res is not None:
        pod_requirements = validate_requirements(pod_res, claim_names, container=False)
        validate_pod_consistency(pod_res, pod_requirements, regular, init)

    _host_network(spec)
    if restart not in ctr.RESTART_POLICIES:
        errs.append(f.not_supported(spec.at("restartPolicy"), restart, ctr.RESTART_POLICIES))
    dns_policy = spec.str("dnsPolicy", "ClusterFirst")
    if dns_policy not in DNS_POLICIES:
        errs.append(f.not_supported(spec.at("dnsPolicy"), dns_policy, DNS_POLICIES))
    errs += names.validate_labels(spec.str_map("nodeSelector"), spec.at("nodeSelector"))
    _pod_security_context(spec, security)
    for ref in spec.objs("imagePullSecrets"):
        ref.str("name")
        if set(ref.keys()) - {"name"}:
            errs.append(f.invalid(ref.path, f.OMIT, "only name may be set"))
    affinity = spec.obj("affinity")
    if affinity is not None:
        _affinity(affinity)
    _dns_config(spec, dns_policy)
    for gate in spec.objs("readinessGates"):
        errs += names.validate_with(names.is_qualified_name, gate.at("conditionType"), gate.str("conditionType"))
    gates: set[str] = set()
    for gate in spec.objs("schedulingGates"):
        gate_name = gate.str("name")
        errs += names.validate_with(names.is_qualified_name, gate.path, gate_name)
        if gate_name in gates:
            errs.append(f.duplicate(gate.path, gate_name))
        gates.add(gate_name)
    if not host_users:
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.bool(key):
                errs.append(f.forbidden(spec.at(key), "when `pod.Spec.HostUsers` is false"))
    for key, check in (("serviceAccountName", names.is_dns1123_subdomain), ("serviceAccount", None),
                       ("nodeName", names.is_dns1123_subdomain), ("priorityClassName", names.is_dns1123_subdomain),
                       ("schedulerName", None), ("hostname", names.is_dns1123_label),
                       ("subdomain", names.is_dns1123_label), ("hostnameOverride", names.is_dns1123_subdomain)):
        value = spec.str(key)
        if value and check is not None:
            errs += names.validate_with(check, spec.at(key), value)
    deadline = spec.opt_int("activeDeadlineSeconds", INT64)
    if deadline is not None and not 1 <= deadline <= INT32[1]:
        errs.append(f.invalid(spec.at("activeDeadlineSeconds"), deadline, names.inclusive_range_error(1, INT32[1])))
    _tolerations(spec)
    for alias in spec.objs("hostAliases"):
        errs += names.validate_ip(alias.at("ip"), alias.str("ip"))
        for j, hostname in enumerate(alias.strs("hostnames")):
            errs += names.validate_with(names.is_dns1123_subdomain, alias.at("hostnames").index(j), hostname)
    runtime_class = spec.opt_str("runtimeClassName")
    if runtime_class is not None:
        errs += names.validate_with(names.is_dns1123_subdomain, spec.at("runtimeClassName"), runtime_class)
    preemption = spec.opt_str("preemptionPolicy")
    if preemption is not None and preemption not in PREEMPTION_POLICIES:
        errs.append(f.not_supported(spec.at("preemptionPolicy"), preemption, PREEMPTION_POLICIES))
    overhead = spec.obj("overhead")
    if overhead is not None:
        validate_requirements(Obj({"limits": overhead.data}, spec.at("overhead"), errs), claim_names)
    os_ = spec.obj("os")
    if os_ is not None:
        os_name = os_.str("name")
        if not os_name:
            errs.append(f.required(os_.at("name")))
        elif os_name not in OS_NAMES:
            errs.append(f.not_supported(os_.at("name"), os_name, OS_NAMES))
    spec.opt_int("priority")
    for flag in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace", "setHostnameAsFQDN",
                 "enableServiceLinks", "automountServiceAccountToken"):
        spec.opt_bool(flag)
    _groups(spec)


def _groups(spec: Obj) -> None:
    """spec.schedulingGroup and spec.workloadRef (the gang stage reads them)."""
    errs = spec.errs
    group = spec.obj("schedulingGroup")
    if group is not None:
        name = group.str("podGroupName")
        if not name:
            errs.append(f.required(group.at("podGroupName")))
        else:
            errs += names.validate_with(names.is_dns1123_subdomain, group.at("podGroupName"), name)
    ref = spec.obj("workloadRef")
    if ref is not None:
        for key in ("name", "podGroup"):
            value = ref.str(key)
            if not value:
                errs.append(f.required(ref.at(key)))
            else:
                check = names.is_dns1123_subdomain if key == "name" else names.is_dns1123_label
                errs += names.validate_with(check, ref.at(key), value)
        ref.str("podGroupReplicaKey")


def _resource_claims(spec: Obj) -> set[str]:
    errs = spec.errs
    found: set[str] = set()
    for claim in spec.objs("resourceClaims"):
        name = claim.str("name")
        if not name:
            errs.append(f.required(claim.at("name")))
        elif name in found:
            errs.append(f.duplicate(claim.at("name"), name))
        else:
            errs += names.validate_with(names.is_dns1123_label, claim.at("name"), name)
            found.add(name)
        by_name, by_template = claim.opt_str("resourceClaimName"), claim.opt_str("resourceClaimTemplateName")
        if by_name is not None and by_template is not None:
            errs.append(f.invalid(claim.path, f.OMIT,
                                  "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified"))
        if by_name is None and by_template is None:
            errs.append(f.invalid(claim.path, f.OMIT,
                                  "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"))
        for key, value in (("resourceClaimName", by_name), ("resourceClaimTemplateName", by_template)):
            if value is not None:
                errs += names.validate_with(names.is_dns1123_subdomain, claim.at(key), value)
    return found


def _ephemeral(spec: Obj, volumes: dict[str, str], claim_names: set[str], restart: str, host_users: bool,
               names_so_far: set[str]) -> None:
    errs = spec.errs
    others = set(names_so_far)
    taken = set(names_so_far)
    for c in spec.objs("ephemeralContainers"):
        ctr.validate_common(c, volumes, claim_names, restart, host_users)
        name = c.str("name")
        if name in taken:
            errs.append(f.duplicate(c.at("name"), name))
        else:
            taken.add(name)
        target = c.str("targetContainerName")
        if target and target not in others:
            errs.append(f.not_found(c.at("targetContainerName"), target))
        for key in ctr.EPHEMERAL_FORBIDDEN:
            if c.has(key) and c.data[key] not in ({}, []):
                errs.append(f.forbidden(c.at(key), "cannot be set for an Ephemeral Container"))
        for mount in c.objs("volumeMounts"):
            for key in ("subPath", "subPathExpr"):
                if mount.str(key):
                    errs.append(f.forbidden(mount.at(key), "cannot be set for an Ephemeral Container"))


def _host_network(spec: Obj) -> None:
    if not spec.bool("hostNetwork"):
        return
    for c in spec.objs("containers"):
        for port in c.objs("ports"):
            host, container = port.int("hostPort"), port.int("containerPort")
            if host != container:
                spec.errs.append(f.invalid(port.at("hostPort"), host, "must match `containerPort` when `hostNetwork` "
                                           "is true"))


def _pod_security_context(spec: Obj, sc: Obj | None) -> None:
    if sc is None:
        return
    errs = sc.errs
    for key in ("fsGroup", "runAsUser", "runAsGroup"):
        value = sc.opt_int(key, INT64)
        if value is not None:
            errs += [f.invalid(sc.at(key), value, m) for m in names.is_user_id(value)]
    for i, gid in enumerate(sc.ints("supplementalGroups", INT64)):
        errs += [f.invalid(sc.at("supplementalGroups").index(i), gid, m) for m in names.is_group_id(gid)]
    sc.opt_bool("runAsNonRoot")
    share = spec.opt_bool("shareProcessNamespace")
    if share and spec.bool("hostPID"):
        errs.append(f.invalid(spec.at("shareProcessNamespace"), share, "ShareProcessNamespace and HostPID cannot "
                              "both be enabled"))
    seen: set[str] = set()
    host_network, host_ipc = spec.bool("hostNetwork"), spec.bool("hostIPC")
    for s in sc.objs("sysctls"):
        name = s.str("name")
        s.str("value")
        if not name:
            errs.append(f.required(s.at("name")))
        elif len(name) > SYSCTL_MAX or not _SYSCTL.fullmatch(name):
            errs.append(f.invalid(s.at("name"), name, f"must have at most {SYSCTL_MAX} characters and match regex "
                                  f"{SYSCTL_REGEX}"))
        elif name in seen:
            errs.append(f.duplicate(s.at("name"), name))
        namespace = _sysctl_namespace(name)
        if host_network and namespace == "net":
            errs.append(f.invalid(s.at("name"), name, "may not be specified when 'hostNetwork' is true"))
        elif host_ipc and namespace == "ipc":
            errs.append(f.invalid(s.at("name"), name, "may not be specified when 'hostIPC' is true"))
        seen.add(name)
    for key, allowed in (("fsGroupChangePolicy", FS_GROUP_POLICIES),
                         ("supplementalGroupsPolicy", SUPPLEMENTAL_GROUPS_POLICIES),
                         ("seLinuxChangePolicy", SE_LINUX_CHANGE_POLICIES)):
        policy = sc.opt_str(key)
        if policy is not None and policy not in allowed:
            errs.append(f.not_supported(sc.at(key), policy, allowed))
    ctr.profile(sc.obj("seccompProfile"), "seccomp")
    ctr.profile(sc.obj("appArmorProfile"), "appArmor")


def _sysctl_namespace(name: str) -> str:
    """utilsysctl.GetNamespace: which namespace a sysctl belongs to (dots or slashes)."""
    name = name.replace("/", ".")
    if name.startswith("net."):
        return "net"
    if name.startswith(("kernel.shm", "kernel.msg", "fs.mqueue.")) or name == "kernel.sem":
        return "ipc"
    return ""


def _dns_config(spec: Obj, dns_policy: str) -> None:
    errs = spec.errs
    config = spec.obj("dnsConfig")
    if dns_policy == "None":
        if config is None:
            errs.append(f.required(spec.at("dnsConfig"), "must provide `dnsConfig` when `dnsPolicy` is None"))
            return
        if not config.items("nameservers"):
            errs.append(f.required(config.at("nameservers"), "must provide at least one DNS nameserver when "
                                   "`dnsPolicy` is None"))
            return
    if config is None:
        return
    servers = config.strs("nameservers")
    if len(servers) > MAX_DNS_NAMESERVERS:
        errs.append(f.invalid(config.at("nameservers"), f.OMIT,
                              f"must not have more than {MAX_DNS_NAMESERVERS} nameservers"))
    for i, server in enumerate(servers):
        errs += names.validate_ip(config.at("nameservers").index(i), server)
    searches = config.strs("searches")
    if len(searches) > MAX_DNS_SEARCH_PATHS:
        errs.append(f.invalid(config.at("searches"), f.OMIT,
                              f"must not have more than {MAX_DNS_SEARCH_PATHS} search paths"))
    if len(" ".join(searches)) > MAX_DNS_SEARCH_CHARS:
        errs.append(f.invalid(config.at("searches"), f.OMIT, f"must not have more than {MAX_DNS_SEARCH_CHARS} "
                              "characters (including spaces) in the search list"))
    for i, search in enumerate(searches):
        if search != ".":  # RelaxedDNSSearchValidation
            errs += names.validate_with(names.is_dns1123_subdomain_with_underscore,
                                        config.at("searches").index(i), search.removesuffix("."))
    for i, option in enumerate(config.objs("options")):
        if not option.str("name"):
            errs.append(f.required(config.at("options").index(i), "must not be empty"))
        option.opt_str("value")


def _tolerations(spec: Obj) -> None:
    errs = spec.errs
    for t in spec.objs("tolerations"):
        key, operator, value, effect = t.str("key"), t.str("operator"), t.str("value"), t.str("effect")
        seconds = t.opt_int("tolerationSeconds", INT64)
        if key:
            errs += names.validate_with(names.is_qualified_name, t.at("key"), key)
        if not key and operator != "Exists":
            errs.append(f.invalid(t.at("operator"), operator, "operator must be Exists when `key` is empty, which "
                                  "means \"match all values and all keys\""))
        if seconds is not None and effect != "NoExecute":
            errs.append(f.invalid(t.at("effect"), effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"))
        if operator in ("Equal", ""):
            msgs = names.is_label_value(value)
            if msgs:
                errs.append(f.invalid(t.at("operator"), value, ";".join(msgs)))
        elif operator == "Exists":
            if value:
                errs.append(f.invalid(t.at("operator"), value, "value must be empty when `operator` is 'Exists'"))
        else:
            errs.append(f.not_supported(t.at("operator"), operator, TOLERATION_OPERATORS))
        if effect and effect not in TAINT_EFFECTS:
            errs.append(f.not_supported(t.at("effect"), effect, TAINT_EFFECTS))


def _affinity(affinity: Obj) -> None:
    errs = affinity.errs
    node = affinity.obj("nodeAffinity")
    if node is not None:
        required = node.obj("requiredDuringSchedulingIgnoredDuringExecution")
        if required is not None:
            terms = required.objs("nodeSelectorTerms")
            if not required.items("nodeSelectorTerms"):
                errs.append(f.required(required.at("nodeSelectorTerms"), "must have at least one node selector term"))
            for term in terms:
                _node_selector_term(term)
        for pref in node.objs("preferredDuringSchedulingIgnoredDuringExecution"):
            weight = pref.int("weight")
            if not 1 <= weight <= 100:
                errs.append(f.invalid(pref.at("weight"), weight, "must be in the range 1-100"))
            preference = pref.obj("preference")
            if preference is not None:
                _node_selector_term(preference)
    # The scheduler's business: only their shape is checked here.
    affinity.obj("podAffinity")
    affinity.obj("podAntiAffinity")


def _node_selector_term(term: Obj) -> None:
    errs = term.errs
    for expr in term.objs("matchExpressions"):
        operator, values = expr.str("operator"), expr.strs("values")
        if operator in ("In", "NotIn"):
            if not values:
                errs.append(f.required(expr.at("values"), "must be specified when `operator` is 'In' or 'NotIn'"))
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                errs.append(f.forbidden(expr.at("values"), "may not be specified when `operator` is 'Exists' or "
                                        "'DoesNotExist'"))
        elif operator in ("Gt", "Lt"):
            if len(values) != 1:
                errs.append(f.required(expr.at("values"), "must be specified single value when `operator` is 'Lt' "
                                       "or 'Gt'"))
        else:
            errs.append(f.invalid(expr.at("operator"), operator, "not a valid selector operator"))
        errs += names.validate_with(names.is_qualified_name, expr.at("key"), expr.str("key"))
        for i, value in enumerate(values):
            errs += names.validate_with(names.is_label_value, expr.at("values").index(i), value)
    for expr in term.objs("matchFields"):
        operator, values = expr.str("operator"), expr.strs("values")
        if expr.str("key") != "metadata.name":
            errs.append(f.invalid(expr.at("key"), expr.str("key"), "not a valid field selector key"))
        if operator in ("In", "NotIn"):
            if len(values) != 1:
                errs.append(f.required(expr.at("values"), "must be only one value when `operator` is 'In' or "
                                       "'NotIn' for node field selector"))
        else:
            errs.append(f.invalid(expr.at("operator"), operator, "not a valid selector operator"))
