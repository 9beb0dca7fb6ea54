"""The manifest loader's bounds, the API server's validation as static pods get it, and what a
static pod ignores — without an agent (tests/test_agent_static.py and test_manifest_fuzz.py run
them through the real one)."""

from __future__ import annotations

import json
import re
import resource
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.model import Pod
from nodeagent.sources import manifest
from nodeagent.sources.manifest import HAVE_C_PARSER, Limits, ManifestError
from nodeagent.sources.staticpod import parse_documents
from nodeagent.validation import validate_pod_create

PARSERS = [pytest.param(False, id="libyaml"), pytest.param(True, id="python")]
SECRET = "hunter2-do-not-print"
NODE = "node1"


def load(text: str, pure: bool, limits: Limits = manifest.DEFAULT_LIMITS) -> list[Any]:
    return [d.value for d in manifest.load(text, "/m/f.yaml", limits, pure_python=pure)]


def refused(text: str, pure: bool, reason: str, match: str) -> ManifestError:
    with pytest.raises(ManifestError, match=match) as info:
        load(text, pure)
    assert info.value.reason == reason
    return info.value


def test_the_c_parser_is_there() -> None:
    assert HAVE_C_PARSER  # the suite runs both; the agent uses libyaml when it can


# --- the loader ----------------------------------------------------------------------------------


@pytest.mark.parametrize("pure", PARSERS)
def test_json_compatible_values_only(pure: bool) -> None:
    assert load("a: 1\nb: [x, 2.5, true, null]\nc: {d: e}\n", pure) == [
        {"a": 1, "b": ["x", 2.5, True, None], "c": {"d": "e"}}]
    # Untagged timestamps stay text (Go's YAML-to-JSON conversion does the same).
    assert load("t: 2024-01-01T00:00:00Z\nd: 2001-12-14\n", pure) == [{"t": "2024-01-01T00:00:00Z", "d": "2001-12-14"}]
    for tag in ("!!binary aGVsbG8=", "!!timestamp 2024-01-01", "!!set {a, b}", "!!python/object:os.system {}",
                "!!python/object/apply:os.system [echo]", "!!python/name:os.system", "!!omap [{a: 1}]", "!local x"):
        error = refused(f"a: {tag}\n", pure, "ManifestInvalid", r"^/m/f\.yaml: line 1, column 4: a: the tag .* is not "
                        r"allowed here")
        assert "aGVsbG8" not in str(error) and "echo" not in str(error)
    refused("a: .inf\n", pure, "ManifestInvalid", "a: a number must be finite")
    refused("a: .nan\n", pure, "ManifestInvalid", "a: a number must be finite")
    refused("a: 9223372036854775808\n", pure, "ManifestInvalid", "a: integer out of range")
    assert load("a: 9223372036854775807\n", pure) == [{"a": 2**63 - 1}]


@pytest.mark.parametrize("pure", PARSERS)
def test_keys_must_be_unique_strings(pure: bool) -> None:
    refused("metadata:\n  labels:\n    1: a\n", pure, "ManifestInvalid",
            r"line 3, column 5: metadata\.labels: a mapping key must be a string, not a number")
    refused("labels: {yes: a}\n", pure, "ManifestInvalid", "not a boolean")
    refused("? [a]\n: b\n", pure, "ManifestInvalid", "not a sequence")
    refused("a: 1\nb: 2\na: 3\n", pure, "ManifestInvalid", r"line 3, column 1: a: duplicate key")
    # YAML 1.1 merges: the mapping's own keys win.
    assert load("base: &b {x: 1, y: 2}\nm: {<<: *b, y: 3}\n", pure)[0]["m"] == {"x": 1, "y": 3}


