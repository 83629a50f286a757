"""Whether every pinned image is present and matches its spec (`ringfence images verify`).

What dispatch asks before it starts a container (is this image pinned, and present?) is the
runtime's: ringfence_server.sandbox.pinned_images.resolve_pinned."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ringfence_server.imagebuild import engine
from ringfence_server.imagebuild.pins import normalize_wheel_name, sha256_file
from ringfence_server.imagebuild.spec import ImageSpec, load_specs
from ringfence_server.sandbox.pinned_images import FIX, IMAGES_DIR, Lock, LockEntry, has_image, is_builtin, load_lock

if TYPE_CHECKING:
    from docker import DockerClient

@dataclass(frozen=True)
class Problem:
    name: str
    kind: str  # "missing" | "drifted" | "refused" (an adopted image failing its checks)
    message: str

    def __str__(self) -> str:
        return f"{self.name}: {self.kind}: {self.message}"


def verify(
    client: DockerClient,
    lock: Lock | None = None,
    *,
    images_dir: str | Path | None = IMAGES_DIR,
    tag_prefix: str = engine.TAG_PREFIX,
    cache_dir: str | Path | None = None,
) -> list[Problem]:
    """Every pinned image that is missing from the engine or has drifted from the lock.

    Drifted: the human tag names a different image than the lock, the lock's record of a
    parent disagrees with the parent's entry, or (when `images_dir` is given) the spec
    changed since the lock was written or has no entry in it; with each changed pin named (a
    package's version, a wheel's hash), and each cached .deb or wheel (`cache_dir`, default
    `images_dir`/.build) whose file is not the one the lock records. An adopted image is
    inspected again (ringfence_server.imagebuild.adopt) and is "refused" when a check now fails.

    Only the lock's own entries are checked (a user's lock: the user's images, whose parents
    are looked up in the built-in lock under it)."""
    from ringfence_server.imagebuild import adopt

    lock = lock if lock is not None else load_lock()
    problems: list[Problem] = []
    for e in lock.entries:
        present = has_image(client, e.id)
        if not present:
            other = engine.tagged_id(client, f"{tag_prefix}{e.name}:latest")
            if other is not None:
                problems.append(Problem(e.name, "drifted", f"lock pins {e.id} but the engine's "
                                        f"{tag_prefix}{e.name}:latest is {other}, and {e.id} is absent: {FIX}"))
            else:
                problems.append(Problem(e.name, "missing", f"{e.id} is not in the engine: {FIX}"))
        if e.parent is not None:
            p = lock.get(e.parent)
            if p is not None and p.id != e.parent_id:
                problems.append(Problem(e.name, "drifted", f"built on {e.parent} {e.parent_id}, but the "
                                        f"lock pins {e.parent} {p.id}: {FIX} --update-lock"))
        if not e.reproducible and present:
            inspection = adopt.inspect(client, e.id, tool=e.tool)
            problems += [Problem(e.name, "refused", f"adopted image {e.id[:19]} fails the {c.name} check: {c.detail}")
                         for c in inspection.failed]
    if images_dir is not None and Path(images_dir).is_dir():
        inherited = {} if is_builtin(images_dir) else load_specs(IMAGES_DIR)
        specs = load_specs(Path(images_dir), inherited)
        cache = Path(cache_dir) if cache_dir is not None else Path(images_dir) / ".build"
        own = {e.name: e for e in lock.entries}
        for name, spec in sorted(specs.items()):
            entry = own.get(name)
            if entry is None:
                problems.append(Problem(name, "missing",
                                        f"images/{name} has no entry in the lock: {FIX} --update-lock"))
                continue
            if entry.inputs_sha256 != spec.inputs_sha256():
                problems.append(Problem(name, "drifted", f"images/{name} changed since the lock was "
                                        f"written: {FIX} --update-lock"))
                problems += [Problem(name, "drifted", line) for line in _pin_drift(spec, entry)]
            problems += [Problem(name, "drifted", line) for line in _cache_drift(entry, cache)]
    return problems


def _pin_drift(spec: ImageSpec, entry: LockEntry) -> list[str]:
    """What the spec pins now that the lock does not record (each named)."""
    out = []
    locked = {d.name: d for d in entry.debs}
    for deb in spec.packages:
        have = locked.get(deb.name)
        if have is None:
            out.append(f"package {deb}: pinned in images/{spec.name} but not in the lock")
        elif have.version != deb.version:
            out.append(f"package {deb.name}: images/{spec.name} pins {deb.version}, the lock has {have.version}")
    wheels = {normalize_wheel_name(w.name): w for w in entry.wheels}
    pinned = {normalize_wheel_name(w.name): w for w in spec.wheels}
    for key in sorted(set(wheels) | set(pinned)):
        w, pin = wheels.get(key), pinned.get(key)
        if w is None:
            out.append(f"wheel {pin}: pinned in images/{spec.name} but not in the lock")
        elif pin is None:
            out.append(f"wheel {w}: in the lock but no longer pinned in images/{spec.name}")
        elif (w.version, w.sha256) != (pin.version, pin.sha256):
            out.append(f"wheel {pin}: images/{spec.name} pins sha256 {pin.sha256}, the lock records "
                       f"{w} sha256 {w.sha256}")
    return out


def _cache_drift(entry: LockEntry, cache: Path) -> list[str]:
    """Cached files of the entry's packages and wheels that are not the files the lock records
    (a missing file is no drift: `images fetch` downloads it and checks it then)."""
    out = []
    for deb in entry.debs:
        path = cache / "debs" / deb.cache_name
        if path.is_file() and (got := sha256_file(path)) != deb.sha256:
            out.append(f"package {deb}: the cached {path} has sha256 {got}, the lock records {deb.sha256}")
    for wheel in entry.wheels:
        path = cache / "wheels" / wheel.sha256 / wheel.filename
        if path.is_file() and (got := sha256_file(path)) != wheel.sha256:
            out.append(f"wheel {wheel}: the cached {path} has sha256 {got}, the lock records {wheel.sha256}")
    return out
