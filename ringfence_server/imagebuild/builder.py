"""Build images from their specs, check them against the lock, load them into the engine.

`build` works out, parents first, which images are missing from the engine or stale against
the lock (spec inputs or parent changed), builds only those, and compares each fresh ID with
the lock. A differing ID is drift: reported (for a root image, with the package diff) and
refused unless `update_lock`, in which case the lock is rewritten. Drifted images are not
loaded, and their children are not built on top of them.

Built layers, configs and a record per image ID are kept under `images/.build/` so a child
can be assembled without rebuilding its parent, and an image the engine lost can be
reloaded without rebuilding at all. A parent whose build is in no cache is read back from the
engine (`docker save` of its pinned ID: the layers come out as the same bytes, checked against
the config's diff_ids) before it is rebuilt from its spec.

A user's images dir (ringfence_server.imagebuild.spec, "Images in the user's project") is built the same
way, with its own lock and cache (DIR/images.lock, DIR/.build); its children of built-in
images take the built-in lock's ID of that parent and never build, tag or re-pin it.

A child's pinned packages and wheels (ringfence_server.imagebuild.debs, ringfence_server.imagebuild.wheels) become one
layer each, below its rootfs/ layer. Which .debs: the lock's when the pinned packages and the
parent are the ones it was built from (so a rebuild installs the same files, whatever else in
the spec changed), else a resolution `fetch` left in the cache (`.build/resolved/<name>.json`,
keyed by the pins and what the parent has), else (not offline) one made now. Every file is
checked against its sha256 before it is unpacked; the build itself never downloads when
`fetch` ran first, and never with `offline`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringfence_server.imagebuild import debs as debs_mod
from ringfence_server.imagebuild import engine, rootfs
from ringfence_server.imagebuild import wheels as wheels_mod
from ringfence_server.imagebuild.archive import (
    ContainerConfig,
    digest_of,
    image_config,
    tree_entries,
    write_docker_archive,
    write_layer_file,
)
from ringfence_server.imagebuild.pins import DebPin, deps_diff, package_diff, sha256_file
from ringfence_server.imagebuild.spec import ImageSpec, ancestors, build_order, load_specs, root_of
from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.pinned_images import (
    IMAGES_DIR,
    Lock,
    LockedDeb,
    LockedWheel,
    LockEntry,
    has_image,
    is_builtin,
    lock_for,
)

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
    debs: tuple[LockedDeb, ...] = ()
    wheels: tuple[LockedWheel, ...] = ()

    @property
    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.config)
        return doc

    def container_config(self) -> ContainerConfig:
        return ContainerConfig.from_json(self.doc["config"])

    def lock_entry(self) -> LockEntry:
        return LockEntry(self.name, self.id, self.inputs_sha256, self.parent, self.parent_id, self.packages,
                         self.debs, self.wheels)


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

    @property
    def wheels(self) -> Path:
        """The wheelhouse: `<sha256>/<file>.whl`."""
        return self.root / "wheels"

    def resolved(self, name: str) -> Path:
        """The .debs `fetch` resolved for a child, for a build that has no lock entry yet."""
        return self.root / "resolved" / f"{name}.json"

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
            "debs": [d.to_json() for d in built.debs],
            "wheels": [w.to_json() for w in built.wheels],
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
                     doc["parent"], doc["parent_id"], tuple(doc["packages"]),
                     tuple(LockedDeb.from_json(d) for d in doc.get("debs", ())),
                     tuple(LockedWheel.from_json(w) for w in doc.get("wheels", ())))

    def from_engine(self, client: DockerClient, entry: LockEntry, progress: Progress) -> Built:
        """A pinned image's build, read back from the engine into this cache (and recorded)."""
        t0 = time.monotonic()
        config, layers = engine.save_image(client, entry.id, self.layers)
        built = Built(entry.name, entry.id, config, layers, entry.inputs_sha256, entry.parent, entry.parent_id,
                      entry.packages, entry.debs, entry.wheels)
        self.save(built)
        progress(f"{entry.name}: layers of {entry.id[:19]} read from the engine in {time.monotonic() - t0:.1f}s")
        return built


