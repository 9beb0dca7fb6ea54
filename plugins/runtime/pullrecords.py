"""Which credentials pulled each image, so that a pod cannot use a private image only because
another pod's secret pulled it onto the node (the kubelet's KubeletEnsureSecretPulledImages,
beta and on by default since 1.35).

After every pull the agent records, per image ID and repository, what the pull used: no
credentials or the node's own (then every pod of the node may use the image:
``nodePodsAccessible``), or a pod's pull secret (its namespace, name, UID and a hash of the
credential). A pod whose image is already present (``IfNotPresent``, ``Never``) may use it
without a pull only when the record allows it: node-accessible, or one of the pod's own
matching pull secrets is the same secret (namespace, name, UID) or holds the same credential
(hash). Otherwise the image is pulled again with the pod's credentials (``Never``: the
kubelet's ErrImageNeverPull), and a success adds them to the record.

Which images are checked at all is ``imagePullCredentialsVerificationPolicy``, the kubelet's:
``NeverVerify``; ``NeverVerifyPreloadedImages`` (the default: images the agent never pulled,
e.g. imported into containerd, are not checked); ``NeverVerifyAllowlistedImages`` (images of
``preloadedImagesVerificationAllowlist`` are not checked: a repository, or a prefix ending
``/*``); ``AlwaysVerify``. A pull in progress is recorded as an intent first, so an image whose
pull was cut short by a restart counts as pulled by the agent.

Records live under ``<rootDir>/image_manager/`` (``pulled/`` and ``pulling/``, one JSON file
each, named by a hash), our own format. Records of images removed from the node are not pruned.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from nodeagent.imagenames import allowlist_pattern, without_tag_or_digest
from nodeagent.statefile import StateFileError, read_or_quarantine, write_atomic
from plugins.runtime.keyring import Credential

log = structlog.get_logger("nodeagent.runtime.pullrecords")

POLICIES = ("NeverVerify", "NeverVerifyPreloadedImages", "NeverVerifyAllowlistedImages", "AlwaysVerify")
DEFAULT_POLICY = "NeverVerifyPreloadedImages"


def credential_hash(credential: Credential) -> str:
    return hashlib.sha256(json.dumps({"username": credential.username, "password": credential.password},
                                     sort_keys=True).encode()).hexdigest()


def _secret_entry(credential: Credential) -> dict[str, str]:
    return {"uid": credential.uid, "namespace": credential.namespace, "name": credential.secret,
            "credentialHash": credential_hash(credential)}


class PullRecords:
    def __init__(self, directory: Path, policy: str = DEFAULT_POLICY, allowlist: Sequence[str] = ()) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown image pull credential verification policy: {policy}")
        self._pulled = directory / "pulled"
        self._pulling = directory / "pulling"
        self._policy = policy
        patterns = [allowlist_pattern(p) for p in allowlist]
        self._exact = {p for p, prefix in patterns if not prefix}
        self._prefixes = [p for p, prefix in patterns if prefix]
        self._intents: dict[str, int] = {}

    # --- pulls ---------------------------------------------------------------------------

    def intend(self, image: str) -> None:
        """A pull of ``image`` starts (persisted: a restart mid-pull still counts it)."""
        self._intents[image] = self._intents.get(image, 0) + 1
        _write(self._pulling / _name(image), {"image": image})

    def pulled(self, image: str, image_ref: str, used: Credential | None) -> None:
        """The pull succeeded with ``used`` (None: anonymously)."""
        self._add(image, image_ref, used)
        self._done(image)

    def failed(self, image: str) -> None:
        self._done(image)

    def _done(self, image: str) -> None:
        left = self._intents.get(image, 1) - 1
        if left > 0:
            self._intents[image] = left
            return
        self._intents.pop(image, None)
        (self._pulling / _name(image)).unlink(missing_ok=True)

    # --- the decision ------------------------------------------------------------------------

    async def must_pull(self, image: str, image_ref: str,
                        pod_credentials: Callable[[], Awaitable[Sequence[Credential]]]) -> bool:
        """Whether the pod must pull ``image`` (present as ``image_ref``) with its own credentials
        (``pod_credentials``: its pull secrets' credentials that match the image, read only when
        the record names secrets)."""
        record = _read(self._pulled / _name(image_ref))
        pulled_by_agent = record is not None or image in self._intents or (self._pulling / _name(image)).exists()
        if not self._verify(image, pulled_by_agent):
            return False
        if record is None:
            return True
        creds = record.get("credentialMapping", {}).get(without_tag_or_digest(image))
        if creds is None:
            return True
        if creds.get("nodePodsAccessible"):
            return False
        for credential in await pod_credentials():
            if credential.node:
                continue  # only the pod's own secrets count here (node credentials are in the record or not)
            entry = _secret_entry(credential)
            for cached in creds.get("kubernetesSecrets", []):
                same_secret = all(cached.get(k) == entry[k] for k in ("uid", "namespace", "name"))
                if cached.get("credentialHash") == entry["credentialHash"] or same_secret:
                    if not same_secret or cached.get("credentialHash") != entry["credentialHash"]:
                        self._add(image, image_ref, credential)  # another secret of the same credential
                    return False
        return True

    def _verify(self, image: str, pulled_by_agent: bool) -> bool:
        if self._policy == "NeverVerify":
            return False
        if self._policy == "NeverVerifyPreloadedImages":
            return pulled_by_agent
        if self._policy == "NeverVerifyAllowlistedImages":
            name = without_tag_or_digest(image)
            return not (name in self._exact or any(name.startswith(p) for p in self._prefixes))
        return True

    def _add(self, image: str, image_ref: str, used: Credential | None) -> None:
        path = self._pulled / _name(image_ref)
        record = _read(path) or {"imageRef": image_ref, "credentialMapping": {}}
        key = without_tag_or_digest(image)
        creds = record["credentialMapping"].setdefault(key, {})
        if creds.get("nodePodsAccessible"):
            return
        if used is None or used.node:
            record["credentialMapping"][key] = {"nodePodsAccessible": True}
        else:
            entry = _secret_entry(used)
            secrets = [s for s in creds.get("kubernetesSecrets", [])
                       if any(s.get(k) != entry[k] for k in ("uid", "namespace", "name"))]
            creds["kubernetesSecrets"] = [*secrets, entry]
        _write(path, record)


def _name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest() + ".json"


def _read(path: Path) -> dict[str, Any] | None:
    # A damaged record is as good as none (the image is verified, pulled, again); it is moved
    # aside for a human rather than overwritten.
    return read_or_quarantine(path, _parse_record, what="image pull record")


def _parse_record(raw: bytes) -> dict[str, Any]:
    data = json.loads(raw)
    if not isinstance(data, dict) or not isinstance(data.get("credentialMapping", {}), dict):
        raise StateFileError("not an image pull record")
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, sort_keys=True))
