"""Images of the memory runtime: a local store (what is pulled) and a registry (what can be).

Names are normalised as containerd's reference docker parser does (``busybox`` is
``docker.io/library/busybox:latest``); an image is known by its ID (``sha256:<64 hex>``), by a
unique prefix of it, by any of its tags and by its repo digest, as containerd's CRI
``localResolve`` finds them. Pulling a name the registry does not have fails with containerd's
words and code (NotFound), a name that needs credentials fails without the right ones as a
registry's 401 does (Unknown: ``pull access denied``), and removing an image removes every tag
of its ID (which is what containerd does to ``RemoveImage`` of one tag).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

DEFAULT_DOMAIN = "docker.io"
OFFICIAL_PREFIX = "library/"


def normalise(ref: str) -> str:
    """``busybox`` → ``docker.io/library/busybox:latest``; digests and full names stay."""
    name, digest = (ref.split("@", 1) + [""])[:2]
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        domain, path = DEFAULT_DOMAIN, name
    else:
        domain, path = first, rest
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = OFFICIAL_PREFIX + path
    full = f"{domain}/{path}"
    if digest:
        return f"{full}@{digest}"
    last = full.rsplit("/", 1)[-1]
    return full if ":" in last else f"{full}:latest"


def repository(ref: str) -> str:
    """The name without tag or digest."""
    name = normalise(ref).split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}"


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Image:
    """One image: an ID with its tags, like a containerd image and its references."""

    id: str
    repo_tags: list[str]
    repo_digests: list[str]
    size: int = 4_400_000
    uid: int | None = 0
    username: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ("sh",)
    env: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    stop_signal: str = ""
    """The image's STOPSIGNAL (empty: SIGTERM)."""
    pinned: bool = False
    pulled_at: int = field(default_factory=time.time_ns)


@dataclass(frozen=True)
class RegistryEntry:
    """What a pull of ``name`` gets, and the credentials it needs (None: anonymous)."""

    name: str
    template: Image
    credentials: tuple[str, str] | None = None


def make_image(names: Sequence[str], **config: object) -> Image:
    """An image whose ID derives from its first name (so a test can predict it)."""
    tags = [normalise(n) for n in names]
    image_id = _digest("image:" + tags[0])
    digests = sorted({f"{repository(t)}@{_digest('manifest:' + tags[0])}" for t in tags})
    return Image(id=image_id, repo_tags=tags, repo_digests=digests, **config)  # type: ignore[arg-type]


class PullError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ImageStore:
    def __init__(self) -> None:
        self._images: dict[str, Image] = {}
        self.registry: dict[str, RegistryEntry] = {}
        """Normalised name → what pulling it gives."""

    # --- the registry -------------------------------------------------------------------

    def publish(self, image: Image, credentials: tuple[str, str] | None = None) -> None:
        """Make every name of ``image`` pullable (optionally only with ``credentials``)."""
        for tag in image.repo_tags + image.repo_digests:
            self.registry[tag] = RegistryEntry(tag, image, credentials)

    # --- the local store ----------------------------------------------------------------

    def add(self, image: Image) -> Image:
        """Import ``image`` as if loaded (``ctr images import``): present without a pull."""
        present = self._images.get(image.id)
        if present is None:
            present = self._images[image.id] = Image(**{**image.__dict__, "repo_tags": [], "repo_digests": []})
        for tag in image.repo_tags:
            self._untag(tag)
            present.repo_tags.append(tag)
        for digest in image.repo_digests:
            if digest not in present.repo_digests:
                present.repo_digests.append(digest)
        return present

    def _untag(self, tag: str) -> None:
        for other in list(self._images.values()):
            if tag in other.repo_tags:
                other.repo_tags.remove(tag)
                if not other.repo_tags and not other.repo_digests:
                    del self._images[other.id]

    def all(self) -> list[Image]:
        return list(self._images.values())

    def resolve(self, ref: str) -> Image | None:
        """The local image ``ref`` names (ID, ID prefix, tag or digest), or None."""
        if not ref:
            return None
        if ref in self._images:
            return self._images[ref]
        bare = ref.removeprefix("sha256:")
        if len(bare) >= 4 and all(ch in "0123456789abcdef" for ch in bare):
            found = [i for i in self._images.values() if i.id.removeprefix("sha256:").startswith(bare)]
            if len(found) == 1:
                return found[0]
        try:
            name = normalise(ref)
        except ValueError:
            return None
        for image in self._images.values():
            if name in image.repo_tags or name in image.repo_digests:
                return image
        return None

    def pull(self, ref: str, auth: tuple[str, str] | None) -> Image:
        name = normalise(ref)
        entry = self.registry.get(name)
        if entry is None:
            raise PullError("NOT_FOUND", f'failed to pull and unpack image "{name}": failed to resolve reference '
                                         f'"{name}": {name}: not found')
        if entry.credentials is not None and auth != entry.credentials:
            raise PullError("UNKNOWN", f'failed to pull and unpack image "{name}": failed to resolve reference '
                                       f'"{name}": pull access denied, repository does not exist or may require '
                                       f"authorization: server message: insufficient_scope: authorization failed")
        template = entry.template
        if "@" in name:
            tags: list[str] = []
            digests = [name]
        else:
            tags = [name]
            digests = [d for d in template.repo_digests if d.startswith(repository(name) + "@")]
        image = self.add(Image(**{**template.__dict__, "repo_tags": tags, "repo_digests": digests,
                                  "pulled_at": time.time_ns()}))
        return image

    def remove(self, ref: str) -> bool:
        """Remove the image ``ref`` names with all its tags (containerd's RemoveImage)."""
        image = self.resolve(ref)
        if image is None:
            return False
        del self._images[image.id]
        return True

    def usage(self) -> tuple[int, int]:
        """(bytes, inodes) the images take."""
        return sum(i.size for i in self._images.values()), 100 * len(self._images)


def preloaded(names_busybox: Iterable[str], names_pause: Iterable[str]) -> list[Image]:
    """The two images the test environment imports into containerd (devenv.images)."""
    busybox = make_image(list(names_busybox), cmd=("sh",))
    pause = make_image(list(names_pause), entrypoint=("/pause",), cmd=(), uid=65535, pinned=True)
    return [busybox, pause]


__all__ = ["Image", "ImageStore", "PullError", "make_image", "normalise", "preloaded", "repository"]