class _Deps:
    """What a child's pinned packages and wheels are, and where their files are: shared by
    `fetch` (which may download) and the build (which downloads only when not offline)."""

    def __init__(self, *, specs: Mapping[str, ImageSpec], inherited: Mapping[str, ImageSpec], lock: Lock,
                 cache: Cache, progress: Progress, offline: bool) -> None:
        self.specs, self.inherited, self.lock, self.cache = specs, inherited, lock, cache
        self.progress, self.offline = progress, offline
        self.planned: dict[str, tuple[LockedDeb, ...]] = {}  # own specs' debs, as decided this run
        self._indexes: dict[tuple[str, str, str], debs_mod.Index] = {}

    def entry(self, name: str, own: bool) -> LockEntry | None:
        """A lock entry by where the spec was found (the user's lock, or the built-in one)."""
        if own:
            return self.lock.get(name) if self.lock.owns(name) else None
        return self.lock.inherited.get(name) if self.lock.inherited is not None else self.lock.get(name)

    def root_packages(self, spec: ImageSpec) -> tuple[str, ...]:
        chain = ancestors(spec, self.specs, self.inherited)
        root, own = chain[-1] if chain else (spec, spec.name in self.specs)
        entry = self.entry(root.name, own)
        if entry is None or not entry.packages:
            raise ImageError(f"{spec.name}: its root image {root.name} is not pinned with a package manifest: "
                             f"build it first (`ringfence images build {root.name} --update-lock`)")
        return entry.packages

    def installed(self, spec: ImageSpec) -> dict[str, str]:
        """What `spec`'s parent has: its root's manifest and every child's debs in between."""
        debs: list[LockedDeb] = []
        for anc, own in ancestors(spec, self.specs, self.inherited)[:-1]:
            if own and anc.name in self.planned:
                debs += self.planned[anc.name]
            elif (e := self.entry(anc.name, own)) is not None:
                debs += e.debs
        return debs_mod.installed_versions(self.root_packages(spec), debs)

    def mirror(self, spec: ImageSpec) -> tuple[str, str]:
        root = root_of(spec, self.specs, self.inherited)
        assert root.debootstrap is not None  # a root spec always has one (spec.load_spec)
        return root.debootstrap.mirror, root.debootstrap.suite

    def target(self, spec: ImageSpec) -> wheels_mod.Target:
        return wheels_mod.target_from_packages(self.root_packages(spec), platform.machine())

    def index(self, spec: ImageSpec) -> debs_mod.Index:
        mirror, suite = self.mirror(spec)
        key = (mirror, suite, debs_mod.debian_architecture())
        if key not in self._indexes:
            t0 = time.monotonic()
            self._indexes[key] = debs_mod.fetch_index(*key)
            self.progress(f"{suite} index from {mirror}: {len(self._indexes[key].packages)} packages, signature "
                          f"checked, in {time.monotonic() - t0:.1f}s")
        return self._indexes[key]

    def plan(self, spec: ImageSpec, parent_id: str | None) -> tuple[LockedDeb, ...]:
        """The .debs of `spec`: the lock's (same pins, same parent), a cached resolution for
        the same pins over the same parent packages, or (online) a fresh one."""
        if not spec.packages:
            return ()
        pins = {str(p) for p in spec.packages}
        entry = self.entry(spec.name, True)
        if entry is not None and entry.parent_id == parent_id and entry.debs and (
                {str(d) for d in entry.debs if d.pinned} == pins):
            self.planned[spec.name] = entry.debs
            return entry.debs
        installed = self.installed(spec)
        key = hashlib.sha256(json.dumps([sorted(pins), sorted(installed.items())]).encode()).hexdigest()
        record = self.cache.resolved(spec.name)
        try:
            doc = json.loads(record.read_text())
            if doc.get("key") == key:
                planned = tuple(LockedDeb.from_json(d) for d in doc["debs"])
                self.planned[spec.name] = planned
                return planned
        except (OSError, ValueError, KeyError, TypeError, ImageError):
            pass  # no usable record: resolve
        if self.offline:
            raise ImageError(f"{spec.name}: its packages are not resolved for this parent yet "
                             "(offline): run `ringfence images fetch` first")
        with _timed(self.progress, f"{spec.name}: resolve {', '.join(sorted(pins))}"):
            stanzas = debs_mod.resolve(spec.packages, installed, self.index(spec),
                                       lambda m: self.progress(f"{spec.name}: {m}"))
        planned = tuple(s.locked(pinned=str(DebPin(s.name, s.version)) in pins) for s in stanzas)
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "debs": [d.to_json() for d in planned]}, indent=1, sort_keys=True))
        os.replace(tmp, record)
        self.planned[spec.name] = planned
        return planned

    def deb_files(self, spec: ImageSpec, planned: tuple[LockedDeb, ...], *,
                  refresh: bool = False) -> list[tuple[LockedDeb, Path]]:
        """Each .deb from the cache (checked); missing ones are downloaded unless offline.
        `refresh` (fetch): a cached file that is not the recorded one is downloaded again; a
        build refuses it instead (it never decides on its own to replace what it installs)."""
        mirror, _suite = self.mirror(spec)
        out = []
        for deb in planned:
            path = self.cache.debs / deb.cache_name
            # Hashed only when a download is allowed and asked for (refresh, or no file yet).
            if ((refresh or not path.is_file()) and not self.offline
                    and (not path.is_file() or sha256_file(path) != deb.sha256)):
                debs_mod.download(deb, mirror, self.cache.debs)
                self.progress(f"{spec.name}: downloaded {deb.cache_name}")
            out.append((deb, debs_mod.cached(deb, self.cache.debs)))
        return out

    def wheel_files(self, spec: ImageSpec) -> list[tuple[LockedWheel, Path]]:
        target = self.target(spec)
        out = []
        for pin in spec.wheels:
            if wheels_mod.in_wheelhouse(pin, self.cache.wheels) is None and not self.offline:
                wheels_mod.fetch(pin, self.cache.wheels, target, lambda m: self.progress(f"{spec.name}: {m}"))
            out.append(wheels_mod.cached(pin, self.cache.wheels, target))
        return out