@pytest.mark.parametrize("pure", PARSERS)
def test_a_billion_laughs_is_refused_early_and_cheaply(pure: bool) -> None:
    levels = [f"l0: &l0 [{', '.join(['lol'] * 10)}]"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]  # 10^10 nodes expanded
    bomb = "\n".join(levels) + "\n"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    begin = time.process_time()
    refused(bomb, pure, "ManifestTooLarge", r"more than 200000 nodes \(with every alias expanded\)")
    assert time.process_time() - begin < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 100 * 1024  # KiB
    refused("a: &a [x, *a]\n", pure, "ManifestMalformed", "alias to an unknown or enclosing anchor")
    refused("a: *nowhere\n", pure, "ManifestMalformed", "alias to an unknown or enclosing anchor")
    many = "a: &a x\nb: [" + ", ".join(["*a"] * 1001) + "]\n"
    refused(many, pure, "ManifestTooLarge", "more than 1000 aliases")
    big = "a: &a '" + "x" * 2_000_000 + "'\nb: [*a, *a, *a, *a, *a, *a]\n"
    refused(big, pure, "ManifestTooLarge", "bytes of text")


@pytest.mark.parametrize("pure", PARSERS)
def test_depth_and_documents_are_bounded(pure: bool) -> None:
    assert load("a: " + "[" * 63 + "]" * 63 + "\n", pure)
    refused("a: " + "[" * 64 + "]" * 64 + "\n", pure, "ManifestTooLarge", "nested more than 64 levels deep")
    refused("[" * 100_000 + "]" * 100_000, pure, "ManifestTooLarge", "nested more than 64 levels deep")
    refused("{a: " * 70 + "1" + "}" * 70, pure, "ManifestTooLarge", "nested more than 64 levels deep")
    refused("a: 1\n---\n" * 101, pure, "ManifestTooLarge", "more than 100 documents")
    with pytest.raises(ManifestError) as info:
        manifest.load(b"x" * (manifest.MAX_MANIFEST_BYTES + 1), "/m/f.yaml")
    assert info.value.reason == "ManifestTooLarge"


@pytest.mark.parametrize("pure", PARSERS)
def test_syntax_errors_name_the_place_not_the_text(pure: bool) -> None:
    error = refused(f"a:\n  b: {{c: {SECRET}\n", pure, "ManifestMalformed", r"^/m/f\.yaml: line 3, column 1: not valid "
                    "YAML or JSON")
    assert SECRET not in str(error)
    error = refused(f"a:\n\tb: '{SECRET}'\n", pure, "ManifestMalformed", "line 2, column 1")
    assert SECRET not in str(error)
    with pytest.raises(ManifestError, match=r"line 2: not valid UTF-8"):
        manifest.load(b"a: 1\nb: \xff\n", "/m/f.yaml")


def test_json_files_are_json() -> None:
    # Python's json writes an emoji as a surrogate pair, which YAML 1.1 cannot read.
    doc = {"a": "😀", "b": [1, {"c": None}]}
    assert [d.value for d in manifest.load(json.dumps(doc), "f")] == [doc]
    assert [d.value for d in manifest.load(json.dumps(doc) + "\n---\n" + json.dumps(doc), "f")] == [doc, doc]
    with pytest.raises(ManifestError, match='duplicate key "a"'):
        manifest.load('{"a": 1, "a": 2}', "f")
    with pytest.raises(ManifestError, match="must be finite"):
        manifest.load('{"a": NaN}', "f")
    with pytest.raises(ManifestError, match="lone surrogate"):
        manifest.load('{"a": "\\ud800"}', "f")
    with pytest.raises(ManifestError, match="nested more than 64"):
        manifest.load('{"a": ' + "[" * 70 + "]" * 70 + "}", "f")
    # Errors in JSON have their line and column too (the second document starts on line 3).
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
           "spec": {"containers": [{"name": "a", "image": "b", "ports": [{"containerPort": 0}]}]}}
    with pytest.raises(ManifestError, match=r"^/m/f\.yaml \(document 2\): line 3, column \d+: spec\.containers\[0\]"
                                            r"\.ports\[0\]\.containerPort: Required value$"):
        parse_documents(Path("/m/f.yaml"), json.dumps(pod()) + "\n---\n" + json.dumps(bad), NODE, 0.0)


# --- the API server's validation -----------------------------------------------------------------


