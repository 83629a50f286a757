"""Pinned images built without a registry, deterministically, and checked by ID.

    load_lock(path=None) -> Lock           images/images.lock ($RINGFENCE_IMAGES_LOCK overrides)
    Lock.image_id(name) -> str             ImageError when the name is not pinned
    resolve_pinned(client, name, lock=None) -> str
                                           the pinned ID, only if the engine has exactly it
    build(names=None, *, update_lock=False, force=False, progress=None, ...) -> BuildReport
    verify(client, lock=None) -> list[Problem]
    lock_for(images_dir) -> Lock             a user's images dir's lock, over the built-in one

Specs live in images/<name>/image.json (+ rootfs/), or in a user's images dir layered over
them; see ringfence_server.imagebuild.spec. A child pins Debian packages (ringfence_server.imagebuild.debs) and wheels
(ringfence_server.imagebuild.wheels); an image built elsewhere is admitted by ringfence_server.imagebuild.adopt.
"""

from ringfence_server.imagebuild.builder import BuildReport, Built, Drift, build
from ringfence_server.imagebuild.pinned import Problem, verify
from ringfence_server.imagebuild.pins import package_diff
from ringfence_server.imagebuild.spec import ImageSpec, load_specs
from ringfence_server.sandbox.pinned_images import Lock, LockEntry, default_lock_path, load_lock, resolve_pinned

__all__ = [
    "BuildReport",
    "Built",
    "Drift",
    "ImageSpec",
    "Lock",
    "LockEntry",
    "Problem",
    "build",
    "default_lock_path",
    "load_lock",
    "load_specs",
    "package_diff",
    "resolve_pinned",
    "verify",
]