@contextlib.contextmanager
def _timed(progress: Progress, what: str) -> Iterator[None]:
    t0 = time.monotonic()
    progress(f"{what} ...")
    yield
    progress(f"{what}: done in {time.monotonic() - t0:.1f}s")


class _Builder:
    def __init__(self, *, specs: dict[str, ImageSpec], lock: Lock, cache: Cache, client: DockerClient | None,
                 update_lock: bool, force: frozenset[str], load: bool, tag_prefix: str, progress: Progress,
                 offline: bool = False, inherited: Mapping[str, ImageSpec] | None = None,
                 builtin_cache: Cache | None = None):
        self.specs, self.lock, self.cache, self.client = specs, lock, cache, client
        self.offline = offline
        # A user's dir: the built-in specs under it, and the built-in build cache (parents' layers).
        self.inherited = inherited or {}
        self.builtin_cache = builtin_cache
        self.deps = _Deps(specs=specs, inherited=self.inherited, lock=lock, cache=cache, progress=progress,
                          offline=offline)
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
            return [*reasons, "not in the lock"]
        if entry.inputs_sha256 != spec.inputs_sha256():
            reasons.append(f"images/{spec.name} changed since the lock")
        parent_id = self.ids.get(spec.parent) if spec.parent else None
        if entry.parent_id != parent_id:
            reasons.append(f"parent {spec.parent} is now {parent_id}")
        if self.load and not has_image(self.engine_client, entry.id):
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
            details += deps_diff(entry.debs, built.debs, entry.wheels, built.wheels)
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
        self.deps.lock = self.lock
        self.lock_changed = True
        self.ids[spec.name] = built.id
        self.current[spec.name] = built
        return True

    # -- building -------------------------------------------------------------------------

    def parent_build(self, spec: ImageSpec) -> Built:
        """The accepted parent's layers: from this run, a build cache, the engine, or (last
        resort, for the dir's own images) rebuilt."""
        assert spec.parent is not None
        pid = self.ids[spec.parent]
        if spec.parent in self.current and self.current[spec.parent].id == pid:
            return self.current[spec.parent]
        for cache in (self.cache, self.builtin_cache):
            cached = cache.find(pid) if cache is not None else None
            if cached is not None:
                return cached
        entry = self.lock.get(spec.parent)
        if self.client is not None and entry is not None and entry.id == pid and has_image(self.client, pid):
            return self.cache.from_engine(self.client, entry, self.progress)
        if spec.parent not in self.specs:
            raise ImageError(f"{spec.name}: the built-in parent {spec.parent} {pid} is in no build cache and not in "
                             "the engine: run `make images` (or `ringfence images build`) for the built-in images")
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
        built = self.assemble_root(spec) if spec.parent is None else self.assemble_child(spec)
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
        pdoc = parent.doc
        diff_ids = list(pdoc["rootfs"]["diff_ids"])
        history = [h["created_by"] for h in pdoc["history"]]
        layers = list(parent.layers)
        debs: tuple[LockedDeb, ...] = ()
        wheels: tuple[LockedWheel, ...] = ()
        if spec.packages:
            debs = self.deps.plan(spec, parent.id)
            files = self.deps.deb_files(spec, debs)
            with self.step(f"{spec.name}: unpack {len(debs)} package(s), no network"), self.staging(spec) as root:
                unpacked = debs_mod.unpack(files, root)
                # Owner root whatever user built it; modes as unpacked (debs.unpack set them).
                diff_id, path = write_layer_file(tree_entries(root, normalize=False, owner=(0, 0)), self.cache.layers)
            if unpacked.scripts_skipped:
                self.progress(f"{spec.name}: maintainer scripts NOT run: {'; '.join(unpacked.scripts_skipped)}")
            if unpacked.setid_stripped:
                self.progress(f"{spec.name}: setuid/setgid dropped: {', '.join(unpacked.setid_stripped)}")
            diff_ids.append(diff_id)
            layers.append(path)
            history.append("ringfence: packages " + " ".join(map(str, debs)))
        if spec.wheels:
            pairs = self.deps.wheel_files(spec)
            wheels = tuple(w for w, _ in pairs)
            with self.step(f"{spec.name}: unpack {len(wheels)} wheel(s) into /{wheels_mod.SITE}"), \
                    self.staging(spec) as root:
                skipped = wheels_mod.install(pairs, root)
                diff_id, path = write_layer_file(tree_entries(root, normalize=True), self.cache.layers)
            if skipped:
                self.progress(f"{spec.name}: left out of the wheels (not importable code): {', '.join(skipped)}")
            diff_ids.append(diff_id)
            layers.append(path)
            history.append("ringfence: wheels " + " ".join(map(str, wheels)))
        with self.step(f"{spec.name}: write layer from images/{spec.name}/rootfs"), spec.overlay() as tree:
            entries = tree_entries(tree, normalize=True) if tree is not None else []
            diff_id, path = write_layer_file(entries, self.cache.layers)
        config = image_config(
            spec.container_config(parent.container_config()),
            [*diff_ids, diff_id],
            [*history, f"ringfence: images/{spec.name}/rootfs"],
            pdoc["architecture"],
        )
        return Built(spec.name, digest_of(config), config, (*layers, path),
                     spec.inputs_sha256(), spec.parent, parent.id, (), debs, wheels)

    @contextlib.contextmanager
    def staging(self, spec: ImageSpec) -> Iterator[Path]:
        work = self.cache.root / "work"
        work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"{spec.name}-", dir=work) as tmp:
            root = Path(tmp) / "rootfs"
            root.mkdir()
            yield root

    def install(self, built: Built) -> None:
        if not self.load:
            return
        if not has_image(self.engine_client, built.id):
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
    lock_path: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Download what the dir's images are installed from and is not in the cache yet: each
    root image's package tarball (all again with `force`), each child's pinned .debs (with the
    dependencies they pull; resolved against the mirror unless the lock already says which
    files) and wheels. Returns the files downloaded.

    Setup, not build: `make images` runs it so that a later offline rebuild (the determinism
    test) has the same packages to install, even when the engine already had every image and
    nothing was built; `build` then installs from it instead of downloading again. For a
    user's dir only the user's images are fetched (the built-in ones are `make images`')."""
    images_dir = Path(images_dir) if images_dir is not None else IMAGES_DIR
    cache = Cache(Path(cache_dir) if cache_dir is not None else images_dir / ".build")
    progress = progress or (lambda _msg: None)
    inherited = {} if is_builtin(images_dir) else load_specs(IMAGES_DIR)
    specs = load_specs(images_dir, inherited)
    fetched = []
    for name, spec in sorted(specs.items()):
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
    children = [n for n in build_order(specs, None) if specs[n].packages or specs[n].wheels]
    if not children:
        return fetched
    lock = lock_for(images_dir, lock_path, missing_ok=True)
    deps = _Deps(specs=specs, inherited=inherited, lock=lock, cache=cache, progress=progress, offline=False)
    for name in children:
        spec = specs[name]
        assert spec.parent is not None  # only children pin packages (spec.load_spec)
        parent = lock.get(spec.parent)
        before = {p for p in (cache.debs, cache.wheels) for p in (p.glob("*") if p.is_dir() else ())}
        t0 = time.monotonic()
        files = deps.deb_files(spec, deps.plan(spec, parent.id if parent is not None else None), refresh=True)
        wheels = deps.wheel_files(spec)
        after = {p for p in (cache.debs, cache.wheels) for p in (p.glob("*") if p.is_dir() else ())}
        fetched += sorted(after - before)
        progress(f"{name}: {len(files)} package file(s) and {len(wheels)} wheel(s) in the cache, checked, "
                 f"in {time.monotonic() - t0:.1f}s")
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
    cache = Cache(Path(cache_dir) if cache_dir is not None else images_dir / ".build")
    progress = progress or (lambda _msg: None)
    builtin = is_builtin(images_dir)
    inherited = {} if builtin else load_specs(IMAGES_DIR)
    specs = load_specs(images_dir, inherited)
    if not specs:
        raise ImageError(f"no image specs under {images_dir}")
    lock = lock_for(images_dir, lock_path, missing_ok=True)
    assert lock.path is not None  # lock_for always says where the lock is
    if load and client is None:
        client = engine.client_from_env()
    order = build_order(specs, names)
    # --force rebuilds what was asked for; parents are still only built when missing or stale.
    forced = frozenset((names or specs) if force else ())
    b = _Builder(specs=specs, lock=lock, cache=cache, client=client, update_lock=update_lock,
                 force=forced, load=load, tag_prefix=tag_prefix, progress=progress, offline=offline,
                 inherited=inherited, builtin_cache=None if builtin else Cache(IMAGES_DIR / ".build"))
    for name in order:
        parent = specs[name].parent
        if parent is not None and parent not in specs:
            # A built-in parent: its pinned ID, as the built-in lock says (never rebuilt here).
            pinned = lock.get(parent)
            if pinned is not None:
                b.ids[parent] = pinned.id
            else:
                progress(f"{name}: the built-in parent {parent} is not pinned: run `make images`")
        b.process(name)
    written = None
    if b.lock_changed:
        written = b.lock.write(lock.path)
        progress(f"wrote {written}")
    return BuildReport(tuple(b.built), tuple(b.loaded), tuple(b.up_to_date), tuple(b.blocked),
                       tuple(b.drifts), written)