def pod(**spec: Any) -> dict[str, Any]:
    metadata = spec.pop("metadata", {"name": "web"})
    container = {"name": "main", "image": "busybox", **spec.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [container], **spec}}


def errors_of(doc: dict[str, Any]) -> list[str]:
    try:
        parse_documents(Path("/m/f.yaml"), json.dumps(doc), NODE, 0.0)
    except ManifestError as exc:
        assert exc.reason == "ManifestInvalid"
        # Each part names the place first (file, then line and column): the field error follows.
        return [re.sub(r"^/m/f\.yaml(?: \(document \d+\))?(?:: line \d+, column \d+)?: ", "", part)
                for part in str(exc).split("; ")]
    return []


def test_field_errors_are_worded_and_placed_as_the_api_server_does() -> None:
    doc = pod(container={"ports": [{"containerPort": 80}, {"containerPort": 70000, "protocol": "QUIC"}]})
    assert errors_of(doc) == [
        "spec.containers[0].ports[1].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
        'spec.containers[0].ports[1].protocol: Unsupported value: "QUIC": supported values: "SCTP", "TCP", "UDP"',
    ]
    text = yaml.safe_dump(doc)
    with pytest.raises(ManifestError) as info:
        parse_documents(Path("/m/f.yaml"), text, NODE, 0.0)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "70000" in t)
    assert str(info.value).startswith(f"/m/f.yaml: line {line}, column ")


def test_names_with_the_node_suffix() -> None:
    assert errors_of(pod(metadata={"name": "a" * 247})) == []  # 247 + "-node1" = 253
    [error] = errors_of(pod(metadata={"name": "a" * 248}))
    assert error.startswith('metadata.name: Invalid value: "aaaa') and error.endswith("must be no more than 253 "
                                                                                      "characters")
    assert errors_of(pod(metadata={"name": "Web"}))[0].startswith('metadata.name: Invalid value: "Web-node1": a '
                                                                 "lowercase RFC 1123 subdomain")
    assert errors_of(pod(metadata={})) == ["metadata.name: Required value: name or generateName is required"]
    assert errors_of(pod(metadata={"name": "web", "namespace": "a.b"})) == [
        'metadata.namespace: Invalid value: "a.b": must not contain dots']
    assert errors_of(pod(metadata={"name": "web", "namespace": "x" * 64}))[0].endswith("must be no more than 63 "
                                                                                        "characters")
    # A UID names directories: a given one must be a plain token.
    for uid in ("../../etc", "a/b", "x" * 65, "a\x00b"):
        assert errors_of(pod(metadata={"name": "web", "uid": uid}))[0].startswith("metadata.uid: Invalid value: ")
    assert errors_of(pod(metadata={"name": "web", "uid": "0b5d7c3e-1111-4222-8333-944455556666"})) == []


def test_containers() -> None:
    doc = pod(initContainers=[{"name": "main", "image": "b"}], container={"name": "Main_1"})
    assert errors_of(doc) == [
        ('spec.containers[0].name: Invalid value: "Main_1": a lowercase RFC 1123 label must consist of lower case '
        "alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
        "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")]
    doc = pod(initContainers=[{"name": "main", "image": "b"}])
    assert errors_of(doc) == ['spec.initContainers[0].name: Duplicate value: "main"']
    doc["spec"]["containers"].append({"name": "main", "image": "c"})
    assert 'spec.containers[1].name: Duplicate value: "main"' in errors_of(doc)
    assert errors_of(pod(container={"image": ""})) == ["spec.containers[0].image: Required value"]
    assert errors_of(pod(container={"name": ""})) == ["spec.containers[0].name: Required value"]
    assert errors_of(pod(ephemeralContainers=[{"name": "dbg", "image": "b"}])) == [
        "spec.ephemeralContainers: Forbidden: cannot be set on create"]
    assert errors_of(pod(containers=[])) == ["spec.containers: Required value"]


