"""The pinned images the runtime may start: images/images.lock, and the check that the engine
holds exactly the pinned image.

The lock is committed. Dispatch trusts nothing but the IDs in it: a tag can be moved by
anyone with the Docker socket, an image ID cannot be made to name other content.

This is the runtime's part of the image code, and the only part ringfence_server/sandbox/ holds: the build
toolchain (ringfence_server/imagebuild/: specs, rootfs, packages, the builder) writes the lock through these
types and imports them from here, so running a container never loads the builder.

A user's images dir has a lock of its own (DIR/images.lock) holding the user's images only;
`lock_for(DIR)` reads it with the built-in lock under it (`Lock.inherited`), so a name is
looked up in the user's lock first, then in the built-in one: the search order of
ringfence_server.imagebuild.spec. Writing a lock writes its own entries only.

An entry is one of:
- built here from a spec: `inputs_sha256` (the spec), parent and parent_id, and what went in:
  a root's package manifest (`packages`, "name=version"), a child's pinned Debian packages
  with the dependencies they pulled (`debs`) and wheels (`wheels`), each with its file's sha256;
- adopted (`ringfence images adopt`): built elsewhere, admitted by ID after the checks of
  ringfence_server.imagebuild.adopt; `"reproducible": false` (nothing here can rebuild it, so its ID is the
  whole of what is known: `inputs_sha256` is the ID itself), and `"tool": true` when it was
  checked for the runner.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringfence_server.sandbox.errors import EngineError, ImageError

# docker is imported where it is used (has_image): the image toolchain runs without it, and
# ringfence_server.sandbox.workspace, which imports this module, is imported by the control plane's config.
if TYPE_CHECKING:
    from docker import DockerClient

LOCK_ENV = "RINGFENCE_IMAGES_LOCK"
IMAGES_DIR_ENV = "RINGFENCE_IMAGES_DIR"
LOCK_VERSION = 1
# The folder holding ringfence_server/: the checkout, or site-packages in an install.
REPO_ROOT = Path(__file__).resolve().parents[2]
# The wheel ships images/ (specs, rootfs/ overlays, lock; not the .build/ cache) as this folder
# next to ringfence_server/sandbox/ (setup.py says why there), so a spec's repository `files` resolve the same.
SHIPPED_IMAGES_DIR = REPO_ROOT / "ringfence_images"


def images_dir() -> Path:
    """The image specs and lock: $RINGFENCE_IMAGES_DIR, else the checkout's images/ when running
    from a checkout (an editable install included), else the copy shipped in the package.

    A checkout without a lock yet (before its first `--update-lock`) still gets its images/:
    the shipped copy is chosen only when it exists and there is no checkout lock."""
    env = os.environ.get(IMAGES_DIR_ENV)
    if env:
        return Path(env)
    checkout = REPO_ROOT / "images"
    if (checkout / "images.lock").is_file() or not SHIPPED_IMAGES_DIR.is_dir():
        return checkout
    return SHIPPED_IMAGES_DIR


# Fixed at import (other modules take it as a default argument): set the variable before.
IMAGES_DIR = images_dir()
_ID = re.compile(r"sha256:[0-9a-f]{64}")
# Hashes of files are bare lowercase hex, as Debian's Packages index and pip write them (image
# IDs keep Docker's "sha256:" prefix).
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
FIX = "run `make images` (or `ringfence images build`)"


def default_lock_path() -> Path:
    env = os.environ.get(LOCK_ENV)
    return Path(env) if env else IMAGES_DIR / "images.lock"


def _fields(doc: object, keys: tuple[str, ...], what: str) -> dict[str, str]:
    if not isinstance(doc, Mapping) or not all(isinstance(doc.get(k), str) for k in keys):
        raise ImageError(f"images.lock: a {what} entry needs string fields {', '.join(keys)}: {doc!r}")
    return {k: doc[k] for k in keys}


@dataclass(frozen=True)
class LockedDeb:
    """One installed .deb: the version, the file's sha256, and where the mirror keeps it."""

    name: str
    version: str
    architecture: str
    sha256: str
    filename: str  # the pool path in the mirror ("pool/main/j/jq/jq_1.6-2.1+deb12u2_amd64.deb")
    # Named in the spec's `packages` (False: pulled in as a dependency). Which pins a lock
    # entry's packages were resolved from, so that a rebuild reuses them exactly when the
    # pins (and the parent) are the same, whatever else in the spec changed.
    pinned: bool = False

    def __post_init__(self) -> None:
        if not SHA256_HEX.fullmatch(self.sha256):
            raise ImageError(f"images.lock: package {self.name}: sha256 {self.sha256!r} is not 64 hex digits")
        if self.filename.startswith("/") or ".." in self.filename.split("/"):
            raise ImageError(f"images.lock: package {self.name}: filename {self.filename!r} leaves the mirror")

    @property
    def cache_name(self) -> str:
        """debootstrap's cache naming (the epoch's ':' quoted), so the base's .debs and these
        share one folder without clashing."""
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.architecture}.deb"

    def __str__(self) -> str:
        return f"{self.name}={self.version}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "architecture": self.architecture,
                "sha256": self.sha256, "filename": self.filename, "pinned": self.pinned}

    @classmethod
    def from_json(cls, doc: object) -> LockedDeb:
        fields = _fields(doc, ("name", "version", "architecture", "sha256", "filename"), "package")
        pinned = doc.get("pinned", False) if isinstance(doc, Mapping) else False
        if not isinstance(pinned, bool):
            raise ImageError(f"images.lock: package {fields['name']}: pinned must be true or false")
        return cls(**fields, pinned=pinned)


