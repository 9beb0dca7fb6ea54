"""Image pull secrets: the kubelet's keyring matching, the order in which the runtime stage tries
credentials, and a pull from agnhost's private fake registry with a real Secret, the real
control plane and the real containerd (the upstream "should be able to pull from private
registry with secret" test, with the registry as a host process on a free loopback port)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from controlplane import build as cpbuild
from cri import CriError
from cri import types as t
from devenv.images import build_pause
from nodeagent import imagenames
from nodeagent.clock import ManualClock
from nodeagent.events import Event, ImagePulled, PodRef
from nodeagent.model import Pod
from nodeagent.stages import Verdict
from plugins.apivolumes import api_fields
from plugins.runtime import nodekeyring, pullrecords
from plugins.runtime.events import PullSecretsUnavailable
from plugins.runtime.images import ImagePuller
from plugins.runtime.keyring import (
    Credential,
    Keyring,
    KeyringError,
    auths_of,
    decode_auth,
    keyring_key,
    repository,
    urls_match,
)
from tests.agent_helpers import pod_manifest, running_agent, wait_for
from tests.test_apivolumes import FakeApi, cluster_node

pytestmark = pytest.mark.anyio

PASSWORD = "pa55-w0rd-never-logged"
# How the runtime says the registry refused the pull: the registry's status (containerd 1.6,
# and 2.x with wrong credentials), or 2.x's error when the registry's 401 asks for basic
# auth and the pull carries no credentials at all.
REFUSED = ("401 Unauthorized", "authorization failed: no basic auth credentials")


def refused(message: str) -> bool:
    return any(text in message for text in REFUSED)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _dockerconfigjson(auths: dict[str, Any]) -> dict[str, str]:
    return {".dockerconfigjson": _b64(json.dumps({"auths": auths}))}


# --- the keyring: pure functions -----------------------------------------------------------


def test_repository_is_the_normalised_name_without_tag_or_digest() -> None:
    assert repository("busybox") == "docker.io/library/busybox"
    assert repository("busybox:1.36") == "docker.io/library/busybox"
    assert repository("someone/app@sha256:" + "a" * 64) == "docker.io/someone/app"
    assert repository("index.docker.io/someone/app:1") == "docker.io/someone/app"
    assert repository("localhost:5000/pause:testing") == "localhost:5000/pause"
    assert repository("localhost/pause") == "localhost/pause"
    assert repository("registry.k8s.io/e2e-test-images/agnhost:2.66.1") == "registry.k8s.io/e2e-test-images/agnhost"


def test_keys_are_urls_without_scheme_and_registry_api_prefix() -> None:
    assert keyring_key("localhost:5000") == "localhost:5000"
    assert keyring_key("https://index.docker.io/v1/") == "index.docker.io"
    assert keyring_key("http://registry.example.com/v2/team") == "registry.example.com/team"
    assert keyring_key("registry.example.com/") == "registry.example.com"
    assert keyring_key("user@registry.example.com:443/path") == "registry.example.com:443/path"
    assert keyring_key("registry.example.com:port") is None  # no URL: ignored, as the kubelet does


@pytest.mark.parametrize(("key", "repo", "matches"), [
    ("localhost:5000", "localhost:5000/pause", True),
    ("localhost:5000", "localhost:5001/pause", False),  # ports must be equal
    ("localhost", "localhost:5000/pause", False),
    ("registry.example.com", "registry.example.com/team/app", True),
    ("registry.example.com/team", "registry.example.com/team/app", True),  # path prefix
    ("registry.example.com/other", "registry.example.com/team/app", False),
    ("*.example.com", "registry.example.com/app", True),  # one label per *
    ("*.example.com", "example.com/app", False),  # label counts differ
    ("*.example.com", "a.b.example.com/app", False),
    ("*.*.example.com", "a.b.example.com/app", True),
    ("r?gistry.example.com", "registry.example.com/app", False),  # ? starts a URL's query
    ("r[a-f]gistry.example.com", "registry.example.com/app", True),
    ("r[^e]gistry.example.com", "registry.example.com/app", False),
    ("r[egistry.example.com", "registry.example.com/app", False),  # malformed glob: no match
    ("[a-z]egistry.example.com", "registry.example.com/app", False),  # [ first: an IPv6 literal to Go
    ("docker.io", "docker.io/library/busybox", True),
    ("index.docker.io", "docker.io/library/busybox", False),  # only through the default fallback
    ("[::1]:5000", "[::1]:5000/pause", True),
])
def test_urls_match_like_the_kubelets_keyring(key: str, repo: str, matches: bool) -> None:
    assert urls_match(key, repo) is matches


def test_auth_is_base64_user_colon_password_padded_or_not() -> None:
    assert decode_auth("dXNlcjpwYXNzd29yZA==") == ("user", "password")
    assert decode_auth("dXNlcjpwYXNzd29yZA") == ("user", "password")
    assert decode_auth(_b64("u:p:with:colons")) == ("u", "p:with:colons")
    with pytest.raises(KeyringError, match="must be formatted"):
        decode_auth(_b64("no-colon"))
    with pytest.raises(KeyringError, match="not valid base64"):
        decode_auth("!!!")


def test_auths_of_both_secret_types_and_nothing_else() -> None:
    json_auths = auths_of("kubernetes.io/dockerconfigjson", {".dockerconfigjson": json.dumps(
        {"auths": {"localhost:5000": {"auth": "dXNlcjpwYXNzd29yZA=="},
                   "other:1": {"username": "u", "password": "p"}}}).encode()}, "s1")
    assert json_auths == {"localhost:5000": Credential("user", "password", "s1"), "other:1": Credential("u", "p", "s1")}
    cfg_auths = auths_of("kubernetes.io/dockercfg",
                         {".dockercfg": json.dumps({"localhost:5000": {"Username": "u", "Password": "p",
                                                                       "auth": _b64("a:b")}}).encode()}, "s2")
    assert cfg_auths == {"localhost:5000": Credential("a", "b", "s2")}  # auth wins over username/password
    # Another type, or the right key under the wrong type: not a pull secret.
    assert auths_of("Opaque", {".dockerconfigjson": b"{}"}) is None
    assert auths_of("kubernetes.io/dockercfg", {".dockerconfigjson": b"{}"}) is None
    assert auths_of("kubernetes.io/dockerconfigjson", {".dockerconfigjson": b"{}"}) == {}
    with pytest.raises(KeyringError, match="not an object"):  # Go cannot unmarshal a list into the config
        auths_of("kubernetes.io/dockerconfigjson", {".dockerconfigjson": b"[]"}, "s")
    with pytest.raises(KeyringError) as caught:
        auths_of("kubernetes.io/dockerconfigjson",
                 {".dockerconfigjson": json.dumps({"auths": {"r": {"password": 7, "auth": PASSWORD}}}).encode()}, "s")
    assert PASSWORD not in str(caught.value)
    assert "password=" not in repr(Credential("u", PASSWORD)) and PASSWORD not in repr(Credential("u", PASSWORD))


def test_lookup_order_and_the_docker_hub_fallback() -> None:
    keyring = Keyring()
    keyring.add({"registry.example.com": Credential("host", "1", "a"),
                 "registry.example.com/team": Credential("team", "2", "a"),
                 "https://index.docker.io/v1/": Credential("hub", "3", "a")})
    keyring.add({"registry.example.com": Credential("host2", "4", "b")})
    # Every matching key, longest (reverse lexical) first; a key's credentials in secret order.
    assert [c.username for c in keyring.lookup("registry.example.com/team/app:1")] == ["team", "host", "host2"]
    assert [c.username for c in keyring.lookup("registry.example.com/app")] == ["host", "host2"]
    assert [c.username for c in keyring.lookup("busybox")] == ["hub"]
    assert [c.username for c in keyring.lookup("someone/app")] == ["hub"]
    assert keyring.lookup("localhost:5000/pause:testing") == []
    assert not Keyring() and keyring


# --- the runtime stage's pulls: which credentials, in which order, what is said ---------------


@dataclass
class FakeRuntime:
    accept: set[str | None]
    """Usernames whose pull succeeds (None: anonymous)."""
    pulls: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    async def image_status(self, image: str) -> Any:
        return None

    async def pull_image(self, image: str, sandbox_config: Any = None, auth: t.AuthConfig | None = None) -> str:
        user = auth.username if auth is not None else None
        self.pulls.append((image, user, auth.password if auth is not None else None))
        if user in self.accept:
            return "sha256:pulled"
        raise CriError("PullImage", "fake", None, f"401 Unauthorized for {user or 'anonymous'}")


class RecordingLog:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((level, event, kw))


@dataclass
class FakeStatus:
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)

    def container_waiting(self, container: str, reason: str, message: str = "") -> None:
        self.waiting[container] = (reason, message)


@dataclass
class PullContext:
    pod: Pod
    objects: Any
    """The shared fake store (tests/test_apivolumes.FakeApi)."""
    runtime: FakeRuntime
    clock: ManualClock = field(default_factory=ManualClock)
    status: FakeStatus = field(default_factory=FakeStatus)
    log: RecordingLog = field(default_factory=RecordingLog)
    events: list[Event] = field(default_factory=list)

    @property
    def ref(self) -> PodRef:
        return PodRef(uid=self.pod.uid, namespace=self.pod.metadata.namespace, name=self.pod.metadata.name)

    async def publish(self, event: Event) -> None:
        self.events.append(event)

    def everything_said(self) -> str:
        return repr((self.log.lines, self.status.waiting, [e.model_dump() for e in self.events]))


def _pull_pod(image: str, *secrets: str) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "image": image, "imagePullPolicy": "Always"}],
                 "imagePullSecrets": [{"name": s} for s in secrets]}})


SECRETS = {
    "Secret/first": {"type": "kubernetes.io/dockerconfigjson",
                     "data": _dockerconfigjson({"localhost:5000": {"auth": _b64(f"first:{PASSWORD}")}})},
    "Secret/second": {"type": "kubernetes.io/dockercfg",
                      "data": {".dockercfg": _b64(json.dumps({"http://localhost:5000/v2/": {
                          "username": "second", "password": PASSWORD}}))}},
    "Secret/elsewhere": {"type": "kubernetes.io/dockerconfigjson",
                         "data": _dockerconfigjson({"registry.example.com": {"auth": _b64("other:x")}})},
    "Secret/opaque": {"type": "Opaque", "data": _dockerconfigjson({"localhost:5000": {"auth": _b64("opaque:x")}})},
    "Secret/broken": {"type": "kubernetes.io/dockerconfigjson",
                      "data": _dockerconfigjson({"localhost:5000": {"auth": _b64(PASSWORD)}})},
}


async def _ensure(ctx: PullContext) -> tuple[str, Any]:
    return await ImagePuller.new().ensure(ctx, ctx.pod.spec.containers[0])  # type: ignore[arg-type]


async def test_each_matching_credential_is_tried_in_turn_until_one_pulls() -> None:
    pod = _pull_pod("localhost:5000/pause:testing", "elsewhere", "first", "opaque", "second")
    ctx = PullContext(pod, FakeApi(**SECRETS), FakeRuntime(accept={"second"}))
    ref, problem = await _ensure(ctx)
    assert (ref, problem) == ("sha256:pulled", None)
    # Only credentials for this registry, from pull secrets only, in secret order; no anonymous pull.
    assert [(user, password) for _, user, password in ctx.runtime.pulls] == [("first", PASSWORD), ("second", PASSWORD)]
    assert [type(e) for e in ctx.events] == [ImagePulled]
    assert PASSWORD not in ctx.everything_said()


async def test_failed_credentials_give_every_answer_and_no_anonymous_pull() -> None:
    pod = _pull_pod("localhost:5000/pause:testing", "first", "second")
    ctx = PullContext(pod, FakeApi(**SECRETS), FakeRuntime(accept={None}))
    ref, problem = await _ensure(ctx)
    assert ref == "" and problem.verdict == Verdict.RETRY and problem.reason == "ErrImagePull"
    assert [user for _, user, _ in ctx.runtime.pulls] == ["first", "second"]
    assert ctx.status.waiting["c"] == ("ErrImagePull", ('Failed to pull image "localhost:5000/pause:testing": '
                                       "[401 Unauthorized for first, 401 Unauthorized for second]"))
    assert not ctx.events  # every secret was read: no FailedToRetrieveImagePullSecret
    assert PASSWORD not in ctx.everything_said()


async def test_a_pods_pull_back_off_and_last_error_go_when_the_puller_forgets_the_pod() -> None:
    pod = _pull_pod("localhost:5000/pause:testing", "first")
    ctx = PullContext(pod, FakeApi(**SECRETS), FakeRuntime(accept={"nobody"}))
    puller = ImagePuller.new()
    container = pod.spec.containers[0]
    assert (await puller.ensure(ctx, container))[1].reason == "ErrImagePull"  # type: ignore[arg-type, union-attr]
    assert (await puller.ensure(ctx, container))[1].reason == "ImagePullBackOff"  # type: ignore[arg-type, union-attr]
    puller.forget("some-other-uid")
    assert (await puller.ensure(ctx, container))[1].reason == "ImagePullBackOff"  # type: ignore[arg-type, union-attr]
    puller.forget(pod.uid)
    assert not puller._last_failure and not puller._last_error and not puller.backoff.current(
        f"{pod.uid}_{container.image}")
    # Nothing of the failed pull is held against the pod any more: the next call pulls again.
    pulls = len(ctx.runtime.pulls)
    assert (await puller.ensure(ctx, container))[1].reason == "ErrImagePull"  # type: ignore[arg-type, union-attr]
    assert len(ctx.runtime.pulls) > pulls


async def test_no_matching_credential_pulls_anonymously() -> None:
    ctx = PullContext(_pull_pod("registry.k8s.io/pause:3.10", "first", "opaque"), FakeApi(**SECRETS),
                      FakeRuntime(accept={None}))
    assert (await _ensure(ctx))[0] == "sha256:pulled"
    assert ctx.runtime.pulls == [("registry.k8s.io/pause:3.10", None, None)]


async def test_a_missing_secret_is_warned_about_and_the_pull_goes_on() -> None:
    pod = _pull_pod("localhost:5000/pause:testing", "gone", "first", "")
    ctx = PullContext(pod, FakeApi(**SECRETS), FakeRuntime(accept=set()))
    _, problem = await _ensure(ctx)
    assert problem.reason == "ErrImagePull"
    assert [user for _, user, _ in ctx.runtime.pulls] == ["first"]
    assert ("warning", "Unable to retrieve pull secret, the image pull may not succeed.",
            {"secret": "ns/gone", "error": 'secret "gone" not found'}) in ctx.log.lines
    # The failed pull names the secrets that could not be read (the kubelet's event text).
    [event] = ctx.events
    assert isinstance(event, PullSecretsUnavailable)
    assert (event.container, event.secrets, event.reason, event.message) == (
        "c", ["gone"], "FailedToRetrieveImagePullSecret",
        "Unable to retrieve some image pull secrets (gone); attempting to pull the image may not succeed.")
    assert PASSWORD not in ctx.everything_said()

    # A successful pull says nothing about them; a secret nobody can read means an anonymous pull.
    ctx = PullContext(_pull_pod("localhost:5000/pause:testing", "gone"), FakeApi(), FakeRuntime(accept={None}))
    assert (await _ensure(ctx))[0] == "sha256:pulled"
    assert ctx.runtime.pulls == [("localhost:5000/pause:testing", None, None)]
    assert [type(e) for e in ctx.events] == [ImagePulled]


async def test_a_malformed_pull_secret_fails_the_pull_without_showing_it() -> None:
    ctx = PullContext(_pull_pod("localhost:5000/pause:testing", "first", "broken"), FakeApi(**SECRETS),
                      FakeRuntime(accept={"first"}))
    _, problem = await _ensure(ctx)
    assert problem.reason == "ErrImagePull" and ctx.runtime.pulls == []
    assert "must be formatted as base64(username:password)" in ctx.status.waiting["c"][1]
    assert PASSWORD not in ctx.everything_said()


# --- the node's own docker config --------------------------------------------------------------


def _config_json(auths: dict[str, Any]) -> str:
    return json.dumps({"auths": auths})


def _dirs(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    dirs = tuple(tmp_path / name for name in ("root", "cwd", "home", "fsroot"))
    for d in dirs:
        (d / ".docker").mkdir(parents=True)
    return dirs  # type: ignore[return-value]


def test_the_node_config_is_the_first_valid_file_in_the_kubelets_order(tmp_path: Path) -> None:
    root, cwd, home, fs_root = _dirs(tmp_path)
    entry = {"localhost:5000": {"auth": _b64(f"node:{PASSWORD}")}}
    keyring, path = nodekeyring.read(root, cwd, home, fs_root)
    assert path is None and not keyring
    # Legacy .dockercfg files only count when no config.json is valid.
    (fs_root / ".dockercfg").write_text(json.dumps({"localhost:5000": {"auth": _b64("legacy:x")}}))
    keyring, path = nodekeyring.read(root, cwd, home, fs_root)
    assert path == fs_root / ".dockercfg" and [c.username for c in keyring.lookup("localhost:5000/p")] == ["legacy"]
    (fs_root / ".docker" / "config.json").write_text(_config_json(entry))
    assert nodekeyring.read(root, cwd, home, fs_root)[1] == fs_root / ".docker" / "config.json"
    (home / ".docker" / "config.json").write_text(_config_json(entry))
    assert nodekeyring.read(root, cwd, home, fs_root)[1] == home / ".docker" / "config.json"
    (cwd / "config.json").write_text(_config_json(entry))
    assert nodekeyring.read(root, cwd, home, fs_root)[1] == cwd / "config.json"
    # An invalid file in the root directory is passed over, never fatal, never shown.
    (root / "config.json").write_text(_config_json({"localhost:5000": {"auth": _b64(PASSWORD)}}))
    keyring, path = nodekeyring.read(root, cwd, home, fs_root)
    assert path == cwd / "config.json"
    assert [(c.username, c.password) for c in keyring.lookup("localhost:5000/p")] == [("node", PASSWORD)]
    (root / "config.json").write_text(_config_json({"localhost:5000": {"username": "root", "password": "r"}}))
    assert nodekeyring.read(root, cwd, home, fs_root)[1] == root / "config.json"


async def test_node_credentials_follow_the_pods_secrets_and_are_reread_after_five_minutes(tmp_path: Path) -> None:
    root, cwd, home, fs_root = _dirs(tmp_path)
    clock = ManualClock()
    puller = ImagePuller.new(nodekeyring.NodeKeyring(root, clock.monotonic, cwd, home, fs_root))
    (root / "config.json").write_text(_config_json({"localhost:5000": {"username": "node", "password": PASSWORD}}))
    pod = _pull_pod("localhost:5000/pause:testing", "first")
    ctx = PullContext(pod, FakeApi(**SECRETS), FakeRuntime(accept={"node"}), clock=clock)
    ref, problem = await puller.ensure(ctx, pod.spec.containers[0])  # type: ignore[arg-type]
    assert (ref, problem) == ("sha256:pulled", None)
    assert [user for _, user, _ in ctx.runtime.pulls] == ["first", "node"]  # the pod's secret first
    assert PASSWORD not in ctx.everything_said()

    # Rotated on the node: the cached copy serves until five minutes have passed.
    (root / "config.json").write_text(_config_json({"localhost:5000": {"username": "rotated", "password": "x"}}))
    alone = _pull_pod("localhost:5000/pause:testing")
    ctx = PullContext(alone, FakeApi(), FakeRuntime(accept={"rotated"}), clock=clock)
    await puller.ensure(ctx, alone.spec.containers[0])  # type: ignore[arg-type]
    assert [user for _, user, _ in ctx.runtime.pulls] == ["node"]
    clock.advance(nodekeyring.CACHE_SECONDS + 20)  # past the image back-off too
    ctx = PullContext(alone, FakeApi(), FakeRuntime(accept={"rotated"}), clock=clock)
    assert (await puller.ensure(ctx, alone.spec.containers[0]))[0] == "sha256:pulled"  # type: ignore[arg-type]
    assert [user for _, user, _ in ctx.runtime.pulls] == ["rotated"]


# --- which credentials pulled an image (KubeletEnsureSecretPulledImages) -----------------------

S1 = Credential("user", "password", "s1", namespace="ns", uid="u-s1")
S1_COPY = Credential("user", "password", "copy", namespace="ns", uid="u-copy")  # same credential, another secret
S1_ROTATED = Credential("user", "rotated", "s1", namespace="ns", uid="u-s1")  # same secret, new password
OTHER = Credential("other", "x", "s2", namespace="ns", uid="u-s2")
IMAGE, REF = "localhost:5000/app:1", "sha256:app"


def _given(*creds: Credential) -> Any:
    async def pod_credentials() -> list[Credential]:
        return list(creds)
    return pod_credentials


async def test_a_present_image_pulled_with_a_secret_needs_that_secret_or_its_credential(tmp_path: Path) -> None:
    records = pullrecords.PullRecords(tmp_path)
    records.intend(IMAGE)
    records.pulled(IMAGE, REF, S1)
    assert not await records.must_pull(IMAGE, REF, _given(S1))
    assert not await records.must_pull("localhost:5000/app:2", REF, _given(S1))  # keyed by repository
    assert await records.must_pull(IMAGE, REF, _given())  # no secret: pull again, with the pod's credentials
    assert await records.must_pull(IMAGE, REF, _given(OTHER))
    assert not await records.must_pull(IMAGE, REF, _given(S1_COPY))  # the same credential in another secret
    assert not await records.must_pull(IMAGE, REF, _given(S1_ROTATED))  # the same secret, rotated
    # What was learnt is kept, across a restart too (a new PullRecords on the same directory).
    again = pullrecords.PullRecords(tmp_path)
    assert not await again.must_pull(IMAGE, REF, _given(S1_COPY))
    assert await again.must_pull(IMAGE, REF, _given())


async def test_anonymous_or_node_pulls_make_an_image_every_pods(tmp_path: Path) -> None:
    records = pullrecords.PullRecords(tmp_path)
    records.pulled(IMAGE, REF, S1)
    assert await records.must_pull(IMAGE, REF, _given())
    records.pulled(IMAGE, REF, None)  # pulled anonymously since: anyone may use it
    assert not await records.must_pull(IMAGE, REF, _given())
    node_only = pullrecords.PullRecords(tmp_path / "n")
    node_only.pulled(IMAGE, REF, Credential("node", "x", "/root/config.json", node=True))
    assert not await node_only.must_pull(IMAGE, REF, _given())


async def test_the_verification_policies(tmp_path: Path) -> None:
    preloaded = "docker.io/library/busybox:1.36"

    async def must(policy: str, image: str, allowlist: tuple[str, ...] = ()) -> bool:
        records = pullrecords.PullRecords(tmp_path / policy, policy, allowlist)
        return await records.must_pull(image, "sha256:x", _given())

    # Never pulled by the agent (imported into containerd): only AlwaysVerify checks it.
    assert not await must("NeverVerifyPreloadedImages", preloaded)
    assert await must("AlwaysVerify", preloaded)
    assert not await must("NeverVerify", preloaded)
    assert not await must("NeverVerifyAllowlistedImages", preloaded, ("docker.io/library/*",))
    assert not await must("NeverVerifyAllowlistedImages", preloaded, ("docker.io/library/busybox",))
    assert await must("NeverVerifyAllowlistedImages", preloaded, ("docker.io/library/nginx",))
    # A pull cut short (intent recorded, no record): counts as pulled by the agent.
    records = pullrecords.PullRecords(tmp_path / "cut")
    records.intend(IMAGE)
    assert await pullrecords.PullRecords(tmp_path / "cut").must_pull(IMAGE, REF, _given(S1))
    records.failed(IMAGE)
    assert not await pullrecords.PullRecords(tmp_path / "cut").must_pull(IMAGE, REF, _given(S1))


async def test_a_pull_cut_short_ends_its_intent(tmp_path: Path) -> None:
    class HangingRuntime(FakeRuntime):
        async def pull_image(self, image: str, sandbox_config: Any = None, auth: t.AuthConfig | None = None) -> str:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    records = pullrecords.PullRecords(tmp_path)
    puller = ImagePuller.new(records=records)
    pod = _pull_pod(IMAGE)
    ctx = PullContext(pod, FakeApi(), HangingRuntime(accept=set()))
    with anyio.move_on_after(0.1):
        await puller.ensure(ctx, pod.spec.containers[0])  # type: ignore[arg-type]
    assert list((tmp_path / "pulling").iterdir()) == []  # the pod went away mid-pull: no intent left


@pytest.mark.parametrize(("pattern", "error"), [
    ("registry.example.com/*", None), ("registry.example.com/app", None),
    (" registry.example.com/app", "leading/trailing spaces"), ("", "too short"), ("/*", "registry hostname"),
    ("*", "only patterns ending with '/*'"),
    ("registry.example.com/*/app", "only patterns ending with '/*'"),
    ("registry.example.com/app:1", "neither tag nor digest"),
])
def test_allowlist_patterns_are_validated_as_the_kubelet_does(pattern: str, error: str | None) -> None:
    if error is None:
        imagenames.allowlist_pattern(pattern)
    else:
        with pytest.raises(ValueError, match=re.escape(error)):
            imagenames.allowlist_pattern(pattern)


def test_standalone_reports_image_pull_secrets_as_needing_the_api() -> None:
    pod = _pull_pod("i", "a", "", "b")
    assert api_fields(pod) == ["spec.imagePullSecrets[0]", "spec.imagePullSecrets[2]"]


# --- against agnhost's private fake registry, the real control plane and containerd ----------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _registry_root(root: Path, agnhost: Path) -> None:
    """A root for ``chroot``: the static agnhost binary and /var/registry (its fake-registry-
    server's fixed directory) holding ``pause:testing``, made from our pause image: the tag file
    holds the manifest's digest, manifests and blobs sit at <sha256>/<2 hex>/<hex>/data."""
    shutil.copy2(agnhost, root / "agnhost")
    base = root / "var" / "registry" / "pause"
    with tarfile.open(build_pause().path) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        blobs = {"sha256:" + m.name.rsplit("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
                 for m in tar.getmembers() if m.isfile() and m.name.startswith("blobs/sha256/")}
    manifest = index["manifests"][0]["digest"]

    def put(kind: str, digest: str) -> None:
        hexd = digest.removeprefix("sha256:")
        path = base / kind / "sha256" / hexd[:2] / hexd / "data"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blobs[digest])

    put("manifests", manifest)
    for digest in blobs:
        if digest != manifest:
            put("blobs", digest)
    (base / "manifests" / "testing").write_text(manifest + "\n")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def private_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """agnhost fake-registry-server --private (user ``user``, password ``password``) as a host
    process on a free port; yields ``localhost:<port>`` (containerd speaks plain HTTP to it)."""
    cpbuild.build(["agnhost"])  # a second when built; on a fresh machine the e2e module's build
    agnhost = cpbuild.binary("agnhost")
    root = tmp_path_factory.mktemp("registry-root")
    _registry_root(root, agnhost)
    port = _free_port()
    log = (root.parent / "fake-registry.log").open("wb")
    server = subprocess.Popen(["chroot", str(root), "/agnhost", "fake-registry-server", "--private",
                               "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                if _status(f"http://127.0.0.1:{port}/v2/") == 401:
                    break
            except OSError:
                pass
            assert server.poll() is None, f"fake registry exited: see {log.name}"
            time.sleep(0.1)
        else:
            pytest.fail(f"fake registry did not answer on port {port}: see {log.name}")
        # It is private: only the test's credentials get the manifest.
        auth = urllib.request.Request(f"http://127.0.0.1:{port}/v2/pause/manifests/testing",
                                      headers={"Authorization": "Basic " + _b64("user:password")})
        assert _status(f"http://127.0.0.1:{port}/v2/pause/manifests/testing") == 401
        with urllib.request.urlopen(auth, timeout=2) as response:
            assert response.status == 200
        yield f"localhost:{port}"
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


async def test_a_static_pod_pulls_from_a_private_registry_with_the_nodes_docker_config(
        containerd: Any, tmp_path: Path, private_registry: str) -> None:
    # Standalone, a static pod has no pull secrets to read: the node's docker config in the
    # agent's root directory (the kubelet reads its root directory's config.json) is what lets it pull.
    root = tmp_path / "root"
    root.mkdir()
    (root / "config.json").write_text(_config_json({private_registry: {"auth": _b64("user:password")}}))
    async with running_agent(containerd, tmp_path) as env:
        env.write("private.yaml", pod_manifest("private", container={
            "image": f"{private_registry}/pause:testing", "command": ["/pause"], "imagePullPolicy": "Always"}))
        await env.wait_running("private", 90)


async def test_a_private_registry_pull_needs_the_pods_image_pull_secret(
        containerd: Any, control_plane: Any, tmp_path: Path, private_registry: str,
        capfd: pytest.CaptureFixture[str]) -> None:
    image = f"{private_registry}/pause:testing"
    async with cluster_node(containerd, control_plane, tmp_path) as node:
        good, wrong = f"pull-{node.name}", f"wrong-{node.name}"
        # e2eregistry.User1DockerSecret: the registry's address, auth = base64("user:password").
        await node.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": good},
                           "type": "kubernetes.io/dockerconfigjson",
                           "data": _dockerconfigjson({private_registry: {"auth": "dXNlcjpwYXNzd29yZA=="}})})
        await node.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": wrong},
                           "type": "kubernetes.io/dockerconfigjson",
                           "data": _dockerconfigjson({private_registry: {"username": "user",
                                                                         "password": PASSWORD}})})
        container = {"name": "image-pull-test", "image": image, "imagePullPolicy": "Always"}
        with_secret = await node.run_pod(f"with-{node.name}", container, restartPolicy="Never",
                                         imagePullSecrets=[{"name": good}])
        without = await node.run_pod(f"without-{node.name}", container, restartPolicy="Never")
        wrong_secret = await node.run_pod(f"wrongcreds-{node.name}", container, restartPolicy="Never",
                                          imagePullSecrets=[{"name": wrong}])

        async def phase(pod: dict[str, Any]) -> str:
            got = json.loads(await node.kubectl("get", "pod", pod["metadata"]["name"], "-o", "json"))
            return str(got.get("status", {}).get("phase", ""))

        await wait_for(lambda: node.running(with_secret["metadata"]["uid"], "image-pull-test"), 90,
                       "the container pulled with the secret running")
        await wait_for(lambda: _is(phase(with_secret), "Running"), 30, "phase Running in the API")

        for pod in (without, wrong_secret):
            name = pod["metadata"]["name"]
            waiting = await wait_for(lambda name=name: _pull_failed(node, name), 60, f"{name} failing to pull")
            assert refused(waiting["message"]), waiting
            assert PASSWORD not in waiting["message"]
            assert await phase(pod) == "Pending"
            assert not await node.running(pod["metadata"]["uid"], "image-pull-test")
        listed = await node.kubectl("get", "pods", "-o", "json")
        assert PASSWORD not in listed
        events = await node.kubectl("get", "events", "-o", "json")
        assert PASSWORD not in events
        out, err = capfd.readouterr()  # the agent's log
        assert "image pull failed" in err + out and PASSWORD not in err + out
    # The pulled image stays: it is our pause image, and CRI RemoveImage would delete every name
    # of it, the session's sandbox image too.


