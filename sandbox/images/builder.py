"""Build images from their specs, check them against the lock, load them into the engine.

`build` works out, parents first, which images are missing from the engine or stale against
the lock (spec inputs or parent changed), builds only those, and compares each fresh ID with
the lock. A differing ID is drift: reported (for a root image, with the package diff) and
refused unless `update_lock`, in which case the lock is rewritten. Drifted images are not
loaded, and their children are not built on top of them.

Built layers, configs and a record per image ID are kept under `images/.build/` so a child
can be assembled without rebuilding its parent, and an image the engine lost can be
reloaded without rebuilding at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.errors import ImageError
from sandbox.images import engine, rootfs
from sandbox.images.archive import (
    ContainerConfig,
    digest_of,
    image_config,
    tree_entries,
    write_docker_archive,
    write_layer_file,
)
from sandbox.images.lock import IMAGES_DIR, Lock, LockEntry, default_lock_path, load_lock, package_diff
from sandbox.images.spec import ImageSpec, build_order, load_specs

if TYPE_CHECKING:
    from docker import DockerClient

Progress = Callable[[str], None]


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1]


@dataclass(frozen=True)
class Built:
    """An assembled image: config bytes plus its layer tars in the cache."""

    name: str
    id: str
    config: bytes = field(repr=False)
    layers: tuple[Path, ...]
    inputs_sha256: str
    parent: str | None
    parent_id: str | None
    packages: tuple[str, ...] = ()

    @property
    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.config)
        return doc

    def container_config(self) -> ContainerConfig:
        return ContainerConfig.from_json(self.doc["config"])

    def lock_entry(self) -> LockEntry:
        return LockEntry(self.name, self.id, self.inputs_sha256, self.parent, self.parent_id, self.packages)


@dataclass(frozen=True)
class Drift:
    name: str
    locked_id: str | None
    built_id: str
    details: tuple[str, ...]
    accepted: bool  # the lock was rewritten to the new ID

    def describe(self) -> str:
        head = (
            f"{self.name}: not in the lock yet, built {self.built_id}"
            if self.locked_id is None
            else f"{self.name}: built {self.built_id}, lock pins {self.locked_id}"
        )
        return "\n".join([head] + [f"    {d}" for d in self.details])


@dataclass(frozen=True)
class BuildReport:
    built: tuple[str, ...]  # assembled this run
    loaded: tuple[str, ...]  # loaded into the engine this run
    up_to_date: tuple[str, ...]
    blocked: tuple[str, ...]  # not built because their parent drifted
    drifts: tuple[Drift, ...]
    lock_written: Path | None

    @property
    def ok(self) -> bool:
        return all(d.accepted for d in self.drifts) and not self.blocked


@dataclass(frozen=True)
class Cache:
    root: Path

    @property
    def debs(self) -> Path:
        return self.root / "debs"

    def packages(self, name: str) -> Path:
        """The package tarball a root image is installed from (debootstrap --make-tarball)."""
        return self.root / f"{name}-packages.tgz"

    @property
    def layers(self) -> Path:
        return self.root / "layers"

    def record(self, image_id: str) -> Path:
        return self.root / "images" / f"{_hex(image_id)}.json"

    def save(self, built: Built) -> None:
        rec = self.record(built.id)
        rec.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "name": built.name,
            "config": built.config.decode(),
            "layers": [p.name for p in built.layers],
            "inputs_sha256": built.inputs_sha256,
            "parent": built.parent,
            "parent_id": built.parent_id,
            "packages": list(built.packages),
        }
        tmp = rec.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, sort_keys=True))
        os.replace(tmp, rec)

    def find(self, image_id: str) -> Built | None:
        """The cached build of `image_id`, if its record and every layer tar are present."""
        try:
            doc = json.loads(self.record(image_id).read_text())
        except (OSError, ValueError):
            return None
        config = doc["config"].encode()
        layers = tuple(self.layers / n for n in doc["layers"])
        if digest_of(config) != image_id or not all(p.is_file() for p in layers):
            return None
        return Built(doc["name"], image_id, config, layers, doc["inputs_sha256"],
                     doc["parent"], doc["parent_id"], tuple(doc["packages"]))


class _Builder:
    def __init__(self, *, specs: dict[str, ImageSpec], lock: Lock, cache: Cache, client: DockerClient | None,
                 update_lock: bool, force: frozenset[str], load: bool, tag_prefix: str, progress: Progress,
                 offline: bool = False):
        self.specs, self.lock, self.cache, self.client = specs, lock, cache, client
        self.offline = offline
        self.update_lock, self.force, self.load = update_lock, force, load
        self.tag_prefix, self.progress = tag_prefix, progress
        self.current: dict[str, Built] = {}  # accepted images of this run, by name
        self.ids: dict[str, str] = {}  # accepted ID of each image processed
        self.built: list[str] = []
        self.loaded: list[str] = []
        self.up_to_date: list[str] = []
        self.blocked: list[str] = []
        self.drifts: list[Drift] = []
        self.lock_changed = False

    @property
    def engine_client(self) -> DockerClient:
        """The engine client: only asked for when `load` is set, and build() then always has one."""
        assert self.client is not None, "loading images needs a Docker client"
        return self.client

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        t0 = time.monotonic()
        self.progress(f"{what} ...")
        yield
        self.progress(f"{what}: done in {time.monotonic() - t0:.1f}s")

    # -- deciding -------------------------------------------------------------------------

    def stale_reasons(self, spec: ImageSpec) -> list[str]:
        entry = self.lock.get(spec.name)
        reasons = []
        if spec.name in self.force:
            reasons.append("--force")
        if entry is None:
            return reasons + ["not in the lock"]
        if entry.inputs_sha256 != spec.inputs_sha256():
            reasons.append(f"images/{spec.name} changed since the lock")
        parent_id = self.ids.get(spec.parent) if spec.parent else None
        if entry.parent_id != parent_id:
            reasons.append(f"parent {spec.parent} is now {parent_id}")
        if self.load and not engine.has_image(self.engine_client, entry.id):
            reasons.append("missing from the engine")
        return reasons

    def process(self, name: str) -> None:
        spec = self.specs[name]
        if spec.parent is not None and spec.parent not in self.ids:
            self.blocked.append(name)
            self.progress(f"{name}: skipped, its parent {spec.parent} was not accepted")
            return
        entry = self.lock.get(name)
        reasons = self.stale_reasons(spec)
        if not reasons:
            assert entry is not None
            self.ids[name] = entry.id
            self.up_to_date.append(name)
            self.progress(f"{name}: up to date ({entry.id[:19]})")
            if self.load:  # a moved tag is put back on the pinned image
                engine.tag(self.engine_client, entry.id, self.tag_prefix + name)
            return
        self.progress(f"{name}: needs work: {'; '.join(reasons)}")
        built = self.obtain(spec, entry)
        if self.accept(spec, built):
            self.install(built)

    def obtain(self, spec: ImageSpec, entry: LockEntry | None) -> Built:
        """The locked build from the cache when inputs still match, else a fresh build."""
        if spec.name not in self.force and entry is not None and entry.inputs_sha256 == spec.inputs_sha256() and (
            entry.parent_id == (self.ids.get(spec.parent) if spec.parent else None)
        ):
            cached = self.cache.find(entry.id)
            if cached is not None:
                self.progress(f"{spec.name}: using cached build {entry.id[:19]}")
                return cached
        return self.assemble(spec)

    def accept(self, spec: ImageSpec, built: Built) -> bool:
        entry = self.lock.get(spec.name)
        if entry is not None and entry.to_json() == built.lock_entry().to_json():
            self.ids[spec.name] = built.id
            self.current[spec.name] = built
            return True
        details: list[str] = []
        if entry is not None:
            if entry.id == built.id:
                details.append("same image ID; the lock's recorded inputs are out of date")
            if spec.parent is None:
                diff = package_diff(entry.packages, built.packages)
                details += diff or ["same package manifest: the assembly itself changed "
                                    "(builder version, cleaning rules) or is not deterministic"]
            if entry.inputs_sha256 != built.inputs_sha256:
                details.append(f"spec inputs {entry.inputs_sha256[:19]} -> {built.inputs_sha256[:19]}")
            if entry.parent_id != built.parent_id:
                details.append(f"parent {entry.parent_id} -> {built.parent_id}")
        drift = Drift(spec.name, entry.id if entry else None, built.id, tuple(details), self.update_lock)
        self.drifts.append(drift)
        if self.update_lock:
            self.progress("lock updated: " + drift.describe())
        else:
            self.progress(f"{spec.name}: DRIFT from the lock (details at the end); not loaded")
        if not self.update_lock:
            return False
        self.lock = self.lock.with_entry(built.lock_entry())
        self.lock_changed = True
        self.ids[spec.name] = built.id
        self.current[spec.name] = built
        return True

    # -- building -------------------------------------------------------------------------

    def parent_build(self, spec: ImageSpec) -> Built:
        """The accepted parent's layers: from this run, the cache, or (last resort) rebuilt."""
        assert spec.parent is not None
        pid = self.ids[spec.parent]
        if spec.parent in self.current and self.current[spec.parent].id == pid:
            return self.current[spec.parent]
        cached = self.cache.find(pid)
        if cached is not None:
            return cached
        self.progress(f"{spec.name}: parent {spec.parent} {pid[:19]} is not in the build cache; rebuilding it")
        pspec = self.specs[spec.parent]
        rebuilt = self.assemble(pspec)
        if rebuilt.id != pid:
            raise ImageError(
                f"rebuilding {spec.parent} for {spec.name} gave {rebuilt.id}, not the pinned {pid}"
                + "".join(f"\n    {d}" for d in package_diff(self.lock.entry(spec.parent).packages, rebuilt.packages))
                + f"\nrun `images build --force --update-lock {spec.parent}` to re-pin it"
            )
        self.current[spec.parent] = rebuilt
        return rebuilt

    def assemble(self, spec: ImageSpec) -> Built:
        if spec.parent is None:
            built = self.assemble_root(spec)
        else:
            built = self.assemble_child(spec)
        self.cache.save(built)
        self.built.append(spec.name)
        self.progress(f"{spec.name}: assembled {built.id}")
        return built

    def assemble_root(self, spec: ImageSpec) -> Built:
        assert spec.debootstrap is not None and spec.account is not None
        work = self.cache.root / "work" / f"{spec.name}-{os.getpid()}"
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        root = work / "rootfs"
        try:
            d = spec.debootstrap
            tarball = self.cache.packages(spec.name)
            # The tarball `images fetch` left is reused (same packages, same ID); --force fetches
            # again, which is how a rebuild sees what the mirror serves today.
            if not self.offline and (spec.name in self.force or not tarball.is_file()):
                with self.step(f"{spec.name}: fetch packages of {d.suite} +{','.join(d.include)} from {d.mirror}"):
                    rootfs.fetch_packages(d, tarball, self.cache.debs, self.cache.root / f"{spec.name}-fetch.log")
            with self.step(f"{spec.name}: debootstrap {d.suite} from the package tarball, no network"):
                rootfs.debootstrap(d, root, tarball, self.cache.root / f"{spec.name}-debootstrap.log")
            with self.step(f"{spec.name}: clean rootfs, add user {spec.account.name}"):
                packages = rootfs.package_manifest(root)
                arch = rootfs.architecture(root)
                rootfs.clean(root)
                rootfs.add_account(root, spec.account)
            with self.step(f"{spec.name}: write layer"):
                diff_id, path = write_layer_file(tree_entries(root, normalize=False), self.cache.layers)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        config = image_config(
            spec.container_config(None), [diff_id],
            [f"ringfence: debootstrap --variant={d.variant} {d.suite} +{','.join(d.include)}"], arch,
        )
        return Built(spec.name, digest_of(config), config, (path,), spec.inputs_sha256(), None, None, packages)

    def assemble_child(self, spec: ImageSpec) -> Built:
        parent = self.parent_build(spec)
        with self.step(f"{spec.name}: write layer from images/{spec.name}/rootfs"), spec.overlay() as tree:
            entries = tree_entries(tree, normalize=True) if tree is not None else []
            diff_id, path = write_layer_file(entries, self.cache.layers)
        pdoc = parent.doc
        config = image_config(
            spec.container_config(parent.container_config()),
            list(pdoc["rootfs"]["diff_ids"]) + [diff_id],
            [h["created_by"] for h in pdoc["history"]] + [f"ringfence: images/{spec.name}/rootfs"],
            pdoc["architecture"],
        )
        return Built(spec.name, digest_of(config), config, parent.layers + (path,),
                     spec.inputs_sha256(), spec.parent, parent.id)

    def install(self, built: Built) -> None:
        if not self.load:
            return
        if not engine.has_image(self.engine_client, built.id):
            archive = self.cache.root / "archives" / f"{built.name}-{os.getpid()}.tar"
            archive.parent.mkdir(parents=True, exist_ok=True)
            try:
                with self.step(f"{built.name}: docker load {built.id[:19]}"):
                    with open(archive, "wb") as f:
                        write_docker_archive(f, built.config, built.layers)
                    engine.load_archive(self.engine_client, archive, built.id)
            finally:
                archive.unlink(missing_ok=True)
            self.loaded.append(built.name)
        engine.tag(self.engine_client, built.id, self.tag_prefix + built.name)