@dataclass(frozen=True)
class LockedWheel:
    name: str
    version: str
    sha256: str
    filename: str  # the .whl's own name (its tags say which interpreters and platforms)

    def __post_init__(self) -> None:
        if not SHA256_HEX.fullmatch(self.sha256):
            raise ImageError(f"images.lock: wheel {self.name}: sha256 {self.sha256!r} is not 64 hex digits")
        if "/" in self.filename or not self.filename.endswith(".whl"):
            raise ImageError(f"images.lock: wheel {self.name}: bad filename {self.filename!r}")

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256, "filename": self.filename}

    @classmethod
    def from_json(cls, doc: object) -> LockedWheel:
        return cls(**_fields(doc, ("name", "version", "sha256", "filename"), "wheel"))


@dataclass(frozen=True)
class LockEntry:
    name: str
    id: str
    inputs_sha256: str
    parent: str | None = None
    parent_id: str | None = None
    # Root images only: "package=version" lines, sorted (the answer to "what changed?").
    packages: tuple[str, ...] = ()
    # Child images only: the Debian packages installed from .debs (pinned ones and what they
    # pulled in) and the wheels, sorted by name.
    debs: tuple[LockedDeb, ...] = ()
    wheels: tuple[LockedWheel, ...] = ()
    # False for an adopted image (built elsewhere; `images build` cannot reproduce it).
    reproducible: bool = True
    # Adopted images only: admitted as a tool image (the runner was checked for).
    tool: bool = False

    def __post_init__(self) -> None:
        if not _ID.fullmatch(self.id):
            raise ImageError(f"lock entry {self.name!r}: id {self.id!r} is not sha256:<64 hex>")
        if (self.parent is None) != (self.parent_id is None):
            raise ImageError(f"lock entry {self.name!r}: parent and parent_id go together")
        if self.parent_id is not None and not _ID.fullmatch(self.parent_id):
            raise ImageError(f"lock entry {self.name!r}: bad parent_id {self.parent_id!r}")
        object.__setattr__(self, "packages", tuple(self.packages))
        object.__setattr__(self, "debs", tuple(sorted(self.debs, key=lambda d: d.name)))
        object.__setattr__(self, "wheels", tuple(sorted(self.wheels, key=lambda w: w.name)))
        if not self.reproducible and (self.parent is not None or self.packages or self.debs or self.wheels):
            raise ImageError(f"lock entry {self.name!r}: an adopted image records its ID only")
        if self.tool and self.reproducible:
            raise ImageError(f"lock entry {self.name!r}: 'tool' marks an adopted image")

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "inputs_sha256": self.inputs_sha256,
            "parent": self.parent,
            "parent_id": self.parent_id,
        }
        if self.packages:
            doc["packages"] = list(self.packages)
        # Written only when present, so the entries of images that pin nothing (every built-in
        # one) are byte for byte what they were.
        if self.debs:
            doc["debs"] = [d.to_json() for d in self.debs]
        if self.wheels:
            doc["wheels"] = [w.to_json() for w in self.wheels]
        if not self.reproducible:
            doc["reproducible"] = False
            doc["tool"] = self.tool
        return doc

    @classmethod
    def from_json(cls, name: str, item: dict[str, Any]) -> LockEntry:
        debs, wheels = item.get("debs", []), item.get("wheels", [])
        if not isinstance(debs, list) or not isinstance(wheels, list):
            raise TypeError("debs and wheels are lists")
        reproducible, tool = item.get("reproducible", True), item.get("tool", False)
        if not isinstance(reproducible, bool) or not isinstance(tool, bool):
            raise TypeError("reproducible and tool are true or false")
        return cls(
            name=name,
            id=item["id"],
            inputs_sha256=item["inputs_sha256"],
            parent=item.get("parent"),
            parent_id=item.get("parent_id"),
            packages=tuple(item.get("packages", ())),
            debs=tuple(LockedDeb.from_json(d) for d in debs),
            wheels=tuple(LockedWheel.from_json(w) for w in wheels),
            reproducible=reproducible,
            tool=tool,
        )


