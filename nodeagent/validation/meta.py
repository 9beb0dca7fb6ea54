"""ObjectMeta on create (apimachinery's ValidateObjectMeta, with the pod name rule)."""

from __future__ import annotations

from nodeagent.validation import field as f
from nodeagent.validation import names
from nodeagent.validation.decode import INT64, Obj


def validate_object_meta(meta: Obj, *, name_is_label: bool = False, namespaced: bool = True) -> None:
    """Names are DNS-1123 subdomains (``name_is_label``: labels), the namespace a DNS-1123 label
    (none at all for a cluster-scoped kind); labels, annotations, owner references and
    finalizers as the API has them. Errors go to ``meta.errs``."""
    errs = meta.errs
    name_check = names.is_dns1123_label if name_is_label else names.is_dns1123_subdomain
    generate_name = meta.str("generateName")
    if generate_name:
        # A prefix may end with a dash (the API masks it before checking).
        masked = generate_name[:-1] + "a" if generate_name.endswith("-") else generate_name
        errs += [f.invalid(meta.at("generateName"), generate_name, m) for m in name_check(masked)]
    name = meta.str("name")
    if not name:
        errs.append(f.required(meta.at("name"), "name or generateName is required"))
    else:
        errs += names.validate_with(name_check, meta.at("name"), name)
    namespace = meta.str("namespace")
    if not namespaced:
        if namespace:
            errs.append(f.forbidden(meta.at("namespace"), "not allowed on this type"))
    elif not namespace:
        errs.append(f.required(meta.at("namespace")))
    else:
        errs += names.validate_with(names.is_dns1123_label, meta.at("namespace"), namespace)
    uid = meta.str("uid")
    if uid:
        errs += names.validate_with(names.is_uid, meta.at("uid"), uid)
    generation = meta.int("generation", bits=INT64)
    if generation < 0:
        errs.append(f.invalid(meta.at("generation"), generation, "must be greater than or equal to 0"))
    errs += names.validate_labels(meta.str_map("labels"), meta.at("labels"))
    errs += names.validate_annotations(meta.str_map("annotations"), meta.at("annotations"))
    _owner_references(meta)
    for i, fin in enumerate(meta.strs("finalizers")):
        errs += names.validate_with(names.is_qualified_name, meta.at("finalizers").index(i), fin)


def _owner_references(meta: Obj) -> None:
    errs = meta.errs
    controller = ""
    for ref in meta.objs("ownerReferences"):
        api_version, kind, name, uid = ref.str("apiVersion"), ref.str("kind"), ref.str("name"), ref.str("uid")
        version = api_version.rsplit("/", 1)[-1] if api_version.count("/") <= 1 else ""
        if not version:
            errs.append(f.invalid(ref.at("apiVersion"), api_version, "version must not be empty"))
        if not kind:
            errs.append(f.invalid(ref.at("kind"), kind, "must not be empty"))
        if not name:
            errs.append(f.invalid(ref.at("name"), name, "must not be empty"))
        if not uid:
            errs.append(f.invalid(ref.at("uid"), uid, "must not be empty"))
        ref.opt_bool("blockOwnerDeletion")
        if ref.bool("controller"):
            current = f"{kind}/{name}"
            if controller:
                errs.append(f.invalid(meta.at("ownerReferences"), f.OMIT,
                                      "Only one reference can have Controller set to true. Found \"true\" in "
                                      f"references for {controller} and {current}"))
            else:
                controller = current
