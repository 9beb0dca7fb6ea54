"""Volumes and their mounts (ValidateVolumes, validateVolumeSource for the sources nodeagent
reads, ValidateVolumeMounts / ValidateVolumeDevices)."""

from __future__ import annotations

from decimal import Decimal

from nodeagent.validation import field as f
from nodeagent.validation import names
from nodeagent.validation.decode import INT64, Obj
from nodeagent.validation.field import Path

PULL_POLICIES = ("Always", "IfNotPresent", "Never")  # a container's imagePullPolicy too
FILE_MODE_ERROR = "must be a number between 0 and 0777 (octal), both inclusive"
# Every VolumeSource of core/v1 (exactly one per volume); the ones nodeagent does not implement
# are still counted, so "more than 1 volume type" holds for them too.
SOURCES = ("emptyDir", "hostPath", "gitRepo", "gcePersistentDisk", "awsElasticBlockStore", "secret", "nfs", "iscsi",
           "glusterfs", "flocker", "persistentVolumeClaim", "rbd", "cinder", "cephfs", "quobyte", "downwardAPI",
           "fc", "flexVolume", "configMap", "azureFile", "vsphereVolume", "photonPersistentDisk", "portworxVolume",
           "azureDisk", "storageos", "projected", "scaleIO", "csi", "ephemeral", "image")
_PVC_LIKE = frozenset({"persistentVolumeClaim", "ephemeral"})
_HOST_PATH_TYPES = ("", "BlockDevice", "CharDevice", "Directory", "DirectoryOrCreate", "File", "FileOrCreate",
                    "Socket")
_PROPAGATION = ("Bidirectional", "HostToContainer", "None")
_VOLUME_FIELD_PATHS = ("metadata.annotations", "metadata.labels", "metadata.name", "metadata.namespace",
                       "metadata.uid")
_CPU_DIVISORS = (Decimal("0.001"), Decimal(1))
_BYTE_DIVISORS = tuple(Decimal(1000**i) for i in range(7)) + tuple(Decimal(1024**i) for i in range(1, 7))
_RESOURCE_FIELD_PATHS = ("limits.cpu", "limits.ephemeral-storage", "limits.memory", "requests.cpu",
                         "requests.ephemeral-storage", "requests.memory")


def path_no_backsteps(value: str, path: Path) -> list[f.FieldError]:
    if ".." in value.replace("\\", "/").split("/"):
        return [f.invalid(path, value, "must not contain '..'")]
    return []


def local_descending_path(value: str, path: Path) -> list[f.FieldError]:
    errs = []
    if value.startswith("/"):
        errs.append(f.invalid(path, value, "must be a relative path"))
    return errs + path_no_backsteps(value, path)


def local_non_reserved_path(value: str, path: Path) -> list[f.FieldError]:
    errs = local_descending_path(value, path)
    if len(value) >= 2 and value.startswith(".."):
        errs.append(f.invalid(path, value, "must not start with '..'"))
    return errs


def _nul(value: str, path: Path) -> list[f.FieldError]:
    """Not an API rule: a path with a NUL byte cannot name a file (the kernel stops at the NUL)."""
    return [f.invalid(path, f.OMIT, "must not contain a NUL character")] if "\x00" in value else []


def _mode(obj: Obj, name: str) -> None:
    mode = obj.opt_int(name)
    if mode is not None and not 0 <= mode <= 0o777:
        obj.errs.append(f.invalid(obj.at(name), mode, FILE_MODE_ERROR))


def validate_volumes(spec: Obj) -> dict[str, str]:
    """The pod's volumes by name → source kind (for the mounts); errors go to ``spec.errs``."""
    errs = spec.errs
    out: dict[str, str] = {}
    seen: set[str] = set()
    for vol in spec.objs("volumes"):
        before = len(errs)
        kind = _source(vol)
        name = vol.str("name")
        if not name:
            errs.append(f.required(vol.at("name")))
        else:
            errs += names.validate_with(names.is_dns1123_label, vol.at("name"), name)
        if name in seen:
            errs.append(f.duplicate(vol.at("name"), name))
        seen.add(name)
        if len(errs) == before and kind is not None:
            out[name] = kind
    return out