@dataclass(frozen=True)
class Lock:
    entries: tuple[LockEntry, ...] = ()
    path: Path | None = field(default=None, compare=False)
    # The built-in lock under a user's one: names this lock lacks are looked up there (get,
    # entry, image_id, ids). Never written with this lock.
    inherited: Lock | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(sorted(self.entries, key=lambda e: e.name)))
        by_name = {e.name: e for e in self.entries}
        if len(by_name) != len(self.entries):
            raise ImageError("images.lock names an image twice")
        for e in self.entries:
            if e.parent is not None and e.parent not in by_name and (
                    self.inherited is None or self.inherited.get(e.parent) is None):
                raise ImageError(f"{self.path or 'images.lock'}: {e.name!r} names unknown parent {e.parent!r}"
                                 + ("" if self.inherited else " (a user's lock is read with lock_for(its dir))"))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    def get(self, name: str) -> LockEntry | None:
        for e in self.entries:
            if e.name == name:
                return e
        return self.inherited.get(name) if self.inherited is not None else None

    def owns(self, name: str) -> bool:
        """True when `name` is this lock's own entry (not one of the inherited lock's)."""
        return any(e.name == name for e in self.entries)

    def entry(self, name: str) -> LockEntry:
        e = self.get(name)
        if e is None:
            where = self.path or "images.lock"
            raise ImageError(f"image {name!r} is not pinned in {where}: "
                             "run `make images` (or `ringfence images build`)")
        return e

    def image_id(self, name: str) -> str:
        return self.entry(name).id

    def ids(self) -> frozenset[str]:
        own = frozenset(e.id for e in self.entries)
        return own | self.inherited.ids() if self.inherited is not None else own

    def with_entry(self, entry: LockEntry) -> Lock:
        rest = [e for e in self.entries if e.name != entry.name]
        return replace(self, entries=(*rest, entry))

    def to_bytes(self) -> bytes:
        doc = {"version": LOCK_VERSION, "images": {e.name: e.to_json() for e in self.entries}}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, path: Path | None = None, inherited: Lock | None = None) -> Lock:
        where = path or "images.lock"
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise ImageError(f"{where}: not JSON: {e}") from e
        if not isinstance(doc, dict) or doc.get("version") != LOCK_VERSION:
            raise ImageError(f"{where}: expected a version {LOCK_VERSION} lock object")
        images = doc.get("images")
        if not isinstance(images, dict):
            raise ImageError(f"{where}: 'images' must be an object")
        entries = []
        for name, item in images.items():
            if not isinstance(item, dict):
                raise ImageError(f"{where}: entry {name!r} must be an object")
            try:
                entries.append(LockEntry.from_json(name, item))
            except (KeyError, TypeError) as err:
                raise ImageError(f"{where}: entry {name!r} is malformed: {err!r}") from err
        return cls(tuple(entries), path, inherited)

    def write(self, path: Path | None = None) -> Path:
        path = Path(path or self.path or default_lock_path())
        tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
        tmp.write_bytes(self.to_bytes())
        os.replace(tmp, path)
        return path