def fetch(
    *,
    force: bool = False,
    progress: Progress | None = None,
    images_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Download the package tarball of every root image that has none yet (all with `force`).

    Setup, not build: `make images` runs it so that a later offline rebuild (the determinism
    test) has the same packages to install, even when the engine already had every image and
    nothing was built; `build` then installs from it instead of downloading again."""
    images_dir = Path(images_dir) if images_dir is not None else IMAGES_DIR
    cache = Cache(Path(cache_dir) if cache_dir is not None else images_dir / ".build")
    progress = progress or (lambda _msg: None)
    fetched = []
    for name, spec in sorted(load_specs(images_dir).items()):
        if spec.debootstrap is None:
            continue
        tarball = cache.packages(name)
        if tarball.is_file() and not force:
            progress(f"{name}: package tarball present ({tarball})")
            continue
        t0 = time.monotonic()
        progress(f"{name}: fetch packages of {spec.debootstrap.suite} from {spec.debootstrap.mirror} ...")
        rootfs.fetch_packages(spec.debootstrap, tarball, cache.debs, cache.root / f"{name}-fetch.log")
        progress(f"{name}: fetched {tarball.stat().st_size} bytes in {time.monotonic() - t0:.1f}s")
        fetched.append(tarball)
    return fetched


def build(
    names: list[str] | None = None,
    *,
    update_lock: bool = False,
    force: bool = False,
    progress: Progress | None = None,
    client: DockerClient | None = None,
    images_dir: str | os.PathLike[str] | None = None,
    lock_path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    load: bool = True,
    tag_prefix: str = engine.TAG_PREFIX,
    offline: bool = False,
) -> BuildReport:
    """Build what is missing or stale among `names` (default: every spec) and their parents.

    Returns a report; `report.ok` is False when an image drifted from the lock and
    `update_lock` was not given. `load=False` assembles without an engine (IDs only).
    `offline=True` installs root images from the package tarball already in the cache and
    fetches nothing.
    """
    images_dir = Path(images_dir) if images_dir is not None else IMAGES_DIR
    lock_path = Path(lock_path) if lock_path is not None else default_lock_path()
    cache = Cache(Path(cache_dir) if cache_dir is not None else images_dir / ".build")
    progress = progress or (lambda _msg: None)
    specs = load_specs(images_dir)
    if not specs:
        raise ImageError(f"no image specs under {images_dir}")
    lock = load_lock(lock_path) if lock_path.exists() else Lock(path=lock_path)
    if load and client is None:
        client = engine.client_from_env()
    order = build_order(specs, names)
    # --force rebuilds what was asked for; parents are still only built when missing or stale.
    forced = frozenset((names or specs) if force else ())
    b = _Builder(specs=specs, lock=lock, cache=cache, client=client, update_lock=update_lock,
                 force=forced, load=load, tag_prefix=tag_prefix, progress=progress, offline=offline)
    for name in order:
        b.process(name)
    written = None
    if b.lock_changed:
        written = b.lock.write(lock_path)
        progress(f"wrote {written}")
    return BuildReport(tuple(b.built), tuple(b.loaded), tuple(b.up_to_date), tuple(b.blocked),
                       tuple(b.drifts), written)