def _source(vol: Obj) -> str | None:
    errs = vol.errs
    kind: str | None = None
    for source in SOURCES:
        if not vol.has(source):
            continue
        if kind is not None:
            errs.append(f.forbidden(vol.at(source), "may not specify more than 1 volume type"))
            continue
        kind = source
        obj = vol.obj(source)
        if obj is None:
            continue
        if source == "emptyDir":
            obj.str("medium")
            size = obj.quantity("sizeLimit")
            if size is not None and size < 0:
                errs.append(f.forbidden(obj.at("sizeLimit"), "SizeLimit field must be a valid resource quantity"))
        elif source == "hostPath":
            path = obj.str("path")
            if not path:
                errs.append(f.required(obj.at("path")))
            else:
                errs += path_no_backsteps(path, obj.at("path")) + _nul(path, obj.at("path"))
            kind_of = obj.str("type")
            if kind_of not in _HOST_PATH_TYPES:
                errs.append(f.not_supported(obj.at("type"), kind_of, _HOST_PATH_TYPES))
        elif source == "secret":
            name = obj.str("secretName")
            if not name:
                errs.append(f.required(obj.at("secretName")))
            _mode(obj, "defaultMode")
            _items(obj)
            obj.opt_bool("optional")
        elif source == "configMap":
            name = obj.str("name")
            if not name:
                errs.append(f.required(obj.at("name")))
            else:
                errs += names.validate_with(names.is_dns1123_subdomain, obj.at("name"), name)
            _mode(obj, "defaultMode")
            _items(obj)
            obj.opt_bool("optional")
        elif source == "downwardAPI":
            _mode(obj, "defaultMode")
            for item in obj.objs("items"):
                _downward_file(item)
        elif source == "projected":
            _projected(obj)
        elif source == "image":
            # validateImageVolumeSource (the API defaults pullPolicy; a static pod may leave it out)
            if not obj.str("reference"):
                errs.append(f.required(obj.at("reference")))
            pull = obj.opt_str("pullPolicy")
            if pull is not None and pull not in PULL_POLICIES:
                errs.append(f.not_supported(obj.at("pullPolicy"), pull, PULL_POLICIES))
    if kind is None:
        errs.append(f.required(vol.path, "must specify a volume type"))
    return kind


def _items(obj: Obj) -> None:
    for item in obj.objs("items"):
        key, path = item.str("key"), item.str("path")
        if not key:
            item.errs.append(f.required(item.at("key")))
        if not path:
            item.errs.append(f.required(item.at("path")))
        item.errs.extend(local_non_reserved_path(path, item.at("path")) + _nul(path, item.at("path")))
        _mode(item, "mode")


def _downward_file(item: Obj) -> None:
    errs = item.errs
    path = item.str("path")
    if not path:
        errs.append(f.required(item.at("path")))
    errs += local_non_reserved_path(path, item.at("path")) + _nul(path, item.at("path"))
    field_ref, resource_ref = item.obj("fieldRef"), item.obj("resourceFieldRef")
    if field_ref is not None:
        object_field_selector(field_ref, _VOLUME_FIELD_PATHS)
        if resource_ref is not None:
            errs.append(f.invalid(item.path, "resource", "fieldRef and resourceFieldRef can not be specified "
                                  "simultaneously"))
    elif resource_ref is not None:
        resource_field_selector(resource_ref, volume=True)
    else:
        errs.append(f.required(item.path, "one of fieldRef and resourceFieldRef is required"))
    _mode(item, "mode")


def object_field_selector(sel: Obj, expressions: tuple[str, ...]) -> None:
    errs = sel.errs
    api_version = sel.str("apiVersion", "v1")
    field_path = sel.str("fieldPath")
    if not api_version:
        errs.append(f.required(sel.at("apiVersion")))
        return
    if not field_path:
        errs.append(f.required(sel.at("fieldPath")))
        return
    if api_version != "v1":
        errs.append(f.invalid(sel.at("fieldPath"), field_path,
                              f"error converting fieldPath: unsupported version: {api_version[:64]}"))
        return
    base, subscript = split_subscript(field_path)
    if subscript is not None:
        if base == "metadata.annotations":
            errs += names.validate_with(names.is_qualified_name, sel.path, subscript.lower())
        elif base == "metadata.labels":
            errs += names.validate_with(names.is_qualified_name, sel.path, subscript)
        else:
            errs.append(f.invalid(sel.path, base, "does not support subscript"))
    elif field_path not in expressions:
        errs.append(f.not_supported(sel.at("fieldPath"), field_path, sorted(expressions)))