def load_lock(path: str | os.PathLike[str] | None = None, *, inherited: Lock | None = None) -> Lock:
    """Read the lock (default: $RINGFENCE_IMAGES_LOCK, else images.lock in images_dir()).
    `inherited`: the lock under it (a user's lock: the built-in one; see lock_for)."""
    path = Path(path) if path is not None else default_lock_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise ImageError(f"{path} does not exist: run `make images` (or `ringfence images build`), "
                         f"or set {IMAGES_DIR_ENV} / {LOCK_ENV}") from e
    except OSError as e:
        raise ImageError(f"cannot read {path}: {e}") from e
    return Lock.from_bytes(data, path, inherited)


def has_image(client: DockerClient, image_id: str) -> bool:
    """True only if the engine holds an image whose ID is exactly `image_id`.

    `images.get` also resolves tags and ID prefixes, so the returned ID is compared: a name
    that merely resolves to something is not the pinned image.
    """
    import docker.errors

    try:
        return client.images.get(image_id).id == image_id
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as e:
        if getattr(e, "status_code", None) == 404:
            return False
        raise EngineError(f"engine failed to inspect {image_id}: {e}") from e
    except docker.errors.DockerException as e:
        raise EngineError(f"engine unreachable inspecting {image_id}: {e}") from e


def resolve_pinned(client: DockerClient, name: str, lock: Lock | None = None) -> str:
    """The locked image ID for `name`, only if the engine holds exactly that image.

    Tags are never consulted: `ringfence/tool:latest` may point anywhere, the ID cannot.
    """
    lock = lock if lock is not None else load_lock()
    image_id = lock.image_id(name)
    if not has_image(client, image_id):
        raise ImageError(f"pinned image {name} ({image_id}) is not in the Docker engine: {FIX}")
    return image_id


def is_builtin(images_dir: str | os.PathLike[str] | None) -> bool:
    """Whether `images_dir` is the built-in images dir (None means it too)."""
    return images_dir is None or Path(images_dir).resolve() == IMAGES_DIR.resolve()


def builtin_lock() -> Lock | None:
    """The built-in lock, or None when there is none yet (before the first `make images`)."""
    path = default_lock_path()
    return load_lock(path) if path.is_file() else None


def lock_for(images_dir: str | os.PathLike[str] | None = None, lock_path: str | os.PathLike[str] | None = None,
             *, missing_ok: bool = False) -> Lock:
    """The lock of an images dir as dispatch and the builder see it: DIR/images.lock (or
    `lock_path`), over the built-in lock when DIR is a user's dir (None: the built-in dir).

    `missing_ok`: a dir with no lock yet gives an empty lock to fill (the first build);
    otherwise a missing lock is an ImageError, as for load_lock."""
    if is_builtin(images_dir):
        path = Path(lock_path) if lock_path is not None else default_lock_path()
        inherited = None
    else:
        assert images_dir is not None  # is_builtin(None) is True
        path = Path(lock_path) if lock_path is not None else Path(images_dir) / "images.lock"
        inherited = builtin_lock()
    if missing_ok and not path.exists():
        return Lock(path=path, inherited=inherited)
    return load_lock(path, inherited=inherited)