def test_resources() -> None:
    limits = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert errors_of(pod(container={"resources": limits})) == [
        'spec.containers[0].resources.requests: Invalid value: "2": must be less than or equal to cpu limit of 1']
    assert errors_of(pod(container={"resources": {"limits": {"cpu": "lots"}}})) == [
        ("spec.containers[0].resources.limits[cpu]: Invalid value: quantities must match the regular expression "
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    assert errors_of(pod(container={"resources": {"limits": {"memory": "-1"}}})) == [
        'spec.containers[0].resources.limits[memory]: Invalid value: "-1": must be greater than or equal to 0']
    assert errors_of(pod(container={"resources": {"requests": {"example.com/gpu": "1"}}})) == [
        "spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources"]
    assert errors_of(pod(container={"resources": {"limits": {"gpu": "1"}}})) == [
        ('spec.containers[0].resources.limits[gpu]: Invalid value: "gpu": must be a standard resource type or fully '
        "qualified"),
        'spec.containers[0].resources.limits[gpu]: Invalid value: "gpu": must be a standard resource for containers']
    assert errors_of(pod(container={"resources": {"limits": {"cpu": "1e999999999"}}}))  # not a billion digits


def test_ports_probes_lifecycle_grace() -> None:
    assert errors_of(pod(container={"ports": [{"containerPort": 80, "name": "HTTP"}, {"containerPort": 81,
                                                                                      "name": "http-too-long-name"}]}))
    assert errors_of(pod(terminationGracePeriodSeconds=-1)) == [
        "spec.terminationGracePeriodSeconds: Invalid value: -1: must be greater than or equal to 0"]
    probe = {"exec": {"command": ["true"]}, "httpGet": {"port": 99999}, "periodSeconds": -1, "successThreshold": 2}
    assert errors_of(pod(container={"livenessProbe": probe})) == [
        "spec.containers[0].livenessProbe.httpGet: Forbidden: may not specify more than 1 handler type",
        "spec.containers[0].livenessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
        "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1"]
    assert errors_of(pod(container={"readinessProbe": {"tcpSocket": {"port": "no_such"}}}))[0].startswith(
        'spec.containers[0].readinessProbe.tcpSocket.port: Invalid value: "no_such": ')
    assert errors_of(pod(terminationGracePeriodSeconds=5, container={"lifecycle": {"preStop": {"sleep": {
        "seconds": 10}}}})) == [("spec.containers[0].lifecycle.preStop.sleep: Invalid value: 10: must be non-negative "
                                "and less than terminationGracePeriodSeconds (5)")]
    assert errors_of(pod(restartPolicy="Sometimes")) == [
        'spec.restartPolicy: Unsupported value: "Sometimes": supported values: "Always", "OnFailure", "Never"']


def test_volumes_and_mounts() -> None:
    doc = pod(volumes=[{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}, {"name": "B", "hostPath": {
        "path": "/x"}}, {"name": "c"}, {"name": "d", "emptyDir": {}, "hostPath": {"path": "/y"}}],
        container={"volumeMounts": [{"name": "nope", "mountPath": "/m"}, {"name": "a", "mountPath": "/m",
                                                                          "subPath": "../../etc"}]})
    assert errors_of(doc) == [
        'spec.volumes[1].name: Duplicate value: "a"',
        ('spec.volumes[2].name: Invalid value: "B": a lowercase RFC 1123 label must consist of lower case alphanumeric '
        "characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
        "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
        "spec.volumes[3]: Required value: must specify a volume type",
        "spec.volumes[4].hostPath: Forbidden: may not specify more than 1 volume type",
        'spec.containers[0].volumeMounts[0].name: Not found: "nope"',
        'spec.containers[0].volumeMounts[1].mountPath: Invalid value: "/m": must be unique',
        "spec.containers[0].volumeMounts.subPath: Invalid value: \"../../etc\": must not contain '..'"]
    assert errors_of(pod(volumes=[{"name": "h", "hostPath": {"path": "/a/../../etc"}}])) == [
        "spec.volumes[0].hostPath.path: Invalid value: \"/a/../../etc\": must not contain '..'"]
    item = {"path": "../x", "fieldRef": {"fieldPath": "metadata.labels"}}
    assert errors_of(pod(volumes=[{"name": "d", "downwardAPI": {"items": [item], "defaultMode": 0o1000}}])) == [
        ("spec.volumes[0].downwardAPI.defaultMode: Invalid value: 512: must be a number between 0 and 0777 (octal), "
        "both inclusive"),
        "spec.volumes[0].downwardAPI.items[0].path: Invalid value: \"../x\": must not contain '..'",
        "spec.volumes[0].downwardAPI.items[0].path: Invalid value: \"../x\": must not start with '..'"]



def test_image_volumes() -> None:
    # validateImageVolumeSource; since 1.33 subPath (and subPathExpr) may name a directory of the image
    assert errors_of(pod(volumes=[{"name": "i", "image": {"reference": "kitten:1.8", "pullPolicy": "Always"}}],
                         container={"volumeMounts": [{"name": "i", "mountPath": "/v", "subPath": "etc"}]})) == []
    assert errors_of(pod(volumes=[{"name": "i", "image": {"pullPolicy": "Sometimes"}}])) == [
        "spec.volumes[0].image.reference: Required value",
        'spec.volumes[0].image.pullPolicy: Unsupported value: "Sometimes": supported values: "Always", '
        '"IfNotPresent", "Never"']

def test_env_labels_annotations() -> None:
    doc = pod(metadata={"name": "web", "labels": {"a b": "c"}, "annotations": {"x": "y" * (256 * 1024)}},
              container={"env": [{"name": "A=B", "value": SECRET}, {"name": "", "value": SECRET}]})
    errors = errors_of(doc)
    assert errors == [
        ('metadata.labels: Invalid value: "a b": name part must consist of alphanumeric characters, \'-\', \'_\' or '
        "'.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', "
        "regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"),
        "metadata.annotations: Too long: may not be more than 262144 bytes",
        ('spec.containers[0].env[0].name: Invalid value: "A=B": a valid environment variable name must consist only '
        "of printable ASCII characters other than '='"),
        "spec.containers[0].env[1].name: Required value"]
    assert not any(SECRET in e for e in errors)


def test_wrong_types_are_named_never_shown() -> None:
    doc = pod(container={"env": [{"name": "A", "value": 123}], "ports": [{"containerPort": "80"}],
                         "command": "sh -c " + SECRET})
    errors = errors_of(doc)
    assert errors == [
        'spec.containers[0].command: Invalid value: "string": must be of type array',
        'spec.containers[0].ports[0].containerPort: Invalid value: "string": must be of type integer',
        "spec.containers[0].ports[0].containerPort: Required value",
        'spec.containers[0].env[0].value: Invalid value: "integer": must be of type string']
    assert errors_of(pod(container={"ports": [{"containerPort": 2**40}]})) == [
        "spec.containers[0].ports[0].containerPort: Invalid value: 1099511627776: must fit in a 32-bit integer",
        "spec.containers[0].ports[0].containerPort: Required value"]


def test_validation_is_usable_on_its_own() -> None:
    # The API source could use it too: a pod as the API has it (name already final).
    assert validate_pod_create({"metadata": {"name": "web", "namespace": "default"},
                                "spec": {"containers": [{"name": "main", "image": "busybox"}]}}) == []


# --- what a static pod ignores -------------------------------------------------------------------

KUBECTL_COPY = """\
apiVersion: v1
kind: Pod
metadata:
  creationTimestamp: "2024-05-01T10:00:00Z"
  deletionTimestamp: 2024-05-02T10:00:00Z
  deletionGracePeriodSeconds: 30
  generation: 1
  labels: {app: web}
  managedFields:
  - {manager: kubectl-run, operation: Update, time: 2024-05-01T10:00:00Z, fieldsType: FieldsV1, fieldsV1: {}}
  name: web
  namespace: default
  ownerReferences:
  - {apiVersion: apps/v1, kind: ReplicaSet, name: web-5d4f, uid: 6f0c3a2e-9b1d-4e7a-8c2f-1a2b3c4d5e6f, controller: true}
  resourceVersion: "123456"
  selfLink: /api/v1/namespaces/default/pods/web
  uid: 0b5d7c3e-1111-4222-8333-944455556666
spec:
  containers:
  - image: busybox
    name: main
    resources: {}
    terminationMessagePath: /dev/termination-log
    terminationMessagePolicy: File
  dnsPolicy: ClusterFirst
  nodeName: other-node
  restartPolicy: Always
  terminationGracePeriodSeconds: 30
status:
  conditions:
  - {lastProbeTime: null, lastTransitionTime: 2024-05-01T10:00:00Z, status: "True", type: Ready}
  containerStatuses:
  - containerID: containerd://abc
    image: busybox
    lastState: {}
    name: main
    ready: true
    restartCount: 3
    started: true
    state:
      running: {startedAt: 2024-05-01T10:00:01Z}
  phase: Running
  podIP: 10.244.0.5
  startTime: 2024-05-01T10:00:00Z
"""


def test_a_kubectl_copy_is_a_static_pod() -> None:
    [p], _ = parse_documents(Path("/m/web.yaml"), KUBECTL_COPY, NODE, 0.0)
    meta = p["metadata"]
    assert "status" not in p
    for key in ("resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                "generation", "managedFields", "selfLink"):
        assert key not in meta, key
    # The copied UID is the API pod's (which may run here too): derived from the content instead.
    assert meta["uid"] != "0b5d7c3e-1111-4222-8333-944455556666" and len(meta["uid"]) == 32
    assert meta["name"] == "web-node1" and p["spec"]["nodeName"] == NODE
    model = Pod.model_validate(p)
    assert model.metadata.deletion_timestamp is None and model.status == {}
    # A UID written by hand (no resourceVersion) is the pod's, as the kubelet has it.
    [p], _ = parse_documents(Path("/m/web.yaml"), json.dumps(pod(metadata={"name": "web", "uid": "my-uid-1"})),
                             NODE, 0.0)
    assert p["metadata"]["uid"] == "my-uid-1"


# --- the model and quantities: the last line of defence (any source) ------------------------------


def test_quantities_that_cannot_be_bounded_are_refused() -> None:
    from nodeagent import quantity

    begin = time.process_time()
    for text in ("1e999999999", "9" * 40, "1e31"):
        with pytest.raises(ValueError):
            quantity.parse(text)  # before: decimal.Overflow, or a billion-digit integer in milli_cpu
    assert time.process_time() - begin < 1
    assert quantity.milli_cpu("1e3") == 1_000_000 and quantity.bytes_("1Ei") == 2**60


def test_the_model_refuses_what_the_stages_cannot_read() -> None:
    from pydantic import ValidationError

    base = {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "a", "image": "b"}]}}

    def with_spec(**spec: Any) -> dict[str, Any]:
        return {**base, "spec": {**base["spec"], **spec}}

    bad_limit = with_spec(containers=[{"name": "a", "image": "b", "resources": {"limits": {"cpu": "OnFailure"}}}])
    with pytest.raises(ValidationError, match="not a valid quantity"):
        Pod.model_validate(bad_limit)  # before: the status writer's qosClass raised, and the agent stopped
    bad_affinity = with_spec(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [True]}}})
    with pytest.raises(ValidationError, match="not a valid node affinity"):
        Pod.model_validate(bad_affinity)  # before: admission raised AttributeError
    Pod.model_validate(with_spec(affinity={"podAntiAffinity": {"anything": 1}, "nodeAffinity": None}))


def test_empty_namespace_and_uid_are_defaulted_as_the_kubelet_does() -> None:
    [p], _ = parse_documents(Path("/m/a.yaml"), json.dumps(pod(metadata={"name": "a", "namespace": "", "uid": ""})),
                             NODE, 0.0)
    assert p["metadata"]["namespace"] == "default" and len(p["metadata"]["uid"]) == 32
    assert errors_of(pod(metadata={"name": "a", "namespace": 0, "uid": 0})) == [
        'metadata.namespace: Invalid value: "integer": must be of type string',
        "metadata.namespace: Required value",
        'metadata.uid: Invalid value: "integer": must be of type string']