def split_subscript(field_path: str) -> tuple[str, str | None]:
    """``metadata.labels['app']`` → (``metadata.labels``, ``app``) (fieldpath.SplitMaybeSubscriptedPath)."""
    if not field_path.endswith("']"):
        return field_path, None
    head, sep, rest = field_path.partition("['")
    if not sep:
        return field_path, None
    return head, rest[:-2]


def resource_field_selector(sel: Obj, *, volume: bool) -> None:
    errs = sel.errs
    container, resource = sel.str("containerName"), sel.str("resource")
    if volume and not container:
        errs.append(f.required(sel.at("containerName")))
    elif not resource:
        errs.append(f.required(sel.at("resource")))
    elif resource not in _RESOURCE_FIELD_PATHS and not resource.startswith(("requests.hugepages-",
                                                                              "limits.hugepages-")):
        errs.append(f.not_supported(sel.at("resource"), resource, _RESOURCE_FIELD_PATHS))
    divisor = sel.quantity("divisor")
    if divisor is None or divisor == 0:
        return  # zero is unset: the default divisor 1
    if resource.endswith(".cpu"):
        if divisor not in _CPU_DIVISORS:
            errs.append(f.invalid(sel.at("divisor"), resource,
                                  "only divisor's values 1m and 1 are supported with the cpu resource"))
        return
    for suffix, what in ((".memory", "memory"), (".ephemeral-storage", "local ephemeral storage")):
        if resource.endswith(suffix) and divisor not in _BYTE_DIVISORS:
            errs.append(f.invalid(sel.at("divisor"), resource, "only divisor's values 1, 1k, 1M, 1G, 1T, 1P, 1E, "
                                  f"1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei are supported with the {what} resource"))
    if "hugepages-" in resource and divisor not in _BYTE_DIVISORS:
        errs.append(f.invalid(sel.at("divisor"), resource, "only divisor's values 1, 1k, 1M, 1G, 1T, 1P, 1E, "
                              "1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei are supported with the hugepages resource"))


def _projected(obj: Obj) -> None:
    errs = obj.errs
    _mode(obj, "defaultMode")
    paths: set[str] = set()
    for source in obj.objs("sources"):
        kinds = [k for k in ("secret", "downwardAPI", "configMap", "serviceAccountToken", "clusterTrustBundle",
                             "podCertificate") if source.has(k)]
        if not kinds:
            errs.append(f.required(source.path, "must specify exactly 1 projected volume type"))
        for extra in kinds[1:]:
            errs.append(f.forbidden(source.at(extra), "may not specify more than 1 volume type"))
        for kind in kinds[:1]:
            inner = source.obj(kind)
            if inner is None:
                continue
            if kind in ("secret", "configMap"):
                name = inner.str("name")
                if not name:
                    errs.append(f.required(inner.at("name")))
                for item in inner.objs("items"):
                    _items_one(item, paths)
                inner.opt_bool("optional")
            elif kind == "downwardAPI":
                for item in inner.objs("items"):
                    _downward_file(item)
                    _unique(item, paths)
            elif kind == "serviceAccountToken":
                inner.str("audience")
                seconds = inner.opt_int("expirationSeconds", INT64)
                if seconds is not None and seconds < 600:
                    errs.append(f.invalid(inner.at("expirationSeconds"), seconds,
                                          "may not specify a duration less than 10 minutes"))
                elif seconds is not None and seconds > 2**32:
                    errs.append(f.invalid(inner.at("expirationSeconds"), seconds,
                                          "may not specify a duration larger than 2^32 seconds"))
                path = inner.str("path")
                if not path:
                    errs.append(f.required(inner.at("path")))
                errs += local_non_reserved_path(path, inner.at("path")) + _nul(path, inner.at("path"))
                _unique(inner, paths)


def _items_one(item: Obj, paths: set[str]) -> None:
    errs = item.errs
    key, path = item.str("key"), item.str("path")
    if not key:
        errs.append(f.required(item.at("key")))
    if not path:
        errs.append(f.required(item.at("path")))
    errs += local_non_reserved_path(path, item.at("path")) + _nul(path, item.at("path"))
    _mode(item, "mode")
    _unique(item, paths)


def _unique(item: Obj, paths: set[str]) -> None:
    path = item.data.get("path")
    if isinstance(path, str) and path:
        if path in paths:
            item.errs.append(f.invalid(item.at("path"), path, "conflicting duplicate paths"))
        paths.add(path)


