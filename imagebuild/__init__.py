"""Pinned images built without a registry, deterministically, and checked by ID.

    load_lock(path=None) -> Lock           images/images.lock ($RINGFENCE_IMAGES_LOCK overrides)
    Lock.image_id(name) -> str             ImageError when the name is not pinned
    resolve_pinned(client, name, lock=None) -> str
                                           the pinned ID, only if the engine has exactly it
    build(names=None, *, update_lock=False, force=False, progress=None, ...) -> BuildReport
    verify(client, lock=None) -> list[Problem]
    lock_for(images_dir) -> Lock             a user's images dir's lock, over the built-in one

Specs live in images/<name>/image.json (+ rootfs/), or in a user's images dir layered over
them; see imagebuild.spec. A child pins Debian packages (imagebuild.debs) and wheels
(imagebuild.wheels); an image built elsewhere is admitted by imagebuild.adopt.
"""

from imagebuild.builder import BuildReport, Built, Drift, build
from imagebuild.pinned import Problem, verify
from imagebuild.pins import package_diff
from imagebuild.spec import ImageSpec, load_specs
from sandbox.pinned_images import Lock, LockEntry, default_lock_path, load_lock, resolve_pinned

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
