"""What dispatch asks before it starts a container: is this image pinned, and present?"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.errors import ImageError
from sandbox.images import engine
from sandbox.images.lock import IMAGES_DIR, Lock, load_lock
from sandbox.images.spec import load_specs

if TYPE_CHECKING:
    from docker import DockerClient

FIX = "run `make images` (or `ringfence images build`)"


@dataclass(frozen=True)
class Problem:
    name: str
    kind: str  # "missing" | "drifted"
    message: str

    def __str__(self) -> str:
        return f"{self.name}: {self.kind}: {self.message}"


def resolve_pinned(client: DockerClient, name: str, lock: Lock | None = None) -> str:
    """The locked image ID for `name`, only if the engine holds exactly that image.

    Tags are never consulted: `ringfence/tool:latest` may point anywhere, the ID cannot.
    """
    lock = lock if lock is not None else load_lock()
    image_id = lock.image_id(name)
    if not engine.has_image(client, image_id):
        raise ImageError(f"pinned image {name} ({image_id}) is not in the Docker engine: {FIX}")
    return image_id


def verify(
    client: DockerClient,
    lock: Lock | None = None,
    *,
    images_dir: str | Path | None = IMAGES_DIR,
    tag_prefix: str = engine.TAG_PREFIX,
) -> list[Problem]:
    """Every pinned image that is missing from the engine or has drifted from the lock.

    Drifted: the human tag names a different image than the lock, the lock's record of a
    parent disagrees with the parent's entry, or (when `images_dir` is given) the spec
    changed since the lock was written or has no entry in it.
    """
    lock = lock if lock is not None else load_lock()
    problems: list[Problem] = []
    for e in lock.entries:
        if not engine.has_image(client, e.id):
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
    if images_dir is not None and Path(images_dir).is_dir():
        specs = load_specs(Path(images_dir))
        for name, spec in sorted(specs.items()):
            entry = lock.get(name)
            if entry is None:
                problems.append(Problem(name, "missing",
                                        f"images/{name} has no entry in the lock: {FIX} --update-lock"))
            elif entry.inputs_sha256 != spec.inputs_sha256():
                problems.append(Problem(name, "drifted", f"images/{name} changed since the lock was "
                                        f"written: {FIX} --update-lock"))
    return problems