def validate_mounts(c: Obj, volumes: dict[str, str], privileged: bool) -> None:
    errs = c.errs
    mounts = c.objs("volumeMounts")
    devices = c.objs("volumeDevices")
    # Read twice (here and below): a type error is reported twice and deduplicated at the end.
    device_names = {d.str("name"): d.str("devicePath") for d in devices}
    mount_names = {m.str("name"): m.str("mountPath") for m in mounts}
    points: set[str] = set()
    for m in mounts:
        name, mount_path = m.str("name"), m.str("mountPath")
        m.opt_bool("readOnly")
        if not name:
            errs.append(f.required(m.at("name")))
        if name not in volumes:
            errs.append(f.not_found(m.at("name"), name))
        if not mount_path:
            errs.append(f.required(m.at("mountPath")))
        if mount_path in points:
            errs.append(f.invalid(m.at("mountPath"), mount_path, "must be unique"))
        points.add(mount_path)
        errs += _nul(mount_path, m.at("mountPath"))
        if name in device_names:
            errs.append(f.invalid(m.at("name"), name, "must not already exist in volumeDevices"))
        if mount_path in device_names.values():
            errs.append(f.invalid(m.at("mountPath"), mount_path, "must not already exist as a path in volumeDevices"))
        # Since 1.33 an image volume may be mounted by subPath too (the runtime mounts the
        # image's subdirectory: CRI Mount.image_sub_path).
        sub_path, sub_expr = m.str("subPath"), m.str("subPathExpr")
        # The API reports these two at volumeMounts.subPath (no index): kept, so messages match.
        if sub_path:
            errs += local_descending_path(sub_path, c.at("volumeMounts").child("subPath"))
            errs += _nul(sub_path, m.at("subPath"))
        if sub_expr:
            if sub_path:
                errs.append(f.invalid(m.at("subPathExpr"), sub_expr, "subPathExpr and subPath are mutually exclusive"))
            errs += local_descending_path(sub_expr, c.at("volumeMounts").child("subPathExpr"))
            errs += _nul(sub_expr, m.at("subPathExpr"))
        propagation = m.opt_str("mountPropagation")
        if propagation is not None:
            if propagation not in _PROPAGATION:
                errs.append(f.not_supported(c.at("volumeMounts").child("mountPropagation"), propagation,
                                            _PROPAGATION))
            elif propagation == "Bidirectional" and not privileged:
                errs.append(f.forbidden(c.at("volumeMounts").child("mountPropagation"),
                                        "Bidirectional mount propagation is available only to privileged containers"))
        rro = m.opt_str("recursiveReadOnly")
        if rro is not None and rro not in ("Disabled", "IfPossible", "Enabled"):
            errs.append(f.not_supported(c.at("volumeMounts").child("recursiveReadOnly"), rro,
                                        ["Disabled", "Enabled", "IfPossible"]))
    dev_paths: set[str] = set()
    dev_names: set[str] = set()
    for d in devices:
        name, dev_path = d.str("name"), d.str("devicePath")
        kind = volumes.get(name)
        if not name:
            errs.append(f.required(d.at("name")))
        if name in dev_names:
            errs.append(f.invalid(d.at("name"), name, "must be unique"))
        if kind is not None and kind not in _PVC_LIKE:
            errs.append(f.invalid(d.at("name"), name, "can only use volume source type of PersistentVolumeClaim or "
                                  "Ephemeral for block mode"))
        if kind is None:
            errs.append(f.not_found(d.at("name"), name))
        if not dev_path:
            errs.append(f.required(d.at("devicePath")))
        if dev_path in dev_paths:
            errs.append(f.invalid(d.at("devicePath"), dev_path, "must be unique"))
        if dev_path and path_no_backsteps(dev_path, d.at("devicePath")):
            errs.append(f.invalid(d.at("devicePath"), dev_path, "can not contain backsteps ('..')"))
        else:
            dev_paths.add(dev_path)
        if name in mount_names:
            errs.append(f.invalid(d.at("name"), name, "must not already exist in volumeMounts"))
        if dev_path in mount_names.values():
            errs.append(f.invalid(d.at("devicePath"), dev_path, "must not already exist as a path in volumeMounts"))
        if name:
            dev_names.add(name)