async def test_a_present_private_image_is_only_used_by_pods_with_its_credentials(
        containerd: Any, control_plane: Any, tmp_path: Path, private_registry: str) -> None:
    # KubeletEnsureSecretPulledImages: once a pod's secret has pulled a private image, another
    # pod on the node may use the present image only with a secret of the same credential.
    image = f"{private_registry}/pause:testing"
    async with cluster_node(containerd, control_plane, tmp_path) as node:
        # The image may be present already (another test pulled it): never RemoveImage it here.
        # It is our pause image re-served, and CRI RemoveImage removes every tag of the image ID,
        # registry.k8s.io/pause:3.10 (every sandbox's) among them.
        auth = {private_registry: {"auth": _b64("user:password")}}
        for name in (f"pull-{node.name}", f"copy-{node.name}"):
            await node.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                               "type": "kubernetes.io/dockerconfigjson", "data": _dockerconfigjson(auth)})
        container = {"name": "image-pull-test", "image": image, "imagePullPolicy": "IfNotPresent"}

        # Always: pulled with the secret whether present or not, so this agent records the pull.
        first = await node.run_pod(f"first-{node.name}", {**container, "imagePullPolicy": "Always"},
                                   imagePullSecrets=[{"name": f"pull-{node.name}"}])
        await wait_for(lambda: node.running(first["metadata"]["uid"], "image-pull-test"), 90, "the first pod running")

        # Present on the node, but this pod has no credential for it: pulled again, anonymously: 401.
        bare = await node.run_pod(f"bare-{node.name}", container)
        waiting = await wait_for(lambda: _pull_failed(node, bare["metadata"]["name"]), 60, "the bare pod refused")
        assert refused(waiting["message"]), waiting
        assert not await node.running(bare["metadata"]["uid"], "image-pull-test")
        never = await node.run_pod(f"never-{node.name}", {**container, "imagePullPolicy": "Never"})

        async def never_pull() -> dict[str, str] | None:
            got = await node.waiting(never["metadata"]["name"], "image-pull-test")
            return got if got.get("reason") == "ErrImageNeverPull" else None

        await wait_for(never_pull, 60, "the Never pod refused the present image")

        # Another secret holding the same credential: the present image is used, no pull.
        copy = await node.run_pod(f"copied-{node.name}", container, imagePullSecrets=[{"name": f"copy-{node.name}"}])
        await wait_for(lambda: node.running(copy["metadata"]["uid"], "image-pull-test"), 60, "the copy-secret pod")
        pulls = [e for e in node.env.agent.trace.chain(f"default/copied-{node.name}") if e["kind"] == "ImagePulled"]
        assert [e["already_present"] for e in pulls] == [True]


async def _is(value: Any, expected: str) -> bool:
    return await value == expected


async def _pull_failed(node: Any, pod: str) -> dict[str, str] | None:
    waiting = await node.waiting(pod, "image-pull-test")
    return waiting if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

